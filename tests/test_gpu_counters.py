"""The simulated device counts kernel launches, host syncs (with their call sites) and pool memory; `bench train
--device cuda` reports them, and peak_memory_bytes reports the pool's peak (see [Note: Simulated device counts]
in hpcfsdp/testing/_sim_counters.py and [Note: Peak device memory] in hpcfsdp/cli/_common.py).

The `gpu`/`gpu_sim` tests drive hpcfsdp.testing.cuda_sim directly (HPCFSDP_CUDA_SIM=1 runs them); the bench test
starts its own simulated process, and the real-CuPy peak tracker runs against a stand-in of CuPy's allocator API.
"""
import gc
import json
import os
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from hpcfsdp.testing import _sim_counters
from hpcfsdp.testing import cuda_sim as cs

POOL = cs.get_default_memory_pool()


@pytest.fixture
def dev0():
    """Device 0 current and idle, no free pool block, no garbage left to free inside a window."""
    cs.Device(0).use()
    gc.collect()
    cs.Device(0).synchronize()
    POOL.free_all_blocks()
    yield
    cs.Device(0).synchronize()


def _here() -> int:
    return sys._getframe(1).f_lineno


def _site(line: int, func: str) -> str:
    return f"tests/test_gpu_counters.py:{line} in {func}"


@pytest.mark.usefixtures("dev0")
@pytest.mark.gpu
@pytest.mark.gpu_sim
def test_small_sequences_launch_what_cupy_launches():
    a = cs.ones((4, 8), dtype=np.float32)
    b = cs.ones((4, 8), dtype=np.float32)
    cases = [(lambda: a + b, 1, "add"), (lambda: cs.matmul(a, b.T), 1, "matmul"), (lambda: a @ b.T, 1, "matmul"),
             (lambda: a.sum(), 1, "ndarray.sum"), (lambda: cs.exp(a), 1, "exp"), (lambda: a.reshape(8, 4), 0, None),
             (lambda: a[1:3], 0, None), (lambda: a.T, 0, None), (lambda: cs.ascontiguousarray(a), 0, None),
             (lambda: a.astype(np.float32, copy=False), 0, None), (lambda: cs.empty(16), 0, None),
             (lambda: cs.zeros(16), 1, "zeros"), (lambda: a.fill(2), 1, "ndarray.fill"),
             (lambda: a.__setitem__(0, 1.0), 1, "ndarray.__setitem__"), (lambda: cs.ascontiguousarray(a.T), 1, None)]
    for fn, n, op in cases:
        with cs.counting() as c:
            fn()
        assert c.launches == n and not c.host_syncs, (op, c, c.launches_by_op)
        if op:
            assert c.launches_by_op == {op: 1}
    with cs.counting() as c:
        a += b
        (a * 2 + 1).sum()
    assert c.launches == 4 and c.launches_by_op == {"iadd": 1, "mul": 1, "add": 1, "ndarray.sum": 1}


@pytest.mark.usefixtures("dev0")
@pytest.mark.gpu
@pytest.mark.gpu_sim
def test_a_blocking_read_is_one_host_sync_at_its_call_site():
    a = cs.arange(6, dtype=np.float32)
    s = a.sum()
    with cs.counting() as c:
        line = _here() + 1
        s.item()
    assert c.launches == 0 and c.host_syncs == [("ndarray.item", _site(line, "test_a_blocking_read_is_one_host_sync_"
                                                                             "at_its_call_site"))]
    reads = {"float(ndarray)": lambda: float(s), "int(ndarray)": lambda: int(s), "bool(ndarray)": lambda: bool(s),
             "ndarray.tolist": lambda: a.tolist(), "repr": lambda: repr(a), "ndarray.get": lambda: a.get(),
             "cupy.asnumpy": lambda: cs.asnumpy(a)}
    for kind, fn in reads.items():
        with cs.counting() as c:
            fn()
        assert c.launches == 0 and [k for k, _ in c.host_syncs] == [kind]
        assert c.host_syncs[0][1].startswith("tests/test_gpu_counters.py:")  # the lambda's line, not the simulator's
    side = cs.cuda.Stream(non_blocking=True)
    ev = side.record()
    waits = {"Stream.synchronize": side.synchronize, "Event.synchronize": ev.synchronize,
             "Device.synchronize": cs.cuda.Device(0).synchronize}
    for kind, fn in waits.items():
        with cs.counting() as c:
            fn()
        assert c.host_syncs[0][0] == kind and len(c.host_syncs) == 1 and c.launches == 0
    with cs.counting() as c:  # queries do not wait: no sync (FSDP's watchdog polls them on its own thread)
        assert side.done and ev.done
    assert c.host_syncs == [] and c.launches == 0
    out = cs.cuda.alloc_pinned_memory(a.nbytes)
    host = np.frombuffer(out, np.float32, a.size)
    with cs.counting() as c:
        a.get(stream=side, out=host)  # asynchronous: into pinned memory, on a stream
        side.synchronize()
    assert [k for k, _ in c.host_syncs] == ["Stream.synchronize"]


@pytest.mark.usefixtures("dev0")
@pytest.mark.gpu
@pytest.mark.gpu_sim
def test_uploads_sync_from_pageable_memory_only():
    a = cs.zeros(8, dtype=np.float32)
    side = cs.cuda.Stream(non_blocking=True)
    pinned = cs.cuda.alloc_pinned_memory(a.nbytes)
    src = np.frombuffer(pinned, np.float32, 8)
    src[...] = 3
    side.wait_event(cs.cuda.get_current_stream().record())
    with cs.counting() as c:
        a.set(src, stream=side)  # pinned, on a stream: asynchronous
    assert c.launches == 0 and c.host_syncs == []
    side.synchronize()
    cases = {"ndarray.set": lambda: a.set(np.ones(8, np.float32)),
             "cupy.array (pageable upload)": lambda: cs.asarray(np.ones(8, np.float32)),
             "ndarray.__setitem__ (pageable upload)": lambda: a.__setitem__(slice(0, 4), np.ones(4, np.float32))}
    for kind, fn in cases.items():
        with cs.counting() as c:
            fn()
        assert c.launches == 0 and [k for k, _ in c.host_syncs] == [kind]


@pytest.mark.usefixtures("dev0")
@pytest.mark.gpu
@pytest.mark.gpu_sim
def test_counts_are_process_wide_and_cost_one_check_when_closed():
    a = cs.ones(16, dtype=np.float32)
    cs.cuda.Device(0).synchronize()

    def work():
        cs.Device(0).use()
        (a * 3).get()

    with cs.counting() as outer:
        t = threading.Thread(target=work)
        t.start()
        t.join()
        with cs.counting() as inner:
            a + 1
    assert outer.launches == 2 and [k for k, _ in outer.host_syncs] == ["ndarray.get"]
    assert inner.launches == 1 and inner.host_syncs == []
    assert _sim_counters.OPEN is None  # what every hook checks first


@pytest.mark.usefixtures("dev0")
@pytest.mark.gpu
@pytest.mark.gpu_sim
def test_allocated_and_peak_bytes_are_the_pools_rounded_blocks():
    with cs.counting() as c:
        x = cs.empty(1000, dtype=np.float32)  # 4000 bytes: one 4096-byte block
        y = cs.empty(100, dtype=np.uint8)  # one 512-byte block
        del x
        z = cs.empty(10, dtype=np.uint8)  # 512 more; the peak stays
    assert c.allocated_bytes == 4096 + 512 + 512
    assert c.peak_bytes - c.start_bytes == 4096 + 512
    assert c.start_bytes == POOL.used_bytes() - 1024  # y and z still held
    cs.reset_device_peak(0)
    assert cs.device_peak_bytes(0) == POOL.used_bytes()
    w = cs.empty(2048, dtype=np.uint8)
    del w
    assert cs.device_peak_bytes(0) == POOL.used_bytes() + 2048
    del y, z


@pytest.mark.usefixtures("dev0")
@pytest.mark.gpu
@pytest.mark.gpu_sim
def test_sections_split_the_counts_by_label():
    a = cs.ones(256, dtype=np.float32)
    with cs.counting() as c:
        with c.section("forward") as fwd:
            h = a * 2
            with c.section("inner"):
                g = h + 1
            s = (g * h).sum()
        c.label("backward")
        s.item()
        grad = cs.ones_like(a)
        c.label(None)
        del grad
        a - 1
    assert c.launches == 6 and len(c.host_syncs) == 1
    assert fwd is c.per_unit["forward"] and fwd.launches == 3 and fwd.launches_by_op == {"mul": 2, "ndarray.sum": 1}
    assert c.per_unit["inner"].launches == 1 and c.per_unit["inner"].allocated_bytes == 1024
    bwd = c.per_unit["backward"]
    assert bwd.launches == 1 and [k for k, _ in bwd.host_syncs] == ["ndarray.item"] and bwd.allocated_bytes == 1024
    assert fwd.allocated_bytes == 2 * 1024 + 512  # h, g * h and the sum's 0-d array
    assert c.sites() == {c.host_syncs[0][1]: 1}


@pytest.mark.gpu
@pytest.mark.gpu_sim
def test_peak_memory_bytes_is_the_pools_peak_on_the_simulator():
    from hpcfsdp.cli import _common

    if not _common._backend.cuda_simulated():
        pytest.skip("the CLI's device is the simulated one under HPCFSDP_CUDA_SIM=1 only")
    cs.Device(0).use()
    _common.track_device_peak("cuda:0")
    base = POOL.used_bytes()
    x = cs.empty(1 << 20, dtype=np.uint8)
    del x
    POOL.free_all_blocks()  # the pool holds less than it used at its peak
    assert _common.peak_memory_bytes("cuda:0") == base + (1 << 20) > POOL.total_bytes()


def test_peak_tracker_wraps_cupys_allocator(monkeypatch):
    """On real CuPy: the allocator set for every thread is wrapped, and the pool's used bytes read after each
    allocation give the peak (a stand-in of cupy's MemoryPool/set_allocator API here)."""
    from hpcfsdp.cli import _common

    class Pool:
        used = 0

        def used_bytes(self):
            return self.used

    pool, allocators = Pool(), []

    def malloc(n):
        pool.used += n
        return types.SimpleNamespace(device_id=0, size=n)

    cuda = types.SimpleNamespace(get_allocator=lambda: malloc, set_allocator=allocators.append,
                                 Device=lambda i: __import__("contextlib").nullcontext(),
                                 runtime=types.SimpleNamespace(getDevice=lambda: 0))
    fake = types.SimpleNamespace(get_default_memory_pool=lambda: pool, cuda=cuda)
    monkeypatch.setattr(_common._backend, "cuda_simulated", lambda: False)
    monkeypatch.setattr(_common._backend, "_need_cupy", lambda: fake)
    monkeypatch.setattr(_common, "_WRAPPED", [])
    monkeypatch.setattr(_common, "_PEAKS", {})
    pool.used = 100
    _common.track_device_peak("cuda:0")
    alloc = allocators[-1]
    a = alloc(300)
    pool.used -= a.size  # freed
    alloc(50)
    assert _common.peak_memory_bytes("cuda:0") == 400 and pool.used == 150
    _common.track_device_peak("cuda:0")  # from now on: no second wrapper
    assert len(allocators) == 1 and _common.peak_memory_bytes("cuda") == 150


@pytest.mark.gpu_sim
def test_bench_train_reports_launches_syncs_and_peak_on_the_simulator(tmp_path):
    js = tmp_path / "r.jsonl"
    env = dict(os.environ, HPCFSDP_CUDA_SIM="1", OPENBLAS_NUM_THREADS="1", HPCFSDP_PROGRESS="0")
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "bench", "train", "--device", "cuda", "--n-layer", "1",
           "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--vocab-size", "256", "--batch-size", "2",
           "--warmup", "1", "--steps", "2", "--profile-kernels", "--json", str(js)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(js.read_text())
    assert r["kernel_launches_per_step"] > 50 and r["host_syncs_per_step"] >= 0
    assert r["kernel_count_source"] == "simulator"  # --profile-kernels: the simulator counts itself
    assert sum(r["host_sync_sites"].values()) <= r["host_syncs_per_step"]
    assert all(":" in s and " in " in s for s in r["host_sync_sites"])
    assert r["peak_device_bytes"] == r["peak_mem_bytes"][0] > 0


@pytest.mark.gpu
@pytest.mark.gpu_sim
@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
def test_an_nccl_collective_is_one_launch_and_no_host_sync(monkeypatch):
    import hpcfsdp.distributed as dist
    from hpcfsdp.distributed.process_group import ProcessGroup

    monkeypatch.setenv("HPCFSDP_GPU_COMM", "nccl")
    monkeypatch.setenv("HPCFSDP_CUDA_SIM_SHARED_GPUS", "0")
    cs.Device(dist.get_rank() % cs.cuda.runtime.getDeviceCount()).use()
    pg = ProcessGroup(name="counters-nccl")
    try:
        x = cs.ones(8, dtype=np.float32)
        pg.all_reduce_(x)  # the communicator is made at the first collective
        cs.cuda.Device().synchronize()
        with cs.counting() as c:
            pg.all_reduce_(x, async_op=True).wait()
        assert c.launches_by_op == {"NCCL allReduce": 1} and c.host_syncs == []
    finally:
        pg.destroy()
        cs.Device(0).use()
