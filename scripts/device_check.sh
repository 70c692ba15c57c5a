#!/usr/bin/env bash
# GPU checks of hpcfsdp in one run on one H200 (about 5 minutes after warm-up), ending in one summary table.
#
#   1. `hpcfsdp info` (is the MPI CUDA-aware? does CuPy have bfloat16?)
#   2. warm-up: the serial `gpu` tests on real CuPy (CuPy compiles its kernels on a fresh machine and
#      caches them on disk, so every later process starts warm); `gpu_hw` tests run here too
#   3. the `gpu and mpi` tests at 2 ranks sharing the GPU, staged through pinned host memory
#      (HPCFSDP_CUDA_AWARE=0); the CUDA-aware leg (HPCFSDP_CUDA_AWARE=1) only where `hpcfsdp info` says the
#      MPI is CUDA-aware (the PyPI MPICH wheel is not), otherwise the table says it was not run
#   4. GPT training in bf16 on 1 rank, FULL_SHARD, with its MFU, for two pinned configs (below)
#   5. the GPU collective benchmark at 2 ranks (staged) and the host-only MPI all-gather of the same bytes
#
# MFU = FLOPs / (step time x 989e12), FLOPs per step = tokens x (6 x params + 12 x n_layer x n_embd x block_size)
# (the matmul FLOPs of forward+backward plus the attention-score term; 989 TFLOP/s = dense bf16 peak of an
# H200 SXM, as `hpcfsdp bench train` computes it). Pinned model configs (vocab 32768, batch 8 x 1024 tokens):
#   gpt-medium: n_layer 12, n_head 16, n_embd 1024      gpt-large: n_layer 16, n_head 16, n_embd 2048
#
# The device machine has CuPy (cupy-cuda13x), mpi4py, numpy, ml_dtypes, safetensors, tqdm, pytest,
# pytest-timeout and hypothesis, but no MPI library and no pytest-mpi, and cannot install from the network.
# They travel as wheels in .whl/ (git-ignored), fetched here once:
#     bash scripts/device_check.sh --prepare        # pip download mpich + pytest-mpi wheels into .whl/
# then, through the device tool, from the repository root:  run(command="bash scripts/device_check.sh",
# carry=[".whl"], timeout_s=480). Results land in $OUT (device_check.log, *.jsonl, summary.txt).
#
# Options: --dry-run prints the commands without running them; --sim runs every step on the simulated
# device (HPCFSDP_CUDA_SIM=1) with tiny sizes, on any machine, to check the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=run
case "${1:-}" in
  --prepare) MODE=prepare ;;
  --dry-run) MODE=dry ;;
  --sim) MODE=sim ;;
  "") ;;
  *) echo "usage: $0 [--prepare|--dry-run|--sim]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}

if [ "$MODE" = prepare ]; then
  excl=$(git rev-parse --git-path info/exclude)  # also right in a git worktree
  mkdir -p "$(dirname "$excl")"
  grep -qx '/.whl/' "$excl" 2>/dev/null || echo '/.whl/' >> "$excl"
  exec $PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl mpich pytest-mpi
fi

OUT=${OUT:-device-results}
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 HPCFSDP_PROGRESS=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STATUS="$OUT/status.tsv"   # step <TAB> exit code <TAB> seconds
: > "$STATUS"
rm -f "$OUT/bench_train.jsonl" "$OUT/bench_comm_cuda.jsonl" "$OUT/bench_comm_host.jsonl"

# sizes: the real run, or tiny ones on the simulation
if [ "$MODE" = sim ]; then
  export HPCFSDP_CUDA_SIM=1
  CONFIGS=("gpt-sim --vocab-size 256 --block-size 16 --n-layer 2 --n-head 2 --n-embd 32 --batch-size 2")
  TRAIN_STEPS="--warmup 1 --steps 2"; COMM_SIZES="--min-bytes 1KiB --max-bytes 64KiB --iters 2 --warmup 1"
  T_TEST=600; T_TRAIN=300; T_COMM=300
else
  CONFIGS=("gpt-medium --vocab-size 32768 --block-size 1024 --n-layer 12 --n-head 16 --n-embd 1024 --batch-size 8"
           "gpt-large --vocab-size 32768 --block-size 1024 --n-layer 16 --n-head 16 --n-embd 2048 --batch-size 8")
  TRAIN_STEPS="--warmup 3 --steps 8"; COMM_SIZES="--min-bytes 1MiB --max-bytes 256MiB --iters 10 --warmup 3"
  T_TEST=150; T_TRAIN=75; T_COMM=60
fi

step() {  # step NAME TIMEOUT CMD...: run (or print) one step, record its exit code and time
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  if [ "$MODE" = dry ]; then printf '%s\t%s\t%s\n' "$name" dry 0 >> "$STATUS"; return 0; fi
  local t0=$SECONDS rc
  timeout "$limit" "$@"; rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$STATUS"
  return 0
}

{
  if [ "$MODE" = run ] && [ -d .whl ]; then
    # pytest-mpi as a plain package; MPICH under a prefix, so that its lib/ and bin/ (mpiexec) exist, and
    # mpi4py is pointed at that libmpi (MPI4PY_LIBMPI, mpi4py >= 4)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/pytest_mpi-*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    if ! $PY -c "import mpi4py.MPI" 2>/dev/null; then
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix /tmp/mpi \
        .whl/mpich-*.whl && export PATH="/tmp/mpi/bin:$PATH" MPI4PY_LIBMPI=/tmp/mpi/lib/libmpi.so.12 \
        LD_LIBRARY_PATH="/tmp/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  fi
  $PY -c "import hpcfsdp, cupy, mpi4py.MPI as M; print('cupy', cupy.__version__, '|', M.Get_library_version().splitlines()[0])" \
    || echo "WARNING: CuPy or MPI not usable here: the steps below will fail"
  LAUNCH=($PY -m hpcfsdp.cli.main launch)
  MPITEST=($PY tests/_mpi_pytest.py --with-mpi -q -p no:cacheprovider)

  step info 60 $PY -m hpcfsdp.cli.main info --json --all-ranks
  if [ "$MODE" != dry ]; then $PY -m hpcfsdp.cli.main info --json > "$OUT/info.json" 2>/dev/null; fi
  AWARE=$($PY -c "import json,sys; print(int(json.load(open(sys.argv[1])).get('cuda_aware', False)))" \
    "$OUT/info.json" 2>/dev/null || echo 0)

  step "gpu tests, 1 rank (warm-up)" "$T_TEST" $PY -m pytest -q -p no:cacheprovider -m "(gpu or gpu_hw) and not mpi" \
    tests/test_gpu.py tests/test_gpu_hw.py tests/test_gpu_sim.py tests/test_gpu_fsdp.py tests/test_backend.py
  step "gpu tests, 2 ranks, staged" "$T_TEST" env HPCFSDP_CUDA_AWARE=0 "${LAUNCH[@]}" -n 2 -- "${MPITEST[@]}" \
    -m "gpu and mpi" tests/test_gpu.py tests/test_gpu_sim.py tests/test_gpu_fsdp.py
  if [ "$AWARE" = 1 ]; then
    step "gpu tests, 2 ranks, CUDA-aware" "$T_TEST" env HPCFSDP_CUDA_AWARE=1 "${LAUNCH[@]}" -n 2 -- "${MPITEST[@]}" \
      -m "gpu and mpi" tests/test_gpu.py tests/test_gpu_sim.py tests/test_gpu_fsdp.py
  else
    printf '%s\t%s\t%s\n' "gpu tests, 2 ranks, CUDA-aware" "not run: hpcfsdp info says the MPI is not CUDA-aware" 0 \
      >> "$STATUS"
  fi
  for cfg in "${CONFIGS[@]}"; do
    name=${cfg%% *}; margs=${cfg#* }
    step "train $name bf16" "$T_TRAIN" "${LAUNCH[@]}" -n 1 -- $PY -m hpcfsdp.cli.main bench train --device cuda \
      --strategy FULL_SHARD --mixed-precision bf16 $margs $TRAIN_STEPS --json "$OUT/bench_train.jsonl"
  done
  step "bench comm cuda (staged, 2 ranks)" "$T_COMM" env HPCFSDP_CUDA_AWARE=0 "${LAUNCH[@]}" -n 2 -- \
    $PY -m hpcfsdp.cli.main bench comm --device cuda --ops all_gather,reduce_scatter $COMM_SIZES --no-raw \
    --json "$OUT/bench_comm_cuda.jsonl"
  step "bench comm host (2 ranks)" "$T_COMM" "${LAUNCH[@]}" -n 2 -- \
    $PY -m hpcfsdp.cli.main bench comm --device cpu --ops all_gather $COMM_SIZES --no-raw \
    --json "$OUT/bench_comm_host.jsonl"

  $PY scripts/device_summary.py "$OUT" | tee "$OUT/summary.txt"
} 2>&1 | tee "$OUT/device_check.log"
