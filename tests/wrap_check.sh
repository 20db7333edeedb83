#!/usr/bin/env bash
# docs/devstage.wrap works as shipped but for its url: a consumer with it in subprojects/ (the
# url pointed at this checkout) finds devstage with a plain dependency('devstage') and builds.
# The subproject is a git clone, so it holds what is committed here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
git rev-parse --verify -q HEAD >/dev/null 2>&1 || { echo "not a git checkout: nothing to clone"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "wrap_check: $*" >&2
    exit 1
}
consumer=$work/consumer
mkdir -p "$consumer/subprojects"
grep -q '^url = ' docs/devstage.wrap || fail "docs/devstage.wrap has no url line"
sed "s|^url = .*|url = $PWD|" docs/devstage.wrap >"$consumer/subprojects/devstage.wrap"
cp tests/consumer/main.cpp "$consumer/"
cat >"$consumer/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
executable('consumer', 'main.cpp', dependencies: dependency('devstage'))
MESON
# --force-fallback-for: a devstage installed on this machine must not stand in for the wrap.
meson setup "$consumer/build" "$consumer" --force-fallback-for=devstage >"$work/setup.log" 2>&1 ||
    fail "setup failed: $(tail -5 "$work/setup.log")"
grep -q 'Dependency devstage found: YES .*(overridden)' "$work/setup.log" ||
    fail "devstage did not come from the wrap: $(grep -i devstage "$work/setup.log" | tail -3)"
ninja -C "$consumer/build" >"$work/build.log" 2>&1 || fail "build failed: $(tail -5 "$work/build.log")"
"$consumer/build/consumer"
echo "docs/devstage.wrap: dependency('devstage') is provided by the subproject it clones"
