"""Loss of quantized training on simulated hosts (root): `python scripts/quantize_accuracy.py [--steps 300]`.

Brings up --hosts simulated hosts (2) of --ppn ranks (2), so that the quantized collectives' cross-host hops
really are quantized, and trains the demo's GPT (`hpcfsdp demo`'s model, data, seed and schedule, logging
every step) once per variant: unquantized, int8 weights + int8 gradients, int8 weights + int4 gradients, and
int4 gradients without error feedback. Prints, per variant, the mean and the median loss of the last --tail (20)
steps and their gaps to the unquantized run's (the median is the short runs' measure: a one-step loss spike,
which the demo's schedule shows early on with or without quantization, moves a 20-step mean by percents);
--json writes them, --png draws the loss curves side by side.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from cluster.harness import Cluster  # noqa: E402

from hpcfsdp.cli.demo import demo_train_args  # noqa: E402

VARIANTS = [
    ("fp32", []),
    ("int8 weights + int8 grads", ["--quantize-weights", "int8", "--quantize-grads", "int8"]),
    ("int8 weights + int4 grads", ["--quantize-weights", "int8", "--quantize-grads", "int4"]),
    ("int8 weights + int4 grads, no error feedback",
     ["--quantize-weights", "int8", "--quantize-grads", "int4", "--no-quantize-error-feedback"]),
]


def train_losses(cluster, hosts, ppn, steps, extra, out_dir, strategy):
    """Per-step train losses of one run of the demo's training on the cluster."""
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "train", *demo_train_args(steps, out_dir), "--log-interval", "1",
           "--strategy", strategy, *extra]
    res, _ = cluster.launch(hosts, ppn, cmd, timeout=max(300, 3 * steps))
    if res.returncode:
        raise RuntimeError(f"{' '.join(extra) or 'fp32'}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r["loss"] for r in recs if "loss" in r and "step" in r]


def draw(curves, path, title):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, label=name, linewidth=1.0)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tail", type=int, default=20, help="steps averaged at the end")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ppn", type=int, default=2)
    ap.add_argument("--strategy", default="FULL_SHARD", choices=["FULL_SHARD", "HYBRID_SHARD"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args()
    if a.tail < 1 or a.steps < a.tail:
        ap.error(f"--tail {a.tail} must be 1..--steps ({a.steps})")
    curves = {}
    with Cluster(a.hosts) as cluster, tempfile.TemporaryDirectory() as tmp:
        for i, (name, extra) in enumerate(VARIANTS):
            curves[name] = train_losses(cluster, a.hosts, a.ppn, a.steps, extra, os.path.join(tmp, str(i)), a.strategy)
    base = None
    rows = []
    for name, losses in curves.items():
        if len(losses) != a.steps:
            raise RuntimeError(f"{name}: {len(losses)} losses logged, expected {a.steps}")
        mean, median = sum(losses[-a.tail:]) / a.tail, statistics.median(losses[-a.tail:])
        base = (mean, median) if base is None else base
        rows.append({"variant": name, "tail_mean_loss": mean, "gap": mean / base[0] - 1, "tail_median_loss": median,
                     "median_gap": median / base[1] - 1, "final_loss": losses[-1]})
    print(f"| variant ({a.strategy}, {a.hosts} x {a.ppn}, {a.steps} steps) | mean loss, last {a.tail} | gap | "
          f"median loss, last {a.tail} | gap |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['tail_mean_loss']:.4f} | {100 * r['gap']:+.2f}% | {r['tail_median_loss']:.4f} | "
              f"{100 * r['median_gap']:+.2f}% |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "tail": a.tail, "strategy": a.strategy, "rows": rows, "curves": curves}, f)
    if a.png:
        draw(curves, a.png, f"demo GPT, {a.strategy} on {a.hosts} simulated hosts x {a.ppn} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
