"""NCCL collectives of scripts/device_check.sh: every collective FSDP uses, on CUDA tensors, checked against NumPy.

Usage: HPCFSDP_GPU_COMM=nccl python scripts/device_nccl_check.py [--json FILE] [--n N]
       (also under `hpcfsdp launch -n P`: the expected values are computed for any world size)

Two parts, each over bfloat16, float16 and float32:
- hpcfsdp's public API (hpcfsdp.distributed: init_process_group, all_gather_into_tensor, reduce_scatter_tensor with
  SUM and AVG, all_reduce with SUM and AVG, broadcast) on CUDA tensors, whatever backend the product chose: the
  GPU comm path the default group chose (its gpu_comm: path and why) is printed;
- cupy.cuda.nccl itself on a communicator of this process alone (size 1): allGather, reduceScatter, allReduce and
  broadcast with NCCL_SUM and NCCL_AVG on a stream, so a result says whether NCCL works on this machine apart from
  the product's use of it. NCCL cannot put two ranks on one GPU; on one GPU this is the world size NCCL can run.
  On the simulated device (no NCCL) this part reports "not available" and is not counted as a failure.
Each rank contributes values that depend on its rank (small multiples of 1/4, exact in every dtype), so a
collective that loses, repeats or misorders a rank's piece fails. Prints one JSON object; exit status 1 when a
check fails.
"""
import argparse
import json
import os
import sys

import numpy as np

os.environ.setdefault("HPCFSDP_GPU_COMM", "nccl")

DTYPES = ("bfloat16", "float16", "float32")
TOL = {"bfloat16": 1 / 64, "float16": 1 / 512, "float32": 1e-6}


def _values(rank, n, seed):
    """This rank's input: multiples of 1/4 in [-4, 4], exact in bf16/fp16 and in their sums over a few ranks."""
    return (np.random.default_rng(seed + 7919 * rank).integers(-16, 17, n) / 4.0).astype(np.float32)


def _close(got, want, dtype):
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype]))


def check_public_api(n):
    import hpcfsdp as hp
    import hpcfsdp.distributed as dist

    from hpcfsdp.cli._common import compute_device

    device = compute_device("cuda")  # cuda:<node-local rank>, made the current device as a training script does
    hp.cuda.set_device(device)
    dist.init_process_group(device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for dname in DTYPES:
        dt = getattr(hp, dname)
        mine = _values(rank, world * n, 1)
        every = np.stack([_values(r, world * n, 1) for r in range(world)])       # (world, world * n)

        def t(arr):
            return hp.tensor(arr, device=device, dtype=dt)

        def host(x):
            return x.float().cpu().numpy()

        def run(name, fn, want):
            try:
                got = fn()
                results[f"{name}/{dname}"] = "ok" if _close(got, want, dname) else "wrong result"
            except Exception as e:  # noqa: BLE001  (the failure is the finding)
                results[f"{name}/{dname}"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]

        piece = mine[:n]

        def all_gather():
            out = t(np.zeros(world * n, np.float32))
            dist.all_gather_into_tensor(out, t(piece))
            return host(out)

        run("all_gather", all_gather, every[:, :n].reshape(-1))
        for op in ("SUM", "AVG"):
            red = every.sum(axis=0) / (world if op == "AVG" else 1)

            def reduce_scatter(op=op):
                out = t(np.zeros(n, np.float32))
                dist.reduce_scatter_tensor(out, t(mine), op=getattr(dist.ReduceOp, op))
                return host(out)

            def all_reduce(op=op):
                x = t(mine)
                dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
                return host(x)

            run(f"reduce_scatter_{op.lower()}", reduce_scatter, red[rank * n:(rank + 1) * n])
            run(f"all_reduce_{op.lower()}", all_reduce, red)

        def broadcast():
            x = t(mine)
            dist.broadcast(x, src=0)
            return host(x)

        run("broadcast", broadcast, every[0])
        hp.cuda.synchronize()
    chosen = getattr(dist.group.WORLD, "gpu_comm", None)  # (path, why) the group chose at its first device collective
    dist.destroy_process_group()
    return rank, world, device, results, chosen


def gpu_comm_path(chosen):
    """(path, where it was read): the default group's choice, else what `hpcfsdp info` says auto picks, else the
    setting."""
    if chosen:
        return f"{chosen[0]} ({chosen[1]})", "the process group"
    try:
        from hpcfsdp.distributed import _nccl

        return _nccl.auto_choice_text(), "hpcfsdp info"
    except (ImportError, AttributeError):
        return os.environ.get("HPCFSDP_GPU_COMM"), "HPCFSDP_GPU_COMM"


def check_raw_nccl(n):
    """cupy.cuda.nccl on a communicator of this process alone."""
    import cupy
    import ml_dtypes

    try:
        from cupy.cuda import nccl
    except Exception as e:  # noqa: BLE001
        return {"available": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}, {}
    info = {"available": True, "version": nccl.get_version()}
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    stream = cupy.cuda.Stream(non_blocking=True)
    kinds = {"bfloat16": (ml_dtypes.bfloat16, nccl.NCCL_BFLOAT16), "float16": (np.float16, nccl.NCCL_FLOAT16),
             "float32": (np.float32, nccl.NCCL_FLOAT32)}
    ops = {"SUM": nccl.NCCL_SUM, "AVG": nccl.NCCL_AVG}
    results = {}
    for dname, (dt, nt) in kinds.items():
        x = _values(0, n, 2)
        src = cupy.asarray(x).astype(dt)

        def run(name, fn, want):
            try:
                out = fn()
                stream.synchronize()
                results[f"{name}/{dname}"] = "ok" if _close(out.astype(np.float32).get(), want, dname) else \
                    "wrong result"
            except Exception as e:  # noqa: BLE001
                results[f"{name}/{dname}"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]

        def collective(kind, op=None):
            out = cupy.zeros(n, dtype=dt)
            cupy.cuda.Device().synchronize()  # the inputs were written on the default stream
            if kind == "allGather":
                comm.allGather(src.data.ptr, out.data.ptr, n, nt, stream.ptr)
            elif kind == "reduceScatter":
                comm.reduceScatter(src.data.ptr, out.data.ptr, n, nt, ops[op], stream.ptr)
            elif kind == "allReduce":
                comm.allReduce(src.data.ptr, out.data.ptr, n, nt, ops[op], stream.ptr)
            else:
                comm.broadcast(src.data.ptr, out.data.ptr, n, nt, 0, stream.ptr)
            return out

        run("allGather", lambda: collective("allGather"), x)
        for op in ops:
            run(f"reduceScatter_{op.lower()}", lambda op=op: collective("reduceScatter", op), x)
            run(f"allReduce_{op.lower()}", lambda op=op: collective("allReduce", op), x)
        run("broadcast", lambda: collective("broadcast"), x)
    comm.destroy()
    return info, results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4099, help="elements per rank (odd: no alignment luck)")
    ap.add_argument("--json", default=None, help="also write the JSON here (rank 0)")
    a = ap.parse_args(argv)
    rank, world, device, api, chosen = check_public_api(a.n)
    path, source = gpu_comm_path(chosen)
    from hpcfsdp import _backend

    simulated = _backend.cuda_simulated()
    raw_info, raw = check_raw_nccl(a.n) if rank == 0 else ({}, {})
    failed = sorted(k for k, v in api.items() if v != "ok") + sorted(f"nccl {k}" for k, v in raw.items() if v != "ok")
    if rank == 0 and not raw_info.get("available") and not simulated:
        failed.append("nccl: cupy.cuda.nccl is not available")
    res = {"world_size": world, "device": device, "simulated_device": simulated, "gpu_comm": path,
           "gpu_comm_source": source, "elements": a.n, "api": api, "raw_nccl": raw_info, "raw": raw,
           "passed": sum(v == "ok" for v in api.values()) + sum(v == "ok" for v in raw.values()),
           "failed": failed}
    if rank == 0:
        print(f"GPU comm path: {path} (from {source}); world size {world}; {res['passed']} checks passed, "
              f"{len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""), flush=True)
        text = json.dumps(res, indent=2)
        print(text, flush=True)
        if a.json:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
