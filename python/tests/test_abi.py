# SPDX-License-Identifier: Apache-2.0
"""The package's ctypes structures match include/devstage/c/devstage.h field for field, and every
function the header declares has a prototype in the package: a struct that drifts would let the
library write past what Python allocated."""
import os
import re

import pytest

from devstage import _lib

HEADER = os.environ.get("DEVSTAGE_TEST_HEADER") or os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "include", "devstage", "c", "devstage.h")


def header():
    if not os.path.exists(HEADER):
        pytest.skip("the C header is not beside the package (an installed package is tested elsewhere)")
    with open(HEADER, encoding="utf-8") as text:
        return re.sub(r"/\*.*?\*/", "", text.read(), flags=re.S)


def fields(source, name):
    body = re.search(r"typedef struct " + name + r" \{(.*?)\} " + name + ";", source, re.S).group(1)
    names = []
    for declaration in body.split(";"):
        declaration = declaration.strip()
        if not declaration:
            continue
        pointer = re.search(r"\(\*(\w+)\)", declaration)
        names.append(pointer.group(1) if pointer else re.findall(r"(\w+)\s*$", declaration)[0])
    return names


@pytest.mark.parametrize("c_name,structure", [
    ("devstage_callbacks", _lib.Callbacks), ("devstage_stager_stats", _lib.StagerStats),
    ("devstage_pinned_stats", _lib.PinnedStats), ("devstage_stager_config", _lib.StagerConfig),
    ("devstage_tensor_arg", _lib.TensorArg), ("devstage_tensor_shape", _lib.TensorShape),
    ("devstage_backend_info", _lib.BackendInfo)])
def test_structures_match_the_header(c_name, structure):
    assert [name for name, _ in structure._fields_] == fields(header(), c_name)


def test_every_function_has_a_prototype():
    declared = set(re.findall(r"DEVSTAGE_C_API\s+[\w\s\*]+?\b(devstage_\w+)\s*\(", header()))
    assert declared, "no function found in the header"
    assert sorted(declared - set(_lib._PROTOTYPES)) == []  # pylint: disable=protected-access
    assert sorted(set(_lib._PROTOTYPES) - declared) == []  # pylint: disable=protected-access


def test_the_step_calls_name_functions_of_the_header():
    """The compiled calls take the library's functions by name: each is declared in the header,
    and the compiled module offers every call the ctypes one does."""
    from devstage import _calls  # pylint: disable=import-outside-toplevel
    declared = set(re.findall(r"DEVSTAGE_C_API\s+[\w\s\*]+?\b(devstage_\w+)\s*\(", header()))
    assert sorted(set(_calls._c) - declared) == []  # pylint: disable=protected-access
    if _calls.native is not None:
        assert [name for name in _calls._CTYPES if not hasattr(_calls.native, name)] == []  # pylint: disable=protected-access
