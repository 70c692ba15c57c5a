"""A step-time and memory model of FSDP training across hosts: alpha-beta per link level, compute per unit, overlap.

[Note: Step-time model]
Ranks: H hosts of G ranks each (N = H * G). Two link levels, each alpha-beta: inside a host (shared memory or
NVLink: ``alpha_intra`` seconds per ring step, ``bw_intra`` bytes/s per rank) and between hosts (``alpha_inter``
per ring step, the host link's nominal rate times ``eff_inter``, shared by the host's G ranks), plus
``call_inter`` seconds once per collective that crosses hosts, whatever its size or ring length: the fixed
cost of starting one (the comm thread's hand-off, Python between MPI calls, TCP leaving its idle state).

Collectives of a unit whose full (unsharded) size is B bytes:
- FULL_SHARD all-gather / reduce-scatter over the N ranks. Node-aware ("hier"): across hosts once per host
  ((H-1)/H * B on each host link, H-1 ring steps) then inside the host ((G-1)/G * B per rank, G-1 steps),
  one after the other. Flat: one ring over all N ranks, (N-1) steps of alpha_inter, and the host link carries
  ``flat_excess`` times the node-aware minimum (1.5 for a ring of 2 x 2 ranks: (N-1)/N over (H-1)/H; MPICH's
  mix of algorithms puts 1.68x on the link here, measured); with G = 1 flat and node-aware coincide.
- HYBRID_SHARD: all-gather / reduce-scatter inside the host only, then an all-reduce of the rank's shard (B/G)
  across the H replicas: 2(H-1)/H * B on each host link, 2(H-1) steps.
These are the bytes of ``bench train``'s wire bound; ``wire_bound`` here is the same definition (``wire_min_bytes``).

Quantized collectives (``ModelShape.quantize_*``; See [Note: Quantized all-gather] and [Note: Quantized gradient
reduction] in distributed/fsdp/_fully_shard/_fsdp_quantized.py) change the bytes per element, not the pattern:
codes and a float32 scale per ``block`` elements, ``quantized_itemsize``: int8 and fp8 1 + 4/block, int4 0.5 +
4/block. Weights: each rank's quantized shard is what is gathered, so the all-gathers carry the quantized bytes on
every link, inside hosts and across. Gradients: the reduce-scatter inside a host stays full precision and only the
cross-host hop carries the quantized bytes: FULL_SHARD's hop is an all-to-all of the host-summed chunks, node-aware
whatever the group's other collectives ((H-1)/H * B quantized per host link, H-1 steps); HYBRID_SHARD's replicate
all-reduce is an all-to-all of quantized chunks plus an all-gather of the quantized sums (two collectives across
hosts, 2(H-1) steps, 2(H-1)/H * B quantized per host link). The quantize and dequantize kernels' time is left out
(scripts/bench_quantize.py measures them), and ``memory_per_rank`` leaves out the payload buffers.

Schedule (``simulate``): one comm channel (hpcfsdp's comm thread) serves collectives in issue order, one compute
stream runs the units. Forward: the root's parameters are gathered first and kept until the step ends (its
compute, the head, runs after the blocks); block i+1's all-gather is issued when block i's forward starts
(prefetch of one), so it overlaps block i's compute; a block's forward waits for its own gather. Backward: the
head first (the last block's re-gather overlaps it), then the blocks in reverse: block i-1's re-gather is issued
when block i's backward starts, and after block i's backward its reduce-scatter (then, for HYBRID_SHARD, the
cross-host all-reduce), overlapping the backward of block i-1; the root's reduce-scatter comes last. The
optimizer step runs after the last collective. Exposed communication = step - compute; it lies
between ``max(0, comm - compute)`` roughly and the serial sum (``overlap=False``: every collective exposed).

Compute per unit: the run's compute-only step split over units by their matmul FLOPs, 1/3 forward and 2/3
backward; or, for planning, FLOPs / (peak * efficiency). ``cpu_per_byte`` adds compute time per byte the host
sends: on the 2-core test machine the kernel's TCP work competes with the ranks for the cores (0 on a real
cluster with a NIC that offloads it). With ``cpu_scope="machine"`` the charge is for the bytes of all H hosts,
since the simulated hosts share one machine's cores; "host" charges one host's bytes (a host's own cores).
"""

import dataclasses
import math

from .config import QUANTIZE_GRADS, QUANTIZE_WEIGHTS  # the codes of QuantizedAllGather, QuantizedReduceScatter

__all__ = ["Links", "ModelShape", "collective_times", "simulate", "predict_step", "wire_bound", "host_link_bytes",
           "fit", "quantized_itemsize", "wire_min_bytes",
           "gpt_shape", "memory_per_rank", "parse_rate"]


def quantized_itemsize(kind: str, block: int, full: float) -> float:
    """Bytes per element on the wire: ``full`` unquantized (``kind`` "none"), else the codes and the per-block float32
    scales (See [Note: Quantized payloads] in hpcfsdp/_kernels/quantize.py): int8, fp8 1 + 4/block; int4 0.5 + 4/block."""
    if kind == "none":
        return full
    from .._kernels import quantize as _quantize

    return _quantize.payload_bytes(kind, block, block) / block


def wire_min_bytes(strategy: str, hosts: int, once: int, twice: int, param_itemsize: float,
                   grad_itemsize: float) -> float:
    """Least payload bytes one host must send per step (``bench train``'s wire bound; See [Note: Step against its
    bounds] in cli/bench_train.py): ``once``/``twice`` parameters gathered once/twice per step, bytes per element
    on the cross-host links (``quantized_itemsize``)."""
    if hosts <= 1:
        return 0.0
    frac = (hosts - 1) / hosts
    grads = (once + twice) * grad_itemsize
    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return frac * (once + 2 * twice) * param_itemsize + frac * grads
    if strategy in ("HYBRID_SHARD", "NO_SHARD"):
        return 2 * frac * grads
    raise ValueError(f"no wire bound for strategy {strategy!r}")


def parse_rate(text) -> float:
    """'200mbit' / '1gbit' / '200G' (bits) or a number of bit/s -> bytes per second."""
    if isinstance(text, (int, float)):
        return float(text) / 8
    t = str(text).strip().lower().removesuffix("/s").removesuffix("it").removesuffix("b")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
    try:
        if t and t[-1] in mult:
            return float(t[:-1]) * mult[t[-1]] / 8
        return float(t) / 8
    except ValueError:
        raise ValueError(f"link rate {text!r}: expected e.g. 200mbit, 1gbit, 200G or bits per second") from None


@dataclasses.dataclass
class Links:
    """Alpha-beta of the two link levels. Rates in bytes/s; ``inter_rate`` is per host (nominal)."""
    inter_rate: float
    alpha_inter: float = 50e-6
    eff_inter: float = 1.0
    bw_intra: float = 2e9
    alpha_intra: float = 10e-6
    flat_excess: float | None = None  # host-link bytes of a flat collective over the node-aware minimum
    cpu_per_byte: float = 0.0  # compute-stream seconds per byte a host sends (kernel TCP work on shared cores)
    cpu_scope: str = "host"  # "machine": every simulated host's TCP work lands on the same cores (one machine)
    call_inter: float = 0.0  # seconds per collective that crosses hosts, independent of its size and ring length

    def __post_init__(self):
        for name in ("inter_rate", "bw_intra", "eff_inter"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Links.{name} must be > 0, got {getattr(self, name)}")
        if self.cpu_scope not in ("host", "machine"):
            raise ValueError(f"Links.cpu_scope must be 'host' or 'machine', got {self.cpu_scope!r}")
        for name in ("alpha_inter", "alpha_intra", "cpu_per_byte", "call_inter"):
            if getattr(self, name) < 0:
                raise ValueError(f"Links.{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass
class ModelShape:
    """FSDP units in forward order: parameter counts and relative compute (FLOPs); ``root`` is unit 0."""
    numels: list
    flops: list
    param_bytes: int = 4  # per gathered parameter, unquantized
    grad_bytes: int = 4  # per reduced gradient element, unquantized
    quantize_weights: str = "none"  # none | int8 | fp8: the all-gathers carry codes + scales on every link
    quantize_grads: str = "none"  # none | int8 | int4: the reductions' cross-host hop carries codes + scales
    quantize_block: int = 256  # elements per float32 scale
    keep_last: bool = False  # the last unit keeps its parameters from forward to backward (gathered once)

    def __post_init__(self):
        if len(self.numels) != len(self.flops) or not self.numels:
            raise ValueError(f"numels and flops must be non-empty and of equal length, got {len(self.numels)} "
                             f"and {len(self.flops)}")
        for name, kinds in (("quantize_weights", QUANTIZE_WEIGHTS), ("quantize_grads", QUANTIZE_GRADS)):
            if getattr(self, name) not in kinds:
                raise ValueError(f"ModelShape.{name} must be one of {', '.join(kinds)}, got {getattr(self, name)!r}")
            quantized_itemsize(getattr(self, name), self.quantize_block, 1)  # the block is checked there

    @property
    def params(self):
        return sum(self.numels)

    @property
    def quantized(self) -> bool:
        return self.quantize_weights != "none" or self.quantize_grads != "none"

    @property
    def param_wire_bytes(self) -> float:
        """Bytes per parameter element an all-gather carries (on every link)."""
        return quantized_itemsize(self.quantize_weights, self.quantize_block, self.param_bytes)

    @property
    def grad_wire_bytes(self) -> float:
        """Bytes per gradient element the reduction carries across hosts (inside a host: ``grad_bytes``)."""
        return quantized_itemsize(self.quantize_grads, self.quantize_block, self.grad_bytes)


def gpt_shape(vocab, block, n_layer, n_embd, batch, tie=True, param_bytes=4, grad_bytes=4, quantize_weights="none",
              quantize_grads="none", quantize_block=256, keep_last=False):
    """hpcfsdp's GPT as shard_gpt wraps it: root (embeddings, final norm, head) + one unit per block (``keep_last``:
    the last block keeps its parameters between forward and backward, as shard_gpt's default).

    FLOPs per unit are forward matmul FLOPs for ``batch`` sequences (2 per multiply-add; attention included).
    """
    tokens = batch * block
    blk_params = 12 * n_embd * n_embd + 13 * n_embd
    blk_flops = 2 * tokens * 12 * n_embd * n_embd + 2 * 2 * tokens * block * n_embd
    root_params = vocab * n_embd + block * n_embd + 2 * n_embd + (0 if tie else vocab * n_embd)
    root_flops = 2 * tokens * vocab * n_embd
    return ModelShape([root_params] + [blk_params] * n_layer, [root_flops] + [blk_flops] * n_layer,
                      param_bytes, grad_bytes, quantize_weights, quantize_grads, quantize_block,
                      keep_last and n_layer > 0)


def _flat_excess(links, hosts, per_host):
    if per_host == 1:
        return 1.0
    if links.flat_excess is not None:
        return links.flat_excess
    n = hosts * per_host
    return ((n - 1) / n) / ((hosts - 1) / hosts)


def collective_times(nbytes, strategy, hosts, per_host, links, hierarchical=True, cross_nbytes=None):
    """Seconds of (all-gather or reduce-scatter of a unit of ``nbytes`` full bytes, cross-host all-reduce).

    ``cross_nbytes``: the unit's bytes on the cross-host hop of a quantized gradient reduction (``nbytes`` stay
    inside the host): node-aware whatever ``hierarchical``, and HYBRID_SHARD's all-reduce two collectives
    (See [Note: Step-time model]). None: the plain collective, ``nbytes`` on every link.
    """
    if strategy not in ("FULL_SHARD", "HYBRID_SHARD"):
        raise ValueError(f"strategy must be FULL_SHARD or HYBRID_SHARD, got {strategy!r}")
    if hosts < 1 or per_host < 1:
        raise ValueError(f"hosts and per_host must be >= 1, got {hosts} and {per_host}")
    h, g = hosts, per_host
    quantized = cross_nbytes is not None
    cross = cross_nbytes if quantized else nbytes
    beta_e = 1.0 / (links.inter_rate * links.eff_inter)
    intra = (g - 1) * links.alpha_intra + (g - 1) / g * nbytes / links.bw_intra if g > 1 else 0.0
    call = links.call_inter if h > 1 else 0.0
    if strategy == "HYBRID_SHARD" or h == 1:
        calls = 2 if quantized else 1  # quantized: an all-to-all, then an all-gather of the sums
        ar = calls * call + 2 * (h - 1) * links.alpha_inter + 2 * (h - 1) / h * cross * beta_e if h > 1 else 0.0
        return intra, (ar if strategy == "HYBRID_SHARD" else 0.0)
    wire = (h - 1) / h * cross * beta_e
    if hierarchical or quantized:
        return call + (h - 1) * links.alpha_inter + wire + intra, 0.0
    return call + (h * g - 1) * links.alpha_inter + _flat_excess(links, h, g) * wire, 0.0


def wire_bound(shape, strategy, hosts, links_or_rate):
    """Least bytes one host sends per step over the nominal link rate (``bench train``'s definition), seconds.

    The bytes are ``wire_min_bytes`` of the root gathered once and the blocks twice (the last once with
    ``keep_last``), at the shape's cross-host bytes per element (quantized or not).
    """
    rate = links_or_rate.inter_rate if isinstance(links_or_rate, Links) else float(links_or_rate)
    if hosts <= 1:
        return 0.0
    if strategy not in ("FULL_SHARD", "HYBRID_SHARD"):
        raise ValueError(f"strategy must be FULL_SHARD or HYBRID_SHARD, got {strategy!r}")
    once = shape.numels[0] + (shape.numels[-1] if shape.keep_last and len(shape.numels) > 1 else 0)
    return wire_min_bytes(strategy, hosts, once, shape.params - once, shape.param_wire_bytes,
                          shape.grad_wire_bytes) / rate


def host_link_bytes(shape, strategy, hosts, per_host, links, hierarchical=True):
    """Bytes one host sends per step: the wire minimum, times ``flat_excess`` for flat FULL_SHARD collectives
    (but for a quantized gradient reduction's hop, node-aware whatever the collectives)."""
    least = wire_bound(shape, strategy, hosts, 1.0)
    if strategy != "FULL_SHARD" or hierarchical or hosts <= 1:
        return least
    excess = _flat_excess(links, hosts, per_host)
    if shape.quantize_grads == "none":
        return least * excess
    grads = (hosts - 1) / hosts * shape.params * shape.grad_wire_bytes
    return (least - grads) * excess + grads


def simulate(fwd, bwd, ag, rs, ar, opt=0.0, overlap=True, keep_last=False):
    """Step time of one schedule (see [Note: Step-time model]); lists are per unit in forward order, unit 0 the root
    (``keep_last``: the last unit is not gathered again for backward).

    Returns (step seconds, compute seconds, comm seconds).
    """
    n = len(fwd)
    if not (len(bwd) == len(ag) == len(rs) == len(ar) == n) or n == 0:
        raise ValueError("fwd, bwd, ag, rs, ar must be non-empty lists of equal length")
    compute = sum(fwd) + sum(bwd) + opt
    keep_last = keep_last and n > 1
    comm_total = sum(ag) + sum(ag[1:]) - (ag[-1] if keep_last else 0.0) + sum(rs) + sum(ar)
    if not overlap:
        return compute + comm_total, compute, comm_total
    chan = 0.0  # when the comm channel is free

    def issue(at, dur):
        nonlocal chan
        chan = max(chan, at) + dur
        return chan

    ready = [0.0] * n
    t = ready[0] = issue(0.0, ag[0])  # the root's gather; its embedding lookup costs nothing here
    if n > 1:
        ready[1] = issue(t, ag[1])
    for i in range(1, n):  # forward of the blocks; each start issues the next block's gather
        start = max(t, ready[i])
        if i + 1 < n:
            ready[i + 1] = issue(start, ag[i + 1])
        t = start + fwd[i]
    t += fwd[0]  # the root's head (its parameters stay gathered)
    if n > 1:  # the last block's re-gather overlaps the head's backward (none if it kept its parameters)
        ready[n - 1] = t if keep_last else issue(t, ag[n - 1])
    t += bwd[0]
    last = t
    for i in range(n - 1, 0, -1):  # backward of the blocks in reverse
        start = max(t, ready[i])
        if i - 1 >= 1:
            ready[i - 1] = issue(start, ag[i - 1])
        t = start + bwd[i]
        last = issue(t, rs[i] + ar[i])
    last = issue(t, rs[0] + ar[0])  # the root's gradients are complete after the embedding's backward
    end = max(t, last) + opt
    return end, compute, comm_total


def predict_step(shape, strategy, hosts, per_host, links, compute_s, hierarchical=True, overlap=True,
                 opt_frac=0.0):
    """Predicted step seconds of ``shape`` given the step's compute seconds (e.g. a compute-only run)."""
    total_flops = sum(shape.flops)
    if links.cpu_per_byte:
        sent = host_link_bytes(shape, strategy, hosts, per_host, links, hierarchical)
        compute_s = compute_s + links.cpu_per_byte * sent * (hosts if links.cpu_scope == "machine" else 1)
    work = compute_s * (1 - opt_frac)
    fwd = [work / 3 * f / total_flops for f in shape.flops]
    bwd = [2 * x for x in fwd]
    ag, rs, ar = [], [], []
    quantized_grads = shape.quantize_grads != "none"
    for numel in shape.numels:
        a, _ = collective_times(numel * shape.param_wire_bytes, strategy, hosts, per_host, links, hierarchical)
        r, x = collective_times(numel * shape.grad_bytes, strategy, hosts, per_host, links, hierarchical,
                                cross_nbytes=numel * shape.grad_wire_bytes if quantized_grads else None)
        ag.append(a)
        rs.append(r)
        ar.append(x)
    return simulate(fwd, bwd, ag, rs, ar, opt=compute_s * opt_frac, overlap=overlap, keep_last=shape.keep_last)[0]


FITTABLE = ("alpha_inter", "eff_inter", "alpha_intra", "bw_intra", "cpu_per_byte", "call_inter")
_FIT_START = {"cpu_per_byte": 1e-12, "call_inter": 1e-4}  # where a parameter that is 0 starts (log space)


def fit(runs, shape, base, params=("alpha_inter", "eff_inter"), hierarchical=False, rounds=60):
    """Fit ``params`` of ``base`` (a Links) to runs: dicts with strategy, hosts, per_host, rate (bytes/s),
    compute_s, step_s. Minimises the sum of squared relative errors with a Nelder-Mead simplex over logarithms.

    Returns (fitted Links, list of relative errors: predicted / measured - 1).
    """
    if not runs:
        raise ValueError("fit needs at least one run")
    for p in params:
        if p not in FITTABLE:
            raise ValueError(f"cannot fit {p!r}: expected one of {', '.join(FITTABLE)}")

    def errors(links):
        out = []
        for r in runs:
            lk = dataclasses.replace(links, inter_rate=r["rate"])
            pred = predict_step(shape, r["strategy"], r["hosts"], r["per_host"], lk, r["compute_s"], hierarchical)
            out.append(pred / r["step_s"] - 1)
        return out

    def loss(links):
        return sum(e * e for e in errors(links))

    start = []
    for p in params:  # log space: every parameter stays positive; start from a value that is never zero
        v = getattr(base, p)
        start.append(math.log(v if v > 0 else _FIT_START.get(p, 1e-6)))

    def at(x):
        links = dataclasses.replace(base)
        for p, v in zip(params, x):
            setattr(links, p, min(math.exp(v), 1.0) if p == "eff_inter" else math.exp(v))
        return links

    best = _nelder_mead(lambda x: loss(at(x)), start, step=math.log(3.0), iters=rounds * 20 * len(params))
    cur = at(best)
    return cur, errors(cur)


def _nelder_mead(f, x0, step, iters, tol=1e-14):
    """Minimise f from x0 (a list) by the Nelder-Mead simplex; returns the best point."""
    n = len(x0)
    pts = [list(x0)] + [[x + (step if j == i else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < tol and max(abs(a - b) for p in pts[1:] for a, b in zip(p, pts[0])) < 1e-9:
            break
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        worst = pts[-1]

        def toward(t):
            return [c + t * (w - c) for c, w in zip(cen, worst)]

        r = toward(-1.0)
        fr = f(r)
        if fr < vals[0]:
            e = toward(-2.0)
            fe = f(e)
            pts[-1], vals[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = r, fr
        else:
            c = toward(0.5)
            fc = f(c)
            if fc < vals[-1]:
                pts[-1], vals[-1] = c, fc
            else:  # shrink toward the best
                pts = [pts[0]] + [[b + 0.5 * (x - b) for b, x in zip(pts[0], p)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[min(range(n + 1), key=vals.__getitem__)]


def memory_per_rank(shape, strategy, world, per_host, tokens_per_rank, n_embd, n_layer, optim_bytes=8,
                    master_bytes=4, grad_state_bytes=4, act_bytes_per_token_layer=None, prefetch=1):
    """Bytes per rank: sharded master weights + grads + optimizer state, gathered units, activations.

    Sharded state: (master + gradient + optimizer) bytes per parameter (fp32 master and gradient, AdamW's two fp32
    moments by default: 16 bytes) over the shard group (N for FULL_SHARD, the
    G ranks of a host for HYBRID_SHARD). Gathered: the largest unit's parameters and gradients, (1 + prefetch)
    units at once. Activations kept for backward: ``act_bytes_per_token_layer`` (default 34 * n_embd * 2 / 2,
    the 16-bit count of transformer activations per token and layer without recomputation) * tokens * layers.
    """
    if strategy not in ("FULL_SHARD", "HYBRID_SHARD"):
        raise ValueError(f"strategy must be FULL_SHARD or HYBRID_SHARD, got {strategy!r}")
    shard = world if strategy == "FULL_SHARD" else per_host
    state = shape.params * (master_bytes + grad_state_bytes + optim_bytes) / shard
    big = max(shape.numels)
    gathered = (1 + prefetch) * big * shape.param_bytes + big * shape.grad_bytes
    act = (act_bytes_per_token_layer if act_bytes_per_token_layer is not None else 34 * n_embd) \
        * tokens_per_rank * n_layer
    return {"state": state, "gathered": gathered, "activations": act, "total": state + gathered + act}
