"""The operators of the simulated ndarray: each is CuPy's ufunc of that operator (held to its dtype loops)."""
from __future__ import annotations

import operator

from . import _sim_surface as _gate

__all__ = ["wire", "recording_getattribute", "OPERATOR_UFUNCS"]

# operator -> CuPy's ufunc (matmul is a product, not a ufunc)
OPERATOR_UFUNCS = {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "true_divide", "floordiv": "floor_divide",
    "mod": "remainder", "pow": "power", "matmul": None, "and": "bitwise_and", "or": "bitwise_or",
    "xor": "bitwise_xor", "lshift": "left_shift", "rshift": "right_shift", "eq": "equal", "ne": "not_equal",
    "lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "neg": "negative", "pos": "positive",
    "abs": "absolute", "invert": "invert"}


def wire(ndarray, call, ufunc, matmul) -> None:
    """Set ndarray's arithmetic, comparison and unary operators: ``ufunc(name, op, fn, args, kwargs, writes, out)``
    for those CuPy runs as ufuncs, ``call(op, fn, args, kwargs, writes)`` for matmul."""
    def binop(f, u):
        if u is None:
            return lambda self, o: call(f.__name__, f, (self, o), {})
        return lambda self, o: ufunc(u, f.__name__, f, (self, o), {})

    def rbinop(f, u):
        if u is None:
            return lambda self, o: call(f.__name__, f, (o, self), {})
        return lambda self, o: ufunc(u, f.__name__, f, (o, self), {})

    def ibinop(f, u):  # CuPy: u(self, o, out=self)
        def fn(self, o):
            if u is None:
                call(f.__name__, f, (self, o), {}, writes=(self,))
            else:
                ufunc(u, f.__name__, f, (self, o), {}, writes=(self,), out=self)
            return self
        return fn

    for n in ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
              "rshift"]:
        f = matmul if n == "matmul" else getattr(operator, n + "_" if n in ("and", "or") else n)
        u = OPERATOR_UFUNCS[n]
        setattr(ndarray, f"__{n}__", binop(f, u))
        setattr(ndarray, f"__r{n}__", rbinop(f, u))
        setattr(ndarray, f"__i{n}__", ibinop(getattr(operator, "i" + n), u))
    for n in ["eq", "ne", "lt", "le", "gt", "ge"]:
        setattr(ndarray, f"__{n}__", binop(getattr(operator, n), OPERATOR_UFUNCS[n]))
    for n in ["neg", "pos", "abs", "invert"]:
        setattr(ndarray, f"__{n}__",
                (lambda f, u: lambda self: ufunc(u, f.__name__, f, (self,), {}))(getattr(operator, n),
                                                                                 OPERATOR_UFUNCS[n]))


def recording_getattribute(self, name):
    """ndarray.__getattribute__ under HPCFSDP_CUDA_SIM_RECORD: every public attribute used is recorded."""
    if name[0] != "_" or name[:2] == "__":
        _gate.record("ndarray." + name)
    return object.__getattribute__(self, name)
