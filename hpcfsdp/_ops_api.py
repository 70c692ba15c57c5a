"""Function forms of Tensor methods at the top level (hp.sum(x), hp.matmul(a, b), ...)."""

from . import _backend
from ._tensor import Tensor
from ._tensor import promote_types as _promote

__all__ = ["abs", "allclose", "amax", "amin", "argmax", "argmin", "clamp", "clip", "exp", "log", "matmul", "max",
           "maximum", "mean", "min", "minimum", "rsqrt", "sigmoid", "softmax", "log_softmax", "sqrt", "sum", "tanh",
           "var", "get_default_dtype", "is_floating_point", "promote_types"]


def _m(name):
    def f(input, *args, **kwargs):  # noqa: A002
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(input).__name__}")
        return getattr(input, name)(*args, **kwargs)

    f.__name__ = name
    f.__doc__ = f"hp.{name}(input, ...) is input.{name}(...)."
    return f


abs = _m("abs")  # noqa: A001
allclose = _m("allclose")
amax = _m("amax")
amin = _m("amin")
argmax = _m("argmax")
argmin = _m("argmin")
clamp = _m("clamp")
clip = _m("clamp")
exp = _m("exp")
log = _m("log")
matmul = _m("matmul")
max = _m("max")  # noqa: A001
maximum = _m("maximum")
mean = _m("mean")
min = _m("min")  # noqa: A001
minimum = _m("minimum")
rsqrt = _m("rsqrt")
sigmoid = _m("sigmoid")
softmax = _m("softmax")
log_softmax = _m("log_softmax")
sqrt = _m("sqrt")
sum = _m("sum")  # noqa: A001
tanh = _m("tanh")
var = _m("var")


def get_default_dtype():
    return _backend.float32


def is_floating_point(t):
    return t.is_floating_point()


def promote_types(type1, type2):
    return _promote(_backend.to_dtype(type1), _backend.to_dtype(type2))

