#!/bin/sh
# Usage: expect_cxx20_error.sh HEADER... -- COMPILER [FLAGS...]
# Passes when each HEADER, compiled as C++17, fails with exactly one error, the one saying that
# devstage needs C++20.
headers=
while [ "$1" != "--" ]; do headers="$headers $1"; shift; done
shift
status=0
for header in $headers; do
    out=$(printf '#include <%s>\n' "$header" | "$@" -std=c++17 -x c++ -fsyntax-only - 2>&1)
    if [ $? -eq 0 ]; then
        echo "FAIL: $header compiled as C++17"; status=1; continue
    fi
    errors=$(printf '%s\n' "$out" | grep -c ': error')
    first=$(printf '%s\n' "$out" | grep -m1 ': error')
    case "$errors:$first" in
        "1:"*"devstage needs C++20"*) echo "ok: $header: $first" ;;
        *) printf '%s\n' "$out" | head -20
           echo "FAIL: $header: $errors error lines; expected one, saying that devstage needs C++20"; status=1 ;;
    esac
done
exit $status
