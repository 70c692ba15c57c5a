"""nn.utils.parametrize and parametrizations (weight_norm, spectral_norm), the hook-based weight_norm / spectral_norm,
and nn.Buffer: values against NumPy float64, gradients by finite differences, state-dict keys as PyTorch's."""
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.nn.utils import parametrizations
from hpcfsdp.nn.utils import parametrize as P

from _gradcheck import gradcheck

RNG = np.random.default_rng(11)


class Symmetric(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).T

    def right_inverse(self, A):
        return A.triu()


class Double(nn.Module):
    def forward(self, X):
        return X * 2

    def right_inverse(self, Y):
        return Y / 2


class NoInverse(nn.Module):
    def forward(self, X):
        return X + 1


class RankOne(nn.Module):
    def forward(self, x, y):
        return x.unsqueeze(-1) @ y.unsqueeze(-2)

    def right_inverse(self, Z):
        return Z[:, 0].clone(), hp.ones(Z.shape[1], dtype=Z.dtype)


def _linear(n_in=3, n_out=3):
    m = nn.Linear(n_in, n_out).double()
    with hp.no_grad():
        m.weight.copy_(hp.tensor(RNG.standard_normal((n_out, n_in))))
    return m


# -- parametrize ---------------------------------------------------------------------------------------------
def test_register_parametrization_class_keys_and_values():
    m = _linear()
    w0 = m.weight.detach().numpy().copy()
    out = P.register_parametrization(m, "weight", Symmetric())
    assert out is m
    assert type(m).__name__ == "ParametrizedLinear" and P.type_before_parametrizations(m) is nn.Linear
    assert P.is_parametrized(m) and P.is_parametrized(m, "weight") and not P.is_parametrized(m, "bias")
    assert not P.is_parametrized(nn.Linear(2, 2))
    assert list(m.state_dict()) == ["bias", "parametrizations.weight.original"]
    assert [n for n, _ in m.named_parameters()] == ["bias", "parametrizations.weight.original"]
    assert isinstance(m.parametrizations, nn.ModuleDict)
    assert isinstance(m.parametrizations.weight, P.ParametrizationList)
    up = np.triu(w0)  # right_inverse ran on registration
    np.testing.assert_allclose(m.parametrizations.weight.original.detach().numpy(), up)
    np.testing.assert_allclose(m.weight.detach().numpy(), up + np.triu(w0, 1).T)
    assert "weight" not in m._parameters


def test_assignment_goes_through_right_inverse():
    m = _linear()
    P.register_parametrization(m, "weight", Symmetric())
    orig = m.parametrizations.weight.original
    a = RNG.standard_normal((3, 3))
    a = a + a.T
    m.weight = hp.tensor(a)
    np.testing.assert_allclose(m.weight.detach().numpy(), a)
    assert m.parametrizations.weight.original is orig  # the Parameter keeps its identity (optimizers hold it)
    m2 = _linear()
    P.register_parametrization(m2, "weight", NoInverse())
    with pytest.raises(RuntimeError, match="does not implement right_inverse"):
        m2.weight = hp.zeros(3, 3, dtype=hp.float64)


def test_gradient_reaches_the_original():
    m = _linear()
    P.register_parametrization(m, "weight", Symmetric())
    x = hp.tensor(RNG.standard_normal((4, 3)))
    m(x).sum().backward()
    g = m.parametrizations.weight.original.grad.numpy()
    # d/dU of sum(x @ (triu(U) + triu(U,1).T).T): reference by differences on the original
    u = m.parametrizations.weight.original.detach().numpy().copy()
    xs = x.numpy()

    def loss(uu):
        w = np.triu(uu) + np.triu(uu, 1).T
        return (xs @ w.T).sum()

    num = np.zeros_like(u)
    for i in np.ndindex(u.shape):
        e = np.zeros_like(u)
        e[i] = 1e-6
        num[i] = (loss(u + e) - loss(u - e)) / 2e-6
    np.testing.assert_allclose(g, num, atol=1e-6)


def test_chained_parametrizations_and_checks():
    m = _linear()
    w0 = m.weight.detach().numpy().copy()
    P.register_parametrization(m, "weight", Double())
    P.register_parametrization(m, "weight", Double())
    assert len(m.parametrizations.weight) == 2
    np.testing.assert_allclose(m.weight.detach().numpy(), w0 * 2)  # original w0 / 2 (set once), doubled twice
    np.testing.assert_allclose(m.parametrizations.weight.original.detach().numpy(), w0 / 2)
    m.weight = hp.tensor(np.ones((3, 3)))  # right_inverse of both, in reverse order
    np.testing.assert_allclose(m.parametrizations.weight.original.detach().numpy(), np.full((3, 3), 0.25))

    class Shrink(nn.Module):
        def forward(self, X):
            return X[:2]

    with pytest.raises(ValueError, match="may not change the shape"):
        P.register_parametrization(_linear(), "weight", Shrink())
    with pytest.raises(ValueError, match="may not change the shape"):
        P.register_parametrization(m, "weight", Shrink())

    class ToFloat(nn.Module):
        def forward(self, X):
            return X.float()

    with pytest.raises(ValueError, match="may not change the dtype"):
        P.register_parametrization(_linear(), "weight", ToFloat())
    m3 = _linear()
    P.register_parametrization(m3, "weight", Shrink(), unsafe=True)
    assert m3.weight.shape == (2, 3)
    with pytest.raises(ValueError, match="does not have a parameter, a buffer, or a parametrized element"):
        P.register_parametrization(_linear(), "nothing", Double())


def test_registration_sets_training_mode():
    m = _linear().eval()
    p = Double()
    P.register_parametrization(m, "weight", p)
    assert p.training is False


def test_sequence_right_inverse_gives_original0_original1():
    m = _linear(3, 4)
    P.register_parametrization(m, "weight", RankOne())
    pl = m.parametrizations.weight
    assert not pl.is_tensor and pl.ntensors == 2
    assert not hasattr(pl, "original")
    assert list(m.state_dict()) == ["bias", "parametrizations.weight.original0", "parametrizations.weight.original1"]
    assert isinstance(pl.original0, nn.Parameter) and pl.original0.requires_grad
    x, y = pl.original0.detach().numpy(), pl.original1.detach().numpy()
    np.testing.assert_allclose(m.weight.detach().numpy(), np.outer(x, y))
    with pytest.raises(ValueError, match="Cannot leave unparametrized"):
        P.remove_parametrizations(m, "weight", leave_parametrized=False)
    P.remove_parametrizations(m, "weight")
    assert type(m) is nn.Linear and isinstance(m.weight, nn.Parameter) and m.weight.grad_fn is None
    np.testing.assert_allclose(m.weight.detach().numpy(), np.outer(x, y))


@pytest.mark.parametrize("leave", [True, False])
def test_remove_parametrizations(leave):
    m = _linear()
    w0 = m.weight.detach().numpy().copy()
    P.register_parametrization(m, "weight", Double())
    orig = m.parametrizations.weight.original
    P.remove_parametrizations(m, "weight", leave_parametrized=leave)
    assert type(m) is nn.Linear and not hasattr(m, "parametrizations")
    assert m.weight is orig and isinstance(m.weight, nn.Parameter)
    np.testing.assert_allclose(m.weight.detach().numpy(), w0 if leave else w0 / 2)
    assert list(m.state_dict()) == ["bias", "weight"]
    with pytest.raises(ValueError, match="does not have a parametrization on weight"):
        P.remove_parametrizations(m, "weight")


def test_two_tensors_class_kept_until_last_removed():
    m = _linear()
    P.register_parametrization(m, "weight", Double())
    P.register_parametrization(m, "bias", Double())
    P.remove_parametrizations(m, "weight")
    assert P.is_parametrized(m) and type(m).__name__ == "ParametrizedLinear"
    P.remove_parametrizations(m, "bias")
    assert type(m) is nn.Linear


def test_buffer_parametrization_stays_a_buffer():
    m = nn.Module()
    m.register_buffer("b", hp.tensor([1.0, 2.0], dtype=hp.float64))
    P.register_parametrization(m, "b", Double())
    assert list(m.state_dict()) == ["parametrizations.b.original"]
    assert "original" in m.parametrizations.b._buffers
    np.testing.assert_allclose(m.b.numpy(), [1.0, 2.0])
    P.remove_parametrizations(m, "b")
    assert "b" in m._buffers


def test_cached_computes_once():
    calls = []

    class Count(nn.Module):
        def forward(self, X):
            calls.append(1)
            return X * 1

    m = _linear()
    P.register_parametrization(m, "weight", Count())
    calls.clear()
    with P.cached():
        a = m.weight
        b = m.weight
        with P.cached():  # nested: the cache lives until the outer block ends
            c = m.weight
    assert a is b is c and len(calls) == 1
    m.weight
    assert len(calls) == 2


def test_state_dict_round_trip_and_deepcopy():
    import copy

    m = _linear()
    P.register_parametrization(m, "weight", Double())
    m2 = _linear()
    P.register_parametrization(m2, "weight", Double())
    m2.load_state_dict(m.state_dict())
    np.testing.assert_allclose(m2.weight.detach().numpy(), m.weight.detach().numpy())
    m3 = copy.deepcopy(m)
    assert type(m3).__name__ == "ParametrizedLinear"
    np.testing.assert_allclose(m3.weight.detach().numpy(), m.weight.detach().numpy())
    assert m3.parametrizations.weight.original is not m.parametrizations.weight.original


def test_transfer_parametrizations_and_params():
    m = _linear()
    P.register_parametrization(m, "weight", Double())
    to = _linear()
    P.transfer_parametrizations_and_params(m, to)
    assert P.is_parametrized(to, "weight")
    assert to.parametrizations.weight.original is m.parametrizations.weight.original


# -- parametrizations.weight_norm ----------------------------------------------------------------------------
def _wn_ref(v, g, dim):
    if dim is None or dim == -1:
        return v * (g / np.sqrt((v ** 2).sum()))
    d = dim % v.ndim
    axes = tuple(k for k in range(v.ndim) if k != d)
    return v * (g / np.sqrt((v ** 2).sum(axis=axes, keepdims=True)))


@pytest.mark.parametrize("dim", [0, 1, None])
def test_parametrizations_weight_norm(dim):
    m = nn.Conv1d(2, 3, 2).double()
    w0 = m.weight.detach().numpy().copy()
    parametrizations.weight_norm(m, dim=dim)
    pl = m.parametrizations.weight
    assert list(m.state_dict()) == ["bias", "parametrizations.weight.original0", "parametrizations.weight.original1"]
    g, v = pl.original0.detach().numpy(), pl.original1.detach().numpy()
    shape = {0: (3, 1, 1), 1: (1, 2, 1), None: ()}[dim]
    assert g.shape == shape
    np.testing.assert_allclose(v, w0)
    np.testing.assert_allclose(m.weight.detach().numpy(), w0, rtol=1e-12)  # right_inverse: g = ||w||, v = w
    g2 = np.asarray(RNG.random(shape) + 0.5, dtype=np.float64)
    with hp.no_grad():
        pl.original0.copy_(hp.tensor(g2))
    np.testing.assert_allclose(m.weight.detach().numpy(), _wn_ref(w0, g2, dim), rtol=1e-12)
    gradcheck(lambda gg, vv: pl[0](gg, vv), [g2.copy(), w0.copy()])


def test_weight_norm_loads_old_state_dict():
    old = nn.Linear(3, 2).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        nn.utils.weight_norm(old)
    new = parametrizations.weight_norm(nn.Linear(3, 2).double())
    new.load_state_dict(old.state_dict())
    np.testing.assert_allclose(new.weight.detach().numpy(), old.weight.detach().numpy())


# -- parametrizations.spectral_norm --------------------------------------------------------------------------
def test_parametrizations_spectral_norm():
    m = _linear(5, 4)
    w0 = m.weight.detach().numpy().copy()
    parametrizations.spectral_norm(m)
    assert list(m.state_dict()) == ["bias", "parametrizations.weight.original", "parametrizations.weight.0._u",
                                    "parametrizations.weight.0._v"]
    for _ in range(50):  # power iterations, one per read in training mode
        w = m.weight
    sigma = np.linalg.svd(w0, compute_uv=False)[0]
    np.testing.assert_allclose(w.detach().numpy(), w0 / sigma, rtol=1e-8)
    np.testing.assert_allclose(np.linalg.svd(w.detach().numpy(), compute_uv=False)[0], 1.0, rtol=1e-8)
    m.eval()  # no iteration in eval mode: u, v stay
    u = m.parametrizations.weight[0]._u.numpy().copy()
    m.weight
    np.testing.assert_array_equal(m.parametrizations.weight[0]._u.numpy(), u)
    # the gradient through sigma(W) = u^T W v with u, v fixed
    sn = m.parametrizations.weight[0]
    gradcheck(lambda ww: sn(ww), [w0.copy()], atol=1e-5)


def test_spectral_norm_dims_and_errors():
    m = nn.ConvTranspose1d(2, 3, 2).double()  # weight (2, 3, 2): dim 1 by default
    parametrizations.spectral_norm(m)
    assert m.parametrizations.weight[0].dim == 1
    assert m.parametrizations.weight[0]._u.shape == (3,) and m.parametrizations.weight[0]._v.shape == (4,)
    with pytest.raises(IndexError, match="Dimension out of range"):
        parametrizations.spectral_norm(_linear(), dim=2)
    with pytest.raises(ValueError, match="n_power_iterations to be positive"):
        parametrizations.spectral_norm(_linear(), n_power_iterations=0)
    with pytest.raises(ValueError, match="has no parameter or buffer with name 'nope'"):
        parametrizations.spectral_norm(_linear(), "nope")
    b = nn.Linear(3, 3).double()
    parametrizations.spectral_norm(b, "bias")  # 1-D: normalized
    np.testing.assert_allclose(np.linalg.norm(b.bias.detach().numpy()), 1.0)


# -- the hook-based weight_norm / spectral_norm --------------------------------------------------------------
def test_old_weight_norm():
    m = _linear(3, 2)
    w0 = m.weight.detach().numpy().copy()
    with pytest.warns(FutureWarning, match="deprecated"):
        nn.utils.weight_norm(m)
    assert list(m.state_dict()) == ["bias", "weight_g", "weight_v"]
    assert m.weight_g.shape == (2, 1)
    np.testing.assert_allclose(m.weight.detach().numpy(), w0)
    with hp.no_grad():
        m.weight_g.mul_(2.0)
    x = hp.tensor(RNG.standard_normal((4, 3)))
    y = m(x)  # the pre-hook recomputes weight
    np.testing.assert_allclose(m.weight.detach().numpy(), 2 * w0)
    y.sum().backward()
    assert m.weight_g.grad is not None and m.weight_v.grad is not None
    with pytest.raises(RuntimeError, match="Cannot register two weight_norm hooks"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            nn.utils.weight_norm(m)
    nn.utils.remove_weight_norm(m)
    assert list(m.state_dict()) == ["bias", "weight"] and isinstance(m.weight, nn.Parameter)
    np.testing.assert_allclose(m.weight.detach().numpy(), 2 * w0)
    with pytest.raises(ValueError, match="weight_norm of 'weight' not found"):
        nn.utils.remove_weight_norm(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        m2 = nn.utils.weight_norm(_linear(3, 2), dim=None)
    assert m2.weight_g.shape == ()


def test_old_spectral_norm():
    m = _linear(5, 4)
    w0 = m.weight.detach().numpy().copy()
    nn.utils.spectral_norm(m)
    sd = m.state_dict()
    assert list(sd) == ["bias", "weight_orig", "weight_u", "weight_v"]
    assert sd._metadata[""]["spectral_norm"] == {"weight.version": 1}
    assert [n for n, _ in m.named_buffers()] == ["weight_u", "weight_v"]
    x = hp.tensor(RNG.standard_normal((2, 5)))
    for _ in range(50):
        m(x)
    sigma = np.linalg.svd(w0, compute_uv=False)[0]
    np.testing.assert_allclose(m.weight.detach().numpy(), w0 / sigma, rtol=1e-8)
    m2 = nn.utils.spectral_norm(_linear(5, 4))
    m2.load_state_dict(m.state_dict())
    m2.eval()
    m2(x)
    np.testing.assert_allclose(m2.weight.detach().numpy(), m.weight.detach().numpy(), rtol=1e-10)
    nn.utils.remove_spectral_norm(m)
    assert list(m.state_dict()) == ["bias", "weight"] and isinstance(m.weight, nn.Parameter)
    assert not m._state_dict_hooks and not m._load_state_dict_pre_hooks
    with pytest.raises(ValueError, match="spectral_norm of 'weight' not found"):
        nn.utils.remove_spectral_norm(m)
    with pytest.raises(ValueError, match="n_power_iterations to be positive"):
        nn.utils.spectral_norm(_linear(), n_power_iterations=0)
    assert nn.utils.spectral_norm(nn.ConvTranspose2d(2, 3, 2)).weight_u.shape == (3,)


# -- nn.Buffer -----------------------------------------------------------------------------------------------
def test_buffer_assignment_registers():
    m = nn.Module()
    t = hp.ones(2)
    b = nn.Buffer(t, persistent=False)
    assert isinstance(b, nn.Buffer) and not isinstance(t, nn.Buffer) and type(b) is hp.Tensor
    assert b.persistent is False and np.shares_memory(b.numpy(), t.numpy())
    m.b = b
    assert "b" in m._buffers and m._non_persistent_buffers_set == {"b"} and list(m.state_dict()) == []
    m.b = hp.zeros(2)  # a plain tensor keeps the registration's persistence
    assert m._non_persistent_buffers_set == {"b"}
    m.b = nn.Buffer(hp.zeros(2))
    assert m._non_persistent_buffers_set == set() and list(m.state_dict()) == ["b"]
    m.c = nn.Buffer()
    assert m.c.shape == (0,) and [n for n, _ in m.named_buffers()] == ["b", "c"]
    assert nn.Buffer(hp.ones(1, requires_grad=True)).requires_grad
    m.p = nn.Parameter(hp.ones(1))
    with pytest.raises(TypeError, match="as parameter 'p'"):
        m.p = nn.Buffer(hp.ones(1))
    m.x = 3
    with pytest.raises(KeyError, match="attribute 'x' already exists"):
        m.x = nn.Buffer(hp.ones(1))
    with pytest.raises(TypeError, match="Buffer expects an hpcfsdp Tensor"):
        nn.Buffer([1.0])


# -- behaviour checked against PyTorch 2.13 (observed, not from its tests) -------------------------------------
def test_chained_registration_checks_right_inverse():
    class BadInverseShape(nn.Module):
        def forward(self, X):
            return X

        def right_inverse(self, X):
            return X[:1]

    class NotImplementedInverse(nn.Module):
        def forward(self, X):
            return X + 1

        def right_inverse(self, X):
            raise NotImplementedError

    m = _linear()
    P.register_parametrization(m, "weight", Double())
    with pytest.raises(ValueError, match="right_inverse must have the same shape as module.weight"):
        P.register_parametrization(m, "weight", BadInverseShape())
    assert len(m.parametrizations.weight) == 1  # a failed check appends nothing
    P.register_parametrization(m, "weight", NotImplementedInverse())  # NotImplementedError: check skipped
    assert len(m.parametrizations.weight) == 2
    with pytest.raises(NotImplementedError):  # but assignment needs every right_inverse
        m.weight = hp.zeros(3, 3, dtype=hp.float64)
    u = _linear()
    P.register_parametrization(u, "weight", Double(), unsafe=True)
    P.register_parametrization(u, "weight", Double())
    assert u.parametrizations.weight.unsafe  # unsafe once, unsafe for the chain


def test_assignment_errors():
    m = _linear()
    P.register_parametrization(m, "weight", Double())
    with pytest.raises(ValueError, match="`right_inverse` should return a tensor. Got float"):
        m.weight = 3.0
    with pytest.raises(ValueError, match="has dtype float32 while `original` has dtype float64"):
        m.weight = hp.zeros(3, 3, dtype=hp.float32)
    r = _linear(3, 4)
    P.register_parametrization(r, "weight", RankOne())
    r.parametrizations.weight[0].right_inverse = lambda Z: (Z,)
    with pytest.raises(ValueError, match="sequence of tensors of length 2. Got a sequence of length 1"):
        r.weight = hp.zeros(4, 3, dtype=hp.float64)


def test_remove_sequence_original_parameter_or_buffer():
    m = _linear(3, 4)
    m.weight.requires_grad_(False)
    P.register_parametrization(m, "weight", RankOne())
    assert isinstance(m.parametrizations.weight.original0, nn.Parameter)
    assert not m.parametrizations.weight.original0.requires_grad
    P.remove_parametrizations(m, "weight")  # the value does not require grad: a buffer
    assert "weight" in m._buffers and "weight" not in m._parameters
    b = nn.Module()
    b.register_buffer("w", hp.tensor(RNG.standard_normal((4, 3)), requires_grad=True))
    P.register_parametrization(b, "w", RankOne())
    assert list(b.parametrizations.w._buffers) == ["original0", "original1"]
    P.remove_parametrizations(b, "w")  # the value requires grad: a Parameter
    assert isinstance(b.w, nn.Parameter) and b.w.grad_fn is None


def test_transfer_creates_missing_tensor_and_shares():
    src = _linear()
    P.register_parametrization(src, "weight", Double())
    P.register_parametrization(src, "weight", Double())
    dst = nn.Module()
    assert P.transfer_parametrizations_and_params(src, dst) is dst
    assert type(dst).__name__ == "ParametrizedModule" and len(dst.parametrizations.weight) == 2
    assert dst.parametrizations.weight[0] is src.parametrizations.weight[0]
    assert dst.parametrizations.weight.original is src.parametrizations.weight.original
    assert list(dst.state_dict()) == ["parametrizations.weight.original"]
    plain = nn.Linear(2, 2)
    assert P.transfer_parametrizations_and_params(nn.Linear(2, 2), plain) is plain and type(plain) is nn.Linear


def test_parametrized_module_refuses_pickle():
    import pickle

    m = _linear()
    P.register_parametrization(m, "weight", Double())
    with pytest.raises(RuntimeError, match="only supported through state_dict"):
        pickle.dumps(m)
    assert type(m) is not type(P.register_parametrization(_linear(), "weight", Double()))  # one class per module


def test_old_spectral_norm_loads_version_0_state_dict():
    src = nn.utils.spectral_norm(_linear(5, 4))
    x = hp.tensor(RNG.standard_normal((2, 5)))
    for _ in range(5):
        src(x)
    src.eval()
    src(x)
    old = dict(src.state_dict())  # no metadata: as a version-0 save, with the weight and without v
    old["weight"] = src.weight.detach().clone()
    del old["weight_v"]
    dst = nn.utils.spectral_norm(_linear(5, 4))
    dst.load_state_dict(old)
    dst.eval()
    dst(x)
    np.testing.assert_allclose(dst.weight.detach().numpy(), src.weight.detach().numpy(), rtol=1e-8)
    del old["weight"]
    missing = nn.utils.spectral_norm(_linear(5, 4)).load_state_dict(old, strict=False).missing_keys
    assert missing == ["weight", "weight_v"]
