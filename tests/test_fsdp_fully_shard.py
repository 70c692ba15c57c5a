"""fully_shard parity with an unsharded reference trained on the global batch (2 and 4 ranks)."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from hpcfsdp.distributed.process_group import collective_counts, reset_collective_counts
from hpcfsdp.distributed.tensor import DTensor

from _fsdp_util import (Blocks, full, global_mean, gpt_batches, local, rounded_reference_step, tiny_gpt,
                        train_parity, world)

pytestmark = pytest.mark.mpi(min_size=2)


def _per_block(reshard):
    def shard(model):
        for b in model.blocks:
            fully_shard(b, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
    return shard


def test_one_group_gpt():
    from hpcfsdp.distributed.fsdp import FSDPModule

    w, _ = world()
    model, _ = train_parity(tiny_gpt, fully_shard, batches=gpt_batches(10, 4 * w + 1))
    assert [m for m in model.modules() if isinstance(m, FSDPModule)] == [model]  # one unit: the root
    assert all(isinstance(p, DTensor) for p in model.parameters())  # resharded after the step


@pytest.mark.parametrize("reshard", [True, False, None])
def test_per_block_groups(reshard):
    from hpcfsdp.distributed.fsdp import FSDPModule

    w, _ = world()
    model, _ = train_parity(tiny_gpt, _per_block(reshard), batches=gpt_batches(10, 4 * w + 1))
    assert all(isinstance(b, FSDPModule) for b in model.blocks)
    assert all(isinstance(p, DTensor) for p in model.parameters())


@pytest.mark.mpi(min_size=4)
def test_reshard_after_forward_int():
    w, _ = world()
    model, _ = train_parity(tiny_gpt, _per_block(2), batches=gpt_batches(10, 4 * w + 1))
    g = model.blocks[0]._get_fsdp_state()._param_group
    assert g.post_forward_mesh_info.shard_world_size == 2


def test_uneven_sizes_and_untied():
    w, _ = world()
    vocab = 4 * w + 1

    def make():
        hp.manual_seed(5)
        return Blocks(vocab)

    def shard(m):
        for b in m.blocks:
            fully_shard(b)
        fully_shard(m)

    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, vocab, (w * 2, 5)), None) for _ in range(10)]
    model, _ = train_parity(make, shard, batches=batches, loss_fn=lambda m, x, y: m(hp.tensor(x)))
    assert any(p.shape[0] % w for p in model.parameters())  # some rows do not divide over the ranks
    untied, _ = train_parity(lambda: tiny_gpt(tie=False), _per_block(True), batches=gpt_batches(10, vocab))
    assert untied.lm_head.weight is not untied.transformer.wte.weight


def test_tied_embedding_is_one_parameter():
    w, _ = world()
    model, _ = train_parity(tiny_gpt, _per_block(True), batches=gpt_batches(5, 4 * w + 1))
    assert model.lm_head.weight is model.transformer.wte.weight
    assert isinstance(model.lm_head.weight, DTensor)


def test_frozen_parameters_in_a_group():
    w, _ = world()

    def make():
        m = tiny_gpt()
        m.transformer.wpe.weight.requires_grad_(False)
        for b in m.blocks:
            b.ln_1.weight.requires_grad_(False)
        return m

    model, ref = train_parity(make, _per_block(True), batches=gpt_batches(8, 4 * w + 1))
    assert model.transformer.wpe.weight.grad is None
    np.testing.assert_array_equal(ref.transformer.wpe.weight.detach().numpy(),
                                  make().transformer.wpe.weight.detach().numpy())


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 6)
        self.shared = nn.Linear(6, 6)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        h = self.inp(x).tanh()
        h = self.shared(h).tanh()
        h = self.shared(h).tanh()  # the same FSDP unit twice in one forward
        return self.out(h).pow(2).mean()


def test_module_used_twice():
    w, _ = world()

    def make():
        hp.manual_seed(3)
        return Twice()

    def shard(m):
        fully_shard(m.shared)
        fully_shard(m)

    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((w * 3, 6)).astype(np.float32), None) for _ in range(10)]
    reset_collective_counts()
    model, _ = train_parity(make, shard, batches=batches, loss_fn=lambda m, x, y: m(hp.tensor(x)))
    # one reduction per unit and step although the shared unit runs twice per forward
    assert collective_counts().get("reduce_scatter", 0) == 2 * len(batches)


class WithScore(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)

    def score(self, x):
        return self.lin(x).pow(2).mean()


def test_register_fsdp_forward_method():
    w, _ = world()

    def make():
        hp.manual_seed(2)
        return WithScore()

    def shard(m):
        fully_shard(m)
        register_fsdp_forward_method(m, "score")

    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((w * 2, 4)).astype(np.float32), None) for _ in range(10)]
    train_parity(make, shard, batches=batches, loss_fn=lambda m, x, y: m.score(hp.tensor(x)))
    with pytest.raises(ValueError, match="does not have a method nope"):
        register_fsdp_forward_method(shard_gpt_root(), "nope")


def shard_gpt_root():
    m = tiny_gpt()
    fully_shard(m)
    return m


def test_gradient_accumulation_no_sync():
    w, _ = world()
    batches = gpt_batches(6, 4 * w + 1, B_per_rank=4)
    reset_collective_counts()
    model, _ = train_parity(tiny_gpt, _per_block(True), batches=batches, micro_batches=2)
    units = len(model.blocks) + 1
    assert collective_counts().get("reduce_scatter", 0) == units * len(batches)  # the last micro-batch only


def test_sharding_states_after_forward_and_backward():
    w, _ = world()
    model = tiny_gpt()
    for b in model.blocks:
        fully_shard(b, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=False)
    x, y = gpt_batches(1, 4 * w + 1)[0]
    _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
    assert all(isinstance(p, DTensor) for p in model.blocks[0].parameters())
    root_direct = model.transformer.wte.weight
    assert not isinstance(root_direct, DTensor) and tuple(root_direct.shape) == (4 * w + 1, 16)
    loss.backward()
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert all(isinstance(p.grad, DTensor) for p in model.parameters())
    model.unshard()
    assert not isinstance(model.transformer.wte.weight, DTensor)
    model.reshard()
    assert isinstance(model.transformer.wte.weight, DTensor)
    handle = model.blocks[1].unshard(async_op=True)
    handle.wait()
    assert not isinstance(model.blocks[1].attn.c_attn.weight, DTensor)
    model.blocks[1].reshard()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_reduce_dtype_and_parity(dtype):
    from hpcfsdp.distributed.fsdp import ReduceScatter
    from hpcfsdp.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    w, _ = world()
    dt = getattr(hp, dtype)
    seen = []

    class Spy(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            seen.append(input_tensor.dtype)
            return super().__call__(output_tensor, input_tensor, group, op, async_op=async_op)

    mp = MixedPrecisionPolicy(param_dtype=dt, reduce_dtype=hp.float32)
    model = tiny_gpt()
    for b in model.blocks:
        fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.blocks[0].set_custom_reduce_scatter(Spy())
    assert isinstance(Spy(), ReduceScatter)
    ref = tiny_gpt()
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
    for x, y in gpt_batches(5, 4 * w + 1):
        _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        rl = rounded_reference_step(ref, ropt, x, y, dt)
        np.testing.assert_allclose(global_mean(loss.item()), rl, rtol=2e-2)
    assert seen and all(d == hp.float32 for d in seen)
    for p in model.parameters():
        assert p.dtype == hp.float32  # sharded master weights stay float32


def test_cpu_offload_policy_parity():
    from hpcfsdp.distributed.fsdp import CPUOffloadPolicy

    w, _ = world()

    def shard(model):
        for b in model.blocks:
            fully_shard(b, offload_policy=CPUOffloadPolicy())
        fully_shard(model, offload_policy=CPUOffloadPolicy())

    model, _ = train_parity(tiny_gpt, shard, batches=gpt_batches(5, 4 * w + 1))
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())


def test_module_apply_converts_each_shard():
    w, _ = world()
    model = tiny_gpt()
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    before = {n: full(p) for n, p in model.named_parameters()}
    model.double()
    for n, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.dtype == hp.float64 and p._data.dtype == np.float64
        np.testing.assert_array_equal(full(p), before[n].astype(np.float64))
    x, y = gpt_batches(1, 4 * w + 1)[0]
    _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
    loss.backward()
    assert all(p.grad.dtype == hp.float64 for p in model.parameters())


def test_default_comm_implementations_of_the_fsdp_interfaces():
    import hpcfsdp.distributed as dist
    from hpcfsdp._tensor import Tensor
    from hpcfsdp.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    from hpcfsdp.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    T = Tensor._wrap

    n, me = dist.get_world_size(), dist.get_rank()
    g = dist.group.WORLD
    ag, rs = DefaultAllGather(), DefaultReduceScatter()
    assert isinstance(ag, AllGather) and isinstance(rs, ReduceScatter)
    out = ag.allocate((n * 3,), dtype=np.float32, device="cpu")
    assert isinstance(out, Tensor) and out._data.shape == (n * 3,) and out._data.dtype == np.float32
    w = ag(out, T(np.full(3, me, np.float32)), g, async_op=True)
    w.wait()
    assert np.array_equal(out._data, np.repeat(np.arange(n, dtype=np.float32), 3))
    red = rs.allocate((2,), dtype=np.float64, device="cpu")
    rs(red, T(np.arange(2 * n, dtype=np.float64)), g, dist.ReduceOp.AVG)
    assert np.array_equal(red._data, np.arange(2 * me, 2 * me + 2, dtype=np.float64))
    with pytest.raises(TypeError, match="expected a ProcessGroup"):
        ag(out, T(np.zeros(3, np.float32)), "world")
    with pytest.raises(ValueError, match="device meta cannot hold"):
        ag.allocate((2,), dtype=np.float32, device="meta")


def test_cli_fsdp_units_sublayer_makes_each_mlp_a_unit_inside_its_block():
    from hpcfsdp.cli._common import build_gpt, shard_gpt
    from hpcfsdp.cli.config import TrainConfig
    from hpcfsdp.distributed.fsdp import FSDPModule

    for units, mlp_is_unit in (("block", False), ("sublayer", True)):
        cfg = TrainConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, fsdp_units=units)
        model = build_gpt(cfg, "cpu")
        shard_gpt(model, cfg, "cpu")
        assert all(isinstance(b, FSDPModule) for b in model.blocks)
        assert [isinstance(b.mlp, FSDPModule) for b in model.blocks] == [mlp_is_unit] * 2
        assert not any(isinstance(b.attn, FSDPModule) for b in model.blocks)
