"""scripts/device_check.sh without a GPU: its time limits, its plan (--dry-run), its summary written step by step,
the whole run on the simulated device (--sim, system tier) and the PyTorch ceiling on the CPU (system tier)."""
import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import device_summary  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "device_check.sh")


def _env(tmp_path, **extra):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, **extra)
    for k in ("HPCFSDP_CUDA_AWARE", "HPCFSDP_GPU_COMM", "HPCFSDP_CUDA_SIM"):
        env.pop(k, None)
    return env


def _limits():
    p = subprocess.run(["bash", SCRIPT, "--limits"], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.splitlines()]
    table = {name: int(limit) for name, limit in rows if name != "total"}
    assert rows[-1] == ["total", str(sum(table.values()))]
    return table


def _summary(out):
    with open(os.path.join(out, "summary.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_step_limits_are_one_table_within_450_s():
    table = _limits()
    assert list(table) == ["setup", "preflight", "gpu-1rank", "parity-2ranks-staged", "nccl-ws1",
                           "hpcfsdp-gpt-medium", "torch-gpt-medium", "hpcfsdp-gpt-large", "torch-gpt-large"]
    assert all(v > 0 for v in table.values()) and sum(table.values()) <= 450
    text = open(SCRIPT).read()
    assert "BUDGET=450" in text and text.count("timeout -k 3 \"$limit\"") == 1  # every step under its own limit


def test_dry_run_plans_every_step_with_its_limit(tmp_path):
    p = subprocess.run(["bash", SCRIPT, "--dry-run"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    table = _limits()
    plan = dict(re.findall(r"^== (\S+) \(limit (\d+)s\): ", p.stdout, re.M))
    assert plan == {k: str(v) for k, v in table.items()}
    cmd = dict(re.findall(r"^== (\S+) \(limit \d+s\): (.*)$", p.stdout, re.M))
    assert "--install" in cmd["setup"] and "device_preflight.py" in cmd["preflight"]
    assert "(gpu or gpu_hw) and not mpi" in cmd["gpu-1rank"].replace("\\", "")
    assert "HPCFSDP_GPU_COMM=staged" in cmd["parity-2ranks-staged"] and "-n 2" in cmd["parity-2ranks-staged"]
    assert "gpu and mpi" in cmd["parity-2ranks-staged"].replace("\\", "")
    assert "HPCFSDP_GPU_COMM=nccl" in cmd["nccl-ws1"] and "-n 1" in cmd["nccl-ws1"]
    for model, layers, heads, embd in (("gpt-medium", 24, 16, 1024), ("gpt-large", 36, 20, 1280)):  # issue 28's
        hp, pt = cmd[f"hpcfsdp-{model}"], cmd[f"torch-{model}"]
        assert "--mixed-precision bf16 --vocab-size 32768 --block-size 1024" in hp and "--device cuda" in hp
        assert f"--n-layer {layers} --n-head {heads} --n-embd {embd} --batch-size 8" in hp
        assert "--device cuda --dtype bf16 --tie --vocab 32768 --seq 1024" in pt
        assert f"--layers {layers} --heads {heads} --d-model {embd} --batch 8" in pt
        # the same steps on both sides; hpcfsdp also counts the kernels of one more step (CUPTI, after the timing)
        assert hp.split("--batch-size 8")[1].split("--json")[0].replace(" --profile-kernels", "") == \
            pt.split("--batch 8")[1].split("--json")[0]
        assert "--profile-kernels" in hp
    rows = _summary(tmp_path)
    assert [r["step"] for r in rows] == list(table) and {r["status"] for r in rows} == {"dry"}
    assert "9 steps planned (dry run)" in p.stdout


def _files(out):
    (out / "steps").mkdir()
    (out / "preflight.json").write_text(json.dumps({
        "gpu": {"name": "NVIDIA H200", "memory_total_bytes": 150 << 30}, "versions": {"cupy": "14.2.0"},
        "nccl": {"available": True, "version": "2.27.7"}, "bf16": {"ops": {"linear": "ok", "gelu": "ok"}},
        "pinned_copy": {"h2d_GBps": 52.5, "d2h_GBps": 51.0},
        "gemm": {"gpt-medium 8192x1024 @ 1024x4096 bf16": {"tflops": 600.0},
                 "gpt-medium 8192x4096 @ 4096x1024 bf16": {"tflops": 650.0},
                 "gpt-medium 8192x1024 @ 1024x4096 fp16": {"tflops": 700.0}}, "problems": []}))
    (out / "steps" / "gpu-1rank.log").write_text("....\n58 passed, 2 skipped, 2807 deselected in 40.1s\n")
    (out / "hpcfsdp-gpt-medium.jsonl").write_text(json.dumps(
        {"model": {"params": 4e8}, "tokens_per_s": 50000.0, "step_time_s": 0.16, "mfu": 0.2}) + "\n")
    (out / "torch-gpt-medium.jsonl").write_text(json.dumps(
        {"params": 4e8, "tokens_per_s": 125000.0, "median_step_s": 0.064, "mfu": 0.5}) + "\n")


def test_summary_gets_a_line_as_each_step_ends_so_a_killed_run_still_reports(tmp_path):
    _files(tmp_path)
    txt = tmp_path / "summary.txt"
    device_summary.record(str(tmp_path), "preflight", "0", "12.3", "40")
    first = txt.read_text().splitlines()
    assert len(first) == 3 and first[2].startswith("preflight") and " ok " in first[2]
    assert "NVIDIA H200" in first[2] and "NCCL 2.27.7" in first[2] and "bf16 ok: 2/2 engine ops, 0/0 array ops" in first[2]
    assert "H2D 52.5 / D2H 51.0 GB/s" in first[2] and "gpt-medium 650" in first[2]  # the best bf16 shape
    device_summary.record(str(tmp_path), "gpu-1rank", "124", "115.0", "115")      # timed out
    device_summary.record(str(tmp_path), "hpcfsdp-gpt-medium", "0", "30", "45")
    device_summary.record(str(tmp_path), "torch-gpt-medium", "0", "20", "30")
    device_summary.record(str(tmp_path), "nccl-ws1", "137", "33", "30")         # killed after the grace
    device_summary.record(str(tmp_path), "torch-gpt-large", "1", "2", "35")     # failed, left no JSON
    lines = txt.read_text().splitlines()
    assert lines[:3] == first and len(lines) == 8  # appended, never rewritten: the run may end at any line
    rows = _summary(tmp_path)
    assert [r["status"] for r in rows] == ["ok", "timeout", "ok", "ok", "timeout", "fail"]
    assert rows[1]["figures"] == {"passed": 58, "skipped": 2, "deselected": 2807}
    assert rows[2]["figures"]["mfu"] == 0.2 and rows[3]["figures"]["step_ms"] == pytest.approx(64.0)
    assert rows[5]["figures"] == {} and "MFU" not in lines[-1]
    text, ok = device_summary.summarize(str(tmp_path))
    assert not ok and "NOT OK: gpu-1rank, nccl-ws1, torch-gpt-large" in text
    assert "MFU 20.0% vs 50.0%: hpcfsdp at 0.40x PyTorch" in text
    assert "MFU of hpcfsdp-gpt-medium >= 35% (a target, not a step): no" in text
    assert device_summary.final(str(tmp_path)) == 1 and "hpcfsdp at 0.40x PyTorch" in txt.read_text()


def test_summary_is_ok_only_with_steps_all_ok(tmp_path):
    assert device_summary.summarize(str(tmp_path)) == (device_summary.HEADER + "\nno step has finished", False)
    _files(tmp_path)
    for step in ("preflight", "gpu-1rank"):
        device_summary.record(str(tmp_path), step, "0", "1", "40")
    text, ok = device_summary.summarize(str(tmp_path))
    assert ok and "2 steps, 2 s: all ok" in text and device_summary.final(str(tmp_path)) == 0


@pytest.mark.system
@pytest.mark.timeout(960)  # the steps' limits, doubled on the simulation, add up to 890 s
def test_sim_runs_every_step_ok_on_the_simulated_device(tmp_path):
    """The whole check on the simulated device with tiny sizes, the PyTorch ceiling on the CPU (needs torch: the
    system tier's peer extra)."""
    p = subprocess.run(["bash", SCRIPT, "--sim"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=930)
    rows = _summary(tmp_path)
    table = _limits()
    assert [r["step"] for r in rows] == list(table), p.stdout[-4000:]
    bad = {r["step"]: open(tmp_path / "steps" / f"{r['step']}.log").read()[-1500:] for r in rows if r["status"] != "ok"}
    assert not bad, bad
    assert p.returncode == 0 and [r["limit_s"] for r in rows] == [2 * v for v in table.values()]  # the slack
    assert all(r["seconds"] <= r["limit_s"] for r in rows)
    fig = {r["step"]: r["figures"] for r in rows}
    assert fig["setup"]["hpcfsdp"] == ROOT and fig["setup"]["mpi"]
    pre = fig["preflight"]
    assert pre["gpu"] and pre["bf16_ops"] >= 11 and pre["bf16_ops_ok"] == pre["bf16_ops"] and not pre["problems"]
    assert pre["bf16_array_ops"] >= 20 and pre["bf16_array_ops_ok"] == pre["bf16_array_ops"]
    assert pre["pinned_h2d_GBps"] > 0 and pre["gemm_bf16_gpt-medium_TFLOPs"] > 0 and pre["gemm_bf16_gpt-large_TFLOPs"] > 0
    assert fig["gpu-1rank"]["passed"] > 0 and "failed" not in fig["gpu-1rank"]
    assert fig["parity-2ranks-staged"]["passed"] > 0 and "failed" not in fig["parity-2ranks-staged"]
    assert fig["nccl-ws1"]["gpu_comm"] and fig["nccl-ws1"]["world_size"] == 1
    assert fig["nccl-ws1"]["passed"] >= 18 and fig["nccl-ws1"]["failed"] == []
    for model in ("gpt-medium", "gpt-large"):
        hp, pt = fig[f"hpcfsdp-{model}"], fig[f"torch-{model}"]
        assert hp["params"] == pt["params"] > 0  # the same GPT in both
        assert hp["tokens_per_s"] > 0 and pt["tokens_per_s"] > 0 and hp["mfu"] > 0 and pt["mfu"] > 0
    text = (tmp_path / "summary.txt").read_text()
    assert "9 steps" in text and "all ok" in text and text.count("hpcfsdp at ") == 2
    assert not (tmp_path / "running").exists()


@pytest.mark.system
def test_torch_ceiling_runs_on_cpu_with_hpcfsdps_model_and_mfu_formula(tmp_path):
    """benchmarks/peer/torch_gpt_step.py at tiny sizes on the CPU (needs torch): hpcfsdp's parameter count for
    the same config, and MFU = tokens x (6 params + 12 L d T) / step / peak."""
    from hpcfsdp.models import GPT, GPTConfig

    out = tmp_path / "t.jsonl"
    for dtype in ("fp32", "bf16"):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "peer", "torch_gpt_step.py"),
                            "--device", "cpu", "--dtype", dtype, "--tie", "--vocab", "128", "--seq", "16",
                            "--layers", "2", "--heads", "2", "--d-model", "32", "--batch", "2", "--warmup", "1",
                            "--steps", "2", "--peak-tflops", "0.5", "--json", str(out)],
                           capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = sum(q.numel() for q in GPT(GPTConfig(vocab_size=128, block_size=16, n_layer=2, n_head=2,
                                                n_embd=32)).parameters())
    for r, dtype in zip(rows, ("fp32", "bf16")):
        assert r["dtype"] == dtype and r["device"] == "cpu" and r["params"] == want and r["eager"]
        fpt = 6 * want + 12 * 2 * 32 * 16
        assert r["flops_per_token"] == fpt and r["tokens_per_s"] == pytest.approx(2 * 16 / r["step_time_s"])
        assert r["mfu"] == pytest.approx(fpt * 32 / r["step_time_s"] / 0.5e12)
        assert len(r["step_times_s"]) == 2 and math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
