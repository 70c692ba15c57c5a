"""Constants (inf, nan, pi, e) and finfo/iinfo against NumPy and PyTorch's documented values."""
import math

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp


# -- constants, finfo, iinfo -------------------------------------------------------------------------------
def test_constants():
    assert hp.inf == math.inf and math.isnan(hp.nan) and hp.pi == math.pi and hp.e == math.e
    assert hp.newaxis is None and hp.ones(2, 3)[:, hp.newaxis].shape == (2, 1, 3)


@pytest.mark.parametrize("dt,bits,eps,res", [(hp.float32, 32, 2.0 ** -23, 1e-6), (hp.float64, 64, 2.0 ** -52, 1e-15),
                                             (hp.float16, 16, 2.0 ** -10, 1e-3), (hp.bfloat16, 16, 2.0 ** -7, 0.01)])
def test_finfo(dt, bits, eps, res):
    f = hp.finfo(dt)
    ref = ml_dtypes.finfo(dt) if dt == hp.bfloat16 else np.finfo(dt)
    assert (f.bits, f.eps, f.resolution) == (bits, eps, res)
    assert f.max == float(ref.max) and f.min == -f.max and f.tiny == f.smallest_normal == float(ref.smallest_normal)
    assert f.dtype == ("bfloat16" if dt == hp.bfloat16 else str(dt)) and "finfo(" in repr(f)
    x = hp.zeros(2, dtype=dt).masked_fill(hp.tensor([True, False]), f.min)  # an attention mask's fill value
    assert x.dtype == dt and float(x[0]) == f.min


def test_finfo_default_and_iinfo():
    assert hp.finfo() == hp.finfo(hp.float32) and hp.finfo("float16").bits == 16
    for dt in (hp.int8, hp.int16, hp.int32, hp.int64, hp.uint8):
        i = hp.iinfo(dt)
        assert (i.min, i.max, i.bits, i.dtype) == (np.iinfo(dt).min, np.iinfo(dt).max, np.iinfo(dt).bits, str(dt))
    with pytest.raises(TypeError, match="requires a floating point"):
        hp.finfo(hp.int32)
    with pytest.raises(TypeError, match="requires an integer"):
        hp.iinfo(hp.float32)
    with pytest.raises(TypeError, match="requires an integer"):
        hp.iinfo(hp.bool)
