"""The ops that run fused kernels on CuPy arrays (LayerNorm, RMSNorm, softmax, log_softmax, cross-entropy) equal the
CPU path, forward and gradients, in float32 and bfloat16, in the launches the kernels promise; a bad cross-entropy
target is raised at the next host read (See [Note: Deferred device checks] in hpcfsdp/_kernels/checks.py).

Marked `gpu`: runs on the simulated device (HPCFSDP_CUDA_SIM=1) or a real GPU. The twins themselves:
tests/test_kernels_norm.py and tests/test_kernels_softmax.py.
"""
import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp._kernels import checks
from hpcfsdp.nn import functional as F

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)
HP = {np.dtype(np.float32): hp.float32, BF16: hp.bfloat16}


@pytest.fixture(autouse=True)
def _no_pending_checks():
    checks._pending.clear()
    yield
    checks._pending.clear()


def _counting():
    from hpcfsdp.testing import _sim_counters
    from hpcfsdp import _backend
    if not _backend.cuda_simulated():
        pytest.skip("launch counts are the simulated device's")
    return _sim_counters.counting()


def _run(dev, fn, arrays, dtype, counts=None):
    """fn on tensors of ``arrays`` (float ones in ``dtype``, requiring grad), backward of sum(out * cos); outputs and
    gradients as float64 NumPy; ``counts`` collects (forward, backward) launch counts on the simulated device."""
    ts = [hp.tensor(a, device=dev).to(HP[dtype]).requires_grad_() if a.dtype.kind == "f" else hp.tensor(a, device=dev)
          for a in arrays]
    if counts is not None:
        with _counting() as cf:
            out = fn(*ts)
    else:
        out = fn(*ts)
    g = hp.tensor(np.cos(np.arange(max(out.numel(), 1), dtype=np.float32)).reshape(out.shape), device=dev).to(out.dtype)
    if counts is not None:
        with _counting() as cb:
            out.backward(g)
        counts += [cf, cb]
    else:
        out.backward(g)
    return [out.detach().double().cpu().numpy()] + [t.grad.double().cpu().numpy() for t in ts if t.grad is not None]


def _close(dtype, got, want):
    for a, b in zip(got, want):
        if dtype == BF16:  # a few bf16 roundings apart: the CPU path rounds each step, the kernel once
            np.testing.assert_allclose(a, b, rtol=2 ** -5, atol=2 ** -5 * max(1.0, np.abs(b).max()))
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


RNG = np.random.default_rng(0)
X = (RNG.standard_normal((3, 4, 40)) * 2 + 0.5).astype(np.float32)
W, B = RNG.standard_normal(40).astype(np.float32), RNG.standard_normal(40).astype(np.float32)
T = RNG.integers(0, 40, 12)
T[5] = -100
T3 = np.where(T == -100, 3, T)  # ignore_index=3
CASES = {  # name: (fn, arrays, (forward launches, backward launches))
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (40,), w, b), (X, W, B), (1, 2)),
    "layer_norm_2d": (lambda x: F.layer_norm(x, (4, 40)), (X,), (1, 1)),
    "rms_norm": (lambda x, w: F.rms_norm(x, (40,), w), (X, W), (1, 2)),
    "rms_norm_eps": (lambda x: F.rms_norm(x, 40, eps=1e-3), (X,), (1, 1)),
    "softmax": (lambda x: F.softmax(x, dim=-1), (X,), (1, 1)),
    "log_softmax": (lambda x: F.log_softmax(x, dim=2), (X,), (1, 1)),
    "cross_entropy": (lambda x, t: F.cross_entropy(x.reshape(-1, 40), t), (X, T), (2, 1)),
    "cross_entropy_sum_smoothed": (lambda x, t: F.cross_entropy(x.reshape(-1, 40), t, reduction="sum",
                                                                label_smoothing=0.2), (X, T), (2, 1)),
    "cross_entropy_none": (lambda x, t: F.cross_entropy(x.reshape(-1, 40), t, reduction="none", ignore_index=3),
                           (X, T3), (2, 1)),
}


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_ops_on_cuda_equal_the_cpu_in_the_promised_launches(case, dtype):
    fn, arrays, (nf, nb) = CASES[case]
    counts = []
    got = _run("cuda", fn, arrays, dtype, counts)
    _close(dtype, got, _run("cpu", fn, arrays, dtype))
    fwd, bwd = counts
    kernels = lambda c: sum(n for op, n in c.launches_by_op.items() if op.startswith("kernel "))  # noqa: E731
    assert (fwd.launches, kernels(fwd)) == (nf, nf), fwd.launches_by_op
    assert (kernels(bwd), len(fwd.host_syncs)) == (nb, 0), (bwd.launches_by_op, fwd.host_syncs)


@pytest.mark.parametrize("case", ["layer_norm", "rms_norm"])
def test_a_float32_weight_on_bfloat16_input_keeps_the_cpu_dtypes(case):
    # LayerNorm: the unfused path (output bf16, the weight applied in float32); RMSNorm: the fused normalisation, then
    # the promoting multiply (output float32), as PyTorch's rms_norm
    x = hp.tensor(X, device="cuda").to(hp.bfloat16)
    w = hp.tensor(W, device="cuda")
    out = F.layer_norm(x, (40,), w) if case == "layer_norm" else F.rms_norm(x, (40,), w)
    ref = F.layer_norm(x.cpu(), (40,), w.cpu()) if case == "layer_norm" else F.rms_norm(x.cpu(), (40,), w.cpu())
    assert out.dtype == ref.dtype == (hp.bfloat16 if case == "layer_norm" else hp.float32)
    np.testing.assert_allclose(out.double().cpu().numpy(), ref.double().numpy(), rtol=2 ** -6, atol=2 ** -6)


def test_softmax_over_another_dim_or_a_strided_input_takes_the_unfused_path():
    x = hp.tensor(X, device="cuda")
    with _counting() as c:
        a = F.softmax(x, dim=1)
        b = F.softmax(x.transpose(1, 2), dim=-1)
    assert not any(op.startswith("kernel ") for op in c.launches_by_op)
    np.testing.assert_allclose(a.cpu().numpy(), F.softmax(x.cpu(), dim=1).numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b.cpu().numpy(), F.softmax(x.cpu().transpose(1, 2), dim=-1).numpy(), rtol=1e-6,
                               atol=1e-7)


def test_a_bad_target_is_raised_at_the_next_host_read_naming_it():
    x = hp.tensor(X.reshape(-1, 40), device="cuda", requires_grad=True)
    t = T.copy()
    t[7], t[9] = 40, -3
    td = hp.tensor(t, device="cuda")
    with _counting() as c:
        loss = F.cross_entropy(x, td)  # no host read: nothing raised yet
    assert c.host_syncs == [] and checks.pending() == 1
    with pytest.raises(IndexError, match=r"^cross_entropy: target 40 is out of bounds for 40 classes$"):
        loss.item()
    assert checks.pending() == 0
    ok = F.cross_entropy(x, hp.tensor(T, device="cuda"))
    assert ok.item() == pytest.approx(F.cross_entropy(x.detach().cpu(), hp.tensor(T)).item(), rel=1e-6)


def test_pending_checks_are_read_in_one_copy_and_the_first_error_wins():
    x = hp.tensor(X.reshape(-1, 40), device="cuda")
    t = T.copy()
    t[2] = 99
    F.cross_entropy(x, hp.tensor(T, device="cuda"))
    F.cross_entropy(x, hp.tensor(t, device="cuda"))
    t[2] = 77
    F.cross_entropy(x, hp.tensor(t, device="cuda"), reduction="none")
    assert checks.pending() == 3
    with _counting() as c, pytest.raises(IndexError, match="target 99 is out"):
        x.sum().tolist()
    # one copy of the three flags, then the bad target's value for the message; the read itself never happens
    assert [(k, site.split(" in ")[-1]) for k, site in c.host_syncs] == [("ndarray.get", "raise_pending"),
                                                                         ("int(ndarray)", "<lambda>")]
    F.cross_entropy(x, hp.tensor(T, device="cuda"))
    F.cross_entropy(x, hp.tensor(T, device="cuda"))
    s = x.sum()
    with _counting() as c:
        s.tolist()  # no error: one copy of both flags, then the read
    assert [k for k, _ in c.host_syncs] == ["ndarray.get", "ndarray.get"] and checks.pending() == 0


def test_debug_sync_checks_raise_at_the_op(monkeypatch):
    monkeypatch.setenv("HPCFSDP_DEBUG_SYNC_CHECKS", "1")
    t = T.copy()
    t[0] = -5
    with pytest.raises(IndexError, match=r"^cross_entropy: target -5 is out of bounds for 40 classes$"):
        F.cross_entropy(hp.tensor(X.reshape(-1, 40), device="cuda"), hp.tensor(t, device="cuda"))
    assert checks.pending() == 0


@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "log_softmax"])
def test_a_strided_input_is_made_contiguous_once(case):
    fn = {"layer_norm": lambda x, w: F.layer_norm(x.transpose(0, 1), (40,), w),
          "rms_norm": lambda x, w: F.rms_norm(x.transpose(0, 1), (40,), w),
          "log_softmax": lambda x, w: F.log_softmax(x.transpose(0, 1) * w, dim=-1)}[case]
    _close(np.dtype(np.float32), _run("cuda", fn, (X, W), np.dtype(np.float32)),
           _run("cpu", fn, (X, W), np.dtype(np.float32)))


# -- embedding: one gather, its bounds check deferred ------------------------------------------------------------
def test_embedding_gathers_in_one_launch_and_raises_a_bad_index_at_the_next_read():
    from hpcfsdp.testing import cuda_sim
    w = hp.randn(10, 6, device="cuda", requires_grad=True)
    idx = hp.tensor([[1, 9], [0, 3]], device="cuda")
    with cuda_sim.counting() as c:
        out = F.embedding(idx, w)
    assert c.host_syncs == [] and c.launches_by_op["kernel embedding_fwd<float>"] == 1
    np.testing.assert_array_equal(out.detach().cpu().numpy(), w.detach().cpu().numpy()[[[1, 9], [0, 3]]])
    out.sum().backward()
    np.testing.assert_array_equal(w.grad.cpu().numpy().sum(axis=1), np.array([1, 1, 0, 1, 0, 0, 0, 0, 0, 1]) * 6.0)
    bad = F.embedding(hp.tensor([[2, 10]], device="cuda"), w)  # no error yet: nothing was read
    with pytest.raises(IndexError, match="embedding: index 10 out of range for 10 rows"):
        bad.sum().item()
    F.embedding(hp.tensor([-1], device="cuda"), w)
    with pytest.raises(IndexError, match="index -1 out of range"):
        hp.ones(1, device="cuda").item()  # any read raises the pending one


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
def test_dropout_on_cuda_draws_as_before_and_runs_two_launches_forward_and_one_backward(dtype):
    import cupy
    x = hp.tensor(np.random.default_rng(9).standard_normal((4, 33)), device="cuda").to(HP[dtype]).requires_grad_()
    cupy.random.seed(5)
    r = cupy.asnumpy(cupy.random.random_sample(x.shape, dtype=np.float32))  # the draw dropout makes
    cupy.random.seed(5)
    counts = []
    with _counting() as cf:
        y = F.dropout(x, p=0.25, training=True)
    g = hp.ones(4, 33, device="cuda").to(HP[dtype])
    with _counting() as cb:
        y.backward(g)
    counts = (cf.launches, cb.launches)
    keep = r >= np.float32(0.25)
    xs = x.detach().double().cpu().numpy()
    want = np.where(keep, xs * np.float32(1 / 0.75), 0.0)
    np.testing.assert_allclose(y.detach().double().cpu().numpy(), want, rtol=2 ** -8 if dtype == BF16 else 1e-7)
    np.testing.assert_allclose(x.grad.double().cpu().numpy(), np.where(keep, np.float32(1 / 0.75), 0.0),
                               rtol=2 ** -8 if dtype == BF16 else 1e-7)
    assert counts == (2, 1), (cf.launches_by_op, cb.launches_by_op)
