"""Shape ops (views, reshape, permute, expand, split/chunk, cat/stack, roll/flip/repeat, movedim, meshgrid)."""

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import LAYOUTS, _np, gradcheck, rand


# -- shape ops -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_shape_ops(rng, layout):
    a = rand(rng, 2, 3, 4, layout=layout)
    gradcheck(lambda x: x.reshape(4, 6) * 2, [a])
    gradcheck(lambda x: x.flatten(1).unsqueeze(0).squeeze(0), [a])
    gradcheck(lambda x: x.permute(2, 0, 1).reshape(-1), [a])
    gradcheck(lambda x: x.transpose(0, 2), [a])
    gradcheck(lambda x: x.contiguous().view(2, 12), [a])
    gradcheck(lambda x: x.T.clone(), [a])
    gradcheck(lambda x: x.unflatten(2, (2, 2)), [a])


def test_expand(rng):
    a = rng.standard_normal((3, 1))
    gradcheck(lambda x: x.expand(2, 3, 4), [a])
    gradcheck(lambda x: x.expand(-1, 5) * 1.5, [a])


def test_split_chunk_unbind(rng):
    a = rand(rng, 5, 4, layout="t")
    gradcheck(lambda x: x.split(2, dim=0), [a])
    gradcheck(lambda x: x.split([1, 3], dim=1), [a])
    gradcheck(lambda x: x.chunk(3, 0)[1], [a])  # unused outputs get no gradient
    gradcheck(lambda x: x.unbind(1), [a])


def test_cat_stack(rng):
    a, b, c = rng.standard_normal((2, 3)), rand(rng, 3, 3, layout="t"), rng.standard_normal((1, 3))
    gradcheck(lambda x, y, z: hp.cat([x, y, z], 0), [a, b, c])
    gradcheck(lambda x, y: hp.cat((x, y), dim=-1), [a, rng.standard_normal((2, 4))])
    gradcheck(lambda x, y: hp.stack([x, y], 1), [a, rng.standard_normal((2, 3))])


def test_narrow_and_tensor_split(rng):
    a = rng.standard_normal((3, 7))
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.narrow(x, 1, 2, 3)), a[:, 2:5])
    np.testing.assert_array_equal(_np(hp.narrow(x, -1, -2, 2)), a[:, 5:])
    np.testing.assert_array_equal(_np(x.narrow(0, hp.tensor(1), 2)), a[1:3])
    gradcheck(lambda t: t.narrow(1, 1, 4), [a])
    assert [p.shape[1] for p in hp.tensor_split(x, 3, dim=1)] == [3, 2, 2]
    assert [p.shape[1] for p in hp.tensor_split(x, [1, 5, 9], dim=1)] == [1, 4, 2, 0]
    assert [p.shape[1] for p in hp.tensor_split(x, [5, 1], dim=1)] == [5, 0, 6]
    assert [p.shape[1] for p in hp.tensor_split(x, hp.tensor([2, 3]), dim=1)] == [2, 1, 4]
    assert [p.shape[0] for p in hp.tensor_split(x, hp.tensor(2))] == [2, 1]
    pieces = hp.tensor_split(x, [2, 4], dim=1)
    for p, r in zip(pieces, np.split(a, [2, 4], axis=1)):
        np.testing.assert_array_equal(_np(p), r)
    gradcheck(lambda t: hp.tensor_split(t, 3, dim=1), [a])
    gradcheck(lambda t: hp.tensor_split(t, [1, 5], dim=1), [a])


# -- shape ops ---------------------------------------------------------------------------------------------
def test_roll_flip_values_and_grad(rng):
    a = rand(rng, 3, 4, layout="t")
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.roll(x, 1)), np.roll(a, 1))
    np.testing.assert_array_equal(_np(hp.roll(x, (1, -2), (0, 1))), np.roll(a, (1, -2), (0, 1)))
    np.testing.assert_array_equal(_np(x.roll(-1, 1)), np.roll(a, -1, 1))
    np.testing.assert_array_equal(_np(hp.flip(x, [0, 1])), a[::-1, ::-1])
    np.testing.assert_array_equal(_np(x.flip(1)), a[:, ::-1])
    np.testing.assert_array_equal(_np(hp.fliplr(x)), np.fliplr(a))
    np.testing.assert_array_equal(_np(hp.flipud(x)), np.flipud(a))
    gradcheck(lambda t: hp.roll(t, (1, 2), (0, 1)) * t, [a])
    gradcheck(lambda t: hp.roll(t, 5) * t, [a])
    gradcheck(lambda t: hp.flip(t, (0,)) * t, [a])
    f = hp.flip(x, [0])
    f[0, 0] = 100.0  # a copy, as PyTorch's
    assert x[2, 0].item() == a[2, 0]
    with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
        hp.roll(x, (1, 2), 0)
    with pytest.raises(RuntimeError, match=">= 2-d"):
        hp.fliplr(hp.ones(3))
    with pytest.raises(RuntimeError, match="repeated dim"):
        hp.flip(x, (0, -2))


def test_repeat_tile_repeat_interleave(rng):
    a = rng.standard_normal((2, 3))
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(x.repeat(2, 1, 2)), np.tile(a, (2, 1, 2)))
    np.testing.assert_array_equal(_np(hp.tile(x, (2,))), np.tile(a, (1, 2)))
    np.testing.assert_array_equal(_np(hp.repeat_interleave(x, 2)), np.repeat(a.ravel(), 2))
    np.testing.assert_array_equal(_np(hp.repeat_interleave(x, hp.tensor([1, 0, 3]), dim=1)),
                                  np.repeat(a, [1, 0, 3], axis=1))
    np.testing.assert_array_equal(_np(x.repeat_interleave(2, dim=0)), np.repeat(a, 2, axis=0))
    r = hp.repeat_interleave(hp.tensor([2, 0, 1]))
    assert r.dtype == hp.int64 and r.tolist() == [0, 0, 2]
    gradcheck(lambda t: t.repeat(2, 1, 3), [a])
    gradcheck(lambda t: hp.tile(t, (3, 1)), [a])
    gradcheck(lambda t: hp.repeat_interleave(t, hp.tensor([2, 1, 3]), dim=1), [a])
    with pytest.raises(RuntimeError, match="can not be smaller"):
        x.repeat(2)
    with pytest.raises(RuntimeError, match="same size as input along dim"):
        hp.repeat_interleave(x, hp.tensor([1, 2]), dim=1)
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        hp.repeat_interleave(x, -1)


def test_meshgrid_broadcast_atleast(rng):
    a, b = rng.standard_normal(2), rng.standard_normal(3)
    for indexing in ("ij", "xy"):
        got = hp.meshgrid(hp.tensor(a), hp.tensor(b), indexing=indexing)
        ref = np.meshgrid(a, b, indexing=indexing)
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(_np(g), r)
    gradcheck(lambda s, t: [g * g for g in hp.meshgrid([s, t], indexing="xy")], [a, b])
    assert [g.shape for g in hp.meshgrid(hp.ones(2), hp.ones(3), hp.ones(4))] == [(2, 3, 4)] * 3
    x, y = hp.broadcast_tensors(hp.ones(2, 1), hp.ones(3))
    assert x.shape == y.shape == (2, 3) and hp.broadcast_shapes((2, 1), (3,), 1) == (2, 3)
    assert hp.broadcast_to(hp.ones(3), (2, 3)).shape == (2, 3)
    gradcheck(lambda s, t: [u * 2 for u in hp.broadcast_tensors(s, t)], [a[:, None], b])
    assert hp.atleast_1d(hp.tensor(1.0)).shape == (1,) and hp.atleast_2d(hp.tensor(1.0)).shape == (1, 1)
    assert hp.atleast_2d(hp.ones(3)).shape == (1, 3) and hp.atleast_3d(hp.ones(2, 3)).shape == (2, 3, 1)
    assert hp.atleast_3d(hp.ones(2)).shape == (1, 2, 1) and hp.atleast_3d(hp.ones(1, 2, 3, 4)).shape == (1, 2, 3, 4)
    pair = hp.atleast_1d(hp.tensor(1.0), hp.tensor(2.0))
    assert isinstance(pair, tuple) and [p.shape for p in pair] == [(1,), (1,)]
    with pytest.raises(RuntimeError, match="Expected 0D or 1D"):
        hp.meshgrid(hp.ones(2, 2))
    with pytest.raises(ValueError, match="indexing must be"):
        hp.meshgrid(hp.ones(2), indexing="ji")
    with pytest.raises(RuntimeError, match="cannot be broadcast"):
        hp.broadcast_tensors(hp.ones(2), hp.ones(3))


def test_movedim(rng):
    a = rng.standard_normal((2, 3, 4))
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.movedim(x, 0, -1)), np.moveaxis(a, 0, -1))
    np.testing.assert_array_equal(_np(x.moveaxis((0, 1), (2, 0))), np.moveaxis(a, (0, 1), (2, 0)))


# -- in-place views ----------------------------------------------------------------------------------------
def test_inplace_views_change_the_shape_of_self():
    y = hp.arange(6.0).reshape(2, 3)
    v = y.view(2, 3)
    assert y.t_() is y and y.shape == (3, 2) and y.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert v.shape == (2, 3)  # other views keep their shapes, as in PyTorch
    assert y.swapdims_(0, 1).shape == (2, 3) and y.swapaxes_(1, 0).shape == (3, 2)
    assert y.transpose_(0, 1).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert y.unsqueeze_(0).shape == (1, 2, 3) and y.unsqueeze_(-1).shape == (1, 2, 3, 1)
    assert y.squeeze_(0).shape == (2, 3, 1) and y.squeeze_().shape == (2, 3)
    z = hp.zeros(1, 3, 1)
    assert z.squeeze_((0, 2)).shape == (3,)
    with pytest.raises(RuntimeError, match="<= 2 dimensions"):
        hp.zeros(2, 3, 4).t_()
    with pytest.raises(IndexError):
        hp.zeros(3).unsqueeze_(5)


def test_inplace_view_in_the_graph_and_on_leaves(rng):
    a = rng.standard_normal((2, 3))

    def f(x):
        y = x * 2
        y.t_()
        y.unsqueeze_(0)
        return y * hp.tensor(np.arange(6.0).reshape(1, 3, 2))

    gradcheck(f, [a])
    leaf = hp.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        leaf.unsqueeze_(0)
    with hp.no_grad():
        leaf.unsqueeze_(0)
    assert leaf.shape == (1, 2, 3) and leaf.requires_grad and leaf.grad_fn is None


def test_swapdims_is_transpose(rng):
    a = rng.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(_np(hp.swapdims(hp.tensor(a), 0, 2)), np.swapaxes(a, 0, 2))
    np.testing.assert_array_equal(_np(hp.tensor(a).swapdims(-1, 1)), np.swapaxes(a, -1, 1))


# -- windows, select, rot90, splits ------------------------------------------------------------------------
def _unfold_ref(a, dim, size, step):
    a = np.moveaxis(a, dim, -1)
    n = a.shape[-1]
    w = np.stack([a[..., s:s + size] for s in range(0, n - size + 1, step)], axis=-2)  # (..., windows, size)
    return np.moveaxis(w, -2, dim if dim >= 0 else dim - 1)


@pytest.mark.parametrize("dim,size,step", [(0, 2, 1), (1, 3, 2), (-1, 2, 2), (2, 4, 1), (1, 1, 5), (2, 0, 1)])
def test_unfold_against_numpy(rng, dim, size, step):
    a = rng.standard_normal((3, 5, 4))
    out = hp.tensor(a).unfold(dim, size, step)
    ref = _unfold_ref(a, dim, size, step)
    assert out.shape == ref.shape
    np.testing.assert_array_equal(_np(out), ref)
    if size:
        gradcheck(lambda x: x.unfold(dim, size, step), [a])  # overlapping windows add up


def test_unfold_edge_cases_and_errors():
    assert hp.arange(7.0).unfold(0, 7, 1).shape == (1, 7) and hp.arange(7.0).unfold(0, 2, 10).shape == (1, 2)
    assert hp.tensor(5.0).unfold(0, 1, 1).tolist() == [5.0]
    with pytest.raises(RuntimeError, match="maximum size for tensor at dimension 0 is 7 but size is 8"):
        hp.arange(7.0).unfold(0, 8, 1)
    with pytest.raises(RuntimeError, match="step is 0 but must be > 0"):
        hp.arange(7.0).unfold(0, 2, 0)
    with pytest.raises(IndexError):
        hp.arange(7.0).unfold(1, 2, 1)


def test_select_ravel_rot90(rng):
    a = rng.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(_np(hp.tensor(a).select(1, -1)), a[:, -1])
    np.testing.assert_array_equal(_np(hp.select(hp.tensor(a), 0, 1)), a[1])
    gradcheck(lambda x: x.select(2, 1), [a])
    with pytest.raises(IndexError, match="out of range"):
        hp.tensor(a).select(1, 3)
    with pytest.raises(IndexError, match="0-dim"):
        hp.tensor(1.0).select(0, 0)
    np.testing.assert_array_equal(_np(hp.ravel(hp.tensor(a).transpose(0, 2))), a.transpose(2, 1, 0).ravel())
    for k in (-1, 0, 1, 2, 3, 5):
        for dims in ((0, 1), (1, 0), (0, 2), (-1, 1)):
            np.testing.assert_array_equal(_np(hp.rot90(hp.tensor(a), k, dims)), np.rot90(a, k, dims), err_msg=str(k))
    gradcheck(lambda x: x.rot90(1, (1, 2)), [a])
    with pytest.raises(RuntimeError, match="total rotation dims == 2"):
        hp.rot90(hp.tensor(a), 1, [0])
    with pytest.raises(RuntimeError, match="rotation dims to be different"):
        hp.rot90(hp.tensor(a), 1, [0, 0])
    with pytest.raises(RuntimeError, match="total dims >= 2"):
        hp.rot90(hp.arange(3.0))


def test_split_with_sizes_and_hvdsplit(rng):
    a = rng.standard_normal((4, 6, 8))
    t = hp.tensor(a)
    parts = t.split_with_sizes([1, 5], 1)
    assert [p.shape for p in parts] == [(4, 1, 8), (4, 5, 8)]
    with pytest.raises(RuntimeError, match="sum exactly to 6"):
        t.split_with_sizes([1, 1], dim=1)
    for name, axis in (("hsplit", 1), ("vsplit", 0), ("dsplit", 2)):
        for ios in (2, [1, 3]):
            got = getattr(hp, name)(t, ios)
            ref = np.array_split(a, ios, axis) if isinstance(ios, int) else np.split(a, ios, axis)
            assert len(got) == len(ref)
            for g, r in zip(got, ref):
                np.testing.assert_array_equal(_np(g), r)
    assert [p.tolist() for p in hp.hsplit(hp.arange(4.0), 2)] == [[0.0, 1.0], [2.0, 3.0]]
    with pytest.raises(RuntimeError, match="not divisible by the split_size 3"):
        hp.dsplit(t, 3)
    with pytest.raises(RuntimeError, match="at least 2 dimension"):
        hp.vsplit(hp.arange(4.0), 2)
    with pytest.raises(RuntimeError, match="at least 3 dimension"):
        hp.dsplit(hp.ones(4, 4), 2)
    with pytest.raises(TypeError):
        hp.hsplit(t, 2.0)
