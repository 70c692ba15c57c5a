"""The step-time model (hpcfsdp.cli._stepmodel) against hand-computed cases, its fit, and `hpcfsdp plan`."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from hpcfsdp.cli import _stepmodel as sm

HP = [sys.executable, "-m", "hpcfsdp.cli.main"]


def test_parse_rate():
    assert sm.parse_rate("200mbit") == 25e6
    assert sm.parse_rate("1gbit") == 125e6
    assert sm.parse_rate("200G") == 25e9
    assert sm.parse_rate(8e6) == 1e6
    with pytest.raises(ValueError, match="link rate 'fast'"):
        sm.parse_rate("fast")


def test_wire_bound_is_the_issue_definition():
    shape = sm.ModelShape(numels=[100, 50, 50], flops=[1, 1, 1], param_bytes=4, grad_bytes=4)
    # FULL_SHARD, 2 hosts: 1/2 of (root once + blocks twice) parameter bytes + 1/2 of the gradient bytes
    assert sm.wire_bound(shape, "FULL_SHARD", 2, 10.0) == pytest.approx((0.5 * (100 + 2 * 100) * 4 + 0.5 * 800) / 10)
    # HYBRID_SHARD, 4 hosts: 2 * 3/4 of the gradient bytes
    assert sm.wire_bound(shape, "HYBRID_SHARD", 4, 10.0) == pytest.approx(2 * 0.75 * 800 / 10)
    assert sm.wire_bound(shape, "FULL_SHARD", 1, 10.0) == 0.0
    with pytest.raises(ValueError, match="NO_SHARD"):
        sm.wire_bound(shape, "NO_SHARD", 2, 10.0)


def test_wire_bound_matches_bench_train_on_the_issue_gpt():
    from hpcfsdp.cli.bench_train import wire_min_bytes

    shape = sm.gpt_shape(1024, 64, 2, 256, 2)
    assert shape.params == 1858560  # the GPT of `hpcfsdp bench train` with these flags
    root, inner = shape.numels[0], sum(shape.numels[1:])
    for strategy in ("FULL_SHARD", "HYBRID_SHARD"):
        for hosts in (2, 4):
            ref = wire_min_bytes(strategy, hosts, root, inner, 4, 4)
            assert sm.wire_bound(shape, strategy, hosts, 1.0) == pytest.approx(ref)


def test_collective_times_hand_computed():
    lk = sm.Links(inter_rate=100.0, alpha_inter=0.1, bw_intra=1000.0, alpha_intra=0.01)
    # node-aware: across hosts (1 step + half the buffer on the link) then inside the host
    ag, ar = sm.collective_times(1000, "FULL_SHARD", 2, 2, lk, hierarchical=True)
    assert (ag, ar) == (pytest.approx(0.1 + 0.5 * 1000 / 100 + 0.01 + 0.5 * 1000 / 1000), 0.0)
    # flat ring over 4 ranks: 3 steps, and (3/4)/(1/2) = 1.5x the node-aware bytes on the host link
    ag, _ = sm.collective_times(1000, "FULL_SHARD", 2, 2, lk, hierarchical=False)
    assert ag == pytest.approx(3 * 0.1 + 1.5 * 0.5 * 1000 / 100)
    ag, _ = sm.collective_times(1000, "FULL_SHARD", 2, 2, dataclasses.replace(lk, flat_excess=2.0), False)
    assert ag == pytest.approx(3 * 0.1 + 2.0 * 0.5 * 1000 / 100)
    # one rank per host: flat and node-aware are the same ring
    assert sm.collective_times(1000, "FULL_SHARD", 4, 1, lk, False) == sm.collective_times(1000, "FULL_SHARD", 4, 1,
                                                                                          lk, True)
    # HYBRID_SHARD: inside the host, then an all-reduce across hosts (2(H-1) steps, 2(H-1)/H of the buffer)
    ag, ar = sm.collective_times(1000, "HYBRID_SHARD", 2, 2, dataclasses.replace(lk, eff_inter=0.5))
    assert ag == pytest.approx(0.01 + 0.5)
    assert ar == pytest.approx(2 * 0.1 + 1000 / 50)
    with pytest.raises(ValueError, match="strategy"):
        sm.collective_times(1000, "SHARD_GRAD_OP", 2, 2, lk)


def test_call_inter_is_charged_once_per_cross_host_collective():
    lk = sm.Links(inter_rate=100.0, alpha_inter=0.1, bw_intra=1000.0, alpha_intra=0.01)
    called = dataclasses.replace(lk, call_inter=0.7)
    for hosts, g in ((2, 2), (4, 1), (8, 4)):
        for hier in (True, False):  # the same 0.7 s whatever the ring length or the bytes
            plain = sm.collective_times(1000, "FULL_SHARD", hosts, g, lk, hier)
            assert sm.collective_times(1000, "FULL_SHARD", hosts, g, called, hier) == (
                pytest.approx(plain[0] + 0.7), 0.0)
        ag, ar = sm.collective_times(5000, "HYBRID_SHARD", hosts, g, lk)
        assert sm.collective_times(5000, "HYBRID_SHARD", hosts, g, called) == (pytest.approx(ag),
                                                                               pytest.approx(ar + 0.7))
    # nothing crosses hosts on one host
    assert sm.collective_times(1000, "FULL_SHARD", 1, 4, called) == sm.collective_times(1000, "FULL_SHARD", 1, 4, lk)
    assert sm.collective_times(1000, "HYBRID_SHARD", 1, 4, called)[1] == 0.0
    with pytest.raises(ValueError, match="call_inter must be >= 0"):
        dataclasses.replace(lk, call_inter=-1e-3)


def test_simulate_without_communication_is_the_compute():
    fwd, bwd = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0]
    step, compute, comm = sm.simulate(fwd, bwd, [0.0] * 3, [0.0] * 3, [0.0] * 3, opt=0.5)
    assert step == compute == pytest.approx(18.5) and comm == 0.0


def test_simulate_compute_bound_exposes_only_the_first_gathers_and_last_reductions():
    c, x = 10.0, 0.01
    ag, rs, ar = [x, 2 * x, 3 * x], [4 * x, 5 * x, 6 * x], [7 * x, 8 * x, 9 * x]
    step, compute, _ = sm.simulate([c] * 3, [2 * c] * 3, ag, rs, ar)
    # the root's and the first block's gathers precede any compute; the first block's and the root's
    # reduce-scatter + all-reduce follow the last backward; everything else hides behind compute
    assert step - compute == pytest.approx(ag[0] + ag[1] + rs[1] + ar[1] + rs[0] + ar[0])


def test_simulate_lies_between_the_overlap_limits():
    fwd, bwd = [0.1, 0.2, 0.2, 0.2], [0.2, 0.4, 0.4, 0.4]
    for scale in (0.01, 0.3, 1.0, 10.0):
        ag, rs, ar = [scale] * 4, [scale] * 4, [scale / 2] * 4
        step, compute, comm = sm.simulate(fwd, bwd, ag, rs, ar)
        serial, _, _ = sm.simulate(fwd, bwd, ag, rs, ar, overlap=False)
        assert serial == pytest.approx(compute + comm)
        assert max(compute, comm) - 1e-12 <= step <= serial + 1e-12
    # communication-bound: the compute that cannot overlap is the last block's forward... bounded by one unit's
    step, compute, comm = sm.simulate(fwd, bwd, [10.0] * 4, [10.0] * 4, [0.0] * 4)
    assert comm < step <= comm + fwd[0] + bwd[0] + max(fwd) + max(bwd) + 1e-12


def test_predict_step_splits_compute_by_flops_and_adds_tcp_cpu():
    shape = sm.ModelShape(numels=[10, 10], flops=[1, 3], param_bytes=4, grad_bytes=4)
    free = sm.Links(inter_rate=1e30, alpha_inter=0.0, bw_intra=1e30, alpha_intra=0.0)
    assert sm.predict_step(shape, "FULL_SHARD", 2, 2, free, 2.0) == pytest.approx(2.0)
    # 1 ns per byte the host sends, host bytes = the wire minimum (node-aware): 1/2 (10 + 20) * 4 + 1/2 * 80
    cpu = dataclasses.replace(free, cpu_per_byte=1e-3)
    assert sm.predict_step(shape, "FULL_SHARD", 2, 2, cpu, 2.0) == pytest.approx(2.0 + 1e-3 * (60 + 40))
    # one machine's cores serve every simulated host: the bytes of all 2 hosts
    shared = dataclasses.replace(cpu, cpu_scope="machine")
    assert sm.predict_step(shape, "FULL_SHARD", 2, 2, shared, 2.0) == pytest.approx(2.0 + 2 * 1e-3 * (60 + 40))
    with pytest.raises(ValueError, match="cpu_scope must be 'host' or 'machine', got 'node'"):
        dataclasses.replace(cpu, cpu_scope="node")


def _synthetic_runs(shape, truth, hierarchical=False):
    runs = []
    for hosts, g in ((2, 2), (4, 1)):
        for rate in (25e6, 125e6):
            for strategy, compute in (("FULL_SHARD", 0.14), ("HYBRID_SHARD", 0.16)):
                lk = dataclasses.replace(truth, inter_rate=rate)
                runs.append(dict(strategy=strategy, hosts=hosts, per_host=g, rate=rate, compute_s=compute,
                                 step_s=sm.predict_step(shape, strategy, hosts, g, lk, compute, hierarchical)))
    return runs


def test_fit_recovers_known_parameters_from_synthetic_runs():
    shape = sm.gpt_shape(1024, 64, 2, 256, 2)
    truth = sm.Links(inter_rate=25e6, alpha_inter=500e-6, eff_inter=0.75, cpu_per_byte=6e-9, flat_excess=1.68)
    runs = _synthetic_runs(shape, truth)
    base = sm.Links(inter_rate=25e6, alpha_inter=50e-6, eff_inter=1.0, flat_excess=1.68)
    got, errors = sm.fit(runs, shape, base, params=("alpha_inter", "eff_inter", "cpu_per_byte"), rounds=200)
    assert got.eff_inter == pytest.approx(0.75, rel=0.02)
    assert got.cpu_per_byte == pytest.approx(6e-9, rel=0.05)
    assert got.alpha_inter == pytest.approx(500e-6, rel=0.15)
    assert max(abs(e) for e in errors) < 0.005
    with pytest.raises(ValueError, match="cannot fit 'rate'"):
        sm.fit(runs, shape, base, params=("rate",))


def test_fit_separates_the_per_call_cost_from_the_ring_latency():
    """Node-aware rings of 1 step (2 hosts) and 3 (4 hosts) tell a per-collective cost from alpha (per step)."""
    shape = sm.gpt_shape(1024, 64, 2, 256, 2)
    truth = sm.Links(inter_rate=25e6, alpha_inter=400e-6, eff_inter=0.9, cpu_per_byte=1e-9, call_inter=2.5e-3)
    runs = _synthetic_runs(shape, truth, hierarchical=True)
    base = sm.Links(inter_rate=25e6, alpha_inter=100e-6, eff_inter=1.0)
    got, errors = sm.fit(runs, shape, base, params=("alpha_inter", "eff_inter", "cpu_per_byte", "call_inter"),
                         hierarchical=True, rounds=300)
    assert got.call_inter == pytest.approx(2.5e-3, rel=0.05)
    assert got.alpha_inter == pytest.approx(400e-6, rel=0.15)
    assert got.eff_inter == pytest.approx(0.9, rel=0.02)
    assert max(abs(e) for e in errors) < 0.005


def test_memory_per_rank_hand_computed():
    shape = sm.ModelShape(numels=[1000, 3000], flops=[1, 1], param_bytes=2, grad_bytes=2)
    m = sm.memory_per_rank(shape, "FULL_SHARD", 8, 4, tokens_per_rank=10, n_embd=16, n_layer=2)
    assert m["state"] == pytest.approx(4000 * 16 / 8)
    assert m["gathered"] == 2 * 3000 * 2 + 3000 * 2
    assert m["activations"] == 34 * 16 * 10 * 2
    assert m["total"] == pytest.approx(m["state"] + m["gathered"] + m["activations"])
    h = sm.memory_per_rank(shape, "HYBRID_SHARD", 8, 4, tokens_per_rank=10, n_embd=16, n_layer=2)
    assert h["state"] == pytest.approx(4000 * 16 / 4)


def test_plan_help():
    out = subprocess.run(HP + ["plan", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--gpus-per-node" in out.stdout and "--fit" in out.stdout


def test_plan_small_table():
    out = subprocess.run(HP + ["plan", "--ranks", "8,16", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pl = json.loads(out.stdout)["plan"]
    rows = {(r["ranks"], r["strategy"]): r for r in pl["rows"]}
    assert set(rows) == {(8, "FULL_SHARD"), (8, "HYBRID_SHARD"), (16, "FULL_SHARD"), (16, "HYBRID_SHARD")}
    shape = sm.gpt_shape(50304, 2048, 32, 4096, 2, param_bytes=2, grad_bytes=2)
    assert pl["params"] == shape.params
    assert pl["compute_s"] == pytest.approx(3 * sum(shape.flops) / (989e12 * 0.4))
    # sharded state 16 bytes per parameter over the shard group; FULL_SHARD halves from 8 to 16 ranks
    assert rows[8, "FULL_SHARD"]["mem_state_gib"] == pytest.approx(shape.params * 16 / 8 / 2**30)
    assert rows[16, "FULL_SHARD"]["mem_state_gib"] == pytest.approx(rows[8, "FULL_SHARD"]["mem_state_gib"] / 2)
    assert rows[16, "HYBRID_SHARD"]["mem_state_gib"] == pytest.approx(rows[8, "HYBRID_SHARD"]["mem_state_gib"])
    # 2 -> 4 nodes: the wire bound grows by (3/4)/(1/2)
    assert rows[16, "FULL_SHARD"]["wire_bound_s"] == pytest.approx(1.5 * rows[8, "FULL_SHARD"]["wire_bound_s"])
    for r in pl["rows"]:
        assert r["step_s"] >= max(r["compute_s"], r["wire_bound_s"] / 0.8)


def test_plan_text_table_and_bad_ranks():
    out = subprocess.run(HP + ["plan", "--ranks", "8"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "| 8 | 2 | FULL_SHARD |" in out.stdout
    out = subprocess.run(HP + ["plan", "--ranks", "10"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--ranks 10 is not a multiple of --gpus-per-node 4" in out.stderr


def test_plan_fit_and_check_from_json_lines(tmp_path):
    shape = sm.gpt_shape(1024, 64, 2, 256, 2, keep_last=True)  # as shard_gpt wraps the benchmarked model
    truth = sm.Links(inter_rate=25e6, alpha_inter=300e-6, eff_inter=0.8, flat_excess=1.5)
    fit_file, check_file = tmp_path / "fit.jsonl", tmp_path / "check.jsonl"
    model = {"vocab_size": 1024, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 256, "batch_size": 2,
             "params": shape.params}
    for path, rate in ((fit_file, 25e6), (check_file, 125e6)):
        with open(path, "w") as f:
            for strategy in ("FULL_SHARD", "HYBRID_SHARD"):
                step = sm.predict_step(shape, strategy, 2, 2, dataclasses.replace(truth, inter_rate=rate), 0.15,
                                       hierarchical=False)
                f.write(json.dumps({"strategy": strategy, "world_size": 4, "hosts": 2, "link_rate_bps": 8 * rate,
                                    "model": model, "step_time_s": step, "compute_only_s": 0.15}) + "\n")
            f.write(json.dumps({"peer": "torch", "median_step_s": 1.0}) + "\n")  # skipped
    out = subprocess.run(HP + ["plan", "--collectives", "flat", "--fit", str(fit_file), "--check", str(check_file),
                               "--json"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert len(res["fit"]["runs"]) == 2 and len(res["check"]) == 2
    assert all(abs(r["error"]) < 0.01 for r in res["check"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"strategy": "FULL_SHARD", "step_time_s": 1.0}) + "\n")
    out = subprocess.run(HP + ["plan", "--fit", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "without compute_only_s" in out.stderr
