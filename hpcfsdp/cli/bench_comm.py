"""`hpcfsdp bench comm`: OSU-style sweep of all-gather / reduce-scatter / all-reduce, hpcfsdp vs raw mpi4py."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

__all__ = ["add_parser", "bench_comm", "bench_small_overhead", "bus_factor", "sizes"]

# [Note: Bandwidth definitions]
# As nccl-tests: ``size`` is the full buffer in bytes (the all-gather output, the reduce-scatter
# input, the all-reduce buffer); algbw = size / time; busbw = algbw * (n-1)/n for all-gather and
# reduce-scatter and algbw * 2(n-1)/n for all-reduce, the bytes each rank's link must carry, so
# busbw compares across rank counts and against the hardware's peak. Time per size is OSU-style:
# each rank averages its iterations (a barrier before each, outside the timing), and we report
# the min / avg / max of those averages over ranks; bandwidths use the max (the slowest rank).
# hpcfsdp and raw mpi4py alternate iteration by iteration on identical buffers (raw on its own
# duplicated communicator, from the main thread), so drift and noise hit both alike.

OPS = ("all_gather", "reduce_scatter", "all_reduce")


def bus_factor(op: str, n: int) -> float:
    if n <= 1:
        return 1.0
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min_bytes to max_bytes (inclusive)."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise ValueError(f"--min-bytes {min_bytes} / --max-bytes {max_bytes}: expected 0 < min <= max")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out


def _parse_bytes(text: str) -> int:
    t = str(text).strip().upper().replace("IB", "").replace("B", "")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a byte count like 1024, 1K, 16M, 1G") from None


def _parse_ops(text: str) -> str:
    bad = [o for o in str(text).split(",") if o.strip() and o.strip() not in OPS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown collective(s) {', '.join(bad)}; expected a subset of {','.join(OPS)}")
    return text


def add_parser(subparsers):
    p = subparsers.add_parser(
        "comm",
        help="sweep collectives (all-gather, reduce-scatter, all-reduce) against raw mpi4py",
        description="OSU-style sweep of the collectives FSDP uses, through hpcfsdp's process group and through "
        "raw mpi4py calls on the same buffers, interleaved. Reports time (min/avg/max over ranks), algbw and "
        "busbw (nccl-tests definitions) and the hpcfsdp/raw busbw ratio. Run under MPI.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--min-bytes", type=_parse_bytes, default=1 << 10)
    p.add_argument("--max-bytes", type=_parse_bytes, default=256 << 20)
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size and implementation")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations per size and implementation")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16", "int64"])
    p.add_argument("--ops", type=_parse_ops, default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--no-raw", action="store_true", help="skip the raw mpi4py comparison")
    p.add_argument("--json", default=None, help="write the rows as JSON lines to this file ('-' = stdout)")
    p.add_argument("--small-overhead", action="store_true",
                   help="instead of the sweep: per-call overhead over raw mpi4py of blocking all_reduce and "
                   "all_gather from --min-bytes to 64 KiB (median of interleaved per-call differences)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    if args.small_overhead:
        return _run_small(args)
    rows = bench_comm(min_bytes=args.min_bytes, max_bytes=args.max_bytes, iters=args.iters, warmup=args.warmup,
                      dtype=args.dtype, ops=args.ops, device=args.device, raw=not args.no_raw)
    from hpcfsdp.distributed._mpi import get_mpi

    if get_mpi().COMM_WORLD.Get_rank() == 0:
        if args.json:
            text = "".join(json.dumps(r) + "\n" for r in rows)
            if args.json == "-":
                sys.stdout.write(text)
            else:
                with open(args.json, "a") as f:
                    f.write(text)
        if args.json != "-":
            print(format_table(rows))
    return 0


def _xp(device: str):
    if device == "cuda":
        from hpcfsdp import _backend

        return _backend._need_cupy()
    return np


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def bench_comm(*, min_bytes=1 << 10, max_bytes=256 << 20, iters=20, warmup=3, dtype="float32",
               ops=",".join(OPS), device="cpu", raw=True, comm=None) -> list[dict]:
    """Run the sweep (collective over ``comm``, default COMM_WORLD); every rank returns the same rows."""
    from hpcfsdp.distributed import _buffers as B
    from hpcfsdp.distributed._mpi import cuda_aware, get_mpi
    from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp

    MPI = get_mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    op_list = [o.strip() for o in ops.split(",") if o.strip()] if isinstance(ops, str) else list(ops)
    for o in op_list:
        if o not in OPS:
            raise ValueError(f"--ops: unknown collective {o!r}; expected a subset of {OPS}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"--iters {iters} / --warmup {warmup}: expected iters >= 1 and warmup >= 0")
    dt = _dtype(dtype)
    xp = _xp(device)
    pg = ProcessGroup(comm, name="bench")
    rawc = comm.Dup()
    n = pg.size()
    raw_ok = raw and (device == "cpu" or cuda_aware()[0])
    rows = []
    try:
        for op in op_list:
            mpi_type, work = B.reduce_plan(dt) if op != "all_gather" else (MPI.BYTE, None)
            raw_this = raw_ok and work is None  # raw MPI has no datatype for it: hpcfsdp converts
            for size in sizes(min_bytes, max_bytes):
                count = max(n, (size // dt.itemsize) // n * n)  # elements of the full buffer, divisible by n
                full = xp.ones(count, dt)
                part = xp.ones(count // n, dt)

                def hp_call():
                    if op == "all_gather":
                        pg.all_gather_into(full, part)
                    elif op == "reduce_scatter":
                        pg.reduce_scatter_into(part, full, ReduceOp.SUM)
                    else:
                        pg.all_reduce_(full, ReduceOp.SUM)

                def raw_call():
                    if op == "all_gather":
                        rawc.Allgather(B.byte_spec(part), B.byte_spec(full))
                    elif op == "reduce_scatter":
                        rawc.Reduce_scatter_block([full, mpi_type], [part, mpi_type], MPI.SUM)
                    else:
                        rawc.Allreduce(MPI.IN_PLACE, [full, mpi_type], MPI.SUM)

                impls = {"hpcfsdp": hp_call}
                if raw_this:
                    impls["mpi4py"] = raw_call
                times = {k: [] for k in impls}
                for _ in range(warmup):
                    for f in impls.values():
                        f()
                names = list(impls)
                for it in range(iters):
                    order = names if it % 2 == 0 else names[::-1]
                    for k in order:
                        rawc.Barrier()
                        t0 = time.perf_counter()
                        impls[k]()
                        if device == "cuda":
                            xp.cuda.get_current_stream().synchronize()
                        times[k].append(time.perf_counter() - t0)
                row = {"op": op, "bytes": int(count * dt.itemsize), "count": int(count), "dtype": dt.name,
                       "device": device, "ranks": n}
                for k, ts in times.items():
                    mine = float(np.mean(ts))
                    allr = rawc.allgather(mine)
                    tmax = max(allr)
                    algbw = row["bytes"] / tmax / 1e9 if tmax > 0 else 0.0
                    row[k] = {"time_us_min": min(allr) * 1e6, "time_us_avg": float(np.mean(allr)) * 1e6,
                              "time_us_max": tmax * 1e6, "algbw_GBps": algbw,
                              "busbw_GBps": algbw * bus_factor(op, n)}
                if "mpi4py" in row and row["mpi4py"]["busbw_GBps"] > 0:
                    row["ratio"] = row["hpcfsdp"]["busbw_GBps"] / row["mpi4py"]["busbw_GBps"]
                rows.append(row)
                full = part = None  # free this size's buffers before the next size allocates
    finally:
        rawc.Free()
        pg.destroy()
    return rows


def format_table(rows: list[dict]) -> str:
    head = (f"{'op':<15}{'bytes':>12}{'dtype':>10} | {'hp us(avg)':>11}{'max':>10}{'busbw':>9} | "
            f"{'raw us(avg)':>11}{'max':>10}{'busbw':>9} | {'ratio':>6}")
    lines = [f"# ranks={rows[0]['ranks'] if rows else '?'}; busbw in GB/s (nccl-tests); ratio = hpcfsdp/raw busbw",
             head, "-" * len(head)]
    for r in rows:
        h = r["hpcfsdp"]
        m = r.get("mpi4py")
        raw = f"{m['time_us_avg']:>11.1f}{m['time_us_max']:>10.1f}{m['busbw_GBps']:>9.3f}" if m else f"{'-':>30}"
        ratio = f"{r['ratio']:>6.2f}" if "ratio" in r else f"{'-':>6}"
        lines.append(f"{r['op']:<15}{r['bytes']:>12}{r['dtype']:>10} | {h['time_us_avg']:>11.1f}"
                     f"{h['time_us_max']:>10.1f}{h['busbw_GBps']:>9.3f} | {raw} | {ratio}")
    return "\n".join(lines)


# [Note: Small-call overhead]
# What a small blocking collective costs on top of MPI: per iteration, a barrier, one hpcfsdp
# call, a barrier, the same raw mpi4py call on the same buffers (order alternating), and the
# difference of the two times. The median of those differences per rank (robust against the
# scheduler's hiccups on a shared machine), the max over ranks, is the overhead per call.


def bench_small_overhead(*, min_bytes=1 << 10, max_bytes=64 << 10, iters=400, warmup=20, dtype="float32",
                         ops=("all_reduce", "all_gather"), comm=None) -> list[dict]:
    """Per-call overhead of blocking small collectives over raw mpi4py; every rank returns the same rows."""
    from hpcfsdp.distributed import _buffers as B
    from hpcfsdp.distributed._mpi import get_mpi
    from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp

    MPI = get_mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    if iters < 1 or warmup < 0:
        raise ValueError(f"--iters {iters} / --warmup {warmup}: expected iters >= 1 and warmup >= 0")
    dt = _dtype(dtype)
    pg = ProcessGroup(comm, name="bench")
    rawc = comm.Dup()
    n = pg.size()
    rows = []
    try:
        for op in ops:
            mpi_type, work = B.reduce_plan(dt) if op != "all_gather" else (MPI.BYTE, None)
            if work is not None:
                raise ValueError(f"--dtype {dtype}: no MPI datatype for a raw {op}; pick another dtype")
            for size in sizes(min_bytes, max_bytes):
                count = max(n, (size // dt.itemsize) // n * n)
                full = np.ones(count, dt)
                part = np.ones(count // n, dt)
                if op == "all_gather":
                    def hp_call():
                        pg.all_gather_into(full, part)

                    def raw_call():
                        rawc.Allgather(B.byte_spec(part), B.byte_spec(full))
                else:
                    def hp_call():
                        pg.all_reduce_(full, ReduceOp.SUM)

                    def raw_call():
                        rawc.Allreduce(MPI.IN_PLACE, [full, mpi_type], MPI.SUM)
                for _ in range(warmup):
                    hp_call()
                    raw_call()
                diffs, th, tr = [], [], []
                perf = time.perf_counter
                for it in range(iters):
                    if it % 2 == 0:
                        rawc.Barrier()
                        t0 = perf(); hp_call(); t1 = perf()  # noqa: E702
                        rawc.Barrier()
                        t2 = perf(); raw_call(); t3 = perf()  # noqa: E702
                    else:
                        rawc.Barrier()
                        t2 = perf(); raw_call(); t3 = perf()  # noqa: E702
                        rawc.Barrier()
                        t0 = perf(); hp_call(); t1 = perf()  # noqa: E702
                    th.append(t1 - t0)
                    tr.append(t3 - t2)
                    diffs.append((t1 - t0) - (t3 - t2))
                mine = (float(np.median(diffs)), float(np.median(th)), float(np.median(tr)))
                allr = rawc.allgather(mine)
                rows.append({"op": op, "bytes": int(count * dt.itemsize), "dtype": dt.name, "ranks": n,
                             "iters": iters, "overhead_us": max(a[0] for a in allr) * 1e6,
                             "hpcfsdp_us": max(a[1] for a in allr) * 1e6, "mpi4py_us": max(a[2] for a in allr) * 1e6})
    finally:
        rawc.Free()
        pg.destroy()
    return rows


def _run_small(args) -> int:
    from hpcfsdp.distributed._mpi import get_mpi

    hi = min(args.max_bytes, 64 << 10)
    rows = bench_small_overhead(min_bytes=args.min_bytes, max_bytes=hi, iters=max(args.iters, 1),
                                warmup=args.warmup, dtype=args.dtype)
    if get_mpi().COMM_WORLD.Get_rank() == 0:
        if args.json:
            text = "".join(json.dumps(r) + "\n" for r in rows)
            if args.json == "-":
                sys.stdout.write(text)
            else:
                with open(args.json, "a") as f:
                    f.write(text)
        if args.json != "-":
            print(f"# ranks={rows[0]['ranks'] if rows else '?'}; per-call medians (us), overhead = median of "
                  "interleaved (hpcfsdp - mpi4py), max over ranks")
            print(f"{'op':<12}{'bytes':>8}{'hpcfsdp':>10}{'mpi4py':>10}{'overhead':>10}")
            for r in rows:
                print(f"{r['op']:<12}{r['bytes']:>8}{r['hpcfsdp_us']:>10.1f}{r['mpi4py_us']:>10.1f}"
                      f"{r['overhead_us']:>10.1f}")
            print(f"max overhead: {max(r['overhead_us'] for r in rows):.1f} us")
    return 0
