"""`bench train` against its bounds: rate parsing, the wire minimum, the compute-only switch, link bytes across hosts.

The last test runs on simulated hosts (system tier); the others run in the default tier.
"""
import json
import sys

import numpy as np
import pytest

from hpcfsdp.cli.bench_train import _unit_numels, local_collectives, parse_rate, wire_min_bytes

PY = sys.executable


@pytest.mark.parametrize("text,bps", [("200mbit", 200e6), ("1gbit", 1e9), ("1.5Gbit", 1.5e9), ("100kbit", 1e5),
                                      ("25000000", 25e6)])
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("bad", ["200mb", "fast", "", "-1gbit", "0"])
def test_parse_rate_rejects(bad):
    with pytest.raises(ValueError, match="link rate"):
        parse_rate(bad)


def test_wire_minimum_follows_the_definition():
    # blocks (twice: forward and backward) 3000 params, root (once) 1000; fp32 gathers, fp32 gradients
    once, twice, H = 1000, 3000, 4
    fs = wire_min_bytes("FULL_SHARD", H, once, twice, 4, 4)
    assert fs == pytest.approx(3 / 4 * (1000 + 2 * 3000) * 4 + 3 / 4 * 4000 * 4)
    assert wire_min_bytes("HYBRID_SHARD", H, once, twice, 4, 4) == pytest.approx(2 * 3 / 4 * 4000 * 4)
    assert wire_min_bytes("FULL_SHARD", H, once, twice, 2, 4) == pytest.approx(3 / 4 * 7000 * 2 + 3 / 4 * 16000)
    assert wire_min_bytes("FULL_SHARD", 1, once, twice, 4, 4) == 0.0
    with pytest.raises(ValueError, match="no wire bound for strategy 'none'"):
        wire_min_bytes("none", 2, once, twice, 4, 4)


def test_units_gathered_once_and_twice():
    from hpcfsdp.cli.config import TrainConfig
    from hpcfsdp.cli._common import build_gpt

    cfg = TrainConfig(vocab_size=50, block_size=8, n_layer=2, n_head=2, n_embd=16, strategy="FULL_SHARD")
    model = build_gpt(cfg)
    blocks = sum(p.numel() for b in model.blocks for p in b.parameters())
    last = sum(p.numel() for p in model.blocks[-1].parameters())
    total = sum(p.numel() for p in model.parameters())
    # by strategy: the root and the last block keep their parameters from forward to backward (shard_gpt)
    assert _unit_numels(model, cfg) == (total - blocks + last, blocks - last)
    cfg.reshard_after_forward = True  # asked for: every unit reshards, the root and the last block included
    assert _unit_numels(model, cfg) == (0, total)
    cfg.reshard_after_forward = None
    cfg.strategy = "SHARD_GRAD_OP"  # nothing reshards after forward: everything is gathered once
    assert _unit_numels(model, cfg) == (total, 0)


@pytest.mark.mpi(min_size=2)
def test_local_collectives_copy_locally_and_refuse_others():
    import hpcfsdp.distributed as dist
    from hpcfsdp.distributed._c10d_groups import default_group

    pg = default_group()
    w, r = pg.size(), pg.rank()
    x = np.full(3, r + 1.0, np.float32)
    out = np.zeros(3 * w, np.float32)
    with local_collectives():
        work = pg.all_gather_into(out, x, async_op=True)
        work.wait()
        assert np.array_equal(out, np.tile(x, w))  # this rank's piece in every slot: no communication
        big = np.arange(3 * w, dtype=np.float32)
        piece = np.zeros(3, np.float32)
        pg.reduce_scatter_into(piece, big)
        assert np.array_equal(piece, big.reshape(w, 3).sum(0))
        a = np.full(4, r + 1.0, np.float32)
        pg.all_reduce_(a)
        assert np.array_equal(a, np.full(4, r + 1.0))
    # the real ones are back
    pg.all_gather_into(out, x)
    assert np.array_equal(out, np.repeat(np.arange(1, w + 1, dtype=np.float32), 3))
    with pytest.raises(RuntimeError, match="compute-only steps still issued collectives"):
        with local_collectives():
            t = np.ones(2, np.float32)
            pg.broadcast_(t, 0)
    dist.barrier()


@pytest.mark.system
@pytest.mark.timeout(300)
def test_bench_train_counts_host_bytes_and_bounds(cluster):
    """2 hosts x 2 ranks: HYBRID_SHARD's cross-host all-reduce between the two replicas is the whole of a host's
    traffic and MPICH's two-rank all-reduce sends exactly the minimum, so the calibrated bytes must match the
    wire minimum; FULL_SHARD cannot go below it."""
    model = ["--vocab-size", "256", "--block-size", "16", "--n-layer", "2", "--n-head", "2", "--n-embd", "64",
             "--batch-size", "2", "--warmup", "1", "--steps", "2"]
    for strategy in ("HYBRID_SHARD", "FULL_SHARD"):
        extra = ["--mesh", "2x2"] if strategy == "HYBRID_SHARD" else []
        out, sent = cluster.launch(2, 2, [PY, "-m", "hpcfsdp.cli.main", "bench", "train", *model, "--strategy", strategy,
                                          *extra, "--link", "eth0", "--link-rate", "1gbit", "--compute-only", "--json", "-"],
                                   timeout=240)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
        assert res["hosts"] == 2 and res["link"] == "eth0"
        per_step, least = res["bytes_sent_per_host_per_step"], res["wire_min_bytes_per_host"]
        assert len(per_step) == 2 and least > 0
        if strategy == "HYBRID_SHARD":
            for b in per_step:
                assert abs(b - least) <= 0.1 * least, (per_step, least)
        else:
            for b in per_step:
                assert b >= 0.97 * least, (per_step, least)
        assert 1.0 <= res["link_bytes_per_payload_byte"] < 1.2
        assert res["wire_bound_s"] == pytest.approx(least * 8 / 1e9)
        assert res["compute_only_s"] > 0
        assert res["step_over_bound"] == pytest.approx(res["step_time_s"] / max(res["compute_only_s"], res["wire_bound_s"]))
        # the whole job (warm-up, calibration and compute-only steps included) sent at least the measured steps
        assert min(sent[:2]) >= 2 * min(per_step)


def _bench(*args, n=None):
    import subprocess

    cmd = [PY, "-m", "hpcfsdp.cli.main", "bench", "train", "--vocab-size", "256", "--block-size", "8", "--n-layer", "1",
           "--n-head", "2", "--n-embd", "16", "--batch-size", "2", "--warmup", "1", "--steps", "2", *args]
    if n:
        cmd = [PY, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def test_bench_train_bounds_on_one_host():
    """One host: nothing must cross a link (wire bound 0), so the step is compared with compute-only."""
    out = _bench("--link", "lo", "--link-rate", "1gbit", "--compute-only", "--json", "-", n=2)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    assert res["hosts"] == 1 and res["wire_bound_s"] == 0 and res["wire_min_bytes_per_host"] == 0
    assert len(res["bytes_sent_per_host_per_step"]) == 1 and res["link_bytes_per_payload_byte"] == 1.0
    assert res["compute_only_s"] > 0
    assert res["step_over_bound"] == pytest.approx(res["step_time_s"] / res["compute_only_s"])


@pytest.mark.parametrize("args,msg", [(["--link", "nosuch0"], "--link nosuch0: no such network interface"),
                                      (["--strategy", "none", "--compute-only"], "not with --strategy none"),
                                      (["--link-rate", "fast"], "link rate 'fast'")])
def test_bench_train_bound_options_bad_input(args, msg):
    out = _bench(*args)
    assert out.returncode != 0 and msg in out.stderr, out.stderr[-2000:]


@pytest.mark.system
@pytest.mark.timeout(400)
def test_quantized_collectives_put_only_their_bytes_on_the_wire(cluster):
    """2 hosts x 2 ranks, bytes counted on the hosts' links: int8 weights + int8 gradients send at most 0.3x the
    fp32 run's bytes per host per step (FULL_SHARD and HYBRID_SHARD), int4 gradients under HYBRID_SHARD at most
    0.15x, each near its quantized wire minimum: a silent full-precision fallback fails here."""
    model = ["--vocab-size", "1024", "--block-size", "64", "--n-layer", "2", "--n-head", "4", "--n-embd", "256",
             "--batch-size", "2", "--warmup", "1", "--steps", "2"]

    def run(strategy, *quant):
        extra = ["--mesh", "2x2"] if strategy == "HYBRID_SHARD" else []
        out, _ = cluster.launch(2, 2, [PY, "-m", "hpcfsdp.cli.main", "bench", "train", *model, "--strategy", strategy,
                                       *extra, *quant, "--link", "eth0", "--link-rate", "10gbit", "--json", "-"],
                                timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
        assert res["quantize_weights"] == (quant[1] if quant else "none")
        return max(res["bytes_sent_per_host_per_step"]), res["wire_min_bytes_per_host"]

    for strategy, grads, most in (("FULL_SHARD", "int8", 0.3), ("HYBRID_SHARD", "int8", 0.3),
                                  ("HYBRID_SHARD", "int4", 0.15)):
        full, _ = run(strategy)
        sent, least = run(strategy, "--quantize-weights", "int8", "--quantize-grads", grads)
        assert sent <= most * full, (strategy, grads, sent, full)
        assert 0.97 * least <= sent <= 1.3 * least, (strategy, grads, sent, least)


@pytest.mark.system
@pytest.mark.timeout(500)
def test_quantized_training_on_two_hosts_follows_the_fp32_loss(tmp_path):
    """scripts/quantize_accuracy.py at 30 steps (the 300-step runs are in BENCHMARKS.md): the demo GPT on 2 simulated
    hosts x 2 ranks, the cross-host hops really quantized; the median loss of the last 20 steps within 2% of the
    fp32 run's for int8 gradients and 3% for int4 (with and without error feedback), every curve really differing."""
    import os
    import subprocess

    out = tmp_path / "acc.json"
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "quantize_accuracy.py")
    res = subprocess.run([PY, script, "--steps", "30", "--json", str(out), "--png", str(tmp_path / "acc.png")],
                         capture_output=True, text=True, timeout=480)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    rows, curves = {r["variant"]: r for r in data["rows"]}, data["curves"]
    fp32 = curves["fp32"]
    assert len(fp32) == 30 and fp32[-1] < fp32[0] - 1.5
    for name, most in (("int8 weights + int8 grads", 0.02), ("int8 weights + int4 grads", 0.03),
                       ("int8 weights + int4 grads, no error feedback", 0.03)):
        assert abs(rows[name]["median_gap"]) <= most, (name, rows[name])
        assert curves[name] != fp32 and abs(curves[name][0] - fp32[0]) < 1e-3 * fp32[0]  # the same start, rounded
    assert (tmp_path / "acc.png").stat().st_size > 10_000
