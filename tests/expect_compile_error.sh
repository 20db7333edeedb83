#!/bin/sh
# Usage: expect_compile_error.sh EXPECTED SOURCE COMPILER [FLAGS...]
# Passes when compiling SOURCE fails and the diagnostic mentions EXPECTED.
expected=$1; source=$2; shift 2
out=$("$@" -fsyntax-only "$source" 2>&1)
if [ $? -eq 0 ]; then
    echo "FAIL: $source compiled, but it must not"; exit 1
fi
if printf '%s\n' "$out" | grep -q -- "$expected"; then
    echo "ok: the diagnostic names '$expected'"; exit 0
fi
printf '%s\n' "$out" | head -40
echo "FAIL: the diagnostic does not mention '$expected'"; exit 1
