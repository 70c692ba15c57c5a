"""QuantizedAllGather / QuantizedReduceScatter (ZeRO++'s qwZ, qgZ) at 2 and 4 ranks: every rank gathers the same
dequantized shards, the reduction's cross-host hop carries the quantized bytes only (hosts simulated with
HPCFSDP_RANKS_PER_NODE), its result is within the quantization bound of the float64 sum, error feedback keeps
the running sum within one step, and FSDP trains with both close to the unquantized run."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp._kernels import quantize as Q
from hpcfsdp.distributed.fsdp import QuantizedAllGather, QuantizedReduceScatter, fully_shard
from hpcfsdp.distributed.process_group import ReduceOp, collective_bytes, reset_collective_counts

pytestmark = pytest.mark.mpi(min_size=2)


def _group():
    return dist.group.WORLD


def _shard(k, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(k) * np.exp(rng.uniform(-3, 3, k))).astype(np.float32)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_all_gather_gives_every_rank_the_same_dequantized_shards(kind, monkeypatch):
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(max(1, n // 2)))  # two simulated hosts
    g = dist.new_group(list(range(n)))
    r, k = g.rank(), 1000
    out = np.empty(n * k, np.float32)
    w = QuantizedAllGather(kind, block_size=128)(out, _shard(k, r), g, async_op=True)
    w.wait()
    for src in range(n):
        x = _shard(k, src)
        want = Q.dequantize(Q.quantize(x, kind, 128), kind, k, 128, np.float32)
        np.testing.assert_array_equal(out[src * k:(src + 1) * k], want)
        assert np.all(np.abs(want.astype(np.float64) - x) <= Q.step_bound(x, kind, 128) * (1 + 1e-5))
    reset_collective_counts()
    gather = QuantizedAllGather(kind, block_size=128)
    gather(out, _shard(k, r), g)
    assert collective_bytes()["all_gather"] == Q.payload_bytes(kind, k, 128) < 0.3 * 4 * k
    monkeypatch.delenv("HPCFSDP_RANKS_PER_NODE")
    one_host = dist.new_group(list(range(n)))  # made without the override: one host, no slow link to spare
    gather(out, _shard(k, r), one_host)
    for src in range(n):
        np.testing.assert_array_equal(out[src * k:(src + 1) * k], _shard(k, src))  # gathered in full precision


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_reduce_scatter_quantizes_the_cross_host_hop_only(kind, monkeypatch):
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(max(1, n // 2)))  # two simulated hosts
    g = dist.new_group(list(range(n)))  # made under the override: its hosts are the simulated ones
    r, k = g.rank(), 512
    inputs = [np.concatenate([_shard(k, 100 * src + dst) for dst in range(n)]) for src in range(n)]
    comm = QuantizedReduceScatter(kind, block_size=64, error_feedback=False)
    out = np.empty(k, np.float32)
    comm(out, inputs[r].copy(), g, ReduceOp.SUM)  # the first call makes the hops' groups
    reset_collective_counts()
    out = np.empty(k, np.float32)
    comm(out, inputs[r].copy(), g, ReduceOp.SUM)
    sent = collective_bytes()
    assert sent["all_to_all"] == 2 * Q.payload_bytes(kind, k, 64), sent  # one payload per host, nothing wider
    assert sent["reduce_scatter"] == 4 * n * k, sent  # inside the host: full precision
    true = sum(inputs[src].astype(np.float64).reshape(n, k)[r] for src in range(n))
    per = n // 2
    host_sums = [sum(inputs[src].astype(np.float64).reshape(n, k)[r] for src in range(h * per, (h + 1) * per))
                 for h in range(2)]
    bound = sum(Q.step_bound(s.astype(np.float32), kind, 64) for s in host_sums)
    assert np.all(np.abs(out - true) <= bound * (1 + 1e-4) + 1e-5 * np.abs(true))
    assert np.max(np.abs(out - true)) > 0  # really quantized
    avg = np.empty(k, np.float32)
    comm(avg, inputs[r].copy(), g, ReduceOp.AVG)
    np.testing.assert_allclose(avg, out / n, rtol=1e-6)


@pytest.mark.timeout(60)
def test_one_host_reduces_in_full_precision():
    g = _group()
    n, r, k = g.size(), g.rank(), 300
    inputs = [np.concatenate([_shard(k, 7 * src + dst) for dst in range(n)]) for src in range(n)]
    out, ref = np.empty(k, np.float32), np.empty(k, np.float32)
    QuantizedReduceScatter("int4")(out, inputs[r].copy(), g, ReduceOp.SUM)
    g.reduce_scatter_into(ref, inputs[r].copy(), ReduceOp.SUM)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.timeout(60)
def test_error_feedback_keeps_the_running_sum_within_one_step(monkeypatch):
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(max(1, n // 2)))
    g = dist.new_group(list(range(n)))
    r, k, steps = g.rank(), 256, 20
    comm = QuantizedReduceScatter("int4", block_size=64, error_feedback=True)
    applied = np.zeros(k, np.float64)
    true = np.zeros(k, np.float64)
    for t in range(steps):
        inputs = [np.concatenate([_shard(k, 1000 * t + 10 * src + dst) for dst in range(n)]) for src in range(n)]
        out = np.empty(k, np.float32)
        comm(out, inputs[r].copy(), g, ReduceOp.SUM)
        applied += out
        true += sum(inputs[src].astype(np.float64).reshape(n, k)[r] for src in range(n))
    # what is still owed is the last residuals: at most half a step of each host's last payload
    last = [np.abs(res).max() for res in comm.residuals.values()]
    step = max(last) * 2 + 1e-6
    assert np.all(np.abs(applied - true) <= 2 * step * 1.01 + 1e-4 * np.abs(true)), np.abs(applied - true).max()
    without = QuantizedReduceScatter("int4", block_size=64, error_feedback=False)
    drift = np.zeros(k)
    for t in range(steps):
        inputs = [np.concatenate([_shard(k, 1000 * t + 10 * src + dst) for dst in range(n)]) for src in range(n)]
        out = np.empty(k, np.float32)
        without(out, inputs[r].copy(), g, ReduceOp.SUM)
        drift += out
    assert np.abs(drift - true).max() > np.abs(applied - true).max()  # feedback is what keeps it close


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        hp.manual_seed(3)
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        return self.b(self.a(x).relu())


@pytest.mark.timeout(120)
def test_fsdp_trains_with_quantized_weights_and_gradients_close_to_unquantized(monkeypatch):
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(max(1, n // 2)))
    r = dist.get_rank()

    def run(quantized):
        model = _Net()
        for m in (model.a, model.b, model):
            fully_shard(m)
            if quantized:
                m.set_custom_all_gather(QuantizedAllGather("int8", block_size=64))
                m.set_custom_reduce_scatter(QuantizedReduceScatter("int8", block_size=64))
        opt = hp.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for t in range(6):
            rng = np.random.default_rng(50 * t + r)
            x, y = hp.tensor(rng.standard_normal((4, 16)).astype(np.float32)), hp.tensor(
                rng.standard_normal((4, 16)).astype(np.float32))
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, {k: v.full_tensor().numpy() for k, v in model.state_dict().items()}

    plain_losses, plain = run(False)
    q_losses, q = run(True)
    np.testing.assert_allclose(q_losses, plain_losses, rtol=2e-2)
    assert q_losses != plain_losses  # the weights really went through int8
    for name in plain:
        np.testing.assert_allclose(q[name], plain[name], atol=3e-3, err_msg=name)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_replicate_all_reduce_is_quantized_and_leaves_the_replicas_equal(kind):
    g = _group()
    n, r, k = g.size(), g.rank(), 1001
    comm = QuantizedReduceScatter(kind, block_size=64, error_feedback=False)
    mine = _shard(k, 40 + r)
    arr = mine.copy()
    reset_collective_counts()
    comm.all_reduce(arr, g, ReduceOp.SUM).wait()
    sent = collective_bytes()
    c = -(-k // n)
    assert sent == {"all_to_all": n * Q.payload_bytes(kind, c, 64), "all_gather": Q.payload_bytes(kind, c, 64)}, sent
    everyone = np.empty(n * k, np.float32)
    g.all_gather_into(everyone, arr)
    for other in everyone.reshape(n, k):
        np.testing.assert_array_equal(other, arr)  # replicas stay equal
    parts = [_shard(k, 40 + src).astype(np.float64) for src in range(n)]
    true = sum(parts)
    pad = lambda x: np.concatenate([x, np.zeros(n * c - k)]).reshape(n, c)  # noqa: E731
    first = sum(pad(p) for p in parts)  # the sums (their blocks' scales bound the second rounding)
    bound_rows = sum(np.stack([Q.step_bound(row.astype(np.float32), kind, 64) for row in pad(p)]) for p in parts)
    bound_sum = np.stack([Q.step_bound((row * (1 + 1e-3)).astype(np.float32), kind, 64) for row in first]) + bound_rows
    bound = (bound_rows + bound_sum).reshape(-1)[:k]
    assert np.all(np.abs(arr - true) <= bound * 1.01 + 1e-5 * np.abs(true)), (np.abs(arr - true) / bound).max()
    avg = mine.copy()
    comm.all_reduce(avg, g, ReduceOp.AVG)
    np.testing.assert_allclose(avg, arr / n, rtol=1e-5, atol=1e-6)


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
def test_hsdp_trains_with_the_quantized_replicate_hop_close_to_unquantized():
    from hpcfsdp.distributed.device_mesh import init_device_mesh

    n, r = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("replicate", "shard"))

    def run(quantized):
        model = _Net()
        comms = []
        for m in (model.a, model.b, model):
            fully_shard(m, mesh=mesh)
            if quantized:
                comms.append(QuantizedReduceScatter("int8", block_size=64))
                m.set_custom_reduce_scatter(comms[-1])
        opt = hp.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for t in range(6):
            rng = np.random.default_rng(50 * t + r)
            x = hp.tensor(rng.standard_normal((4, 16)).astype(np.float32))
            loss = ((model(x) - x) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        # the units holding parameters (the root holds none) sent their replicate hop quantized
        assert not quantized or all(any(key[0] == "ar" for key in c.residuals) for c in comms[:2])
        return losses, {k: v.full_tensor().numpy() for k, v in model.state_dict().items()}

    plain_losses, plain = run(False)
    q_losses, q = run(True)
    np.testing.assert_allclose(q_losses, plain_losses, rtol=2e-2)
    for name in plain:
        np.testing.assert_allclose(q[name], plain[name], atol=3e-3, err_msg=name)
        everyone = np.empty((n,) + q[name].shape, np.float32)
        dist.group.WORLD.all_gather_into(everyone.reshape(-1), np.ascontiguousarray(q[name]).reshape(-1))
        for other in everyone:
            np.testing.assert_array_equal(other, q[name])  # every replica holds the same parameters
