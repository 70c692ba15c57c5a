"""The simulated device exposes no more than the installed CuPy: its names, ndarray attributes, flags and dtype loops
are read from CuPy (hpcfsdp/testing/_cupy_surface.py); the names a workload uses are recorded and checked.

These drive hpcfsdp.testing.cuda_sim directly (no environment needed); the recording and the loop comparison with
CuPy's own resolution run in subprocesses.
"""
import importlib.metadata
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from hpcfsdp.testing import _cupy_surface
from hpcfsdp.testing import cuda_sim as cs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def _device0():
    cs.Device(0).use()
    yield
    cs.Device(0).use()


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HPCFSDP_CUDA_SIM")}
    e.update(PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)


def test_surface_is_the_installed_cupys():
    s = _cupy_surface.surface()
    assert s.version == importlib.metadata.version("cupy-cuda13x")
    assert "EE->E" in s.ufuncs["add"] and not any("E" in t for t in s.ufuncs["bitwise_and"])
    assert "bfloat16" not in s.modules["cupy"] and {"ndarray", "cuda", "asnumpy"} <= s.modules["cupy"]
    assert {"Stream", "Event", "Device", "runtime"} <= s.modules["cupy.cuda"]
    assert "NcclCommunicator" in s.modules["cupy.cuda.nccl"] and "scatter_add" in s.modules["cupyx"]
    assert s.flags == {"c_contiguous", "f_contiguous", "owndata", "fnc", "forc"}
    assert {"__dlpack__", "__dlpack_device__", "__cuda_array_interface__", "astype"} <= s.ndarray
    assert "setflags" not in s.ndarray and "E->E" in s.reductions["sum"]
    assert _cupy_surface.surface() is s  # read once per process


def test_names_outside_cupy_raise_as_cupy_does():
    a = cs.ones(3, dtype=np.float32)
    cupy = cs.get_array_module(a)
    for mod, name in [(cs, "bfloat16"), (cupy, "bfloat16"), (cupy, "mpi_access"), (cupy, "install")]:
        with pytest.raises(AttributeError, match=f"module 'cupy' has no attribute '{name}'"):
            getattr(mod, name)
    with pytest.raises(AttributeError, match="module 'cupy.cuda' has no attribute 'synchronize_all'"):
        cs.cuda.synchronize_all
    with pytest.raises(AttributeError, match="module 'cupyx' has no attribute 'empty_like'"):
        cs.cupyx.empty_like
    with pytest.raises(AttributeError, match="'cupy.ndarray' object has no attribute 'setflags'"):
        a.setflags(write=False)
    with pytest.raises(AttributeError, match="Flags' object has no attribute 'writeable'"):
        a.flags.writeable
    with pytest.raises(KeyError, match="WRITEABLE is not defined for cupy.ndarray.flags"):
        a.flags["WRITEABLE"]
    with pytest.raises(AttributeError):
        a.flags.c_contiguous = False
    assert a.flags["C_CONTIGUOUS"] and a.flags.owndata and not a[::2].flags.c_contiguous
    assert not a[1:].flags.owndata and a.flags.forc and not a.flags.fnc
    # what the simulation has of CuPy's names still works, the NumPy-backed ones included
    assert cupy.ndarray is cs.ndarray and float(cupy.exp(a).sum()) == pytest.approx(3 * np.e, rel=1e-6)


def test_ufuncs_pick_cupys_loop_or_raise_its_type_error():
    x = cs.ones(4, dtype=BF16)
    assert (x + x).dtype == BF16 and cs.exp(x).dtype == BF16 and (x > 0).dtype == np.bool_
    assert (x * 2.0).dtype == np.float32  # CuPy 14: a Python float takes no bfloat16 loop (result_type promotes)
    assert (x + cs.ones(4, dtype=np.float16)).dtype == np.float32 and x.sum().dtype == BF16
    assert (x @ x).dtype == BF16 and np.exp(x).dtype == BF16
    assert (cs.ones(2, dtype=np.int32) / 2).dtype == np.float64
    with pytest.raises(TypeError, match=r"Wrong type .*bfloat16.* of arguments for cupy_bitwise_and"):
        cs.bitwise_and(x, x)
    with pytest.raises(TypeError, match="Wrong type .* of arguments for cupy_invert"):
        ~x
    with pytest.raises(TypeError, match="Wrong type .* of arguments for cupy_bitwise_xor"):
        np.bitwise_xor(x, x)  # NumPy's ufunc on a device array: CuPy's of the same name
    assert np.logical_not(x).dtype == np.bool_  # no bfloat16 loop, but bfloat16 casts safely to float32's
    i = cs.ones(3, dtype=np.int32)
    i += 1
    with pytest.raises(TypeError, match='could not be coerced .* "same_kind"'):
        i += 1.5  # CuPy: add(i, 1.5, out=i) computes in float64, which same_kind cannot cast to int32
    with pytest.raises(TypeError, match="scatter_add only supports int32, float16, float32, float64"):
        cs.cupyx.scatter_add(cs.zeros(4, dtype=BF16), cs.array([0, 1, 1]), cs.ones(3, dtype=BF16))
    g = cs.zeros(4, dtype=np.float32)
    cs.cupyx.scatter_add(g, cs.array([0, 1, 1]), cs.ones(3, dtype=np.float32))
    np.testing.assert_array_equal(g.get(), [1, 2, 0, 0])


_COMPARE = r"""
import ml_dtypes, numpy as np, cupy
from hpcfsdp.testing import _sim_surface as g
dts = [np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16,
                             ml_dtypes.bfloat16, np.float32, np.float64, np.complex64)]
class A:  # an array argument: only its dtype matters
    def __init__(self, dt): self.dtype = dt
bad, n = [], 0
for name in ["add", "multiply", "true_divide", "maximum", "greater", "bitwise_and", "exp", "tanh", "sqrt",
             "negative", "isnan", "power"]:
    u = getattr(cupy, name)
    for a in dts:
        for b in (dts if u.nin == 2 else [None]):
            ins = (a,) if b is None else (a, b)
            op = u._ops._guess_routine_from_in_types(ins)
            want = None if op is None else (tuple(op.in_types), tuple(op.out_types))
            try:
                got = g.resolve(name, [A(t) for t in ins])
            except TypeError:
                got = None
            n += 1
            if got != want:
                bad.append((name, ins, got, want))
print(n, bad)
"""


def test_loop_resolution_agrees_with_cupys_own():
    r = _run(_COMPARE)
    assert r.returncode == 0, r.stderr
    n, _, bad = r.stdout.strip().partition(" ")
    assert int(n) > 500 and bad == "[]", r.stdout


def test_dlpack_export_is_cuda_memory_and_needs_synchronised_writes():
    a = cs.arange(4, dtype=np.float32)
    assert a.__dlpack_device__() == (2, 0)
    with pytest.raises(cs.CudaSimError, match=r"__dlpack__\(stream=-1\).*arange"):
        a.__dlpack__(stream=-1, max_version=(1, 0), copy=False)  # as mpi4py calls it: the consumer syncs nothing
    cs.cuda.get_current_stream().synchronize()
    cap = a.__dlpack__(stream=-1, max_version=(1, 0), copy=False)
    assert "dltensor_versioned" in repr(cap)
    with pytest.raises((BufferError, RuntimeError, TypeError)):
        np.from_dlpack(a)  # NumPy takes CPU memory only: the capsule says CUDA
    side = cs.cuda.Stream(non_blocking=True)
    with side:
        b = a * 2
        b.__dlpack__()  # stream=None: the legacy default stream waits for this one
    np.testing.assert_array_equal((b + 0).get(), [0, 2, 4, 6])
    with cs.cuda.Device(1), pytest.raises(BufferError, match="not on"):
        a.__dlpack__(dl_device=(2, 1))


_WORKLOAD = r"""
import numpy as np
import hpcfsdp as hp
from hpcfsdp.models import GPT, GPTConfig
hp.manual_seed(0)
model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)).to("cuda")
opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
x = hp.tensor(np.random.default_rng(0).integers(0, 32, (2, 8)), device="cuda")
_, loss = model(x, x)
loss.backward()
opt.step()
print(loss.item())
"""


def test_names_a_workload_uses_are_recorded_and_checked(tmp_path):
    rec = tmp_path / "names"
    r = _run(_WORKLOAD, HPCFSDP_CUDA_SIM="1", HPCFSDP_CUDA_SIM_RECORD=str(rec))
    assert r.returncode == 0, r.stderr
    (f,) = list(rec.glob("cupy_names.*.txt"))
    names = set(f.read_text().split())
    assert {"cupy.ndarray", "cupy.cuda", "ndarray.shape", "ndarray.dtype"} <= names, sorted(names)
    assert any(n.startswith("cupy.cuda.") for n in names) and any(n.startswith("ndarray.flags.") for n in names)
    check = [sys.executable, "-m", "hpcfsdp.testing.cupy_names", str(rec)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("HPCFSDP_CUDA_SIM", None)
    ok = subprocess.run(check, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and f"all {len(names)} cupy names used exist" in ok.stdout, ok.stdout + ok.stderr
    (rec / "cupy_names.other.1.txt").write_text("cupy.bfloat16\nndarray.flags.writeable\ncupy.cuda.Stream\n")
    bad = subprocess.run(check, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    listed = [ln.strip() for ln in bad.stdout.splitlines()[1:]]
    assert listed == ["cupy.bfloat16", "ndarray.flags.writeable"], bad.stdout


def test_installing_without_cupy_names_the_extra():
    code = ("import sys; sys.modules['cupy'] = None\n"  # `import cupy` raises ImportError
            "from hpcfsdp.testing import cuda_sim\n"
            "cuda_sim.install()\n")
    r = _run(code)
    assert r.returncode != 0 and 'pip install -e ".[cuda]"' in r.stderr and "not importable" in r.stderr, r.stderr
