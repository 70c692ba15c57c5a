"""Run the whole test suite: serial tests, then MPI tests at 2 and at 4 ranks; fail if any part fails.

Usage: python tests/run_all.py [--system] [--quick] [extra pytest args]
Every test has a timeout (setup.cfg), and every MPI phase has an overall one, so a deadlock fails
in seconds instead of hanging CI. pytest's exit code 5 (no tests collected) counts as a failure:
each phase is expected to run tests.

`--system` adds the system tier after those phases: tests marked `system`, which need root or a long
setup (simulated hosts on network namespaces), and the GPU code paths on the simulated CUDA device
(hpcfsdp/testing/cuda_sim.py, serially, and at 2 and 4 ranks on NCCL and staged), within SYSTEM_TIMEOUT. There a test whose setup cannot
start fails instead of skipping (HPCFSDP_SYSTEM_TIER=1), and so does a system test that is skipped. Its Open MPI
tests take the python of HPCFSDP_OMPI_PYTHON (default .venv-ompi beside this checkout's .venv).
Its peer phases run tests/ported on PyTorch (the `peer` extra), all of it.
"""
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PHASE_TIMEOUT = float(os.environ.get("HPCFSDP_TEST_PHASE_TIMEOUT", "1500"))
_SIM = {"HPCFSDP_CUDA_SIM": "1"}
SYSTEM_TIMEOUT = float(os.environ.get("HPCFSDP_SYSTEM_TIMEOUT", "2400"))  # the system tier: 40 minutes


def _counts(xml_path):
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root)
    tot = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for k in tot:
            tot[k] += int(s.get(k, 0))
    return tot


def _have_torch(py) -> bool:
    """Whether ``py`` imports torch (the peer phases run the ported tests on PyTorch with the same python)."""
    return subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0


def _phase(name, argv, env, xml, logdir, timeout=PHASE_TIMEOUT):
    print(f"\n===== {name}: {' '.join(argv)}", flush=True)
    t0 = time.time()
    try:
        rc = subprocess.run(argv, env=env, cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    took = time.time() - t0
    print(f"===== {name}: exit {rc} in {took:.0f} s", flush=True)
    if rc != 0 and logdir:
        for f in sorted(os.listdir(logdir)):
            text = open(os.path.join(logdir, f), errors="replace").read()
            if "failed" in text or "Error" in text or "Timeout" in text:
                print(f"----- {f} (tail)\n{text[-4000:]}", flush=True)
    return rc, _counts(xml), took


def main() -> int:
    system = "--system" in sys.argv[1:]
    extra = [a for a in sys.argv[1:] if a not in ("--quick", "--system")]
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    tmp = tempfile.mkdtemp(prefix="hpcfsdp-tests-")
    py = sys.executable
    phases = [("serial", [py, "-m", "pytest", "-m", "not mpi and not system", "tests"], None)]
    for n in (2, 4):
        logdir = os.path.join(tmp, f"np{n}")
        os.makedirs(logdir)
        argv = [py, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--timeout", str(PHASE_TIMEOUT), "--",
                py, "tests/_mpi_pytest.py", "--with-mpi", "-m", "mpi", "-q", "tests"]
        phases.append((f"mpi-{n}", argv, logdir))
    if system:
        # every cupy name the GPU phases use is recorded, then checked against the installed CuPy by the system
        # phase (tests/test_cupy_names.py): the next CuPy API change fails CI, not a user
        names = os.path.join(tmp, "cupy-names")
        os.makedirs(names)
        sim = dict(_SIM, HPCFSDP_CUDA_SIM_RECORD=names)
        phases.append(("gpu-sim", [py, "-m", "pytest", "-m", "gpu and not mpi", "tests"], None, sim))
        # each GPU path at 2 and 4 ranks: NCCL (every simulated rank has GPUs of its own), and staged through
        # pinned host memory (the fixtures of tests/test_gpu_fsdp.py add the CUDA-aware MPI path)
        for path in ("nccl", "staged"):
            for n in (2, 4):
                logdir = os.path.join(tmp, f"sim-{path}-np{n}")
                os.makedirs(logdir)
                argv = [py, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--timeout", str(PHASE_TIMEOUT), "--",
                        py, "tests/_mpi_pytest.py", "--with-mpi", "-m", "gpu and mpi", "-q", "tests"]
                phases.append((f"gpu-sim-{path}-mpi-{n}", argv, logdir, dict(sim, HPCFSDP_GPU_COMM=path)))
        phases.append(("system", [py, "-m", "pytest", "-m", "system", "-rs", "tests"], None))
        for n in (2, 4):
            logdir = os.path.join(tmp, f"peer-np{n}")
            os.makedirs(logdir)
            argv = [py, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--timeout", str(PHASE_TIMEOUT), "--",
                    py, "tests/_mpi_pytest.py", "--with-mpi", "-m", "mpi", "-q", "tests/ported"]
            phases.append((f"peer-mpi-{n}", argv, logdir, {"HPCFSDP_PORT_FRAMEWORK": "torch"}))
    failed, totals, times = [], {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}, []
    for name, argv, logdir, *extra_env in phases:
        xml = os.path.join(tmp, f"{name}.xml")
        if name.startswith("peer-") and not _have_torch(py):
            print(f"===== {name}: PyTorch is not importable by {py} (pip install -e '.[peer]'): counted as a failure",
                  flush=True)
            failed.append(name)
            continue
        penv = dict(env, HPCFSDP_TEST_LOGDIR=logdir or "", **(extra_env[0] if extra_env else {}))
        if name == "system":
            penv["HPCFSDP_SYSTEM_TIER"] = "1"
            # the Open MPI environment of the Open MPI system tests (.ci/run builds it; see tests/cluster/harness.py)
            penv.setdefault("HPCFSDP_OMPI_PYTHON", os.path.join(ROOT, ".venv-ompi", "bin", "python"))
            penv["HPCFSDP_TEST_CUPY_NAMES"] = names
        argv = argv + [f"--junitxml={xml}", *extra]
        rc, counts, took = _phase(name, argv, penv, xml, logdir, SYSTEM_TIMEOUT if name == "system" else PHASE_TIMEOUT)
        times.append((name, took))
        if rc == 5:
            print(f"===== {name}: pytest collected no tests (exit 5): counted as a failure", flush=True)
        if name == "system" and counts and counts["skipped"]:
            print(f"===== system: {counts['skipped']} test(s) skipped: counted as a failure", flush=True)
            rc = rc or 1
        if rc != 0:
            failed.append(name)
        if counts:
            for k in totals:
                totals[k] += counts[k]
    bad = totals["failures"] + totals["errors"]
    passed = totals["tests"] - bad - totals["skipped"]
    print("\nphase times: " + ", ".join(f"{n} {t:.0f} s" for n, t in times))
    print(f"phases failed: {', '.join(failed) or 'none'}")
    print(f"hpcfsdp-tests: {passed} passed, {bad} failed, {totals['skipped']} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
