"""`hpcfsdp launch --max-restarts/--min-ranks`: which ranks and hosts survive, when a job is rerun, how it resumes.

The decisions are checked as pure functions, and the restart loop end to end with a stand-in mpiexec (a shell
script that records each start's argv and reports a killed rank as the rank wrapper does), so no MPI is needed;
tests/test_cli_restart_system.py kills real ranks.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from hpcfsdp.cli import _restart, launch
from hpcfsdp.cli._restart import Lost, decide

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]


def _decide(code, lost, **kw):
    args = {"nprocs": 4, "min_ranks": 1, "restarts": 0, "max_restarts": 2}
    args.update(kw)
    return decide(code, lost, **args)


def test_one_machine_shrinks_by_the_lost_ranks():
    d = _decide(137, [Lost(3, 9, "vm")])
    assert d.restart and d.nprocs == 3 and d.hosts == ()
    assert d.why == "lost rank 3 (host vm, SIGKILL)"
    d = _decide(137, [Lost(1, 9), Lost(2, 11), Lost(1, 9)])  # a rank reported twice counts once
    assert d.restart and d.nprocs == 2 and "rank 1 (host ?, SIGKILL), rank 2 (host ?, SIGSEGV)" in d.why


def test_simulated_nodes_lose_every_rank_of_a_node_with_a_lost_rank():
    assert _decide(137, [Lost(5, 9)], nprocs=8, ranks_per_node=2).nprocs == 6
    assert _decide(137, [Lost(4, 9), Lost(5, 9), Lost(0, 9)], nprocs=8, ranks_per_node=2).nprocs == 4


def test_with_hosts_the_host_of_a_lost_rank_is_dropped():
    placed = _restart.place([("a", None), ("b", None), ("c", None)], 6)
    assert placed == [("a", 2), ("b", 2), ("c", 2)]
    d = _decide(137, [Lost(3, 9, "b")], nprocs=6, hosts=placed)  # by the wrapper's hostname
    assert d.restart and d.nprocs == 4 and d.hosts == (("a", 2), ("c", 2)) and "dropping host(s) b" in d.why
    d = _decide(137, [Lost(5, 9, "10.0.0.3")], nprocs=6, hosts=placed)  # a name not in the list: by placement
    assert d.hosts == (("a", 2), ("b", 2))
    d = _decide(137, [Lost(0, 9, "a.cluster.example")], nprocs=6, hosts=placed)  # its short name is listed
    assert d.hosts == (("b", 2), ("c", 2))
    uneven = _restart.place([("a", 1), ("b", 3)], 4)
    assert [_restart.host_of_rank(uneven, r) for r in range(4)] == ["a", "b", "b", "b"]
    assert _decide(137, [Lost(2, 9)], nprocs=4, hosts=uneven).nprocs == 1


def test_restarts_stop_at_max_restarts_and_below_min_ranks():
    d = _decide(137, [Lost(0, 9)], restarts=2, max_restarts=2)
    assert not d.restart and d.why == "lost rank 0 (host ?, SIGKILL); not restarted: --max-restarts 2 used up"
    d = _decide(137, [Lost(0, 9), Lost(1, 9), Lost(2, 9)], min_ranks=2)
    assert not d.restart and "not restarted: 1 rank(s) would remain, fewer than --min-ranks 2" in d.why
    assert _decide(137, [Lost(0, 9), Lost(1, 9)], min_ranks=2).restart  # exactly min_ranks left


@pytest.mark.parametrize("code", [0, 75, 130, 124])
def test_done_stopped_interrupted_and_timed_out_jobs_are_never_restarted(code):
    d = _decide(code, [Lost(0, 9)])
    assert not d.restart and d.why == ""


def test_a_job_the_launcher_was_told_to_stop_or_that_lost_no_rank_is_not_restarted():
    assert _decide(137, [Lost(0, 9)], stopped=True) == _restart.Decision(False, "")
    d = _decide(1, [])
    assert not d.restart and "without losing a rank" in d.why


def test_hosts_and_hostfiles_parse_and_place(tmp_path):
    assert _restart.parse_hosts("a, b:3,\nc") == [("a", None), ("b", 3), ("c", None)]
    f = tmp_path / "hosts"
    f.write_text("# nodes\nn1:2\nn2 slots=2  # Open MPI style\n\nn3\n")
    assert _restart.read_hostfile(str(f)) == [("n1", 2), ("n2", 2), ("n3", None)]
    assert _restart.place(_restart.read_hostfile(str(f)), 6) == [("n1", 2), ("n2", 2), ("n3", 2)]
    for bad, msg in (("a,a", "listed twice"), ("a:0", "NAME:SLOTS"), (",", "no host")):
        with pytest.raises(ValueError, match=msg):
            _restart.parse_hosts(bad)
    with pytest.raises(ValueError, match="do not spread evenly"):
        _restart.place([("a", None), ("b", None)], 3)
    with pytest.raises(ValueError, match="give -n 4"):
        _restart.place([("a", 2), ("b", 2)], 6)


def test_hosts_reach_each_mpiexec_in_its_own_spelling():
    argv, _ = launch.build_command(4, ["true"], mpiexec="mpiexec", vendor="mpich", env={}, hosts=[("a", 2), ("b", 2)])
    assert argv[:5] == ["mpiexec", "-n", "4", "-hosts", "a:2,b:2"]
    argv, _ = launch.build_command(4, ["true"], mpiexec="mpirun", vendor="openmpi", env={}, hosts=[("a", 2), ("b", 2)])
    assert argv[:5] == ["mpirun", "-n", "4", "--host", "a:2,b:2"]


def _latest(tmp_path):
    ck = tmp_path / "ck"
    (ck / "latest").mkdir(parents=True)
    return ck


def test_a_relaunched_train_resumes_from_latest_whatever_its_own_resume_flags(tmp_path):
    ck = _latest(tmp_path)
    cmd = ["hpcfsdp", "train", "--steps", "9", "--resume-from", "step-2", "--checkpoint-dir", str(ck),
           "--no-resume", "--resume-if-exists"]
    new, where = _restart.resume_command(cmd)
    assert new == ["hpcfsdp", "train", "--steps", "9", "--checkpoint-dir", str(ck), "--resume",
                   "--no-resume-if-exists", "--resume-from", "none"]
    assert where == f"resuming from {ck}/latest"
    again, _ = _restart.resume_command(new)  # a second restart: the same command
    assert again == new
    py = [sys.executable, "-m", "mpi4py", "-m", "hpcfsdp.cli.main", "train", f"--checkpoint-dir={ck}",
          "--resume-from=3"]
    assert _restart.resume_command(py)[0] == py[:-1] + ["--resume", "--no-resume-if-exists", "--resume-from", "none"]


def test_the_checkpoint_dir_of_a_config_file_counts(tmp_path):
    ck = _latest(tmp_path)
    conf = tmp_path / "run.toml"
    conf.write_text(f'checkpoint_dir = "{ck}"\nresume_if_exists = true\n')
    new, where = _restart.resume_command(["hpcfsdp", "train", "--config", str(conf)])
    assert new[-4:] == ["--resume", "--no-resume-if-exists", "--resume-from", "none"] and str(ck) in where


def test_without_a_checkpoint_or_train_the_command_reruns_unchanged(tmp_path):
    cmd = ["hpcfsdp", "train", "--checkpoint-dir", str(tmp_path / "none-yet"), "--resume-if-exists"]
    assert _restart.resume_command(cmd) == (cmd, f"no checkpoint in {tmp_path / 'none-yet'} yet: starting again "
                                                 "from the command's own start")
    assert _restart.resume_command(["hpcfsdp", "train"])[1].startswith("no --checkpoint-dir")
    assert _restart.resume_command(["python", "x.py", "train"])[1].endswith("rerun unchanged")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID",
                        "HPCFSDP_RANKS_PER_NODE")}
    env.update(extra)
    return env


def _stand_in(tmp_path, script):
    """A Hydra stand-in: records each start's argv as a line of tmp_path/starts, then runs ``script`` (sh) with
    $n the start's number (1, 2, ...)."""
    fake = tmp_path / "mpiexec"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "HYDRA build details: stand-in"; exit 0; fi
        case "$*" in *_shm.py*) echo "$*" >> {tmp_path}/cleanings; exit 0 ;; esac  # the per-host cleaning step
        echo "$*" >> {tmp_path}/starts
        n=$(wc -l < {tmp_path}/starts)
        """) + textwrap.dedent(script))
    fake.chmod(0o755)
    return fake


def _launch(tmp_path, fake, *args):
    return subprocess.run([*HPC, "launch", "--mpiexec", str(fake), *args, "--", "true"], capture_output=True,
                          text=True, timeout=60, env=_clean_env(), cwd=tmp_path)


_KILL_B = """\
    if [ "$n" -le {fails} ]; then
        echo "hpcfsdp: rank {rank} (host {host}, pid 4242) killed by SIGKILL (signal 9) without a Python traceback" >&2
        exit 137
    fi
    exit 0
    """


@pytest.mark.timeout(60)
def test_a_job_that_lost_a_host_reruns_on_the_others(tmp_path):
    fake = _stand_in(tmp_path, _KILL_B.format(fails=1, rank=3, host="b"))
    out = _launch(tmp_path, fake, "-n", "6", "--hosts", "a,b,c", "--max-restarts", "2", "--min-ranks", "2")
    assert out.returncode == 0, out.stderr
    starts = (tmp_path / "starts").read_text().splitlines()
    assert len(starts) == 2
    assert starts[0].startswith("-n 6 -hosts a:2,b:2,c:2 ") and starts[1].startswith("-n 4 -hosts a:2,c:2 "), starts
    cleanings = (tmp_path / "cleanings").read_text().splitlines()  # after the failed run, one process per host
    assert len(cleanings) == 1 and cleanings[0].startswith("-n 3 -hosts a:1,b:1,c:1 "), cleanings
    assert ("hpcfsdp launch: restart 1/2: lost rank 3 (host b, SIGKILL); dropping host(s) b; restarting on 4 rank(s) "
            "(hosts a:2, c:2), the command is not `hpcfsdp train`: rerun unchanged") in out.stderr


@pytest.mark.timeout(60)
def test_restarts_used_up_end_with_the_failures_status_and_say_why(tmp_path):
    fake = _stand_in(tmp_path, _KILL_B.format(fails=9, rank=0, host="vm"))
    out = _launch(tmp_path, fake, "-n", "4", "--max-restarts", "2")
    assert out.returncode == 137, out.stderr
    starts = (tmp_path / "starts").read_text().splitlines()
    assert [s.split()[:2] for s in starts] == [["-n", "4"], ["-n", "3"], ["-n", "2"]]
    assert out.stderr.count("hpcfsdp launch: restart ") == 2
    assert out.stderr.rstrip().endswith("lost rank 0 (host vm, SIGKILL); not restarted: --max-restarts 2 used up; "
                                        "exit 137")


@pytest.mark.timeout(60)
def test_below_min_ranks_the_job_is_not_restarted(tmp_path):
    fake = _stand_in(tmp_path, _KILL_B.format(fails=9, rank=1, host="vm"))
    out = _launch(tmp_path, fake, "-n", "2", "--max-restarts", "3", "--min-ranks", "2")
    assert out.returncode == 137 and len((tmp_path / "starts").read_text().splitlines()) == 1
    assert "not restarted: 1 rank(s) would remain, fewer than --min-ranks 2; exit 137" in out.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [75, 130, 1])
def test_stopped_interrupted_or_plainly_failing_jobs_run_once(tmp_path, code):
    fake = _stand_in(tmp_path, f"exit {code}\n")
    out = _launch(tmp_path, fake, "-n", "2", "--max-restarts", "3")
    assert out.returncode == code and len((tmp_path / "starts").read_text().splitlines()) == 1
    assert ("without losing a rank: not restarted" in out.stderr) == (code == 1), out.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,msg", [
    (["-n", "2", "--min-ranks", "3"], "--min-ranks 3 must be 1..2 (-n)"),
    (["-n", "2", "--max-restarts", "-1"], "--max-restarts -1 must be 0 or more"),
    (["-n", "3", "--hosts", "a,b"], "do not spread evenly"),
    (["-n", "2", "--hosts", "a", "--hostfile", "f"], "give --hosts or --hostfile, not both"),
])
def test_bad_restart_arguments_are_one_line_and_exit_2(tmp_path, args, msg):
    out = subprocess.run([*HPC, "launch", *args, "--", "true"], capture_output=True, text=True, timeout=60,
                         env=_clean_env())
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("hpcfsdp launch: error: ") and msg in out.stderr and out.stderr.count("\n") == 1


def test_remove_since_keeps_older_and_mapped_segments(tmp_path):
    import mmap
    import time

    from hpcfsdp.cli import _shm

    old = tmp_path / "mpich_shm_old_0"
    old.write_bytes(b"x" * 16)
    since = time.time() + 0.05
    time.sleep(0.1)
    new, mapped, other = (tmp_path / n for n in ("mpich_shm_new_0", "vader_segment.h.1", "unrelated"))
    for f in (new, mapped, other):
        f.write_bytes(b"x" * 4096)
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert _shm.remove_since(since, str(tmp_path)) == ["mpich_shm_new_0"]
    assert sorted(os.listdir(tmp_path)) == ["mpich_shm_old_0", "unrelated", "vader_segment.h.1"]


def test_a_lost_proxy_drops_the_hosts_that_do_not_answer():
    placed = _restart.place([("a", 2), ("b", 2), ("c", 2)], 6)
    proxy = Lost(_restart.PROXY_LOST, 0)
    d = _decide(255, [proxy], nprocs=6, hosts=placed, unreachable={"b"})
    assert d.restart and d.hosts == (("a", 2), ("c", 2)) and d.nprocs == 4
    assert d.why == "mpiexec lost a host's proxy (unreachable: b); dropping host(s) b"
    d = _decide(255, [proxy], nprocs=6, hosts=placed)  # every host answers: the same hosts again
    assert d.restart and d.nprocs == 6 and d.why == "mpiexec lost a host's proxy (every host answers again)"
    d = _decide(255, [proxy, Lost(0, 9, "a")], nprocs=6, hosts=placed, unreachable={"c"})
    assert d.hosts == (("b", 2),) and "lost rank 0 (host a, SIGKILL); mpiexec lost a host's proxy" in d.why
    d = _decide(255, [proxy])  # one machine, no host list: which host is unknown
    assert not d.restart and "cannot tell which host" in d.why


def test_relay_stderr_reports_hydras_lost_proxy():
    data = (b"[mpiexec@hd] control_cb (/mpich/src/pm/hydra/mpiexec/pmiserv_cb.c:280): assert (!closed) failed\n"
            b"[mpiexec@hd] main (/mpich/mpiexec.c:270): process manager error waiting for completion\n")
    chunks = iter([data])
    dst_r, dst_w = os.pipe()
    got = []
    launch.relay_stderr(lambda: next(chunks, b""), dst_w, lambda rank, sig: None, on_lost=got.append)
    os.close(dst_w)
    os.close(dst_r)
    assert got == [Lost(_restart.PROXY_LOST, 0)]
