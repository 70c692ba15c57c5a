"""A rendered training job that loses a node reruns its step on the others, resuming, or requeues itself.

One machine cannot lose a node of a real Slurm allocation, so the scripts run under bash with stand-ins for
srun (each start records its arguments; the first ones fail as a lost node makes them fail: a rank wrapper's
line naming the node, or srun's "Node failure on"), scontrol (the allocation's host names; requeue recorded)
and sinfo (no node down). See [Note: Node failures in a Slurm job] in hpcfsdp/cli/_slurm_restart.py.
"""
import os
import shlex
import subprocess

import pytest

from hpcfsdp.cli import slurm
from hpcfsdp.cli.config import TrainConfig

NODES = ["node1", "node2", "node3"]
WRAPPER_LINE = "hpcfsdp: rank {rank} (host {host}.cluster, pid 77) killed by SIGKILL (signal 9) without a Python traceback"


def _job(tmp_path, fails, *, launcher="srun", template="multi-node", config=None, **kw):
    """Run the rendered script; ``fails`` is the sh code of each failing start (start i runs fails[i - 1]; later
    starts exit 0). Returns (CompletedProcess, [argv of each start])."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cases = "".join(f"    {i + 1}) {code} ;;\n" for i, code in enumerate(fails))
    starter = f"""#!/bin/bash
n=$(( $(ls "$REC".start.* 2>/dev/null | wc -l) + 1 ))
printf '%s\\n' "$@" > "$REC.start.$n"
case "$n" in
{cases}    *) exit 0 ;;
esac
"""
    (bin_dir / ("srun" if launcher == "srun" else "mpiexec")).write_text(starter)
    (bin_dir / "scontrol").write_text(f"""#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then printf '%s\\n' {' '.join(NODES)}; exit 0; fi
echo "$@" >> "$REC.scontrol"
""")
    (bin_dir / "sinfo").write_text("#!/bin/bash\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    cfg = config or TrainConfig(checkpoint_dir=str(tmp_path / "ck"))
    text = slurm.render_script(template, nodes=3, gpus_per_node=0, ntasks_per_node=2, config=cfg, launcher=launcher,
                               python="python3", **kw)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    rec = tmp_path / "rec"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REC": str(rec), "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "node[1-3]"}
    out = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    starts = []
    for i in range(1, 10):
        f = tmp_path / f"rec.start.{i}"
        if f.exists():
            starts.append(f.read_text().splitlines())
    return out, starts


def _kill(rank, host, code=137):
    return f"echo {shlex.quote(WRAPPER_LINE.format(rank=rank, host=host))} >&2; exit {code}"


def _options(argv):
    """srun's options (up to the program)."""
    return argv[:argv.index("-m") - 1] if "-m" in argv else argv


def _train(argv):
    return argv[argv.index("train") + 1:]


@pytest.mark.timeout(60)
def test_a_lost_node_is_excluded_and_the_step_rerun_resuming(tmp_path):
    (tmp_path / "ck" / "latest").mkdir(parents=True)
    out, starts = _job(tmp_path, [_kill(3, "node2")])
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(starts) == 2
    first, second = _options(starts[0]), _options(starts[1])
    assert first == ["--nodes=3", "--ntasks-per-node=2", "--kill-on-bad-exit=1"]
    assert second == first + ["--nodes=2", "--exclude=node2"]  # srun takes the last --nodes
    assert _train(starts[1]) == _train(starts[0]) and "--resume-if-exists" in _train(starts[0])
    assert (f"hpcfsdp: restart 1/2: lost node(s) node2; rerunning on 2 node(s) x 2 rank(s) without node2, resuming "
            f"from {tmp_path}/ck/latest") in out.stdout
    assert WRAPPER_LINE.format(rank=3, host="node2") in out.stderr  # the step's stderr still reaches the job log
    assert not (tmp_path / "rec.scontrol").exists()
    assert "#SBATCH --no-kill" in (tmp_path / "job.sbatch").read_text()


@pytest.mark.timeout(60)
def test_srun_node_failures_add_up_over_restarts_until_they_are_used_up(tmp_path):
    out, starts = _job(tmp_path, ["echo 'srun: error: Node failure on node3' >&2; exit 1", _kill(0, "node1", 9)],
                       max_restarts=1)
    assert out.returncode == 9 and len(starts) == 2, out.stdout + out.stderr
    assert _options(starts[1])[-2:] == ["--nodes=2", "--exclude=node3"]
    assert "no checkpoint yet: from step 0" in out.stdout
    assert out.stdout.rstrip().endswith("hpcfsdp: lost node(s) node1; not rerun: --max-restarts 1 used up; exit 9")


@pytest.mark.timeout(60)
def test_below_min_ranks_the_job_is_requeued(tmp_path):
    out, starts = _job(tmp_path, [_kill(1, "node1")], min_ranks=5)
    assert out.returncode == 137 and len(starts) == 1
    assert (tmp_path / "rec.scontrol").read_text() == "requeue 42\n"
    assert ("hpcfsdp: lost node(s) node1; 4 rank(s) would remain, fewer than --min-ranks 5: requeueing job 42; "
            "exit 137") in out.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [1, 75, 130])
def test_a_failure_without_a_lost_node_or_a_stop_is_not_rerun(tmp_path, code):
    out, starts = _job(tmp_path, [f"exit {code}"])
    assert out.returncode == code and len(starts) == 1
    assert ("without losing a node of the allocation: not rerun" in out.stdout) == (code == 1), out.stdout


@pytest.mark.timeout(60)
def test_hsdp_reruns_on_the_mesh_of_the_nodes_left(tmp_path):
    out, starts = _job(tmp_path, [_kill(2, "node2")], template="hsdp")
    assert out.returncode == 0 and len(starts) == 2, out.stdout + out.stderr
    first, second = _train(starts[0]), _train(starts[1])
    assert first[first.index("--mesh") + 1] == "3x2"
    assert second[:len(first)] == first and second[len(first):] == ["--mesh", "2x2"]  # the last --mesh wins


@pytest.mark.timeout(60)
def test_a_job_rendered_to_resume_from_a_step_reruns_from_latest(tmp_path):
    (tmp_path / "ck" / "latest").mkdir(parents=True)
    cfg = TrainConfig(checkpoint_dir=str(tmp_path / "ck"), resume_from="step-5")
    out, starts = _job(tmp_path, [_kill(2, "node2")], config=cfg, config_explicit=("resume_from",))
    assert out.returncode == 0 and len(starts) == 2, out.stdout + out.stderr
    first, second = _train(starts[0]), _train(starts[1])
    assert first[first.index("--resume-from") + 1] == "step-5"
    assert second[len(first):] == ["--resume-from", f"{tmp_path}/ck/latest"]


@pytest.mark.timeout(60)
def test_mpiexec_reruns_on_the_hosts_left(tmp_path):
    out, starts = _job(tmp_path, [_kill(5, "node3")], launcher="mpiexec")
    assert out.returncode == 0 and len(starts) == 2, out.stdout + out.stderr
    assert _options(starts[0]) == ["-n", "6", "-ppn", "2"]
    assert _options(starts[1]) == ["-n", "4", "-ppn", "2", "-hosts", "node1,node2"]


def test_restart_settings_are_checked_and_zero_restarts_keep_the_old_failure_handling():
    with pytest.raises(slurm.ConfigError, match=r"min_ranks=9: expected 1..8"):
        slurm.render_script("multi-node", nodes=2, gpus_per_node=4, min_ranks=9)
    with pytest.raises(slurm.ConfigError, match="max_restarts=-1"):
        slurm.render_script("multi-node", nodes=2, gpus_per_node=4, max_restarts=-1)
    text = slurm.render_script("multi-node", nodes=2, gpus_per_node=4, max_restarts=0)
    assert "--no-kill" not in text and "Node failure:" not in text
    assert "Node failure: the step is rerun" in slurm.render_script("multi-node", nodes=2, gpus_per_node=4)
