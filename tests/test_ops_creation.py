"""Index-constructing functions (tril_indices, triu_indices)."""

import numpy as np

import hpcfsdp as hp
from tests._gradcheck import _np


def test_tril_triu_indices():
    for args in ((3, 3), (3, 4, 1), (4, 3, -1), (2, 5, -3)):
        r, c, *k = args
        for kind in ("tril", "triu"):
            got = getattr(hp, f"{kind}_indices")(*args)
            assert got.dtype == hp.int64
            np.testing.assert_array_equal(_np(got), np.stack(getattr(np, f"{kind}_indices")(r, k[0] if k else 0, c)))
    assert hp.tril_indices(3, 3, dtype=hp.int32).dtype == hp.int32
