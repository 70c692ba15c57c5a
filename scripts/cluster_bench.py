"""Step time against its bounds on simulated hosts (root): `python scripts/cluster_bench.py [--repeats N]`.

For each link rate and strategy, brings up 2 hosts with every host link shaped to the rate, runs
`hpcfsdp bench train --link eth0 --link-rate RATE --compute-only` with 2 ranks per host, tears down, and
prints one Markdown table row (medians over the repeats, the rounds interleaved). JSON lines of every run
go to --json.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from cluster.harness import Cluster  # noqa: E402

MODEL = ["--vocab-size", "1024", "--block-size", "64", "--n-layer", "2", "--n-head", "4", "--n-embd", "256",
         "--batch-size", "2"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="200mbit,1gbit")
    ap.add_argument("--strategies", default="FULL_SHARD,HYBRID_SHARD")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    runs = {}
    for rep in range(a.repeats):
        for rate in a.rates.split(","):
            with Cluster(2, rate=rate) as c:
                for strategy in a.strategies.split(","):
                    mesh = ["--mesh", "2x2"] if strategy == "HYBRID_SHARD" else []
                    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "bench", "train", *MODEL, "--strategy", strategy,
                           *mesh, "--warmup", str(a.warmup), "--steps", str(a.steps), "--link", "eth0",
                           "--link-rate", rate, "--compute-only", "--json", "-"]
                    out, _ = c.launch(2, 2, cmd, timeout=900, env=dict(os.environ, HPCFSDP_NO_PROGRESS="1"))
                    if out.returncode != 0:
                        print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
                        return 1
                    res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
                    res["rate"] = rate
                    runs.setdefault((rate, strategy), []).append(res)
                    print(f"# {rate} {strategy} round {rep}: step {res['step_time_s']:.3f} s, compute-only "
                          f"{res['compute_only_s']:.3f} s, wire bound {res['wire_bound_s']:.3f} s", file=sys.stderr)
                    if a.json:
                        with open(a.json, "a") as f:
                            f.write(json.dumps(res) + "\n")
    print("| link per host | strategy | step (s) | compute-only (s) | wire bound (s) | step / max(compute, wire) "
          "| sent per host per step (MiB) | wire minimum (MiB) | sent / minimum |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (rate, strategy), rs in runs.items():
        def med(key):
            return statistics.median(r[key] for r in rs)

        step, comp, wire = med("step_time_s"), med("compute_only_s"), med("wire_bound_s")
        sent = statistics.median(max(r["bytes_sent_per_host_per_step"]) for r in rs)
        least = rs[0]["wire_min_bytes_per_host"]
        print(f"| {rate} | {strategy} | {step:.3f} | {comp:.3f} | {wire:.3f} | {step / max(comp, wire):.2f} "
              f"| {sent / 2**20:.2f} | {least / 2**20:.2f} | {sent / least:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
