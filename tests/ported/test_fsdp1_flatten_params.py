"""Re-expresses the output checks of PyTorch's test/distributed/fsdp/test_fsdp_flatten_params.py on CPU: an
nn.Transformer (with and without feed-forward weights shared between encoder and decoder layers, in float32 and
after ``.half()``) wrapped whole computes what it computed before wrapping, and one SGD step leaves the parameter
norm the unwrapped model's step leaves. The FlatParameter numel / metadata tests are left out (flat)."""
import pytest

from _common import assert_close, fsdp1_cpu, fsdp1_full_params, randn
from _framework import FSDP, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _transformer(shared: bool, half: bool):
    torch.manual_seed(0)
    module = nn.Transformer(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
                            dropout=0.1)
    module.register_buffer("dummy_buffer", torch.tensor(1.0))
    if shared:  # share the feed-forward weights
        for enc, dec in zip(module.encoder.layers, module.decoder.layers):
            dec.linear1.weight = enc.linear1.weight
            dec.linear2.weight = enc.linear2.weight
    return module.half() if half else module


def _output(module, dtype):
    src, tgt = randn(10, 4, 16, seed=1).to(dtype), randn(5, 4, 16, seed=2).to(dtype)  # T x B x C
    torch.manual_seed(1)  # the same dropout masks for every call
    return module(src, tgt)


def _tol(half):
    return dict(rtol=2e-3, atol=2e-3) if half else dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("shared", [False, True], ids=["without_shared_params", "with_shared_params"])
def test_output(shared, half):
    """test_output_without_shared_params / test_output_with_shared_params (half False / True)."""
    module = _transformer(shared, half)
    dtype = next(module.parameters()).dtype
    assert dtype == (torch.float16 if half else torch.float32)
    ref_out = _output(module, dtype)
    fsdp = FSDP(module, device_id=fsdp1_cpu())
    out = _output(fsdp, dtype)
    assert out.dtype == dtype
    assert_close(out, ref_out, **_tol(half))


def _step(module, dtype):
    optim = torch.optim.SGD(module.parameters(), lr=0.01)
    _output(module, dtype).float().sum().backward()
    optim.step()


@pytest.mark.parametrize("half", [False, True])
def test_pnorm_after_step_with_shared_params(half):
    """One SGD step (the same input on every rank, so the averaged gradient is the local one) leaves the
    parameters with the norm the unwrapped model's step leaves, and every parameter equal; the shared weights
    stay shared (one entry each)."""
    ref = _transformer(True, half)
    dtype = next(ref.parameters()).dtype
    _step(ref, dtype)
    fsdp = FSDP(_transformer(True, half), device_id=fsdp1_cpu())
    _step(fsdp, dtype)
    full = fsdp1_full_params(fsdp)
    ref_params = {n: p for n, p in ref.named_parameters()}
    assert sorted(full) == sorted(ref_params)
    assert not any(n.startswith("decoder.") and ".linear" in n and n.endswith("weight") for n in full)
    norm = sum(float((v ** 2).sum()) for v in full.values()) ** 0.5
    ref_norm = float(torch.stack([p.detach().float().norm() for p in ref.parameters()]).norm())
    assert_close(norm, ref_norm, **_tol(half))
    for name, p in ref_params.items():
        assert_close(full[name], p, **_tol(half), msg=name)
