"""The sharding rules of DTensor's ops, one module per kind of op; importing the package registers them on the
op registry's entries (See [Note: DTensor op dispatch] in ../_dispatch.py)."""
from hpcfsdp.distributed.tensor._rules import functional, index, matmul, pointwise, random, reduce, view  # noqa: F401
