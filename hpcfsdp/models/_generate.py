"""Autoregressive sampling from a causal language model that returns (logits, loss)."""
import numpy as np

__all__ = ["generate"]


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):
    """Extend idx (B, T) int64 by ``max_new_tokens`` tokens, one forward per token (no KV cache).

    Each step feeds the last ``block_size`` tokens, scales the last position's logits by 1/temperature,
    keeps the ``top_k`` largest if given, and samples from the softmax with hpcfsdp's generator (seed it
    with ``hp.manual_seed``; on a sharded model every rank must use the same seed so that all ranks pick
    the same tokens). ``temperature=0`` picks the most likely token (greedy). Runs under no_grad; put the
    model in eval() mode first to turn dropout off.
    """
    import hpcfsdp as hp
    from hpcfsdp import _backend

    if idx.ndim != 2:
        raise ValueError(f"generate expects idx of shape (B, T), got {tuple(idx.shape)}")
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    vocab = model.config.vocab_size
    if top_k is not None and not 1 <= int(top_k):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    block = model.config.block_size
    gen = _backend.generator()
    with hp.no_grad():
        for _ in range(int(max_new_tokens)):
            cond = idx if idx.shape[1] <= block else idx[:, -block:]
            logits, _ = model(cond)
            last = np.asarray(_backend.to_numpy(logits[:, -1, :]._data), dtype=np.float64)  # (B, V)
            if temperature == 0:
                nxt = last.argmax(-1)
            else:
                z = last / float(temperature)
                if top_k is not None:
                    k = min(int(top_k), vocab)
                    kth = np.sort(z, axis=-1)[:, -k][:, None]
                    z = np.where(z < kth, -np.inf, z)
                z = np.exp(z - z.max(-1, keepdims=True))
                probs = z / z.sum(-1, keepdims=True)
                u = gen.random(probs.shape[0])[:, None]
                nxt = np.minimum((np.cumsum(probs, -1) < u).sum(-1), vocab - 1)
            nxt_t = hp.tensor(nxt.astype(np.int64).reshape(-1, 1), device=idx.device)
            idx = hp.cat([idx, nxt_t], dim=1)
    return idx
