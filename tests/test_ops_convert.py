"""Conversions: dtype casts and .to(), with gradients through the cast."""

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import gradcheck


def test_cast_and_to(rng):
    a = rng.standard_normal((3, 2))
    gradcheck(lambda x: x.to(hp.float32).to(hp.float64) * 2, [a], eps=1e-2, atol=1e-6)
    x = hp.tensor(a, dtype=hp.float32, requires_grad=True)
    y = x.double()
    y.sum().backward()
    assert x.grad.dtype == hp.float32
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((3, 2), np.float32))


def test_integer_casts_and_device_queries():
    x = hp.tensor([1.7, -2.0, 3.0])
    assert x.byte().dtype == hp.uint8 and x.char().dtype == hp.int8 and x.short().dtype == hp.int16
    assert x.short().tolist() == [1, -2, 3] and x.ndimension() == 1
    assert x.is_cpu and x.get_device() == -1 and hp.get_device(x) == -1 and not x.is_pinned()
    m = hp.empty(2, device="meta")
    assert not m.is_cpu and m.get_device() == -1
    y = hp.tensor([1.0], requires_grad=True) * 2
    d = hp.detach(y)
    assert not d.requires_grad and d.tolist() == [2.0]
    assert hp.detach_(y) is y and y.grad_fn is None


def test_pin_memory_needs_a_gpu():
    if hp.cuda.is_available():
        p = hp.tensor([1.0, 2.0]).pin_memory()
        assert p.is_pinned() and p.tolist() == [1.0, 2.0] and p.pin_memory() is p
    else:
        with pytest.raises(RuntimeError, match="accelerator"):
            hp.tensor([1.0]).pin_memory()
