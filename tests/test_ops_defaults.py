"""The default dtype, print options and dtype queries (set_default_dtype, set_printoptions, result_type, can_cast),
asarray, scalar_tensor and the constructors logspace, randint_like and the signal windows, against NumPy float64."""
import numpy as np
import pytest

import hpcfsdp as hp


@pytest.fixture
def float64_default():
    hp.set_default_dtype(hp.float64)
    yield
    hp.set_default_dtype(hp.float32)


def test_set_default_dtype_reaches_factories_data_promotion_and_repr(float64_default):
    assert hp.get_default_dtype() == hp.float64
    assert hp.tensor([1.0, 2.0]).dtype == hp.float64 and hp.zeros(2).dtype == hp.float64
    assert hp.rand(2).dtype == hp.float64 and hp.arange(3.0).dtype == hp.float64 and hp.full((2,), 1.5).dtype == hp.float64
    assert (hp.tensor([1]) * 0.5).dtype == hp.float64 and hp.tensor([4]).sqrt().dtype == hp.float64
    assert hp.tensor([1], dtype=hp.int64).dtype == hp.int64 and hp.Tensor([1]).dtype == hp.float64
    assert "dtype" not in repr(hp.tensor([1.0])) and "dtype=hp.float32" in repr(hp.tensor([1.0], dtype=hp.float32))


def test_set_default_dtype_refuses_non_floating():
    with pytest.raises(TypeError, match="only floating-point types"):
        hp.set_default_dtype(hp.int64)
    assert hp.get_default_dtype() == hp.float32 and hp.tensor([1.0]).dtype == hp.float32


def test_set_printoptions():
    try:
        hp.set_printoptions(precision=2)
        assert repr(hp.tensor([1.123456, 2.0])) == "tensor([1.12, 2.00])"
        hp.set_printoptions(profile="default", sci_mode=True)
        assert "e+00" in repr(hp.tensor([1.5, 2.0]))
        hp.set_printoptions(profile="default", threshold=5, edgeitems=2)
        r = repr(hp.arange(10.0))
        assert "..." in r and "8." in r and "5." not in r
        hp.set_printoptions(profile="default", linewidth=20)
        assert repr(hp.arange(10.0)).count("\n") >= 2
        hp.set_printoptions(profile="full")
        assert "..." not in repr(hp.arange(2000.0))
    finally:
        hp.set_printoptions(profile="default")
    assert repr(hp.tensor([1.123456, 2.0])) == "tensor([1.1235, 2.0000])"


def test_result_type_and_can_cast():
    assert hp.result_type(hp.tensor([1]), 1.0) == hp.float32
    assert hp.result_type(2, 3.0) == hp.float32 and hp.result_type(2, 3) == hp.int64 and hp.result_type(True, False) == hp.bool
    assert hp.result_type(hp.tensor(1.0, dtype=hp.float64), hp.tensor([1], dtype=hp.int32)) == hp.float64
    assert hp.result_type(hp.tensor([1], dtype=hp.int8), hp.tensor(1000)) == hp.int8  # a 0-d tensor: same category
    assert hp.result_type(hp.tensor([1], dtype=hp.int8), hp.tensor([1000])) == hp.int64
    assert not hp.can_cast(hp.float64, hp.int32) and not hp.can_cast(hp.int32, hp.bool)
    assert hp.can_cast(hp.bool, hp.int8) and hp.can_cast(hp.float64, hp.float16) and hp.can_cast(hp.int64, hp.float16)


def test_asarray_shares_or_copies():
    a = np.arange(3.0)
    t = hp.asarray(a)
    a[0] = 9
    assert t.dtype == hp.float64 and t.tolist() == [9.0, 1.0, 2.0]
    c = hp.asarray(a, copy=True)
    a[1] = 7
    assert c.tolist() == [9.0, 1.0, 2.0]
    with pytest.raises(ValueError):
        hp.asarray(a, dtype=hp.float32, copy=False)
    x = hp.ones(2)
    assert hp.asarray(x) is x and hp.asarray(x, copy=True) is not x
    assert hp.asarray(x, dtype=hp.float64).dtype == hp.float64
    assert hp.asarray([1.0, 2.0], requires_grad=True).requires_grad
    with pytest.raises(RuntimeError, match="floating point"):
        hp.asarray([1, 2], requires_grad=True)
    assert hp.asarray(3.5).dtype == hp.float32 and hp.asarray(3.5).ndim == 0


def test_scalar_tensor():
    for s in (3, True, 2.5):
        t = hp.scalar_tensor(s)
        assert t.ndim == 0 and t.dtype == hp.float32 and t.item() == float(s)
    assert hp.scalar_tensor(3, dtype=hp.int64).dtype == hp.int64


def test_logspace_and_randint_like():
    np.testing.assert_allclose(hp.logspace(0, 2, 3).numpy(), [1, 10, 100], rtol=1e-6)
    np.testing.assert_allclose(hp.logspace(-1, 1, 5, base=2, dtype=hp.float64).numpy(), 2.0 ** np.linspace(-1, 1, 5))
    assert hp.logspace(0, 2, 3, base=2, dtype=hp.int64).tolist() == [1, 2, 4]
    r = hp.randint_like(hp.zeros(1000), 5)
    assert r.dtype == hp.float32 and r.min().item() >= 0 and r.max().item() <= 4
    r = hp.randint_like(hp.zeros(1000, dtype=hp.int64), 2, 5)
    assert r.dtype == hp.int64 and set(r.tolist()) == {2, 3, 4}


@pytest.mark.parametrize("name,fn", [
    ("hann_window", lambda k, m: 0.5 - 0.5 * np.cos(2 * np.pi * k / m)),
    ("hamming_window", lambda k, m: 0.54 - 0.46 * np.cos(2 * np.pi * k / m)),
    ("blackman_window", lambda k, m: 0.42 - 0.5 * np.cos(2 * np.pi * k / m) + 0.08 * np.cos(4 * np.pi * k / m)),
    ("bartlett_window", lambda k, m: 1 - np.abs(2 * k / m - 1)),
])
def test_windows(name, fn):
    f = getattr(hp, name)
    n = 7
    np.testing.assert_allclose(f(n, dtype=hp.float64).numpy(), fn(np.arange(n), n), atol=1e-12)  # periodic default
    np.testing.assert_allclose(f(n, periodic=False, dtype=hp.float64).numpy(), fn(np.arange(n), n - 1), atol=1e-12)
    assert f(n).dtype == hp.float32 and f(1).tolist() == [1.0] and f(0).shape == (0,)
    with pytest.raises(RuntimeError, match="floating point"):
        f(5, dtype=hp.int64)
