#!/usr/bin/env bash
# GPU checks in one run (fits a 10-minute window on one GPU): the `gpu` test marker (serial and at
# 2 ranks sharing the GPU), then the GPU benchmarks. Results land in $OUT (default ./device-results).
# Usage (from the repository root, on a machine with CuPy and mpi4py): bash scripts/device_check.sh
set -uo pipefail
OUT=${OUT:-device-results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 HPCFSDP_PROGRESS=0
$PY -m pip install -q -e . --no-deps 2>&1 | tail -1
$PY -m pip install -q ml_dtypes safetensors tqdm pytest pytest-mpi pytest-timeout hypothesis 2>&1 | tail -1
{
  $PY -m hpcfsdp.cli.main info --json
  echo "== gpu tests (serial)"
  timeout 240 $PY -m pytest -q -m "gpu and not mpi" tests 2>&1 | tail -15
  echo "== gpu tests (2 ranks, staged and direct paths)"
  for aware in 0 1; do
    HPCFSDP_CUDA_AWARE=$aware timeout 180 $PY -m hpcfsdp.cli.main launch -n 2 -- \
      $PY tests/_mpi_pytest.py --with-mpi -q -m "gpu and mpi" tests 2>&1 | tail -5
  done
  echo "== bench comm (2 ranks on one GPU, staged)"
  HPCFSDP_CUDA_AWARE=0 timeout 120 $PY -m hpcfsdp.cli.main launch -n 2 -- hpcfsdp bench comm --device cuda \
    --min-bytes 1MiB --max-bytes 256MiB --iters 10 --json "$OUT/bench_comm_cuda.jsonl" 2>&1 | tail -12
  echo "== bench train (1 rank, unsharded vs FULL_SHARD; fp32 and bf16)"
  for mp in none bf16; do
    timeout 90 $PY -m hpcfsdp.cli.main bench train --device cuda --strategy none --mixed-precision $mp \
      --warmup 2 --steps 5 --json "$OUT/bench_train_cuda.jsonl" 2>&1 | tail -2
    timeout 90 $PY -m hpcfsdp.cli.main launch -n 1 -- hpcfsdp bench train --device cuda --strategy FULL_SHARD \
      --mixed-precision $mp --warmup 2 --steps 5 --json "$OUT/bench_train_cuda.jsonl" 2>&1 | tail -2
  done
} 2>&1 | tee "$OUT/device_check.log"
