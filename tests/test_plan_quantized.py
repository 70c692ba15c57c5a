"""The step-time model and `hpcfsdp plan` with quantized collectives: the bytes across hosts (codes + scales) against
hand counts from the parameter counts, the intra-host bytes (full-precision gradients), and the plan's flags."""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcfsdp.cli import _stepmodel as sm
from hpcfsdp.cli.config import ConfigError, TrainConfig
from hpcfsdp._kernels import quantize as Q

HP = [sys.executable, "-m", "hpcfsdp.cli.main"]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

# the GPT of `bench train --vocab-size 1024 --block-size 64 --n-layer 2 --n-embd 256`, counted by hand:
# root = token + position embeddings + final LayerNorm; a block = 12 n^2 weights + 13 n biases and norm parameters
ROOT = 1024 * 256 + 64 * 256 + 2 * 256
BLOCK = 12 * 256 * 256 + 13 * 256
PARAMS = ROOT + 2 * BLOCK


def _itemsize(kind, block, full):
    """Bytes per element by hand: int8 and fp8 one byte, int4 half a byte, plus a float32 scale per block."""
    return {"none": full, "int8": 1 + 4 / block, "fp8": 1 + 4 / block, "int4": 0.5 + 4 / block}[kind]


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("block", [64, 256])
def test_quantized_itemsize_is_the_payload_per_element(kind, block):
    assert sm.quantized_itemsize(kind, block, 4) == pytest.approx(_itemsize(kind, block, 4))
    # the real payload of n elements (a whole number of blocks) has that many bytes per element
    n = 8 * block
    payload = Q.quantize(np.linspace(-1, 1, n, dtype=np.float32), kind, block)
    assert payload.size == Q.payload_bytes(kind, n, block) == pytest.approx(n * sm.quantized_itemsize(kind, block, 4))
    assert sm.quantized_itemsize("none", block, 2) == 2


def test_bench_train_uses_the_models_definitions():
    from hpcfsdp.cli import bench_train

    assert bench_train.quantized_itemsize is sm.quantized_itemsize
    assert bench_train.wire_min_bytes is sm.wire_min_bytes
    with pytest.raises(ValueError, match="quantization dtype 'int2'"):
        sm.quantized_itemsize("int2", 256, 4)


@pytest.mark.parametrize("qw,qg,block", [("none", "none", 256), ("int8", "none", 256), ("none", "int4", 256),
                                         ("int8", "int4", 256), ("fp8", "int8", 64)])
def test_quantized_host_bytes_by_hand(qw, qg, block):
    shape = sm.gpt_shape(1024, 64, 2, 256, 2, quantize_weights=qw, quantize_grads=qg, quantize_block=block)
    assert shape.numels == [ROOT, BLOCK, BLOCK] and shape.params == PARAMS
    wbytes, gbytes = _itemsize(qw, block, 4), _itemsize(qg, block, 4)
    lk = sm.Links(inter_rate=1.0)
    for hosts in (2, 4):
        frac = (hosts - 1) / hosts
        # FULL_SHARD: the root gathered once, the blocks twice, at the quantized weight bytes; gradients once
        full = frac * (ROOT + 2 * 2 * BLOCK) * wbytes + frac * PARAMS * gbytes
        assert sm.wire_bound(shape, "FULL_SHARD", hosts, 1.0) == pytest.approx(full)
        assert sm.host_link_bytes(shape, "FULL_SHARD", hosts, 2, lk) == pytest.approx(full)
        # HYBRID_SHARD: weights never cross hosts; the replicate hop is an all-to-all + all-gather of the codes
        hsdp = 2 * frac * PARAMS * gbytes
        assert sm.wire_bound(shape, "HYBRID_SHARD", hosts, 10.0) == pytest.approx(hsdp / 10)
        assert sm.host_link_bytes(shape, "HYBRID_SHARD", hosts, 2, lk) == pytest.approx(hsdp)
    assert sm.wire_bound(shape, "FULL_SHARD", 1, 1.0) == 0.0


@pytest.mark.parametrize("qw,qg,block", [("none", "none", 256), ("int8", "int4", 256), ("fp8", "int8", 32),
                                         ("none", "int8", 128), ("int8", "none", 64)])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "HYBRID_SHARD"])
def test_wire_bound_agrees_with_bench_trains_wire_minimum(qw, qg, block, strategy):
    from hpcfsdp.cli.bench_train import quantized_itemsize, wire_min_bytes

    for pbytes, gbytes in ((4, 4), (2, 4)):  # bench: fp32 or 16-bit gathers, fp32 gradients
        shape = sm.gpt_shape(1024, 64, 2, 256, 2, param_bytes=pbytes, grad_bytes=gbytes, quantize_weights=qw,
                             quantize_grads=qg, quantize_block=block)
        for hosts in (1, 2, 3, 4):  # bench's units: the root gathered once, the blocks twice
            bench = wire_min_bytes(strategy, hosts, ROOT, 2 * BLOCK, quantized_itemsize(qw, block, pbytes),
                                   quantized_itemsize(qg, block, gbytes))
            assert sm.wire_bound(shape, strategy, hosts, 1.0) == pytest.approx(bench)


def test_flat_collectives_multiply_only_the_gathers_when_gradients_are_quantized():
    shape = sm.ModelShape(numels=[100, 50, 50], flops=[1, 1, 1], param_bytes=4, grad_bytes=4, quantize_grads="int8",
                          quantize_block=4)
    lk = sm.Links(inter_rate=1.0, flat_excess=1.5)
    # the quantized reduction's hop is an all-to-all across hosts whatever the group's collectives: not 1.5x
    gathers, grads = 0.5 * (100 + 2 * 100) * 4, 0.5 * 200 * (1 + 4 / 4)
    assert sm.host_link_bytes(shape, "FULL_SHARD", 2, 2, lk, hierarchical=False) == pytest.approx(1.5 * gathers + grads)
    plain = dataclasses.replace(shape, quantize_grads="none")
    assert sm.host_link_bytes(plain, "FULL_SHARD", 2, 2, lk, False) == pytest.approx(1.5 * (gathers + 0.5 * 200 * 4))


def test_quantized_reduction_times_full_bytes_inside_codes_across():
    lk = sm.Links(inter_rate=100.0, alpha_inter=0.1, bw_intra=1000.0, alpha_intra=0.01, call_inter=0.5)
    full, codes = 1000, 260  # a unit's gradient bytes in fp32 and as int8 codes + scales
    intra = 0.01 + 0.5 * full / 1000  # G = 2: one step, half the full-precision buffer
    for hier in (True, False):  # node-aware either way: the local reduce-scatter, then the all-to-all across
        rs, ar = sm.collective_times(full, "FULL_SHARD", 2, 2, lk, hier, cross_nbytes=codes)
        assert (rs, ar) == (pytest.approx(0.5 + 0.1 + 0.5 * codes / 100 + intra), 0.0)
    # HYBRID_SHARD, 4 hosts: intra in full precision; the all-reduce two collectives (all-to-all, all-gather),
    # 3 steps each, 3/4 of the codes each on the link
    rs, ar = sm.collective_times(full, "HYBRID_SHARD", 4, 2, lk, cross_nbytes=codes)
    assert rs == pytest.approx(intra)
    assert ar == pytest.approx(2 * 0.5 + 6 * 0.1 + 2 * 0.75 * codes / 100)
    # one host: nothing crosses, the reduction stays full precision
    assert sm.collective_times(full, "FULL_SHARD", 1, 2, lk, cross_nbytes=codes) == (pytest.approx(intra), 0.0)


def test_predict_step_serial_sum_by_hand():
    """overlap=False: the step is compute + every collective; each collective counted by hand from alpha-beta."""
    numels = [100, 50, 50]
    shape = sm.ModelShape(numels=numels, flops=[1, 1, 1], param_bytes=4, grad_bytes=4, quantize_weights="int8",
                          quantize_grads="int4", quantize_block=4)
    lk = sm.Links(inter_rate=100.0, alpha_inter=0.1, bw_intra=1000.0, alpha_intra=0.01)
    w, g = 1 + 4 / 4, 0.5 + 4 / 4  # bytes per element: int8 and int4 codes, a float32 scale per 4 elements

    def gather(n):  # node-aware, 2 hosts x 2 ranks: the quantized payload on both levels
        return 0.1 + 0.5 * n * w / 100 + 0.01 + 0.5 * n * w / 1000

    def reduce(n):  # full-precision inside the host, codes across
        return 0.01 + 0.5 * n * 4 / 1000 + 0.1 + 0.5 * n * g / 100

    comm = sum(gather(n) for n in numels) + sum(gather(n) for n in numels[1:]) + sum(reduce(n) for n in numels)
    assert sm.predict_step(shape, "FULL_SHARD", 2, 2, lk, 3.0, overlap=False) == pytest.approx(3.0 + comm)
    # HSDP: gathers and reduce-scatters inside the host only; the replicate all-reduce of the codes across
    inner = sum(0.01 + 0.5 * n * w / 1000 for n in numels) + sum(0.01 + 0.5 * n * w / 1000 for n in numels[1:])
    inner += sum(0.01 + 0.5 * n * 4 / 1000 + 2 * 0.1 + n * g / 100 for n in numels)
    assert sm.predict_step(shape, "HYBRID_SHARD", 2, 2, lk, 3.0, overlap=False) == pytest.approx(3.0 + inner)
    # TCP CPU per byte sent: the quantized bytes
    free = sm.Links(inter_rate=1e30, alpha_inter=0.0, bw_intra=1e30, alpha_intra=0.0, cpu_per_byte=1e-3)
    sent = 0.5 * (100 + 2 * 100) * w + 0.5 * 200 * g
    assert sm.predict_step(shape, "FULL_SHARD", 2, 2, free, 2.0) == pytest.approx(2.0 + 1e-3 * sent)


def test_model_shape_refuses_what_the_collectives_refuse():
    with pytest.raises(ValueError, match="quantize_grads must be one of none, int8, int4, got 'fp8'"):
        sm.ModelShape(numels=[1], flops=[1], quantize_grads="fp8")
    with pytest.raises(ValueError, match="quantize_weights must be one of none, int8, fp8, got 'int4'"):
        sm.gpt_shape(256, 8, 1, 16, 1, quantize_weights="int4")
    with pytest.raises(ValueError, match="block_size=3"):
        sm.ModelShape(numels=[1], flops=[1], quantize_grads="int4", quantize_block=3)


def _plan(*args, ranks="8,16"):
    return subprocess.run(HP + ["plan", "--ranks", ranks, *map(str, args)], capture_output=True, text=True,
                          timeout=60, env=ENV)


def _json(res):
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["plan"]


@pytest.mark.timeout(120)
def test_plan_gives_the_quantized_bytes_and_step_beside_the_unquantized():
    small = ["--n-layer", 2, "--n-embd", 256, "--vocab-size", 1024, "--block-size", 64, "--precision", "fp32",
             "--link-rate", "1gbit", "--json"]
    plain = _json(_plan(*small))
    got = _json(_plan(*small, "--quantize-weights", "int8", "--quantize-grads", "int4", "--quantize-block", 128))
    assert got["quantize"] == {"weights": "int8", "grads": "int4", "block": 128} and "quantize" not in plain
    w, g = 1 + 4 / 128, 0.5 + 4 / 128
    for p, r in zip(plain["rows"], got["rows"]):
        assert {k: v for k, v in r.items() if not k.startswith("quantized_")} == p  # the unquantized figures stay
        frac = (r["nodes"] - 1) / r["nodes"]
        if r["strategy"] == "FULL_SHARD":  # the root and the last block gathered once, the other block twice
            assert r["host_bytes"] == pytest.approx(frac * (ROOT + 3 * BLOCK) * 4 + frac * PARAMS * 4)
            assert r["quantized_host_bytes"] == pytest.approx(frac * (ROOT + 3 * BLOCK) * w + frac * PARAMS * g)
        else:
            assert r["host_bytes"] == pytest.approx(2 * frac * PARAMS * 4)
            assert r["quantized_host_bytes"] == pytest.approx(2 * frac * PARAMS * g)
        assert r["quantized_wire_bound_s"] == pytest.approx(r["quantized_host_bytes"] / 125e6)
        assert max(r["compute_s"], r["quantized_wire_bound_s"]) <= r["quantized_step_s"] < r["step_s"]
        assert r["quantized_tokens_per_s"] == pytest.approx(r["tokens_per_s"] * r["step_s"] / r["quantized_step_s"])


@pytest.mark.timeout(120)
def test_plan_text_table_shows_both(tmp_path):
    res = _plan("--quantize-grads", "int8", ranks="8")
    assert res.returncode == 0, res.stderr
    assert "gradients int8 (across nodes; full precision inside), 256 elements per scale" in res.stdout
    assert "| GiB per node | step (s) | quantized GiB per node | quantized wire bound (s) | quantized step (s) |" \
        in res.stdout
    rows = {line.split("|")[3].strip(): line.split("|")[1:-1] for line in res.stdout.splitlines()
            if line.startswith("| 8 | 2 |")}
    shape = sm.gpt_shape(50304, 2048, 32, 4096, 2)  # plan's default model, bf16 (2 bytes) on the wire
    n, root, inner = shape.params, shape.numels[0], sum(shape.numels[1:])
    gathered = root + 2 * inner - shape.numels[-1]  # the last block keeps its parameters: gathered once
    fs = rows["FULL_SHARD"]
    assert float(fs[3]) == pytest.approx((0.5 * gathered * 2 + 0.5 * n * 2) / 2**30, abs=1e-3)
    assert float(fs[5]) == pytest.approx((0.5 * gathered * 2 + 0.5 * n * (1 + 4 / 256)) / 2**30, abs=1e-3)
    assert float(rows["HYBRID_SHARD"][5]) == pytest.approx(n * (1 + 4 / 256) / 2**30, abs=1e-3)
    assert float(fs[7]) < float(fs[4])  # the quantized step is the faster


@pytest.mark.timeout(120)
def test_plan_reads_quantization_from_the_config_and_flags_override_it(tmp_path):
    conf = tmp_path / "run.toml"
    conf.write_text('quantize_weights = "fp8"\nquantize_grads = "int8"\nquantize_block = 64\n')
    flags = ["--n-layer", 4, "--vocab-size", 256, "--block-size", 64, "--n-embd", 128, "--batch-size", 8,
             "--precision", "fp32", "--strategies", "FULL_SHARD", "--json"]  # train's defaults, as the file has
    got = _json(_plan("--config", conf, "--json"))
    assert got == _json(_plan(*flags, "--quantize-weights", "fp8", "--quantize-grads", "int8", "--quantize-block", 64))
    over = _json(_plan("--config", conf, "--quantize-grads", "none", "--json"))
    assert over["quantize"] == {"weights": "fp8", "grads": "none", "block": 64}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad", [{"quantize_block": 3}, {"quantize_grads": "int2"}, {"quantize_weights": "int4"}])
def test_plan_refuses_bad_settings_with_trains_messages(tmp_path, bad):
    with pytest.raises(ConfigError) as train:
        TrainConfig(**bad).validate(1)
    conf = tmp_path / "run.json"
    conf.write_text(json.dumps(bad))
    res = _plan("--config", conf)
    assert res.returncode == 2 and f"hpcfsdp plan: {train.value}" in res.stderr, res.stderr
    if "quantize_block" in bad:  # the flag: the same check
        res = _plan("--quantize-block", 3)
        assert res.returncode == 2 and f"hpcfsdp plan: {train.value}" in res.stderr, res.stderr


@pytest.mark.timeout(120)
def test_plan_refuses_bad_choices_as_train_does():
    res = _plan("--quantize-grads", "fp8")
    assert res.returncode == 2 and "argument --quantize-grads: invalid choice: 'fp8'" in res.stderr
    res = _plan("--quantize-weights", "int4")
    assert res.returncode == 2 and "argument --quantize-weights: invalid choice: 'int4'" in res.stderr
