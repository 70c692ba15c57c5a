"""Real ranks killed by kill -9 (system tier): `hpcfsdp launch --max-restarts` reruns the training on what
survives and it resumes from the newest checkpoint, on one machine and across simulated hosts; under plain
mpiexec the killed rank is named.

Each training test prints its efficiency (the summed step durations of the logged steps over the job's wall
time, restart included): BENCHMARKS.md, "restarts without ULFM".
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from cluster.harness import NET_ENV, ROOT, _mpiexec

pytestmark = pytest.mark.system

PY = sys.executable
HPC = [PY, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2", "--checkpoint-interval", "1"]
STEPS = 30


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID",
                        "HPCFSDP_RANKS_PER_NODE", "HPCFSDP_TRAIN_CRASH_AFTER_STEP", "HPCFSDP_PROGRESS")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _records(path):
    try:
        with open(path) as f:
            return [json.loads(ln) for ln in f if ln.strip().endswith("}")]
    except OSError:
        return []


def _train_ranks(mark, wrapped=True):
    """{rank: pid} of the training processes whose command line holds ``mark`` (not their rank wrappers)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
        except OSError:
            continue
        if (not os.path.basename(argv[0]).startswith("python") or "hpcfsdp.cli.rankwrap" in argv
                or "train" not in argv or not any(mark in a for a in argv) or "launch" in argv):
            continue
        if wrapped and not is_wrapped(int(pid)):
            continue
        if env.get("PMI_RANK", "").isdigit():
            found[int(env["PMI_RANK"])] = int(pid)
    return found


def is_wrapped(pid):
    from hpcfsdp.cli.rankwrap import is_rank_wrapper

    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    return is_rank_wrapper(ppid)


def _kill_when_trained(proc, metrics, mark, victim, nranks, after=4, limit=60):
    """SIGKILL rank ``victim``'s training process once every one of ``nranks`` runs and step ``after`` is logged;
    returns the last step logged before."""
    deadline = time.monotonic() + limit
    while True:
        assert proc.poll() is None, f"the job ended before the kill:\n{''.join(o or '' for o in proc.communicate())}"
        assert time.monotonic() < deadline, f"step {after} not logged within {limit} s"
        steps = [r["step"] for r in _records(metrics) if "loss" in r]
        ranks = _train_ranks(mark)
        if steps and steps[-1] >= after and len(ranks) == nranks:
            break
        time.sleep(0.2)
    os.kill(ranks[victim], signal.SIGKILL)
    return steps[-1], ranks[victim]


def _check_resumed(out, rc, metrics, seen, world, wall):
    """The job ended 0 at STEPS, resumed once at a step >= ``seen`` - 1 on ``world`` ranks; each step after the resume
    point logged once; returns the efficiency."""
    assert rc == 0, out[-4000:]
    m = re.search(r"hpcfsdp launch: restart 1/2: (?:lost rank \d+|mpiexec lost a host).*; restarting on (\d+) rank\(s\).*, resuming from "
                  r"\S+/latest \(step (\d+)\)", out)
    assert m, out[-4000:]
    assert int(m[1]) == world
    resumed = int(m[2])
    # a step is logged, then saved (train.py: a saved step always has its record), so a kill between the two
    # resumes one step before the last record seen; the trimmed log then holds each later step once
    assert resumed >= seen - 1, (resumed, seen)
    assert f"resumed from {os.path.dirname(metrics)}/ck/latest at step {resumed}" in out
    assert re.search(rf"over steps {resumed + 1}\.\.{STEPS}; ", out), out[-2000:]
    recs = _records(metrics)
    starts = [(r["step"], r["world_size"], r.get("resumed_from")) for r in recs if "world_size" in r]
    assert starts[-1] == (resumed + 1, world, resumed), starts
    steps = [r["step"] for r in recs if "loss" in r]
    assert sorted(s for s in steps if s > resumed) == list(range(resumed + 1, STEPS + 1)), steps  # each once
    assert len(set(steps)) == len(steps), steps  # nothing logged twice
    busy = sum(r["step_time_s"] for r in recs if "loss" in r)
    eff = busy / wall
    print(f"\nefficiency {eff:.3f}: steps {busy:.2f} s of {wall:.2f} s wall, resumed at step {resumed} "
          f"on {world} ranks")
    return eff


@pytest.mark.timeout(120)
def test_kill9_of_a_rank_restarts_on_the_survivors_and_resumes_from_the_last_checkpoint(tmp_path):
    metrics = str(tmp_path / "metrics.jsonl")
    t0 = time.monotonic()
    proc = subprocess.Popen([*HPC, "launch", "-n", "4", "--max-restarts", "2", "--min-ranks", "2", "--timeout", "100",
                             "--", "hpcfsdp", "train", *TINY, "--steps", str(STEPS), "--out-dir", str(tmp_path),
                             "--checkpoint-dir", str(tmp_path / "ck")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen, _ = _kill_when_trained(proc, metrics, str(tmp_path), victim=2, nranks=4)
        out = proc.communicate(timeout=90)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - t0
    assert "hpcfsdp: rank 2 (host " in out and "killed by SIGKILL (signal 9)" in out
    _check_resumed(out, proc.returncode, metrics, seen, world=3, wall=wall)


@pytest.mark.timeout(90)
def test_under_plain_mpiexec_a_killed_rank_is_named(tmp_path):
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    script = os.path.join(os.path.dirname(PY), "hpcfsdp")
    proc = subprocess.Popen([mpiexec, "-n", "4", script, "train", *TINY, "--steps", "100000", "--out-dir",
                             str(tmp_path), "--checkpoint-dir", str(tmp_path / "ck")], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, pid = _kill_when_trained(proc, str(tmp_path / "metrics.jsonl"), str(tmp_path), victim=1, nranks=4, after=2)
        t0 = time.monotonic()
        err = proc.communicate(timeout=30)[1]
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert (f"hpcfsdp: rank 1 (host {socket.gethostname()}, pid {pid}) killed by SIGKILL (signal 9) without a "
            "Python traceback") in err, err[-3000:]
    assert took < 10, took


def _stand_in(cluster, path):
    """An mpiexec for `hpcfsdp launch --hosts`: Hydra in the head namespace, the cluster's ssh stand-in, TCP between
    hosts, and the hosts the launcher gives (the harness's own stand-in picks them itself)."""
    real = _mpiexec()
    genv = " ".join(f"-genv {k} {v}" for k, v in NET_ENV[cluster.net].items())
    path.write_text(f"""#!/bin/sh
case "$1" in --version|-version|-info) exec {real} "$@" ;; esac
exec ip netns exec {cluster.head} unshare --uts -- sh -c 'hostname "$0" && exec "$@"' {cluster.head} \\
    {real} -launcher ssh -launcher-exec {cluster.dir}/nsexec {genv} "$@"
""")
    path.chmod(0o755)
    return str(path)


@pytest.mark.timeout(150)
def test_a_rank_killed_on_one_of_3_hosts_restarts_on_the_2_others(cluster, tmp_path):
    mpiexec = _stand_in(cluster, tmp_path / "mpiexec")
    hosts = cluster.hosts[:3]
    metrics = str(tmp_path / "metrics.jsonl")
    t0 = time.monotonic()
    proc = subprocess.Popen([*HPC, "launch", "--mpiexec", mpiexec, "-n", "6", "--hosts", ",".join(hosts),
                             "--max-restarts", "2", "--min-ranks", "2", "--timeout", "130", "--", "hpcfsdp", "train",
                             *TINY, "--steps", str(STEPS), "--out-dir", str(tmp_path), "--checkpoint-dir",
                             str(tmp_path / "ck")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen, _ = _kill_when_trained(proc, metrics, str(tmp_path), victim=3, nranks=6, limit=90)  # on hosts[1]
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - t0
    assert f"hpcfsdp: rank 3 (host {hosts[1]}, pid " in out, out[-3000:]
    assert f"dropping host(s) {hosts[1]}; restarting on 4 rank(s) (hosts {hosts[0]}:2, {hosts[2]}:2)" in out, out[-3000:]
    _check_resumed(out, proc.returncode, metrics, seen, world=4, wall=wall)


def _private_shm_stand_in(cluster, tmp_path):
    """Like _stand_in, but each host gets a /dev/shm of its own (tmp_path/shm/<host>, bind-mounted where its
    processes run), as real hosts have: the harness's hosts share the machine's; and a host with a file
    tmp_path/down/<host> cannot be reached (the ssh stand-in fails as ssh to a dead host does)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    (tmp_path / "down").mkdir()
    nsexec = tmp_path / "nsexec"
    nsexec.write_text(f"""#!/bin/sh
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-p|-l|-i|-F|-E|-b|-c|-m|-J|-L|-R|-D|-W|-w) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=$1; shift
case "$host" in
    10.77.0.*) ns="{cluster.name}-h$((${{host##*.}} - 1))" ;;
    *) ns=$host ;;
esac
[ -e "{tmp_path}/down/$ns" ] && {{ echo "ssh: connect to host $ns: No route to host" >&2; exit 255; }}
mkdir -p "{shm}/$ns"
exec ip netns exec "$ns" unshare --uts -- sh -c 'mount --bind "$2" /dev/shm && hostname "$0" && exec sh -c "$1"' \\
    "$ns" "$*" "{shm}/$ns"
""")
    nsexec.chmod(0o755)
    real = _mpiexec()
    genv = " ".join(f"-genv {k} {v}" for k, v in NET_ENV[cluster.net].items())
    mpiexec = tmp_path / "mpiexec"
    mpiexec.write_text(f"""#!/bin/sh
case "$1" in --version|-version|-info) exec {real} "$@" ;; esac
exec ip netns exec {cluster.head} unshare --uts -- sh -c 'hostname "$0" && exec "$@"' {cluster.head} \\
    {real} -launcher ssh -launcher-exec {nsexec} {genv} "$@"
""")
    mpiexec.chmod(0o755)
    return str(mpiexec), shm


def _segments(d):
    return sorted(n for n in os.listdir(d) if n.startswith(("mpich_shm_", "vader_segment.", "sm_segment.")))


@pytest.mark.timeout(120)
def test_the_segments_of_a_killed_job_are_removed_on_every_host(cluster, tmp_path):
    mpiexec, shm = _private_shm_stand_in(cluster, tmp_path)
    hosts = cluster.hosts[:2]
    job = os.path.join(ROOT, "tests", "cluster", "_job.py")
    proc = subprocess.Popen([*HPC, "launch", "--mpiexec", mpiexec, "-n", "4", "--hosts", ",".join(hosts),
                             "--timeout", "100", "--", PY, job, "hang", str(tmp_path)],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        files = [tmp_path / f"rank{r}.pid" for r in range(4)]
        deadline = time.monotonic() + 60
        while not all(f.exists() for f in files):
            assert proc.poll() is None, f"the job ended before every rank started:\n{proc.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "the ranks did not all start within 60 s"
            time.sleep(0.2)
        time.sleep(1.0)  # inside their all-reduce loop
        held = {h: _segments(shm / h) for h in hosts}
        assert all(held.values()), f"each host's ranks share a segment in its /dev/shm: {held}"
        os.kill(int((tmp_path / "rank3.pid").read_text().split()[0]), signal.SIGKILL)  # on hosts[1]
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert f"hpcfsdp: rank 3 (host {hosts[1]}, pid " in out, out[-3000:]
    left = {h: _segments(shm / h) for h in hosts}
    assert left == {h: [] for h in hosts}, f"segments left behind: {left}\n{out[-3000:]}"
    for h in hosts:
        assert re.search(rf"hpcfsdp launch: removed \d+ shared-memory segment\(s\) the job left on {h}: ", out), \
            out[-3000:]


@pytest.mark.timeout(150)
def test_a_host_lost_with_all_its_ranks_is_found_by_probing_and_dropped(cluster, tmp_path):
    # no rank wrapper is left to name anything: Hydra only says it lost a proxy; the launcher probes each host
    mpiexec, _ = _private_shm_stand_in(cluster, tmp_path)
    hosts = cluster.hosts[:3]
    metrics = str(tmp_path / "metrics.jsonl")
    t0 = time.monotonic()
    proc = subprocess.Popen([*HPC, "launch", "--mpiexec", mpiexec, "-n", "6", "--hosts", ",".join(hosts),
                             "--max-restarts", "2", "--min-ranks", "2", "--timeout", "130", "--", "hpcfsdp", "train",
                             *TINY, "--steps", str(STEPS), "--out-dir", str(tmp_path), "--checkpoint-dir",
                             str(tmp_path / "ck")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"the job ended early:\n{proc.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "step 4 not logged within 90 s"
            steps = [r["step"] for r in _records(metrics) if "loss" in r]
            if steps and steps[-1] >= 4 and len(_train_ranks(str(tmp_path))) == 6:
                break
            time.sleep(0.2)
        seen = steps[-1]
        (tmp_path / "down" / hosts[1]).write_text("")  # unreachable from now on
        for pid in subprocess.run(["ip", "netns", "pids", hosts[1]], capture_output=True, text=True,
                                  timeout=30).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)  # the host's proxy, rank wrappers and ranks: as if it died
            except ProcessLookupError:
                pass
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - t0
    assert (f"mpiexec lost a host's proxy (unreachable: {hosts[1]}); dropping host(s) {hosts[1]}; restarting on 4 "
            f"rank(s) (hosts {hosts[0]}:2, {hosts[2]}:2)") in out, out[-3000:]
    _check_resumed(out, proc.returncode, metrics, seen, world=4, wall=wall)
