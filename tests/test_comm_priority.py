"""HPCFSDP_COMM_NICE: the communication thread's niceness relative to the thread that starts it.

Each case runs in a fresh interpreter: raising a thread's niceness cannot be undone without privilege,
so it must not leak into the test process.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's"),
              pytest.mark.timeout(120)]

# Starts the communication thread through a queued collective (so its loop has begun), then reports the
# niceness of the starting thread and of the communication thread. DENY=1 makes lowering a niceness fail
# as it does without CAP_SYS_NICE.
PROBE = textwrap.dedent("""
    import json, os, sys, threading
    if os.environ.get("DENY") == "1":
        real = os.setpriority
        def deny(which, who, prio):
            if prio < os.getpriority(which, who):
                raise PermissionError(13, "Permission denied")
            real(which, who, prio)
        os.setpriority = deny
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    from hpcfsdp.distributed import _comm_thread as CT
    work = CT.execute("probe", lambda: 42, async_op=True)
    assert work.result() == 42
    t = CT.comm_thread()
    print(json.dumps({"base": base,
                      "main": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
                      "comm": os.getpriority(os.PRIO_PROCESS, t._thread.native_id)}))
""")


def _probe(nice, deny=False):
    env = dict(os.environ, HPCFSDP_COMM_NICE=str(nice), DENY="1" if deny else "0")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=100)
    return out


def _ok(out):
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_default_leaves_both_threads_alone():
    r = _ok(_probe(0))
    assert r["main"] == r["base"] and r["comm"] == r["base"]


def test_positive_makes_the_comm_thread_nicer():
    r = _ok(_probe(3))
    assert r["main"] == r["base"] and r["comm"] == r["base"] + 3


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a thread's niceness needs CAP_SYS_NICE (root)")
def test_negative_with_privilege_lowers_the_comm_threads_niceness():
    r = _ok(_probe(-4))
    assert r["main"] == r["base"] and r["comm"] == r["base"] - 4


def test_negative_without_privilege_raises_the_starting_threads_niceness():
    r = _ok(_probe(-4, deny=True))
    assert r["comm"] == r["base"] and r["main"] == r["base"] + 4
    assert r["main"] - r["comm"] == 4  # the same difference as with privilege


@pytest.mark.parametrize("bad", ["fast", "-20", "25", "1.5"])
def test_bad_values_are_refused_by_name(bad):
    out = _probe(bad)
    assert out.returncode != 0
    assert "HPCFSDP_COMM_NICE" in out.stderr and bad in out.stderr
