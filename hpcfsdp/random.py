"""Random number generator state (torch.random): seeds, saved states, fork_rng, and the Generator class."""
import builtins
import contextlib
import secrets
from typing import Iterable, Optional

import numpy as np

from . import _backend, _normal_math
from ._tensor import Tensor

__all__ = ["Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
           "set_rng_state", "fork_rng"]

# [Note: RNG states]
# A state is a 1-D uint8 tensor, as PyTorch's, holding hpcfsdp's own bytes (not PyTorch's layout):
#   b"HPR" | version (1) | kind (1) | payload
# kind 0, a CPU generator: NumPy's PCG64 state (state, inc: 16 bytes each; has_uint32: 1; uinteger: 4),
#   then the generator's initial seed (8); all little-endian.
# kind 1, a CuPy generator: a seed (8), then the initial seed (8). cuRAND's state cannot be read back, so
#   reading the state of a CuPy generator *forks* it, as hpcfsdp.utils.checkpoint does: it draws a seed
#   from the generator and replaces the generator by a fresh one made from that seed. Setting the state
#   makes a fresh generator from the seed again, so set_state(get_state()) repeats the same next draws;
#   the stream after get_state() is the forked one, not the one the generator had before.
_MAGIC = b"HPR\x01"
_KIND_PCG64, _KIND_CUPY_SEED = 0, 1
_PCG64_BYTES = len(_MAGIC) + 1 + 16 + 16 + 1 + 4 + 8
_CUPY_BYTES = len(_MAGIC) + 1 + 8 + 8
_DEFAULT_SEED = 67280421310721  # PyTorch's for a new Generator


def _le(value: int, n: int) -> bytes:
    return builtins.int(value).to_bytes(n, "little")


def _state_tensor(raw: bytes) -> Tensor:
    return Tensor._wrap(np.frombuffer(raw, dtype=np.uint8).copy())


def _pcg64_state(rng: np.random.Generator, initial: int) -> Tensor:
    st = rng.bit_generator.state
    if st["bit_generator"] != "PCG64":
        raise RuntimeError(f"cannot save the state of a {st['bit_generator']} generator (PCG64 only)")
    raw = (_MAGIC + bytes([_KIND_PCG64]) + _le(st["state"]["state"], 16) + _le(st["state"]["inc"], 16)
           + bytes([st["has_uint32"]]) + _le(st["uinteger"], 4) + _le(initial, 8))
    return _state_tensor(raw)


def _state_bytes(new_state, kind: int) -> bytes:
    """Validate a state tensor and return its bytes."""
    if not isinstance(new_state, Tensor) or new_state.dtype != _backend.uint8:
        got = f"{type(new_state).__name__}" if not isinstance(new_state, Tensor) else f"a {new_state.dtype} Tensor"
        raise TypeError(f"RNG state must be a uint8 Tensor (hp.ByteTensor), got {got}")
    raw = _backend.to_numpy(new_state.detach()._data).reshape(-1).tobytes()
    size = _PCG64_BYTES if kind == _KIND_PCG64 else _CUPY_BYTES
    what = "a CPU" if kind == _KIND_PCG64 else "a CuPy (cuda)"
    if len(raw) != size or raw[:len(_MAGIC)] != _MAGIC or raw[len(_MAGIC)] != kind:
        found = (f"size to be {len(raw)}" if len(raw) != size else
                 "not to be an hpcfsdp state" if raw[:len(_MAGIC)] != _MAGIC else "to be of another device type")
        raise RuntimeError(f"Expected {what} hpcfsdp RNG state of size {size} but found the input RNG state {found}")
    return raw[len(_MAGIC) + 1:]


def _set_pcg64(rng: np.random.Generator, new_state) -> int:
    """Load a kind-0 state into ``rng`` in place; returns the saved initial seed."""
    p = _state_bytes(new_state, _KIND_PCG64)
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": builtins.int.from_bytes(p[0:16], "little"), "inc": builtins.int.from_bytes(p[16:32], "little")},
        "has_uint32": p[32], "uinteger": builtins.int.from_bytes(p[33:37], "little")}
    return builtins.int.from_bytes(p[37:45], "little")


def _cupy_fork_seed(rng) -> int:
    return builtins.int(rng.randint(0, 2 ** 31 - 1))


class Generator:
    """A random number generator of its own (torch.Generator), independent of the global seed: pass it as
    ``generator=`` to hp.rand, randn, randint, randperm, rand_like, randn_like and the nn.init functions.

    On "cpu" it is a NumPy PCG64 generator; on "cuda" a CuPy RandomState on its device (See [Note: RNG states]
    for what reading a CuPy generator's state does). A new generator is seeded with PyTorch's default seed.
    """

    def __init__(self, device="cpu") -> None:
        dev = _backend.to_device(device)
        if dev.type not in ("cpu", "cuda"):
            raise RuntimeError(f"Generator: device type '{dev.type}' has no random generator; expected cpu or cuda")
        if dev.type == "cuda" and dev.index is None:
            _backend._need_cupy()
            dev = _backend.device("cuda", _backend.current_cuda_device() or 0)
        self._device = dev
        self._rng = None
        self._seed = _DEFAULT_SEED
        self._reseed(_DEFAULT_SEED)

    def _reseed(self, value: int) -> None:
        if self._device.type == "cpu":
            self._rng = np.random.default_rng(value)
        else:
            cp = _backend._need_cupy()
            with cp.cuda.Device(self._device.index):
                self._rng = cp.random.RandomState(value)

    def _backend_rng(self, dev):
        """The NumPy/CuPy generator to draw from for a tensor on ``dev`` (See _backend.generator_for)."""
        if dev.type != "meta" and dev.type != self._device.type:
            raise RuntimeError(f"Expected a '{dev.type}' device type for generator but found '{self._device.type}'")
        return self._rng

    @property
    def device(self):
        """The device this generator draws for."""
        return self._device

    def manual_seed(self, seed) -> "Generator":
        """Seed the generator (PyTorch's range: [-2**63, 2**64); negative seeds wrap); returns the generator."""
        seed = builtins.int(seed)
        if not -(1 << 63) <= seed < (1 << 64):
            raise ValueError(f"Seed must be within the range [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff], "
                             f"got {seed}")
        self._seed = seed & ((1 << 64) - 1)
        self._reseed(self._seed)
        return self

    def seed(self) -> int:
        """Seed the generator from the operating system's entropy and return that seed."""
        value = secrets.randbits(63)
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        """The seed last given by manual_seed()/seed() (or restored by set_state())."""
        return self._seed

    def get_state(self) -> Tensor:
        """The generator's state as a uint8 tensor (See [Note: RNG states])."""
        if self._device.type == "cpu":
            return _pcg64_state(self._rng, self._seed)
        fork = _cupy_fork_seed(self._rng)
        self._reseed(fork)
        return _state_tensor(_MAGIC + bytes([_KIND_CUPY_SEED]) + _le(fork, 8) + _le(self._seed, 8))

    def set_state(self, new_state) -> "Generator":
        """Restore a state from get_state(); the next draws repeat those that followed it. Returns the generator."""
        if self._device.type == "cpu":
            self._seed = _set_pcg64(self._rng, new_state)
        else:
            p = _state_bytes(new_state, _KIND_CUPY_SEED)
            self._reseed(builtins.int.from_bytes(p[0:8], "little"))
            self._seed = builtins.int.from_bytes(p[8:16], "little")
        return self

    def __repr__(self) -> str:
        return f"<hpcfsdp.Generator device={self._device}>"


class _DefaultGenerator(Generator):
    """The global CPU generator (``default_generator``) seen through the Generator interface."""

    def __init__(self) -> None:
        self._device = _backend.device("cpu")

    @property
    def _rng(self):
        return _backend.generator()

    @property
    def _seed(self):
        return _backend._initial_seed

    @_seed.setter
    def _seed(self, value):
        _backend._initial_seed = value

    def _reseed(self, value: int) -> None:
        _backend._seed_cpu(value)


default_generator = _DefaultGenerator()
"""The generator hp.rand/randn/randint/randperm draw from on the CPU when given no ``generator=``."""


def manual_seed(seed) -> int:
    """Seed every generator hpcfsdp draws from by default: the CPU's and each CUDA device's (returns the seed)."""
    return _backend.manual_seed(seed)


def seed() -> int:
    """Seed every default generator from the operating system's entropy; returns that seed."""
    value = secrets.randbits(63)
    _backend.manual_seed(value)
    return value


def initial_seed() -> int:
    """The seed of the default CPU generator (0 until manual_seed() or seed() is called)."""
    return _backend._initial_seed


def get_rng_state() -> Tensor:
    """The default CPU generator's state as a uint8 tensor (See [Note: RNG states])."""
    return default_generator.get_state()


def set_rng_state(new_state) -> None:
    """Restore the default CPU generator's state from get_rng_state(): the next draws repeat."""
    default_generator.set_state(new_state)


def _cuda_device_indices(device_type: Optional[str]):
    if device_type not in (None, "cuda"):
        return []
    cp = _backend._try_cupy()
    if cp is None:
        return []
    try:
        return list(range(cp.cuda.runtime.getDeviceCount()))
    except Exception:  # no visible GPU
        return []


@contextlib.contextmanager
def fork_rng(devices: Optional[Iterable] = None, enabled: bool = True, _caller: str = "fork_rng",
             _devices_kw: str = "devices", device_type: Optional[str] = None):
    """Fork the default CPU generator and the CUDA devices' (all visible ones when ``devices`` is None): on exit
    they are back at their state at entry, whatever the block drew. ``enabled=False`` forks nothing.

    A CUDA device's generator is forked as in [Note: RNG states]: the draws after the block are those of the
    generator forked at entry.
    """
    if device_type is not None and device_type not in ("cpu", "cuda"):
        raise RuntimeError(f"{_caller}: device_type must be 'cuda' (or None), got {device_type!r}")
    if not enabled:
        yield
        return
    if devices is None:
        indices = _cuda_device_indices(device_type)
    else:
        indices = [d if isinstance(d, builtins.int) else _backend.to_device(d).index or 0 for d in devices]
    cpu_state = get_rng_state()
    seeds = {}
    if indices:
        cp = _backend._need_cupy()
        for idx in indices:
            with cp.cuda.Device(idx):
                seeds[idx] = _cupy_fork_seed(cp.random.get_random_state())
                cp.random.seed(seeds[idx])
    try:
        yield
    finally:
        set_rng_state(cpu_state)
        if seeds:
            cp = _backend._need_cupy()
            for idx, s in seeds.items():
                with cp.cuda.Device(idx):
                    cp.random.seed(s)


# [Note: Random values of a sharded tensor]
# An in-place random fill (nn.init.uniform_/normal_/trunc_normal_ and their users, Tensor.normal_/uniform_)
# takes the values of the whole tensor in C order, as for a plain tensor, and keeps those of the tensor's
# local piece: the fill goes through a sink, ``_sink(tensor, dtype)``. A plain tensor's sink is its whole flat
# array, filled by one draw. A sharded tensor (DTensor) gets its sink from the hook that
# hpcfsdp/distributed/tensor/_rules/random.py installs: it takes the draws in blocks of ``block`` values (so
# the whole tensor is never held) and keeps, from each, the values whose global flat index falls in the
# local piece (uniform and normal fills skip to them instead: [Note: Skipping to a shard's values]). Every rank
# sees the same stream, so a sharded parameter initialised from a seed equals the slice of the plain one
# initialised from that seed, and the generator ends where the plain fill leaves it.
# Drawing n values in blocks gives the values of one draw of n: NumPy's generators (and a CuPy RandomState
# within one block) continue their stream across calls.
_SHARDED_SINK = [None]


class _FlatSink:
    """The sink of a plain tensor: its whole flat array (See [Note: Random values of a sharded tensor])."""

    def __init__(self, tensor, dtype):
        arr = tensor._data
        self.shape = tuple(arr.shape)
        self.n = int(arr.size)
        self.block = max(self.n, 1)
        self._flat = _backend.array_module(arr).empty(self.n, dtype=dtype)

    def put_range(self, start, values):
        self._flat[start:start + values.shape[0]] = values

    def put_index(self, idx, values):
        self._flat[idx] = values

    def result(self):
        return self._flat.reshape(self.shape)


def _sink(tensor, dtype):
    """Where an in-place random fill of ``tensor`` puts the values of the whole tensor's stream."""
    hook = _SHARDED_SINK[0]
    if hook is not None and type(tensor) is not Tensor:
        sink = hook(tensor, dtype)
        if sink is not None:
            return sink
    return _FlatSink(tensor, dtype)


def _stream(sink, draw, transform=None, block=None):
    """Fill ``sink`` with ``draw((k,))`` for the whole tensor, block by block (``transform`` applied to each; ``block``
    values at a time, the sink's block if None)."""
    block = sink.block if block is None else block
    for start in range(0, sink.n, block):
        vals = draw((min(block, sink.n - start),))
        sink.put_range(start, vals if transform is None else transform(vals))
    return sink


# [Note: Skipping to a shard's values]
# U[0, 1) values from a NumPy Generator on PCG64 take a fixed share of its stream: a float64 one 64-bit draw, a
# float32 one 32-bit half (PCG64 hands out the low half of a draw, then the high half it kept). PCG64 is a
# counter-based generator in effect: ``advance(k)`` moves it past k draws in O(log k). So a sharded tensor's
# uniform fill positions a copy of the generator at each of its runs of the whole tensor's C-order values (runs
# closer than _GAP values are drawn as one span, cheaper than another jump) and draws only those; the
# generator then ends where the plain fill leaves it (advanced past every value, its kept half as the plain
# fill would leave it). Normal values take a fixed share too, by construction (See [Note: Normal values at
# fixed positions]): a span starting or ending inside a pair draws the partner's uniform as well. CuPy's
# generators (cuRAND cannot be advanced) are drawn whole, block by block, and kept where local (See [Note: Random
# values of a sharded tensor]).
_GAP = 1 << 14
_NORMAL_CHUNK = 1 << 16  # values a normal or transformed uniform fill draws at a time from a NumPy generator


def _pcg64(gen):
    return gen.bit_generator if isinstance(gen, np.random.Generator) and \
        isinstance(gen.bit_generator, np.random.PCG64) else None


def _positioned(state, j, half):
    """A Generator whose next U[0, 1) value is value ``j`` of a fill that starts from PCG64 ``state``."""
    bg = np.random.PCG64()
    if half:  # float32: 32-bit halves, the first from the kept one when there is one
        if state["has_uint32"]:
            if j == 0:
                bg.state = state
                return np.random.Generator(bg)
            j -= 1
        bg.state = {**state, "has_uint32": 0, "uinteger": 0}
        bg.advance(j // 2)
        gen = np.random.Generator(bg)
        if j % 2:
            gen.random(1, dtype=np.float32)  # the low half: the value wanted is the kept high half
        return gen
    bg.state = state
    bg.advance(j)
    st = bg.state
    bg.state = {**st, "has_uint32": state["has_uint32"], "uinteger": state["uinteger"]}  # 64-bit draws keep it
    return np.random.Generator(bg)


def _spans(runs):
    """The runs ``[a, b)`` merged where less than _GAP values apart."""
    spans = []
    for a, b in runs:
        if spans and a - spans[-1][1] < _GAP:
            spans[-1][1] = b
        elif b > a:
            spans.append([a, b])
    return spans


def _uniform_stream(sink, gen, dtype, draw, transform=None):
    """``_stream(sink, draw, transform)`` for ``draw``, U[0, 1) values of ``dtype`` from ``gen``: skipping to a sharded
    sink's runs where the generator allows (See [Note: Skipping to a shard's values])."""
    bg = _pcg64(gen)
    runs = getattr(sink, "runs", None)
    if bg is None or runs is None or np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        numpy_gen = isinstance(gen, (np.random.Generator, np.random.RandomState))  # its stream goes on across calls
        return _stream(sink, draw, transform, _NORMAL_CHUNK if numpy_gen and transform is not None else None)
    state, half = bg.state, np.dtype(dtype) == np.float32
    for a, b in _spans(runs()):
        g = _positioned(state, a, half)
        for start in range(a, b, sink.block):
            vals = g.random(min(sink.block, b - start), dtype=dtype)
            sink.put_range(start, vals if transform is None else transform(vals))
    bg.state = _positioned(state, sink.n, half).bit_generator.state
    return sink


# [Note: Normal values at fixed positions]
# NumPy's standard_normal (a ziggurat) takes a variable share of the stream, so no rank could tell where the
# values of its piece start without drawing everything before them. The normal fills (nn.init.normal_,
# kaiming_normal_, xavier_normal_, Tensor.normal_ and DTensor.normal_) therefore make value i of a tensor from
# float64 uniforms at fixed positions, by Box-Muller on pairs (hpcfsdp/_normal_math.py): values 2i and 2i + 1
# from uniforms 2i and 2i + 1, r = sqrt(-2 log(1 - u[2i])), t = 2 pi u[2i + 1], value 2i = r cos t, value
# 2i + 1 = r sin t, computed in float64 and rounded once to the tensor's dtype. A uniform is one 64-bit draw
# (whatever the dtype: float32 values get float64 arithmetic and no 32-bit halves), so a fill of n values
# takes exactly 2 * ceil(n / 2) draws (an odd n draws its last value's partner too), plain or sharded alike.
# Box-Muller is exact (not an approximation of the normal: only rounding), needs no rejection, and 1 - u lies
# in (0, 1], so u = 0 gives r = 0, never log(0); |values| stay below sqrt(2 * 53 ln 2) = 8.57. The polar method
# and the ziggurat reject, inverse-CDF costs a rational function per value: Box-Muller is the one of fixed share
# whose cost (log, sqrt, sin, cos per pair) is close to NumPy's own ziggurat. trunc_normal_ needs values in a
# window and takes the inverse CDF instead (one uniform per value, See [Note: ndtri]), as PyTorch does.
# The values differ from NumPy's standard_normal and from those hpcfsdp's normal fills gave before this
# scheme; hp.randn and hp.normal, which are no fills of a sharded tensor, keep NumPy's ziggurat.
def _normal_span(sink, gen, a, b, keep, dtype, chunk):
    """Put values [keep, b) of a normal fill into ``sink``, drawing from ``gen`` positioned at uniform ``a`` (even):
    the uniforms [a, b + b % 2), ``chunk`` (even) at a time."""
    stop = b + (b & 1)
    for start in range(a, stop, chunk):
        k = min(chunk, stop - start)
        u = _normal_math.uniform64(gen, k)
        z = _normal_math.box_muller(u, _backend.array_module(u).empty(k, dtype=dtype))
        lo, hi = max(start, keep), min(start + k, b)
        if hi > lo:
            sink.put_range(lo, z[lo - start:hi - start])


def _normal_stream(sink, gen, dtype):
    """Fill ``sink`` with the whole tensor's standard normal values of ``dtype`` from ``gen`` (See [Note: Normal
    values at fixed positions]): a plain tensor's in one pass, a sharded one's by skipping to its runs where the
    generator allows (See [Note: Skipping to a shard's values]), else drawing every value and keeping its own.
    The generator ends past the 2 * ceil(n / 2) uniforms of the whole tensor either way."""
    if isinstance(sink, _FlatSink):
        _normal_math.standard_normal_(gen, sink._flat)
        return sink
    total = sink.n + (sink.n & 1)
    bg, runs = _pcg64(gen), getattr(sink, "runs", None)
    if bg is None or runs is None:
        even = max(2, sink.block + (sink.block & 1))
        chunk = min(even, _NORMAL_CHUNK) if isinstance(gen, (np.random.Generator, np.random.RandomState)) else even
        _normal_span(sink, gen, 0, sink.n, 0, dtype, chunk)
        return sink
    state = bg.state
    chunk = min(max(2, sink.block + (sink.block & 1)), _NORMAL_CHUNK)
    for a, b in _spans(runs()):
        _normal_span(sink, _positioned(state, a - (a & 1), False), a - (a & 1), b, a, dtype, chunk)
    bg.state = _positioned(state, total, False).bit_generator.state
    return sink
