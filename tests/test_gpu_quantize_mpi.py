"""QuantizedAllGather / QuantizedReduceScatter on CUDA arrays across (simulated) hosts: every rank's payload is
quantized and dequantized in one launch each way, not one per rank or host (issue 30: one launch each per bucket),
with the values of the NumPy path bit for bit. Runs on the system tier's GPU phases at 2 and 4 ranks, NCCL and
staged (HPCFSDP_GPU_COMM), or on a real GPU."""
import numpy as np
import pytest

import hpcfsdp.distributed as dist
from hpcfsdp.distributed.fsdp import QuantizedAllGather, QuantizedReduceScatter

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

QUANTIZE_OPS = ("quantize_blocks", "dequantize_blocks", "dequantize_sum")


@pytest.fixture
def cp():
    import cupy

    before = cupy.cuda.runtime.getDevice()
    cupy.cuda.Device(dist.get_rank() % cupy.cuda.runtime.getDeviceCount()).use()
    yield cupy
    cupy.cuda.Device(before).use()


def _hosts(monkeypatch):
    """A group over every rank on two simulated hosts (HPCFSDP_RANKS_PER_NODE), one simulated GPU per rank."""
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(max(1, n // 2)))
    monkeypatch.setenv("HPCFSDP_CUDA_SIM_SHARED_GPUS", "0")
    return dist.new_group(list(range(n)))


def _values(k, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(k) * np.exp(rng.uniform(-3, 3, k))).astype(np.float32)


def _quantize_launches(c):
    return {op: n for op, n in c.launches_by_op.items() if any(q in op for q in QUANTIZE_OPS)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_all_gather_dequantizes_every_rank_s_payload_in_one_launch(cp, monkeypatch, kind):
    from hpcfsdp.testing import cuda_sim

    g = _hosts(monkeypatch)
    n, k = g.size(), 1000
    shard, out = cp.asarray(_values(k, g.rank())), cp.empty(n * k, np.float32)
    gather = QuantizedAllGather(kind, block_size=128)
    gather(out, shard, g)  # the first call learns the group's hosts
    with cuda_sim.counting() as c:
        gather(out, shard, g)
        cp.cuda.get_current_stream().synchronize()
    assert _quantize_launches(c) == {"kernel quantize_blocks<float>": 1, "kernel dequantize_blocks<float>": 1}
    host = np.empty(n * k, np.float32)
    QuantizedAllGather(kind, block_size=128)(host, _values(k, g.rank()), g)
    np.testing.assert_array_equal(out.get(), host)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_reduce_scatter_quantizes_and_sums_the_hosts_rows_in_one_launch_each(cp, monkeypatch, kind):
    from hpcfsdp.testing import cuda_sim

    g = _hosts(monkeypatch)
    n, k = g.size(), 512
    grads = [_values(n * k, 100 * step + g.rank()) for step in range(2)]
    dev, host = QuantizedReduceScatter(kind, block_size=128), QuantizedReduceScatter(kind, block_size=128)
    out = cp.empty(k, np.float32)
    dev(out, cp.asarray(grads[0]), g)  # the first call learns the hops; its residual feeds the second
    inp = cp.asarray(grads[1])
    with cuda_sim.counting() as c:
        dev(out, inp, g)
        cp.cuda.get_current_stream().synchronize()
    assert _quantize_launches(c) == {"kernel quantize_blocks_ef<float>": 1, "kernel dequantize_sum<float>": 1}
    want = np.empty(k, np.float32)
    for x in grads:  # the NumPy path, the same two steps (at most 2 ranks per host: the in-host sum is exact)
        host(want, x.copy(), g)
    np.testing.assert_array_equal(out.get(), want)
