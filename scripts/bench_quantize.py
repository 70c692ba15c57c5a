"""Quantize / dequantize throughput of the block kernels (hpcfsdp/_kernels/quantize.py) on this machine:
`python scripts/bench_quantize.py [--elements N] [--block B]`; milliseconds per call and GB/s of float32 input."""
import argparse
import time

import numpy as np

from hpcfsdp._kernels import quantize as Q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 22)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    x = np.random.default_rng(0).standard_normal(a.elements).astype(np.float32)
    for kind in Q.KINDS:
        t = time.perf_counter()
        for _ in range(a.repeats):
            p = Q.quantize(x, kind, a.block)
        tq = (time.perf_counter() - t) / a.repeats
        t = time.perf_counter()
        for _ in range(a.repeats):
            Q.dequantize(p, kind, x.size, a.block, np.float32)
        td = (time.perf_counter() - t) / a.repeats
        print(f"{kind}: quantize {tq * 1e3:.1f} ms ({x.nbytes / tq / 1e9:.2f} GB/s), "
              f"dequantize {td * 1e3:.1f} ms ({x.nbytes / td / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    main()
