"""The simulated cupy.random: one generator per device, NumPy's PCG64 underneath (see cuda_sim)."""
from __future__ import annotations

import numpy as np

from ._sim_runtime import _cur_dev
from ._sim_surface import SimModule

__all__ = ["RandomState", "random", "wire"]

_KERNEL = []  # cuda_sim's kernel context (_Ctx): set by wire(), as cuda_sim builds on this module


def wire(kernel) -> None:
    """Draws become kernels of ``kernel(name)`` (``check(name)``, ``out(array, name)``): cuda_sim's _Ctx."""
    _KERNEL[:] = [kernel]


class RandomState:
    """cupy.random.RandomState: its draws are kernels on the current stream of the current device."""

    def __init__(self, seed=0):
        self._g = np.random.default_rng(seed)

    def _out(self, r, name):
        c = _KERNEL[0](name)
        c.check(name)
        return c.out(np.asarray(r), name)

    def standard_normal(self, size=None, dtype=float):
        return self._out(self._g.standard_normal(size, dtype=dtype), "random.standard_normal")

    def random_sample(self, size=None, dtype=float):
        return self._out(self._g.random(size, dtype=dtype), "random.random_sample")

    def randint(self, low, high=None, size=None, dtype=int):
        return self._out(self._g.integers(low, high, size=size, dtype=dtype), "random.randint")

    def permutation(self, n):
        return self._out(self._g.permutation(n), "random.permutation")

    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        return self._out(self._g.uniform(low, high, size).astype(dtype), "random.uniform")

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        return self._out(self._g.normal(loc, scale, size).astype(dtype), "random.normal")


_RS: dict[int, RandomState] = {}


def _get_random_state():
    d = _cur_dev()
    if d not in _RS:
        _RS[d] = RandomState(d)
    return _RS[d]


def _set_random_state(rs):
    _RS[_cur_dev()] = rs


def _seed(seed=None):
    _RS[_cur_dev()] = RandomState(seed)


random = SimModule("cupy.random")
random.get_random_state, random.set_random_state = _get_random_state, _set_random_state
random.seed = _seed
random.RandomState = RandomState
for _n in ["standard_normal", "random_sample", "randint", "permutation", "uniform", "normal"]:
    setattr(random, _n, (lambda n: lambda *a, **k: getattr(_get_random_state(), n)(*a, **k))(_n))
