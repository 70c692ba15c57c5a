"""PyTorch's runtime names on `import hpcfsdp as torch`: hp.cuda, hp.backends and the switches of hpcfsdp._runtime.

The CPU tests pin CuPy's absence (or a CuPy without GPUs) by monkeypatching, so they check PyTorch's CPU-build
answers on any machine. The `gpu` tests run on the simulated device (HPCFSDP_CUDA_SIM=1) or a real GPU.
"""
import ctypes
import importlib
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import _backend, _runtime
from hpcfsdp import backends
from hpcfsdp import cuda as hcuda
from hpcfsdp.backends import cudnn
from hpcfsdp.testing.cuda_sim import CudaSimError

NO_CUDA = "Torch not compiled with CUDA enabled"
RUNTIME_NAMES = ["set_num_threads", "get_num_threads", "set_num_interop_threads", "get_num_interop_threads",
                 "set_float32_matmul_precision", "get_float32_matmul_precision", "use_deterministic_algorithms",
                 "are_deterministic_algorithms_enabled", "is_deterministic_algorithms_warn_only_enabled", "compile"]


@pytest.fixture(autouse=True)
def _restore_switches():
    """Every switch a test flips comes back: runtime state, BLAS threads, backend attributes, peaks."""
    state = dict(_runtime._state)
    threads = _runtime.get_num_threads()
    cudnn_vals = {k: getattr(cudnn, k) for k in cudnn._FLAGS}
    matmul_vals = dict(backends.cuda.matmul._values)
    sdp = dict(backends.cuda._sdp)
    hcuda._peaks.clear()
    yield
    _runtime._state.clear()
    _runtime._state.update(state)
    if _runtime._find_openblas() is not None:
        _runtime._find_openblas()[0](threads)
    for k, v in cudnn_vals.items():
        setattr(cudnn, k, v)
    backends.cuda.matmul._values.update(matmul_vals)
    backends.cuda._sdp.update(sdp)
    hcuda._peaks.clear()


# ---------------------------------------------------------------------------------------------
# wiring
def test_runtime_names_are_top_level_and_submodules_are_attributes():
    for name in RUNTIME_NAMES:
        assert getattr(hp, name) is getattr(_runtime, name)
    assert hp.cuda is importlib.import_module("hpcfsdp.cuda")
    assert hp.backends is backends and hp.backends.cudnn is cudnn
    assert hp.backends.cuda.matmul is backends.cuda.matmul and hp.backends.mps.is_available() is False


def test_import_loads_neither_cuda_nor_backends_nor_cupy():
    code = ("import sys, hpcfsdp as torch\n"
            "mods = ['hpcfsdp.cuda', 'hpcfsdp.backends', 'cupy', 'mpi4py']\n"
            "assert not [m for m in mods if m in sys.modules], [m for m in mods if m in sys.modules]\n"
            "torch.backends.cudnn.benchmark = True\n"
            "print(torch.cuda.is_available() in (True, False), torch.backends.cudnn.benchmark, 'mpi4py' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "HPCFSDP_CUDA_SIM"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "False"]


# ---------------------------------------------------------------------------------------------
# threads
def _numpy_uses_openblas():
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    return "openblas" in str(blas.get("name", "")).lower()


def test_set_num_threads_sets_numpys_openblas():
    path = _runtime.blas_library()
    assert (path is not None) == _numpy_uses_openblas(), path
    if path is None:  # a NumPy on another BLAS: the value is recorded (test below)
        return
    lib = ctypes.CDLL(path)  # the same, already loaded library: a second handle to it
    getter = next(getattr(lib, f"{p}_get_num_threads{s}") for p in _runtime._SYMBOL_PREFIXES
                  for s in _runtime._SYMBOL_SUFFIXES if hasattr(lib, f"{p}_get_num_threads{s}"))
    getter.restype = ctypes.c_int
    for n in (2, 1, 3):
        hp.set_num_threads(n)
        assert hp.get_num_threads() == n
        assert getter() == n  # OpenBLAS itself reports it
    a = np.random.default_rng(0).standard_normal((64, 64))
    np.testing.assert_allclose(a @ np.eye(64), a)  # BLAS still computes after the change


def test_without_openblas_the_count_is_recorded(monkeypatch):
    monkeypatch.setattr(_runtime, "_blas", False)
    monkeypatch.setitem(_runtime._state, "threads", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert hp.get_num_threads() == 5  # PyTorch's default honours OMP_NUM_THREADS
    hp.set_num_threads(3)
    assert hp.get_num_threads() == 3
    hp.set_num_threads(np.int64(4))
    assert hp.get_num_threads() == 4


@pytest.mark.parametrize("fn", ["set_num_threads", "set_num_interop_threads"])
def test_thread_counts_are_validated_as_pytorch(fn):
    f = getattr(hp, fn)
    for bad in (0, -1):
        with pytest.raises(RuntimeError, match=f"{fn} expects a positive integer"):
            f(bad)
    for bad, tname in (("2", "str"), (2.0, "float"), (True, "bool")):
        with pytest.raises(RuntimeError, match=f"{fn} expects an int, but got {tname}"):
            f(bad)


def test_interop_threads_are_recorded():
    hp.set_num_interop_threads(3)
    assert hp.get_num_interop_threads() == 3
    hp.set_num_interop_threads(1)  # PyTorch allows one call only; hpcfsdp has no pool to freeze
    assert hp.get_num_interop_threads() == 1


# ---------------------------------------------------------------------------------------------
# matmul precision, determinism
def test_float32_matmul_precision_and_allow_tf32_are_one_setting():
    assert hp.get_float32_matmul_precision() == "highest" and backends.cuda.matmul.allow_tf32 is False
    for p, tf32 in (("high", True), ("medium", True), ("highest", False)):
        hp.set_float32_matmul_precision(p)
        assert hp.get_float32_matmul_precision() == p and backends.cuda.matmul.allow_tf32 is tf32
    backends.cuda.matmul.allow_tf32 = True
    assert hp.get_float32_matmul_precision() == "high"
    backends.cuda.matmul.allow_tf32 = False
    assert hp.get_float32_matmul_precision() == "highest"


def test_float32_matmul_precision_validation():
    hp.set_float32_matmul_precision("medium")
    for bad in ("low", "HIGH"):
        with pytest.warns(UserWarning, match=f"{bad} is not one of 'highest', 'high', or 'medium'"):
            hp.set_float32_matmul_precision(bad)
        assert hp.get_float32_matmul_precision() == "medium"  # no effect, as PyTorch
    for bad, tname in ((1, "int"), (None, "NoneType")):
        with pytest.raises(RuntimeError, match=f"expects a str, but got {tname}"):
            hp.set_float32_matmul_precision(bad)


def test_deterministic_algorithms_switch():
    assert hp.are_deterministic_algorithms_enabled() is False
    hp.use_deterministic_algorithms(True)
    assert hp.are_deterministic_algorithms_enabled() is True
    assert hp.is_deterministic_algorithms_warn_only_enabled() is False
    hp.use_deterministic_algorithms(True, warn_only=True)
    assert hp.is_deterministic_algorithms_warn_only_enabled() is True
    hp.use_deterministic_algorithms(False)
    assert not hp.are_deterministic_algorithms_enabled() and not hp.is_deterministic_algorithms_warn_only_enabled()
    with pytest.raises(TypeError, match="argument 'mode' must be bool, not str"):
        hp.use_deterministic_algorithms("yes")
    with pytest.raises(TypeError, match="argument 'warn_only' must be bool, not int"):
        hp.use_deterministic_algorithms(True, warn_only=1)
    assert cudnn.deterministic is False  # as PyTorch: the two switches are separate


# ---------------------------------------------------------------------------------------------
# compile
def test_compile_returns_the_model_itself_in_every_form():
    hp.manual_seed(0)
    model = hp.nn.Linear(3, 2)
    assert hp.compile(model) is model
    assert hp.compile(model, fullgraph=True, dynamic=False, backend="eager", mode="max-autotune") is model
    assert hp.compile(model, options={"triton.cudagraphs": False}, disable=True) is model
    assert list(hp.compile(model).state_dict()) == ["weight", "bias"]  # no "_orig_mod." prefix

    def f(x):
        return x * 2

    assert hp.compile(f) is f

    @hp.compile
    def g(x):
        return x + 1

    @hp.compile(fullgraph=True, mode="reduce-overhead")
    def h(x):
        return x - 1

    x = hp.tensor([1.0, 2.0])
    assert g(x).tolist() == [2.0, 3.0] and h(x).tolist() == [0.0, 1.0] and g.__name__ == "g" and h.__name__ == "h"
    assert hp.compile(model)(hp.ones(1, 3)).shape == (1, 2)


def test_compile_validates_as_pytorch():
    with pytest.raises(RuntimeError, match="Either mode or options can be specified"):
        hp.compile(lambda x: x, mode="default", options={})
    with pytest.raises(RuntimeError, match="Unrecognized mode=bogus, should be one of: default, lite"):
        hp.compile(lambda x: x, mode="bogus")
    with pytest.raises(RuntimeError, match="Unrecognized mode=bogus"):
        hp.compile(mode="bogus")  # the decorator form checks at once too
    with pytest.raises(TypeError, match="compile expects a callable .* but got int"):
        hp.compile(5)


# ---------------------------------------------------------------------------------------------
# backends
def test_backend_switches_have_pytorchs_defaults_and_are_settable():
    assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == (True, False, False, True)
    assert cudnn.benchmark_limit is None and cudnn.is_available() is False and cudnn.version() is None
    assert cudnn.is_acceptable(hp.zeros(2)) is False
    hp.backends.cudnn.benchmark = True
    hp.backends.cudnn.deterministic = True
    assert cudnn.benchmark is True and importlib.import_module("hpcfsdp.backends.cudnn").deterministic is True
    with cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=False):
        assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == (True, False, False, False)
    assert (cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == (True, True, True)
    m = backends.cuda.matmul
    assert (m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction,
            m.allow_fp16_accumulation) == (True, True, False)
    m.allow_bf16_reduced_precision_reduction = False
    m.allow_fp16_reduced_precision_reduction = (False, True)  # PyTorch's (reduced precision, split-K) form
    assert m.allow_bf16_reduced_precision_reduction is False and m.allow_fp16_reduced_precision_reduction is False
    with pytest.raises(TypeError, match="expects a bool"):
        m.allow_bf16_reduced_precision_reduction = "no"
    with pytest.raises(AttributeError, match="Unknown attribute foo"):
        m.foo = 1
    with pytest.raises(AttributeError, match="Unknown attribute foo"):
        m.foo  # noqa: B018
    assert hp.backends.mps.is_available() is False and hp.backends.mps.is_built() is False


def test_sdp_switches_and_is_built(monkeypatch):
    bc = backends.cuda
    pairs = [(bc.enable_flash_sdp, bc.flash_sdp_enabled), (bc.enable_mem_efficient_sdp, bc.mem_efficient_sdp_enabled),
             (bc.enable_math_sdp, bc.math_sdp_enabled), (bc.enable_cudnn_sdp, bc.cudnn_sdp_enabled)]
    for enable, enabled in pairs:
        assert enabled() is True
        enable(False)
        assert enabled() is False
    monkeypatch.setattr(_backend, "_try_cupy", lambda: None)
    assert bc.is_built() is False


# ---------------------------------------------------------------------------------------------
# hp.cuda without CUDA: PyTorch's CPU-build answers
@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.setattr(_backend, "_try_cupy", lambda: None)
    monkeypatch.setattr(_backend, "_cupy_missing", "needs CuPy, which is not importable")


def test_cuda_without_cupy_answers_as_a_cpu_build(no_cupy):
    c = hp.cuda
    assert c.is_available() is False and c.device_count() == 0 and c.is_initialized() is False
    assert c.memory_stats() == {} and c.is_bf16_supported() is False and c.is_bf16_supported(False) is False
    for f in (c.memory_allocated, c.max_memory_allocated, c.memory_reserved, c.max_memory_reserved):
        assert f() == 0 and f(0) == 0
    assert c.manual_seed(1) is None and c.manual_seed_all(1) is None and c.empty_cache() is None
    for f in (c.current_device, c.synchronize, c.init, lambda: c.synchronize("cpu"), lambda: c.set_device(0),
              lambda: c.set_device("cuda:0"), c.get_device_name, c.get_device_capability, c.get_device_properties,
              c.reset_peak_memory_stats, c.current_stream, c.default_stream, c.mem_get_info):
        with pytest.raises(AssertionError, match=NO_CUDA):
            f()
    c.set_device(-1)  # PyTorch: a negative index is "no device", a no-op
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        c.set_device("cpu")
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        c.device("cpu")
    with pytest.raises(RuntimeError, match="compiled without CUDA support"):
        with c.device(0):
            pass
    with c.device(-1), c.device(None), c.device_of(hp.zeros(1)), c.stream(None) as s:
        assert s is None
    c.set_stream(None)
    with pytest.raises(RuntimeError, match="torch.cuda.Stream requires CUDA support"):
        c.Stream()
    with pytest.raises(RuntimeError, match="torch.cuda.Event requires CUDA support"):
        c.Event()


def test_cuda_with_cupy_but_no_gpu(monkeypatch):
    class _Runtime:
        @staticmethod
        def getDeviceCount():  # noqa: N802 (CuPy's name)
            return 0

    class _CuPy:
        class cuda:  # noqa: N801
            runtime = _Runtime

    monkeypatch.setattr(_backend, "_try_cupy", lambda: _CuPy)
    assert hp.cuda.is_available() is False and hp.cuda.device_count() == 0 and hp.cuda.memory_allocated() == 0
    with pytest.raises(RuntimeError, match="No CUDA GPUs are available"):
        hp.cuda.current_device()
    with pytest.raises(RuntimeError, match="No CUDA GPUs are available"):
        hp.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# hp.cuda with a GPU (the simulated device in CI)
@pytest.fixture
def gpu():
    cp = importlib.import_module("cupy")
    hp.cuda.set_device(0)
    yield cp
    hp.cuda.set_device(0)
    hp.cuda.set_stream(hp.cuda.default_stream(0))


@pytest.mark.gpu
def test_cuda_devices(gpu):
    c = hp.cuda
    assert c.is_available() and c.is_initialized() and c.device_count() == gpu.cuda.runtime.getDeviceCount() >= 2
    assert c.current_device() == 0
    for d in (1, "cuda:1", hp.device("cuda", 1)):
        c.set_device(0)
        c.set_device(d)
        assert c.current_device() == 1 and gpu.cuda.runtime.getDevice() == 1
        assert hp.zeros(2, device="cuda").device == hp.device("cuda", 1)  # "cuda" is the current device
    c.set_device(-1)
    assert c.current_device() == 1
    with pytest.raises(ValueError, match="out of range"):
        c.set_device(c.device_count())
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        c.set_device("cpu")
    c.set_device(0)
    with c.device(1):
        assert c.current_device() == 1
        with c.device("cuda:0"):
            assert c.current_device() == 0
        assert c.current_device() == 1
    assert c.current_device() == 0
    with c.device(1):
        t = hp.ones(3, device="cuda")
    with c.device_of(t):
        assert c.current_device() == 1
    with c.device_of(hp.ones(1)), c.device(None):
        assert c.current_device() == 0


@pytest.mark.gpu
def test_cuda_properties(gpu):
    c = hp.cuda
    props = gpu.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    assert c.get_device_name() == c.get_device_name(0) == c.get_device_properties("cuda:0").name == name
    p = c.get_device_properties(0)
    assert p.total_memory == props["totalGlobalMem"] and (p.major, p.minor) == c.get_device_capability(0)
    assert (p.major, p.minor) == (props["major"], props["minor"])
    free, total = c.mem_get_info()
    assert 0 < free <= total
    assert c.is_bf16_supported() is _backend.cupy_bfloat16()[0]
    assert c.is_bf16_supported(including_emulation=False) is (_backend.cupy_bfloat16()[0] and p.major >= 8)


@pytest.mark.gpu
def test_cuda_manual_seed(gpu):
    c = hp.cuda
    c.manual_seed(3)
    a = hp.randn(4, device="cuda")
    c.manual_seed(3)
    assert hp.equal(a, hp.randn(4, device="cuda"))
    c.manual_seed_all(7)
    x0 = hp.randn(4, device="cuda:0")
    with c.device(1):
        x1 = hp.randn(4, device="cuda:1").cpu()
    c.manual_seed_all(7)
    assert hp.equal(x0, hp.randn(4, device="cuda:0"))
    with c.device(1):
        assert hp.equal(x1, hp.randn(4, device="cuda:1").cpu())


class _FakePool:
    """CuPy's default pool, per device, with the bytes a test sets."""

    def __init__(self, cp):
        self.cp, self.used, self.total, self.freed = cp, {}, {}, []

    def used_bytes(self):
        return self.used.get(self.cp.cuda.runtime.getDevice(), 0)

    def total_bytes(self):
        return self.total.get(self.cp.cuda.runtime.getDevice(), 0)

    def free_all_blocks(self):
        d = self.cp.cuda.runtime.getDevice()
        self.freed.append(d)
        self.total[d] = self.used.get(d, 0)


@pytest.mark.gpu
def test_cuda_memory_follows_the_cupy_pool(gpu, monkeypatch):
    c = hp.cuda
    pool = _FakePool(gpu)
    monkeypatch.setattr(gpu, "get_default_memory_pool", lambda: pool)
    pool.used[0], pool.total[0] = 100, 200
    assert c.memory_allocated() == 100 and c.memory_reserved() == 200
    pool.used[0], pool.total[0] = 500, 600
    assert c.memory_allocated(0) == 500
    pool.used[0] = 50
    assert c.memory_allocated() == 50 and c.max_memory_allocated() == 500 and c.max_memory_reserved() == 600
    assert c.memory_stats() == {"allocated_bytes.all.current": 50, "allocated_bytes.all.peak": 500,
                                "reserved_bytes.all.current": 600, "reserved_bytes.all.peak": 600}
    pool.used[1], pool.total[1] = 7, 9
    assert c.memory_allocated(1) == 7 and c.memory_reserved("cuda:1") == 9 and c.max_memory_allocated(1) == 7
    c.empty_cache()  # frees the cached blocks of every device
    assert sorted(pool.freed) == [0, 1] and c.memory_reserved() == 50 and c.max_memory_reserved() == 600
    c.reset_peak_memory_stats()
    assert c.max_memory_allocated() == 50 and c.max_memory_reserved() == 50
    assert c.max_memory_allocated(1) == 7  # the other device keeps its peaks
    pool.used[0] = 80
    c.synchronize()  # samples the pool too
    pool.used[0] = 10
    assert c.max_memory_allocated() == 80 and c.memory_allocated() == 10


@pytest.mark.gpu
def test_cuda_memory_of_the_real_pool_is_consistent(gpu):
    c = hp.cuda
    x = hp.ones(1024, device="cuda")
    used = int(gpu.get_default_memory_pool().used_bytes())
    assert c.memory_allocated() == used and c.memory_reserved() >= used
    assert c.max_memory_allocated() >= used and c.max_memory_reserved() >= c.memory_reserved()
    del x


@pytest.mark.gpu
def test_cuda_streams_and_events_order_work(gpu):
    c = hp.cuda
    assert c.current_stream() == c.default_stream() and c.current_stream().device == hp.device("cuda", 0)
    s = c.Stream()
    assert s.device == hp.device("cuda", 0) and s != c.default_stream() and isinstance(s.cuda_stream, int)
    x = hp.ones(8, device="cuda")
    s.wait_stream(c.current_stream())  # x was written on the default stream
    with c.stream(s) as entered:
        assert entered is s and c.current_stream() == s
        y = x * 2
    assert c.current_stream() == c.default_stream()
    if _backend.cuda_simulated():  # the simulation catches the missing wait; real CUDA would race silently
        with pytest.raises(CudaSimError, match="not synchronised"):
            y + 1
    ev = s.record_event()
    ev.wait()  # the default stream waits for s's work
    assert (y + 1).tolist() == [3.0] * 8
    s.synchronize()
    assert s.query() and ev.query()
    with c.device(1):
        s1 = c.Stream()
    assert s1.device == hp.device("cuda", 1)
    with c.stream(s1):
        assert c.current_device() == 1 and c.current_stream() == s1
    assert c.current_device() == 0
    start, end = c.Event(enable_timing=True), c.Event(enable_timing=True)
    start.record()
    z = x @ x
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0 and float(z) == 8.0
    c.set_stream(s)
    assert c.current_stream() == s
    c.set_stream(c.default_stream())
    assert c.current_stream() == c.default_stream()


@pytest.mark.gpu
def test_cuda_synchronize_makes_stream_work_visible(gpu):
    c = hp.cuda
    s = c.Stream()
    x = hp.ones(4, device="cuda")
    s.wait_stream(c.current_stream())
    with c.stream(s):
        y = x + 1
    c.synchronize()  # the whole device: the host knows s's work is done
    assert y.tolist() == [2.0] * 4
    c.synchronize(0)
    c.synchronize("cuda:1")
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        c.synchronize("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.init()
