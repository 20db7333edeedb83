#!/usr/bin/env bash
# Instructions a checked handle adds to a call of the C interface, counted by valgrind's
# callgrind (deterministic): devstage_run_slot (the guard, the look-up of its run, a read, the
# report) less devstage_run_destroy(NULL) (the guard and the report alone), per call; and a
# whole devstage_stager_stats_get. Usage: handle_instructions.sh EXECUTABLE [MAX]; with MAX,
# exits 1 when the look-up costs more than MAX instructions.
set -euo pipefail
exe=$1
max=${2:-}
calls=100000
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A per
for mode in baseline run_slot stats; do
    valgrind --tool=callgrind --toggle-collect='measure_*' --callgrind-out-file="$out/$mode" \
        "$exe" "$mode" "$calls" >/dev/null 2>"$out/$mode.log"
    total=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/$mode.log")
    per[$mode]=$(awk -v t="$total" -v n=$calls 'BEGIN { printf "%.1f", t / n }')
    echo "$mode ${per[$mode]} instructions per call"
done
check=$(awk -v a="${per[run_slot]}" -v b="${per[baseline]}" 'BEGIN { printf "%.1f", a - b }')
echo "handle check (with the slot read) $check instructions per call"
if [ -n "$max" ] && awk -v c="$check" -v m="$max" 'BEGIN { exit !(c > m) }'; then
    echo "a checked handle costs $check instructions per call, above $max" >&2
    exit 1
fi
