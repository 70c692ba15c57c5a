"""More of PyTorch's top-level tensor functions (torch.isnan(x), torch.topk(x, k), torch.einsum(eq, a, b), ...).

Each is the Tensor method of the same name where PyTorch has one (the math lives there and in autograd/);
einsum, pow and clone are written out because their arguments differ from a method call.
"""
from ._ops_api import _method_as_function
from ._tensor import Tensor
from .autograd import ops
from ._autocast import LOWER, autocast_op

__all__ = [
    "isfinite", "isnan", "isinf", "logical_not", "logical_and", "logical_or", "logical_xor",
    "cumsum", "prod", "logsumexp", "std", "count_nonzero", "all", "any", "norm",
    "sort", "argsort", "topk", "multinomial",
    "chunk", "split", "tensor_split", "unbind", "squeeze", "unsqueeze", "flatten", "unflatten", "reshape",
    "transpose", "swapaxes", "permute", "t", "narrow", "gather", "index_select", "masked_fill",
    "dot", "mm", "bmm", "outer", "einsum",
    "square", "pow", "neg", "negative", "cos", "sin", "erf", "exp2", "sign", "round", "floor", "ceil", "clone",
]

isfinite = _method_as_function("isfinite")
isnan = _method_as_function("isnan")
isinf = _method_as_function("isinf")
logical_not = _method_as_function("logical_not")
logical_and = _method_as_function("logical_and")
logical_or = _method_as_function("logical_or")
logical_xor = _method_as_function("logical_xor")

cumsum = _method_as_function("cumsum")
prod = _method_as_function("prod")
logsumexp = _method_as_function("logsumexp")
std = _method_as_function("std")
count_nonzero = _method_as_function("count_nonzero")
all = _method_as_function("all")  # noqa: A001
any = _method_as_function("any")  # noqa: A001

sort = _method_as_function("sort")
argsort = _method_as_function("argsort")
topk = _method_as_function("topk")
multinomial = _method_as_function("multinomial")

chunk = _method_as_function("chunk")
split = _method_as_function("split")
tensor_split = _method_as_function("tensor_split")
unbind = _method_as_function("unbind")
squeeze = _method_as_function("squeeze")
unsqueeze = _method_as_function("unsqueeze")
flatten = _method_as_function("flatten")
unflatten = _method_as_function("unflatten")
reshape = _method_as_function("reshape")
transpose = _method_as_function("transpose")
swapaxes = _method_as_function("transpose")
permute = _method_as_function("permute")
t = _method_as_function("t")
narrow = _method_as_function("narrow")
gather = _method_as_function("gather")
index_select = _method_as_function("index_select")
masked_fill = _method_as_function("masked_fill")

dot = _method_as_function("dot")
mm = _method_as_function("mm")
bmm = _method_as_function("bmm")
outer = _method_as_function("outer")

square = _method_as_function("square")
neg = negative = _method_as_function("neg")
cos = _method_as_function("cos")
sin = _method_as_function("sin")
erf = _method_as_function("erf")
exp2 = _method_as_function("exp2")
sign = _method_as_function("sign")
round = _method_as_function("round")  # noqa: A001
floor = _method_as_function("floor")
ceil = _method_as_function("ceil")


def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):  # noqa: A002
    """torch.norm(input, p='fro', dim=None, keepdim=False, out=None, dtype=None): ``input.norm(p, dim, ...)``."""
    if not isinstance(input, Tensor):
        raise TypeError(f"norm(): argument 'input' must be Tensor, not {type(input).__name__}")
    if out is not None:
        raise TypeError("norm(): out= is not supported by hpcfsdp; use the returned tensor")
    return input.norm(p, dim, keepdim, dtype=dtype)


def pow(input, exponent):  # noqa: A001,A002
    """torch.pow(input, exponent): input a Tensor or a number (then exponent is a Tensor)."""
    if isinstance(input, Tensor):
        return input ** exponent
    if not isinstance(exponent, Tensor):
        raise TypeError(f"pow(): expected a Tensor as input or exponent, got {type(input).__name__} and "
                        f"{type(exponent).__name__}")
    return input ** exponent  # Tensor.__rpow__


def clone(input, *, memory_format=None):  # noqa: A002
    """torch.clone(input): a differentiable copy (every tensor here is contiguous: memory_format is ignored)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"clone(): argument 'input' must be Tensor, not {type(input).__name__}")
    return input.clone()


@autocast_op(cpu=LOWER, cuda=LOWER)
def einsum(equation, *operands):
    """torch.einsum(equation, *operands) or (equation, [operands]); differentiable in every operand.

    Subscripts are letters, ``...`` broadcasts, size-1 dims broadcast, no '->' sorts the output letters.
    The operands must share one dtype and device, as PyTorch requires.
    """
    if not isinstance(equation, str):
        raise TypeError(f"einsum(): the first argument must be the equation string, got {type(equation).__name__} "
                        f"(the sublist format is not supported)")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    for i, x in enumerate(operands):
        if not isinstance(x, Tensor):
            raise TypeError(f"einsum(): operand {i} must be a Tensor, not {type(x).__name__}")
        if x.dtype != operands[0].dtype:
            raise RuntimeError(f"einsum(): expected scalar type {operands[0].dtype} but found {x.dtype} (operand {i})")
        if x.device != operands[0].device:
            raise RuntimeError(f"einsum(): expected all operands on one device, found {operands[0].device} and "
                               f"{x.device} (operand {i})")
    return ops.Einsum.apply(equation, *operands)
