#!/usr/bin/env bash
# Installs devstage into a temporary prefix and builds a CMake project against it with
# find_package(devstage), and a plain compile with the installed pkg-config file.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
meson setup "$work/build" --prefix="$work/prefix" -Dtests=disabled -Dexamples=disabled -Dbench=disabled >/dev/null
meson install -C "$work/build" >/dev/null
cmake -S tests/consumer -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_STANDARD=20 >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"
pc_dir=$(dirname "$(find "$work/prefix" -name devstage.pc | head -1)")
# shellcheck disable=SC2046
${CXX:-c++} -std=c++20 tests/consumer/main.cpp $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs devstage) -o "$work/pc_consumer"
"$work/pc_consumer"
# As a Meson subproject: dependency('devstage') resolves to the override, tests stay off.
mkdir -p "$work/meson_consumer/subprojects"
ln -s "$PWD" "$work/meson_consumer/subprojects/devstage"
cp tests/consumer/main.cpp "$work/meson_consumer/"
cat > "$work/meson_consumer/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
devstage = dependency('devstage', fallback: ['devstage', 'devstage_dep'])
executable('consumer', 'main.cpp', dependencies: devstage)
MESON
meson setup "$work/meson_consumer/build" "$work/meson_consumer" >/dev/null
ninja -C "$work/meson_consumer/build" >/dev/null
"$work/meson_consumer/build/consumer"
[ ! -e "$work/meson_consumer/build/subprojects/devstage/tests" ] || { echo "tests built in a subproject"; exit 1; }
echo "devstage works installed (CMake find_package, pkg-config) and as a Meson subproject"
