"""Tensor's methods and the hpcfsdp.* op functions, one file per op family (the families of
hpcfsdp/_registry.py): each declares its ops with ``@op`` / ``@function_op`` and ends with its generated mixin.
hpcfsdp/_tensor.py combines the mixins into Tensor; hpcfsdp/__init__.py takes the op functions from the registry.
Shared helpers (operand promotion, argument checks, the in-place wrapper) are in _common.py. See CONTRIBUTING.md.
"""
from .activation import ActivationMixin
from .arithmetic import ArithmeticMixin
from .compare import CompareMixin
from .convert import ConvertMixin
from .creation import CreationMixin
from .index import IndexMixin
from .linalg import LinalgMixin
from .random import RandomMixin
from .reduce import ReduceMixin
from .shape import ShapeMixin
from .unary import UnaryMixin
from . import inplace_functions  # noqa: E402,F401  (last: it gives declared in-place ops their hpcfsdp.* functions)

__all__ = ["MIXINS", "ActivationMixin", "ArithmeticMixin", "CompareMixin", "ConvertMixin", "CreationMixin",
           "IndexMixin", "LinalgMixin", "RandomMixin", "ReduceMixin", "ShapeMixin", "UnaryMixin"]

# Tensor's bases after TensorBase, in family order (no two define the same name: the registry refuses that)
MIXINS = (ArithmeticMixin, UnaryMixin, ReduceMixin, CompareMixin, ShapeMixin, IndexMixin, LinalgMixin, RandomMixin,
          ActivationMixin, ConvertMixin, CreationMixin)
