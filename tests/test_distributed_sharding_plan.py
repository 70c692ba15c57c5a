"""ShardingPlan/ShardingPlanner (seed 004), the planners, the plan table, apply_sharding_plan; MPI parity."""
import dataclasses
import math
import re

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from hpcfsdp.distributed.sharding_plan import (
    FullyShardSpec,
    MemoryBudgetPlanner,
    ModuleClassPlanner,
    ParamCountPlanner,
    ShardingPlan,
    ShardingPlanner,
    apply_sharding_plan,
)
from hpcfsdp.distributed.sharding_plan import api as plan_api
from hpcfsdp.models import GPT, GPTConfig
from hpcfsdp.models.gpt import Block

from _fsdp_util import gpt_batches, tiny_gpt, train_parity, world


def _gpt(vocab=9, n_layer=2, tie=True):
    hp.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, block_size=8, n_layer=n_layer, n_head=2, n_embd=16, bias=False,
                         tie_weights=tie))


def _seq():
    hp.manual_seed(0)
    # params: 0: 110, 1: 33, 2.0: 220, 2.2: 105
    return nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 3),
                         nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5)))


def _owned(module, units):
    """Reference ownership: each parameter (first FQN) goes to the deepest unit that prefixes its name."""
    out = {u: [] for u in units}
    for name, p in module.named_parameters():
        mod = name.rsplit(".", 1)[0] if "." in name else ""
        cands = [u for u in units if u == "" or mod == u or mod.startswith(u + ".")]
        out[max(cands, key=len)].append(p)
    return out


def _sharded_modules(module):
    return [n for n, m in module.named_modules() if isinstance(m, FSDPModule)]


# ------------------------------------------------------------------------------------------ the seed API
def test_sharding_plan_fields_match_seed():
    f = dataclasses.fields(ShardingPlan)
    assert [x.name for x in f] == ["plan", "output_plan", "return_local_tensor"]
    assert f[1].default is None and f[2].default is None
    plan = ShardingPlan({"": FullyShardSpec()})
    assert plan.output_plan is None and plan.return_local_tensor is None


def test_sharding_planner_is_abstract():
    with pytest.raises(TypeError):
        ShardingPlanner()

    class NoBuild(ShardingPlanner):
        pass

    with pytest.raises(TypeError):
        NoBuild()

    class Root(ShardingPlanner):
        def build_plan(self, module):
            return ShardingPlan({"": FullyShardSpec(reshard_after_forward=True)})

    assert list(Root().build_plan(_seq()).plan) == [""]


def test_plan_type_checks():
    with pytest.raises(TypeError, match="FullyShardSpec"):
        ShardingPlan({"": 3})
    with pytest.raises(TypeError, match="FQN"):
        ShardingPlan({0: FullyShardSpec()})
    with pytest.raises(TypeError, match="output_plan"):
        ShardingPlan({}, output_plan=["x"])
    with pytest.raises(TypeError, match="return_local_tensor"):
        ShardingPlan({}, return_local_tensor="fc")
    with pytest.raises(TypeError, match="unknown fully_shard kwargs"):
        ShardingPlan({"": {"reshard": True}})
    with pytest.raises(TypeError, match="mp_policy"):
        FullyShardSpec(mp_policy="bf16")
    with pytest.raises(TypeError, match="reshard_after_forward"):
        FullyShardSpec(reshard_after_forward="yes")
    spec = ShardingPlan({"": {"reshard_after_forward": False}}).plan[""]
    assert isinstance(spec, FullyShardSpec) and spec.fully_shard_kwargs() == {"reshard_after_forward": False}


# ------------------------------------------------------------------------------------------- planners
def test_module_class_planner_gpt_blocks_and_stats():
    m = _gpt(n_layer=3)
    plan = ModuleClassPlanner([Block]).build_plan(m)
    assert list(plan.plan) == ["transformer.h.0", "transformer.h.1", "transformer.h.2", ""]
    ref = _owned(m, list(plan.plan))
    for key, spec in plan.plan.items():
        ps = ref[key]
        assert spec.stats.num_params == sum(int(np.prod(p.shape)) for p in ps)
        assert spec.stats.unsharded_bytes == sum(p.detach().numpy().nbytes for p in ps)
        assert spec.stats.grad_bytes == spec.stats.unsharded_bytes
    assert plan.plan["transformer.h.0"].stats.module_cls == "Block"
    assert plan.plan[""].stats.module_cls == "GPT"
    assert sum(s.stats.num_params for s in plan.plan.values()) == sum(p.numel() for p in m.parameters())
    # root keeps the tied embedding/lm_head, wpe and ln_f: (9 + 8) * 16 + 16
    assert plan.plan[""].stats.num_params == (9 + 8) * 16 + 16


def test_module_class_planner_checks():
    with pytest.raises(TypeError, match="Module classes"):
        ModuleClassPlanner([int])
    with pytest.raises(ValueError, match="at least one"):
        ModuleClassPlanner([])
    with pytest.raises(ValueError, match="ModuleList"):
        ModuleClassPlanner([nn.ModuleList])
    # every Embedding a unit: the tied token embedding would leave lm_head in another unit
    with pytest.raises(ValueError, match=r"'transformer\.wte'.*'lm_head'|'lm_head'.*'transformer\.wte'"):
        ModuleClassPlanner(nn.Embedding).build_plan(_gpt())
    plan = ModuleClassPlanner(nn.Embedding).build_plan(_gpt(tie=False))
    assert list(plan.plan) == ["transformer.wte", "transformer.wpe", ""]


def test_param_count_planner_sequential():
    m = _seq()
    # min 100: "0" (110), "2.0" (220), "2.2" (105); "2" keeps 0 < 100; root keeps "1" (33)
    plan = ParamCountPlanner(100).build_plan(m)
    assert list(plan.plan) == ["0", "2.0", "2.2", ""]
    assert [s.stats.num_params for s in plan.plan.values()] == [110, 220, 105, 33]
    assert [s.stats.unsharded_bytes for s in plan.plan.values()] == [440, 880, 420, 132]
    # min 150: only "2.0"; "2" keeps 105 < 150; root keeps 110 + 33 + 105
    plan = ParamCountPlanner(150).build_plan(m)
    assert list(plan.plan) == ["2.0", ""]
    assert plan.plan[""].stats.num_params == 248
    # the threshold is inclusive (>=), like size_based_auto_wrap_policy
    assert list(ParamCountPlanner(110).build_plan(m).plan) == ["0", "2.0", ""]
    assert list(ParamCountPlanner(10 ** 6).build_plan(m).plan) == [""]
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="min_num_params"):
            ParamCountPlanner(bad)


def test_param_count_planner_keeps_tied_weights_together():
    m = _gpt(vocab=64)  # wte: 1024 params, tied with lm_head
    plan = ParamCountPlanner(500).build_plan(m)
    assert "transformer.wte" not in plan.plan and "lm_head" not in plan.plan
    # c_attn 768, c_fc and c_proj 1024 each; attn keeps c_proj 256 < 500, mlp keeps nothing
    assert list(plan.plan) == [f"transformer.h.{i}.{n}" for i in (0, 1)
                               for n in ("attn.c_attn", "mlp.c_fc", "mlp.c_proj")] + [""]
    # root: wte (tied lm_head), wpe, ln_f, and per block ln_1, ln_2, attn.c_proj
    assert plan.plan[""].stats.num_params == 64 * 16 + 8 * 16 + 16 + 2 * (2 * 16 + 256)
    untied = ParamCountPlanner(500).build_plan(_gpt(vocab=64, tie=False))
    assert "transformer.wte" in untied.plan and "lm_head" in untied.plan


def test_plan_text_table():
    m = _seq()
    plan = ParamCountPlanner(100).build_plan(m)
    text = str(plan)
    assert text == plan.describe()
    lines = text.splitlines()
    assert lines[0].split() == ["unit", "class", "params", "unsharded", "bytes"]
    rows = [ln.split() for ln in lines[1:-2]]
    assert rows == [["0", "Linear", "110", "440"], ["2.0", "Linear", "220", "880"],
                    ["2.2", "Linear", "105", "420"], ["(root)", "Sequential", "33", "132"]]
    assert set(lines[-2].replace(" ", "")) == {"-"}
    assert lines[-1].split() == ["total", "4", "units", "468", "1,872"]
    # thousands separators, and a plan without stats measured on demand
    big = ShardingPlan({"": FullyShardSpec()})
    assert "?" in str(big)
    lin = nn.Linear(100, 30)
    assert big.describe(lin).splitlines()[1].split() == ["(root)", "Linear", "3,030", "12,120"]
    # a plan without the root describes it too (apply_sharding_plan always shards the root)
    lines = ShardingPlan({"2": FullyShardSpec()}).describe(m).splitlines()
    assert [ln.split()[0] for ln in lines[1:-2]] == ["2", "(root)"]
    assert lines[1].split()[1:] == ["Sequential", "325", "1,300"] and lines[-1].split()[-2:] == ["468", "1,872"]
    with pytest.raises(ValueError, match="'3'"):
        ShardingPlan({"3": FullyShardSpec()}).describe(m)


# --------------------------------------------------------------------------------- memory budget planner
def _ref_required(module, units, world, k=2.0, prefetch=1):
    """Independent [Note: Memory model]: (S, {unit: working bytes})."""
    s = 0.0
    for _, p in module.named_parameters():
        a = p.detach().numpy()
        rows = a.shape[0] if a.ndim else 1
        shard = -(-rows // world) * (a.size // rows) * a.itemsize
        s += shard * (1 + (1 + k) * p.requires_grad)
    s = math.ceil(s)
    work = {}
    for u, ps in _owned(module, units).items():
        b = sum(p.detach().numpy().nbytes for p in ps)
        g = sum(p.detach().numpy().nbytes for p in ps if p.requires_grad)
        work[u] = (1 + prefetch) * b + g
    return s, work


@pytest.mark.parametrize("world", [1, 2, 4])
def test_budget_plans_fit(world):
    m = _gpt(n_layer=2)
    block = 3104 * 4  # 16 + 16*48 + 16*16 + 16 + 16*64 + 64*16 params, float32
    s, _ = _ref_required(m, [""], world)
    total = sum(p.detach().numpy().nbytes for p in m.parameters())
    # everything in the root fits exactly: one unit
    plan = MemoryBudgetPlanner(s + 3 * total, world_size=world).build_plan(m)
    assert list(plan.plan) == [""]
    # one byte less: the blocks (the largest children) become units, both alike
    plan = MemoryBudgetPlanner(s + 3 * total - 1, world_size=world).build_plan(m)
    assert list(plan.plan) == ["transformer.h.0", "transformer.h.1", ""]
    plan = MemoryBudgetPlanner(s + 3 * block, world_size=world).build_plan(m)
    assert list(plan.plan) == ["transformer.h.0", "transformer.h.1", ""]
    # finer and finer: every unit of every plan fits the budget by the reference formula
    minimum = s + 3 * 1024 * 4  # the largest leaves: mlp.c_fc and mlp.c_proj (16 x 64)
    for budget in sorted({s + 3 * block - 1, s + 3 * 5000, s + 3 * 4500, minimum + 700, minimum}, reverse=True):
        planner = MemoryBudgetPlanner(budget, world_size=world)
        plan = planner.build_plan(m)
        ref_s, work = _ref_required(m, list(plan.plan), world)
        assert all(ref_s + w <= budget for w in work.values()), (budget, work)
        est = planner.estimate(m, plan)
        assert est.sharded_state_bytes == ref_s and est.unit_bytes == work and est.fits
        assert est.required_bytes == ref_s + max(work.values())
        assert list(plan.plan)[-1] == "" and all(sp.stats.num_params > 0 for sp in plan.plan.values())
        assert "transformer.wte" not in plan.plan and "lm_head" not in plan.plan  # tied: they stay in the root
    assert {"transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj"} <= set(plan.plan)
    assert "transformer.h.0.mlp" not in plan.plan  # all its parameters went to its children
    # below the minimum: a leaf cannot be split; the message names the budget, the need and the module
    with pytest.raises(ValueError) as e:
        MemoryBudgetPlanner(minimum - 1, world_size=world).build_plan(m)
    msg = str(e.value)
    assert f"{minimum - 1:,} B" in msg and f"{minimum:,} B" in msg
    assert re.search(r"'transformer\.h\.\d\.mlp\.c_(fc|proj)' \(Linear\)", msg) and "leaf" in msg


def test_budget_error_sharded_state_and_tied_root():
    m = _gpt(vocab=300)  # the tied embedding (300 x 16) is larger than any block leaf and stays in the root
    s, _ = _ref_required(m, [""], 2)
    with pytest.raises(ValueError, match=r"alone need .*'' \(the root\) \(GPT\)|\(the root\) \(GPT\) alone"):
        MemoryBudgetPlanner(s - 1, world_size=2).build_plan(m)
    need = s + 3 * 300 * 16 * 4
    plan = MemoryBudgetPlanner(need, world_size=2).build_plan(m)
    assert plan.plan[""].stats.unsharded_bytes == 300 * 16 * 4
    with pytest.raises(ValueError, match=r"'' \(the root\) \(GPT\) needs " + re.escape(f"{need:,} B")):
        MemoryBudgetPlanner(need - 1, world_size=2).build_plan(m)


def test_budget_frozen_params_and_factors():
    m = _gpt()
    m.transformer.wpe.weight.requires_grad_(False)
    for b in m.blocks:
        b.mlp.c_fc.weight.requires_grad_(False)
    for k, pf in ((0.0, 0), (1.0, 2), (2.0, 1)):
        s, _ = _ref_required(m, [""], 3, k, pf)
        for budget in (s + 4 * (2 + pf) * 4096, s + 3 * (2 + pf) * 4096 // 2, s + (2 + pf) * 4096):
            planner = MemoryBudgetPlanner(budget, world_size=3, optimizer_state_factor=k, prefetch=pf)
            plan = planner.build_plan(m)
            ref_s, work = _ref_required(m, list(plan.plan), 3, k, pf)
            assert all(ref_s + w <= budget for w in work.values()), (k, pf, budget, work)
            assert planner.estimate(m, plan).required_bytes == ref_s + max(work.values())
    assert plan.plan["transformer.h.0.mlp.c_fc"].stats.grad_bytes == 0


def test_planners_on_meta_device_models():
    meta = GPT(GPTConfig(vocab_size=9, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=False), device="meta")
    cpu = _gpt()
    for planner in (ParamCountPlanner(500), ModuleClassPlanner(Block), MemoryBudgetPlanner(70_000, world_size=2)):
        assert planner.build_plan(meta) == planner.build_plan(cpu)


def test_budget_planner_checks():
    for kw in (dict(budget_bytes=0), dict(budget_bytes=-1), dict(budget_bytes=float("inf")),
               dict(budget_bytes=10, world_size=0), dict(budget_bytes=10, optimizer_state_factor=-1),
               dict(budget_bytes=10, prefetch=-1), dict(budget_bytes=10, prefetch=1.5)):
        with pytest.raises(ValueError, match=list(kw)[-1]):
            MemoryBudgetPlanner(**kw)
    with pytest.raises(TypeError, match="nn.Module"):
        MemoryBudgetPlanner(10 ** 9).build_plan([nn.Linear(2, 2)])


def test_budget_world_size_defaults_to_the_default_group():
    m = _seq()
    planner = MemoryBudgetPlanner(10 ** 9)
    assert planner.estimate(m, planner.build_plan(m)).world_size == dist.get_world_size()


# --------------------------------------------------------------------------------- apply_sharding_plan
def test_apply_order_and_kwarg_merge(monkeypatch):
    calls = []
    monkeypatch.setattr(plan_api, "fully_shard", lambda mod, **kw: calls.append((mod, kw)))
    m = _gpt(n_layer=2)
    mp = MixedPrecisionPolicy(param_dtype=hp.float32)
    plan = ShardingPlan({"": FullyShardSpec(), "transformer.h.1": FullyShardSpec(reshard_after_forward=True),
                         "transformer.h.0.mlp": FullyShardSpec(mp_policy=mp), "transformer.h.0": FullyShardSpec()})
    assert apply_sharding_plan(m, plan, mesh="M", reshard_after_forward=False) is m
    names = {id(mod): n for n, mod in m.named_modules()}
    assert [names[id(mod)] for mod, _ in calls] == ["transformer.h.0.mlp", "transformer.h.1", "transformer.h.0", ""]
    assert calls[0][1] == dict(mesh="M", reshard_after_forward=False, mp_policy=mp)
    assert calls[1][1] == dict(mesh="M", reshard_after_forward=True)
    assert calls[3][1] == dict(mesh="M", reshard_after_forward=False)
    # the root is a unit even when the plan leaves it out
    calls.clear()
    apply_sharding_plan(_gpt(), ShardingPlan({"transformer.h.0": FullyShardSpec()}))
    assert len(calls) == 2 and isinstance(calls[1][0], GPT)


def test_apply_serial_matches_unsharded():
    ref = _gpt(n_layer=2)
    m = _gpt(n_layer=2)
    plan = MemoryBudgetPlanner(160_000, world_size=1).build_plan(m)
    assert len(plan.plan) > 1
    apply_sharding_plan(m, plan)
    assert sorted(_sharded_modules(m)) == sorted(plan.plan)
    x = np.random.default_rng(0).integers(0, 9, (2, 8))
    np.testing.assert_allclose(m(hp.tensor(x))[0].detach().numpy(), ref(hp.tensor(x))[0].detach().numpy(),
                               rtol=1e-6, atol=1e-7)
    with pytest.raises(RuntimeError, match="already sharded"):
        apply_sharding_plan(m, plan)


def test_apply_rejects_bad_plans_before_sharding():
    m = _gpt()
    cases = [
        (ShardingPlan({"transformer.h.7": FullyShardSpec()}), ValueError, r"'transformer\.h\.7'"),
        (ShardingPlan({"": FullyShardSpec()}, return_local_tensor=["nope"]), ValueError, "'nope'"),
        (ShardingPlan({"transformer.h": FullyShardSpec()}), ValueError, "ModuleList"),
        (ShardingPlan({"transformer.wte": FullyShardSpec(), "": FullyShardSpec()}), ValueError,
         r"'transformer\.wte' and 'lm_head'"),
        (ShardingPlan({"lm_head": FullyShardSpec()}), ValueError, r"'transformer\.wte' and 'lm_head'"),
        (ShardingPlan({"": FullyShardSpec()}, output_plan={"lm_head": "spec"}), NotImplementedError,
         "tensor parallelism"),
    ]
    for plan, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            apply_sharding_plan(m, plan)
        assert _sharded_modules(m) == []
    with pytest.raises(TypeError, match="reshard"):
        apply_sharding_plan(m, ShardingPlan({}), reshard=True)
    with pytest.raises(TypeError, match="ShardingPlan"):
        apply_sharding_plan(m, {"": FullyShardSpec()})
    assert _sharded_modules(m) == []
    # the tie message names both units; an ignored tied parameter may cross units
    with pytest.raises(ValueError, match=r"different units \('transformer\.wte' and '' \(the root\)\)"):
        apply_sharding_plan(m, ShardingPlan({"transformer.wte": FullyShardSpec()}))
    ok = ShardingPlan({"": FullyShardSpec()}, output_plan={}, return_local_tensor=["", "lm_head"])
    apply_sharding_plan(m, ok)
    assert _sharded_modules(m) == [""]


# -------------------------------------------------------------------------------------------------- MPI
def _block_budget(model):
    """The budget at which the blocks are units: the estimate of the ModuleClassPlanner(Block) plan."""
    return MemoryBudgetPlanner(10 ** 12).estimate(model, ModuleClassPlanner(Block).build_plan(model)).required_bytes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("finer", [False, True])
def test_budget_plan_training_parity(finer):
    w, _ = world()
    budget = _block_budget(tiny_gpt()) - (1 if finer else 0)
    plans = []

    def shard(model):
        plan = MemoryBudgetPlanner(budget).build_plan(model)
        plans.append(plan)
        apply_sharding_plan(model, plan)

    model, _ = train_parity(tiny_gpt, shard, steps=3, batches=gpt_batches(3, 4 * w + 1))
    plan = plans[0]
    units = list(plan.plan)
    if finer:
        # one byte less: each block splits off its largest child (mlp: 2048 of its 3104 params): nested units
        assert units == ["transformer.h.0.mlp", "transformer.h.0", "transformer.h.1.mlp", "transformer.h.1", ""]
    else:
        assert units == ["transformer.h.0", "transformer.h.1", ""]
    assert sorted(_sharded_modules(model)) == sorted(units)
    gathered = [None] * w
    dist.all_gather_object(gathered, units)
    assert all(g == units for g in gathered)
    est = MemoryBudgetPlanner(budget).estimate(model, plan)
    assert est.world_size == w and est.required_bytes <= budget


@pytest.mark.mpi(min_size=2)
def test_class_and_count_plans_training_parity():
    w, _ = world()
    batches = gpt_batches(3, 4 * w + 1)
    train_parity(tiny_gpt, lambda m: apply_sharding_plan(m, ModuleClassPlanner(Block).build_plan(m),
                                                         reshard_after_forward=False), steps=3, batches=batches)
    train_parity(lambda: tiny_gpt(tie=False), lambda m: apply_sharding_plan(m, ParamCountPlanner(500).build_plan(m)),
                 steps=3, batches=batches)
