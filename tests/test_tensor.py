"""hp.Tensor and the creation functions: PyTorch semantics for dtypes, shapes, indexing, conversion, in-place ops."""
import numpy as np
import pytest

import hpcfsdp as hp


# -- creation --------------------------------------------------------------------------------------
def test_tensor_dtype_inference():
    assert hp.tensor([1.0, 2.0]).dtype == hp.float32
    assert hp.tensor([1, 2]).dtype == hp.int64
    assert hp.tensor([True, False]).dtype == hp.bool
    assert hp.tensor(np.zeros(2, np.float64)).dtype == hp.float64
    assert hp.tensor(np.zeros(2, np.int32)).dtype == hp.int32
    assert hp.tensor([1, 2], dtype=hp.float16).dtype == hp.float16
    assert hp.tensor(2.5).shape == () and hp.tensor(2.5).item() == 2.5
    a = np.arange(3.0)
    t = hp.tensor(a)
    a[0] = 7
    assert t[0].item() == 0.0  # tensor() copies


def test_creation_functions():
    assert hp.zeros(2, 3).shape == (2, 3) and hp.zeros((2, 3)).numpy().sum() == 0
    assert hp.ones([4], dtype=hp.int32).dtype == hp.int32 and hp.ones(4).numpy().sum() == 4
    assert hp.empty(3, 2).shape == (3, 2) and hp.empty(3).dtype == hp.float32
    f = hp.full((2, 2), 3.5)
    assert f.dtype == hp.float32 and (f.numpy() == 3.5).all()
    assert hp.full((2,), 3).dtype == hp.int64
    np.testing.assert_array_equal(hp.arange(5).numpy(), np.arange(5))
    assert hp.arange(5).dtype == hp.int64 and hp.arange(0, 1, 0.25).dtype == hp.float32
    np.testing.assert_allclose(hp.arange(1, 2, 0.25).numpy(), [1, 1.25, 1.5, 1.75])
    x = hp.randn(2, 3, dtype=hp.float64)
    assert hp.zeros_like(x).dtype == hp.float64 and (hp.ones_like(x).numpy() == 1).all()
    assert hp.zeros_like(x, dtype=hp.float16).dtype == hp.float16
    assert hp.zeros(2, requires_grad=True).requires_grad
    assert hp.Tensor([1, 2]).dtype == hp.float32 and hp.Tensor(2, 3).shape == (2, 3)
    assert hp.Tensor().shape == (0,)


def test_random_reproducible_and_ranges():
    hp.manual_seed(42)
    a, b, c = hp.randn(100), hp.rand(100), hp.randint(3, 7, (100,))
    hp.manual_seed(42)
    np.testing.assert_array_equal(a.numpy(), hp.randn(100).numpy())
    np.testing.assert_array_equal(b.numpy(), hp.rand(100).numpy())
    np.testing.assert_array_equal(c.numpy(), hp.randint(3, 7, (100,)).numpy())
    assert a.dtype == hp.float32 and c.dtype == hp.int64
    assert 0 <= b.numpy().min() and b.numpy().max() < 1
    assert c.numpy().min() >= 3 and c.numpy().max() <= 6
    assert hp.randint(5, (3, 2)).shape == (3, 2)
    assert abs(hp.randn(20000).numpy().std() - 1) < 0.05


def test_from_numpy_and_dlpack_share_memory():
    a = np.zeros(3, np.float32)
    t = hp.from_numpy(a)
    a[1] = 5
    assert t[1].item() == 5
    d = hp.from_dlpack(a)
    a[2] = 7
    assert d[2].item() == 7
    back = np.from_dlpack(t)
    back[0] = 9
    assert t[0].item() == 9
    assert t.__dlpack_device__()[0] == 1
    with pytest.raises(TypeError):
        hp.from_numpy([1, 2])
    with pytest.raises(RuntimeError, match="requires grad"):
        hp.ones(2, requires_grad=True).__dlpack__()


def test_cat_stack_where_values():
    a, b = hp.tensor([[1, 2]]), hp.tensor([[3, 4]])
    np.testing.assert_array_equal(hp.cat([a, b]).numpy(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(hp.cat([a, b], dim=1).numpy(), [[1, 2, 3, 4]])
    np.testing.assert_array_equal(hp.stack([a, b], dim=-1).numpy(), [[[1, 3], [2, 4]]])
    assert hp.cat([a, hp.tensor([[0.5, 1.5]])]).dtype == hp.float32
    np.testing.assert_array_equal(hp.where(hp.tensor([True, False]), hp.tensor([1, 2]), 0).numpy(), [1, 0])
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        hp.cat([a, hp.zeros(1, 3, dtype=hp.int64)])
    with pytest.raises(RuntimeError, match="equal size"):
        hp.stack([a, hp.zeros(1, 3, dtype=hp.int64)])


# -- dtype promotion -------------------------------------------------------------------------------------
def test_dtype_promotion_like_pytorch():
    f32, f64 = hp.ones(2), hp.ones(2, dtype=hp.float64)
    i64, i32 = hp.ones(2, dtype=hp.int64), hp.ones(2, dtype=hp.int32)
    assert (f32 * 2.0).dtype == hp.float32
    assert (f32 + 1).dtype == hp.float32
    assert (i64 / 2).dtype == hp.float32
    assert (i64 / i64).dtype == hp.float32
    assert (i64 * 2.5).dtype == hp.float32
    assert (i64 + 1).dtype == hp.int64
    assert (f32 + f64).dtype == hp.float64
    assert (f32 + hp.tensor(2.0, dtype=hp.float64)).dtype == hp.float32  # 0-d does not promote within a category
    assert (i32 + i64).dtype == hp.int64
    assert (hp.tensor([True]) + 1).dtype == hp.int64
    assert (hp.ones(2, dtype=hp.float16) + hp.ones(2, dtype=hp.bfloat16)).dtype == hp.float32
    assert (i64 + hp.ones(2, dtype=hp.float16)).dtype == hp.float16
    assert (2 ** hp.tensor([1.0, 2.0])).dtype == hp.float32
    assert (hp.ones(2, dtype=hp.float16) * 3.0).dtype == hp.float16
    assert hp.promote_types(hp.int32, hp.float32) == hp.float32


def test_comparisons_are_bool_without_grad():
    x = hp.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for r in (x > 1.5, x == 2, x <= x, x != 1, x >= hp.tensor(2.0), x < 3):
        assert r.dtype == hp.bool and not r.requires_grad
    np.testing.assert_array_equal((x > 1.5).numpy(), [False, True, True])
    m = (x > 1.5) & (x < 2.5)
    np.testing.assert_array_equal(m.numpy(), [False, True, False])
    np.testing.assert_array_equal((~m).numpy(), [True, False, True])


# -- reductions and math -----------------------------------------------------------------------------------
def test_reductions_values():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = hp.tensor(a)
    np.testing.assert_array_equal(t.sum(1).numpy(), a.sum(1))
    np.testing.assert_array_equal(t.sum((0, 2), keepdim=True).numpy(), a.sum((0, 2), keepdims=True))
    np.testing.assert_allclose(t.mean(-1).numpy(), a.mean(-1))
    m = t.max(1)
    np.testing.assert_array_equal(m.values.numpy(), a.max(1))
    np.testing.assert_array_equal(m.indices.numpy(), a.argmax(1))
    vals, idx = t.min(dim=2, keepdim=True)
    assert vals.shape == (2, 3, 1) and idx.dtype == hp.int64
    assert t.max().item() == 23 and t.min().item() == 0
    np.testing.assert_array_equal(t.amax((0, 1)).numpy(), a.max((0, 1)))
    assert t.argmax().item() == 23
    np.testing.assert_array_equal(t.argmax(1).numpy(), a.argmax(1))
    assert hp.tensor([1, 2]).sum().dtype == hp.int64
    np.testing.assert_allclose(t.softmax(-1).numpy().sum(-1), 1, rtol=1e-6)
    np.testing.assert_allclose(t.log_softmax(0).exp().numpy().sum(0), 1, rtol=1e-6)
    with pytest.raises(RuntimeError, match="mean"):
        hp.tensor([1, 2]).mean()
    np.testing.assert_array_equal(t.clamp(2, 5).numpy(), a.clip(2, 5))
    np.testing.assert_array_equal(hp.max(t, 1)[0].numpy(), a.max(1))
    np.testing.assert_array_equal(hp.tensor([1.0, -2.0]).abs().numpy(), [1.0, 2.0])


def test_masked_fill_and_errors():
    x = hp.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = x.masked_fill(hp.tensor([True, False]), float("-inf"))
    np.testing.assert_array_equal(out.numpy(), [[-np.inf, 2], [-np.inf, 4]])
    with pytest.raises(RuntimeError, match="bool"):
        x.masked_fill(hp.tensor([1, 0]), 0.0)


# -- shape ops ---------------------------------------------------------------------------------------------
def test_views_share_memory():
    base = hp.arange(12, dtype=hp.float32)
    v = base.view(3, 4)
    t = v.transpose(0, 1)
    s = v[1:, ::2]
    with hp.no_grad():
        base.mul_(2)
    assert v[1, 1].item() == 10 and t[1, 1].item() == 10 and s[0, 0].item() == 8
    for piece in v.split(2, dim=1):
        assert np.shares_memory(piece.numpy(), base.numpy())
    assert np.shares_memory(v.permute(1, 0).numpy(), base.numpy())
    assert np.shares_memory(v.reshape(2, 6).numpy(), base.numpy())


def test_shape_ops_results():
    x = hp.zeros(2, 3, 4)
    assert x.reshape(-1, 4).shape == (6, 4)
    assert x.view(6, -1).shape == (6, 4)
    assert x.permute(2, 0, 1).shape == (4, 2, 3)
    assert x.unsqueeze(1).shape == (2, 1, 3, 4) and x.unsqueeze(-1).shape == (2, 3, 4, 1)
    assert hp.zeros(1, 3, 1).squeeze().shape == (3,) and hp.zeros(1, 3, 1).squeeze(0).shape == (3, 1)
    assert x.flatten().shape == (24,) and x.flatten(1).shape == (2, 12)
    assert hp.zeros(3, 1).expand(2, 3, 4).shape == (2, 3, 4)
    assert [p.shape[0] for p in hp.zeros(5).chunk(3)] == [2, 2, 1]
    assert [p.shape[0] for p in hp.zeros(6).chunk(4)] == [2, 2, 2]
    assert [p.shape[1] for p in x.split([1, 2], 1)] == [1, 2]
    assert len(x.unbind(2)) == 4 and x.unbind(2)[0].shape == (2, 3)
    assert x.size() == (2, 3, 4) and x.size(-1) == 4 and x.dim() == 3 and x.numel() == 24
    assert x.shape.numel() == 24
    with pytest.raises(RuntimeError, match="view"):
        x.transpose(0, 2).view(-1)
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        x.reshape(5, -1)
    with pytest.raises(RuntimeError, match="expanded size"):
        hp.zeros(3, 2).expand(3, 4)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.sum(3)


def test_indexing():
    a = np.arange(20.0).reshape(4, 5)
    t = hp.tensor(a)
    np.testing.assert_array_equal(t[1].numpy(), a[1])
    np.testing.assert_array_equal(t[:, 1:3].numpy(), a[:, 1:3])
    np.testing.assert_array_equal(t[..., -1].numpy(), a[..., -1])
    np.testing.assert_array_equal(t[None, 1].numpy(), a[None, 1])
    np.testing.assert_array_equal(t[hp.tensor([3, 0, 3])].numpy(), a[[3, 0, 3]])
    np.testing.assert_array_equal(t[hp.tensor([0, 1]), hp.tensor([4, 2])].numpy(), a[[0, 1], [4, 2]])
    np.testing.assert_array_equal(t[t > 10].numpy(), a[a > 10])
    np.testing.assert_array_equal(t[[1, 2]].numpy(), a[[1, 2]])
    with pytest.raises(IndexError, match="float"):
        t[hp.tensor([0.0, 1.0])]
    with hp.no_grad():
        t[0] = 0.0
        t[t > 15] = -1.0
    assert t[0].sum().item() == 0 and (t.numpy() == -1).sum() == 4


# -- conversion --------------------------------------------------------------------------------------
def test_to_and_casts():
    x = hp.tensor([1.5, 2.5])
    assert x.to(hp.float64).dtype == hp.float64
    assert x.to(dtype=hp.float16).dtype == hp.float16
    assert x.to("cpu") is x and x.cpu() is x
    assert x.to("cpu", hp.int64).dtype == hp.int64
    assert x.half().dtype == hp.float16 and x.bfloat16().dtype == hp.bfloat16
    assert x.half().float().dtype == hp.float32 and x.double().dtype == hp.float64
    assert x.long().dtype == hp.int64 and x.int().dtype == hp.int32 and x.bool().dtype == hp.bool
    assert x.type_as(hp.zeros(1, dtype=hp.float64)).dtype == hp.float64
    assert x.to(hp.zeros(1, dtype=hp.float16)).dtype == hp.float16
    assert x.to("float64").dtype == hp.float64
    m = x.to("meta")
    assert m.device == "meta" and m.shape == (2,)
    with pytest.raises(RuntimeError, match="needs (CuPy|a CUDA GPU)"):
        x.cuda()
    with pytest.raises(ValueError, match="tpu"):
        x.to("tpu")


def test_numpy_item_tolist_array():
    s = hp.tensor([1.0, 2.0]).sum()
    assert isinstance(s.numpy(), np.ndarray) and s.numpy().shape == ()  # reductions give 0-d arrays
    with hp.no_grad():
        s.add_(1)
    assert s.item() == 4.0
    x = hp.tensor([[1.0, 2.0]])
    assert x.numpy() is x._data
    assert x.tolist() == [[1.0, 2.0]] and x[0, 1].item() == 2.0
    assert isinstance(hp.tensor([3]).item(), int)
    np.testing.assert_array_equal(np.asarray(x), [[1, 2]])
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    y = hp.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        y.numpy()
    assert y.detach().numpy()[0] == 1.0
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        x.item()
    assert hp.tensor([1.0, 2.0], dtype=hp.bfloat16).tolist() == [1.0, 2.0]


def test_python_protocols():
    x = hp.tensor([1.0, 2.0, 3.0])
    assert len(x) == 3
    assert [v.item() for v in x] == [1.0, 2.0, 3.0]
    assert bool(hp.tensor([1.0])) and not bool(hp.tensor(0.0))
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x)
    s = {x, hp.tensor([1.0, 2.0, 3.0])}
    assert len(s) == 2 and x in s
    assert float(hp.tensor(2.5)) == 2.5 and int(hp.tensor(3)) == 3
    assert [10, 20, 30][hp.tensor(1)] == 20
    r = repr(hp.tensor([1.0, 2.0], requires_grad=True))
    assert r == "tensor([1., 2.], requires_grad=True)"
    assert repr(hp.tensor([1, 2])) == "tensor([1, 2])"
    assert "dtype=hp.float64" in repr(hp.tensor([0.25], dtype=hp.float64))
    assert "grad_fn=<MulBackward>" in repr(hp.tensor([1.0], requires_grad=True) * 2)


def test_metadata_helpers():
    x = hp.zeros(4, 5, dtype=hp.float16)
    assert x.element_size() == 2 and x.nbytes == 40 and x.itemsize == 2
    assert x.is_contiguous() and not x.t().is_contiguous()
    assert x.data_ptr() == x.numpy().ctypes.data
    assert x[1].data_ptr() == x.data_ptr() + 10
    assert x.stride() == (5, 1) and x.t().stride() == (1, 5)
    n = x.new_zeros(2, 3)
    assert n.shape == (2, 3) and n.dtype == hp.float16 and not n.requires_grad
    assert x.new_ones((2,)).numpy().sum() == 2
    assert x.new_empty((3,)).shape == (3,)
    assert (x.new_full((2,), 7.0).numpy() == 7).all()
    assert x.new_zeros(2, dtype=hp.int64).dtype == hp.int64
    assert x.device == hp.device("cpu") and x.device == "cpu" and not x.is_cuda


def test_data_property():
    p = hp.ones(2, requires_grad=True)
    d = p.data
    assert not d.requires_grad and np.shares_memory(d.numpy(), p.detach().numpy())
    p.data = hp.zeros(3)
    assert p.shape == (3,) and p.requires_grad


# -- in-place ops --------------------------------------------------------------------------------------
def test_inplace_ops_values():
    with hp.no_grad():
        x = hp.tensor([1.0, 2.0, 3.0])
        x.add_(hp.tensor([1.0, 1.0, 1.0]), alpha=2)
        np.testing.assert_array_equal(x.numpy(), [3, 4, 5])
        x.mul_(2).sub_(1)
        np.testing.assert_array_equal(x.numpy(), [5, 7, 9])
        x.addcmul_(hp.tensor([1.0, 2.0, 3.0]), hp.tensor([2.0, 2.0, 2.0]), value=0.5)
        np.testing.assert_array_equal(x.numpy(), [6, 9, 12])
        x.addcdiv_(hp.tensor([6.0, 9.0, 12.0]), hp.tensor([3.0, 3.0, 3.0]), value=-1)
        np.testing.assert_array_equal(x.numpy(), [4, 6, 8])
        x.lerp_(hp.tensor([0.0, 0.0, 0.0]), 0.25)
        np.testing.assert_array_equal(x.numpy(), [3, 4.5, 6])
        x.clamp_(4, 5)
        np.testing.assert_array_equal(x.numpy(), [4, 4.5, 5])
        x.copy_(hp.tensor([1, 2, 3]))  # casts and keeps dtype
        assert x.dtype == hp.float32 and x.tolist() == [1, 2, 3]
        x.copy_(hp.tensor(9.0))  # broadcasts
        assert x.tolist() == [9, 9, 9]
        x.fill_(2).div_(4)
        assert x.tolist() == [0.5] * 3
        x.zero_()
        assert x.tolist() == [0] * 3
        x += 1
        assert x.tolist() == [1] * 3


def test_logical_and_inplace_as_pytorch():
    """PyTorch: in-place logical_and; nonzero is True; the result is written as 1/0 in self's dtype."""
    a = np.array([[0.0, 1.5, -2.0, np.nan], [3.0, 0.0, 0.0, 1.0]], np.float32)
    b = np.array([2, 0, 7, 1], np.int64)  # broadcasts over the rows of a
    for dtype in (np.bool_, np.int64, np.int32, np.float32, np.float64, hp.bfloat16):
        data = a if np.dtype(dtype).kind == "f" or dtype == hp.bfloat16 else np.nan_to_num(a, nan=5.0)
        x = hp.tensor(data, dtype=dtype)
        view = x[0]
        out = x.logical_and_(hp.tensor(b))
        expected = np.logical_and(data != 0, b != 0).astype(dtype)
        assert out is x and x.dtype == dtype and x.shape == (2, 4)
        np.testing.assert_array_equal(x.numpy(), expected)
        np.testing.assert_array_equal(view.numpy(), expected[0])  # written in place: views see it
    m = hp.tensor([True, True, False])
    m.logical_and_(hp.tensor([True, False, False]))
    assert m.tolist() == [True, False, False]
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        hp.tensor([True, True, True]).logical_and_(hp.ones(2, 3, dtype=hp.bool))
    with pytest.raises(TypeError, match="must be Tensor, not int"):
        hp.tensor([1, 0]).logical_and_(1)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        hp.ones(2, requires_grad=True).logical_and_(hp.ones(2))


def test_inplace_on_leaf_requiring_grad_raises():
    w = hp.ones(3, requires_grad=True)
    for op in (lambda: w.add_(1), lambda: w.mul_(2), lambda: w.zero_(), lambda: w.copy_(hp.zeros(3))):
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            op()
    with hp.no_grad():
        w.add_(1)  # optimizers step under no_grad
    assert w.tolist() == [2, 2, 2]
    y = w * 1
    y += 1  # rebinds to the recorded out-of-place result
    y.sum().backward()
    assert w.grad.tolist() == [1, 1, 1]


# -- meta device ---------------------------------------------------------------------------------------
def test_meta_tensors():
    m = hp.empty(1000, 1000, device="meta")
    assert m.device == "meta" and m.is_meta and m.shape == (1000, 1000) and m.dtype == hp.float32
    assert m._data.strides == (0, 0)
    with hp.device("meta"):
        z = hp.zeros(64, 64)
        r = hp.randn(8)
    assert z.is_meta and r.is_meta and hp.zeros(2).device == "cpu"
    v = m.view(10, -1).transpose(0, 1)[2:5]
    assert v.is_meta and v.shape == (3, 10) and v._data.strides == (0, 0)
    for piece in m.chunk(4):
        assert piece.is_meta and piece.shape == (250, 1000)
    y = (m * 2 + 1) @ hp.empty(1000, 3, device="meta")
    assert y.is_meta and y.shape == (1000, 3)
    assert m.to(hp.float16).is_meta and m.to(hp.float16).dtype == hp.float16
    with hp.no_grad():
        assert m.normal_() is m and m.zero_() is m
    with pytest.raises(RuntimeError, match="meta"):
        m.numpy()
    assert "meta" in repr(m)


def test_format_of_a_scalar_tensor_is_its_number_and_other_tensors_refuse_a_spec():
    t = hp.tensor([3.0, 4.0])
    assert f"{t[0] / t[1]:.3f}" == "0.750" and "{:>5d}".format(hp.tensor(7)) == "    7"
    assert f"{hp.tensor(2.5)}" == "2.5"  # an empty spec: str(item()), as PyTorch
    assert f"{t}" == str(t)
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{t:.2f}"


def test_mod_and_floordiv_operators_are_pytorch_remainder_and_floor_divide():
    x = hp.tensor([3.5, -1.25, 7.0], requires_grad=True)
    (x % 2.0).sum().backward()  # d/dx remainder(x, c) = 1: the operator used to drop the graph
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(3, np.float32))
    a = np.array([3, -7, 4, -8])
    t = hp.tensor(a)
    for got, want in (((t // 3), a // 3), ((t % 3), a % 3), ((9 % t), 9 % a), ((9 // t), 9 // a),
                      ((t % -3), a % -3)):
        assert got.dtype == hp.int64
        np.testing.assert_array_equal(got.numpy(), want)
    f = np.array([3.5, -7.25], np.float32)
    np.testing.assert_array_equal((hp.tensor(f) // 2).numpy(), f // 2)
    np.testing.assert_array_equal((2.0 % hp.tensor(f)).numpy(), np.float32(2.0) % f)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        t % 0
