"""Joining and combining tensors: hstack/vstack/row_stack/dstack/column_stack, tensordot, block_diag,
cartesian_prod, combinations, unravel_index, against NumPy float64 and finite-difference gradients."""
import itertools

import numpy as np
import pytest

import hpcfsdp as hp

from _gradcheck import gradcheck

RNG = np.random.default_rng(5)


def _t(a):
    return hp.tensor(np.asarray(a))


@pytest.mark.parametrize("name", ["hstack", "vstack", "row_stack", "dstack", "column_stack"])
@pytest.mark.parametrize("shapes", [[(3,), (3,)], [(2, 3), (2, 3)], [(2, 3, 2), (2, 3, 2)], [(), ()]])
def test_stacks_match_numpy(name, shapes):
    arrays = [RNG.standard_normal(s) for s in shapes]
    ref = getattr(np, name if name != "row_stack" else "vstack")(arrays)
    out = getattr(hp, name)([_t(a) for a in arrays])
    np.testing.assert_array_equal(out.numpy(), ref)
    gradcheck(lambda *xs: getattr(hp, name)(list(xs)), [a.copy() for a in arrays])


def test_stacks_promote_and_refuse_empty():
    assert hp.vstack([hp.tensor([1, 2]), hp.tensor([3.0, 4.0])]).dtype == hp.float32
    with pytest.raises(RuntimeError, match="non-empty"):
        hp.hstack([])


@pytest.mark.parametrize("dims,sa,sb", [(2, (2, 3, 4), (3, 4, 5)), (0, (2, 3), (3, 4)), (1, (2, 3), (3, 4)),
                                        (([1, 0], [0, 1]), (3, 4, 2), (4, 3)), ((1, 0), (2, 3), (3, 4))])
def test_tensordot_matches_numpy(dims, sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    np.testing.assert_allclose(hp.tensordot(_t(a), _t(b), dims=dims).numpy(), np.tensordot(a, b, axes=dims),
                               rtol=1e-12)
    gradcheck(lambda x, y: hp.tensordot(x, y, dims=dims), [a, b])


def test_tensordot_errors():
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.tensordot(hp.ones(2, 3), hp.ones(3, 4, dtype=hp.float64), dims=1)
    with pytest.raises(RuntimeError, match="contracted dimensions need to match"):
        hp.tensordot(hp.ones(2, 3), hp.ones(4, 4), dims=1)


def test_block_diag():
    a, b, c = RNG.standard_normal(()), RNG.standard_normal(2), RNG.standard_normal((2, 2))
    ref = np.zeros((4, 5))
    ref[0, 0], ref[1, 1:3], ref[2:, 3:] = a, b, c
    np.testing.assert_array_equal(hp.block_diag(_t(a), _t(b), _t(c)).numpy(), ref)
    gradcheck(lambda *xs: hp.block_diag(*xs), [np.array(a), b, c])
    assert hp.block_diag().shape == (1, 0)
    assert hp.block_diag(hp.tensor([1]), hp.tensor([[2.0]])).dtype == hp.float32
    with pytest.raises(RuntimeError, match="2 or fewer dimensions"):
        hp.block_diag(hp.ones(2, 2, 2))


def test_cartesian_prod_and_combinations():
    a, b = [1, 2], [3, 4, 5]
    assert hp.cartesian_prod(hp.tensor(a), hp.tensor(b)).tolist() == [list(p) for p in itertools.product(a, b)]
    x = hp.tensor([1, 2])
    assert hp.cartesian_prod(x) is x
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.cartesian_prod(hp.tensor([1]), hp.tensor([1.0]))
    v = [1, 2, 3, 4]
    for r in (1, 2, 3):
        assert hp.combinations(hp.tensor(v), r).tolist() == [list(c) for c in itertools.combinations(v, r)]
        assert hp.combinations(hp.tensor(v), r, True).tolist() == [
            list(c) for c in itertools.combinations_with_replacement(v, r)]
    assert hp.combinations(hp.tensor(v), 0).shape == (0,) and hp.combinations(hp.tensor(v), 5).shape == (0, 5)
    gradcheck(lambda t: hp.combinations(t, 2), [RNG.standard_normal(4)])
    with pytest.raises(RuntimeError, match="1D vector"):
        hp.combinations(hp.ones(2, 2))


def test_unravel_index():
    idx = np.array([0, 4, 5, 3])
    out = hp.unravel_index(hp.tensor(idx), (2, 3))
    for o, r in zip(out, np.unravel_index(idx, (2, 3))):
        assert o.dtype == hp.int64 and o.tolist() == r.tolist()
    assert [o.item() for o in hp.unravel_index(hp.tensor(-1), (2, 3))] == [1, 2]  # from the end, as PyTorch
    assert [o.item() for o in hp.unravel_index(hp.tensor(5), 6)] == [5]
    with pytest.raises(TypeError, match="integer dtype"):
        hp.unravel_index(hp.tensor([1.0]), (2, 3))
