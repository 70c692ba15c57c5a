"""`hpcfsdp plan`: predicted step time and memory per rank from 8 to 1024 ranks, and the model's fit to measured runs.

The model is `hpcfsdp.cli._stepmodel` ([Note: Step-time model]). Without measurements it tabulates a stated
interconnect and model; with ``--fit FILE`` it fits the inter-host alpha and bandwidth efficiency to runs of
`hpcfsdp bench train --link ... --compute-only` (JSON lines, e.g. from scripts/cluster_bench.py --json), and
with ``--check FILE`` it predicts other runs with the fitted parameters and prints predicted against measured.
``--config FILE`` reads the model, batch, precision, strategy and quantization of a run from the file `hpcfsdp train
--config` reads (the trainer's defaults for the keys it leaves out); flags given on the command line override it.
With ``--quantize-weights``/``--quantize-grads`` (as `hpcfsdp train`'s) each row also gives the bytes per node and
the step time with the quantized collectives, beside the unquantized ones.
"""

import argparse
import dataclasses
import json
import statistics
import sys

from . import _stepmodel as sm
from .config import QUANTIZE_GRADS, QUANTIZE_WEIGHTS, check_quantize

__all__ = ["add_parser", "run", "load_runs", "fit_runs", "plan_table", "PLAN_DEFAULTS"]

# The settings a training config gives (plan flag dest -> default without --config: GPT-3 6.7B's shape).
PLAN_DEFAULTS = {"vocab_size": 50304, "block_size": 2048, "n_layer": 32, "n_embd": 4096, "batch_size": 2,
                 "tie": True, "precision": "bf16", "strategies": "FULL_SHARD,HYBRID_SHARD",
                 "quantize_weights": "none", "quantize_grads": "none", "quantize_block": 256}
_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def add_parser(subparsers):
    p = subparsers.add_parser(
        "plan",
        help="predict step time and memory per rank at scale (alpha-beta + overlap model)",
        description="Tabulate predicted step time and memory per rank of a GPT for a range of rank counts on a "
        "stated interconnect (G ranks per node, a per-node link rate, an intra-node bandwidth, alpha per ring "
        "step) and compute (peak TFLOP/s x efficiency). --fit/--check fit the model to measured multi-host runs "
        "and check it on others.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    S = argparse.SUPPRESS  # these come from PLAN_DEFAULTS, or --config, unless given (see _resolve)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="the run's TOML or JSON config file (as `hpcfsdp train --config`): its model, batch_size, "
                   "mixed_precision, strategy and quantize_*; the flags below override it")
    m = p.add_argument_group("model (default: a 6.7B-parameter GPT, GPT-3 6.7B shape; with --config: the run's)")
    m.add_argument("--vocab-size", type=int, default=S, help="(default: 50304)")
    m.add_argument("--block-size", type=int, default=S, help="(default: 2048)")
    m.add_argument("--n-layer", type=int, default=S, help="(default: 32)")
    m.add_argument("--n-embd", type=int, default=S, help="(default: 4096)")
    m.add_argument("--batch-size", type=int, default=S, help="sequences per rank (default: 2)")
    m.add_argument("--no-tie", dest="tie", action="store_false", default=S, help="untied output head")
    m.add_argument("--tie", dest="tie", action="store_true", default=S, help="output head tied to the embedding "
                   "(default)")
    m.add_argument("--precision", choices=list(_BYTES), default=S,
                   help="bytes of gathered parameters and reduced gradients on the wire (bf16, fp16: 2, fp32: 4; "
                   "--config: mixed_precision, none = fp32) (default: bf16)")
    q = p.add_argument_group("quantized collectives (as `hpcfsdp train`'s; each row then gives both: quantized and not)")
    q.add_argument("--quantize-weights", choices=QUANTIZE_WEIGHTS, default=S,
                   help="all-gathers of block-quantized weights: codes + scales on every link (default: none)")
    q.add_argument("--quantize-grads", choices=QUANTIZE_GRADS, default=S,
                   help="the gradient reduction's cross-host hop quantized; inside a node it stays full precision "
                   "(default: none)")
    q.add_argument("--quantize-block", type=int, default=S, help="elements per float32 scale (default: 256)")
    n = p.add_argument_group("machine (default: H100-class nodes of 4 GPUs, 200 Gbit/s per node)")
    n.add_argument("--ranks", default="8,16,32,64,128,256,512,1024", help="comma-separated rank counts")
    n.add_argument("--gpus-per-node", type=int, default=4)
    n.add_argument("--link-rate", default="200gbit", help="network rate per node (e.g. 200gbit, 1gbit, 200mbit)")
    n.add_argument("--eff-inter", type=float, default=0.8, help="fraction of the link rate collectives reach")
    n.add_argument("--alpha-inter", type=float, default=20e-6, help="seconds per ring step between nodes")
    n.add_argument("--call-inter", type=float, default=0.0,
                   help="seconds per collective that crosses nodes, whatever its size (software start-up)")
    n.add_argument("--intra-bw", type=float, default=150e9, help="bytes/s per rank inside a node")
    n.add_argument("--alpha-intra", type=float, default=5e-6, help="seconds per ring step inside a node")
    n.add_argument("--tflops", type=float, default=989.0, help="peak dense TFLOP/s per rank")
    n.add_argument("--efficiency", type=float, default=0.4, help="fraction of the peak the compute reaches")
    p.add_argument("--strategies", default=S,
                   help="comma-separated, of FULL_SHARD and HYBRID_SHARD (default: both; --config: its strategy)")
    p.add_argument("--collectives", choices=["hier", "flat"], default="hier",
                   help="FULL_SHARD across nodes: node-aware (hier) or one flat ring over all ranks")
    p.add_argument("--fit", action="append", default=[], metavar="FILE",
                   help="JSON lines of `bench train --link --compute-only` runs to fit alpha-inter and eff-inter on")
    p.add_argument("--fit-rate", default=None, help="fit only on the runs at this link rate (e.g. 200mbit)")
    p.add_argument("--fit-params", default="alpha_inter,eff_inter",
                   help=f"Links fields to fit, of {','.join(sm.FITTABLE)} (cpu_per_byte: seconds of compute per byte "
                   "sent, TCP on shared cores; call_inter: seconds per collective across hosts)")
    p.add_argument("--cpu-scope", choices=["host", "machine"], default="host",
                   help="cpu_per_byte counts one host's bytes (host) or every host's (machine: simulated hosts "
                   "sharing one machine's cores)")
    p.add_argument("--check", action="append", default=[], metavar="FILE",
                   help="JSON lines of runs to predict with the fitted parameters (predicted vs measured)")
    p.add_argument("--json", action="store_true", help="print JSON instead of Markdown tables")
    p.set_defaults(func=run)


def load_runs(paths, rate=None):
    """hpcfsdp `bench train` results with hosts, link rate and compute-only (PyTorch peer lines are skipped)."""
    runs = []
    for path in paths:
        with open(path) as f:
            for no, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                if "step_time_s" not in r:
                    continue
                missing = [k for k in ("compute_only_s", "hosts", "link_rate_bps", "world_size", "model") if k not in r]
                if missing:
                    raise ValueError(f"{path}:{no}: a run without {', '.join(missing)}: run `bench train` with "
                                     "--link, --link-rate and --compute-only across hosts")
                if rate is not None and abs(r["link_rate_bps"] - 8 * sm.parse_rate(rate)) > 1:
                    continue
                m = r["model"]
                runs.append({
                    "strategy": r["strategy"], "hosts": r["hosts"], "per_host": r["world_size"] // r["hosts"],
                    "rate": r["link_rate_bps"] / 8, "compute_s": r["compute_only_s"], "step_s": r["step_time_s"],
                    "shape": (m["vocab_size"], m["block_size"], m["n_layer"], m["n_embd"], m["batch_size"],
                              m["params"] != _untied_params(m)),  # tied head: fewer parameters
                    "excess": (max(r["bytes_sent_per_host_per_step"]) / r["wire_min_bytes_per_host"]
                               if r.get("wire_min_bytes_per_host") and r.get("bytes_sent_per_host_per_step") else None),
                })
    return runs


def _untied_params(m):
    return sm.gpt_shape(m["vocab_size"], m["block_size"], m["n_layer"], m["n_embd"], 1, tie=False).params


def _group(runs):
    """Median step and compute over repeats of the same configuration."""
    groups = {}
    for r in runs:
        groups.setdefault((r["strategy"], r["hosts"], r["per_host"], r["rate"], r["shape"]), []).append(r)
    out = []
    for key, rs in groups.items():
        ex = [r["excess"] for r in rs if r["excess"] is not None]
        row = dict(strategy=key[0], hosts=key[1], per_host=key[2], rate=key[3], shape=key[4], n=len(rs),
                   compute_s=statistics.median(r["compute_s"] for r in rs),
                   step_s=statistics.median(r["step_s"] for r in rs), excess=statistics.median(ex) if ex else None)
        if all("predicted_s" in r for r in rs):
            row["predicted_s"] = statistics.median(r["predicted_s"] for r in rs)
        out.append(row)
    return out


def _shape(key):
    vocab, block, layers, width, batch, tie = key
    return sm.gpt_shape(vocab, block, layers, width, batch, tie=tie, keep_last=True)  # as shard_gpt wraps it


def fit_runs(fit, hierarchical=False, params=("alpha_inter", "eff_inter"), cpu_scope="host"):
    """Fit Links (``params``; flat_excess from the measured bytes) to grouped runs of one model."""
    shapes = {r["shape"] for r in fit}
    if len(shapes) != 1:
        raise ValueError(f"--fit runs must be of one model, got {len(shapes)}")
    shape = _shape(shapes.pop())
    ex = [r["excess"] for r in fit if r["excess"] is not None and r["strategy"] == "FULL_SHARD" and r["per_host"] > 1]
    base = sm.Links(inter_rate=fit[0]["rate"], alpha_inter=100e-6, eff_inter=0.9,
                    flat_excess=statistics.median(ex) if ex else None, cpu_scope=cpu_scope)
    links, errors = sm.fit(fit, shape, base, params=params, hierarchical=hierarchical)
    return links, errors, shape


def _predict_grouped(runs, links, hierarchical):
    """Each run predicted from its own compute-only time; medians per configuration, with the relative error."""
    for r in runs:
        lk = dataclasses.replace(links, inter_rate=r["rate"])
        r["predicted_s"] = sm.predict_step(_shape(r["shape"]), r["strategy"], r["hosts"], r["per_host"], lk,
                                           r["compute_s"], hierarchical)
    rows = _group(runs)
    for r in rows:
        r["error"] = r["predicted_s"] / r["step_s"] - 1
    return rows


def _pct(x):
    return f"{100 * x:+.1f}%"


def _from_config(path) -> dict:
    """The plan settings of a training config file (the trainer's defaults for keys it leaves out)."""
    from .config import TrainConfig, load_config_file

    cfg = TrainConfig.from_dict(load_config_file(path), source=f"config {path!r}")
    if cfg.strategy not in ("FULL_SHARD", "HYBRID_SHARD"):
        raise ValueError(f"config {path!r}: strategy={cfg.strategy!r}: the model predicts FULL_SHARD and "
                         "HYBRID_SHARD; give --strategies")
    unmodelled = [f"{k}={getattr(cfg, k)}" for k, plain in (("grad_accum", 1), ("tp", 1), ("cpu_offload", False),
                                                             ("activation_checkpointing", False))
                  if getattr(cfg, k) != plain]
    if unmodelled:
        print(f"hpcfsdp plan: note: config {path!r}: the model leaves out {', '.join(unmodelled)} "
              "(it predicts one micro-batch, no tensor parallelism, no offload or recomputation)", file=sys.stderr)
    return {"vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "n_layer": cfg.n_layer, "n_embd": cfg.n_embd,
            "batch_size": cfg.batch_size, "tie": True if cfg.tie_weights is None else cfg.tie_weights,  # None: GPT's
            "precision": "fp32" if cfg.mixed_precision == "none" else cfg.mixed_precision, "strategies": cfg.strategy,
            "quantize_weights": cfg.quantize_weights, "quantize_grads": cfg.quantize_grads,
            "quantize_block": cfg.quantize_block}


def _resolve(a) -> None:
    """PLAN_DEFAULTS, then the --config file's values, then the flags given (already in ``a``); once."""
    if all(hasattr(a, name) for name in PLAN_DEFAULTS):
        return
    values = dict(PLAN_DEFAULTS)
    if getattr(a, "config", None):
        values.update(_from_config(a.config))
    for name, value in values.items():
        if not hasattr(a, name):
            setattr(a, name, value)


def plan_table(a):
    """(unquantized shape, compute seconds, rows): per rank count and strategy, the unquantized figures; with
    quantization also ``quantized_host_bytes``, ``quantized_wire_bound_s``, ``quantized_step_s`` (and its exposed
    fraction and tokens/s), the same model with the quantized collectives' bytes."""
    _resolve(a)
    check_quantize(a.quantize_weights, a.quantize_grads, a.quantize_block)  # train's messages
    plain = sm.gpt_shape(a.vocab_size, a.block_size, a.n_layer, a.n_embd, a.batch_size, tie=a.tie,
                         param_bytes=_BYTES[a.precision], grad_bytes=_BYTES[a.precision], keep_last=True)
    quant = dataclasses.replace(plain, quantize_weights=a.quantize_weights, quantize_grads=a.quantize_grads,
                                quantize_block=a.quantize_block)
    links = sm.Links(inter_rate=sm.parse_rate(a.link_rate), alpha_inter=a.alpha_inter, eff_inter=a.eff_inter,
                     bw_intra=a.intra_bw, alpha_intra=a.alpha_intra, call_inter=a.call_inter)
    hier = a.collectives == "hier"
    compute = 3 * sum(plain.flops) / (a.tflops * 1e12 * a.efficiency)
    rows = []
    for ranks in [int(x) for x in a.ranks.split(",")]:
        g = min(a.gpus_per_node, ranks)
        if ranks % g:
            raise ValueError(f"--ranks {ranks} is not a multiple of --gpus-per-node {a.gpus_per_node}")
        hosts = ranks // g
        tokens = ranks * a.batch_size * a.block_size
        for strategy in a.strategies.split(","):
            step = sm.predict_step(plain, strategy, hosts, g, links, compute, hierarchical=hier)
            mem = sm.memory_per_rank(plain, strategy, ranks, g, a.batch_size * a.block_size, a.n_embd, a.n_layer)
            row = {"ranks": ranks, "nodes": hosts, "strategy": strategy, "compute_s": compute,
                   "host_bytes": sm.host_link_bytes(plain, strategy, hosts, g, links, hier),
                   "wire_bound_s": sm.wire_bound(plain, strategy, hosts, links), "step_s": step,
                   "exposed_frac": (step - compute) / step, "tokens_per_s": tokens / step,
                   "mem_state_gib": mem["state"] / 2**30, "mem_total_gib": mem["total"] / 2**30}
            if quant.quantized:
                qstep = sm.predict_step(quant, strategy, hosts, g, links, compute, hierarchical=hier)
                row.update(quantized_host_bytes=sm.host_link_bytes(quant, strategy, hosts, g, links, hier),
                           quantized_wire_bound_s=sm.wire_bound(quant, strategy, hosts, links), quantized_step_s=qstep,
                           quantized_exposed_frac=(qstep - compute) / qstep, quantized_tokens_per_s=tokens / qstep)
            rows.append(row)
    return plain, compute, rows


def _print_quantized(pl):
    """The table with the bytes per node and step time unquantized and quantized side by side."""
    q = pl["quantize"]
    print(f"quantized collectives: weights {q['weights']} (every link), gradients {q['grads']} (across nodes; full "
          f"precision inside), {q['block']} elements per scale; exposed comm and tokens/s are the quantized run's\n")
    print("| ranks | nodes | strategy | GiB per node | step (s) | quantized GiB per node | quantized wire bound (s) "
          "| quantized step (s) | exposed comm | tokens/s | state per rank (GiB) | memory per rank (GiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in pl["rows"]:
        print(f"| {r['ranks']} | {r['nodes']} | {r['strategy']} | {r['host_bytes'] / 2**30:.3f} | {r['step_s']:.3f} "
              f"| {r['quantized_host_bytes'] / 2**30:.3f} | {r['quantized_wire_bound_s']:.3f} "
              f"| {r['quantized_step_s']:.3f} | {100 * r['quantized_exposed_frac']:.0f}% "
              f"| {r['quantized_tokens_per_s']:,.0f} | {r['mem_state_gib']:.1f} | {r['mem_total_gib']:.1f} |")


def run(a) -> int:
    try:
        _resolve(a)
        out = {}
        if a.fit:
            fit = load_runs(a.fit, a.fit_rate)
            if not fit:
                raise ValueError(f"no runs to fit in {', '.join(a.fit)}" + (f" at {a.fit_rate}" if a.fit_rate else ""))
            hier = a.collectives == "hier"
            ex = [r["excess"] for r in fit if r["excess"] and r["strategy"] == "FULL_SHARD" and r["per_host"] > 1]
            if hier and ex and statistics.median(ex) > 1.1:
                print(f"hpcfsdp plan: note: the FULL_SHARD runs sent {statistics.median(ex):.2f}x the node-aware "
                      "minimum per host, so their collectives were flat; fitting them as node-aware (--collectives "
                      "hier) blames those bytes on the link rate. Use --collectives flat for such runs.",
                      file=sys.stderr)
            links, _, _ = fit_runs(fit, hierarchical=hier, params=tuple(a.fit_params.split(",")),
                                   cpu_scope=a.cpu_scope)
            out["fit"] = {"alpha_inter_s": links.alpha_inter, "eff_inter": links.eff_inter,
                          "cpu_per_byte": links.cpu_per_byte, "call_inter_s": links.call_inter,
                          "flat_excess": links.flat_excess,
                          "runs": _predict_grouped(fit, links, hier)}
            if a.check:
                out["check"] = _predict_grouped(load_runs(a.check), links, hier)
        elif a.check:
            raise ValueError("--check needs --fit (the parameters come from the fitted runs)")
        else:
            shape, compute, rows = plan_table(a)
            out["plan"] = {"params": shape.params, "compute_s": compute, "rows": rows}
            if a.quantize_weights != "none" or a.quantize_grads != "none":
                out["plan"]["quantize"] = {"weights": a.quantize_weights, "grads": a.quantize_grads,
                                           "block": a.quantize_block}
    except (ValueError, OSError) as err:
        print(f"hpcfsdp plan: {err}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out, default=list))
        return 0
    if "plan" in out:
        pl = out["plan"]
        print(f"GPT {pl['params'] / 1e9:.2f}B params, {a.batch_size} x {a.block_size} tokens per rank, {a.precision}; "
              f"{a.gpus_per_node} ranks per node, {a.link_rate} per node (x{a.eff_inter}), {a.collectives} "
              f"collectives; compute {pl['compute_s']:.3f} s per step ({a.tflops:g} TFLOP/s x {a.efficiency:g})")
        if "quantize" in pl:
            _print_quantized(pl)
            return 0
        print("\n| ranks | nodes | strategy | wire bound (s) | step (s) | exposed comm | tokens/s | state per rank (GiB) "
              "| memory per rank (GiB) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in pl["rows"]:
            print(f"| {r['ranks']} | {r['nodes']} | {r['strategy']} | {r['wire_bound_s']:.3f} | {r['step_s']:.3f} "
                  f"| {100 * r['exposed_frac']:.0f}% | {r['tokens_per_s']:,.0f} | {r['mem_state_gib']:.1f} "
                  f"| {r['mem_total_gib']:.1f} |")
        return 0
    f = out["fit"]
    print(f"fit: alpha_inter {f['alpha_inter_s'] * 1e6:.0f} us per ring step, link efficiency {f['eff_inter']:.3f}, "
          f"TCP CPU {f['cpu_per_byte'] * 1e9:.2f} ns per byte sent ({a.cpu_scope}), "
          f"{f['call_inter_s'] * 1e3:.2f} ms per cross-host collective, "
          f"flat collective bytes {f['flat_excess'] or 0:.2f}x the node-aware minimum\n")
    print("| set | hosts x ranks | link | strategy | runs | compute-only (s) | measured step (s) | predicted (s) | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in (("fit", f["runs"]), ("check", out.get("check", []))):
        for r in rows:
            print(f"| {name} | {r['hosts']} x {r['per_host']} | {8 * r['rate'] / 1e6:g} Mbit/s | {r['strategy']} | {r['n']} "
                  f"| {r['compute_s']:.3f} | {r['step_s']:.3f} | {r['predicted_s']:.3f} | {_pct(r['error'])} |")
    return 0
