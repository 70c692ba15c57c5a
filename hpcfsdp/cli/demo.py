"""`hpcfsdp demo`: train a small GPT with FULL_SHARD on 4 MPI ranks on the shipped corpus, then report."""

import json
import os
import sys

__all__ = ["add_parser", "run", "demo_train_args"]


def add_parser(subparsers):
    p = subparsers.add_parser(
        "demo",
        help="train a small GPT with FULL_SHARD on 4 ranks (about 2 minutes on 2 cores)",
        description="Launch `hpcfsdp train` on N ranks (default 4) with FULL_SHARD: a 4-layer, 128-wide GPT on "
        "the byte-level corpus shipped with hpcfsdp. Prints the loss falling, then where the metrics, the plot "
        "(if matplotlib is installed) and the checkpoint are.",
    )
    p.add_argument("-n", "--nprocs", type=int, default=4, help="number of MPI ranks")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--out-dir", default="runs/demo", help="where metrics, plot and checkpoint go")
    p.add_argument("--timeout", type=float, default=900, help="kill the run after S seconds")
    p.set_defaults(func=run)


def demo_train_args(steps: int, out_dir: str) -> list:
    return [
        "--strategy", "FULL_SHARD", "--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--block-size", "64",
        "--batch-size", "8", "--steps", str(steps), "--lr", "3e-3", "--min-lr", "3e-4", "--warmup-steps", "20",
        "--dropout", "0.0", "--log-interval", "10", "--out-dir", out_dir,
        "--checkpoint-dir", os.path.join(out_dir, "checkpoints"), "--checkpoint-interval", str(max(1, steps // 3)),
        "--seed", "1337",
    ]


def run(args) -> int:
    from .launch import launch

    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "train", *demo_train_args(args.steps, out)]
    print(f"hpcfsdp demo: training a 4-layer GPT with FULL_SHARD on {args.nprocs} ranks for {args.steps} steps",
          flush=True)
    rc = launch(args.nprocs, cmd, timeout=args.timeout)
    if rc != 0:
        print(f"hpcfsdp demo: training failed (exit {rc})", file=sys.stderr)
        return rc
    metrics = os.path.join(out, "metrics.jsonl")
    recs = [json.loads(line) for line in open(metrics) if line.strip()]
    recs = [r for r in recs if "loss" in r]
    first, last = recs[0], recs[-1]
    print(f"\nloss fell from {first['loss']:.3f} (step {first['step']}) to {last['loss']:.3f} (step {last['step']}), "
          f"{last['tokens_per_s']:.0f} tokens/s at the end")
    print(f"metrics:    {metrics}")
    from .plot import PlotDependencyError, load_metrics, plot_metrics

    try:
        png = os.path.join(out, "loss.png")
        plot_metrics(load_metrics(metrics), png)
        print(f"plot:       {png}")
    except PlotDependencyError:
        print("plot:       pip install 'hpcfsdp[plot]' and run `hpcfsdp plot` to draw one")
    print(f"checkpoint: {os.path.join(out, 'checkpoints', 'latest')} "
          f"(inspect with `hpcfsdp checkpoint inspect`)")
    return 0
