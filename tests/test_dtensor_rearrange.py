"""Element-wise functions, their in-place forms, and the ops that move data along some dims (flip, roll, rot90,
diff, msort, tile, trace, repeat_interleave, ravel) on DTensors: each against the same op on the full tensor,
the layout PyTorch's DTensor keeps (an in-place op keeps its tensor's; a shard of a dim the op does not move
stays), and a Partial input reduced before a function that is not linear in it."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

pytestmark = pytest.mark.mpi(min_size=2)


def _mesh():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _full(seed=0, shape=(8, 6), low=0.1, high=0.9):
    return hp.tensor(np.random.default_rng(seed).uniform(low, high, shape))


UNARY = ["acosh", "asinh", "atanh", "tan", "erfc", "erfinv", "digamma", "lgamma", "logit", "sinc", "deg2rad", "rad2deg",
         "nan_to_num", "signbit", "isposinf", "isneginf", "isreal", "byte", "char", "short"]
BINARY = ["copysign", "float_power", "xlogy"]
IN_PLACE = ["abs_", "acos_", "asin_", "asinh_", "atan_", "atanh_", "ceil_", "cos_", "cosh_", "deg2rad_", "digamma_",
            "erf_", "erfc_", "erfinv_", "exp2_", "expm1_", "floor_", "frac_", "lgamma_", "log10_", "log1p_", "log2_",
            "log_", "logit_", "nan_to_num_", "rad2deg_", "reciprocal_", "relu_", "round_", "rsqrt_", "sigmoid_",
            "sign_", "sin_", "sinc_", "sinh_", "square_", "tan_", "tanh_", "trunc_"]


def _same(out, ref, what):
    assert isinstance(out, DTensor) and tuple(out.shape) == tuple(ref.shape) and out.dtype == ref.dtype, what
    np.testing.assert_allclose(out.full_tensor().detach().numpy().astype(np.float64),
                               ref.detach().numpy().astype(np.float64),
                               rtol=1e-12, err_msg=what)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pl", [Shard(0), Shard(1), Replicate()])
def test_element_wise_functions_keep_the_layout(pl):
    mesh = _mesh()
    f = _full(0) + 1.0  # acosh needs >= 1: shift every function's input alike
    for name in UNARY:
        x = f if name == "acosh" else f - 1.0
        out = getattr(distribute_tensor(x, mesh, [pl]), name)()
        _same(out, getattr(x, name)(), name)
        assert out.placements == (pl,), name
    g = _full(1) - 0.5
    for name in BINARY:
        a, b = distribute_tensor(f - 1.0, mesh, [pl]), distribute_tensor(g, mesh, [Replicate()])
        _same(getattr(a, name)(b), getattr(f - 1.0, name)(g), name)
    _same(distribute_tensor(f - 1.0, mesh, [pl]).polygamma(1), (f - 1.0).polygamma(1), "polygamma")
    _same(distribute_tensor(f, mesh, [pl]).mvlgamma(2), f.mvlgamma(2), "mvlgamma")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pl", [Shard(0), Shard(1)])
def test_in_place_functions_write_the_local_piece_and_keep_the_layout(pl):
    mesh = _mesh()
    for name in IN_PLACE:
        full = _full(2)
        d = distribute_tensor(full.clone(), mesh, [pl])
        with hp.no_grad():
            got = getattr(d, name)()
            want = getattr(full.clone(), name)()
        assert got is d and d.placements == (pl,), name
        _same(d, want, name)
    other = _full(3) - 0.5
    for name, arg in [("atan2_", other), ("copysign_", other), ("hypot_", other), ("fmod_", 0.3), ("remainder_", 0.3),
                      ("clamp_min_", 0.5), ("clamp_max_", 0.5), ("floor_divide_", 0.3), ("xlogy_", other.abs()),
                      ("float_power_", 2.0), ("eq_", 0.5), ("ge_", 0.5), ("gt_", 0.5), ("le_", 0.5), ("lt_", 0.5),
                      ("ne_", 0.5)]:
        full = _full(4)
        d = distribute_tensor(full.clone(), mesh, [pl])
        o = distribute_tensor(arg, mesh, [Replicate()]) if isinstance(arg, hp.Tensor) else arg
        with hp.no_grad():
            assert getattr(d, name)(o) is d, name
            want = getattr(full.clone(), name)(arg)
        _same(d, want, name)


@pytest.mark.timeout(60)
def test_a_partial_input_is_reduced_before_a_function_not_linear_in_it():
    mesh = _mesh()
    n = mesh.size()
    v = _full(5, (6,), 0.01, 0.2)
    p = DTensor.from_local(v, mesh, [Partial()])  # the global value is n * v
    out = p.atanh()
    assert out.placements == (Replicate(),)
    np.testing.assert_allclose(out.full_tensor().numpy(), np.arctanh(n * v.numpy()), rtol=1e-12)
    with pytest.raises(RuntimeError, match="in-place op on a Partial DTensor"):
        with hp.no_grad():
            DTensor.from_local(v.clone(), mesh, [Partial()]).tan_()


MOVED = {  # name: (call, the placement a Shard(0) input keeps, a Shard(1) input's)
    "flip(0)": (lambda x: x.flip(0), Replicate(), Shard(1)),
    "flip([0, 1])": (lambda x: x.flip([0, 1]), Replicate(), Replicate()),
    "fliplr": (lambda x: x.fliplr(), Shard(0), Replicate()),
    "flipud": (lambda x: x.flipud(), Replicate(), Shard(1)),
    "roll(2, 1)": (lambda x: x.roll(2, 1), Shard(0), Replicate()),
    "roll(3)": (lambda x: x.roll(3), Replicate(), Replicate()),
    "roll((1, -2), (0, 1))": (lambda x: x.roll((1, -2), (0, 1)), Replicate(), Replicate()),
    "rot90": (lambda x: x.rot90(), Replicate(), Replicate()),
    "diff(dim=1)": (lambda x: x.diff(dim=1), Shard(0), Replicate()),
    "diff(2, dim=0)": (lambda x: x.diff(2, dim=0), Replicate(), Shard(1)),
    "msort": (lambda x: x.msort(), Replicate(), Shard(1)),
    "tile": (lambda x: x.tile((2, 1)), Replicate(), Replicate()),
    "trace": (lambda x: x.trace(), Replicate(), Replicate()),
    "repeat_interleave": (lambda x: x.repeat_interleave(2, dim=0), Replicate(), Replicate()),
    "ravel": (lambda x: x.ravel(), Replicate(), Replicate()),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(MOVED))
def test_ops_that_move_data_along_dims_gather_only_those_dims(case):
    mesh = _mesh()
    fn, keep0, keep1 = MOVED[case]
    full = hp.tensor(np.random.default_rng(6).standard_normal((8, 6)), requires_grad=True)
    for pl, keep in ((Shard(0), keep0), (Shard(1), keep1)):
        ref = fn(full)
        x = distribute_tensor(full.detach(), mesh, [pl]).requires_grad_()
        out = fn(x)
        _same(out, ref, case)
        assert out.placements == (keep,), (case, pl, out.placements)
        weight = hp.tensor(np.random.default_rng(7).standard_normal(tuple(ref.shape)))
        (out * distribute_tensor(weight, mesh, [keep] if isinstance(keep, Shard) and out.ndim > keep.dim
                                 else [Replicate()])).sum().full_tensor().backward()
        full.grad = None
        (ref * weight).sum().backward()
        np.testing.assert_allclose(x.grad.full_tensor().numpy(), full.grad.numpy(), rtol=1e-12, err_msg=case)
