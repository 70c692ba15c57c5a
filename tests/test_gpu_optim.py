"""Fused optimizer steps and clipping on CUDA tensors (hpcfsdp/_kernels/optim.py): equal to the CPU optimizer after
several steps, one or two launches per parameter group, no host sync in clip_grad_norm_.

Marked `gpu`: run on the simulated device with HPCFSDP_CUDA_SIM=1 (conftest), or on a GPU.
"""
import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import optim
from hpcfsdp.nn.utils import clip_grad_norm_

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(8, 4), (4,), (3, 5, 2), (7,), (1,), (16, 3), (2, 2), (5,), (6, 6), (9,), (4, 4, 1), (3,)]  # 12, GPT-like


def _cs():
    from hpcfsdp.testing import cuda_sim

    return cuda_sim


def _params(dev, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [hp.tensor(rng.standard_normal(s).astype(dtype), device=dev, requires_grad=True) for s in SHAPES]


def _set_grads(ps, step, dtype):
    rng = np.random.default_rng(100 + step)
    for p in ps:
        p.grad = hp.tensor(rng.standard_normal(p.shape).astype(dtype), device=p.device)


def _run(cls, kw, dev, dtype=np.float32, steps=4):
    ps = _params(dev, dtype)
    opt = cls(ps, **kw)
    for t in range(steps):
        _set_grads(ps, t, dtype)
        opt.step()
    return [p.detach().cpu().numpy() for p in ps], opt


CASES = [
    (optim.Adam, dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    (optim.Adam, dict(lr=1e-2, maximize=True)),
    (optim.AdamW, dict(lr=1e-2, weight_decay=0.05)),
    (optim.AdamW, dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.2, maximize=True)),
    (optim.SGD, dict(lr=0.1)),
    (optim.SGD, dict(lr=0.1, weight_decay=0.01, maximize=True)),
    (optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    (optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True)),
]


@pytest.mark.parametrize("cls,kw", CASES)
def test_fused_step_on_cuda_equals_the_cpu_optimizer(cls, kw):
    cpu, _ = _run(cls, kw, "cpu")
    with _cs().counting() as c:
        gpu, opt = _run(cls, kw, "cuda")
    for a, b in zip(gpu, cpu):
        np.testing.assert_array_equal(a, b)  # float32: the kernels repeat the unfused operations in order
    assert c.launches_by_op[f"kernel {_kernel(cls, kw)}<float>"] == 4
    assert opt._hp_tables.uploads == 4  # new gradient arrays each step: one small async upload each


def _kernel(cls, kw):
    if cls is not optim.SGD:
        return "adam_multi"
    return "sgd_momentum_multi" if kw.get("momentum") else "sgd_multi"


@pytest.mark.parametrize("cls,kw", [CASES[2], CASES[6]])
def test_bf16_params_step_within_bf16_tolerance_of_the_cpu_optimizer(cls, kw):
    cpu, _ = _run(cls, kw, "cpu", np.float32)
    gpu, _ = _run(cls, kw, "cuda", BF16)
    for a, b in zip(gpu, cpu):
        assert a.dtype == BF16
        np.testing.assert_allclose(a.astype(np.float32), b, rtol=2 ** -6, atol=2e-2)


@pytest.mark.parametrize("cls,kw", [CASES[0], CASES[3], CASES[7]])
def test_a_group_of_n_parameters_steps_in_one_launch_and_no_host_sync(cls, kw):
    ps = _params("cuda")
    opt = cls(ps, **kw)
    _set_grads(ps, 0, np.float32)
    opt.step()  # the state and the tables are made
    for n in (1, 12):
        ps = _params("cuda")[:n]
        opt = cls(ps, **kw)
        _set_grads(ps, 0, np.float32)
        opt.step()
        _set_grads(ps, 1, np.float32)
        with _cs().counting() as c:
            opt.step()
        assert c.launches == 1, c.launches_by_op
        assert c.host_syncs == [], c.sites()


def test_the_per_parameter_path_without_fusion_launches_per_parameter():
    ps = _params("cuda")
    opt = optim.AdamW(ps, lr=1e-2, fused=False)
    _set_grads(ps, 0, np.float32)
    opt.step()
    with _cs().counting() as c:
        opt.step()
    assert c.launches >= 10 * len(ps) and "kernel adam_multi<float>" not in c.launches_by_op


def test_amsgrad_and_foreach_take_the_per_parameter_path():
    for kw in (dict(amsgrad=True), dict(foreach=True)):
        cpu, _ = _run(optim.Adam, dict(lr=1e-2, **kw), "cpu")
        with _cs().counting() as c:
            gpu, _ = _run(optim.Adam, dict(lr=1e-2, **kw), "cuda")
        assert "kernel adam_multi<float>" not in c.launches_by_op
        for a, b in zip(gpu, cpu):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_moved_array_rebuilds_the_table():
    ps = _params("cuda")
    opt = optim.SGD(ps, lr=0.1)
    _set_grads(ps, 0, np.float32)
    opt.step()
    up = opt._hp_tables.uploads
    _set_grads(ps, 1, np.float32)  # new gradient arrays: new addresses
    ref = [p.detach().cpu().numpy() - 0.1 * p.grad.cpu().numpy() for p in ps]
    opt.step()
    assert opt._hp_tables.uploads == up + 1
    for p, r in zip(ps, ref):
        np.testing.assert_allclose(p.detach().cpu().numpy(), r, rtol=1e-6)


# -- clip_grad_norm_ -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_norm,norm_type", [(1.0, 2.0), (100.0, 2.0), (0.5, 1.0), (0.5, float("inf"))])
def test_clip_grad_norm_on_cuda_equals_cpu_with_no_host_sync(max_norm, norm_type):
    res = {}
    for dev in ("cpu", "cuda"):
        ps = _params(dev)
        _set_grads(ps, 0, np.float32)
        if dev == "cuda":
            clip_grad_norm_(ps, max_norm, norm_type)  # the tables are made
            _set_grads(ps, 0, np.float32)
            with _cs().counting() as c:
                total = clip_grad_norm_(ps, max_norm, norm_type)
            assert c.host_syncs == [], c.sites()
            if norm_type == 2.0:
                assert c.launches == 3, c.launches_by_op  # two for the norm, one to scale
            assert total.device.type == "cuda"
        else:
            total = clip_grad_norm_(ps, max_norm, norm_type)
        res[dev] = (float(total.item()), [p.grad.cpu().numpy() for p in ps])
    assert res["cuda"][0] == pytest.approx(res["cpu"][0], rel=1e-6)
    for a, b in zip(res["cuda"][1], res["cpu"][1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_of_a_nonfinite_gradient_raises_only_when_asked():
    ps = _params("cuda")
    _set_grads(ps, 0, np.float32)
    ps[3].grad._data[0] = float("nan")
    total = clip_grad_norm_(ps, 1.0)
    assert np.isnan(total.item()) and np.isnan(ps[0].grad.cpu().numpy()).all()
    _set_grads(ps, 0, np.float32)
    ps[3].grad._data[0] = float("inf")
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
