"""hpcfsdp.accelerator and the device helpers of hpcfsdp.distributed, as PyTorch on a machine without GPUs."""
import datetime

import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import accelerator

NO_GPU = not accelerator.is_available()


@pytest.mark.skipif(not NO_GPU, reason="checks PyTorch's answers on a machine without an accelerator")
def test_accelerator_without_a_gpu_answers_as_pytorch():
    assert accelerator.is_available() is False
    assert accelerator.device_count() == 0
    assert accelerator.current_accelerator() is None
    with accelerator.device_index(None):  # None: no device change, allowed without an accelerator
        pass
    with pytest.raises(RuntimeError, match="Cannot access accelerator device when none is available"):
        with accelerator.device_index(0):
            pass
    with pytest.raises(RuntimeError, match="Cannot access accelerator device when none is available"):
        accelerator.current_device_index()


def test_accelerator_without_cupy_is_unavailable(monkeypatch):
    monkeypatch.setattr(hp._backend, "_try_cupy", lambda: None)
    assert accelerator.device_count() == 0 and not accelerator.is_available()
    assert accelerator.current_accelerator() is None


def test_accelerator_with_a_gpu(monkeypatch):
    """A stand-in CuPy with two devices: the current device follows set_device_index and device_index."""
    class _Runtime:
        current = 0

        @staticmethod
        def getDeviceCount():  # noqa: N802 (CuPy's name)
            return 2

        @classmethod
        def getDevice(cls):  # noqa: N802
            return cls.current

    class _Device:
        def __init__(self, i):
            self.i = i

        def use(self):
            _Runtime.current = self.i

    class _Cuda:
        runtime = _Runtime
        Device = _Device

    class _CuPy:
        cuda = _Cuda

    monkeypatch.setattr(hp._backend, "_try_cupy", lambda: _CuPy)
    assert accelerator.is_available() and accelerator.device_count() == 2
    assert accelerator.current_accelerator() == hp.device("cuda")
    with accelerator.device_index(1):
        assert accelerator.current_device_index() == 1
    assert accelerator.current_device_index() == 0
    accelerator.set_device_index("cuda:1")
    assert accelerator.current_device_index() == 1
    with pytest.raises(ValueError, match="device index 2 is out of range: 2 accelerator"):
        accelerator.set_device_index(2)


def test_get_default_backend_for_device():
    for d, name in (("cpu", "gloo"), ("cuda", "nccl"), ("cuda:1", "nccl"), (hp.device("cpu"), "gloo"),
                    (hp.device("cuda", 0), "nccl")):  # PyTorch's names (checked against torch 2.13)
        assert dist.get_default_backend_for_device(d) == name
    with pytest.raises(ValueError, match="Default backend not registered for device : meta"):
        dist.get_default_backend_for_device("meta")
    with pytest.raises(ValueError, match="Default backend not registered for device : tpu"):
        dist.get_default_backend_for_device("tpu")


def test_init_process_group_accepts_pytorch_keywords():
    from mpi4py import MPI

    dist.destroy_process_group()
    with pytest.raises(ValueError, match="Cannot specify both init_method and store"):
        dist.init_process_group(init_method="env://", store=object())
    with pytest.raises(ValueError, match="must be given when using store"):
        dist.init_process_group(store=object())
    with pytest.raises(ValueError, match="device_id='meta': expected a CPU or CUDA device"):
        dist.init_process_group(device_id="meta", comm=MPI.COMM_SELF)
    if NO_GPU:
        with pytest.raises(RuntimeError, match="device_id=0: no CUDA device is available"):
            dist.init_process_group(device_id=0, comm=MPI.COMM_SELF)
    assert not dist.is_initialized()
    dist.init_process_group(backend=dist.get_default_backend_for_device("cpu"), init_method="env://",
                            timeout=datetime.timedelta(seconds=60), world_size=1, rank=0, group_name="main",
                            pg_options=None, device_id=hp.device("cpu"), comm=MPI.COMM_SELF)
    try:
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        assert dist.group.WORLD.bound_device_id == hp.device("cpu")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_synchronize_waits_for_the_device():
    """On the device hpcfsdp uses (the simulated one in CI): synchronize() of the current and of a named device."""
    x = hp.ones(4, device="cuda") * 2
    accelerator.synchronize()
    accelerator.synchronize(0)
    accelerator.synchronize("cuda:0")
    assert x.cpu().tolist() == [2.0] * 4
