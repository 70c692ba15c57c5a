#!/usr/bin/env bash
# The GPU check of hpcfsdp in one run of at most 450 s on one H200 (the device tool's machine), step by step:
#
#   setup                  install the carried wheels (.whl) beside the machine's own Python packages
#   preflight              versions, GPU, NCCL, bf16 coverage of the engine's ops, pinned copy GB/s, raw CuPy bf16
#                          GEMM TFLOP/s at gpt-medium and gpt-large shapes (scripts/device_preflight.py)
#   gpu-1rank              pytest -m "(gpu or gpu_hw) and not mpi" tests, on real CuPy (also compiles and caches
#                          CuPy's kernels on disk, so later processes start warm)
#   parity-2ranks-staged   the `gpu and mpi` tests (FSDP parity among them) at 2 ranks sharing the one GPU, staged
#                          through pinned host memory (HPCFSDP_GPU_COMM=staged; NCCL cannot run two ranks on one GPU)
#   nccl-ws1               NCCL collectives at world size 1, bf16/fp16/fp32, SUM and AVG (scripts/device_nccl_check.py)
#   hpcfsdp-gpt-medium     hpcfsdp bench train, bf16, FULL_SHARD on 1 rank: tokens/s, step time, MFU, and the kernels
#                          of one more step (--profile-kernels: PyTorch's CUPTI profiler; the simulator's count of
#                          the same model is in BENCHMARKS.md, 2026-12-03, to hold them side by side)
#   torch-gpt-medium       the same GPT in PyTorch eager bf16 (benchmarks/peer/torch_gpt_step.py): the ceiling
#   hpcfsdp-gpt-large, torch-gpt-large   the same for gpt-large
#
# Each step runs under `timeout` with its limit from the table LIMITS below (the only place they are written; they
# add up to at most BUDGET = 450 s, which the script checks and tests/test_gpu_device_check.py asserts; a step is
# sent SIGTERM at its limit and SIGKILL 3 s later), and as it ends a line is appended to
# $OUT/summary.txt and $OUT/summary.jsonl (status, seconds, key figures: scripts/device_summary.py), so a run that
# the device tool kills at its limit still reports every step that finished; $OUT/running names the step in flight.
# The whole log is $OUT/device_check.log, each step's output $OUT/steps/<step>.log.
#
# MFU = FLOPs / (step time x 989e12), FLOPs per step = tokens x (6 x params + 12 x n_layer x n_embd x block_size)
# (the matmul FLOPs of forward+backward plus the attention-score term; 989 TFLOP/s = dense bf16 peak of an
# H200 SXM), as `hpcfsdp bench train` and torch_gpt_step.py both compute it. Models (MODELS below; head tied to
# the token embedding, batch 8 x 1024 tokens): issue 28's reference configs, gpt-medium n_layer 24, n_head 16,
# n_embd 1024, and gpt-large n_layer 36, n_head 20, n_embd 1280 (as scripts/gpu_counts.py); vocab 32768.
#
# The machine: Python 3.12 (python3, itself a virtual environment holding PyTorch), CuPy 14 for CUDA 13 with NCCL
# (nvidia-nccl-cu13), mpi4py, pytest, pytest-timeout, hypothesis, numpy, ml_dtypes, safetensors, tqdm; no MPI
# library, no pytest-mpi, no network. What it lacks travels as wheels in .whl/ (git-ignored), fetched here once:
#     bash scripts/device_check.sh --prepare     # pip download mpich, mpi4py, pytest-mpi, pytest-timeout (cp312)
# then, from the repository root through the device tool:
#     run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=480)
# hpcfsdp itself runs from the tree (PYTHONPATH=the repository root), so no wheel of it is needed.
# Where the wheels go (setup): pure-Python ones into $HPCFSDP_DEVICE_DIR/site (on PYTHONPATH, before the machine's
# site-packages), MPICH under the prefix $HPCFSDP_DEVICE_DIR/mpi (its bin/mpiexec and lib/libmpi.so.12, which
# mpi4py >= 4 loads through MPI4PY_LIBMPI); the machine's mpi4py is kept unless it is older than 4.0.3. Not a
# virtual environment: python3 there is a venv already, and a venv made from it with --system-site-packages sees
# the base interpreter's packages, not that venv's CuPy and PyTorch; nor --user, which a venv refuses.
#
# Options: --dry-run prints each step's command and limit without running it; --sim runs every step on the
# simulated device (HPCFSDP_CUDA_SIM=1) with tiny sizes and the PyTorch ceiling on the CPU, on any machine, to check
# the script itself (CI; there each limit is doubled, the simulation being slower on 2 shared cores); --limits prints the table and its total. PYTHON names the Python (default python3, or
# .venv/bin/python for --sim/--dry-run where it exists); OUT the results folder (default device-results).
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

# step                  limit/s
LIMITS="
setup                      15
preflight                  40
gpu-1rank                 115
parity-2ranks-staged       60
nccl-ws1                   30
hpcfsdp-gpt-medium         50
torch-gpt-medium           30
hpcfsdp-gpt-large          75
torch-gpt-large            35
"
BUDGET=450

# name         vocab  block  n_layer  n_head  n_embd  batch
MODELS_RUN="
gpt-medium     32768  1024   24       16      1024    8
gpt-large      32768  1024   36       20      1280    8
"
MODELS_SIM="
gpt-medium     256    16     2        2       32      2
gpt-large      256    32     2        2       64      2
"

MODE=run
case "${1:-}" in
  --prepare) MODE=prepare ;;
  --dry-run) MODE=dry ;;
  --sim) MODE=sim ;;
  --limits) MODE=limits ;;
  --install|--env-check) MODE=${1#--} ;;  # the setup step's own work (internal)
  "") ;;
  *) echo "usage: $0 [--prepare|--dry-run|--sim|--limits]" >&2; exit 2 ;;
esac
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ "$MODE" != run ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
DC=${HPCFSDP_DEVICE_DIR:-/tmp/hpcfsdp-device}
WHEELS="mpich==5.0.2 mpi4py==4.1.2 pytest-mpi==0.6 pytest-timeout==2.4.0"

limit_of() { awk -v s="$1" '$1 == s { print $2 }' <<< "$LIMITS"; }
TOTAL=$(awk 'NF == 2 { t += $2 } END { print t }' <<< "$LIMITS")
[ "$TOTAL" -le "$BUDGET" ] || { echo "device_check.sh: the limits add up to ${TOTAL}s, over ${BUDGET}s" >&2; exit 2; }

case $MODE in
limits)
  awk 'NF == 2 { print; t += $2 } END { print "total", t }' <<< "$LIMITS"
  exit 0 ;;
prepare)  # here, where pip reaches the package index: the wheels the device lacks, for CPython 3.12 x86-64
  excl=$(git rev-parse --git-path info/exclude)  # also right in a git worktree
  mkdir -p "$(dirname "$excl")" .whl
  grep -qx '/.whl/' "$excl" 2>/dev/null || echo '/.whl/' >> "$excl"
  rm -f .whl/mpich-* .whl/mpi4py-* .whl/pytest_mpi-* .whl/pytest_timeout-*  # one version of each
  # shellcheck disable=SC2086
  exec $PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d .whl $WHEELS ;;
install|env-check)  # run by the setup step, under its time limit, with the environment below already exported
  if [ "$MODE" = install ]; then
    [ -d .whl ] || { echo "setup: error=no .whl here: run 'bash scripts/device_check.sh --prepare' where pip" \
      "reaches PyPI, and carry .whl"; exit 1; }
    pipi() { $PY -m pip install -q --no-index --find-links .whl --no-deps --no-compile --no-cache-dir "$@"; }
    installed=pytest-mpi
    pipi --upgrade --target "$DC/site" pytest-mpi || exit 1
    if ! $PY -c "import pytest_timeout" 2>/dev/null; then
      pipi --upgrade --target "$DC/site" pytest-timeout || exit 1; installed="$installed pytest-timeout"
    fi
    pipi --ignore-installed --prefix "$DC/mpi" mpich || exit 1; installed="$installed mpich"
    if ! $PY -c "import sys, mpi4py; sys.exit(tuple(map(int, mpi4py.__version__.split('.')[:3])) < (4, 0, 3))" \
        2>/dev/null; then
      pipi --upgrade --target "$DC/site" mpi4py || exit 1; installed="$installed mpi4py"
    fi
    echo "setup: installed=$installed (into $DC)"
  fi
  $PY - <<'EOF'
import platform, mpi4py, pytest_mpi  # noqa
from mpi4py import MPI
import hpcfsdp
print("setup: python=" + platform.python_version())
print("setup: mpi=" + MPI.Get_library_version().splitlines()[0].strip())
print("setup: mpi4py=" + mpi4py.__version__ + " at " + mpi4py.__file__.rsplit("/", 2)[0])
print("setup: hpcfsdp=" + hpcfsdp.__file__.rsplit("/", 2)[0])
EOF
  exit $? ;;
esac

OUT=${OUT:-device-results}
mkdir -p "$OUT/steps"
rm -f "$OUT"/summary.txt "$OUT"/summary.jsonl "$OUT"/status.tsv "$OUT"/*.jsonl "$OUT"/preflight.json \
  "$OUT"/nccl.json "$OUT"/running "$OUT"/steps/*.log
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 HPCFSDP_PROGRESS=0 PYTHONUNBUFFERED=1 PYTHON=$PY
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$MODE" = run ]; then  # where setup puts the wheels (nothing imports mpi4py before it has run)
  export PYTHONPATH="$PWD:$DC/site${PYTHONPATH#"$PWD"}" PATH="$DC/mpi/bin:$PATH" \
    MPI4PY_LIBMPI="$DC/mpi/lib/libmpi.so.12" LD_LIBRARY_PATH="$DC/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if [ "$MODE" = sim ]; then
  export HPCFSDP_CUDA_SIM=1
  # the simulation runs on whatever CPUs the machine has (CI: 2, shared): every limit x 2 there
  MODELS=$MODELS_SIM; SIMFLAG=--sim; SETUP=--env-check; TORCH_DEV=cpu; SLACK=2
  STEPS="--warmup 1 --steps 2"; PEAK="--peak-tflops 0.01"  # a made-up peak: MFU is computed on both sides
else
  MODELS=$MODELS_RUN; SIMFLAG=; SETUP=--install; TORCH_DEV=cuda; SLACK=1
  STEPS="--warmup 2 --steps 5"; PEAK=
fi

step() {  # step ID CMD...: run (or print) one step under its time limit, then append its summary line
  local id=$1 limit rc t0 secs; shift
  limit=$(limit_of "$id")
  [ -n "$limit" ] || { echo "device_check.sh: step $id has no limit in LIMITS" >&2; exit 2; }
  limit=$((limit * SLACK))
  echo "== $id (limit ${limit}s): $(printf '%q ' "$@")"
  if [ "$MODE" = dry ]; then
    rc=dry; secs=0
  else
    echo "$id since $(date -u +%H:%M:%S)" > "$OUT/running"
    t0=$EPOCHREALTIME
    timeout -k 3 "$limit" "$@" < /dev/null 2>&1 | tee "$OUT/steps/$id.log"; rc=${PIPESTATUS[0]}
    secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    rm -f "$OUT/running"
  fi
  printf '%s\t%s\t%s\n' "$id" "$rc" "$secs" >> "$OUT/status.tsv"
  $PY scripts/device_summary.py record "$OUT" "$id" "$rc" "$secs" "$limit" \
    || printf '%-22s rc=%s %ss (no figures: device_summary.py failed)\n' "$id" "$rc" "$secs" >> "$OUT/summary.txt"
}

{
  LAUNCH=("$PY" -m hpcfsdp.cli.main launch)
  step setup bash scripts/device_check.sh "$SETUP"
  # shellcheck disable=SC2086
  step preflight "$PY" scripts/device_preflight.py $SIMFLAG --json "$OUT/preflight.json"
  step gpu-1rank "$PY" -m pytest -q -p no:cacheprovider -m "(gpu or gpu_hw) and not mpi" tests
  mkdir -p "$OUT/steps/parity-ranks"
  step parity-2ranks-staged env HPCFSDP_GPU_COMM=staged HPCFSDP_CUDA_AWARE=0 \
    HPCFSDP_TEST_LOGDIR="$OUT/steps/parity-ranks" "${LAUNCH[@]}" -n 2 -- \
    "$PY" tests/_mpi_pytest.py --with-mpi -q -p no:cacheprovider -m "gpu and mpi" tests
  step nccl-ws1 env HPCFSDP_GPU_COMM=nccl "${LAUNCH[@]}" -n 1 -- "$PY" scripts/device_nccl_check.py \
    --json "$OUT/nccl.json"
  while read -r name vocab block layers heads embd batch <&3; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086
    step "hpcfsdp-$name" "${LAUNCH[@]}" -n 1 -- "$PY" -m hpcfsdp.cli.main bench train --device cuda \
      --strategy FULL_SHARD --mixed-precision bf16 --vocab-size "$vocab" --block-size "$block" --n-layer "$layers" \
      --n-head "$heads" --n-embd "$embd" --batch-size "$batch" $STEPS $PEAK --profile-kernels \
      --json "$OUT/hpcfsdp-$name.jsonl"
    # shellcheck disable=SC2086
    step "torch-$name" "$PY" benchmarks/peer/torch_gpt_step.py --device "$TORCH_DEV" --dtype bf16 --tie \
      --vocab "$vocab" --seq "$block" --layers "$layers" --heads "$heads" --d-model "$embd" --batch "$batch" \
      $STEPS $PEAK --json "$OUT/torch-$name.jsonl"
  done 3<<< "$MODELS"
  echo
  "$PY" scripts/device_summary.py final "$OUT"
} 2>&1 | tee "$OUT/device_check.log"
exit "${PIPESTATUS[0]}"
