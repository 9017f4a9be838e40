#!/usr/bin/env bash
# One H200 call for the cupy backend (run from the repository root; logs under $OUT):
#   1. gpu_check --only-decode: the decode, fp8, 64-row mma.sync and Hopper (wgmma) prefill
#      kernels against the exact spec on poisoned pools, determinism, torch inputs, fp8
#      write_kv/copy_blocks; then (--measure shapes) prefill 8 x 4,096 per tensor-core kernel
#      shape (64, wgmma, wgmma-serial, wgmma-2cta) beside cuDNN;
#   2. the official bench: `pagedattn bench --shapes targets --peers sdpa`, default planning;
#   3. compute-sanitizer memcheck and racecheck on the small poisoned cases, in the time left.
# Every step has its own timeout so the whole stays under TOTAL seconds (default 300).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cupy-h200}
TOTAL=${TOTAL:-300}
mkdir -p "$OUT/logs"
start=$SECONDS
left() { echo $((TOTAL - (SECONDS - start))); }

timeout 160 python3 -m pagedattn.backends.cupy.gpu_check --only-decode --skip bench,sanitizer \
    --measure shapes --out "$OUT/logs" > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$? at $((SECONDS - start)) s"
timeout $(( $(left) > 110 ? 110 : $(left) )) python3 -m pagedattn bench --backend cupy \
    --shapes targets --peers sdpa --budget 0.1 --out "$OUT/logs/bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$? at $((SECONDS - start)) s"
for tool in memcheck racecheck; do
    budget=$(( $(left) - 5 ))
    if [ "$budget" -lt 15 ]; then echo "$tool: skipped (no time left)"; continue; fi
    timeout "$budget" compute-sanitizer --tool "$tool" --error-exitcode 9 python3 -m \
        pagedattn.backends.cupy.gpu_check --sanitize --only-decode > "$OUT/logs/$tool.log" 2>&1
    echo "$tool rc=$? at $((SECONDS - start)) s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/$tool.log" | tr '\n' ' ')"
    grep -E "^sanitize" "$OUT/logs/$tool.log" | grep -v ": ok" | head -5
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
grep -E "^FAIL|checks passed|host overhead|kernel time|^shape|^cuDNN" "$OUT/gpu_check.log" | tail -40
grep -v '^\[' "$OUT/bench.log" | grep -E "ceilings|cupy|sdpa" | tail -20
