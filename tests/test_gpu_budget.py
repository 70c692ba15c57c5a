"""The GPU step's launch and sync budget, counted on the simulated device (scripts/gpu_counts.py, issue 28): a
regression in the fused path (an op falling back to its unfused passes, a host read in the step) fails here.

The block is gpt-medium's (width 1024, 16 heads) on a short sequence; the counts do not depend on T or batch.
Runs in its own process (HPCFSDP_CUDA_SIM=1), so it needs no GPU and runs in the default tier.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The budgets of issue 28 (what the fused path reaches: BENCHMARKS.md).
BLOCK_LAUNCHES = 40  # issue 28's budget; 39 measured at 2 blocks (BENCHMARKS.md, 2026-12-03 later)
OPTIMIZER_LAUNCHES_PER_GROUP = 2


def _counts(tmp_path, fused, layers=2):
    js = tmp_path / f"counts{fused}_{layers}.jsonl"
    env = dict(os.environ, HPCFSDP_CUDA_SIM="1", HPCFSDP_FUSED_KERNELS=str(fused), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_counts.py"), "--config", "gpt-medium",
                          "--layers", str(layers), "--block-size", "32", "--vocab", "512", "--json", str(js)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(js.read_text())


@pytest.mark.timeout(300)
def test_a_block_and_the_optimizer_keep_the_launch_budget_and_the_step_makes_no_host_sync(tmp_path):
    r = _counts(tmp_path, 1)
    assert r["fused_kernels"] and r["fsdp_groups"] == 3  # two blocks and the root
    assert r["block_launches"] <= BLOCK_LAUNCHES, (r["block_forward_top_ops"], r["block_backward_top_ops"])
    assert r["optimizer_launches_per_group"] <= OPTIMIZER_LAUNCHES_PER_GROUP, r["optimizer_launches"]
    assert r["step_host_syncs"] == 0, r["host_sync_sites"]  # the loss is read after the window, at logging
    # the unfused ops, side by side: the budget is the kernels' doing, not a counter that stopped counting
    u = _counts(tmp_path, 0)
    assert u["block_launches"] > 3 * r["block_launches"] and u["optimizer_launches"] > 50 * r["optimizer_launches"]
    assert u["step_host_syncs"] > 0


@pytest.mark.timeout(300)
def test_a_block_costs_the_step_at_most_the_budget_with_all_of_fsdp_s_work(tmp_path):
    """What one more block adds to the whole step (its FSDP casts, copies and collectives wherever they run,
    prefetches included), not only what its own forward and backward windows count."""
    two, three = _counts(tmp_path, 1, 2), _counts(tmp_path, 1, 3)
    assert three["fsdp_groups"] == 4 and three["step_host_syncs"] == 0
    assert three["step_launches"] - two["step_launches"] <= BLOCK_LAUNCHES, (two["step_launches"],
                                                                           three["step_launches"])
