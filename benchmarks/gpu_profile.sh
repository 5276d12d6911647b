#!/usr/bin/env bash
# Where the traced GPU loop spends its CPU time: cProfile of benchmarks/gpu_check.py's traced child.
# Run on a CUDA machine: bash benchmarks/gpu_profile.sh [STEPS]
set -euo pipefail
steps=${1:-400}
out=${OUT:-/tmp}
python3 -m cProfile -o "$out/traced.prof" benchmarks/gpu_check.py --child traced "$steps" "$out/traced.json"
python3 -m cProfile -o "$out/bare.prof" benchmarks/gpu_check.py --child bare "$steps" "$out/bare.json"
python3 - "$out" <<'PY'
import json, pstats, statistics, sys
out = sys.argv[1]
for name in ("bare", "traced"):
    durations = json.load(open(f"{out}/{name}.json"))["durations_ns"][20:]
    print(f"{name}: median step {statistics.median(durations) / 1e3:.1f} us")
stats = pstats.Stats(f"{out}/traced.prof")
stats.sort_stats("tottime").print_stats(30)
PY
