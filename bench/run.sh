#!/usr/bin/env bash
# Runs the benchmarks from BUILD_DIR (default build-bench) and renders docs/performance.md
# (tables) and docs/bind_overhead.svg (plot) from the JSON of this run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-bench}
shift || true
out=$build/bench_staging.json
"$build/bench/bench_staging" --benchmark_out="$out" --benchmark_out_format=json \
    --benchmark_min_time=0.2 "$@"
python3 bench/render.py "$out" docs/performance.md docs/bind_overhead
if command -v gnuplot >/dev/null; then
    for plot in bind_overhead step_time; do
        gnuplot "docs/$plot.gp" && rm -f "docs/$plot.gp" "docs/$plot.dat"
    done
else
    echo "gnuplot not found: plots not rendered (docs/*.gp left in place)"
fi
echo "wrote docs/performance.md"
