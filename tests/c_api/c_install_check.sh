#!/usr/bin/env bash
# Installs the build tree BUILD (prefix PREFIX, libdir LIBDIR) into a temporary DESTDIR, the
# same files `meson install` puts in PREFIX, and builds programs against that copy only:
# - pkg-config devstage-c: the C99 consumer (gcc -std=c99 -Wall -Werror), shared and static
#   (the static one runs with no libdevstage_c.so in reach), and the C++17 consumer;
# - CMake find_package(devstage): the C99 consumer on devstage::devstage_c and the C++17 one on
#   devstage::devstage_c_static, from an installed tree that is not where it was configured for.
# Usage: c_install_check.sh BUILD PREFIX LIBDIR
set -euo pipefail
build=$1 prefix=$2 libdir=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "c_install_check: $*" >&2
    exit 1
}
cc=${CC:-gcc}
cxx=${CXX:-g++}

meson install -C "$build" --no-rebuild --destdir "$work/dest" >"$work/install.log" 2>&1 ||
    fail "meson install failed: $(tail -5 "$work/install.log")"
root=$work/dest$prefix
lib=$root/$libdir
[ "${libdir#/}" = "$libdir" ] || lib=$work/dest$libdir
[ -f "$root/include/devstage/c/devstage.h" ] || fail "devstage/c/devstage.h was not installed"
[ -f "$lib/libdevstage_c.a" ] || fail "libdevstage_c.a was not installed in $lib"
ls "$lib"/libdevstage_c.so.* >/dev/null 2>&1 || fail "libdevstage_c.so was not installed in $lib"

# pkg-config, with the installed copy's prefix.
pc() { PKG_CONFIG_PATH=$lib/pkgconfig pkg-config --define-variable=prefix="$root" "$@" devstage-c; }
pc --exists || fail "no devstage-c.pc in $lib/pkgconfig"
# shellcheck disable=SC2046: one flag per word
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror -I"$here" "$here/consumer.c" "$here/fake_device.c" \
    $(pc --cflags) $(pc --libs) -pthread -o "$work/c_shared"
LD_LIBRARY_PATH=$lib "$work/c_shared"
private=$(pc --static --libs | sed 's/-ldevstage_c//; s/-L[^ ]*//g')
# shellcheck disable=SC2046,SC2086
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror -I"$here" "$here/consumer.c" "$here/fake_device.c" \
    $(pc --cflags) "$lib/libdevstage_c.a" $private -o "$work/c_static"
if ldd "$work/c_static" | grep -q devstage; then fail "the static consumer links libdevstage_c.so"; fi
"$work/c_static"
# shellcheck disable=SC2046
"$cxx" -std=c++17 -Wall -Wextra -pedantic -Werror "$here/consumer17.cpp" $(pc --cflags) $(pc --libs) -o "$work/cxx17"
LD_LIBRARY_PATH=$lib "$work/cxx17"

# CMake: the package finds the library and headers relative to its own directory.
CC=$cc CXX=$cxx cmake -S "$here/cmake_consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$root" >"$work/cmake.log" 2>&1 ||
    fail "cmake configure failed: $(tail -5 "$work/cmake.log")"
cmake --build "$work/cmake" >"$work/cmake_build.log" 2>&1 || fail "cmake build failed: $(tail -20 "$work/cmake_build.log")"
"$work/cmake/c_consumer"
"$work/cmake/cxx17_consumer"
echo "devstage_c works installed: C99 and C++17 consumers through pkg-config (shared and static) and CMake"
