# SPDX-License-Identifier: Apache-2.0
"""Interpreter exit with devstage objects still alive at module level — pools, buffers, views,
stagers, runs, completions, adopted streams, callbacks backends — is silent and safe: exit status
0 and nothing on stderr."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import numpy_or_skip

SCRIPTS = {
    "pinned buffers": """
        import devstage
        backend = devstage.sim()
        pool = devstage.PinnedPool(backend)
        buffer = pool.allocate((64, 64), "float32")
        other = pool.allocate(10)
    """,
    "views and a stager mid-run": """
        import numpy as np, devstage
        backend = devstage.sim()
        pool = devstage.PinnedPool(backend)
        buffer = pool.allocate(4096)
        view = np.asarray(buffer)
        stager = devstage.Stager(backend, pack_limit=4096, pipeline_slots=3)
        stream = backend.create_stream()
        run = stager.bind([devstage.In(buffer), devstage.Out(np.zeros(16, np.uint8))], stream=stream)
        exported = run.device_args[1].numpy()
        done = stager.finish(stager.bind([devstage.In(view[:100])], stream=stream), stream=stream)
        frame = stager.frame([devstage.TensorShape(8, "int32")])
        frame_view = np.asarray(frame[0])
    """,
    "a callbacks backend": """
        import ctypes, devstage
        blocks = {}
        def malloc(n):
            block = ctypes.create_string_buffer(n); blocks[ctypes.addressof(block)] = block
            return ctypes.addressof(block)
        def free(address):
            del blocks[address]
        def copy(dst, src, n):
            ctypes.memmove(dst, src, n)
        backend = devstage.callbacks(device_malloc=malloc, device_free=free, copy_to_device=copy,
                                     copy_from_device=copy, pinned_malloc=malloc, pinned_free=free)
        pool = devstage.PinnedPool(backend)
        buffer = pool.allocate(100)
        stager = devstage.Stager(backend, pack_limit=4096)
        run = stager.bind([devstage.In(buffer)])
    """,
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_interpreter_exit_is_silent(name, tmp_path):
    numpy_or_skip()
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    env = dict(os.environ)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
