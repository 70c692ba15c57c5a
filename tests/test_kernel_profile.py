"""Counting a GPU's kernels for `hpcfsdp bench train --profile-kernels` (hpcfsdp/cli/_kernel_profile.py): which
profiler events are launches (as the simulator counts them) and the errors without a GPU or PyTorch."""
import os
import subprocess
import sys
import types

from hpcfsdp.cli._kernel_profile import count_device_events


def _ev(name, device="CUDA"):
    return types.SimpleNamespace(name=name, device_type=types.SimpleNamespace(name=device))


def test_kernels_device_copies_and_memsets_are_launches_host_transfers_are_not():
    events = [_ev("void gelu_fwd<__nv_bfloat16>(...)"), _ev("ampere_bf16_s16816gemm_bf16_128x128"),
              _ev("Memcpy DtoD (Device -> Device)"), _ev("Memset (Device)"), _ev("Memcpy HtoD (Pinned -> Device)"),
              _ev("Memcpy DtoH (Device -> Pageable)"), _ev("aten::mm", device="CPU"), _ev("cudaLaunchKernel", "CPU")]
    got = count_device_events(events)
    assert got == {"launches": 4, "by_kind": {"kernel": 2, "memcpy DtoD": 1, "memset": 1}, "transfers": 2}


def test_profile_kernels_on_the_cpu_is_an_error_naming_the_device():
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "bench", "train", "--strategy", "none", "--n-layer", "1",
           "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--vocab-size", "256", "--batch-size", "2",
           "--warmup", "0", "--steps", "1", "--profile-kernels", "--json", "-"]
    env = {k: v for k, v in os.environ.items() if k != "HPCFSDP_CUDA_SIM"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode != 0 and "--profile-kernels: counts a GPU's kernels; use it with --device cuda" in out.stderr
