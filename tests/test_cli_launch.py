"""The launcher: mpiexec discovery, per-vendor arguments, abort-on-exception, timeouts."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hpcfsdp.cli import launch

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]


def test_openmpi_as_root_gets_oversubscribe_and_root_variables(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    argv, env = launch.build_command(4, ["python", "x.py"], mpiexec="/x/mpiexec", vendor="openmpi", env={})
    assert argv[:4] == ["/x/mpiexec", "-n", "4", "--oversubscribe"]
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert argv[4:8] == launch.rank_env_wrapper("openmpi")
    assert argv[8:11] == [sys.executable, "-m", "mpi4py"] and argv[-1] == "x.py"


def test_mpich_gets_nothing_extra(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    argv, env = launch.build_command(2, ["/usr/bin/python3", "-c", "pass"], mpiexec="m", vendor="mpich", env={})
    assert argv == ["m", "-n", "2", "-print-all-exitcodes", *launch.rank_env_wrapper("mpich"),
                    "/usr/bin/python3", "-m", "mpi4py", "-c", "pass"]
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env


def test_non_python_commands_are_left_alone():
    argv, _ = launch.build_command(2, ["hostname"], mpiexec="m", vendor="openmpi", env={})
    assert argv[-1] == "hostname" and "mpi4py" not in argv


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive number of ranks"):
        launch.build_command(0, ["x"], mpiexec="m", vendor="mpich", env={})
    with pytest.raises(ValueError, match="no command given"):
        launch.build_command(2, [], mpiexec="m", vendor="mpich", env={})
    with pytest.raises(ValueError, match="--ranks-per-node 3 must divide -n 4"):
        launch.launch(4, ["true"], ranks_per_node=3)


def test_missing_mpiexec_names_the_extras(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(FileNotFoundError, match=r"hpcfsdp\[mpich\]"):
        launch.find_mpiexec()


def test_vendor_detected_from_installed_mpiexec():
    assert launch.mpi_vendor(launch.find_mpiexec()) in ("mpich", "openmpi")


def test_one_failing_rank_aborts_the_job(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "if MPI.COMM_WORLD.rank == 2:\n"
        "    raise RuntimeError('rank 2 fails on purpose')\n"
        "MPI.COMM_WORLD.Barrier()\n"
    )
    t0 = time.time()
    out = subprocess.run(HPC + ["launch", "-n", "4", "--", "python", str(script)], capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 15
    assert out.returncode != 0
    assert "rank 2 fails on purpose" in out.stderr and "Traceback" in out.stderr


def test_timeout_kills_the_job(tmp_path):
    t0 = time.time()
    out = subprocess.run(HPC + ["launch", "-n", "2", "--timeout", "2", "--", "python", "-c", "import time; time.sleep(60)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 124 and time.time() - t0 < 20
    assert "--timeout" in out.stderr


def test_ranks_per_node_reaches_the_ranks():
    out = subprocess.run(HPC + ["launch", "-n", "2", "--ranks-per-node", "1", "--", "python", "-c",
                                "import os; os.write(1, ('RPN %s\\n' % os.environ['HPCFSDP_RANKS_PER_NODE']).encode())"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count("RPN 1") == 2


def test_help_of_every_command():
    out = subprocess.run(HPC + ["launch", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--ranks-per-node" in out.stdout


_SHOW_RANK_ENV = ("import os; os.write(1, ('ENV %s %s %s %s\\n' % tuple(os.environ.get(k) for k in "
                  "('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE'))).encode())")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID")}
    env.update(extra)
    return env


@pytest.mark.parametrize("rpn,local", [(None, ["0 2", "1 2"]), ("1", ["0 1", "0 1"])])
def test_launched_command_sees_torchrun_variables_before_any_import(rpn, local):
    opts = ["--ranks-per-node", rpn] if rpn else []
    out = subprocess.run(HPC + ["launch", "-n", "2", *opts, "--", "python", "-c", _SHOW_RANK_ENV],
                         capture_output=True, text=True, timeout=60, env=_clean_env())
    assert out.returncode == 0, out.stderr
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("ENV"))
    assert lines == [f"ENV 0 2 {local[0]}", f"ENV 1 2 {local[1]}"]


def test_user_rank_that_disagrees_with_mpi_is_an_error():
    out = subprocess.run(HPC + ["launch", "-n", "2", "--", "python", "-c", "import hpcfsdp.distributed"],
                         capture_output=True, text=True, timeout=60, env=_clean_env(RANK="7"))
    assert out.returncode != 0
    assert "RANK=7 in the environment disagrees with PMI_RANK of MPICH/Hydra: this process has RANK=0" in out.stderr


def test_a_stale_rank_under_an_hpcfsdp_command_is_one_line_for_the_job(tmp_path):
    out = subprocess.run(HPC + ["launch", "-n", "2", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train",
                                "--steps", "1", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size",
                                "16", "--vocab-size", "256", "--batch-size", "2"],
                         capture_output=True, text=True, timeout=120, env=_clean_env(RANK="7"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("disagrees with") == 1, out.stderr
    assert "hpcfsdp train: error: RANK=7 in the environment disagrees with PMI_RANK" in out.stderr


def test_variables_an_hpcfsdp_process_exported_are_replaced_in_a_new_job():
    env = _clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", HPCFSDP_RANK_ENV_PID="1")
    out = subprocess.run(HPC + ["launch", "-n", "2", "--", "python", "-c", _SHOW_RANK_ENV],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert sorted(line for line in out.stdout.splitlines() if line.startswith("ENV")) == ["ENV 0 2 0 2",
                                                                                         "ENV 1 2 1 2"]


@pytest.mark.parametrize("vendor,variables", [
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}),
    ("mpich", {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}),
])
def test_rank_env_wrapper_reads_each_vendors_variables(vendor, variables):
    for rpn, local in [(None, "1 4"), (2, "1 2"), (3, "2 3")]:
        argv = launch.rank_env_wrapper(vendor, rpn) + [sys.executable, "-c", _SHOW_RANK_ENV]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_clean_env(**variables))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"ENV 5 8 {local}"
    out = subprocess.run(launch.rank_env_wrapper() + [sys.executable, "-c", _SHOW_RANK_ENV], capture_output=True,
                         text=True, timeout=60, env=_clean_env())
    assert out.stdout.strip() == "ENV None None None None"  # no launcher's variables: nothing is made up


def _relayed(chunks) -> bytes:
    """What relay_stdout writes when mpiexec's stdout delivers ``chunks``, one per read."""
    dst_r, dst_w = os.pipe()
    pending = iter(chunks)
    launch.relay_stdout(lambda: next(pending, b""), dst_w)
    os.close(dst_w)
    with os.fdopen(dst_r, "rb") as f:
        return f.read()


@pytest.mark.parametrize("split", [1, 5, 64, 100000])
def test_relay_stderr_passes_everything_on_and_reports_killed_ranks(split):
    data = (b"rank 0 warning\nhpcfsdp: rank 3 (host h1, pid 77) killed by SIGKILL (signal 9) without a Python "
            b"traceback\nhpcfsdp: rank 2: cannot start 'x': no such file\n"
            b"hpcfsdp: rank 12 (host node-7.cluster, pid 9) killed by SIGSEGV (signal 11) without a Python traceback\n"
            b"tail without newline: hpcfsdp: rank 5 (host h, pid 1) killed by SIGKILL (signal 9)")
    chunks = iter([data[i:i + split] for i in range(0, len(data), split)])
    dst_r, dst_w = os.pipe()
    got = []
    launch.relay_stderr(lambda: next(chunks, b""), dst_w, lambda rank, sig: got.append((rank, sig)))
    os.close(dst_w)
    with os.fdopen(dst_r, "rb") as f:
        assert f.read() == data  # unchanged, nothing held back
    assert got == [(3, 9), (12, 11)]  # whole lines only: the unterminated last one is not a report yet


@pytest.mark.parametrize("split", [1, 3, 7, 1000])
def test_relay_drops_a_successful_exit_codes_line_and_translates_a_failed_one(split):
    ok = b"[mpiexec@node1] Exit codes: [node1] 0,0 [node2] 0,0\n"
    bad = b"[mpiexec@node1] Exit codes: [node1] 0,768\n"
    other = b"[mpiexec@node1] something else Hydra says\n"
    user = b"loss 1.0 [mpiexec@x] is not at a line start\n[mpi"
    data = b"step 1\npartial" + b" line\n" + ok + other + bad + user
    chunks = [data[i:i + split] for i in range(0, len(data), split)]
    said = b"hpcfsdp launch: rank exits by host: node1: 0, 3\n"  # 768 is exit status 3
    assert _relayed(chunks) == b"step 1\npartial line\n" + other + said + user


def test_exit_codes_are_translated_from_wait_statuses():
    from hpcfsdp.cli.launch import translate_exit_codes

    assert translate_exit_codes(b" [vm] 512,512") == b"hpcfsdp launch: rank exits by host: vm: 2, 2\n"
    assert translate_exit_codes(b" [a] 0,9 [b] 256") == b"hpcfsdp launch: rank exits by host: a: 0, signal 9; b: 1\n"


def test_successful_job_prints_no_exit_codes_line():
    r = subprocess.run([*HPC, "launch", "-n", "2", "--", sys.executable, "-c", "print('rank output')"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # Hydra may interleave the two ranks' writes ("rank outputrank output\n\n"): count, don't split lines
    assert r.stdout.count("rank output") == 2 and r.stdout.count("\n") == 2, r.stdout
    assert "Exit codes" not in r.stdout and "Exit codes" not in r.stderr, r.stdout + r.stderr


def test_a_killed_rank_ends_a_job_mpiexec_keeps_waiting_on(tmp_path):
    """What Hydra does across hosts when it loses the dead rank's proxy: a rank's wrapper reports it killed,
    and mpiexec (here a stand-in that ignores SIGINT and waits, with a child of its own) never ends the job.
    The launcher ends it: after LOST_RANK_GRACE it interrupts mpiexec, then kills the whole tree."""
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "mpiexec"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "HYDRA build details: stand-in"; exit 0; fi
        trap '' INT
        sleep 300 &
        echo $! > {pidfile}
        echo "hpcfsdp: rank 3 (host h1, pid 4242) killed by SIGKILL (signal 9) without a Python traceback" >&2
        wait
        """))
    fake.chmod(0o755)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "--mpiexec", str(fake), "-n", "2", "--",
                          "true"], capture_output=True, text=True, timeout=60, env=_clean_env())
    took = time.monotonic() - t0
    assert out.returncode == 128 + 9, (out.returncode, out.stderr)
    assert launch.LOST_RANK_GRACE <= took < 3 * launch.LOST_RANK_GRACE + 5, took
    assert "rank 3 (host h1, pid 4242) killed by SIGKILL" in out.stderr  # the report passed on
    assert "hpcfsdp launch: rank 3 was killed by signal 9 and mpiexec has not ended the job" in out.stderr
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z"


def test_remove_stale_keeps_old_and_mapped_segments(tmp_path):
    from hpcfsdp.cli import _shm

    d = str(tmp_path)
    (tmp_path / "mpich_shm_old_0").write_bytes(b"x" * 4096)
    before = _shm.segments(d)
    for name in ("mpich_shm_dead_0", "mpich_shm_live_0", "vader_segment.n1.2", "unrelated_file"):
        (tmp_path / name).write_bytes(b"x" * 4096)
    live = tmp_path / "mpich_shm_live_0"
    mapper = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import mmap, sys, time
        f = open({str(live)!r}, "r+b")
        m = mmap.mmap(f.fileno(), 4096)
        print("mapped", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert mapper.stdout.readline().strip() == "mapped"
        assert _shm.remove_stale(before, d) == ["mpich_shm_dead_0", "vader_segment.n1.2"]
        assert sorted(os.listdir(d)) == ["mpich_shm_live_0", "mpich_shm_old_0", "unrelated_file"]
    finally:
        mapper.kill()
        mapper.wait()
    assert _shm.remove_stale(before, d) == ["mpich_shm_live_0"]  # its job is gone now


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
def test_launch_removes_the_segments_a_failed_job_left(tmp_path):
    """A job killed before MPI_Finalize leaves MPICH's /dev/shm segment behind; the launcher removes it."""
    tag = f"hpcfsdptest{os.getpid()}"
    old = f"/dev/shm/mpich_shm_{tag}old_0"
    with open(old, "wb") as f:
        f.write(b"x")
    fake = tmp_path / "mpiexec"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "HYDRA build details: stand-in"; exit 0; fi
        head -c 4096 /dev/zero > /dev/shm/mpich_shm_{tag}new_0
        exit 3
        """))
    fake.chmod(0o755)
    try:
        out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "--mpiexec", str(fake), "-n", "2",
                              "--", "true"], capture_output=True, text=True, timeout=60, env=_clean_env())
        assert out.returncode == 3, out.stderr
        assert not os.path.exists(f"/dev/shm/mpich_shm_{tag}new_0")
        assert os.path.exists(old)  # there before the job: not the launcher's to judge
    finally:
        for path in (old, f"/dev/shm/mpich_shm_{tag}new_0"):
            if os.path.exists(path):
                os.unlink(path)
