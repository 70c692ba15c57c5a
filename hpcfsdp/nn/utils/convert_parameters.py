"""parameters_to_vector / vector_to_parameters: flatten parameters into one vector and back."""
from hpcfsdp._tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters) -> Tensor:
    """Concatenate the flattened parameters into one 1-D tensor (differentiable)."""
    import hpcfsdp

    return hpcfsdp.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters) -> None:
    """Copy slices of the 1-D ``vec`` into the parameters' storage, in order."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected vec to be an hpcfsdp Tensor, but got: {type(vec).__name__}")
    if vec.dim() != 1:
        raise ValueError(f"expected a 1-D vector, got shape {tuple(vec.shape)}")
    pointer = 0
    for param in parameters:
        num_param = param.numel()
        param.data = vec[pointer:pointer + num_param].reshape(tuple(param.shape)).data
        pointer += num_param
