"""`hpcfsdp data prepare`: the corpus size and an estimate up front, progress bars of both phases on stderr
(silenced by --no-progress or HPCFSDP_PROGRESS=0), help that states the --python-stdlib corpus's size and time
(checked against this Python's), and that corpus without site-packages."""
import os
import re
import subprocess
import sys

import pytest

from hpcfsdp.cli import data as data_cli

HPC = [sys.executable, "-m", "hpcfsdp.cli.main", "data", "prepare"]


def _corpus(tmp_path, n=6):
    d = tmp_path / "corpus"
    d.mkdir()
    for k in range(n):
        (d / f"f{k}.txt").write_text("".join(f"line {i} of file {k}: the quick brown fox\n" for i in range(300)))
    return d, sum(p.stat().st_size for p in d.iterdir())


def _run(args, env_extra=None, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != data_cli.PROGRESS_ENV}
    env.update(env_extra or {})
    return subprocess.run(HPC + args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("tokenizer", ["bpe", "byte"])
def test_prepare_shows_size_estimate_and_both_bars_on_stderr(tmp_path, tokenizer):
    d, total = _corpus(tmp_path)
    out = _run([str(d), "--out", str(tmp_path / "out"), "--tokenizer", tokenizer, "--vocab-size", "300"])
    assert out.returncode == 0, out.stderr
    err = out.stderr.replace("\r", "\n")
    first = err.splitlines()[0]
    assert re.fullmatch(rf"hpcfsdp data prepare: 6 files, {total / 2**20:.1f} MiB of text: about \d+ s on one core "
                        r"\(HPCFSDP_PROGRESS=0 or --no-progress: no bars\)", first), first
    size = f"{total / 1024:.1f}k" if total < 1024 * 1000 else None  # tqdm's scaled byte count (divisor 1024)
    bars = [line for line in err.splitlines() if "100%" in line]
    tokenizing = [b for b in bars if b.startswith("tokenizing")]
    assert tokenizing and size in tokenizing[-1], err
    training = [b for b in bars if b.startswith("training BPE (300 tokens)")]
    assert bool(training) == (tokenizer == "bpe"), err
    if training:
        assert "computing merges" in training[-1]
    assert "Traceback" not in err and "tokens in 1 shard(s)" in out.stdout


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["flag", "env"])
def test_progress_can_be_silenced(tmp_path, how):
    d, _ = _corpus(tmp_path)
    args = [str(d), "--out", str(tmp_path / "out"), "--tokenizer", "byte"]
    out = _run(args + ["--no-progress"]) if how == "flag" else _run(args, {data_cli.PROGRESS_ENV: "0"})
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "6 files" in out.stdout


@pytest.mark.timeout(120)
def test_help_states_the_stdlib_corpus_size_and_time_truthfully():
    out = subprocess.run(HPC + ["--help"], capture_output=True, text=True, timeout=60, env={**os.environ,
                         "COLUMNS": "400"})
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    m = re.search(r"--python-stdlib add this Python's standard library sources, without site-packages \(an offline "
                  r"corpus: about (\d+) MiB of text in some (\d+) files for CPython [\d.]+; about [\d-]+ s on one core "
                  r"with the default BPE", text)
    assert m, text
    stated_mib, stated_files = int(m.group(1)), int(m.group(2))
    std = data_cli.stdlib_dir()
    files = data_cli._files([std], "*.txt,*.py,*.rst,*.md", 0, prune=[(std, data_cli._NOT_STDLIB)])
    mib = sum(os.path.getsize(f) for f in files) / 2**20
    # this Python's standard library, measured now (another CPython version differs by some tens of percent)
    assert 0.6 * stated_mib <= mib <= 1.5 * stated_mib and 0.6 * stated_files <= len(files) <= 1.5 * stated_files
    assert not any(f"{os.sep}site-packages{os.sep}" in f for f in files)
    assert "--no-progress" in text and "HPCFSDP_PROGRESS=0" in text
    # the estimate the first line prints uses the same rate as the help's time
    lo, hi = (int(x) for x in re.search(r"about (\d+)-(\d+) s on one core", text).groups())
    assert lo * 0.7 <= data_cli.estimate_seconds(30 * 2**20, "bpe") <= hi * 1.3


@pytest.mark.timeout(60)
def test_python_stdlib_leaves_out_site_packages(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    (lib / "site-packages" / "pkg").mkdir(parents=True)
    (lib / "json").mkdir()
    (lib / "os.py").write_text("import sys\n")
    (lib / "json" / "decoder.py").write_text("x = 1\n")
    (lib / "site-packages" / "pkg" / "mod.py").write_text("y = 2\n" * 100)
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "site-packages").mkdir()  # a user's own directory of that name is read
    (tmp_path / "extra" / "site-packages" / "notes.txt").write_text("kept\n")
    monkeypatch.setattr(data_cli, "stdlib_dir", lambda: str(lib))
    s = data_cli.prepare([str(tmp_path / "extra")], str(tmp_path / "out"), tokenizer="byte", progress=False,
                         python_stdlib=True)
    assert s["files"] == 3 and s["bytes"] == len("kept\n") + len("import sys\n") + len("x = 1\n")
