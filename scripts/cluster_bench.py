"""Step time against its bounds on simulated hosts (root): `python scripts/cluster_bench.py [--repeats N]`.

For each link rate and strategy, brings up --hosts hosts (2) with every host link shaped to the rate, runs
`hpcfsdp bench train --link eth0 --link-rate RATE --compute-only` with --ppn ranks per host (2), tears down, and
prints one Markdown table row (medians over the repeats, the rounds interleaved). JSON lines of every run
go to --json.

With `--peer PYTHON` (a Python with torch, benchmarks/peer/requirements.txt) the same cluster also runs the
PyTorch peer, benchmarks/peer/torch_fsdp2_bench.py, on the same model right after each hpcfsdp run: one
`torchrun --nnodes H --node-rank i` per host inside that host's namespace, rendezvous at host 0's address on
the cluster bridge, gloo over the shaped links (FULL_SHARD -> FSDP2 on a 1-D mesh, HYBRID_SHARD -> HSDP with
replicate = hosts). A second table then sets the two side by side.

With `--compare NAME:VAR=VALUE|--flag[,...]` (repeatable) every configuration also runs with those
environment variables and `hpcfsdp bench train` flags, right after the plain run on the same cluster (e.g.
`--compare staged:HPCFSDP_COMM_STAGED=1`, `--compare noprefetch:--no-prefetch`): the rows of each variant are
named in the strategy column, and the ratios
of one round are measured minutes apart at most, so that a loaded machine moves all of them alike.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from cluster.harness import SUBNET, Cluster  # noqa: E402

PEER = os.path.join(os.path.dirname(HERE), "benchmarks", "peer", "torch_fsdp2_bench.py")
PEER_MODEL = ["--vocab", "1024", "--seq", "64", "--layers", "2", "--heads", "4", "--d-model", "256", "--batch", "2",
              "--tie"]

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
    ap.add_argument("--hosts", type=int, default=2, help="simulated hosts")
    ap.add_argument("--ppn", type=int, default=2, help="ranks per host")
    ap.add_argument("--peer", default=None, metavar="PYTHON",
                    help="also run the PyTorch FSDP2 peer with this Python (torch installed) on the same cluster")
    ap.add_argument("--compare", action="append", default=[], metavar="NAME:VAR=VALUE|--flag[,...]",
                    help="also run every configuration with these environment variables and bench flags "
                         "(repeatable)")
    a = ap.parse_args()
    variants = [("", {}, [])]
    for spec in a.compare:
        name, _, items = spec.partition(":")
        items = [x for x in items.split(",") if x]
        flags = [x for x in items if x.startswith("--")]
        pairs = [x.partition("=") for x in items if not x.startswith("--")]
        if not name or not items or any(not k or not eq for k, eq, _ in pairs):
            ap.error(f"--compare {spec!r}: expected NAME:VAR=VALUE|--bench-flag[,...]")
        variants.append((name, {k: v for k, _, v in pairs}, flags))
    runs, peer_runs = {}, {}
    for rep in range(a.repeats):
        for rate in a.rates.split(","):
            with Cluster(a.hosts, rate=rate) as c:
                for strategy, (vname, venv, vflags) in [(s_, v) for s_ in a.strategies.split(",") for v in variants]:
                    mesh = ["--mesh", f"{a.hosts}x{a.ppn}"] if strategy == "HYBRID_SHARD" else []
                    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "bench", "train", *MODEL, "--strategy", strategy,
                           *mesh, "--warmup", str(a.warmup), "--steps", str(a.steps), "--link", "eth0",
                           "--link-rate", rate, "--compute-only", "--json", "-", *vflags]
                    out, _ = c.launch(a.hosts, a.ppn, cmd, timeout=900,
                                      env=dict(os.environ, HPCFSDP_NO_PROGRESS="1", **venv))
                    if out.returncode != 0:
                        print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
                        return 1
                    res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
                    res["rate"], res["hosts"], res["ppn"] = rate, a.hosts, a.ppn
                    if vname:
                        res["variant"], res["variant_env"], res["variant_flags"] = vname, venv, vflags
                    label = f"{strategy} {vname}" if vname else strategy
                    runs.setdefault((rate, label), []).append(res)
                    print(f"# {rate} {label} round {rep}: step {res['step_time_s']:.3f} s, compute-only "
                          f"{res['compute_only_s']:.3f} s, wire bound {res['wire_bound_s']:.3f} s, ratio "
                          f"{res['step_over_bound']:.2f}", file=sys.stderr)
                    if a.json:
                        with open(a.json, "a") as f:
                            f.write(json.dumps(res) + "\n")
                    if a.peer and not vname:
                        pres = run_peer(c, a, strategy)
                        pres["rate"] = rate
                        peer_runs.setdefault((rate, strategy), []).append(pres)
                        print(f"# {rate} {strategy} round {rep}: PyTorch FSDP2 step {pres['median_step_s']:.3f} s",
                              file=sys.stderr)
                        if a.json:
                            with open(a.json, "a") as f:
                                f.write(json.dumps(pres) + "\n")
    print("| link per host | strategy | step (s) | compute-only (s) | wire bound (s) | step / max(compute, wire) "
          "| sent per host per step (MiB) | wire minimum (MiB) | sent / minimum | per-round ratio, median |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (rate, strategy), rs in runs.items():
        def med(key):
            return statistics.median(r[key] for r in rs)

        step, comp, wire = med("step_time_s"), med("compute_only_s"), med("wire_bound_s")
        sent = statistics.median(max(r["bytes_sent_per_host_per_step"]) for r in rs)
        least = rs[0]["wire_min_bytes_per_host"]
        print(f"| {rate} | {strategy} | {step:.3f} | {comp:.3f} | {wire:.3f} | {step / max(comp, wire):.2f} "
              f"| {sent / 2**20:.2f} | {least / 2**20:.2f} | {sent / least:.2f} | {med('step_over_bound'):.2f} |")
    if peer_runs:
        print("\n| link per host | strategy | hpcfsdp step (s) | PyTorch FSDP2 step (s) | PyTorch / hpcfsdp |")
        print("|---|---|---|---|---|")
        for key, prs in peer_runs.items():
            hp_step = statistics.median(r["step_time_s"] for r in runs[key])
            pt_step = statistics.median(r["median_step_s"] for r in prs)
            print(f"| {key[0]} | {key[1]} | {hp_step:.3f} | {pt_step:.3f} | {pt_step / hp_step:.2f} |")
    return 0


def run_peer(c, a, strategy, port=29531):
    """The PyTorch peer on every host of cluster ``c`` (one torchrun per host); rank 0's result dict."""
    torchrun = os.path.join(os.path.dirname(a.peer), "torchrun")
    mode = ["--mode", "hsdp", "--replicate", str(a.hosts)] if strategy == "HYBRID_SHARD" else ["--mode", "fsdp"]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0")
    before = c.link_bytes()
    procs = []
    for i in range(a.hosts):
        cmd = [torchrun, "--nnodes", str(a.hosts), "--node-rank", str(i), "--nproc-per-node", str(a.ppn),
               "--master-addr", f"{SUBNET}.1", "--master-port", str(port), PEER, *mode, *PEER_MODEL,
               "--warmup", str(a.warmup), "--steps", str(a.steps), "--json", "-"]
        procs.append(subprocess.Popen(c.exec_argv(i, cmd), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=900))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError("PyTorch peer did not finish within 900 s")
    after = c.link_bytes()
    if any(p.returncode for p in procs):
        raise RuntimeError("PyTorch peer failed:\n" + "\n".join(o[1][-2000:] for o in outs))
    res = json.loads([ln for ln in outs[0][0].splitlines() if ln.startswith("{")][-1])
    res.update(strategy=strategy, hosts=a.hosts, ppn=a.ppn,
               bytes_sent_per_host_run=[x["tx"] - b["tx"] for x, b in zip(after, before)])
    return res


if __name__ == "__main__":
    sys.exit(main())
