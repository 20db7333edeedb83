#!/usr/bin/env bash
# Builds bench/gpu/gpu_bench.cpp into one binary that needs only the CUDA runtime and driver at
# run time (loaded with dlopen; libstdc++ and libgcc linked in statically), and runs it.
#
#   bench/gpu/run.sh --build-only        build here (g++ >= 12, range-v3 headers); no GPU needed
#   bench/gpu/run.sh [gpu_bench options] run it on a GPU machine (builds first if it is missing)
#   bench/gpu/run.sh --rebuild [...]     build again, then run
#
# After gpu_bench, where python3 can import torch, torch_copies.py times PyTorch's own
# non_blocking copies of the same sets (GPU_BENCH_TORCH=0 skips it), and, where
# DEVSTAGE_C_LIBRARY names a built libdevstage_c.so, python/examples/decode_loop.py --backend cuda
# times the Python decode loop beside the same loop in plain torch.
# The binary goes to $GPU_BENCH_DIR (default bench/gpu/build/, ignored by git) with a copy of
# libcudart.so.13 when one is found here, which the binary uses where the machine has none.
# Range-v3 headers: /usr/include/range, or RANGE_V3_INCLUDE=dir. See bench/gpu/README.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${GPU_BENCH_DIR:-$root/bench/gpu/build}
bin=$dir/gpu_bench

build() {
    mkdir -p "$dir"
    local extra=() revision
    [ -n "${RANGE_V3_INCLUDE:-}" ] && extra+=("-I$RANGE_V3_INCLUDE")
    revision=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
    echo "building $bin (sources at $revision)"
    "${CXX:-g++}" -std=c++20 -O2 -DNDEBUG -Wall -Wextra -Wpedantic -I"$root/include" -I"$root/examples" \
        "${extra[@]}" "$root/bench/gpu/gpu_bench.cpp" -static-libstdc++ -static-libgcc -ldl -pthread -o "$bin.tmp"
    mv "$bin.tmp" "$bin"
    echo "$revision" > "$dir/revision"
    # A runtime to fall back on where the GPU machine has none (gpu_bench looks next to itself).
    local cudart
    for cudart in "${CUDART_LIBRARY:-}" /usr/local/cuda/lib64/libcudart.so.13 \
        "$(ldconfig -p 2>/dev/null | awk '/libcudart\.so\.13 /{print $NF; exit}')"; do
        if [ -n "$cudart" ] && [ -e "$cudart" ]; then
            cp -L "$cudart" "$dir/libcudart.so.13"
            echo "bundled $cudart"
            break
        fi
    done
}

case "${1:-}" in
    --build-only)
        build
        exit 0
        ;;
    --rebuild)
        shift
        build
        ;;
    *)
        [ -x "$bin" ] || build
        ;;
esac

echo "gpu_bench built from $(cat "$dir/revision" 2>/dev/null || echo unknown), run $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader 2>/dev/null || true
"$bin" "$@"
# PyTorch's non_blocking copies of the same sets, where torch is importable (exit 77: skipped).
if [ "${GPU_BENCH_TORCH:-1}" != 0 ] && python3 -c 'import torch' 2>/dev/null; then
    torch_args=()
    for ((i = 1; i <= $#; i++)); do
        case "${!i}" in
            --steps | --set-steps) j=$((i + 1)); torch_args+=("${!i}" "${!j}") ;;
        esac
    done
    set_scale=()
    for ((i = 1; i <= $#; i++)); do
        [ "${!i}" = --set-scale ] && j=$((i + 1)) && set_scale=(--set-scale "${!j}")
    done
    "$bin" --list-sets "${set_scale[@]}" | python3 "$root/bench/gpu/torch_copies.py" "${torch_args[@]}" || [ $? = 77 ]
else
    echo "torch: not importable here (no PyTorch rows)"
fi
# The Python decode loop (devstage's frame beside plain torch pin_memory + non_blocking copies),
# where torch is importable and a built libdevstage_c is named by DEVSTAGE_C_LIBRARY.
if [ -n "${DEVSTAGE_C_LIBRARY:-}" ] && python3 -c 'import torch' 2>/dev/null; then
    PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$root/python/examples/decode_loop.py" \
        --backend cuda || [ $? = 77 ]
else
    echo "python decode loop: set DEVSTAGE_C_LIBRARY to a built libdevstage_c.so (and have torch) to run it"
fi
