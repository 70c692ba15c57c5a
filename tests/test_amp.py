"""hpcfsdp.amp: GradScaler against hand-computed scale sequences, autocast's switches (ops: test_autocast.py), the torch.cuda.amp
aliases, and ShardedGradScaler at 2 and 4 ranks (one rank's inf makes every rank skip and back off)."""
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.amp import GradScaler, autocast
from hpcfsdp.amp.grad_scaler import OptState


def _model(seed=0):
    hp.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _batch(step):
    rng = np.random.default_rng(100 + step)
    return hp.tensor(rng.standard_normal((5, 4)).astype(np.float32))


def _expected_scales(flags, init, growth, backoff, interval):
    """The scale and growth tracker after each update, by hand: PyTorch's _amp_update_scale_."""
    scale, tracker, out = init, 0, []
    for bad in flags:
        if bad:
            scale, tracker = scale * backoff, 0
        elif tracker + 1 == interval:
            scale, tracker = scale * growth, 0
        else:
            tracker += 1
        out.append((scale, tracker))
    return out


@pytest.mark.parametrize("bad_kind", [float("inf"), float("-inf"), float("nan")])
def test_scale_backs_off_on_inf_and_grows_after_the_interval(bad_kind):
    flags = [False, False, True, False, False, False, False, True, True, False, False, False]
    want = _expected_scales(flags, 2.0**10, 4.0, 0.25, 3)
    assert [s for s, _ in want] == [1024, 1024, 256, 256, 256, 1024, 1024, 256, 64, 64, 64, 256]
    model = _model()
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=2.0**10, growth_factor=4.0, backoff_factor=0.25, growth_interval=3)
    assert scaler.get_scale() == 1024.0 and scaler._get_growth_tracker() == 0
    for step, bad in enumerate(flags):
        before = [p.detach().clone() for p in model.parameters()]
        scaler.scale(model(_batch(step)).pow(2).mean()).backward()
        if bad:
            model[2].weight.grad[1, 2] = bad_kind
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        assert (scaler.get_scale(), scaler._get_growth_tracker()) == want[step], step
        changed = [not np.array_equal(a.numpy(), p.detach().numpy()) for a, p in zip(before, model.parameters())]
        assert not any(changed) if bad else all(changed), step


def test_scaler_on_each_backend(device):
    """The scale lives on the loss's device; a NaN on the device backs off; the state dict is plain floats."""
    model = _model().to(device)
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(device, init_scale=2.0**8, growth_interval=2)
    flags = [False, True, False, False, False]
    for step, bad in enumerate(flags):
        scaler.scale(model(_batch(step).to(device)).pow(2).mean()).backward()
        if bad:
            model[0].weight.grad[0, 0] = float("nan")
        w = model[0].weight.detach().cpu().numpy().copy()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        assert np.array_equal(w, model[0].weight.detach().cpu().numpy()) == bad
    assert scaler._scale.device.type == device and scaler._scale.dtype == hp.float32
    assert (scaler.get_scale(), scaler._get_growth_tracker()) == _expected_scales(flags, 256.0, 2.0, 0.5, 2)[-1]
    assert type(scaler.state_dict()["scale"]) is float


def test_unscaled_gradients_equal_the_unscaled_backward_bit_for_bit():
    ref, model = _model(), _model()
    ref(_batch(0)).pow(2).mean().backward()
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=2.0**12)
    loss = model(_batch(0)).pow(2).mean()
    scaled = scaler.scale(loss)
    assert scaled.dtype == hp.float32 and scaled.item() == loss.item() * 4096
    scaled.backward()
    g = model[0].weight.grad.numpy().copy()
    scaler.unscale_(opt)  # a power of two: scaling and unscaling are exact
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    np.testing.assert_array_equal(g, ref[0].weight.grad.numpy() * 4096)
    hp.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # clipping unscaled gradients between unscale_ and step
    w = model[0].weight.detach().numpy().copy()
    scaler.step(opt)  # does not unscale again
    np.testing.assert_allclose(model[0].weight.detach().numpy(), w - 0.1 * model[0].weight.grad.numpy(), rtol=1e-6)
    scaler.update()
    assert scaler.get_scale() == 4096.0


def test_inv_scale_is_float32_of_the_reciprocal_and_half_grads_go_through_float32():
    p = nn.Parameter(hp.zeros(3, dtype=hp.bfloat16))
    p.grad = hp.tensor([3.0, 6.0, 1e30], dtype=hp.bfloat16)
    q = nn.Parameter(hp.zeros(2, dtype=hp.float64))
    q.grad = hp.tensor([1.0, 3.0], dtype=hp.float64)
    opt = hp.optim.SGD([p, q], lr=1.0)
    scaler = GradScaler("cpu", init_scale=3.0)
    scaler.scale(hp.tensor(1.0))  # creates the scale
    scaler.unscale_(opt)
    inv = np.float32(1.0 / 3.0)
    want = (np.array([3.0, 6.0, 1e30], np.float32).astype(hp.bfloat16).astype(np.float32) * inv).astype(hp.bfloat16)
    np.testing.assert_array_equal(p.grad.numpy(), want)
    np.testing.assert_array_equal(q.grad.numpy(), np.array([1.0, 3.0]) * np.float64(inv))
    found = scaler._found_inf_per_device(opt)
    assert list(found) == [hp.device("cpu")] and found[hp.device("cpu")].item() == 0.0


def test_only_the_optimizer_with_the_inf_skips_and_the_scale_backs_off():
    m1, m2 = _model(1), _model(2)
    o1, o2 = hp.optim.SGD(m1.parameters(), lr=0.1), hp.optim.SGD(m2.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=8.0)
    scaler.scale([m1(_batch(0)).sum(), (m2(_batch(0)).sum(),)])  # nested outputs are scaled too
    loss = m1(_batch(0)).pow(2).mean() + m2(_batch(0)).pow(2).mean()
    scaler.scale(loss).backward()
    m2[0].bias.grad[0] = float("inf")
    w1, w2 = m1[0].weight.detach().clone(), m2[0].weight.detach().clone()
    scaler.step(o1)
    scaler.step(o2)
    assert not np.array_equal(m1[0].weight.detach().numpy(), w1.numpy())
    np.testing.assert_array_equal(m2[0].weight.detach().numpy(), w2.numpy())
    scaler.update()
    assert scaler.get_scale() == 4.0


def test_scale_of_nested_outputs_and_types():
    scaler = GradScaler("cpu", init_scale=2.0)
    a, b, c = hp.ones(2), hp.ones(3), hp.ones(1)
    out = scaler.scale([a, (b, [c])])
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    assert out[0].numpy().tolist() == [2.0, 2.0] and out[1][1][0].numpy().tolist() == [2.0]
    assert scaler.scale(hp.ones(3, dtype=hp.float16)).dtype == hp.float16  # 0-d float32 scale: no promotion
    with pytest.raises(ValueError, match="Tensor or an iterable"):
        scaler.scale([a, 3])


def test_call_order_is_checked():
    model = _model()
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    with pytest.raises(RuntimeError, match="scaler.scale"):
        scaler.step(opt)
    scaler.scale(model(_batch(0)).sum()).backward()
    scaler.unscale_(opt)
    assert scaler._per_optimizer_states[id(opt)]["stage"] is OptState.UNSCALED
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: 0.0)
    scaler.update()
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    with pytest.raises(ValueError, match="growth factor"):
        GradScaler("cpu", growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff factor"):
        GradScaler("cpu", backoff_factor=1.0)


def test_fp16_gradients_are_refused_as_pytorch_does():
    p = nn.Parameter(hp.zeros(2, dtype=hp.float16))
    p.grad = hp.ones(2, dtype=hp.float16)
    scaler = GradScaler("cpu")
    scaler.scale(hp.tensor(1.0))
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(hp.optim.SGD([p], lr=1.0))


def test_growth_that_would_overflow_keeps_the_scale():
    model = _model()
    opt = hp.optim.SGD(model.parameters(), lr=0.0)
    big = float(np.finfo(np.float32).max) / 2 * 1.5
    scaler = GradScaler("cpu", init_scale=big, growth_interval=1)
    scaler.scale(hp.tensor(1.0))
    for p in model.parameters():
        p.grad = hp.zeros_like(p)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == float(np.float32(big)) and scaler._get_growth_tracker() == 0


def test_update_with_new_scale_and_state_dict_round_trip():
    model = _model()
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=16.0, growth_interval=5)
    for step in range(2):
        scaler.scale(model(_batch(step)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    sd = scaler.state_dict()
    assert sd == {"scale": 16.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 5,
                  "_growth_tracker": 2}
    other = GradScaler("cpu")
    other.load_state_dict(sd)
    assert other.state_dict() == sd and other.get_scale() == 16.0
    other.scale(hp.tensor(1.0))
    assert other._scale.dtype == hp.float32 and other._get_growth_tracker() == 2
    scaler.scale(model(_batch(3)).sum()).backward()
    scaler.step(opt)
    scaler.update(new_scale=3.0)
    assert scaler.get_scale() == 3.0 and scaler._get_growth_tracker() == 2
    scaler.scale(hp.tensor(1.0))
    scaler.update(hp.tensor(5.0))
    assert scaler.get_scale() == 5.0
    with pytest.raises(RuntimeError, match="empty"):
        GradScaler("cpu").load_state_dict({})


def test_disabled_scaler_is_transparent():
    model = _model()
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", enabled=False)
    loss = model(_batch(0)).sum()
    assert scaler.scale(loss) is loss and not scaler.is_enabled()
    loss.backward()
    w = model[0].weight.detach().clone()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert not np.array_equal(w.numpy(), model[0].weight.detach().numpy())
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    scaler.load_state_dict({})


@pytest.mark.skipif(hp.accelerator.is_available(), reason="a GPU is visible: device='cuda' stays enabled")
def test_cuda_scaler_without_a_gpu_warns_and_disables_itself():
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling"):
        scaler = GradScaler()
    assert not scaler.is_enabled() and scaler.get_scale() == 1.0
    with pytest.warns(FutureWarning, match="torch.cuda.amp.GradScaler"), pytest.warns(UserWarning, match="Disabling"):
        old = hp.cuda.amp.GradScaler(init_scale=4.0)
    assert isinstance(old, GradScaler) and not old.is_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GradScaler(enabled=False).is_enabled() is False  # asked disabled: no warning


def test_torch_cuda_amp_names():
    from hpcfsdp.cuda.amp import GradScaler as CudaGradScaler
    from hpcfsdp.cuda.amp import autocast as cuda_autocast

    assert hp.cuda.amp.GradScaler is CudaGradScaler and issubclass(CudaGradScaler, GradScaler)
    assert hp.amp.GradScaler is GradScaler
    with pytest.warns(FutureWarning, match="torch.cuda.amp.autocast"):
        with cuda_autocast(enabled=False):
            pass
    with pytest.warns(FutureWarning), pytest.warns(UserWarning, match="CUDA is not available"):
        assert not cuda_autocast()._enabled  # no GPU here: PyTorch warns and disables
    assert cuda_autocast.__mro__[1] is autocast


def test_autocast_disabled_is_a_no_op():
    x = hp.ones(2, 3)
    with autocast("cuda", dtype=hp.bfloat16, enabled=False) as ctx:
        y = x @ x.T
    assert isinstance(ctx, autocast) and y.dtype == hp.float32

    @autocast(device_type="cpu", enabled=False)
    def f(a):
        return a * 2

    assert f(x).numpy().tolist() == [[2.0] * 3] * 2 and f.__name__ == "f"
    with pytest.raises(ValueError, match="device_type"):
        autocast(0, enabled=False)
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'xpu2'"):
        autocast("xpu2")
    assert hp.amp.is_autocast_available("cuda") and hp.amp.is_autocast_available("cpu")
    assert not hp.amp.is_autocast_available("mps")


# -- ShardedGradScaler ------------------------------------------------------------------------------------------
def test_sharded_scaler_keeps_the_dtype_and_allows_fp16_grads():
    from hpcfsdp.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    scaler = ShardedGradScaler("cpu", init_scale=4.0)
    assert scaler.scale(hp.tensor(1.5, dtype=hp.float16)).dtype == hp.float16  # PyTorch's .type(outputs.dtype)
    p = nn.Parameter(hp.zeros(2, dtype=hp.float16))
    p.grad = hp.tensor([4.0, 8.0], dtype=hp.float16)
    opt = hp.optim.SGD([p], lr=1.0)
    scaler.step(opt)
    np.testing.assert_array_equal(p.detach().numpy(), np.array([-1.0, -2.0], np.float16))
    scaler.update()
    assert scaler.get_scale() == 4.0 and scaler._get_growth_tracker() == 1


def _fsdp_pair(seed=0):
    """An FSDP2 model (each Linear a unit) and its unsharded twin."""
    from hpcfsdp.distributed.fsdp import fully_shard

    ref, model = _model(seed), _model(seed)
    for m in (model[0], model[2]):
        fully_shard(m)
    fully_shard(model)
    return model, ref


def _full(p):
    from hpcfsdp.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().numpy()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_sharded_scaler_one_rank_inf_makes_every_rank_skip_and_back_off():
    import hpcfsdp.distributed as dist
    from hpcfsdp.distributed import _c10d_groups
    from hpcfsdp.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    w, r = dist.get_world_size(), dist.get_rank()
    model, ref = _fsdp_pair()
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
    scaler = ShardedGradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    rscaler = GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    rng = np.random.default_rng(7)
    flags = [False, True, False, False, False]
    for step, bad in enumerate(flags):
        x = rng.standard_normal((2 * w, 4)).astype(np.float32)
        before = [_full(p).copy() for p in model.parameters()]
        loss = model(hp.tensor(x[2 * r:2 * r + 2])).pow(2).mean()
        scaler.scale(loss).backward()
        rscaler.scale(ref(hp.tensor(x)).pow(2).mean()).backward()
        if bad:
            if r == w - 1:  # only the last rank's piece of one gradient: the others see finite gradients
                g = model[0].weight.grad  # (8, 4) in chunks of ceil(8 / w) rows
                assert g._data.size > 0
                g._data.flat[0] = np.inf
            ref[0].weight.grad[(w - 1) * -(-8 // w), 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        rscaler.step(ropt)
        rscaler.update()
        opt.zero_grad()
        ropt.zero_grad()
        found = scaler.get_scale(), scaler._get_growth_tracker()
        assert found == (rscaler.get_scale(), rscaler._get_growth_tracker()), step
        assert all(f == found for f in _c10d_groups.default_group().comm.allgather(found))
        after = [_full(p) for p in model.parameters()]
        if bad:
            assert found == (128.0, 0)  # every rank skipped its Adam step
            assert all(int(st["step"]) == 1 for st in opt.state.values())
            for a, b in zip(before, after):
                np.testing.assert_array_equal(a, b)
        else:
            assert all(not np.array_equal(a, b) for a, b in zip(before, after))
        for p, q in zip(model.parameters(), ref.parameters()):
            np.testing.assert_allclose(_full(p), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert scaler.get_scale() == 256.0  # 256 -> 128 (inf) -> 2 clean steps -> 256 -> 1 clean step


@pytest.mark.mpi(min_size=2)
def test_sharded_scaler_clean_step_agrees_without_infs_and_keeps_the_state_dict():
    import hpcfsdp.distributed as dist
    from hpcfsdp.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    w, r = dist.get_world_size(), dist.get_rank()
    model, _ = _fsdp_pair(3)
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    scaler = ShardedGradScaler("cpu", 64.0, 0.25, 4.0, 1)  # PyTorch's order: backoff before growth
    x = np.random.default_rng(1).standard_normal((2 * w, 4)).astype(np.float32)
    scaler.scale(model(hp.tensor(x[2 * r:2 * r + 2])).sum()).backward()
    scaler.unscale_(opt)
    assert [f.item() for f in scaler._found_inf_per_device(opt).values()] == [0.0]
    scaler.step(opt)
    scaler.update()
    assert scaler.state_dict() == {"scale": 256.0, "growth_factor": 4.0, "backoff_factor": 0.25,
                                   "growth_interval": 1, "_growth_tracker": 0}
