"""Re-expresses the case of PyTorch's test/distributed/_composable/fsdp/test_fully_shard_conversion.py that
torch 2.13's API has (no per-parameter ``grad_dtype``): ``module.to(bfloat16)`` after fully_shard matches the
same conversion of a plain module, before and after gradients exist, and training continues in parity."""
import pytest

from _common import assert_close, copy_model
from _framework import DTensor, fully_shard, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _assert_parity(model, ref):
    """Every sharded parameter (and gradient) agrees with the plain module's in dtype, flags and value. Every
    rank feeds the same input, so FSDP's averaged gradient is the plain module's gradient."""
    for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
        assert isinstance(p, DTensor), name
        assert p.dtype == rp.dtype and p.requires_grad == rp.requires_grad and p.is_leaf == rp.is_leaf, name
        assert_close(p, rp, rtol=1e-3, atol=1e-3, msg=name)
        if rp.grad is None:
            assert p.grad is None, name
        else:
            assert isinstance(p.grad, DTensor), name
            assert p.grad.dtype == rp.grad.dtype, (name, p.grad.dtype, rp.grad.dtype)
            assert_close(p.grad, rp.grad, rtol=1e-3, atol=1e-3, msg=f"grad {name}")


@pytest.mark.parametrize("existing_grad", [False, True])
def test_to_matches_plain_module(existing_grad):
    """A Linear with a frozen bias, converted to bfloat16 after fully_shard (with ones as existing gradients or
    none); then two forward/backward passes, each followed by SGD, Adam and AdamW steps, stay equal to the
    plain module's."""
    ref = nn.Linear(4, 4)
    with torch.no_grad():
        ref.weight.fill_(0.25)
        ref.bias.fill_(0.125)
    ref.bias.requires_grad_(False)
    model = copy_model(ref)
    fully_shard(model)
    if existing_grad:
        for m in (model, ref):
            for p in m.parameters():
                if p.requires_grad:
                    p.grad = torch.ones_like(p)
    for m in (model, ref):
        m.to(torch.bfloat16)
    _assert_parity(model, ref)
    inp = (torch.arange(8, dtype=torch.float32).view(2, 4) / 8).to(torch.bfloat16)
    for it in range(2):
        if it:
            for m in (model, ref):
                m.zero_grad(set_to_none=True)
        expected = ref(inp)
        actual = model(inp)
        assert actual.dtype == expected.dtype == torch.bfloat16
        assert_close(actual, expected, rtol=1e-3, atol=1e-3)
        expected.sum().backward()
        actual.sum().backward()
        _assert_parity(model, ref)
        for optim_cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
            for m in (model, ref):
                optim_cls(m.parameters(), lr=0.01).step()
            _assert_parity(model, ref)
