#!/usr/bin/env bash
# The checks and figures that need a GPU, in one run (docs/benchmarks.md, "On an H100"):
#   1. the device-agnostic tests on the GPU (PANTHEON_OCR_TEST_DEVICE);
#   2. a full page's vision at the LightOnOCR-1B shapes on the GPU in each compute dtype, and the
#      page's prefill on the CPU, as `bench ocr` measures them;
#   3. whole pages through the pipeline (`bench pages`): the GPU's vision beside the CPU's prefill
#      and decode, the GPU switches, overlap on and off.
# Usage: DEVICE=cuda scripts/gpu_check.sh [OUT]   (SMALL=1: 2 vision and 4 text layers, small pages,
# a dry run of the script on any machine with DEVICE=cpu VB=torch). Each step has its own time limit, so a
# hang costs one step, not the run; the JSON of each benchmark lands in OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/gpu-check}}
DEVICE=${DEVICE:-cuda}
PAGES=${PAGES:-8}
TOKENS=${TOKENS:-128}
mkdir -p "$OUT"
OCR=(python3 -c 'import sys; from pantheon_ocr.cli import run; sys.argv[0] = "pantheon-ocr"; run()')  # no install needed
step() { echo "== $1 ($(date +%T))"; }

step environment
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  python3 -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__)'
  echo "$(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" \
      "$(grep -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  cc --version | head -1; } 2>&1

step "tests on $DEVICE"
PANTHEON_OCR_TEST_DEVICE=$DEVICE timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=line \
    tests/engine/test_backends_torch.py tests/engine/test_gpu_switches.py \
    tests/bench/test_bench.py::test_bench_ocr_runs_the_vision_on_the_device_in_each_dtype 2>&1 | tail -25

step "random LightOnOCR-1B files"
D=/tmp/lightonocr-random
if [ -n "${SMALL:-}" ]; then
    D=/tmp/lightonocr-random-small
    python3 scripts/make_random_lightonocr.py $D --vision-layers 2 --text-layers 4 > /dev/null
    EDGE="--longest-edge 448"
else
    python3 scripts/make_random_lightonocr.py $D > /dev/null
    EDGE=""
fi
TEXT=$(ls $D/lightonocr-*.gguf | head -1); MMPROJ=$(ls $D/mmproj-*.gguf | head -1)
ls -la $D

step "vision on $DEVICE by dtype, prefill on the CPU (bench ocr)"
timeout 150 "${OCR[@]}" bench ocr --model "$TEXT" --mmproj "$MMPROJ" --stage vision --vision-backend torch --device "$DEVICE" \
    --vision-dtype float32,bfloat16,float16 --repeats 3 $EDGE --json "$OUT/vision.json" 2>&1
timeout 90 "${OCR[@]}" bench ocr --model "$TEXT" --mmproj "$MMPROJ" --stage prefill $EDGE --json "$OUT/prefill.json" 2>&1

step "whole pages (bench pages): $PAGES pages, $TOKENS tokens each"
common=(--model "$TEXT" --mmproj "$MMPROJ" --synthetic "$PAGES" --batch-size "$PAGES" --max-tokens "$TOKENS"
        --ignore-eos --device "$DEVICE" --vision-backend "${VB:-auto}" $EDGE)
timeout 200 "${OCR[@]}" bench pages "${common[@]}" --vision-dtype float32,bfloat16 --json "$OUT/pages-dtype.json" 2>&1
timeout 200 "${OCR[@]}" bench pages "${common[@]}" --vision-dtype bfloat16 --gpu-prefill on --gpu-decode on,off \
    --json "$OUT/pages-switches.json" 2>&1
timeout 120 "${OCR[@]}" bench pages "${common[@]}" --vision-dtype bfloat16 --overlap off \
    --json "$OUT/pages-overlap.json" 2>&1
step done
