"""Cost of HPCFSDP_DEBUG=1 per collective: the same collectives on a plain and on a debug group, interleaved.

Run under MPI: hpcfsdp launch -n 2 -- python scripts/debug_cost.py [--reps 400] [--json FILE]
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

from hpcfsdp.distributed.process_group import ProcessGroup

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=400)
ap.add_argument("--json", default=None)
args = ap.parse_args()
os.environ.pop("HPCFSDP_DEBUG", None)
plain = ProcessGroup()
os.environ["HPCFSDP_DEBUG"] = "1"
debug = ProcessGroup()
os.environ.pop("HPCFSDP_DEBUG")
n = plain.size()
rows = []
for nbytes in (1 << 10, 1 << 14, 1 << 20, 16 << 20):
    k = nbytes // 4
    for op in ("all_reduce", "all_gather"):
        times = {"off": [], "on": []}
        for _ in range(max(4, args.reps * (1 << 14) // max(nbytes, 1 << 14))):
            for name, pg in (("off", plain), ("on", debug)):
                buf = np.ones(k, np.float32)
                out = np.empty(k * n, np.float32)
                pg.barrier()
                t = time.perf_counter()
                pg.all_reduce_(buf) if op == "all_reduce" else pg.all_gather_into(out, buf)
                times[name].append(time.perf_counter() - t)
        med = {key: statistics.median(v) * 1e6 for key, v in times.items()}
        med = {key: max(plain.all_gather_object(v)) for key, v in med.items()}
        rows.append({"op": op, "bytes": nbytes, "ranks": n, "off_us": med["off"], "on_us": med["on"]})
if plain.rank() == 0:
    print("| op | bytes | off (us) | on (us) | added (us) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['bytes']} | {r['off_us']:.0f} | {r['on_us']:.0f} | {r['on_us'] - r['off_us']:+.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
