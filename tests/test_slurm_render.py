"""`hpcfsdp slurm render`: --setup before the launch, absolute paths, every setting written, the pmi2 warning."""

import argparse
import dataclasses
import importlib.metadata
import os
import shlex
import subprocess
import sys

import pytest

from hpcfsdp.cli import slurm
from hpcfsdp.cli.config import TrainConfig, add_config_arguments, config_from_args

HP = [sys.executable, "-m", "hpcfsdp.cli.main"]
SETUP = 'export SITE_MARK="set up"; echo "setup ran: $SITE_MARK"'


def _render(args, cwd, env=None):
    return subprocess.run(HP + ["slurm", "render", "--gpus-per-node", "0", "--ntasks-per-node", "2", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **(env or {})))


def _train_words(text):
    """The words after `train` in the launch line (continuations joined, the trailing `&` dropped)."""
    line = next(ln for ln in text.replace("\\\n", " ").splitlines() if ln.startswith(("srun ", "mpiexec ")))
    words = shlex.split(line)
    assert words[-1] == "&", words
    assert words[-2] == shlex.split(slurm._slurm_restart.AGAIN)[0], words  # a rerun's flags: none in the first run
    return words[words.index("train") + 1:-2]


def _given(words):
    p = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(p)
    return vars(p.parse_args(words))


@pytest.mark.timeout(120)
def test_setup_runs_in_the_batch_shell_before_the_launch(tmp_path):
    res = _render(["--setup", SETUP, "--setup", "cd .", "--steps", "3"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert subprocess.run(["bash", "-n"], input=text, text=True, timeout=30).returncode == 0
    lines = text.splitlines()
    at = lines.index(SETUP)
    assert lines[at + 1] == "cd ." and lines[at - 1] == "set +u" and lines[at + 2] == "set -u"
    assert lines.index("set -euo pipefail") < at < next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    # run it: a fake srun records what the job step saw; the setup ran first, in the same shell
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\necho "srun saw: $SITE_MARK"\nprintf "%s\\n" "$@" > "$REC"\n')
    (bin_dir / "srun").chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    rec = tmp_path / "args"
    job = subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", REC=str(rec)))
    assert job.returncode == 0, job.stderr
    out = job.stdout.splitlines()
    assert out.index("setup ran: set up") < out.index("srun saw: set up"), out
    assert "--resume-if-exists" in rec.read_text().split("\n")


@pytest.mark.timeout(60)
def test_setup_that_is_not_bash_fails_at_render_time(tmp_path):
    res = _render(["--setup", "module load mpich; if then"], cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("hpcfsdp slurm render: error: setup='module load mpich; if then': not valid bash")


@pytest.mark.timeout(60)
def test_paths_are_absolute_against_the_render_directory(tmp_path):
    work = tmp_path / "work dir"
    work.mkdir()
    res = _render(["--data", "data/tok.bin", "--checkpoint-dir", "ck", "--out-dir", "../out", "--trace", "tr",
                   "--metrics-path", "m.jsonl", "--sbatch-output", "logs/%x-%j.out"], cwd=work)
    assert res.returncode == 0, res.stderr
    given = _given(_train_words(res.stdout))
    assert given["data"] == str(work / "data" / "tok.bin") and given["checkpoint_dir"] == str(work / "ck")
    assert given["out_dir"] == str(tmp_path / "out") and given["trace"] == str(work / "tr")
    assert given["metrics_path"] == str(work / "m.jsonl")
    assert "\n#SBATCH --output=logs/%x-%j.out\n" in res.stdout  # a directive cannot hold a space: left relative
    plain = tmp_path / "plain"
    plain.mkdir()
    res = _render(["--sbatch-output", "logs/%x-%j.out", "--resume-from", "step-20", "--checkpoint-dir", "ck"],
                  cwd=plain)
    assert res.returncode == 0, res.stderr
    assert f"\n#SBATCH --output={plain}/logs/%x-%j.out\n" in res.stdout
    given = _given(_train_words(res.stdout))
    assert given["resume_from"] == "step-20" and given["checkpoint_dir"] == str(plain / "ck")  # a step stays a step
    res = _render(["--resume-from", "old/ckpt", "--checkpoint-dir", "ck"], cwd=plain)
    assert _given(_train_words(res.stdout))["resume_from"] == str(plain / "old" / "ckpt")
    # the default checkpoint directory and run directory, too
    given = _given(_train_words(_render([], cwd=plain).stdout))
    assert given["checkpoint_dir"] == str(plain / "checkpoints") and given["out_dir"] == str(plain / "runs" / "hpcfsdp")


@pytest.mark.timeout(60)
def test_every_setting_is_written_so_later_defaults_cannot_change_the_job(tmp_path):
    res = _render(["--n-layer", "2"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    given = _given(_train_words(res.stdout))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    # reshard_after_forward unset means "by strategy" (FSDP2's root rule differs from an explicit value)
    assert fields - {"reshard_after_forward"} <= set(given), sorted(fields - set(given))
    # so the job is what render resolved, whatever defaults the TrainConfig that reads it has
    # (bias and tie_weights, None = the model's choice, are written as that choice: GPT's True)
    expected = TrainConfig(n_layer=2, device="cpu", checkpoint_dir=str(tmp_path / "checkpoints"),
                           out_dir=str(tmp_path / "runs" / "hpcfsdp"), resume_if_exists=True, bias=True,
                           tie_weights=True)
    assert config_from_args(argparse.Namespace(**given)) == expected


@pytest.mark.timeout(120)
def test_the_models_own_choices_are_written_as_that_models(tmp_path):
    """bias / tie_weights unset mean the model's default (GPT: on, Llama: off); a flag cannot say "unset", so
    render writes the model's choice."""
    for model, want in (("gpt", True), ("llama", False)):
        res = _render(["--model", model], cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        given = _given(_train_words(res.stdout))
        assert given["model"] == model and given["bias"] is want and given["tie_weights"] is want, given


def _loaded_libmpi():
    """The libmpi mpi4py really loads here (from /proc/self/maps of a process that imported mpi4py.MPI)."""
    code = ("from mpi4py import MPI\n"
            "print(next((l.split()[-1] for l in open('/proc/self/maps') if '/libmpi' in l), ''))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "HPCFSDP_RANK_ENV_PID"})
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _wheel_files():
    try:
        dist = importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        return set()
    return {os.path.realpath(dist.locate_file(f)) for f in dist.files or ()}


@pytest.mark.timeout(120)
def test_warns_once_when_this_mpi_needs_pmi2_and_the_site_default_may_differ(tmp_path):
    lib = _loaded_libmpi()
    wheel = bool(lib) and os.path.realpath(lib) in _wheel_files()
    assert (slurm.mpi_needs_pmi2() is not None) == wheel
    assert slurm.mpi_needs_pmi2(prefixes=[str(tmp_path)], environ={}) is None  # no libmpi there
    conf = tmp_path / "slurm.conf"
    env = {"SLURM_CONF": str(tmp_path / "missing.conf")}
    res = _render([], cwd=tmp_path, env=env)
    assert res.returncode == 0 and res.stdout.startswith("#!/bin/bash")
    if not wheel:  # pragma: no cover - an environment whose mpi4py runs another MPI: nothing to warn about
        assert res.stderr == ""
        return
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("hpcfsdp slurm render: warning: "), res.stderr
    assert "MPICH wheel" in res.stderr and "--mpi=pmi2" in res.stderr and "render with --mpi pmi2" in res.stderr
    assert "may differ" in res.stderr
    conf.write_text("ClusterName=x\nMpiDefault=none\n")
    res = _render([], cwd=tmp_path, env={"SLURM_CONF": str(conf)})
    assert "MpiDefault=none in this machine's slurm.conf" in res.stderr and res.stderr.count("\n") == 1
    for args, conf_text in ((["--mpi", "pmi2"], "MpiDefault=none\n"), (["--launcher", "mpiexec"], ""),
                            ([], "# site\nMpiDefault=pmi2\n")):
        conf.write_text(conf_text)
        res = _render(args, cwd=tmp_path, env={"SLURM_CONF": str(conf)})
        assert res.returncode == 0 and res.stderr == "", (args, res.stderr)
