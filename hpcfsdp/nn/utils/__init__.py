"""nn utilities: gradient clipping, parameter/vector conversion, padded or packed sequences (``rnn``),
parametrizations (``parametrize``, ``parametrizations``) and the hook-based weight_norm / spectral_norm."""
from hpcfsdp.nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm
from hpcfsdp.nn.utils import rnn
from hpcfsdp.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters
from hpcfsdp.nn.utils import parametrize
from hpcfsdp.nn.utils import parametrizations
from hpcfsdp.nn.utils.spectral_norm import remove_spectral_norm, spectral_norm
from hpcfsdp.nn.utils.weight_norm import remove_weight_norm, weight_norm

__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm",
           "parameters_to_vector", "vector_to_parameters", "rnn", "parametrize", "parametrizations",
           "remove_spectral_norm", "remove_weight_norm", "spectral_norm", "weight_norm"]
