#!/usr/bin/env bash
# One H200 call for the wgmma prefill kernel (run from the repository root; logs under $OUT),
# about 170-220 s: gpu_check --only-wgmma, i.e.
#   1. wgmma_layout_check: one warpgroup's S = Q K^T and O = P V through the kernel's shared-
#      memory layout and descriptors against NumPy (bf16/fp16 x d = 128/64); a failure prints
#      which reference column/row block each result block matches (a layout permutation);
#   2. the kernel's cases (PAGEDATTN_CUPY_PREFILL=wgmma, overlap and serial schedules) against
#      the exact spec on poisoned pools, each saying whether the wgmma kernel took it (fp8 must
#      fall back), windows at both head dims and block sizes 16 and 64, and determinism;
#   3. causal prefill 8 x 4,096 (bf16, 32/8 heads, d = 128, shuffled NHD blocks) at block sizes
#      16/32/64 for the wgmma kernel (overlap, serial, 2 CTAs/SM) and the 64-row mma.sync
#      kernel, beside cuDNN SDPA in the same run.
# SHAPES and PASSES (environment) narrow steps 3 and 2 (defaults: all).
# The log folder is also packed into $OUT/cupy-wgmma-logs.tar.gz (the device tool returns at
# most 8 files).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cupy-wgmma}
mkdir -p "$OUT/logs"
timeout "${TIMEOUT:-225}" python3 -m pagedattn.backends.cupy.gpu_check --only-wgmma \
    --skip bench,sanitizer --measure shapes --shapes "${SHAPES:-wgmma,wgmma-serial,wgmma-2cta,64}" \
    --wgmma-passes "${PASSES:-overlap,serial,2cta}" --out "$OUT/logs" \
    > "$OUT/logs/wgmma.log" 2>&1
rc=$?
echo "gpu_check rc=$rc" | tee "$OUT/logs/summary.log"
grep -E "^FAIL|checks passed|^shape|^cuDNN|layout" "$OUT/logs/wgmma.log" | tee -a "$OUT/logs/summary.log" | tail -45
tar -czf "$OUT/cupy-wgmma-logs.tar.gz" -C "$OUT" logs
