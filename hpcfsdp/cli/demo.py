"""`hpcfsdp demo`: train a small GPT with FULL_SHARD on 4 MPI ranks on the shipped corpus, then report."""

import json
import os
import sys
import time

__all__ = ["add_parser", "run", "demo_train_args", "DEMO_MODEL"]

# The demo's GPT: 3 blocks (the FSDP units), 96 wide, 64-byte context, 8 sequences per rank per step.
# 300 steps take about two minutes of 4 ranks on 2 cores, and the byte-level loss falls from ln(256)
# = 5.55 to about 2.2.
DEMO_MODEL = {"n_layer": 3, "n_head": 4, "n_embd": 96, "block_size": 64, "batch_size": 8}


def add_parser(subparsers):
    p = subparsers.add_parser(
        "demo",
        help="train a small GPT with FULL_SHARD on 4 ranks (about 2 minutes on 2 cores)",
        description=f"Launch `hpcfsdp train` on N ranks (default 4) with FULL_SHARD: a {DEMO_MODEL['n_layer']}-layer, "
        f"{DEMO_MODEL['n_embd']}-wide GPT on the byte-level corpus shipped with hpcfsdp. Prints the loss falling, "
        "then where the metrics, the plot (if matplotlib is installed) and the checkpoint are.",
    )
    p.add_argument("-n", "--nprocs", type=int, default=4, help="number of MPI ranks (default: 4)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default: 300)")
    p.add_argument("--out-dir", default="runs/demo", help="where metrics, plot and checkpoint go (default: runs/demo)")
    p.add_argument("--timeout", type=float, default=900, help="kill the run after S seconds (default: 900)")
    p.add_argument("--resume", action="store_true",
                   help="continue a demo stopped by Ctrl-C (or a signal) from its last checkpoint")
    p.set_defaults(func=run)


def demo_train_args(steps: int, out_dir: str) -> list:
    m = DEMO_MODEL
    return [
        "--strategy", "FULL_SHARD", "--n-layer", str(m["n_layer"]), "--n-head", str(m["n_head"]),
        "--n-embd", str(m["n_embd"]), "--block-size", str(m["block_size"]), "--batch-size", str(m["batch_size"]),
        "--steps", str(steps), "--lr", "3e-3", "--min-lr", "3e-4", "--warmup-steps", str(min(20, max(1, steps // 10))),
        "--dropout", "0.0", "--log-interval", str(max(1, min(10, steps // 10))), "--out-dir", out_dir,
        "--checkpoint-dir", os.path.join(out_dir, "checkpoints"), "--checkpoint-interval", str(max(1, steps // 3)),
        "--seed", "1337",
    ]


def run(args) -> int:
    from hpcfsdp.distributed._mpi import check_library

    from .launch import launch
    from .runtime import INTERRUPTED_EXIT, STOPPED_EXIT

    check_library()  # no MPI library: the one line of hpcfsdp/cli/main.py, before anything else is said
    for name in ("nprocs", "steps"):
        if getattr(args, name) < 1:
            print(f"hpcfsdp demo: error: --{name} {getattr(args, name)}: expected a positive integer", file=sys.stderr)
            return 2
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics) and not args.resume:
        os.remove(metrics)  # a stale log from an earlier demo must not pass for this one's
    if sys.stdout.isatty():
        os.environ.setdefault("HPCFSDP_PROGRESS", "1")  # the ranks' stdout is a pipe: ask for the bar anyway
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "train", *demo_train_args(args.steps, out),
           *(["--resume"] if args.resume else [])]
    m = DEMO_MODEL
    print(f"hpcfsdp demo: training a {m['n_layer']}-layer, {m['n_embd']}-wide GPT with FULL_SHARD on {args.nprocs} "
          f"ranks for {args.steps} steps", flush=True)
    t0 = time.perf_counter()
    rc = launch(args.nprocs, cmd, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if rc in (STOPPED_EXIT, INTERRUPTED_EXIT):
        return rc  # stopped by a signal (Ctrl-C): train said what it saved and how to resume
    if rc != 0:
        print(f"hpcfsdp demo: training failed (exit {rc})", file=sys.stderr)
        return rc
    recs = [r for r in (json.loads(line) for line in open(metrics) if line.strip()) if "loss" in r]
    if not recs:
        print(f"hpcfsdp demo: training logged nothing to {metrics}", file=sys.stderr)
        return 1
    last = recs[-1]  # the loss, metrics and checkpoint are in train's own summary line, printed once above
    from .plot import PlotDependencyError, load_metrics, plot_metrics

    try:
        png = os.path.join(out, "loss.png")
        plot_metrics(load_metrics(metrics), png)
        plot = f"plot: {png}"
    except PlotDependencyError:
        plot = "pip install 'hpcfsdp[plot]' and run `hpcfsdp plot` for a plot"
    ckpt = os.path.join(out, "checkpoints", "latest")
    print(f"hpcfsdp demo: {last['step']} steps in {wall:.0f} s, {last['tokens_per_s']:.0f} tokens/s at the end; {plot}; "
          f"inspect the checkpoint with `hpcfsdp checkpoint inspect {ckpt}`")
    return 0
