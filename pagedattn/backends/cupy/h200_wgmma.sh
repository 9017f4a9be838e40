#!/usr/bin/env bash
# One H200 call for the wgmma prefill kernel (run from the repository root; logs under $OUT),
# about 150-200 s: gpu_check --only-wgmma, i.e.
#   1. wgmma_layout_check: one warpgroup's S = Q K^T and O = P V through the kernel's shared-
#      memory layout and descriptors against NumPy (bf16/fp16 x d = 128/64); a failure prints
#      which reference column/row block each result block matches (a layout permutation);
#   2. the kernel's cases (PAGEDATTN_CUPY_PREFILL=wgmma, overlap and serial schedules) against
#      the exact spec on poisoned pools, each saying whether the wgmma kernel took it (fp8 must
#      fall back), and determinism;
#   3. causal prefill 8 x 4,096 (bf16, 32/8 heads, d = 128, shuffled NHD blocks) at block sizes
#      16/32/64 for the wgmma kernel (overlap, serial) and the 64-row mma.sync kernel, beside
#      cuDNN SDPA in the same run.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cupy-wgmma}
mkdir -p "$OUT"
timeout "${TIMEOUT:-225}" python3 -m pagedattn.backends.cupy.gpu_check --only-wgmma \
    --skip bench,sanitizer --measure shapes --shapes wgmma,wgmma-serial,64 --out "$OUT" \
    > "$OUT/wgmma.log" 2>&1
echo "gpu_check rc=$?"
grep -E "^FAIL|checks passed|^shape|^cuDNN|layout" "$OUT/wgmma.log" | tail -45
