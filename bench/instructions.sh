#!/usr/bin/env bash
# Instructions per tensor of bind+finish, counted by valgrind's callgrind (deterministic),
# beside a bare prefix sum of the same sizes. Usage: bench/instructions.sh EXECUTABLE [MAX]
# Prints one line per mode (instructions per tensor), then the stream loop's instructions per step; with MAX, exits 1 when RetainedBump costs more than MAX per tensor.
# The plain modes leave Out args as they are (OutputPolicy::kernel_writes_all); "-zeroed" ones zero them
# (the default policy). "mapped": RetainedBump with MapSmall<16384> over the null backends with map_host.
set -euo pipefail
exe=$1
max=${2:-}
tensors=1000
runs=10
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for mode in retained packed mapped per-tensor prefix-sum retained-zeroed packed-zeroed mapped-zeroed; do
    valgrind --tool=callgrind --toggle-collect='*measure_*' --callgrind-out-file="$out/$mode" \
        "$exe" "$mode" "$tensors" "$runs" >/dev/null 2>"$out/$mode.log"
    total=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/$mode.log")
    per=$(awk -v t="$total" -v n=$((tensors * runs)) 'BEGIN { printf "%.1f", t / n }')
    echo "$mode $per"
    if [ "$mode" = retained ] && [ -n "$max" ] && awk -v p="$per" -v m="$max" 'BEGIN { exit !(p > m) }'; then
        echo "RetainedBump bind+finish costs $per instructions per tensor, above $max" >&2
        status=1
    fi
done
# Per step: a pipelined stream loop of 16 tensors on two slots, nothing shared between steps.
steps=1000
for mode in stream-retained stream-packed stream-mapped stream-retained-zeroed stream-packed-zeroed stream-mapped-zeroed; do
    valgrind --tool=callgrind --toggle-collect='*measure_*' --callgrind-out-file="$out/$mode" \
        "$exe" "$mode" 16 "$steps" >/dev/null 2>"$out/$mode.log"
    total=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/$mode.log")
    echo "$mode-per-step $(awk -v t="$total" -v n=$steps 'BEGIN { printf "%.1f", t / n }')"
done
exit $status
