"""Conversions: dtype casts and .to(), with gradients through the cast."""

import numpy as np

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
