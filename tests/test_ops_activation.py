"""Activation ops on Tensors (softmax, log_softmax): gradients by finite differences."""

import pytest

from tests._gradcheck import gradcheck, rand


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_grad(rng, name, dim):
    a = rand(rng, 3, 5, layout="t")
    gradcheck(lambda x: getattr(x, name)(dim), [a])
