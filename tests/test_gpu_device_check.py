"""scripts/device_check.sh: its plan (--dry-run) and its summary table, checked without a GPU."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import device_summary  # noqa: E402


def test_dry_run_plans_every_step_and_skips_the_cuda_aware_leg_on_a_plain_mpi(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    env.pop("HPCFSDP_CUDA_AWARE", None)
    p = subprocess.run(["bash", "scripts/device_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for step in ["gpu tests, 1 rank (warm-up)", "gpu tests, 2 ranks, staged", "train gpt-medium bf16",
                 "train gpt-large bf16", "bench comm cuda (staged, 2 ranks)", "bench comm host (2 ranks)"]:
        assert f"== {step}:" in out and step in out.split("check")[-1]
    assert "HPCFSDP_CUDA_AWARE=0" in out and "--mixed-precision bf16" in out and "--device cuda" in out
    assert "not run: hpcfsdp info says the MPI is not CUDA-aware" in out  # no info.json in a dry run


def _write(tmp_path, status, train, cuda_bw, host_bw):
    (tmp_path / "status.tsv").write_text("".join(f"{n}\t{rc}\t3\n" for n, rc in status))
    with open(tmp_path / "bench_train.jsonl", "w") as f:
        for params, mfu in train:
            f.write(json.dumps({"model": {"n_layer": 12, "n_embd": 1024, "block_size": 1024, "params": params},
                                "tokens_per_s": 1e5, "step_time_s": 0.08, "mfu": mfu}) + "\n")
    for name, bw in (("cuda", cuda_bw), ("host", host_bw)):
        rows = [{"op": "all_gather", "bytes": b, "hpcfsdp": {"busbw_GBps": bw * b / (256 << 20)}}
                for b in (1 << 20, 256 << 20)]
        (tmp_path / f"bench_comm_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_passes_only_when_every_step_and_target_holds(tmp_path):
    _write(tmp_path, [("gpu tests", "0"), ("train", "0")], [(2e8, 0.2), (8e8, 0.35)], 8.0, 10.0)
    text, ok = device_summary.summarize(str(tmp_path))
    assert ok and "MFU 35.0%" in text and "0.80x (ok)" in text and "256 MiB" in text
    _write(tmp_path, [("gpu tests", "0")], [(2e8, 0.4), (8e8, 0.25)], 8.0, 10.0)  # largest config below 30 %
    assert not device_summary.summarize(str(tmp_path))[1]
    _write(tmp_path, [("gpu tests", "0")], [(8e8, 0.35)], 6.0, 10.0)  # staged all-gather below 0.7x
    text, ok = device_summary.summarize(str(tmp_path))
    assert not ok and "BELOW 0.7x" in text
    _write(tmp_path, [("gpu tests", "124")], [(8e8, 0.35)], 8.0, 10.0)
    text, ok = device_summary.summarize(str(tmp_path))
    assert not ok and "TIMEOUT" in text
