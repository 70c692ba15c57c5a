"""nn.Module.load_state_dict(sd, strict=True, assign=False) as PyTorch's: assign, ndarrays, meta, extra state."""
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn


def _lin(seed=0):
    hp.manual_seed(seed)
    return nn.Linear(3, 2)


def test_numpy_arrays_load_as_tensors_do():
    m = _lin()
    w = np.arange(6, dtype=np.float64).reshape(2, 3)  # another dtype: copied and cast like a tensor
    b = np.array([1.0, -1.0], dtype=np.float32)
    res = m.load_state_dict({"weight": w, "bias": b})
    assert list(res.missing_keys) == [] and list(res.unexpected_keys) == []
    assert m.weight.dtype == hp.float32 and isinstance(m.weight, nn.Parameter)
    np.testing.assert_array_equal(m.weight.detach().numpy(), w.astype(np.float32))
    np.testing.assert_array_equal(m.bias.detach().numpy(), b)
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        m.load_state_dict({"weight": np.zeros((3, 2)), "bias": b})


def test_assign_replaces_parameters_and_keeps_requires_grad():
    m = _lin()
    m.bias.requires_grad_(False)
    new_w = hp.randn(2, 3)
    new_b = nn.Parameter(hp.randn(2))  # a Parameter: used as is, requires_grad set to the module's
    m.load_state_dict({"weight": new_w, "bias": new_b}, assign=True)
    assert isinstance(m.weight, nn.Parameter) and m.weight._data is new_w._data and m.weight.requires_grad
    assert m.bias is new_b and not m.bias.requires_grad
    arr = np.ones((2, 3), np.float32)
    m.load_state_dict({"weight": arr, "bias": np.zeros(2, np.float32)}, assign=True)
    assert isinstance(m.weight, nn.Parameter) and m.weight._data is arr


def test_strict_and_non_strict_keys():
    m = _lin()
    sd = m.state_dict()
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "bias"'):
        m.load_state_dict({"weight": sd["weight"]})
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "extra"'):
        m.load_state_dict({**sd, "extra": hp.zeros(1)})
    res = m.load_state_dict({"weight": sd["weight"], "extra": hp.zeros(1)}, strict=False)
    assert list(res.missing_keys) == ["bias"] and list(res.unexpected_keys) == ["extra"]
    with pytest.raises(RuntimeError, match="expected hpcfsdp.Tensor"):
        m.load_state_dict({**sd, "bias": [1.0, 2.0]})


def test_one_element_vector_loads_into_a_scalar():
    m = nn.Module()
    m.register_buffer("s", hp.tensor(np.float32(0.0)))
    m.load_state_dict({"s": hp.tensor(np.array([3.0], np.float32))})
    assert m.s.ndim == 0 and float(m.s) == 3.0


def test_copy_into_meta_warns_and_assign_materialises():
    with hp.device("meta"):
        m = nn.Linear(3, 2)
    sd = _lin().state_dict()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m.load_state_dict(sd)
    assert any("copying from a non-meta parameter" in str(r.message) and "assign=True" in str(r.message) for r in rec)
    assert m.weight.device == "meta"
    m.load_state_dict(sd, assign=True)
    assert m.weight.device == "cpu"
    np.testing.assert_array_equal(m.weight.detach().numpy(), sd["weight"].numpy())


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.count = 0

    def get_extra_state(self):
        return {"count": self.count}

    def set_extra_state(self, state):
        self.count = state["count"]


def test_extra_state_round_trips():
    a = _Counter()
    a.count = 7
    sd = a.state_dict()
    assert sd["_extra_state"] == {"count": 7}
    b = _Counter()
    b.load_state_dict(sd)
    assert b.count == 7
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "_extra_state"'):
        b.load_state_dict({k: v for k, v in sd.items() if k != "_extra_state"})
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "lin._extra_state"'):
        b.load_state_dict({**sd, "lin._extra_state": 1})
