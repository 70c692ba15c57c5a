"""`hpcfsdp bench train|compare|checkpoint`: results are complete and sane; the CI regression check on FSDP overhead."""
import json
import os
import subprocess
import sys

import pytest

HP = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--block-size", "32", "--vocab-size", "256",
        "--batch-size", "2", "--warmup", "1", "--steps", "2"]
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", HPCFSDP_PROGRESS="0")


def _run(cmd, timeout=240):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def test_bench_train_reports_every_field_at_2_ranks(tmp_path):
    js = tmp_path / "r.jsonl"
    _run(HP + ["launch", "-n", "2", "--", "hpcfsdp", "bench", "train", *TINY, "--meta-init", "--json", str(js)])
    _run(HP + ["bench", "train", "--strategy", "none", *TINY, "--json", str(js)])
    sharded, single = [json.loads(line) for line in js.read_text().splitlines()]
    for r in (sharded, single):
        assert r["step_time_s"] > 0 and r["tokens_per_s"] > 0 and len(r["step_times_s"]) == 2
        assert 0 <= r["exposed_comm_frac"] <= 1
    assert sharded["world_size"] == 2 and len(sharded["peak_mem_bytes"]) == 2
    # two ranks each hold about half of what the single process holds (params + grads + AdamW state)
    ratio = max(sharded["sharded_state_bytes"]) / single["sharded_state_bytes"][0]
    assert 0.45 < ratio < 0.6, ratio


def test_bench_train_tp_splits_the_model_and_counts_data_parallel_tokens(tmp_path):
    js = tmp_path / "tp.jsonl"
    _run(HP + ["launch", "-n", "2", "--", "hpcfsdp", "bench", "train", *TINY, "--json", str(js)])
    _run(HP + ["launch", "-n", "2", "--", "hpcfsdp", "bench", "train", *TINY, "--tp", "2", "--json", str(js)])
    fsdp, tp = [json.loads(line) for line in js.read_text().splitlines()]
    assert fsdp["tp"] == 1 and tp["tp"] == 2 and tp["world_size"] == 2
    # one data-parallel rank: the tokens of one batch per step (FSDP at 2 ranks: two batches)
    assert tp["tokens_per_s"] * tp["step_time_s"] == pytest.approx(2 * 32)
    assert fsdp["tokens_per_s"] * fsdp["step_time_s"] == pytest.approx(2 * 2 * 32)
    # the two tp ranks each hold part of the model: well under the whole (FSDP halves it exactly)
    assert max(tp["sharded_state_bytes"]) < 0.8 * 2 * max(fsdp["sharded_state_bytes"])
    bad = subprocess.run(HP + ["bench", "train", *TINY, "--tp", "2", "--strategy", "none"], capture_output=True,
                         text=True, timeout=120, env=ENV)
    assert bad.returncode != 0 and "--tp 2: needs a sharded strategy" in bad.stderr + bad.stdout


def test_bench_train_quantized_collectives_and_their_wire_bound(tmp_path):
    """--quantize-weights/--quantize-grads put QuantizedAllGather/ReduceScatter on every unit (two simulated hosts
    of one rank), the wire bound counts codes and scales, and --compute-only still runs (the hop faked too)."""
    js = tmp_path / "q.jsonl"
    env = dict(ENV, HPCFSDP_RANKS_PER_NODE="1")
    for extra in ([], ["--quantize-weights", "int8", "--quantize-grads", "int4"]):
        out = subprocess.run(HP + ["launch", "-n", "2", "--", "hpcfsdp", "bench", "train", *TINY, "--link-rate",
                                   "1gbit", "--compute-only", *extra, "--json", str(js)],
                             capture_output=True, text=True, timeout=240, env=env)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    plain, quant = [json.loads(line) for line in js.read_text().splitlines()]
    assert plain["hosts"] == quant["hosts"] == 2
    assert (plain["quantize_weights"], quant["quantize_weights"], quant["quantize_grads"]) == ("none", "int8", "int4")
    assert quant["compute_only_s"] > 0
    # FULL_SHARD: weights gathered (once + 2 twice) times (the root and the last block once), gradients once:
    # 4 -> 1 + 4/256 and 4 -> 0.5 + 4/256 bytes
    ratio = quant["wire_min_bytes_per_host"] / plain["wire_min_bytes_per_host"]
    assert 0.2 < ratio < 0.27, ratio
    # the step-time model (`hpcfsdp plan`) counts the same bytes for the same GPT and quantization
    from hpcfsdp.cli import _stepmodel as sm

    for res, qw, qg in ((plain, "none", "none"), (quant, "int8", "int4")):
        shape = sm.gpt_shape(256, 32, 2, 64, 2, quantize_weights=qw, quantize_grads=qg, keep_last=True)
        assert res["model"]["params"] == shape.params
        assert sm.wire_bound(shape, "FULL_SHARD", 2, 1.0) == pytest.approx(res["wire_min_bytes_per_host"])


def test_bench_checkpoint_io(tmp_path):
    js = tmp_path / "io.jsonl"
    _run(HP + ["launch", "-n", "2", "--", "hpcfsdp", "bench", "checkpoint", "--bytes", "8M", "--dir",
               str(tmp_path / "d"), "--json", str(js)])
    res = json.loads(js.read_text())
    assert res["roundtrip_ok"] and res["world_size"] == 2 and res["bytes"] >= 8 << 20
    assert res["save_GBps"] > 0 and res["load_GBps"] > 0


@pytest.mark.system
def test_bench_compare_quick_fsdp_overhead_regression(tmp_path):
    """The CI regression check: FULL_SHARD at 2 ranks costs at most 1.5x two unsharded processes running at once
    (the same machine's contention, without the sharding). A timing, so it runs in the system tier (CI, a quiet
    machine), not the default one a user runs beside other work. A noisy neighbour can spoil one measurement, so a
    second one is taken before failing (the better one counts)."""
    summaries = []
    for attempt in range(2):
        js = tmp_path / f"cmp{attempt}.json"
        out = subprocess.run(HP + ["bench", "compare", "--quick", "--json", str(js)], capture_output=True, text=True,
                             timeout=600, env=ENV)
        assert js.exists(), out.stdout[-2000:] + out.stderr[-3000:]
        s = json.loads(js.read_text())
        summaries.append(s)
        assert len(s["runs"]["hp_single_concurrent"]) == len(s["runs"]["hp_fsdp"]) == 3
        med = s["median_step_s"]
        assert s["hp_ratio"] == pytest.approx(med["hp_fsdp"] / med["hp_single"])
        runs = s["runs"]
        assert s["hp_ratio_vs_concurrent"] == pytest.approx(min(runs["hp_fsdp"]) / min(runs["hp_single_concurrent"]))
        over = s["hp_ratio_vs_concurrent"] > 1.5  # the command's own verdict: exit 1 and a line saying so
        assert out.returncode == int(over), out.stdout[-2000:] + out.stderr[-3000:]
        assert ("exceeds 1.5" in out.stderr) == over, out.stderr[-2000:]
        if not over:
            break
    assert 0 < min(s["hp_ratio_vs_concurrent"] for s in summaries) <= 1.5, summaries


def test_compare_uses_the_peer_script_in_the_repository(tmp_path):
    import argparse

    from hpcfsdp.cli import bench_train

    script = bench_train.peer_script()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert script == os.path.join(root, "benchmarks", "peer", "torch_fsdp2_bench.py")
    assert os.path.isfile(script) and os.path.isfile(os.path.join(root, "benchmarks", "peer", "requirements.txt"))
    args = argparse.Namespace(peer_script=None, tie_weights=True, vocab_size=256, block_size=32, n_layer=2, n_head=2,
                              n_embd=64, batch_size=2, warmup=1, steps=2, torch_python="/venv/bin/python", nprocs=2)
    cmd = bench_train._torch_cmd(args, "fsdp", "out.jsonl")
    assert cmd[:6] == ["/venv/bin/torchrun", "--standalone", "--nproc-per-node", "2", script, "--mode"]
    assert "--tie" in cmd  # the same (tied) model as hpcfsdp's default
    args.tie_weights = False
    assert "--tie" not in bench_train._torch_cmd(args, "single", "out.jsonl")
    # a peer script that is not there is refused before any run
    out = subprocess.run(HP + ["bench", "compare", "--torch-python", sys.executable, "--peer-script",
                               str(tmp_path / "none.py")], capture_output=True, text=True, timeout=60, env=ENV)
    assert out.returncode != 0 and "no PyTorch peer script at" in out.stderr


def test_no_prefetch_turns_prefetch_off_with_and_without_meta_init(tmp_path):
    """--no-prefetch once acted only together with --meta-init (the JSON still said prefetch off); the result
    now reads prefetching back from the FSDP units."""
    js = tmp_path / "p.jsonl"
    for extra in ([], ["--no-prefetch"], ["--no-prefetch", "--meta-init"]):
        _run(HP + ["launch", "-n", "2", "--", "hpcfsdp", "bench", "train", *TINY, *extra, "--json", str(js)])
    default, off, off_meta = [json.loads(line) for line in js.read_text().splitlines()]
    assert default["prefetch"] is True and off["prefetch"] is False and off_meta["prefetch"] is False
