"""The summary of scripts/device_check.sh, written step by step: a killed run still reports the steps that ended.

    python scripts/device_summary.py record OUT STEP RC SECONDS LIMIT   # after each step: one line appended
    python scripts/device_summary.py final OUT                          # the closing block; exit 1 if a step failed

`record` appends the step's result to OUT/summary.jsonl (one JSON object: step, status, rc, seconds, limit_s,
figures) and a line to OUT/summary.txt; the figures are read from what the step left in OUT (preflight.json,
nccl.json, <step>.jsonl of the training steps, steps/<step>.log for the test counts). status: ok (exit 0), dry
(--dry-run), timeout (exit 124, or 137 when `timeout` had to kill), fail (any other exit status). `final` adds,
per model, hpcfsdp's bf16 step beside PyTorch's (the same GPT, the same MFU formula) and hpcfsdp's MFU as a
fraction of PyTorch's, and whether the largest config reaches the MFU target (reported, not a failure).
"""
import json
import os
import re
import sys

MFU_TARGET = 0.35  # issue 28: gpt-large's bf16 MFU at one rank, torchtitan's eager FSDP2 level (33-39% on H100)


def _load(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        rows = [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
        return rows[-1] if rows else None


def _status(rc):
    if rc == "dry":
        return "dry"
    if rc == "0":
        return "ok"
    return "timeout" if rc in ("124", "137") else "fail"


def _pytest_counts(log):
    """The counts of pytest's closing line (the first one: rank 0's under MPI)."""
    try:
        text = open(log, errors="replace").read()
    except OSError:
        return {}
    for line in text.splitlines():
        if re.search(r"\d+ (passed|failed|error)", line) and re.search(r" in [0-9.]+s", line):
            return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", line)}
    return {}


def _train_figures(row):
    fig = {"tokens_per_s": row.get("tokens_per_s"), "step_ms": 1e3 * row.get("step_time_s", row.get("median_step_s", 0)),
           "mfu": row.get("mfu")}
    fig["params"] = row.get("model", {}).get("params", row.get("params"))
    if row.get("kernel_launches_per_step") is not None:
        fig["launches"] = row["kernel_launches_per_step"]
        fig["launch_source"] = row.get("kernel_count_source")
        fig["host_syncs"] = row.get("host_syncs_per_step")
    return fig


def figures(out, step):
    """Key figures of a finished step, from the files it left in ``out``."""
    if step == "preflight":
        pf = _load(os.path.join(out, "preflight.json"))
        if not isinstance(pf, dict) or "gpu" not in pf:
            return {}
        gpu, ver, nccl, bf = pf.get("gpu", {}), pf.get("versions", {}), pf.get("nccl", {}), pf.get("bf16", {})
        ops = bf.get("ops", {})
        fig = {"gpu": gpu.get("name"), "memory_GiB": round(gpu.get("memory_total_bytes", 0) / 2**30, 1),
               "cupy": ver.get("cupy"), "cuda_runtime": ver.get("cuda_runtime"), "cuda_driver": ver.get("cuda_driver"),
               "nccl": nccl.get("version") if nccl.get("available") else f"unavailable ({nccl.get('error', '')})",
               "bf16_ops_ok": sum(v == "ok" for v in ops.values()), "bf16_ops": len(ops),
               "bf16_array_ops_ok": sum(v == "ok" for v in bf.get("product", {}).get("per_op", {}).values()),
               "bf16_array_ops": len(bf.get("product", {}).get("per_op", {})),
               "bf16_failed": bf.get("failed", []),
               "is_bf16_supported": bf.get("product", {}).get("is_bf16_supported"),
               "pinned_h2d_GBps": pf.get("pinned_copy", {}).get("h2d_GBps"),
               "pinned_d2h_GBps": pf.get("pinned_copy", {}).get("d2h_GBps"),
               "problems": pf.get("problems", [])}
        for key, g in (pf.get("gemm") or {}).items():
            if isinstance(g, dict) and "bf16" in key:
                model = key.split()[0]
                best = fig.get(f"gemm_bf16_{model}_TFLOPs")
                if g.get("tflops") is not None and (best is None or g["tflops"] > best):
                    fig[f"gemm_bf16_{model}_TFLOPs"] = g["tflops"]
        return fig
    if step == "nccl-ws1":
        nc = _load(os.path.join(out, "nccl.json"))
        if not isinstance(nc, dict) or "api" not in nc:
            return {}
        return {"gpu_comm": nc.get("gpu_comm"), "gpu_comm_source": nc.get("gpu_comm_source"),
                "world_size": nc.get("world_size"), "passed": nc.get("passed"), "failed": nc.get("failed"),
                "nccl_version": nc.get("raw_nccl", {}).get("version")}
    if step.startswith(("hpcfsdp-", "torch-")):
        row = _load(os.path.join(out, f"{step}.jsonl"))
        return _train_figures(row) if row else {}
    if step == "setup":
        fig = {}
        log = os.path.join(out, "steps", "setup.log")
        for line in (open(log, errors="replace").read().splitlines() if os.path.exists(log) else []):
            m = re.match(r"setup: ([a-z0-9_]+)=(.*)", line)
            if m:
                fig[m.group(1)] = " ".join(m.group(2).split())
        return fig
    return _pytest_counts(os.path.join(out, "steps", f"{step}.log"))


def _fmt_figures(step, fig):
    def num(x, spec):
        return format(x, spec) if isinstance(x, (int, float)) else "n/a"

    if not fig:
        return ""
    if step == "preflight":
        gemm = ", ".join(f"{k[len('gemm_bf16_'):-len('_TFLOPs')]} {v:.0f}" for k, v in fig.items()
                         if k.startswith("gemm_bf16_"))
        text = (f"{fig['gpu']} {fig['memory_GiB']} GiB, CuPy {fig['cupy']}, CUDA {fig['cuda_runtime']} "
                f"(driver {fig['cuda_driver']}), NCCL {fig['nccl']}; bf16 ok: {fig['bf16_ops_ok']}/{fig['bf16_ops']} engine "
                f"ops, {fig.get('bf16_array_ops_ok', 0)}/{fig.get('bf16_array_ops', 0)} array ops; pinned H2D {num(fig['pinned_h2d_GBps'], '.1f')} / D2H {num(fig['pinned_d2h_GBps'], '.1f')} "
                f"GB/s; bf16 GEMM TFLOP/s: {gemm or 'n/a'}")
        return text + (f"; problems: {'; '.join(fig['problems'])}" if fig["problems"] else "")
    if step == "nccl-ws1":
        failed = fig.get("failed") or []
        return (f"GPU comm path {fig['gpu_comm']} (from {fig['gpu_comm_source']}), world size {fig['world_size']}: "
                f"{fig['passed']} checks passed, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    if step.startswith(("hpcfsdp-", "torch-")):
        mfu = f"MFU {100 * fig['mfu']:.1f}%" if fig.get("mfu") is not None else "MFU n/a"
        launches = f", {num(fig['launches'], '.0f')} launches/step ({fig.get('launch_source')})" \
            if "launches" in fig else ""
        return f"{num(fig['tokens_per_s'], '.0f')} tok/s, step {num(fig['step_ms'], '.1f')} ms, {mfu}{launches}"
    return ", ".join(f"{k}={v}" if step == "setup" else f"{v} {k}" for k, v in fig.items())


def line(row):
    secs = f"{row['seconds']:.0f}/{row['limit_s']}s"
    return f"{row['step']:<22} {row['status']:<8} {secs:>9}  {_fmt_figures(row['step'], row['figures'])}".rstrip()


HEADER = f"{'step':<22} {'status':<8} {'s/limit':>9}  figures\n" + "-" * 100


def record(out, step, rc, seconds, limit):
    try:
        fig = figures(out, step) if rc != "dry" else {}
    except Exception as e:  # noqa: BLE001  (a line must be written whatever the step left behind)
        fig = {"figures_error": f"{type(e).__name__}: {e}"}
    row = {"step": step, "status": _status(rc), "rc": rc, "seconds": float(seconds), "limit_s": int(limit),
           "figures": fig}
    with open(os.path.join(out, "summary.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    txt = os.path.join(out, "summary.txt")
    new = not os.path.exists(txt)
    with open(txt, "a") as f:
        f.write((HEADER + "\n" if new else "") + line(row) + "\n")
    print(line(row), flush=True)
    return row


def rows(out):
    path = os.path.join(out, "summary.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def closing(rs):
    """The lines after the step table: hpcfsdp beside PyTorch per model, the MFU target, the verdict."""
    by = {r["step"]: r for r in rs}
    lines, cmp = [], []
    for step in by:
        if not step.startswith("hpcfsdp-"):
            continue
        model = step[len("hpcfsdp-"):]
        hp, pt = by[step]["figures"], by.get(f"torch-{model}", {}).get("figures", {})
        if not hp.get("tokens_per_s") or not pt.get("tokens_per_s"):
            continue
        frac = hp["tokens_per_s"] / pt["tokens_per_s"]  # = the MFU ratio: the same model, tokens and formula
        mfu = (f"MFU {100 * hp['mfu']:.1f}% vs {100 * pt['mfu']:.1f}%" if hp.get("mfu") is not None
               and pt.get("mfu") is not None else "MFU n/a")
        cmp.append(f"{model:<12} hpcfsdp {hp['tokens_per_s']:.0f} tok/s vs PyTorch eager {pt['tokens_per_s']:.0f} "
                   f"tok/s, {mfu}: hpcfsdp at {frac:.2f}x PyTorch")
    if cmp:
        lines += ["", "bf16 training step, hpcfsdp (FULL_SHARD, 1 rank) vs PyTorch eager (autocast bf16), same GPT:"]
        lines += ["  " + c for c in cmp]
    trains = [r for r in rs if r["step"].startswith("hpcfsdp-") and r["figures"].get("params")]
    if trains:
        big = max(trains, key=lambda r: r["figures"]["params"])
        mfu = big["figures"].get("mfu")
        hit = "n/a" if mfu is None else ("yes" if mfu >= MFU_TARGET else "no")
        lines.append(f"MFU of {big['step']} >= {100 * MFU_TARGET:.0f}% (a target, not a step): {hit}")
    failed = [r["step"] for r in rs if r["status"] not in ("ok", "dry")]
    total = sum(r["seconds"] for r in rs)
    if not rs:
        lines.append("no step has finished")
    elif all(r["status"] == "dry" for r in rs):
        lines.append(f"{len(rs)} steps planned (dry run)")
    else:
        lines.append(f"{len(rs)} steps, {total:.0f} s: " + (f"NOT OK: {', '.join(failed)}" if failed else "all ok"))
    return lines


def summarize(out):
    """(text, ok): the step table and its closing lines; ok when there are steps and every one is ok (or dry)."""
    rs = rows(out)
    text = "\n".join([HEADER] + [line(r) for r in rs] + closing(rs))
    return text, bool(rs) and all(r["status"] in ("ok", "dry") for r in rs)


def final(out):
    text, ok = summarize(out)
    with open(os.path.join(out, "summary.txt"), "a") as f:
        f.write("\n".join(closing(rows(out))) + "\n")
    print(text, flush=True)
    return 0 if ok else 1


def main(argv):
    if len(argv) == 7 and argv[1] == "record":
        record(*argv[2:])
        return 0
    if len(argv) == 3 and argv[1] == "final":
        return final(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
