"""Every Tensor method and every hpcfsdp.* op function comes from one op registry entry (hpcfsdp/_registry.py)."""
import types

import pytest

import hpcfsdp as hp
from hpcfsdp import _registry as R
from hpcfsdp.autograd.function import Function

# Tensor members that are not ops: the autograd graph API, metadata queries and Python protocols that
# compute nothing on the data (a DTensor answers them from its metadata, a GPU kernel has nothing to do).
PROTOCOL = {
    "__array__", "__array_priority__", "__bool__", "__deepcopy__", "__dict__", "__dlpack__", "__dlpack_device__",
    "__float__", "__format__", "__hash__", "__index__", "__int__", "__len__", "__repr__", "__str__", "__weakref__",
    "__doc__", "__module__", "__new__", "__slots__",
    "__annotations__",  # made (empty) on each class of the MRO by isinstance(t, <runtime_checkable Protocol>)
    "data", "data_ptr", "device", "dim", "dtype", "element_size", "grad", "grad_fn", "is_contiguous", "is_cuda",
    "is_cpu", "is_floating_point", "is_floating_point_", "is_leaf", "is_meta", "item", "itemsize", "nbytes", "ndim",
    "ndimension", "nelement", "numel", "numpy", "requires_grad", "requires_grad_", "retain_grad", "retains_grad", "shape",
    "size", "storage_offset", "stride", "tolist", "backward", "register_hook", "register_post_accumulate_grad_hook",
}

# hpcfsdp.* callables that are not ops on tensors: constructors from shapes or data, grad mode, dtype
# queries, random state, runtime switches, autocast settings, serialization.
NOT_OP_FUNCTIONS = {
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "randn", "rand", "randint", "randperm", "arange",
    "linspace", "eye", "from_numpy", "from_dlpack", "is_tensor", "manual_seed", "seed", "initial_seed",
    "get_rng_state", "set_rng_state", "no_grad", "enable_grad", "inference_mode", "is_grad_enabled",
    "set_grad_enabled", "get_default_dtype", "promote_types", "finfo", "iinfo", "save", "load", "compile",
    "tril_indices", "triu_indices", "broadcast_shapes",
    "are_deterministic_algorithms_enabled", "get_float32_matmul_precision", "get_num_interop_threads",
    "get_num_threads", "is_deterministic_algorithms_warn_only_enabled", "set_float32_matmul_precision",
    "set_num_interop_threads", "set_num_threads", "use_deterministic_algorithms",
    "clear_autocast_cache", "get_autocast_cpu_dtype", "get_autocast_dtype", "get_autocast_gpu_dtype",
    "is_autocast_cache_enabled", "is_autocast_cpu_enabled", "is_autocast_enabled", "set_autocast_cache_enabled",
    "set_autocast_dtype", "set_autocast_enabled", "autocast", "is_floating_point", "numel",
    "set_default_dtype", "set_printoptions", "result_type", "can_cast", "asarray", "scalar_tensor", "logspace",
    "hann_window", "hamming_window", "blackman_window", "bartlett_window",
}


def _tensor_members():
    out = set()
    for n in dir(hp.Tensor):
        owner = next((c for c in hp.Tensor.__mro__ if n in c.__dict__), None)
        if owner is not None and owner.__module__.startswith("hpcfsdp") and (not n.startswith("_") or
                                                                              n.startswith("__")):
            out.add(n)
    return out


def test_every_tensor_method_is_a_registry_entry():
    methods = R.method_names()
    missing = sorted(n for n in _tensor_members() - PROTOCOL if n not in methods)
    assert not missing, f"Tensor members with no registry entry: {missing}"
    for n, entry in methods.items():
        assert getattr(hp.Tensor, n) is entry.impl, f"Tensor.{n} is not the registry's {entry.family} entry"


def test_every_top_level_op_is_a_registry_entry():
    funcs = R.top_level()
    missing = []
    for n in dir(hp):
        v = getattr(hp, n)
        if n.startswith("_") or isinstance(v, (type, types.ModuleType)) or not callable(v):
            continue
        if n in funcs:
            assert v is funcs[n], f"hpcfsdp.{n} is not the registry's function"
        elif n not in NOT_OP_FUNCTIONS:
            missing.append(n)
    assert not missing, f"hpcfsdp functions with no registry entry: {sorted(missing)}"
    for n in funcs:
        assert getattr(hp, n) is funcs[n], n


def test_entries_are_well_formed():
    assert len(R.OPS) > 220  # 229 entries; with their aliases 238 Tensor method names and 162 hpcfsdp functions
    used = set()
    for name, e in R.OPS.items():
        assert e.name == name and e.family in R.FAMILIES
        assert e.impl is not None or e.function is not None, name
        assert all(isinstance(f, type) and issubclass(f, Function) for f in e.functions), name
        dunder = name.startswith("__") and name.endswith("__")  # "__radd__" ends with "_" but is not in place
        assert e.inplace == (name in R.INPLACE_DUNDERS if dunder
                             else name.endswith("_")), name
        assert e.sharding_rule is None or callable(e.sharding_rule)  # hpcfsdp.distributed.tensor fills it
        assert e.gpu_kernel is None  # a slot for the GPU kernels
        used.add(e.family)
    for fam in ("arithmetic", "unary", "reduce", "compare", "shape", "index", "linalg", "random", "activation",
                "convert"):
        assert fam in used, fam


def test_families_are_found_where_the_issue_expects():
    for name, fam in {"exp": "unary", "exp2": "unary", "expm1": "unary", "cumsum": "reduce", "cumprod": "reduce",
                      "isnan": "compare", "isinf": "compare", "isclose": "compare", "add": "arithmetic",
                      "matmul": "linalg", "gather": "index", "reshape": "shape", "softmax": "activation",
                      "to": "convert", "add_": "arithmetic", "bernoulli": "random"}.items():
        assert R.lookup(name).family == fam, name
    assert R.lookup("clip") is R.lookup("clamp")
    assert R.lookup("__add__") is R.lookup("add")


def test_a_new_op_is_one_entry(monkeypatch):
    monkeypatch.setattr(R, "OPS", dict(R.OPS))
    monkeypatch.setattr(R, "_METHOD_NAMES", dict(R._METHOD_NAMES))
    monkeypatch.setattr(R, "_FUNCTION_NAMES", dict(R._FUNCTION_NAMES))

    @R.op("unary", function=True, aliases=("twice_alias",))
    def twice(self):
        return self * 2

    cls = type("T", (hp.Tensor, R.mixin("unary")), {})
    t = cls._make_subclass(cls, hp.tensor([1.0, 2.0]))
    assert t.twice().tolist() == [2.0, 4.0] and t.twice_alias().tolist() == [2.0, 4.0]
    assert R.top_level()["twice"](hp.tensor([3.0])).tolist() == [6.0]
    with pytest.raises(TypeError, match="argument 'input' must be Tensor"):
        R.top_level()["twice"]([3.0])
    with pytest.raises(ValueError, match="declared twice"):
        R.op("unary", name="twice")(lambda self: self)
    with pytest.raises(ValueError, match="unknown family"):
        R.op("nonsense")(lambda self: self)
