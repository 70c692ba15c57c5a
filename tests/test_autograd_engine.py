"""The backward engine: accumulation, hooks, callbacks, custom Functions, freeing saved values."""
import gc
import weakref

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.autograd import Function
from hpcfsdp.autograd.engine import is_in_backward, queue_callback


def leaf(*shape, seed=0):
    return hp.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


def test_accumulates_into_existing_grad_in_place():
    x = leaf(3)
    (x * 2).sum().backward()
    g = x.grad
    (x * 3).sum().backward()
    assert x.grad is g  # accumulated in place, as PyTorch without create_graph
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0, 5.0])


def test_grads_of_two_leaves_never_share_memory():
    x, y = leaf(4), leaf(4, seed=1)
    (x + y).sum().backward()
    x.grad.add_(1.0)
    np.testing.assert_array_equal(y.grad.numpy(), np.ones(4))
    z = leaf(2, 3)
    w = z.expand(2, 3)  # broadcast view gradient must become an owned writeable buffer
    (w * 1.0).sum().backward()
    z.grad.zero_()
    assert z.grad.numpy().flags.writeable


def test_same_leaf_used_twice_and_diamond():
    x = leaf(3)
    a = x * 2
    b = x.exp()
    ((a + b) * a).sum().backward()
    xv = x.detach().numpy()
    ref = (2 + np.exp(xv)) * 2 * xv + (2 * xv + np.exp(xv)) * 2
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-12)
    y = leaf(2)
    (y + y).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 2.0])


def test_non_scalar_needs_gradient():
    x = leaf(3)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(hp.tensor([1.0, 2.0, 3.0], dtype=hp.float64))
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0])


def test_backward_without_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        hp.ones(2).sum().backward()


def test_second_backward_raises_and_retain_graph_allows_it():
    x = leaf(3)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_saved_values_are_freed_after_backward():
    x = leaf(1000)
    y = x.exp()  # Exp saves its output array
    node = y.grad_fn
    saved = weakref.ref(node.out)
    z = y.sum()
    del y
    gc.collect()
    assert saved() is not None
    z.backward()
    gc.collect()
    assert saved() is None


def test_leaf_hook_changes_gradient_and_handle_removes_it():
    x = leaf(3)
    h = x.register_hook(lambda g: g * 10)
    x.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [10.0] * 3)
    h.remove()
    x.grad = None
    x.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0] * 3)


def test_nonleaf_hook_and_retain_grad():
    x = leaf(3)
    y = x * 2
    seen = []
    y.register_hook(lambda g: seen.append(g.numpy().copy()))
    y.register_hook(lambda g: g + 1)
    y.retain_grad()
    assert y.retains_grad
    (y * 3).sum().backward()
    np.testing.assert_array_equal(seen[0], [3.0] * 3)
    np.testing.assert_array_equal(y.grad.numpy(), [4.0] * 3)  # retain_grad sees the hooked gradient
    np.testing.assert_array_equal(x.grad.numpy(), [8.0] * 3)


def test_hook_on_tensor_without_grad_raises():
    with pytest.raises(RuntimeError):
        hp.ones(2).register_hook(lambda g: g)


def test_post_accumulate_grad_hook_order_and_argument():
    w1, w2, x = leaf(3), leaf(3, seed=1), hp.ones(3)
    order = []

    def hook(t):
        assert t.grad is not None
        order.append(t)

    w1.register_post_accumulate_grad_hook(hook)
    w2.register_post_accumulate_grad_hook(hook)
    h = w1 * x  # created first: its gradient is ready last
    out = (w2 * h).sum()
    out.backward()
    assert order[0] is w2 and order[1] is w1
    with pytest.raises(RuntimeError, match="non-leaf"):
        h.register_post_accumulate_grad_hook(hook)


def test_queue_callback_runs_after_backward_in_fifo_order():
    x = leaf(3)
    log = []

    def late():
        log.append("late")

    def hook(t):
        assert is_in_backward()
        queue_callback(lambda: log.append(("cb1", t.grad.numpy().sum())))
        queue_callback(lambda: (log.append("cb2"), queue_callback(late)))
        log.append("hook")

    x.register_post_accumulate_grad_hook(hook)
    (x * 2).sum().backward()
    assert log == ["hook", ("cb1", 6.0), "cb2", "late"]
    assert not is_in_backward()
    with pytest.raises(RuntimeError, match="backward"):
        queue_callback(lambda: None)


class MulConst(Function):
    @staticmethod
    def forward(ctx, x, c, y):
        ctx.save_for_backward(x, y)
        ctx.c = c
        return x * y * c

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, False, True)
        return g * y * ctx.c, None, g * x * ctx.c


def test_custom_function():
    x, y = leaf(3), leaf(3, seed=2)
    out = MulConst.apply(x, 2.5, y)
    assert out.grad_fn is not None and not out.is_leaf
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2.5 * y.detach().numpy())
    np.testing.assert_allclose(y.grad.numpy(), 2.5 * x.detach().numpy())
    with pytest.raises(RuntimeError, match="second time"):
        out.grad_fn.saved_tensors


class TwoOut(Function):
    @staticmethod
    def forward(ctx, x):
        idx = hp.tensor([0, 1])
        ctx.mark_non_differentiable(idx)
        return x * 2, x * 3, idx

    @staticmethod
    def backward(ctx, g1, g2, gi):
        assert g2 is not None  # unused output: zeros materialised
        np.testing.assert_array_equal(g2.numpy(), np.zeros(3))
        return g1 * 2 + g2 * 3


def test_custom_function_multi_output_and_non_differentiable():
    x = leaf(3)
    a, b, idx = TwoOut.apply(x)
    assert not idx.requires_grad and b.requires_grad
    a.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0] * 3)


class BadGrads(Function):
    @staticmethod
    def forward(ctx, x, y):
        return x + y

    @staticmethod
    def backward(ctx, g):
        return (g,)


def test_custom_function_wrong_number_of_grads():
    with pytest.raises(RuntimeError, match="incorrect number of gradients"):
        BadGrads.apply(leaf(2), leaf(2)).sum().backward()


def test_custom_function_returning_input_gets_new_tensor():
    class Ident(Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 5

    x = leaf(2)
    y = Ident.apply(x)
    assert y is not x and y.grad_fn is not None
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0])


def test_no_grad_modes():
    x = leaf(2)
    with hp.no_grad():
        assert not hp.is_grad_enabled()
        y = x * 2
        with hp.enable_grad():
            z = x * 2
    assert not y.requires_grad and y.grad_fn is None and z.requires_grad

    @hp.no_grad()
    def f(t):
        return t * 2

    assert not f(x).requires_grad and hp.is_grad_enabled()

    @hp.no_grad
    def g(t):
        return t * 2

    assert not g(x).requires_grad and hp.is_grad_enabled()
    with hp.inference_mode():
        assert not (x * 2).requires_grad
    with hp.no_grad(), hp.inference_mode(False):
        assert (x * 2).requires_grad

    @hp.inference_mode()
    def h(t):
        return t * 2

    assert not h(x).requires_grad and hp.is_grad_enabled()
    hp.set_grad_enabled(False)
    assert not hp.is_grad_enabled()
    hp.set_grad_enabled(True)
    with hp.set_grad_enabled(False):
        assert not (x * 1).requires_grad
    assert hp.is_grad_enabled()


def test_autograd_grad_returns_without_accumulating():
    x, y = leaf(3), leaf(3, seed=1)
    out = (x * y).sum()
    gx, gy = hp.autograd.grad(out, (x, y))
    assert x.grad is None and y.grad is None
    np.testing.assert_allclose(gx.numpy(), y.detach().numpy())
    np.testing.assert_allclose(gy.numpy(), x.detach().numpy())


def test_leaf_grad_dtype_follows_leaf():
    x = hp.ones(3, dtype=hp.float32, requires_grad=True)
    (x.double() * hp.ones(3, dtype=hp.float64)).sum().backward()
    assert x.grad.dtype == hp.float32


def test_deep_graph_no_recursion_limit():
    x = leaf(2)
    y = x
    for _ in range(5000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001 ** 5000] * 2, rtol=1e-9)


def test_grad_setter_validates_and_detach():
    x = leaf(2)
    with pytest.raises(RuntimeError, match="shape"):
        x.grad = hp.zeros(3, dtype=hp.float64)
    x.grad = hp.zeros(2, dtype=hp.float64)
    y = (x * 2).detach()
    assert y.is_leaf and not y.requires_grad
    with pytest.raises(RuntimeError, match="leaf"):
        (x * 2).requires_grad = False
    with pytest.raises(RuntimeError, match="floating point"):
        hp.tensor([1, 2]).requires_grad_()


def test_split_outputs_partially_used():
    x = leaf(6)
    a, _b, c = x.split(2)
    (a * 2 + c).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2, 2, 0, 0, 1, 1])


def test_custom_function_gradient_shapes_are_validated():
    class Expanding(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g.expand(4, *g.shape) * 1  # broadcasts to the input: summed down, as PyTorch

    class Wrong(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return hp.ones(7, dtype=hp.float64)

    x = leaf(3)
    Expanding.apply(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0, 4.0])
    with pytest.raises(RuntimeError, match="invalid gradient at index 0"):
        Wrong.apply(leaf(3)).sum().backward()
