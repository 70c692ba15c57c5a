"""autocast: per-op dtypes as PyTorch's CPU autocast (transcribed from PyTorch 2.13), values and gradients
against the same ops with the casts written out by hand, and the region's state rules (nesting, threads,
devices, unsupported settings), custom_fwd/custom_bwd."""
import threading
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp.amp import autocast

BF16, FP16, FP32, FP64 = hp.bfloat16, hp.float16, hp.float32, hp.float64


def _t(*shape, dtype=FP32, seed=0):
    rng = np.random.default_rng(seed + 7 * len(shape))
    return hp.tensor(rng.standard_normal(shape).astype(np.float32)).to(dtype)


x, w = _t(4, 8), _t(6, 8, seed=1)
b16 = _t(4, 8, seed=2, dtype=BF16)
tgt = hp.tensor([0, 3, 5, 7])
tgt6 = hp.tensor([0, 3, 5, 1])  # for 6 classes

# (name, op, args, dtype PyTorch 2.13 gives inside autocast("cpu", dtype=torch.bfloat16))
CASES = [
    ("linear", F.linear, (x, w), BF16),
    ("matmul", hp.matmul, (x, w.t()), BF16),
    ("@", lambda a, b: a @ b, (x, w.t()), BF16),
    ("mm", hp.mm, (x, w.t()), BF16),
    ("bmm", hp.bmm, (x[None], w.t()[None]), BF16),
    ("addmm", hp.addmm, (hp.zeros(4, 6), x, w.t()), BF16),
    ("baddbmm", hp.baddbmm, (hp.zeros(1, 4, 6), x[None], w.t()[None]), BF16),
    ("einsum", lambda a, b: hp.einsum("ij,kj->ik", a, b), (x, w), BF16),
    ("conv1d", F.conv1d, (x[None], _t(2, 4, 3)), BF16),
    ("conv2d", F.conv2d, (_t(1, 2, 5, 5), _t(3, 2, 3, 3)), BF16),
    ("conv_transpose1d", F.conv_transpose1d, (x[None], _t(4, 2, 3)), BF16),
    ("sdpa", F.scaled_dot_product_attention, (x[None], x[None], x[None]), BF16),
    ("prelu", F.prelu, (x, hp.tensor([0.25])), BF16),
    ("matmul float64 stays", lambda a, b: a @ b, (x.double(), w.t().double()), FP64),
    ("cross_entropy", F.cross_entropy, (b16, tgt), FP32),
    ("nll_loss", F.nll_loss, (b16, tgt), FP32),
    ("mse_loss", F.mse_loss, (b16, b16), FP32),
    ("l1_loss", F.l1_loss, (b16, b16), FP32),
    ("smooth_l1_loss", F.smooth_l1_loss, (b16, b16), FP32),
    ("huber_loss", F.huber_loss, (b16, b16), FP32),
    ("kl_div", lambda a, b: F.kl_div(a, b, reduction="batchmean"), (b16, b16), FP32),
    ("bce_with_logits", F.binary_cross_entropy_with_logits, (b16, b16.sigmoid()), FP32),
    ("bce", F.binary_cross_entropy, (b16.sigmoid(), b16.sigmoid()), FP32),
    ("prod", hp.prod, (b16,), FP32),
    ("cdist", hp.cdist, (x, x), FP32),
    ("softmax unchanged", lambda a: F.softmax(a, -1), (b16,), BF16),
    ("log_softmax unchanged", lambda a: F.log_softmax(a, -1), (b16,), BF16),
    ("layer_norm unchanged", lambda a: F.layer_norm(a, (8,)), (b16,), BF16),
    ("layer_norm fp32 unchanged", lambda a: F.layer_norm(a, (8,)), (x,), FP32),
    ("exp unchanged", hp.exp, (b16,), BF16),
    ("sum unchanged", hp.sum, (b16,), BF16),
    ("gelu unchanged", F.gelu, (b16,), BF16),
    ("relu fp32 unchanged", F.relu, (x,), FP32),
    ("add promotes", lambda a, b: a + b, (b16, x), FP32),
    ("cumsum unchanged", lambda a: hp.cumsum(a, 0), (b16,), BF16),
    ("embedding fp32 unchanged", F.embedding, (hp.tensor([0, 1]), w), FP32),
]


@pytest.mark.parametrize("name,op,args,expected", CASES, ids=[c[0] for c in CASES])
def test_cpu_autocast_op_dtypes_match_pytorch(name, op, args, expected):
    with autocast("cpu", dtype=BF16):
        out = op(*args)
    assert out.dtype == expected
    floats = [a.dtype for a in args if isinstance(a, hp.Tensor) and a.is_floating_point()]
    outside = FP32 if FP32 in floats else floats[0]  # outside a region: the inputs' (promoted) dtype
    assert op(*args).dtype == outside


def test_lower_precision_dtype_follows_the_region():
    with autocast("cpu", dtype=FP16):
        assert F.linear(x, w).dtype == FP16
    with autocast("cpu"):  # CPU default: bfloat16
        assert F.linear(x, w).dtype == BF16 and hp.get_autocast_dtype("cpu") == BF16


def _bf16_round(a):
    return hp.tensor(a).to(BF16).float().numpy().astype(np.float64)


def test_values_and_gradients_equal_the_hand_cast_computation():
    xa = x.clone().requires_grad_()
    wa = w.clone().requires_grad_()
    ba = hp.zeros(6).requires_grad_()
    with autocast("cpu"):
        y = F.linear(xa, wa, ba)
        loss = F.cross_entropy(y, tgt6)
    assert y.dtype == BF16 and loss.dtype == FP32
    loss.backward()
    # the same graph with the casts written out
    xb, wb, bb = (t.clone().requires_grad_() for t in (x, w, hp.zeros(6)))
    y2 = F.linear(xb.to(BF16), wb.to(BF16), bb.to(BF16))
    loss2 = F.cross_entropy(y2.float(), tgt6)
    loss2.backward()
    assert np.array_equal(y.detach().float().numpy(), y2.detach().float().numpy()) and loss.item() == loss2.item()
    for a, b in ((xa, xb), (wa, wb), (ba, bb)):
        assert a.grad.dtype == FP32 and np.array_equal(a.grad.numpy(), b.grad.numpy())
    # and an independent reference: float64 products of the bf16-rounded inputs, rounded to bf16
    ref = _bf16_round(_bf16_round(x.numpy()) @ _bf16_round(w.numpy()).T)
    np.testing.assert_allclose(y.detach().float().numpy(), ref, rtol=2 ** -7, atol=1e-6)
    assert not np.array_equal(y.detach().float().numpy(), F.linear(x, w).numpy())  # really computed in bfloat16


def test_ints_float64_and_other_devices_are_left_alone():
    i = hp.tensor([[1, 2], [3, 4]])
    with autocast("cpu"):
        assert (i @ i).dtype == hp.int64
        assert (x.double() @ w.double().t()).dtype == FP64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with autocast("cuda", dtype=FP16):  # no GPU here: disabled (see below); and CPU tensors are not CUDA's
            assert F.linear(x, w).dtype == FP32


def test_nesting_restores_and_disabled_inner_region():
    assert not hp.is_autocast_enabled("cpu")
    with autocast("cpu"):
        with autocast("cpu", enabled=False):
            assert not hp.is_autocast_enabled("cpu") and F.linear(x, w).dtype == FP32
        with autocast("cpu", dtype=FP16):
            assert F.linear(x, w).dtype == FP16
        assert hp.is_autocast_enabled("cpu") and F.linear(x, w).dtype == BF16
    assert not hp.is_autocast_enabled("cpu") and F.linear(x, w).dtype == FP32


def test_state_is_restored_when_the_region_raises():
    with pytest.raises(KeyError):
        with autocast("cpu"):
            raise KeyError("boom")
    assert not hp.is_autocast_enabled("cpu") and F.linear(x, w).dtype == FP32


def test_decorator_and_reuse_of_one_object():
    ac = autocast("cpu")

    @ac
    def f(a, b):
        return F.linear(a, b)

    assert f(x, w).dtype == BF16 and f(x, w).dtype == BF16 and f.__name__ == "f"
    with ac:
        with ac:
            assert F.linear(x, w).dtype == BF16
        assert hp.is_autocast_enabled("cpu")
    assert not hp.is_autocast_enabled("cpu")


def test_state_is_per_thread():
    seen = {}

    def other():
        seen["enabled"] = hp.is_autocast_enabled("cpu")
        seen["dtype"] = F.linear(x, w).dtype

    with autocast("cpu"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == {"enabled": False, "dtype": FP32}


def test_unavailable_device_and_unsupported_dtype_warn_and_disable():
    assert not hp.cuda.is_available()
    with pytest.warns(UserWarning, match="CUDA is not available"):
        ac = autocast("cuda")
    assert ac._enabled is False
    with pytest.warns(UserWarning, match="In CPU autocast, but the target dtype is not supported"):
        ac = autocast("cpu", dtype=FP32)
    with ac:
        assert not hp.is_autocast_enabled("cpu")
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'xpu2'"):
        autocast("xpu2")


def test_torch_level_state_functions():
    assert hp.get_autocast_dtype("cpu") == BF16 and hp.get_autocast_dtype("cuda") == FP16
    assert hp.get_autocast_cpu_dtype() == BF16 and hp.get_autocast_gpu_dtype() == FP16
    try:
        hp.set_autocast_enabled("cpu", True)
        hp.set_autocast_dtype("cpu", FP16)
        assert hp.is_autocast_cpu_enabled() and F.linear(x, w).dtype == FP16
    finally:
        hp.set_autocast_enabled("cpu", False)
        hp.set_autocast_dtype("cpu", BF16)
    assert F.linear(x, w).dtype == FP32 and not hp.is_autocast_enabled()
    hp.clear_autocast_cache()
    assert hp.is_autocast_cache_enabled()
    with pytest.raises(RuntimeError, match="unsupported autocast device_type"):
        hp.get_autocast_dtype("tpu")


def test_custom_fwd_cast_inputs_and_custom_bwd_replay_the_forward_state():
    seen = []

    class Twice(hp.autograd.Function):
        @staticmethod
        @hp.amp.custom_fwd(device_type="cpu", cast_inputs=FP32)
        def forward(ctx, a):
            seen.append(("fwd", a.dtype, hp.is_autocast_enabled("cpu")))
            return a * 2

        @staticmethod
        @hp.amp.custom_bwd(device_type="cpu")
        def backward(ctx, g):
            seen.append(("bwd", g.dtype, hp.is_autocast_enabled("cpu")))
            return g * 2

    a = _t(3, dtype=BF16).requires_grad_()
    with autocast("cpu"):
        y = Twice.apply(a)
    assert y.dtype == FP32
    y.sum().backward()
    assert a.grad.dtype == BF16 and a.grad.float().numpy().tolist() == [2.0, 2.0, 2.0]
    # PyTorch: with cast_inputs the forward runs with autocast off, and so does the backward
    assert seen == [("fwd", FP32, False), ("bwd", FP32, False)]

    class Mul(hp.autograd.Function):
        @staticmethod
        @hp.amp.custom_fwd(device_type="cpu")
        def forward(ctx, p, q):
            return p @ q

        @staticmethod
        @hp.amp.custom_bwd(device_type="cpu")
        def backward(ctx, g):
            seen.append(("mul bwd", hp.is_autocast_enabled("cpu")))
            return g, g

    with autocast("cpu"):
        z = Mul.apply(_t(2, 2).requires_grad_(), _t(2, 2, seed=3))
    assert z.dtype == BF16
    z.float().sum().backward()
    assert seen[-1] == ("mul bwd", True) and not hp.is_autocast_enabled("cpu")


def test_mlp_training_step_under_autocast_matches_the_hand_cast_model():
    def run(auto):
        hp.manual_seed(0)
        model = hp.nn.Sequential(hp.nn.Linear(8, 16), hp.nn.GELU(), hp.nn.LayerNorm(16), hp.nn.Linear(16, 8))
        opt = hp.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            if auto:
                with autocast("cpu"):
                    loss = F.cross_entropy(model(x), tgt)
            else:
                h = F.linear(x.to(BF16), model[0].weight.to(BF16), model[0].bias.to(BF16))
                h = model[2](model[1](h))
                out = F.linear(h, model[3].weight.to(BF16), model[3].bias.to(BF16))
                loss = F.cross_entropy(out.float(), tgt)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, [p.detach().numpy().copy() for p in model.parameters()]

    (la, pa), (lb, pb) = run(True), run(False)
    assert la == lb and all(np.array_equal(a, b) for a, b in zip(pa, pb))
    assert all(p.dtype == np.float32 for p in pa)


OPS_WITH_A_PYTHON_SCALAR = [
    ("a / 3.0", lambda a: a / 3.0, lambda v: v / 3.0), ("a / 3", lambda a: a / 3, lambda v: v / 3),
    ("3.0 / a", lambda a: 3.0 / a, lambda v: 3.0 / v), ("a * 0.1", lambda a: a * 0.1, lambda v: v * np.float32(0.1)),
    ("a + 1.5", lambda a: a + 1.5, lambda v: v + 1.5), ("1.5 - a", lambda a: 1.5 - a, lambda v: 1.5 - v),
    ("a ** 2.0", lambda a: a ** 2.0, lambda v: v ** 2), ("2.0 ** a", lambda a: 2.0 ** a, lambda v: 2.0 ** v),
    ("a % 2.5", lambda a: a % 2.5, lambda v: np.remainder(v, 2.5)), ("a.sum() / 3.0", lambda a: a.sum() / 3.0,
                                                                     lambda v: v.sum() / 3.0),
]


@pytest.mark.parametrize("name,op,ref", OPS_WITH_A_PYTHON_SCALAR, ids=[c[0] for c in OPS_WITH_A_PYTHON_SCALAR])
def test_bfloat16_with_a_python_scalar_stays_bfloat16(name, op, ref):
    """PyTorch keeps a bfloat16 tensor's dtype against Python scalars (computing in float32 and rounding);
    NumPy with ml_dtypes returns float32 for a Python float."""
    a = (_t(5, seed=4).abs() + 0.5).to(BF16).requires_grad_()
    out = op(a)
    assert out.dtype == BF16
    want = hp.tensor(np.asarray(ref(a.detach().float().numpy()), dtype=np.float32)).to(BF16)
    assert np.array_equal(out.detach().float().numpy(), want.float().numpy())
    out.float().sum().backward()
    assert a.grad.dtype == BF16


@pytest.mark.gpu
def test_cuda_autocast_on_the_device():
    """On the device hpcfsdp uses (the simulated one in CI): CUDA's lists (float16 by default; softmax and
    layer_norm in float32, unlike CPU's), CPU tensors untouched, gradients in the parameters' dtype."""
    xc = x.to("cuda")
    wc = w.clone().to("cuda").requires_grad_()
    with autocast("cuda"):
        y = F.linear(xc, wc)
        s = F.softmax(y, -1)
        ln = F.layer_norm(y, (6,))
        cpu_out = F.linear(x, w)
        assert hp.is_autocast_enabled() and not hp.is_autocast_enabled("cpu")
    assert y.dtype == FP16 and s.dtype == FP32 and ln.dtype == FP32 and cpu_out.dtype == FP32
    s.sum().backward()
    assert wc.grad.dtype == FP32 and wc.grad.device.type == "cuda"
    ref = (x.numpy().astype(np.float16).astype(np.float64) @ w.numpy().astype(np.float16).astype(np.float64).T)
    np.testing.assert_allclose(y.detach().cpu().float().numpy(), ref.astype(np.float16).astype(np.float32), rtol=2e-3,
                               atol=2e-3)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpoint_recomputes_in_the_forwards_autocast_state(use_reentrant):
    """Backward runs outside the region: the recompute must run in the state the forward had (PyTorch saves it);
    gradients equal those of the same region without checkpointing."""
    from hpcfsdp.utils.checkpoint import checkpoint

    hp.manual_seed(0)
    m = hp.nn.Sequential(hp.nn.Linear(8, 16), hp.nn.GELU(), hp.nn.Linear(16, 4))

    def grads(ckpt):
        for p in m.parameters():
            p.grad = None
        xi = x.clone().requires_grad_()  # the reentrant variant differentiates through its inputs only
        with autocast("cpu"):
            y = checkpoint(m, xi, use_reentrant=use_reentrant) if ckpt else m(xi)
        assert y.dtype == BF16
        y.float().sum().backward()
        return [p.grad.numpy().copy() for p in m.parameters()] + [xi.grad.numpy().copy()]

    assert all(np.array_equal(a, b) for a, b in zip(grads(False), grads(True)))
    assert not hp.is_autocast_enabled("cpu")
