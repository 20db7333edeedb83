# SPDX-License-Identifier: Apache-2.0
"""python/examples/pinned_inputs.py runs end to end (it checks what it staged itself)."""
import os
import subprocess
import sys

from conftest import torch_or_skip

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "pinned_inputs.py")


def test_pinned_inputs_example():
    torch_or_skip()
    done = subprocess.run([sys.executable, EXAMPLE, "--scale", "0.0005", "--steps", "2"], capture_output=True,
                          text=True, check=False, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
