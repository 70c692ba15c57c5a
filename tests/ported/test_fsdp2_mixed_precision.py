"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_mixed_precision.py."""
import numpy as np
import pytest

from _common import (
    MLP,
    assert_close,
    check_sharded_parity,
    copy_model,
    global_sum,
    local,
    randn,
    to_np,
    world,
)
from _framework import MixedPrecisionPolicy, dist, fully_shard, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _models(reshard_after_forward, param_dtype, reduce_dtype, dim=16):
    torch.manual_seed(42)
    model = nn.Sequential(*[MLP(dim) for _ in range(3)])
    ref = copy_model(model)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for mlp in model:
        fully_shard(mlp, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    return ref, model


def _record_param_dtypes(module, seen):
    """Forward pre-hook on every Linear: the dtype its (unsharded) weight has while it computes."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(lambda mod, args: seen.append(mod.weight.dtype))


def _ddp_low_precision_step(ref, ref_lp, ref_optim, x_local, reduce_dtype):
    """The mixed-precision reference: compute in ref_lp's dtype on the local batch, cast the gradients to
    ``reduce_dtype``, all-reduce and average them (DDP by hand), step the float32 master ``ref``, copy back."""
    w, _ = world()
    loss = ref_lp(x_local).sum()
    loss.backward()
    for p32, plp in zip(ref.parameters(), ref_lp.parameters()):
        g = plp.grad.to(reduce_dtype)
        dist.all_reduce(g)
        p32.grad = (g / w).to(torch.float32)
        plp.grad = None
    ref_optim.step()
    with torch.no_grad():
        for p32, plp in zip(ref.parameters(), ref_lp.parameters()):
            plp.copy_(p32.to(plp.dtype))
    return loss


@pytest.mark.parametrize("reshard_after_forward", [False, True, 2])
@pytest.mark.parametrize("param_dtype", ["bfloat16", "float16"])
def test_compute_dtype(param_dtype, reshard_after_forward):
    """param_dtype only: forward/backward compute in param_dtype (unsharded weights, loss); the sharded
    parameters and gradients stay float32; training follows the low-precision reference."""
    param_dtype = getattr(torch, param_dtype)
    w, _ = world()
    ref, model = _models(reshard_after_forward, param_dtype, None)
    ref_lp = copy_model(ref).to(param_dtype)
    seen = []
    _record_param_dtypes(model, seen)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(3):
        x = randn(4 * w, 16, seed=it, dtype=param_dtype)
        optim.zero_grad(set_to_none=(it % 2 == 0))
        ref_optim.zero_grad(set_to_none=(it % 2 == 0))
        loss = model(local(x)).sum()
        assert loss.dtype == param_dtype
        loss.backward()
        optim.step()
        ref_loss = _ddp_low_precision_step(ref, ref_lp, ref_optim, local(x), param_dtype)
        assert_close(loss, ref_loss, rtol=0, atol=0, msg=f"loss at iter {it}")  # the same low-precision compute
        for p in model.parameters():
            assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        # the reduction itself ran in param_dtype (numbers rounded to it at each rank and in the sum)
        check_sharded_parity(ref, model, rtol=2e-2, atol=2e-2, check_grads=False)
    assert seen and all(d == param_dtype for d in seen), set(seen)


@pytest.mark.parametrize("reshard_after_forward", [False, True, 2])
def test_reduce_dtype(reshard_after_forward):
    """bf16 compute, fp32 reduction: parity with a reference that casts its bf16 gradients to fp32 before
    all-reducing (tight: only the fp32 summation order differs)."""
    w, _ = world()
    ref, model = _models(reshard_after_forward, torch.bfloat16, torch.float32)
    ref_lp = copy_model(ref).to(torch.bfloat16)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(3):
        x = randn(4 * w, 16, seed=it, dtype=torch.bfloat16)
        optim.zero_grad(set_to_none=(it % 2 == 0))
        ref_optim.zero_grad(set_to_none=(it % 2 == 0))
        loss = model(local(x)).sum()
        loss.backward()
        ref_loss = _ddp_low_precision_step(ref, ref_lp, ref_optim, local(x), torch.float32)
        assert_close(loss, ref_loss, rtol=0, atol=0, msg=f"loss at iter {it}")
        for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
            assert p.grad.dtype == torch.float32
            assert_close(p.grad, rp.grad, rtol=1e-5, atol=1e-6, msg=f"grad {name}")
        optim.step()
        check_sharded_parity(ref, model, rtol=1e-5, atol=1e-6, check_grads=False)


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_grad_acc_with_reduce_dtype(reshard_after_forward):
    """bf16 compute, fp32 reduce, micro-batches without gradient sync then a synced one: the unsharded
    gradients accumulate in fp32. The reference accumulates the bf16 micro-batch gradients in fp32, and the
    test checks that bf16 accumulation would be told apart at the tolerance used."""
    w, _ = world()
    ref, model = _models(reshard_after_forward, torch.bfloat16, torch.float32)
    ref_lp = copy_model(ref).to(torch.bfloat16)
    num_micro = 4
    x = randn(2 * num_micro * w, 16, seed=7, dtype=torch.bfloat16)
    micro = [t.contiguous() for t in torch.chunk(local(x), num_micro)]
    acc32 = [None] * len(list(ref.parameters()))
    acc16 = [None] * len(acc32)
    for i, xm in enumerate(micro):
        last = i == num_micro - 1
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last or reshard_after_forward)
        loss = model(xm).sum()
        ref_loss = ref_lp(xm).sum()
        assert loss.dtype == torch.bfloat16
        assert_close(loss, ref_loss, rtol=0, atol=0, msg=f"micro-batch {i}")
        loss.backward()
        ref_loss.backward()
        for j, plp in enumerate(ref_lp.parameters()):
            g = plp.grad.to(torch.float32)
            acc32[j] = g if acc32[j] is None else acc32[j] + g
            acc16[j] = plp.grad.clone() if acc16[j] is None else acc16[j] + plp.grad
            plp.grad = None
    rtol, atol = 1e-5, 1e-6
    apart = 0
    for j, ((name, p), rp) in enumerate(zip(model.named_parameters(), ref.parameters())):
        g32 = acc32[j].clone()
        dist.all_reduce(g32)
        g16 = acc16[j].to(torch.float32)
        dist.all_reduce(g16)
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert_close(p.grad, g32 / w, rtol=rtol, atol=atol, msg=f"fp32-accumulated grad {name}")
        diff = np.abs(to_np(g16 / w) - to_np(g32 / w))
        apart += int((diff > atol + rtol * np.abs(to_np(g32 / w))).any())
    assert apart > 0, "bf16 and fp32 accumulation agree at this tolerance: the test would not tell them apart"


class SaveForwardInputsModule(nn.Module):
    def __init__(self, forward_inputs, cast_forward_inputs, dim=16):
        super().__init__()
        self.l = nn.Linear(dim, dim)
        self.forward_inputs = forward_inputs
        self.cast_forward_inputs = cast_forward_inputs

    def forward(self, x):
        self.forward_inputs[self] = x
        return self.l(x.to(self.l.weight.dtype) if self.cast_forward_inputs else x)


class SaveForwardInputsModel(nn.Module):
    def __init__(self, forward_inputs, cast_forward_inputs, dim=16):
        super().__init__()
        self.c1 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs, dim)
        self.c2 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs, dim)
        self.forward_inputs = forward_inputs

    def forward(self, x):
        self.forward_inputs[self] = x
        return self.c2(self.c1(x))


def test_float16_on_one_submodule():
    """fp16 on one child only: (1) on c2, which casts its own input; (2) on c2 with
    cast_forward_inputs=False, the user module casting; (3) on the NON-root c1 with output_dtype=fp32, so that
    its output (c2's input) is float32."""
    x = torch.zeros(2, 16)
    inputs = {}
    model = SaveForwardInputsModel(inputs, cast_forward_inputs=False)
    fully_shard(model.c2, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))
    fully_shard(model)
    model(x).sum().backward()
    assert [inputs[m].dtype for m in (model, model.c1, model.c2)] == [torch.float32, torch.float32, torch.float16]

    inputs = {}
    model = SaveForwardInputsModel(inputs, cast_forward_inputs=True)
    fully_shard(model.c2, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16, cast_forward_inputs=False))
    fully_shard(model)
    model(x).sum().backward()
    assert [inputs[m].dtype for m in (model, model.c1, model.c2)] == [torch.float32, torch.float32, torch.float32]

    inputs = {}
    model = SaveForwardInputsModel(inputs, cast_forward_inputs=False)
    fully_shard(model.c1, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16, output_dtype=torch.float32))
    fully_shard(model)
    outputs = []
    model.c1.register_forward_hook(lambda mod, args, out: outputs.append(out.dtype))
    model(x).sum().backward()
    assert [inputs[m].dtype for m in (model, model.c1, model.c2)] == [torch.float32, torch.float16, torch.float32]
    assert outputs == [torch.float32]
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32


class ToyModule(nn.Module):
    def __init__(self, forward_inputs, dim=16):
        super().__init__()
        self.l = nn.Linear(dim, dim)
        self.forward_inputs = forward_inputs

    def forward(self, x, y):
        self.forward_inputs["l2_input_x"] = x
        self.forward_inputs["l2_input_y"] = y
        return self.l(x)


class ToyModel(nn.Module):
    def __init__(self, forward_inputs, dim=16):
        super().__init__()
        self.l1 = nn.Linear(dim, dim)
        self.l2 = ToyModule(forward_inputs, dim)
        self.forward_inputs = forward_inputs

    def forward(self, x):
        self.forward_inputs["model_input_x"] = x
        y = torch.ones(2, 16, dtype=torch.float32)  # an input from outside the root's arguments
        return self.l2(self.l1(x), y)


@pytest.mark.parametrize("enable_submodule_cast", [False, True])
def test_submodules_with_external_inputs(enable_submodule_cast):
    """A child's cast_forward_inputs decides whether an input that did not come through the root is cast."""
    inputs = {}
    model = ToyModel(inputs)
    fully_shard(model.l2, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16,
                                                         cast_forward_inputs=enable_submodule_cast))
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))
    model(torch.zeros(2, 16)).sum().backward()
    assert inputs["model_input_x"].dtype == torch.float16
    assert inputs["l2_input_x"].dtype == torch.float16
    assert inputs["l2_input_y"].dtype == (torch.float16 if enable_submodule_cast else torch.float32)


@pytest.mark.parametrize("param_dtype", ["bfloat16", "float16"])
def test_norm_modules(param_dtype):
    """Norm layers under a low-precision policy: LayerNorm computes in param_dtype; BatchNorm (float32 running
    statistics, which CPU kernels refuse to mix with half inputs) gets its own policy that keeps it float32
    and casts its output (PyTorch's "special mixed precision policy" sub-case). Forward output in
    param_dtype, backward runs, gradients float32."""
    param_dtype = getattr(torch, param_dtype)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype)
    for kind in ("layer_norm", "batch_norm"):
        torch.manual_seed(0)
        norm = nn.LayerNorm(16) if kind == "layer_norm" else nn.BatchNorm1d(16)
        model = nn.Sequential(nn.Linear(16, 16), norm, nn.Linear(16, 16))
        if kind == "batch_norm":
            fully_shard(model[1], mp_policy=MixedPrecisionPolicy(output_dtype=param_dtype))
            shard = (model[0], model[2], model)
        else:
            shard = (model[0], model[1], model[2], model)
        for m in shard:
            fully_shard(m, mp_policy=mp)
        z = model(randn(4, 16, seed=1))
        assert z.dtype == param_dtype, kind
        z.sum().backward()
        for p in model.parameters():
            assert p.grad is not None and p.grad.dtype == torch.float32, kind


def test_clamp_reduce_dtype():
    """A model built in bf16 with policy (bf16, bf16), cast to fp32 afterwards: the reduction still runs in bf16
    (it is not clamped to the new parameter dtype), so every reduced gradient is a bf16 number."""
    w, _ = world()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16, dtype=torch.bfloat16), nn.Linear(16, 16, dtype=torch.bfloat16))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    assert mp.reduce_dtype == torch.bfloat16
    for m in model:
        fully_shard(m, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to(torch.float32)
    x = local(randn(4 * w, 16, seed=3))
    model(x).sum().backward()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
        g = to_np(p.grad)
        rounded = to_np(p.grad.full_tensor().to(torch.bfloat16))
        np.testing.assert_array_equal(g, rounded, err_msg=f"{name}: gradient not reduced in bf16")
    assert global_sum(torch.tensor([1.0])) == w
