#!/usr/bin/env bash
# ./dev install passes Meson options through: -Dpkgconfig.relocatable=true gives a .pc file
# relative to its own location, and an option Meson does not know fails the install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v dpkg-query >/dev/null || { echo "no dpkg-query: ./dev install needs Debian packages"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "dev_install_check: $*" >&2
    exit 1
}

INSTALL_BUILD_DIR=$work/build ./dev install "$work/prefix" -Dpkgconfig.relocatable=true -Dcapi=disabled >"$work/install.log" 2>&1 ||
    fail "./dev install with -Dpkgconfig.relocatable=true failed: $(tail -5 "$work/install.log")"
pc=$(find "$work/prefix" -name devstage.pc | head -1)
[ -n "$pc" ] || fail "no devstage.pc installed"
grep -q '^prefix=${pcfiledir}/' "$pc" || fail "the option was ignored: $(grep '^prefix=' "$pc")"

if INSTALL_BUILD_DIR=$work/build ./dev install "$work/other" -Dno_such_option=true >"$work/bad.log" 2>&1; then
    fail "./dev install accepted an unknown option"
fi
grep -q 'no_such_option' "$work/bad.log" || fail "the failure does not name the option: $(tail -3 "$work/bad.log")"
[ ! -e "$work/other" ] || fail "an install with an unknown option installed something"
echo "./dev install passes Meson options through (a relocatable .pc file; an unknown option fails)"
