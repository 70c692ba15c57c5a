"""The random streams behind ``generator=`` arguments of samplers and random_split."""
import numpy as np

from hpcfsdp import _backend

__all__ = ["numpy_generator", "fresh_generator", "seeded_generator"]

# [Note: generator= in hpcfsdp.utils.data]
# PyTorch's samplers draw from a torch.Generator; hpcfsdp's draw from NumPy PCG64 generators, the kind
# behind hpcfsdp's CPU generators. A ``generator=`` argument may be:
#   * None: hpcfsdp's global CPU generator (reseeded by hp.manual_seed), as PyTorch's default generator;
#   * an hp.Generator (anything with ``_backend_rng(device)``): its CPU stream, the one
#     hp.randperm(n, generator=g) draws from, so a sampler's order is hp.randperm's; a CUDA generator
#     raises, as PyTorch's samplers do with one;
#   * a numpy.random.Generator: drawn from directly.
# Each draw advances the generator, as with a torch.Generator. The permutations are not PyTorch's (another
# bit generator); every structural property is.


def numpy_generator(generator) -> np.random.Generator:
    """The NumPy Generator a ``generator=`` argument stands for. See [Note: generator= in hpcfsdp.utils.data]."""
    if generator is None:
        return _backend.generator()
    if isinstance(generator, np.random.Generator):
        return generator
    backend_rng = getattr(generator, "_backend_rng", None)
    if callable(backend_rng):
        return backend_rng(_backend.device("cpu"))
    raise TypeError(f"generator must be None, an hp.Generator or a numpy.random.Generator, "
                    f"got {type(generator).__name__}")


def seeded_generator(seed: int) -> np.random.Generator:
    """A fresh PCG64 stream from an integer seed (PyTorch's range: negative seeds wrap modulo 2**64)."""
    return np.random.default_rng(int(seed) % 2**64)


def fresh_generator() -> np.random.Generator:
    """A new stream seeded from hpcfsdp's global generator (PyTorch's RandomSampler does this when
    ``generator`` is None: one draw from the default generator per iteration)."""
    return seeded_generator(int(_backend.generator().integers(0, 2**63)))
