#!/usr/bin/env bash
# Runs the benchmarks from BUILD_DIR (default build-bench) and the instruction counts
# (bench/instructions.sh, where valgrind is installed), then renders docs/performance.md
# (tables) and docs/bind_overhead.svg, docs/step_time.svg (plots) from this run, and the Python
# step's section of it (bench/python_step.py).
# Arguments after BUILD_DIR go to Google Benchmark.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-bench}
shift || true
out=$build/bench_staging.json
# Three repetitions, their median reported: the machine may be shared.
"$build/bench/bench_staging" --benchmark_out="$out" --benchmark_out_format=json \
    --benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true "$@"

counts=$build/instructions.txt
rm -f "$counts"
probe=
for candidate in "$build/bench/instructions" "$build/tests/instructions"; do
    [ -x "$candidate" ] && probe=$candidate && break
done
if [ -n "$probe" ] && command -v valgrind >/dev/null; then
    echo "==> instructions per tensor (callgrind)"
    # MALLOC_PERTURB_ would add a fill of every allocation to the counts.
    MALLOC_PERTURB_=0 bench/instructions.sh "$probe" | tee "$counts"
else
    echo "valgrind or $build/bench/instructions not found: instruction counts not measured"
fi

python3 bench/render.py "$out" docs/performance.md docs/bind_overhead --instructions "$counts" --build "$build"
# The Python step against the same step in C, NumPy and torch (its own section of the page).
echo "==> the Python step (bench/python_step.py)"
"${PYTHON:-/usr/bin/python3}" bench/python_step.py --build "$build" --markdown docs/performance.md
if command -v gnuplot >/dev/null; then
    for plot in bind_overhead step_time; do
        gnuplot "docs/$plot.gp" && rm -f "docs/$plot.gp" "docs/$plot.dat"
    done
else
    echo "gnuplot not found: plots not rendered (docs/*.gp left in place)"
fi
echo "wrote docs/performance.md"
