"""hpcfsdp: fully sharded data parallel training on MPI, NumPy and CuPy."""
from . import _backend
from ._backend import (bfloat16, bool, device, double, float, float16, float32, float64, half, int, int8,  # noqa: A004
                       int16, int32, int64, long, manual_seed, uint8)
# _creation, and with it _tensor, loads before autograd: See [Note: Tensor and Function] in _tensor.py
from ._creation import (arange, as_tensor, empty, eye, from_dlpack, from_numpy, full, is_tensor, linspace, numel,
                        ones, rand, randint, randn, randperm, tensor, zeros)
from ._creation import (asarray, bartlett_window, blackman_window, hamming_window, hann_window, logspace,  # noqa: F401
                        scalar_tensor)
from ._creation import tril_indices, triu_indices  # noqa: F401
from ._dtype_info import (e, finfo, get_default_dtype, iinfo, inf, is_floating_point, nan, newaxis, pi,  # noqa: F401
                          promote_types)
from ._dtype_info import can_cast, result_type, set_default_dtype  # noqa: F401
from ._printing import set_printoptions  # noqa: F401
from ._registry import top_level as _top_level
from ._tensor import Size, Tensor
from ._tensor_base import broadcast_shapes  # noqa: F401
from .autograd.grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from . import autograd  # noqa: E402

# The op functions (hp.sum, hp.cat, hp.where, ...): every hpcfsdp.* function of the op registry, declared with
# its op in hpcfsdp/_tensor_methods/ (loaded with _tensor above). See CONTRIBUTING.md.
_OPS = _top_level()
globals().update(_OPS)

dtype = _backend.np.dtype  # isinstance(x, hp.dtype) works: hp dtypes are NumPy dtypes

from ._version import __version__  # noqa: E402, F401  (hpcfsdp.__version__)

__all__ = [
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "double", "float", "half", "long", "int", "dtype", "device", "Size", "Tensor",
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "randn", "rand", "randint", "randperm", "arange",
    "linspace", "eye", "from_numpy", "from_dlpack",
    "is_tensor", "numel", "manual_seed", "no_grad", "enable_grad", "inference_mode", "is_grad_enabled", "set_grad_enabled",
    "get_default_dtype", "is_floating_point", "promote_types", "autograd", "nn", "optim", "models",
    "save", "load",
]
__all__ = sorted(__all__ + list(_OPS))  # its own names above, then the registry's

# Submodules above the compute core, imported last: they import the names above.
from . import nn, optim, models, accelerator  # noqa: E402,F401
_OPS = _top_level()  # the registry again: with the nn.functional ops PyTorch exposes at the top level (torch.dropout,
# torch.conv2d, ...: hpcfsdp/nn/_functional/torch_functions.py, loaded with nn)
globals().update(_OPS)
__all__ = sorted(set(__all__) | set(_OPS))
from .serialization import load, save  # noqa: E402
from . import utils  # noqa: E402,F401
from .random import Generator, default_generator, get_rng_state, initial_seed, seed, set_rng_state  # noqa: E402,F401
from .utils import checkpoint as _checkpoint  # noqa: E402,F401  (hp.utils.checkpoint, as torch.utils.checkpoint)

# PyTorch's names beyond the core, so a script ported by its import lines finds them.
from ._runtime import (are_deterministic_algorithms_enabled, compile, get_float32_matmul_precision,  # noqa: E402,F401,A004
                       get_num_interop_threads, get_num_threads, is_deterministic_algorithms_warn_only_enabled,
                       set_float32_matmul_precision, set_num_interop_threads, set_num_threads,
                       use_deterministic_algorithms)
from .utils import data as _utils_data  # noqa: E402,F401  (hp.utils.data, as torch.utils.data)
from ._autocast import (clear_autocast_cache, get_autocast_cpu_dtype, get_autocast_dtype,  # noqa: E402,F401
                        get_autocast_gpu_dtype, is_autocast_cache_enabled, is_autocast_cpu_enabled,
                        is_autocast_enabled, set_autocast_cache_enabled, set_autocast_dtype, set_autocast_enabled)

# Submodules PyTorch makes reachable as attributes after `import torch` (torch.distributed.get_rank()
# with no `import torch.distributed`), imported on first use so that `import hpcfsdp` stays light.
_LAZY_SUBMODULES = ("distributed", "cuda", "backends", "testing", "linalg", "amp", "multiprocessing", "profiler")


# Under an MPI launcher, torchrun's RANK/LOCAL_RANK/... are exported at import, as `hpcfsdp launch`
# does, so a script that reads them before touching torch.distributed finds them under a plain mpiexec
# too (see [Note: torchrun variables]; no MPI call, mpi4py is not imported). Variables that disagree
# with the launcher's raise where hpcfsdp.distributed is imported by the script, not here.
import contextlib as _contextlib  # noqa: E402
import os as _os  # noqa: E402

if {"PMI_RANK", "OMPI_COMM_WORLD_RANK"} & _os.environ.keys():
    with _contextlib.suppress(RuntimeError):  # a disagreement: raised again on the script's own import
        from . import distributed  # noqa: E402,F401

_LAZY_NAMES = {"autocast": "amp"}  # torch.autocast is torch.amp.autocast


def __getattr__(name):
    if name in _LAZY_SUBMODULES or name in _LAZY_NAMES:
        import importlib
        module = importlib.import_module(f"{__name__}.{_LAZY_NAMES.get(name, name)}")
        return getattr(module, name) if name in _LAZY_NAMES else module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
