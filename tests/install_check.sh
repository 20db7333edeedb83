#!/usr/bin/env bash
# Installs devstage (tests, examples and benchmarks off) into a temporary prefix and consumes it:
# - pkg-config: Cflags carry no -std, and a consumer compiling as C++23 stays C++23;
# - CMake find_package, after the installed tree has been moved elsewhere;
# - as a Meson subproject (tests stay off), with range-v3 found through CMake, then with no
#   usable CMake (headers on the include path), then with neither (a clear error).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "install_check: $*" >&2
    exit 1
}
cxx=${CXX:-c++}

meson setup "$work/build" --prefix="$work/prefix" -Dtests=disabled -Dexamples=disabled -Dbench=disabled \
    -Dcapi=disabled >/dev/null  # the header-only package (c_install covers devstage_c)
meson install -C "$work/build" >/dev/null

# pkg-config: the consumer picks its standard (C++20 or later); the .pc file must not pick one.
pc_dir=$(dirname "$(find "$work/prefix" -name devstage.pc | head -1)")
cflags=$(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags devstage)
libs=$(PKG_CONFIG_PATH=$pc_dir pkg-config --libs devstage)
case " $cflags " in *" -std="*) fail "pkg-config --cflags devstage sets the standard: $cflags" ;; esac
std_after_20=c++23
"$cxx" -std=c++23 -E -x c++ /dev/null >/dev/null 2>&1 || std_after_20=c++2b
# shellcheck disable=SC2086
"$cxx" -std=$std_after_20 -DCONSUMER_AFTER_CXX20 tests/consumer/main.cpp $cflags $libs -o "$work/pc_consumer"
"$work/pc_consumer"

# CMake: the package locates the headers from its own directory, so a moved tree still works.
mv "$work/prefix" "$work/moved"
cmake -S tests/consumer -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/moved" >/dev/null
grep -q "^devstage_DIR:PATH=$work/moved/" "$work/consumer/CMakeCache.txt" ||
    fail "find_package(devstage) did not use the moved prefix: $(grep '^devstage_DIR' "$work/consumer/CMakeCache.txt")"
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"

# As a Meson subproject: dependency('devstage') resolves to the override, tests stay off.
consumer=$work/meson_consumer
mkdir -p "$consumer/subprojects"
ln -s "$PWD" "$consumer/subprojects/devstage"
cp tests/consumer/main.cpp "$consumer/"
cat >"$consumer/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
devstage = dependency('devstage', fallback: ['devstage', 'devstage_dep'])
executable('consumer', 'main.cpp', dependencies: devstage)
MESON
meson setup "$consumer/build" "$consumer" >/dev/null
ninja -C "$consumer/build" >/dev/null
"$consumer/build/consumer"
[ ! -e "$consumer/build/subprojects/devstage/tests" ] || fail "tests built in a subproject"

# Without a usable CMake, range-v3 comes from the headers on the compiler's include path.
printf "[binaries]\ncmake = 'false'\n" >"$work/no_cmake.ini"
meson setup "$consumer/build-no-cmake" "$consumer" --native-file "$work/no_cmake.ini" >"$work/no_cmake.log" 2>&1 ||
    fail "setup without CMake failed: $(tail -3 "$work/no_cmake.log")"
grep -q 'range-v3 found: NO' "$work/no_cmake.log" || fail "range-v3 was found with CMake disabled"
ninja -C "$consumer/build-no-cmake" >/dev/null
"$consumer/build-no-cmake/consumer"

# With neither CMake nor the headers, setup stops and names the package to install.
printf "[binaries]\ncmake = 'false'\n[built-in options]\ncpp_args = ['-nostdinc']\n" >"$work/no_range.ini"
if meson setup "$consumer/build-no-range" "$consumer" --native-file "$work/no_range.ini" >"$work/no_range.log" 2>&1; then
    fail "setup succeeded without range-v3"
fi
grep -q 'install librange-v3-dev' "$work/no_range.log" || fail "no hint to install librange-v3-dev: $(tail -3 "$work/no_range.log")"

echo "devstage works installed (pkg-config with the consumer's standard, CMake find_package from a" \
    "moved prefix) and as a Meson subproject (range-v3 through CMake or the include path)"
