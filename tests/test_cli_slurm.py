"""Tests for hpcfsdp.cli.slurm: every template rendered for 1, 2 and 16 nodes is a valid sbatch script."""

import argparse
import os
import pathlib
import re
import shlex
import signal
import sys
import time
import subprocess

import pytest

from hpcfsdp.cli import _slurm_restart, slurm
from hpcfsdp.cli.config import ConfigError, TrainConfig, add_config_arguments, config_from_args

REPO = pathlib.Path(__file__).resolve().parents[1]

# Long options of sbatch(1) (Slurm 23/24 documentation), written down independently of the
# templates. A directive naming anything else is a typo sbatch would reject.
SBATCH_LONG_OPTIONS = frozenset("""
    account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint
    container contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
    delay-boot dependency distribution error exclude exclusive export export-file extra-node-info
    get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres
    gres-flags hint hold ignore-pbs input job-name kill-on-invalid-dep licenses mail-type mail-user
    mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile
    nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode
    output overcommit oversubscribe parsable partition power prefer priority profile propagate qos
    quiet reboot requeue reservation signal sockets-per-node spread-job switches test-only
    thread-spec threads-per-core time time-min tmp tres-per-task uid use-min-nodes verbose wait
    wait-all-nodes wckey wrap
""".split())
# Options that take no value.
SBATCH_FLAGS = frozenset({"contiguous", "exclusive", "hold", "ignore-pbs", "no-kill", "no-requeue", "overcommit",
                          "oversubscribe", "parsable", "quiet", "reboot", "requeue", "spread-job", "test-only",
                          "use-min-nodes", "verbose", "wait"})
_DIRECTIVE = re.compile(r"^#SBATCH --([a-z][a-z-]*)(?:=(\S+))?\s*$")


def _train_parser():
    p = argparse.ArgumentParser(prog="hpcfsdp train", exit_on_error=False)
    add_config_arguments(p)
    return p


def _directives(text):
    """#SBATCH directives as {option: value}; all must come before the first command (sbatch stops there)."""
    out = {}
    seen_command = False
    for line in text.splitlines()[1:]:
        s = line.strip()
        if line.startswith("#SBATCH"):
            assert not seen_command, f"#SBATCH after the first command is ignored by sbatch: {line!r}"
            m = _DIRECTIVE.match(line)
            assert m, f"directive does not parse as --option[=value]: {line!r}"
            opt, value = m.group(1), m.group(2)
            assert opt in SBATCH_LONG_OPTIONS, f"not an sbatch option: --{opt}"
            assert (value is None) == (opt in SBATCH_FLAGS), line
            assert opt not in out, f"--{opt} given twice"
            out[opt] = value
        elif s and not s.startswith("#"):
            seen_command = True
    return out


def _launch_command(text):
    """(launcher tokens, program tokens) of the one srun/mpiexec line, continuations joined."""
    joined = text.replace("\\\n", " ")
    lines = [ln for ln in joined.splitlines() if re.match(r"^\s*(srun|mpiexec)\s", ln)]
    assert len(lines) == 1, lines
    tokens = shlex.split(lines[0])
    assert tokens[-1] == "&", tokens  # the step runs in the background so the batch shell's trap can run
    # a rerun's srun options and train flags (see [Note: Node failures in a Slurm job]): empty in the first run
    tokens = [t for t in tokens[:-1] if t not in (shlex.split(_slurm_restart.RERUN) + shlex.split(_slurm_restart.AGAIN))]
    for i, tok in enumerate(tokens):
        if tok == "hpcfsdp":
            return tokens[:i], tokens[i + 1:]
        if tok == "-m" and tokens[i + 1] == "hpcfsdp.cli.main":
            start = i - 3 if tokens[i - 2:i] == ["-m", "mpi4py"] else i - 1  # python [-m mpi4py] -m ...
            assert tokens[start] in ("$PYTHON", "python", "python3"), tokens
            return tokens[:start], tokens[i + 2:]
    raise AssertionError(f"no hpcfsdp entry in {lines[0]!r}")


def _check_script(text, *, nodes, ntasks_per_node, gpus_per_node, bench=False):
    """All the checks a job script must pass; returns the TrainConfig it runs (None for bench)."""
    assert text.startswith("#!/bin/bash\n")
    # documented at its top
    head = text.split("#SBATCH", 1)[0]
    for must in ("SLURM_LOCALID", "--gpus-per-node", "--gpus-per-task", "CUDA IPC", "MPICH_GPU_SUPPORT_ENABLED",
                 "HPCFSDP_CUDA_AWARE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        assert must in head, must
    # --gpus-per-task only ever in the explanation why not
    for line in text.splitlines():
        if "--gpus-per-task" in line:
            assert line.startswith("#") and not line.startswith("#SBATCH"), line
    d = _directives(text)
    assert int(d["nodes"]) == nodes and int(d["ntasks-per-node"]) == ntasks_per_node
    assert "time" in d and "job-name" in d and "output" in d
    if gpus_per_node:
        assert int(d["gpus-per-node"]) == gpus_per_node
    else:
        assert "gpus-per-node" not in d and "gpus" not in d and "gres" not in d
    assert d["signal"].startswith("B:USR1@") and "trap 'forward USR1' USR1" in text and 'wait "$step"' in text
    res = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr
    launcher, prog = _launch_command(text)
    if launcher[0] == "srun":
        assert f"--nodes={nodes}" in launcher and f"--ntasks-per-node={ntasks_per_node}" in launcher
        assert "--kill-on-bad-exit=1" in launcher
    elif bench:
        assert launcher[:5] == ["mpiexec", "-n", str(nodes * ntasks_per_node), "-ppn", str(ntasks_per_node)]
    else:  # a rerun has fewer ranks: the shell's $ranks, set to the first run's count
        assert launcher[:5] == ["mpiexec", "-n", "$ranks", "-ppn", str(ntasks_per_node)]
        assert f"\nnodes={nodes}; ranks={nodes * ntasks_per_node}; " in text
    assert not any("gpus-per-task" in t for t in launcher)
    if bench:
        assert prog[:2] == ["bench", "comm"], prog
        return None
    assert prog[0] == "train", prog
    cfg = config_from_args(_train_parser().parse_args(prog[1:]))
    cfg.validate(nodes * ntasks_per_node)
    assert cfg.device == ("cuda" if gpus_per_node else "cpu")
    return cfg


CASES = [(t, n) for t in slurm.TEMPLATES for n in (1, 2, 16) if not (t == "single-node" and n != 1)]


@pytest.mark.parametrize("gpus", [4, 0])
@pytest.mark.parametrize("template,nodes", CASES)
def test_rendered_templates_are_valid(template, nodes, gpus):
    text = slurm.render_script(template, nodes=nodes, gpus_per_node=gpus)
    ntasks = gpus or 1
    cfg = _check_script(text, nodes=nodes, ntasks_per_node=ntasks, gpus_per_node=gpus, bench=template == "bench-comm")
    if template == "hsdp":
        assert cfg.strategy == "HYBRID_SHARD" and cfg.mesh == (nodes, ntasks)
        assert "--distribution=block" in text
    elif cfg is not None:
        assert cfg.strategy == "FULL_SHARD" and cfg.mesh is None


@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_render_variants(nodes):
    cfg = TrainConfig(n_layer=8, n_embd=256, n_head=8, steps=1000, checkpoint_dir="ckpt/run 1",
                      checkpoint_interval=100, mixed_precision="bf16", lr=6e-4, min_lr=6e-5)
    text = slurm.render_script(
        None, nodes=nodes, gpus_per_node=8, ntasks_per_node=4, config=cfg, partition="gpu", account="proj1",
        time="1-00:00:00", job_name="big-run", cpus_per_task=7, exclusive=True, qos="normal",
        constraint="a100&nvlink", mpi="pmix", launcher="srun", entry="script", cuda_aware="1")
    got = _check_script(text, nodes=nodes, ntasks_per_node=4, gpus_per_node=8)
    # a requeued job continues; paths are absolute, against the directory render ran in; the model's choices
    # (bias, tie_weights: None) are written as GPT's
    expected = TrainConfig(**{**vars(cfg), "device": "cuda", "resume_if_exists": True, "bias": True, "tie_weights": True,
                              "checkpoint_dir": os.path.join(os.getcwd(), "ckpt", "run 1"),
                              "out_dir": os.path.join(os.getcwd(), "runs", "hpcfsdp")})
    assert got == expected
    d = _directives(text)
    assert d["partition"] == "gpu" and d["account"] == "proj1" and d["cpus-per-task"] == "7"
    assert d["qos"] == "normal" and d["constraint"] == "a100&nvlink" and d["job-name"] == "big-run"
    assert "exclusive" in d and d["time"] == "1-00:00:00"
    assert "srun --mpi=pmix " in text and "export HPCFSDP_CUDA_AWARE=1\n" in text
    assert "\n    hpcfsdp train \\\n" in text


def test_mpiexec_and_cray():
    text = slurm.render_script("multi-node", nodes=2, gpus_per_node=4, launcher="mpiexec")
    _check_script(text, nodes=2, ntasks_per_node=4, gpus_per_node=4)
    text = slurm.render_script("hsdp", nodes=16, gpus_per_node=4, mpi="cray_shasta")
    _check_script(text, nodes=16, ntasks_per_node=4, gpus_per_node=4)
    assert "\nexport MPICH_GPU_SUPPORT_ENABLED=1" in text and "--mpi=cray_shasta" in text
    text = slurm.render_script("hsdp", nodes=2, gpus_per_node=4)
    assert "\n# export MPICH_GPU_SUPPORT_ENABLED=1" in text
    assert "--mpi=" not in _launch_command(text)[0]


def test_bench_args():
    text = slurm.render_script("bench-comm", nodes=2, gpus_per_node=4, bench_args="--sizes '1K 1M' --iters 5")
    _, prog = _launch_command(text)
    assert prog == ["bench", "comm", "--sizes", "1K 1M", "--iters", "5", "--device", "cuda"]  # the GPUs asked for
    text = slurm.render_script("bench-comm", nodes=2, gpus_per_node=0, bench_args="--iters 5")
    assert _launch_command(text)[1] == ["bench", "comm", "--iters", "5"]


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(template="single-node", nodes=2), "nodes=2: template single-node runs on exactly 1 node"),
    (dict(nodes=1, gpus_per_node=4, ntasks_per_node=8), "ntasks_per_node=8: expected <= gpus_per_node=4"),
    (dict(nodes=0), "nodes=0"),
    (dict(nodes=2, time="two hours"), "time='two hours'"),
    (dict(nodes=2, partition="gpu; rm -rf /"), "partition="),
    (dict(nodes=2, mpi="openmpi"), "mpi='openmpi'"),
    (dict(template="multi-node", nodes=2, config=TrainConfig(strategy="HYBRID_SHARD")), "use --template hsdp"),
    (dict(template="hsdp", nodes=2, config=TrainConfig(strategy="FULL_SHARD"), config_explicit={"strategy"}),
     "template hsdp runs HYBRID_SHARD"),
    (dict(nodes=2, config=TrainConfig(mesh=(3,)), config_explicit={"mesh"}), "mesh='3'"),
    (dict(nodes=2, config=TrainConfig(n_head=3)), "n_embd=128"),
    (dict(nodes=2, gpus_per_node=0, config=TrainConfig(device="cuda"), config_explicit={"device"}),
     "device='cuda': needs --gpus-per-node"),
])
def test_render_errors(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        slurm.render_script(**kwargs)
    assert fragment in str(info.value), str(info.value)


def test_repo_slurm_directory_matches_templates():
    for name, text in slurm.render_examples().items():
        path = REPO / "slurm" / name
        assert path.read_text() == text, f"{path} is stale; regenerate it (see slurm/README.md)"
    assert (REPO / "slurm" / "README.md").is_file()
    for name, nodes, bench in (("single_node.sbatch", 1, False), ("multi_node_fsdp.sbatch", 2, False),
                               ("multi_node_hsdp.sbatch", 2, False), ("bench_comm.sbatch", 2, True)):
        _check_script((REPO / "slurm" / name).read_text(), nodes=nodes, ntasks_per_node=4, gpus_per_node=4,
                      bench=bench)


def test_raw_templates_are_documented():
    for name in slurm.TEMPLATES:
        raw = slurm.template_text(name)
        lines = raw.splitlines()
        assert lines[0] == "#!/bin/bash" and lines[1].startswith("# hpcfsdp ")
        assert "--gpus-per-task" not in raw


# ------------------------------------------------------------------ command line


def _cli():
    p = argparse.ArgumentParser(prog="hpcfsdp")
    slurm.add_parser(p.add_subparsers(dest="command"))
    return p


def _run(argv, capsys):
    args = _cli().parse_args(argv)
    rc = args.func(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_render_hsdp_with_config_file(tmp_path, capsys):
    conf = tmp_path / "run.toml"
    conf.write_text('n_layer = 6\nstrategy = "HYBRID_SHARD"\nsteps = 50\n')
    rc, out, err = _run(["slurm", "render", "--nodes", "16", "--gpus-per-node", "4", "--config", str(conf),
                         "--steps", "70", "--mesh", "auto"], capsys)
    assert rc == 0, err
    cfg = _check_script(out, nodes=16, ntasks_per_node=4, gpus_per_node=4)
    assert cfg == TrainConfig(n_layer=6, strategy="HYBRID_SHARD", steps=70, mesh=(16, 4), device="cuda",
                              checkpoint_dir=os.path.join(os.getcwd(), "checkpoints"), resume_if_exists=True,
                              bias=True, tie_weights=True,
                              out_dir=os.path.join(os.getcwd(), "runs", "hpcfsdp"))
    assert f'PYTHON="${{PYTHON:-{sys.executable}}}"' in out and f"# Interpreter: {sys.executable}" in out
    assert "HYBRID_SHARD (HSDP)" in out


def test_cli_render_cpu_single(capsys):
    rc, out, err = _run(["slurm", "render", "--gpus-per-node", "0", "--ntasks-per-node", "2"], capsys)
    assert rc == 0, err
    cfg = _check_script(out, nodes=1, ntasks_per_node=2, gpus_per_node=0)
    assert cfg.device == "cpu" and "single-node training job" in out


@pytest.mark.parametrize("argv,fragment", [
    (["--nodes", "2", "--n-head", "3"], "n_embd=128: expected a multiple of n_head=3"),
    (["--nodes", "2", "--mesh", "3"], "mesh='3': its size 3 must equal the world size 8"),
    (["--nodes", "2", "--mesh", "2by2"], "mesh='2by2'"),
    (["--template", "single-node", "--nodes", "2"], "template single-node"),
    (["--nodes", "2", "--device", "cpu"], "device='cpu'"),
])
def test_cli_render_bad_config_exits_2(argv, fragment, capsys):
    rc, out, err = _run(["slurm", "render"] + argv, capsys)
    assert rc == 2 and out == ""
    assert err.startswith("hpcfsdp slurm render: error: ") and fragment in err, err


def test_cli_render_bad_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        _cli().parse_args(["slurm", "render", "--strategy", "ZERO3"])
    assert info.value.code == 2
    assert "invalid choice: 'ZERO3'" in capsys.readouterr().err


def test_cli_list(capsys):
    rc, out, _ = _run(["slurm", "list"], capsys)
    assert rc == 0
    for name, (fname, _) in slurm.TEMPLATES.items():
        assert name in out and fname in out


_FAKE_SRUN = """#!/bin/bash
if [ -n "${STARTING:-}" ]; then  # the ranks are still starting: the signal kills them
    trap 'echo USR1 >> "$REC"; trap - USR1; kill -s USR1 $$' USR1
else
    trap 'echo USR1 >> "$REC"; exit 75' USR1
fi
trap 'echo TERM >> "$REC"; exit 75' TERM
printf '%s\\n' "$@" > "$REC.args"
touch "$REC.started"
while :; do sleep 0.1; done
"""


@pytest.mark.parametrize("starting", [False, True], ids=["training", "starting"])
@pytest.mark.parametrize("requeue", [True, False])
def test_rendered_script_forwards_the_warning_signal_and_requeues(tmp_path, requeue, starting):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(_FAKE_SRUN)
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "$@" >> "$REC.scontrol"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    text = slurm.render_script("single-node", gpus_per_node=0, config=TrainConfig(requeue=requeue), signal_seconds=300)
    d = _directives(text)
    assert d["signal"] == "B:USR1@300" and ("requeue" in d) == requeue
    assert (d.get("open-mode") == "append") == requeue  # a requeued run appends to the first run's log
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    rec = tmp_path / "rec"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REC": str(rec), "SLURM_JOB_ID": "42",
           "STARTING": "1" if starting else ""}
    job = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 30
        while not (tmp_path / "rec.started").exists():
            assert time.monotonic() < end and job.poll() is None, job.communicate(timeout=5)
            time.sleep(0.05)
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1 does: the batch shell only
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 75, (out, err)  # a step killed by the signal while starting lost nothing: stopped too
    assert ("ended of USR1 while starting" in out) == starting, out
    assert rec.read_text() == "USR1\n"  # the job step got the signal, once
    assert "--resume-if-exists" in (tmp_path / "rec.args").read_text().split("\n")  # continues from latest
    scontrol = tmp_path / "rec.scontrol"
    assert (scontrol.read_text() == "requeue 42\n") if requeue else not scontrol.exists()


def test_mpiexec_launcher_runs_the_mpiexec_next_to_the_rendering_interpreter(tmp_path):
    """In a batch job `mpiexec` on PATH is often another MPI's (or none): use the venv's, which matches mpi4py."""
    venv = tmp_path / "venv bin"
    venv.mkdir()
    (venv / "python").write_text("")
    kw = dict(gpus_per_node=0, ntasks_per_node=2, launcher="mpiexec", python=str(venv / "python"))
    rerun = " " + _slurm_restart.RERUN
    assert f'\nmpiexec -n "$ranks" -ppn 2{rerun} \\\n' in slurm.render_script("single-node", **kw)  # none there: PATH's
    (venv / "mpiexec").write_text("#!/bin/sh\n")
    (venv / "mpiexec").chmod(0o755)
    text = slurm.render_script("single-node", **kw)
    assert f"\n'{venv / 'mpiexec'}' -n \"$ranks\" -ppn 2{rerun} \\\n" in text
