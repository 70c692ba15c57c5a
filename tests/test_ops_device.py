"""The same ops on every array backend (the simulated CUDA device under HPCFSDP_CUDA_SIM=1) match the CPU."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _np

# Each case: the function, then (rtol, atol) for its output and for its gradient. Scans, quantiles and the
# matrix functions add or invert float32 values in a different order on the device: looser tolerances.
TIGHT, LOOSE = ((1e-5, 1e-6), (1e-5, 1e-6)), ((1e-5, 1e-5), (1e-4, 1e-5))
DEVICE_CASES = {
    "sort": (lambda x: hp.sort(x, 1, descending=True).values * hp.sort(x, 0).indices.float(), TIGHT),
    "topk": (lambda x: hp.topk(x, 2).values, TIGHT),
    "cumsum_prod": (lambda x: hp.cumsum(x, 1) * hp.prod(x, 0), TIGHT),
    "logsumexp": (lambda x: hp.logsumexp(x, 1), TIGHT),
    "norms": (lambda x: hp.linalg.vector_norm(x, 3, 1) + hp.linalg.matrix_norm(x, "nuc") + x.norm(), TIGHT),
    "gather": (lambda x: x.gather(1, hp.tensor([[0, 0], [2, 1], [3, 3]], device=x.device))
    + x.index_select(1, hp.tensor([1, 1], device=x.device)), TIGHT),
    "einsum": (lambda x: hp.einsum("ij,kj->ik", x, x) + hp.einsum("ij->i", x) + hp.einsum("ii->i", x[:, :3]), TIGHT),
    "elementwise": (lambda x: hp.cos(x) * hp.sin(x) + hp.erf(x) + hp.exp2(x) + hp.floor(x) * hp.sign(x), TIGHT),
    "shape": (lambda x: hp.roll(x, 1, 0) * hp.flip(x, [1]) + hp.tile(x, (1, 1)) + x.repeat_interleave(1, 0), LOOSE),
    "diag": (lambda x: hp.diagonal(x, 1).sum() + hp.trace(x[:, :3]) + hp.diag(x[0]).sum(), LOOSE),
    "unary": (lambda x: hp.log1p(x.abs()) + hp.expm1(x) + hp.atan2(x, x + 3) + hp.sinh(x) + hp.remainder(x, 0.7), LOOSE),
    "scans": (lambda x: hp.cumprod(x, 1) + hp.cummax(x, 0).values + hp.median(x, 1, keepdim=True).values, LOOSE),
    "quantile": (lambda x: hp.quantile(x, hp.tensor([0.2, 0.9], device=x.device), dim=1) + hp.nansum(x), LOOSE),
    "fma": (lambda x: hp.addmm(x[:, :3], x, x.mT[:, :3]) + hp.lerp(x[:, :3], x[:, 1:], 0.3), LOOSE),
    "linalg": (lambda x: hp.linalg.inv(x[:, :3] + 4 * hp.eye(3, device=x.device)) + hp.linalg.det(x[:, 1:] + 4 * hp.eye(
        3, device=x.device)), LOOSE),
    "cdist": (lambda x: hp.cdist(x, x * 2), LOOSE),
    "special": (lambda x: hp.logaddexp(x, x.flip(0)) + hp.logaddexp2(x, 0.5 * x) + hp.xlogy(x, x.abs() + 1)
                + hp.fmax(x, x.flip(1)) + hp.fmin(x, -x) + hp.copysign(x, x.flip(0)), TIGHT),
    "products": (lambda x: hp.addmv(x[:, 0], x, x[0], beta=0.5) + hp.addr(x[:, :3], x[:, 0], x[0, :3]).sum(1)
                 + hp.addbmm(x[:, :3], x[None], x.mT[None, :, :3]).sum(1) + hp.inner(x, x).sum(1)
                 + hp.aminmax(x, dim=1).max + hp.msort(x)[0, :3], LOOSE),
    "unary_more": (lambda x: hp.asinh(x) + hp.atanh(x * 0.3) + hp.sinc(x) + hp.deg2rad(x) + hp.logit(x.sigmoid(), 0.2)
                   + hp.nan_to_num(x.log()) + x.unfold(1, 2, 1).sum(-1).sum(-1, keepdim=True), LOOSE),
    "index_write": (lambda x: x.index_fill(1, _i(x, [0, 2]), 0.5) + x.index_copy(0, _i(x, [2, 0, 1]), x * 2)
                    + x.index_put((_i(x, [0, 0]), _i(x, [1, 1])), x[0, :2], accumulate=True)
                    + x.put(_i(x, [3, 3]), x[1, 1:3], accumulate=True) + x.masked_scatter(x > 0, x.flip(0) * 3)
                    + x.scatter_reduce(1, _i(x, [[0, 0], [3, 1], [2, 2]]), x[:, :2] + 1, "prod")
                    + x.scatter_reduce(0, _i(x, [[0, 0, 1, 1]]), x[1:2], "amax", include_self=False)
                    + x.index_reduce(1, _i(x, [0, 0, 3, 3]), x.exp(), "mean"), TIGHT),
    "special_functions": (lambda x: hp.erfc(x) + (x * 0.3).erfinv() + (x.abs() + 0.5).lgamma() + hp.digamma(x.abs() + 1)
                          + hp.polygamma(1, x.abs() + 1) + hp.mvlgamma(x + 4, 2), LOOSE),
}


def _i(x, v):
    return hp.tensor(v, device=x.device)


@pytest.mark.parametrize("case", sorted(DEVICE_CASES))
def test_ops_on_device_match_cpu(device, case):
    a = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    fn, (out_tol, grad_tol) = DEVICE_CASES[case]
    res = []
    for dev in ("cpu", device):
        x = hp.tensor(a, device=dev, requires_grad=True)
        out = fn(x)
        out.sum().backward()
        assert out.device.type == x.grad.device.type == dev
        res.append((_np(out), _np(x.grad)))
    np.testing.assert_allclose(res[1][0], res[0][0], rtol=out_tol[0], atol=out_tol[1])
    np.testing.assert_allclose(res[1][1], res[0][1], rtol=grad_tol[0], atol=grad_tol[1])


def test_multinomial_and_predicates_on_device(device):
    hp.manual_seed(0)
    w = hp.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]], device=device)
    s = hp.multinomial(w, 50, replacement=True)
    assert s.device.type == device and s.dtype == hp.int64
    assert set(s[0].cpu().tolist()) <= {1, 2} and set(s[1].cpu().tolist()) == {0}
    n = hp.multinomial(w[:1], 2)
    assert sorted(n.cpu().tolist()[0]) == [1, 2]
    x = hp.tensor([1.0, math.inf, math.nan], device=device)
    assert hp.isinf(x).cpu().tolist() == [False, True, False] and hp.count_nonzero(x).item() == 3


def test_index_results_on_device(device):
    x = hp.tensor([[0, 3, 1], [3, 0, 2]], device=device)
    assert hp.nonzero(x).device.type == device and hp.nonzero(x).cpu().tolist() == [[0, 1], [0, 2], [1, 0], [1, 2]]
    u, c = hp.unique(x, return_counts=True)
    assert u.cpu().tolist() == [0, 1, 2, 3] and c.cpu().tolist() == [2, 1, 1, 2]
    assert hp.bincount(x.flatten()).cpu().tolist() == [2, 1, 1, 2]
    s = hp.tensor([1.0, 3.0, 5.0], device=device)
    assert hp.searchsorted(s, hp.tensor([2.0, 5.0], device=device)).cpu().tolist() == [1, 2]
    assert hp.tril_indices(2, 2, device=device).device.type == device
    hp.manual_seed(0)
    assert hp.normal(hp.zeros(3, device=device), 1.0).device.type == device
    assert hp.bernoulli(hp.full((3,), 0.5, device=device)).device.type == device


def test_views_comparisons_and_bitwise_on_device(device):
    x = hp.arange(12.0, device=device).reshape(3, 4)
    u = x.unfold(1, 2, 1)
    assert u.device.type == device and u.shape == (3, 3, 2) and u[1, 2].cpu().tolist() == [6.0, 7.0]
    assert hp.rot90(x).cpu().tolist() == np.rot90(np.arange(12.0).reshape(3, 4)).tolist()
    assert hp.take_along_dim(x, hp.tensor([[3], [0], [1]], device=device), 1).cpu().tolist() == [[3.0], [4.0], [9.0]]
    y = x.clone()
    assert y.t_().shape == (4, 3) and y.unsqueeze_(0).shape == (1, 4, 3) and y.device.type == device
    assert x.where(x > 5, 0.0).sum().item() == 6 + 7 + 8 + 9 + 10 + 11
    assert hp.eq(x, 3).sum().item() == 1 and hp.greater_equal(x, 10).sum().item() == 2
    assert x.clone().lt_(2).cpu().tolist()[0] == [1.0, 1.0, 0.0, 0.0]
    i = hp.tensor([3, 5, -8], device=device)
    assert (i & 6).cpu().tolist() == [2, 4, 0] and (i >> 70).cpu().tolist() == [0, 0, -1]
    assert (1 << hp.tensor([1, 2], device=device)).cpu().tolist() == [2, 4] and (~i).cpu().tolist() == [-4, -6, 7]
    assert hp.isin(i, hp.tensor([5, 7], device=device)).cpu().tolist() == [False, True, False]
    assert hp.signbit(hp.tensor([-0.0, 1.0], device=device)).cpu().tolist() == [True, False]
    assert hp.isposinf(hp.tensor([math.inf, 1.0], device=device)).cpu().tolist() == [True, False]
    on_gpu = device != "cpu"
    assert x.get_device() == (0 if on_gpu else -1) and x.is_cpu is not on_gpu and not x.is_pinned()
    if on_gpu:
        with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
            x.pin_memory()
        p = hp.tensor([1.0, 2.0]).pin_memory()
        assert p.is_pinned() and p.tolist() == [1.0, 2.0] and p.pin_memory() is p


def test_random_fills_and_inplace_functions_on_device(device):
    hp.manual_seed(0)
    fills = [hp.empty(64, device=device).exponential_(), hp.empty(64, device=device).geometric_(0.3),
             hp.empty(64, device=device).log_normal_(), hp.empty(64, device=device).cauchy_(),
             hp.empty(64, device=device, dtype=hp.int32).random_(3, 9), hp.empty(64, device=device).random_(),
             hp.empty(64, device=device).bernoulli_(hp.full((64,), 0.5, device=device))]
    for t in fills:
        assert t.device.type == device and bool(hp.isfinite(t.float()).all())
    assert fills[0].min().item() > 0 and fills[1].min().item() >= 1 and 3 <= fills[4].min().item() <= 8
    t = hp.ones(2, device=device)
    assert hp.exp_(t) is t and np.allclose(_np(t), math.e)
