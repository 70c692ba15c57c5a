"""The in-place ops that PyTorch also exposes as ``torch.*`` functions (``torch.exp_(t)``, ``torch.relu_(t)``,
``torch.clamp_(t, 0, 1)``, ...): each ``hpcfsdp.<name>(input, ...)`` is ``input.<name>(...)``, given to the ops the
family files declare once they are all registered (hpcfsdp/_tensor_methods/__init__.py imports this module last).
The list is PyTorch 2.13's, less the names hpcfsdp has no Tensor method for (see tests/test_ops_inplace_functions.py)."""
from .._registry import expose_functions

__all__ = ["INPLACE_FUNCTIONS"]

INPLACE_FUNCTIONS = (
    "abs_", "acos_", "acosh_", "addmv_", "arccos_", "arccosh_", "arcsin_", "arcsinh_", "arctan_", "arctanh_", "asin_",
    "asinh_", "atan_", "atanh_", "ceil_", "clamp_", "clamp_max_", "clamp_min_", "clip_", "cos_", "cosh_", "deg2rad_",
    "erf_", "erfc_", "exp2_", "exp_", "expm1_", "fill_", "fix_", "floor_", "frac_", "log10_", "log1p_", "log2_", "log_",
    "logit_", "nan_to_num_", "neg_", "negative_", "rad2deg_", "reciprocal_", "relu_", "round_", "rsqrt_", "sigmoid_",
    "sin_", "sinc_", "sinh_", "sqrt_", "square_", "tan_", "tanh_", "trunc_", "xlogy_", "zero_",
)

expose_functions(*INPLACE_FUNCTIONS)
