"""Preflight of scripts/device_check.sh: versions, the GPU, NCCL, bf16 coverage, pinned copy GB/s, bf16 GEMM TFLOP/s.

Usage: python scripts/device_preflight.py [--sim] [--json FILE]
Prints one JSON object (and writes it to FILE). --sim: tiny sizes, for the simulated device (HPCFSDP_CUDA_SIM=1).
Exit status 1 when there is no usable GPU, a bf16 op of the engine fails, or the bf16 GEMM fails; on a real GPU
also when cupy.cuda.nccl is not available (the engine's first choice of GPU collectives).

bf16 coverage has two parts: what the product says (hpcfsdp.cuda.is_bf16_supported(), and each array op of its
probe, hpcfsdp._backend._BF16_PROBES, run one by one), and this script's own run of the ops a GPT training step calls (linear, matmul, layer_norm, gelu,
softmax, log_softmax, scaled_dot_product_attention, cross_entropy, embedding, AdamW, clip_grad_norm_), forward and
backward on bfloat16 CUDA tensors, each against the same op in float32 on the CPU (bf16 tolerances).
"""
import argparse
import importlib.metadata as md
import json
import os
import platform
import sys
import time
import traceback

import numpy as np

SHAPES = {"gpt-medium": [(8 * 1024, 1024, 4096), (8 * 1024, 4096, 1024)],   # (M, K, N): x @ W, the MLP's GEMMs
          "gpt-large": [(8 * 1024, 1280, 5120), (8 * 1024, 5120, 1280)]}
SIM_SHAPES = {"gpt-medium": [(64, 32, 128)], "gpt-large": [(64, 64, 256)]}


def _version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _err(e):
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def versions():
    import cupy

    out = {"python": platform.python_version(), "numpy": np.__version__, "cupy": cupy.__version__,
           "ml_dtypes": _version("ml_dtypes"), "mpi4py": _version("mpi4py"), "torch": _version("torch"),
           "nvidia-nccl": _version("nvidia-nccl-cu13") or _version("nvidia-nccl-cu12")}
    import hpcfsdp

    out["hpcfsdp"] = getattr(hpcfsdp, "__version__", None)
    rt = cupy.cuda.runtime
    out["cuda_runtime"], out["cuda_driver"] = rt.runtimeGetVersion(), rt.driverGetVersion()
    return out


def gpu():
    import cupy

    rt = cupy.cuda.runtime
    n = rt.getDeviceCount()
    if n == 0:
        raise RuntimeError("CuPy sees no GPU")
    p = rt.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    free, total = rt.memGetInfo()
    return {"count": n, "name": name, "capability": f"{p.get('major', '?')}.{p.get('minor', '?')}",
            "multiprocessors": p.get("multiProcessorCount"), "memory_total_bytes": int(p.get("totalGlobalMem", total)),
            "memory_free_bytes": int(free)}


def nccl():
    try:
        from cupy.cuda import nccl as nc
    except Exception as e:  # noqa: BLE001  (any failure to load is the finding)
        return {"available": False, "error": _err(e)}
    res = {"available": bool(getattr(nc, "available", True))}
    try:
        v = nc.get_version()
        res["version"] = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else str(v)
        res["build_version"] = nc.get_build_version()
    except Exception as e:  # noqa: BLE001
        res.update(available=False, error=_err(e))
    return res


def comm_info():
    """What hpcfsdp's MPI probe found, and the GPU comm path auto would pick (as `hpcfsdp info` says it)."""
    from hpcfsdp.distributed import _mpi

    info = _mpi.probe()
    keys = ("vendor", "version", "mpi4py_version", "cuda_aware", "cuda_aware_source", "bfloat16_type", "libmpi")
    res = {k: info.get(k) for k in keys}
    try:
        from hpcfsdp.distributed import _nccl

        res["gpu_comm"], res["gpu_comm_source"] = _nccl.auto_choice_text(), "hpcfsdp info"
        res["nccl_status"] = _nccl.nccl_status()[1]
    except (ImportError, AttributeError):
        res["gpu_comm"], res["gpu_comm_source"] = os.environ.get("HPCFSDP_GPU_COMM", "auto"), "HPCFSDP_GPU_COMM"
    return res


# -- bf16 coverage ---------------------------------------------------------------------------------------------------
def _product_bf16():
    """hpcfsdp's own answer: is_bf16_supported() both ways, _backend.cupy_bfloat16() (ok, the first op that fails),
    and each of the product's probes (_backend._BF16_PROBES: the array ops the engine calls) run one by one, so that
    every failing op is named, not only the first."""
    import hpcfsdp as hp
    from hpcfsdp import _backend

    res = {"is_bf16_supported": hp.cuda.is_bf16_supported(),
           "is_bf16_supported_hw": hp.cuda.is_bf16_supported(including_emulation=False),
           "cupy_bfloat16": list(_backend.cupy_bfloat16())}
    probes = getattr(_backend, "_BF16_PROBES", None)
    if probes:
        import cupy

        ha, hb = np.array([0.5, 2.0], np.float32), np.array([1.5, 0.25], np.float32)
        per_op = {}
        for name, f in probes:
            try:
                a, b = cupy.asarray(ha.astype(_backend.bfloat16)), cupy.asarray(hb.astype(_backend.bfloat16))
                got = cupy.asnumpy(f(cupy, a, b)).astype(np.float32)
                want = np.asarray(f(np, ha, hb)).astype(np.float32)
                per_op[name] = "ok" if np.allclose(got, want, rtol=2e-2, atol=1e-2) else "wrong result"
            except Exception as e:  # noqa: BLE001  (the failure is the finding)
                per_op[name] = _err(e)
        res["per_op"] = per_op
        res["per_op_failed"] = sorted(k for k, v in per_op.items() if v != "ok")
    return res


def _engine_ops():
    """name -> (fn on tensors, input arrays): the ops of a GPT training step."""
    from hpcfsdp.nn import functional as F

    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 8, 16)).astype(np.float32)
    w = (0.2 * rng.standard_normal((24, 16))).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    q = rng.standard_normal((2, 2, 8, 8)).astype(np.float32)
    emb = rng.standard_normal((32, 16)).astype(np.float32)
    idx = rng.integers(0, 32, (2, 8))
    tgt = rng.integers(0, 16, 16)
    return {
        "linear": (lambda x, w_, b_: F.linear(x, w_, b_), (a, w, bias)),
        "matmul": (lambda x, w_: x @ w_.T, (a, w)),
        "layer_norm": (lambda x, w_: F.layer_norm(x, (16,), w_[0], w_[1, :16]), (a, w[:2, :16].copy())),
        "gelu": (lambda x: F.gelu(x), (a,)),
        "softmax": (lambda x: F.softmax(x, dim=-1), (a,)),
        "log_softmax": (lambda x: F.log_softmax(x, dim=-1), (a,)),
        "sdpa_causal": (lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True), (q,)),
        "cross_entropy": (lambda x, t: F.cross_entropy(x.reshape(-1, 16), t), (a, tgt)),
        "embedding": (lambda i, e: F.embedding(i, e), (idx, emb)),
    }


def _run_op(fn, arrays, device, dtype):
    import hpcfsdp as hp

    ts = []
    for arr in arrays:
        if arr.dtype.kind == "f":
            ts.append(hp.tensor(arr, device=device, dtype=dtype, requires_grad=True))
        else:
            ts.append(hp.tensor(arr, device=device))
    out = fn(*ts)
    (out.float().sum() if out.ndim else out.float()).backward()
    grads = [t.grad.float().cpu().numpy() for t in ts if t.requires_grad]
    return out.float().detach().cpu().numpy(), grads


def _close(x, y, scale):
    return bool(np.all(np.isfinite(x))) and float(np.max(np.abs(x - y), initial=0.0)) <= 0.05 * max(1.0, scale)


def _optim_ops(device):
    """AdamW step and clip_grad_norm_ on a bf16 parameter against float32 on the CPU."""
    import hpcfsdp as hp

    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(64).astype(np.float32)
    g0 = rng.standard_normal(64).astype(np.float32)
    res = {}
    for name in ("adamw_step", "clip_grad_norm_"):
        outs = []
        for dev, dt in ((device, hp.bfloat16), ("cpu", hp.float32)):
            p = hp.nn.Parameter(hp.tensor(p0, device=dev, dtype=dt))
            p.grad = hp.tensor(g0, device=dev, dtype=dt)
            if name == "adamw_step":
                opt = hp.optim.AdamW([p], lr=1e-1, weight_decay=0.1)
                opt.step()
                opt.step()
                outs.append(p.detach().float().cpu().numpy())
            else:
                norm = hp.nn.utils.clip_grad_norm_([p], 1.0)
                outs.append(np.concatenate([p.grad.float().cpu().numpy(), [float(norm)]]))
        res[name] = (outs[0], outs[1])
    return res


def bf16_coverage(device="cuda"):
    import hpcfsdp as hp

    res = {"product": _product_bf16(), "ops": {}}
    for name, (fn, arrays) in _engine_ops().items():
        try:
            (o16, g16), (o32, g32) = _run_op(fn, arrays, device, hp.bfloat16), _run_op(fn, arrays, "cpu", hp.float32)
            scale = float(np.max(np.abs(o32), initial=1.0))
            ok = _close(o16, o32, scale) and all(_close(x, y, float(np.max(np.abs(y), initial=1.0)))
                                                 for x, y in zip(g16, g32))
            res["ops"][name] = "ok" if ok else "wrong result"
        except Exception as e:  # noqa: BLE001  (the failure is the finding)
            res["ops"][name] = _err(e)
    try:
        for name, (x, y) in _optim_ops(device).items():
            res["ops"][name] = "ok" if _close(x, y, float(np.max(np.abs(y), initial=1.0))) else "wrong result"
    except Exception as e:  # noqa: BLE001
        res["ops"]["optim"] = _err(e)
    res["failed"] = sorted(k for k, v in res["ops"].items() if v != "ok") + \
        [f"array {k}" for k in res["product"].get("per_op_failed", [])]
    return res


# -- bandwidth and GEMM ----------------------------------------------------------------------------------------------
def _time_ms(fn, reps, stream):
    import cupy

    times = []
    for _ in range(reps):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        fn()
        e1.record(stream)
        e1.synchronize()
        times.append(cupy.cuda.get_elapsed_time(e0, e1))
    return times


def pinned_copy(nbytes, reps):
    import cupy
    import cupyx

    host = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
    host[...] = 1
    dev = cupy.empty((nbytes,), dtype=np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        dev.set(host, stream=stream)  # warm-up
        stream.synchronize()
        h2d = _time_ms(lambda: dev.set(host, stream=stream), reps, stream)
        d2h = _time_ms(lambda: dev.get(stream=stream, out=host), reps, stream)
    gbps = lambda ms: nbytes / (ms * 1e-3) / 1e9  # noqa: E731
    return {"bytes": nbytes, "reps": reps, "h2d_GBps": gbps(min(h2d)), "d2h_GBps": gbps(min(d2h)),
            "h2d_GBps_median": gbps(float(np.median(h2d))), "d2h_GBps_median": gbps(float(np.median(d2h)))}


def gemm(shapes, reps):
    import cupy
    import ml_dtypes

    out = {}
    for model, mkns in shapes.items():
        for m, k, n in mkns:
            for dname, dt in (("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)):
                key = f"{model} {m}x{k} @ {k}x{n} {dname}"
                try:
                    a = cupy.random.standard_normal((m, k), dtype=np.float32).astype(dt)
                    b = cupy.random.standard_normal((k, n), dtype=np.float32).astype(dt)
                    c = cupy.matmul(a, b)  # warm-up (and the result's check below)
                    ref = cupy.matmul(a[:4].astype(np.float32), b.astype(np.float32))
                    err = float(cupy.max(cupy.abs(c[:4].astype(np.float32) - ref)))
                    stream = cupy.cuda.get_current_stream()
                    ms = _time_ms(lambda: cupy.matmul(a, b, out=c), reps, stream)
                    best = min(ms)
                    out[key] = {"tflops": 2 * m * k * n / (best * 1e-3) / 1e12, "ms": best,
                                "max_abs_err_vs_fp32": err, "ok": err <= 0.05 * (k ** 0.5) + 0.5}
                except Exception as e:  # noqa: BLE001  (e.g. a CuPy without bf16 GEMMs: the reason is the finding)
                    out[key] = {"tflops": None, "ok": False, "error": _err(e)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", action="store_true", help="tiny sizes (the simulated device)")
    ap.add_argument("--json", default=None, help="also write the JSON here")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    res, problems = {"sim": a.sim}, []
    parts = [("versions", versions), ("gpu", gpu), ("nccl", nccl), ("comm", comm_info), ("bf16", bf16_coverage),
             ("pinned_copy", lambda: pinned_copy(8 << 20 if a.sim else 256 << 20, 2 if a.sim else 5)),
             ("gemm", lambda: gemm(SIM_SHAPES if a.sim else SHAPES, 2 if a.sim else 10))]
    for name, fn in parts:
        t = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001  (report every part; a failed one is named below)
            res[name] = {"error": _err(e), "traceback": traceback.format_exc()[-2000:]}
            problems.append(f"{name}: {_err(e)}")
        res.setdefault("seconds", {})[name] = round(time.perf_counter() - t, 3)
    from hpcfsdp import _backend

    simulated = _backend.cuda_simulated()
    res["simulated_device"] = simulated
    if res["bf16"].get("failed"):
        problems.append(f"bf16 ops failed: {', '.join(res['bf16']['failed'])}")
    bad_gemm = [k for k, v in res.get("gemm", {}).items() if isinstance(v, dict) and "bf16" in k and not v.get("ok")]
    if bad_gemm:
        problems.append(f"bf16 GEMM failed: {', '.join(bad_gemm)}")
    if not simulated and not res["nccl"].get("available"):
        problems.append(f"cupy.cuda.nccl is not available ({res['nccl'].get('error', '')})")
    res["problems"] = problems
    res["seconds"]["total"] = round(time.perf_counter() - t0, 3)
    text = json.dumps(res, indent=2, default=str)
    print(text, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    for p in problems:
        print(f"device_preflight: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
