"""A short traced FSDP run for tests/test_trace.py: a tiny GPT, fully_shard per block and root, 3 steps."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hpcfsdp as hp  # noqa: E402
from hpcfsdp.distributed.fsdp import fully_shard  # noqa: E402

from _fsdp_util import gpt_batches, local, tiny_gpt, world  # noqa: E402


def main(steps=3):
    w, _ = world()
    model = tiny_gpt()
    for b in model.transformer.h:
        fully_shard(b)
    fully_shard(model)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in gpt_batches(steps, 4 * w + 1):
        _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model


if __name__ == "__main__":
    main()
