#!/usr/bin/env bash
# Builds and runs bench/gpu/gpu_bench.cpp on a machine with an NVIDIA GPU and libcudart
# (no CUDA headers needed). Needs g++ >= 12 and the range-v3 headers (/usr/include/range, or
# RANGE_V3_INCLUDE=dir). Usage: bench/gpu/run.sh [scale (default 1.0)] [steps (default 4)]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp}/gpu_bench
extra=()
[ -n "${RANGE_V3_INCLUDE:-}" ] && extra+=("-I$RANGE_V3_INCLUDE")
${CXX:-g++} -std=c++20 -O2 -DNDEBUG -Iinclude -Iexamples "${extra[@]}" bench/gpu/gpu_bench.cpp -ldl -pthread -o "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
"$out" "$@"
