#!/usr/bin/env bash
# The docs' pictures, made with the CLI (needs the plot extra; about a minute on 2 cores):
#   docs/img/trace_step.png      `hpcfsdp trace plot` of one step of a traced 2-rank run
#   docs/img/metrics_resume.png  `hpcfsdp plot --smooth` of that run, resumed at 2 ranks, then at 4 ranks
# Usage: bash scripts/docs_images.sh [OUT_DIR]   (default: docs/img; HPCFSDP=... names another hpcfsdp command)
set -euo pipefail
img=$(realpath -m "${1:-docs/img}")
hp=${HPCFSDP:-hpcfsdp}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir -p "$img"
train=(--n-layer 4 --n-embd 64 --n-head 4 --block-size 64 --batch-size 8 --lr 3e-3 --warmup-steps 5
       --log-interval 1 --out-dir run --checkpoint-dir ckpt --checkpoint-interval 10)
export HPCFSDP_PROGRESS=0
$hp launch -n 2 -- $hp train "${train[@]}" --steps 20 --trace trace        # steps 1..20, traced
$hp launch -n 2 -- $hp train "${train[@]}" --steps 40 --resume             # resumed at 20, same size
$hp launch -n 4 -- $hp train "${train[@]}" --steps 60 --resume             # resumed at 40 at 4 ranks
$hp trace merge trace -o merged.json
$hp trace plot merged.json --step 12 -o "$img/trace_step.png" \
    --title "hpcfsdp trace plot: step 12 of a 4-block GPT at 2 ranks (FSDP unit per block + root)"
$hp plot run/metrics.jsonl --smooth -o "$img/metrics_resume.png" \
    --title "hpcfsdp plot --smooth: 20 steps at 2 ranks, resumed at 20 (2 ranks) and at 40 (4 ranks)"
