# Final call: .ci/h200-measure's steps, balanced over two GPUs.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=/tmp/f; mkdir -p $O
step() { local name=$1 limit=$2 t0=$SECONDS; shift 2; timeout "$limit" "$@" > "$O/$name.log" 2>&1; echo "$name: rc=$? in $((SECONDS - t0)) s"; }
gpu1() {
  CUDA_VISIBLE_DEVICES=1 step cupy-gpu-check 200 python3 -m pagedattn.backends.cupy.gpu_check --skip bench,sanitizer --out $O/cupy-gpu-check
  CUDA_VISIBLE_DEVICES=1 PAGEDATTN_CUPY_PREFILL=wgmma WORKERS=12 OUT=$O/wgmma bash .ci/h200-thorough 150 cupy > $O/cupy-thorough-wgmma.log 2>&1
  for tool in memcheck racecheck; do
    CUDA_VISIBLE_DEVICES=1 step cupy-$tool 60 env PAGEDATTN_CUPY_PREFILL=wgmma compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pagedattn.backends.cupy.gpu_check --sanitize
  done
}
gpu1 &
CUDA_VISIBLE_DEVICES=0 step bench 110 python3 -m pagedattn bench --backend triton cupy --shapes targets --peers sdpa --out $O/bench
CUDA_VISIBLE_DEVICES=0 step benchmarks 150 python3 -m pytest -q -p no:cacheprovider -o python_files='bench_*.py' \
    pagedattn/perf/bench_backends.py pagedattn/perf/bench_targets.py --perf-backends triton cupy --benchmark-json $O/baseline.json
CUDA_VISIBLE_DEVICES=0 step cupy-wgmma-check 120 python3 -m pagedattn.backends.cupy.gpu_check --only-wgmma --skip bench,sanitizer \
    --measure shapes --shapes wgmma-2cta,64 --out $O/cupy-wgmma-check
CUDA_VISIBLE_DEVICES=0 WORKERS=15 OUT=$O bash .ci/h200-thorough 120 cupy > $O/cupy-thorough.log 2>&1
wait
tar czf $OUT/final.tgz -C /tmp f; cp $O/baseline.json $OUT/ 2>/dev/null
grep -h -E "checks passed|^FAIL" $O/*-check.log | tail -6
grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY" $O/cupy-memcheck.log $O/cupy-racecheck.log
grep -h "wgmma kernel" $O/cupy-memcheck.log | cut -c1-90
cat $O/cupy-thorough*.log
grep -E "^shape|cuDNN" $O/cupy-wgmma-check.log
grep -E "^(FAILED|ERROR)|passed|failed" $O/benchmarks.log | cut -c1-160 | tail -5
grep -v '^\[' $O/bench.log | tail -12
