"""Function forms of Tensor methods at the top level (hp.sum(x), hp.matmul(a, b), ...)."""

from . import _backend
from ._array import promote_types as _promote
from ._tensor import Tensor

__all__ = ["abs", "allclose", "equal", "amax", "amin", "argmax", "argmin", "clamp", "clip", "exp", "log", "matmul", "max",
           "maximum", "mean", "min", "minimum", "relu", "rsqrt", "sigmoid", "softmax", "log_softmax", "sqrt", "sum", "tanh",
           "var", "get_default_dtype", "is_floating_point", "promote_types"]


def _method_as_function(name):
    def f(input, *args, **kwargs):  # noqa: A002
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(input).__name__}")
        return getattr(input, name)(*args, **kwargs)

    f.__name__ = name
    f.__doc__ = f"hp.{name}(input, ...) is input.{name}(...)."
    return f


abs = _method_as_function("abs")  # noqa: A001
allclose = _method_as_function("allclose")
equal = _method_as_function("equal")
amax = _method_as_function("amax")
amin = _method_as_function("amin")
argmax = _method_as_function("argmax")
argmin = _method_as_function("argmin")
clamp = _method_as_function("clamp")
clip = _method_as_function("clamp")
exp = _method_as_function("exp")
log = _method_as_function("log")
matmul = _method_as_function("matmul")
max = _method_as_function("max")  # noqa: A001
maximum = _method_as_function("maximum")
mean = _method_as_function("mean")
min = _method_as_function("min")  # noqa: A001
minimum = _method_as_function("minimum")
rsqrt = _method_as_function("rsqrt")
relu = _method_as_function("relu")
sigmoid = _method_as_function("sigmoid")
softmax = _method_as_function("softmax")
log_softmax = _method_as_function("log_softmax")
sqrt = _method_as_function("sqrt")
sum = _method_as_function("sum")  # noqa: A001
tanh = _method_as_function("tanh")
var = _method_as_function("var")


def get_default_dtype():
    return _backend.float32


def is_floating_point(t):
    return t.is_floating_point()


def promote_types(type1, type2):
    return _promote(_backend.to_dtype(type1), _backend.to_dtype(type2))

