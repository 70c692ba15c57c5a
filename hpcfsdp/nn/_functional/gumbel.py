"""gumbel_softmax of torch.nn.functional: a differentiable sample from the Gumbel-softmax distribution."""
import warnings

from ._common import check_float

__all__ = ["gumbel_softmax"]


def gumbel_softmax(logits, tau=1, hard=False, eps=1e-10, dim=-1):
    """softmax((logits + g) / tau) along ``dim`` with g ~ Gumbel(0, 1) (-log of an Exponential(1) draw); with
    ``hard`` the one-hot of its argmax in the forward pass and the soft sample's gradient (straight through).

    ``eps`` is deprecated and unused, as PyTorch's (a warning when it is not the default).
    """
    import hpcfsdp

    check_float(logits, "gumbel_softmax", "logits")
    if eps != 1e-10:
        warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=2)
    with hpcfsdp.no_grad():
        u = hpcfsdp.rand_like(logits)
        gumbels = -(-(1 - u).log()).log()  # -log(E), E = -log(1 - U) ~ Exponential(1)
    y_soft = ((logits + gumbels) / tau).softmax(dim)
    if not hard:
        return y_soft  # the reparameterization trick
    index = y_soft.detach().argmax(dim, keepdim=True)
    y_hard = hpcfsdp.zeros_like(logits).scatter(dim, index, 1.0)
    return y_hard - y_soft.detach() + y_soft
