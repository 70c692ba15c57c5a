"""The torch.* function forms of in-place ops (hp.exp_(t) is t.exp_()): each returns its input, changed in place, and
refuses a non-Tensor input with PyTorch's TypeError."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp._tensor_methods.inplace_functions import INPLACE_FUNCTIONS

ARGS = {"clamp_": (-0.5, 0.5), "clip_": (-0.5, 0.5), "clamp_max_": (0.2,), "clamp_min_": (0.2,), "fill_": (3.0,),
        "xlogy_": (2.0,)}
UNIT = ("acos_", "arccos_", "asin_", "arcsin_", "atanh_", "arctanh_", "logit_")  # defined on (-1, 1) / (0, 1)


@pytest.mark.parametrize("name", [n for n in INPLACE_FUNCTIONS if n != "addmv_"])
def test_function_form_is_the_method(name):
    base = np.array([0.25, 0.75]) if name in UNIT else np.array([1.25, 2.5])
    t, ref = hp.tensor(base), hp.tensor(base)
    args = ARGS.get(name, ())
    assert getattr(hp, name)(t, *args) is t
    np.testing.assert_array_equal(t.numpy(), getattr(ref, name)(*args).numpy())
    assert not np.array_equal(t.numpy(), base) or name in ("relu_", "abs_", "clamp_min_", "nan_to_num_")  # changed
    with pytest.raises(TypeError, match="must be Tensor"):
        getattr(hp, name)(1.0, *args)


def test_addmv_and_keyword_arguments():
    y = hp.zeros(2)
    assert hp.addmv_(y, hp.ones(2, 3), hp.ones(3), beta=0.0, alpha=2.0) is y and y.tolist() == [6.0, 6.0]
    assert hp.round_(hp.tensor([1.26]), decimals=1).tolist() == pytest.approx([1.3])
    assert hp.nan_to_num_(hp.tensor([float("nan")]), nan=7.0).tolist() == [7.0]
