#!/usr/bin/env bash
# The one device call that made this folder's bench.json / bench.png and
# pagedattn/perf/baselines/nvidia-h200/baseline.json (run from the repository root, $OUT set).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/pagedattn-h200}
mkdir -p "$OUT/h200"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# 1. the torch backend against the spec, on CUDA
timeout 25 python3 -m pytest -q -x -p no:cacheprovider tests/test_torch_backend.py 2>&1 | tail -4
# 2. the bench: torch backend + peers (sdpa, flex) on the quick set
timeout 95 python3 -m pagedattn bench --backend torch --shapes quick --budget 0.15 --flex-budget 20 \
    --out "$OUT/h200" 2>&1 | tee "$OUT/bench.log" | grep -v '^\['
# 3. the pytest-benchmark suite, saved as this GPU's baseline
timeout 30 python3 -m pytest -q -p no:cacheprovider -o 'python_files=bench_*.py' pagedattn/perf \
    --perf-baseline=off --benchmark-json="$OUT/baseline.json" --benchmark-columns=median,iqr,rounds 2>&1 | tail -20
