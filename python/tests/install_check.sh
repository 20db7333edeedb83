#!/usr/bin/env bash
# The Python package installed the two ways Python users install it, each used from outside the
# source tree with DEVSTAGE_C_LIBRARY unset:
# - pip: `pip install --no-build-isolation .` into a fresh venv (offline, with the system's
#   meson-python), the library inside the wheel;
# - Meson: `meson install` into a prefix, the package in its site-packages loading the library
#   from the prefix's library directory (no LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import mesonpy' 2>/dev/null || { echo "no meson-python (Debian: python3-mesonpy)"; exit 77; }
"$python" -c 'import venv, ensurepip' 2>/dev/null || { echo "no venv (Debian: python3-venv)"; exit 77; }
work=$(mktemp -d)
# The two builds sit in the source tree, as the test build does, so that their compiles are the
# same commands and ccache has them.
wheel_build=$(mktemp -d "$PWD/build-python-wheel-XXXXXX")
meson_build=$(mktemp -d "$PWD/build-python-meson-XXXXXX")
trap 'rm -rf "$work" "$wheel_build" "$meson_build"' EXIT
fail() {
    echo "python install_check: $*" >&2
    exit 1
}
unset DEVSTAGE_C_LIBRARY DEVSTAGE_PY_NATIVE PYTHONPATH
use='import devstage, sys
where = devstage.__file__
assert where.startswith(sys.argv[1]), f"devstage imported from {where}, not from {sys.argv[1]}"
backend = devstage.sim()
stager = devstage.Stager(backend, pack_limit=4096)
data = bytearray(range(256)) * 4
out = bytearray(len(data))
run = stager.bind([devstage.In(bytes(data)), devstage.Out(out)])
backend.copy_to_device(run.device_pointers[1], run.device_pointers[0], 0)
stager.finish(run)
import os
assert os.path.exists(os.path.join(os.path.dirname(where), "py.typed")), "py.typed was not installed"
assert devstage._calls.IMPLEMENTATION == sys.argv[2], f"the calls go through {devstage._calls.IMPLEMENTATION}, not {sys.argv[2]}"
print("devstage", devstage.__version__, "from", where, "library", devstage._lib.lib.devstage_path, "calls",
      devstage._calls.IMPLEMENTATION)'
# Where Cython and the interpreter's headers are, the compiled calls are built and installed.
calls=ctypes
command -v cython3 >/dev/null && "$python" -c 'import sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null && calls=native

# pip, into a fresh venv that sees the system's meson-python, NumPy and PyTorch.
"$python" -m venv --system-site-packages "$work/venv" >/dev/null
# (Built as the test build is, so that ccache has the objects.)
"$work/venv/bin/python" -m pip install --no-build-isolation --no-index --no-deps --quiet \
    --config-settings=builddir="$wheel_build" --config-settings=setup-args=-Dbuildtype=debugoptimized . \
    >"$work/pip.log" 2>&1 || fail "pip install failed: $(tail -20 "$work/pip.log")"
(cd "$work" && "$work/venv/bin/python" -c "$use" "$work/venv" "$calls") || fail "the pip-installed package does not work"
(cd "$work" && "$work/venv/bin/python" -c 'import devstage, os; assert os.path.dirname(devstage._lib.lib.devstage_path) == os.path.dirname(devstage.__file__)') ||
    fail "the pip-installed package did not load the library inside it"

# Meson install into a prefix (tests, examples and benchmarks off).
rmdir "$meson_build"
meson setup "$meson_build" --prefix="$work/prefix" -Dtests=disabled -Dexamples=disabled -Dbench=disabled \
    -Dpython=enabled >"$work/setup.log" 2>&1 || fail "meson setup failed: $(tail -5 "$work/setup.log")"
meson install -C "$meson_build" >"$work/install.log" 2>&1 || fail "meson install failed: $(tail -5 "$work/install.log")"
init=$(find "$work/prefix" -path '*devstage/__init__.py' | head -1)
[ -n "$init" ] || fail "meson install did not install the Python package"
site=$(dirname "$(dirname "$init")")
(cd "$work" && PYTHONPATH=$site "$python" -c "$use" "$site" "$calls") || fail "the Meson-installed package does not work"
echo "the Python package works installed with pip (a fresh venv) and with meson install (a prefix)"
