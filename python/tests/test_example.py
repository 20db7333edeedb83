# SPDX-License-Identifier: Apache-2.0
"""python/examples/pinned_inputs.py runs end to end (it checks what it staged itself)."""
import os
import subprocess
import sys

import pytest

from conftest import torch_or_skip

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "pinned_inputs.py")


def test_pinned_inputs_example():
    torch_or_skip()
    done = subprocess.run([sys.executable, EXAMPLE, "--scale", "0.0005", "--steps", "2"], capture_output=True,
                          text=True, check=False, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout


DECODE_LOOP = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "decode_loop.py")


def test_decode_loop_example_on_the_simulator():
    pytest.importorskip("numpy", reason="python3-numpy is not installed")
    done = subprocess.run([sys.executable, DECODE_LOOP, "--steps", "12"], capture_output=True, text=True, check=False,
                          timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("PASS"), done.stdout
    assert "1 upload(s), 1 copy-back(s)" in done.stdout, done.stdout
