"""The summary table of scripts/device_check.sh: step outcomes, MFU of the GPT runs, staged vs host all-gather.

Usage: python scripts/device_summary.py OUT_DIR   (reads status.tsv, bench_train.jsonl, bench_comm_*.jsonl there)
Exit status 1 when a step failed or a target is missed (MFU of the largest config < 30 %, staged all-gather
bus bandwidth at the largest size < 0.7 x the host-only all-gather).
"""
import json
import os
import sys

MFU_TARGET = 0.30
STAGED_TARGET = 0.7


def _jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _largest(rows, op):
    rows = [r for r in rows if r.get("op") == op and "hpcfsdp" in r]
    return max(rows, key=lambda r: r["bytes"]) if rows else None


def summarize(out):
    lines, ok = [], True
    lines.append(f"{'check':<44} {'result':<40} {'s':>5}")
    lines.append("-" * 91)
    status = os.path.join(out, "status.tsv")
    for row in (open(status).read().splitlines() if os.path.exists(status) else []):
        name, rc, secs = (row.split("\t") + ["", ""])[:3]
        if rc in ("0", "dry"):
            res = "pass" if rc == "0" else "(dry run)"
        elif rc.startswith("not run"):
            res = rc
        else:
            res = "TIMEOUT" if rc == "124" else f"FAIL (exit {rc})"
            ok = False
        lines.append(f"{name:<44} {res:<40} {secs:>5}")
    train = _jsonl(os.path.join(out, "bench_train.jsonl"))
    for r in train:
        m = r["model"]
        label = f"train L{m['n_layer']} d{m['n_embd']} T{m['block_size']} ({m['params'] / 1e6:.0f}M)"
        mfu = r.get("mfu")
        res = (f"{r['tokens_per_s']:.0f} tok/s, step {1e3 * r['step_time_s']:.0f} ms, "
               + (f"MFU {100 * mfu:.1f}%" if mfu is not None else "MFU n/a"))
        lines.append(f"{label:<44} {res:<40}")
    if train:
        big = max(train, key=lambda r: r["model"]["params"])
        mfu = big.get("mfu")
        hit = mfu is not None and mfu >= MFU_TARGET
        ok &= hit
        lines.append(f"{'MFU of the largest config >= 30%':<44} {('yes' if hit else 'NO'):<40}")
    cuda = _largest(_jsonl(os.path.join(out, "bench_comm_cuda.jsonl")), "all_gather")
    host = _largest(_jsonl(os.path.join(out, "bench_comm_host.jsonl")), "all_gather")
    if cuda and host:
        ratio = cuda["hpcfsdp"]["busbw_GBps"] / host["hpcfsdp"]["busbw_GBps"] if host["hpcfsdp"]["busbw_GBps"] else 0
        hit = ratio >= STAGED_TARGET
        ok &= hit
        res = (f"{cuda['hpcfsdp']['busbw_GBps']:.2f} vs {host['hpcfsdp']['busbw_GBps']:.2f} GB/s = {ratio:.2f}x "
               f"({'ok' if hit else 'BELOW 0.7x'})")
        size = f"{cuda['bytes'] >> 20} MiB" if cuda["bytes"] >= 1 << 20 else f"{cuda['bytes'] >> 10} KiB"
        lines.append(f"{'staged all-gather ' + size + ', 2 ranks vs host':<44} {res:<40}")
    return "\n".join(lines), ok


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    text, ok = summarize(argv[1])
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
