"""hpcfsdp._backend: dtypes, devices, default-device context, meta arrays, array modules, seeding."""
import threading

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import _backend as B


def test_dtypes_are_numpy_dtypes():
    assert hp.float32 == np.dtype("float32") and hp.int64 == np.dtype("int64")
    assert hp.bfloat16 == np.dtype(ml_dtypes.bfloat16) and hp.bool == np.dtype(bool)
    assert isinstance(hp.float16, hp.dtype)
    for name, dt in [("float32", hp.float32), ("torch.float16", hp.float16), ("bfloat16", hp.bfloat16),
                     ("long", hp.int64), ("double", hp.float64), ("bool", hp.bool)]:
        assert B.to_dtype(name) == dt
    assert B.to_dtype(float) == hp.float32 and B.to_dtype(int) == hp.int64 and B.to_dtype(bool) == hp.bool
    assert B.to_dtype(np.float64) == hp.float64 and B.to_dtype(hp.uint8) == hp.uint8
    with pytest.raises(TypeError, match="complex64"):
        B.to_dtype(np.complex64)
    with pytest.raises(TypeError, match="float99"):
        B.to_dtype("float99")
    assert B.is_floating_dtype(hp.bfloat16) and not B.is_floating_dtype(hp.int32)


def test_device_parsing_equality_hash():
    d = hp.device("cuda:1")
    assert d.type == "cuda" and d.index == 1 and str(d) == "cuda:1"
    assert hp.device("cuda", 1) == d and hash(hp.device("cuda", 1)) == hash(d)
    assert hp.device("cpu") == "cpu" and hp.device("cpu") != "meta" and str(hp.device("cpu")) == "cpu"
    assert hp.device("meta").type == "meta" and repr(hp.device("cpu")) == "device(type='cpu')"
    assert hp.device(hp.device("cuda:0")) == "cuda:0"
    assert len({hp.device("cpu"), hp.device("cpu"), hp.device("meta")}) == 2
    with pytest.raises(ValueError, match="tpu"):
        hp.device("tpu")
    with pytest.raises(ValueError, match="cuda:x"):
        hp.device("cuda:x")
    with pytest.raises(AttributeError):
        d.index = 3


def test_cuda_device_needs_cupy():
    if B.cupy_available():  # a GPU machine: cuda tensors work
        assert hp.zeros(2, device="cuda").device.type == "cuda"
        return
    # without CuPy: which extra to install; CuPy installed (CI installs it) but no GPU: say so
    msg = "cuda12.*cuda13" if "not importable" in B.cupy_unavailable_reason() else "CuPy .* is installed but sees none"
    with pytest.raises(RuntimeError, match=msg):
        hp.zeros(2, device="cuda")
    with pytest.raises(RuntimeError, match="CuPy"):
        B.to_device("cuda:0")


def test_default_device_context_nests_and_is_thread_local():
    assert B.default_device() == "cpu"
    seen = []
    with hp.device("meta"):
        assert B.default_device() == "meta"
        with hp.device("cpu"):
            assert hp.ones(2).device == "cpu"
        assert hp.ones(2).device == "meta"
        t = threading.Thread(target=lambda: seen.append(B.default_device()))
        t.start()
        t.join()
    assert seen == [hp.device("cpu")] and B.default_device() == "cpu"
    assert B.to_device(None) == "cpu" and B.to_device("meta") == hp.device("meta")


def test_meta_array_has_no_memory():
    m = B.meta_array((1 << 20, 1 << 20), np.float32)  # 4 TiB if it were real
    assert m.shape == (1 << 20, 1 << 20) and m.strides == (0, 0) and B.is_meta_array(m)
    assert B.device_of_array(m) == "meta" and not m.flags.writeable
    assert B.is_meta_array(m.reshape(-1)) and B.is_meta_array(m.T[:5])
    s = np.exp(m)  # element-wise ufunc: shape and dtype only
    assert B.is_meta_array(s) and s.shape == m.shape and s.strides == (0, 0)
    assert not B.is_meta_array(np.zeros(3)) and B.device_of_array(np.zeros(3)) == "cpu"


def test_array_module_and_helpers():
    a = np.zeros(3)
    assert B.array_module(a) is np and B.array_module("cpu") is np and B.array_module(hp.device("meta")) is np
    assert B.to_numpy(a) is a and not B.is_cupy_array(a)
    p = B.pinned_empty((2, 3), np.float32)
    assert p.shape == (2, 3) and p.dtype == np.float32
    B.synchronize()
    B.synchronize("cpu")


def test_manual_seed_controls_the_generator():
    hp.manual_seed(5)
    a = B.generator().random(4)
    hp.manual_seed(5)
    assert (B.generator().random(4) == a).all()
    hp.manual_seed(6)
    assert not (B.generator().random(4) == a).all()


def test_host_allocator_tuning_can_be_disabled():
    import subprocess
    import sys

    code = "import hpcfsdp._backend as B; print(B.host_allocator_tuned())"
    env = {"HPCFSDP_MALLOC_TUNE": "0", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    import os
    import platform

    if platform.libc_ver()[0] == "glibc" and os.environ.get("HPCFSDP_MALLOC_TUNE", "1") != "0":
        assert B.host_allocator_tuned()


def test_pinned_helpers_use_cupys_page_locked_memory(monkeypatch):
    from hpcfsdp.testing import cuda_sim

    monkeypatch.setattr(B, "_cupy", None)
    monkeypatch.setattr(B, "_cupy_checked", True)
    monkeypatch.delitem(__import__("sys").modules, "cupy", raising=False)
    plain = B.pinned_empty((2, 3), np.float32)
    assert plain.shape == (2, 3) and plain.dtype == np.float32 and not B.is_pinned(plain)
    monkeypatch.setattr(B, "_cupy", cuda_sim)
    for a in (B.pinned_empty((2, 3), hp.bfloat16), B.pinned_bytes(5), B.host_empty(4, np.int64, pin_memory=True)):
        assert B.is_pinned(a) and a.flags.c_contiguous
    assert B.pinned_empty(7, np.float16).shape == (7,) and B.pinned_bytes(0).size == 1
    assert not B.is_pinned(B.host_empty(4, np.int64, pin_memory=False)) and not B.is_pinned(np.zeros(3))


def test_cupy_bfloat16_probe_names_a_cupy_without_it(monkeypatch):
    from hpcfsdp.testing import cuda_sim

    class OldCupy:
        __version__ = "13.6.0"

        @staticmethod
        def ones(n, dtype):
            raise TypeError(f"Unsupported dtype {dtype}")

    monkeypatch.setattr(B, "_cupy_checked", True)
    monkeypatch.setattr(B, "_cupy", OldCupy)
    ok, why = B.cupy_bfloat16()
    assert not ok and "CuPy 13.6.0 lacks bfloat16" in why
    monkeypatch.setattr(B, "_cupy", cuda_sim)
    assert B.cupy_bfloat16() == (True, "")
    monkeypatch.setattr(B, "_cupy", None)
    assert B.cupy_bfloat16() == (False, "CuPy is not importable")


def test_array_module_has_one_copy():
    from hpcfsdp.distributed import _buffers

    assert _buffers.array_module is B.array_module and _buffers.is_cupy_array is B.is_cupy_array
    assert B.array_module(np.zeros(2)) is np and B.array_module("cpu") is np


def test_info_warns_when_cupy_lacks_bfloat16(monkeypatch, capsys):
    import argparse

    from hpcfsdp.cli import info
    from hpcfsdp.distributed import _mpi

    probe = {"cupy": True, "cupy_version": "13.6.0", "gpu_count": 1, "cupy_bfloat16": False,
             "cupy_bfloat16_note": "CuPy 13.6.0 lacks bfloat16 (TypeError: x)"}
    monkeypatch.setattr(_mpi, "probe", lambda: dict(probe))
    info.run(argparse.Namespace(json=False, all_ranks=False))
    out = capsys.readouterr().out
    assert "cupy_bfloat16: False" in out and "warning: the installed CuPy lacks bfloat16 (CuPy 13.6.0" in out
    monkeypatch.setattr(_mpi, "probe", lambda: dict(probe, cupy_bfloat16=True))
    info.run(argparse.Namespace(json=False, all_ranks=False))
    assert "warning: the installed CuPy" not in capsys.readouterr().out  # (the settings table shows log levels)
