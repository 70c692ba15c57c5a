"""Print the tables of BENCHMARKS.md from benchmarks/results/*.json[l] (written by scripts/benchmarks.sh)."""
import json
import os
import statistics
import sys

R = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"


def lines(name):
    path = os.path.join(R, name)
    if not os.path.exists(path):
        return []
    return [json.loads(x) for x in open(path) if x.strip()]


def mib(b):
    return b / 2**20


def single():
    hp = [r["step_time_s"] for r in lines("single_hp.jsonl")]
    th = [r["median_step_s"] for r in lines("single_torch.jsonl")]
    if hp and th:
        print("| run | hpcfsdp step (s) | PyTorch step (s) | hpcfsdp / PyTorch |\n|---|---|---|---|")
        for i, (a, b) in enumerate(zip(hp, th), 1):
            print(f"| round {i} | {a:.2f} | {b:.2f} | {a / b:.3f} |")
        a, b = statistics.median(hp), statistics.median(th)
        print(f"| median | {a:.2f} | {b:.2f} | **{a / b:.3f}** |\n")


def compare():
    path = os.path.join(R, "compare_n2.json")
    if not os.path.exists(path):
        return
    s = json.load(open(path))
    print("| run | hpcfsdp FULL_SHARD x2 | hpcfsdp unsharded | PyTorch FSDP2 x2 | PyTorch single |\n|---|---|---|---|---|")
    for i in range(len(s["runs"]["hp_fsdp"])):
        row = [s["runs"][k][i] if i < len(s["runs"][k]) else float("nan")
               for k in ("hp_fsdp", "hp_single", "torch_fsdp", "torch_single")]
        print(f"| round {i + 1} | " + " | ".join(f"{v:.2f} s" for v in row) + " |")
    m = s["median_step_s"]
    print(f"| median | {m['hp_fsdp']:.2f} s | {m['hp_single']:.2f} s | {m.get('torch_fsdp', float('nan')):.2f} s | "
          f"{m.get('torch_single', float('nan')):.2f} s |")
    print(f"\nFSDP overhead (FULL_SHARD x2 / unsharded, same per-rank batch): hpcfsdp **{s['hp_ratio']:.3f}**"
          + (f", PyTorch FSDP2 **{s['torch_ratio']:.3f}**" if "torch_ratio" in s else "") + "\n")


def prefetch():
    rows = lines("prefetch.jsonl")
    if not rows:
        return
    on = [r for r in rows if r["prefetch"]]
    off = [r for r in rows if not r["prefetch"]]
    print("| prefetch | median step (s) per run | exposed comm (median) |\n|---|---|---|")
    for name, rs in (("on", on), ("off", off)):
        steps = ", ".join(f"{r['step_time_s']:.3f}" for r in rs)
        exposed = ", ".join(f"{100 * r['exposed_comm_frac']:.1f}%" for r in rs)
        print(f"| {name} | {steps} | {exposed} |")
    a = statistics.median(r["step_time_s"] for r in on)
    b = statistics.median(r["step_time_s"] for r in off)
    print(f"\nprefetch on / off: **{a / b:.3f}**\n")


def comm():
    rows = lines("comm_n2.jsonl")
    if not rows:
        return
    print("| op | bytes | hpcfsdp busbw (GB/s) | raw mpi4py busbw (GB/s) | ratio |\n|---|---|---|---|---|")
    for r in rows:
        if r["bytes"] >= 16 << 20:
            print(f"| {r['op']} | {r['bytes'] >> 20} MiB | {r['hpcfsdp']['busbw_GBps']:.2f} | "
                  f"{r['mpi4py']['busbw_GBps']:.2f} | {r['ratio']:.3f} |")
    small = [r for r in rows if r["bytes"] <= 64 << 10]
    if small:
        extra = statistics.median(r["hpcfsdp"]["time_us_avg"] - r["mpi4py"]["time_us_avg"] for r in small)
        print(f"\nAt 64 KiB and below the per-call overhead over raw mpi4py is {extra:.0f} us (median over ops and sizes).")
    print()


def table():
    rows = lines("table.jsonl")
    if not rows:
        return
    print("| strategy | ranks | precision | step (s) | tokens/s | peak RSS/rank (MiB) | sharded state/rank (MiB) | exposed comm |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        strat = r["strategy"] + (f" {r['mesh']}" if r.get("mesh") else "")
        print(f"| {strat} | {r['world_size']} | {r['mixed_precision']} | {r['step_time_s']:.3f} | {r['tokens_per_s']:.0f} | "
              f"{mib(max(r['peak_mem_bytes'])):.0f} | {mib(max(r['sharded_state_bytes'])):.1f} | "
              f"{100 * r['exposed_comm_frac']:.1f}% |")
    print()


def memory():
    trows = lines("memory_torch.jsonl")
    print("| | unsharded, 1 process | FULL_SHARD x4, per rank (max) | ratio |\n|---|---|---|---|")
    for tune in ("speed", "memory"):
        rows = lines(f"memory_{tune}.jsonl")
        if not rows:
            continue
        single = next(r for r in rows if r["strategy"] == "none")
        fsdp = next(r for r in rows if r["strategy"] != "none")
        a, b = mib(max(fsdp["peak_mem_bytes"])), mib(max(single["peak_mem_bytes"]))
        print(f"| hpcfsdp peak RSS, HPCFSDP_MALLOC_TUNE={tune} | {b:.0f} MiB | {a:.0f} MiB | **{a / b:.3f}** |")
    if len(trows) >= 2:
        ts = next(r for r in trows if r["mode"] == "single")
        tf = next(r for r in trows if r["mode"] != "single")
        tb = max(x["peak_rss_mib"] for x in ts["per_rank"])
        ta = max(x["peak_rss_mib"] for x in tf["per_rank"])
        print(f"| PyTorch peak RSS | {tb:.0f} MiB | {ta:.0f} MiB | **{ta / tb:.3f}** |")
    print()


def ckpt():
    rows = lines("ckpt.jsonl")
    if not rows:
        return
    print("| ranks | GiB | save GB/s | raw write GB/s | load GB/s | raw read GB/s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['world_size']} | {r['bytes'] / 2**30:.2f} | {r['save_GBps']:.2f} | {r['raw_write_GBps']:.2f} | "
              f"{r['load_GBps']:.2f} | {r['raw_read_GBps']:.2f} |")
    print()


for section in (single, compare, prefetch, comm, table, memory, ckpt):
    print(f"### {section.__name__}\n")
    section()
