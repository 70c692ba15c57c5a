#!/usr/bin/env bash
# Every number in BENCHMARKS.md comes from this script (CPU; one BLAS thread per rank).
# Usage: bash scripts/benchmarks.sh [SECTION...]   sections: single compare prefetch comm table memory ckpt ac
# PyTorch (for the peer numbers) lives in its own venv, never in hpcfsdp's: TORCH_PY=/path/to/python.
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
mkdir -p "$R"
PY=${PY:-.venv/bin/python}
TORCH_PY=${TORCH_PY:-../peer-venv/bin/python}
PEER=${PEER:-benchmarks/peer/torch_fsdp2_bench.py}
HP="$PY -m hpcfsdp.cli.main"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HPCFSDP_PROGRESS=0
sections=${*:-single compare prefetch comm table memory ckpt debug soak}
MED="--n-layer 4 --n-embd 256 --n-head 8 --block-size 128 --vocab-size 4096 --batch-size 4"

for s in $sections; do case $s in
single)  # unsharded single-process step vs PyTorch eager, default GPT, alternating A B A B
  for r in 1 2; do
    $HP bench train --strategy none --no-tie --warmup 1 --steps 3 --json $R/single_hp.jsonl
    $TORCH_PY $PEER --mode single --threads 1 --warmup 1 --steps 3 --json $R/single_torch.jsonl > /dev/null
  done ;;
compare)  # FULL_SHARD at 2 ranks / unsharded, hpcfsdp and PyTorch FSDP2 (gloo), alternating
  $HP bench compare -n 2 --repeats 2 --warmup 1 --steps 3 --no-tie --torch-python $TORCH_PY --peer-script $PEER \
    --json $R/compare_n2.json ;;
ac)  # activation checkpointing on vs off at 2 ranks, default GPT built on the meta device, alternating
  for r in 1 2; do
    for ac in "" "--activation-checkpointing"; do
      $HP launch -n 2 -- hpcfsdp bench train --meta-init --warmup 1 --steps 3 $ac --json $R/ac_n2.jsonl
    done
  done ;;
prefetch)  # prefetch on vs off at 2 ranks, exposed communication
  for r in 1 2; do
    for pf in "" "--no-prefetch"; do
      $HP launch -n 2 -- hpcfsdp bench train $MED --warmup 2 --steps 6 $pf --json $R/prefetch.jsonl
    done
  done ;;
prefetch-gpt)  # prefetch on vs off at 2 ranks on the default GPT (large units), alternating
  for r in 1 2; do
    for pf in "" "--no-prefetch"; do
      $HP launch -n 2 -- hpcfsdp bench train --no-tie --warmup 1 --steps 3 $pf --json $R/prefetch_gpt.jsonl
    done
  done ;;
comm)  # busbw of hpcfsdp vs raw mpi4py on identical buffers, 2 ranks
  $HP launch -n 2 -- hpcfsdp bench comm --min-bytes 1K --max-bytes 256M --iters 10 --json $R/comm_n2.jsonl ;;
table)  # step time / tokens/s / peak memory per rank for 1, 2, 4 ranks x strategies x precision
  for mp in none bf16; do
    $HP bench train $MED --strategy none --mixed-precision $mp --warmup 1 --steps 4 --json $R/table.jsonl
    $HP launch -n 1 -- hpcfsdp bench train $MED --strategy FULL_SHARD --mixed-precision $mp --warmup 1 --steps 4 --json $R/table.jsonl
    for st in FULL_SHARD SHARD_GRAD_OP NO_SHARD; do
      $HP launch -n 2 -- hpcfsdp bench train $MED --strategy $st --mixed-precision $mp --warmup 1 --steps 4 --json $R/table.jsonl
      $HP launch -n 4 -- hpcfsdp bench train $MED --strategy $st --mixed-precision $mp --warmup 1 --steps 4 --json $R/table.jsonl
    done
    $HP launch -n 4 --ranks-per-node 2 -- hpcfsdp bench train $MED --strategy HYBRID_SHARD --mesh 2x2 --mixed-precision $mp --warmup 1 --steps 4 --json $R/table.jsonl
  done ;;
memory)  # parameter-dominated GPT, per-rank peak RSS at 4 ranks vs the unsharded process
  BIG="--n-layer 12 --n-embd 1024 --n-head 16 --vocab-size 8192 --block-size 128 --batch-size 1 --no-tie"
  for tune in speed memory; do  # the host allocator's two settings ([Note: Host allocator])
    HPCFSDP_MALLOC_TUNE=$tune $HP bench train $BIG --strategy none --warmup 1 --steps 2 --json $R/memory_$tune.jsonl
    HPCFSDP_MALLOC_TUNE=$tune $HP launch -n 4 -- hpcfsdp bench train $BIG --strategy FULL_SHARD --meta-init \
      --warmup 1 --steps 2 --json $R/memory_$tune.jsonl
  done
  TBIG="--layers 12 --d-model 1024 --heads 16 --vocab 8192 --seq 128 --batch 1 --warmup 1 --steps 2"
  $TORCH_PY $PEER --mode single $TBIG --json $R/memory_torch.jsonl > /dev/null
  ${TORCH_PY%/python}/torchrun --standalone --nproc-per-node 4 $PEER --mode fsdp --meta-init $TBIG --json $R/memory_torch.jsonl > /dev/null ;;
ckpt)  # checkpoint save/load throughput vs raw NumPy I/O, 1 GiB, 2 and 4 ranks
  for n in 2 4; do $HP launch -n $n -- hpcfsdp bench checkpoint --bytes 1G --json $R/ckpt.jsonl; done ;;
debug)  # cost of HPCFSDP_DEBUG=1 (fingerprint check before every collective), interleaved per call
  $HP launch -n 2 -- python scripts/debug_cost.py --json $R/debug_cost.json ;;
soak)  # a 10-minute soak: checkpoint/reload cycles checked against the uninterrupted run
  rm -rf /tmp/hpcfsdp-soak
  /usr/bin/time -f "soak wall %e s" $HP launch -n 2 -- hpcfsdp train --soak --steps 1500 --checkpoint-interval 50 \
    --n-layer 4 --n-embd 128 --n-head 4 --block-size 64 --batch-size 8 --log-interval 50 \
    --out-dir /tmp/hpcfsdp-soak --checkpoint-dir /tmp/hpcfsdp-soak/ckpt 2>&1 | tail -4 | tee $R/soak.txt
  cp /tmp/hpcfsdp-soak/soak.json $R/soak.json ;;
*) echo "unknown section $s" >&2; exit 2 ;;
esac; done
