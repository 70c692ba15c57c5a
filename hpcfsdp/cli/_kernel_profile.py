"""The kernels a step really launches on a GPU, counted with a CUPTI-based profiler (PyTorch's, where installed).

[Note: Counting kernels on a GPU]
The simulated device counts launches itself ([Note: Simulated device counts]); a real GPU has no such counter
short of CUPTI, which records every kernel, copy and memset of the process, CuPy's included. PyTorch's profiler
(torch.profiler, ProfilerActivity.CUDA) is a CUPTI client most GPU machines have, so ``hpcfsdp bench train
--profile-kernels`` runs one step more after the timed ones under it (the timing stays unperturbed) and counts its
device events as the simulator counts launches: kernels, device-to-device copies and memsets; host-device copies
are transfers, not launches. PyTorch stays optional: without it the flag is an error naming it.
"""
from __future__ import annotations

import collections

__all__ = ["count_device_events", "profile_step"]

_TRANSFERS = ("HtoD", "DtoH", "HtoH", "PtoP")  # CUPTI's memcpy kinds that move data across the host link


def count_device_events(events) -> dict:
    """{"launches": n, "by_kind": {"kernel" | "memcpy DtoD" | "memset": n}, "transfers": n} of profiler events
    (objects with ``device_type`` (DeviceType.CUDA for device work) and ``name``)."""
    kinds = collections.Counter()
    transfers = 0
    for e in events:
        if getattr(getattr(e, "device_type", None), "name", "") != "CUDA":
            continue
        name = str(e.name)
        low = name.lower()
        if low.startswith("memcpy"):
            if any(t in name for t in _TRANSFERS):
                transfers += 1
                continue
            kinds["memcpy DtoD"] += 1
        elif low.startswith("memset"):
            kinds["memset"] += 1
        else:
            kinds["kernel"] += 1
    return {"launches": sum(kinds.values()), "by_kind": dict(kinds), "transfers": transfers}


def profile_step(step, synchronize) -> dict:
    """Run ``step()`` once under PyTorch's CUDA profiler and count its device events (See [Note: Counting kernels
    on a GPU]); SystemExit naming PyTorch where it is not installed."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        raise SystemExit(f"hpcfsdp bench train --profile-kernels: needs PyTorch's profiler (CUPTI) to count a GPU's "
                         f"kernels, and PyTorch is not importable ({e}); pip install torch, or leave the flag out") \
            from None
    synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        synchronize()
    return count_device_events(prof.events())
