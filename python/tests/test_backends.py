# SPDX-License-Identifier: Apache-2.0
"""Every backend of the C interface from Python: the simulator, CUDA and Ascend (over the stand-in
runtimes; a clear LibraryNotFound naming the library where the runtime is missing), a runtime's
callbacks with and without streams; and where the package finds libdevstage_c."""
import os
import subprocess
import sys

import pytest

import devstage
from devstage import _lib

from conftest import numpy_or_skip


def test_kinds_and_devices(sim, cuda_standin, ascend_standin, host_device):
    assert (sim.kind, sim.device, sim.dlpack_device) == ("sim", 0, (1, 0))
    gpu, _ = cuda_standin
    npu, _ = ascend_standin
    assert (gpu.kind, gpu.name) == ("cuda", "cuda")
    assert (npu.kind, npu.name) == ("ascend", "ascend")
    backend = host_device.backend()
    assert backend.kind == "callbacks" and backend.dlpack_device == (1, 0)
    assert repr(sim).startswith("<devstage backend 'sim' #")


@pytest.mark.parametrize("make,library", [(devstage.cuda, "libcudart"), (devstage.ascend, "libascendcl")])
def test_a_missing_runtime_names_the_library_it_looked_for(make, library, tmp_path):
    missing = tmp_path / f"{library}.so"
    with pytest.raises(devstage.LibraryNotFound) as caught:
        make(0, missing)
    assert str(missing) in str(caught.value)
    assert caught.value.status == "library_not_found" and isinstance(caught.value, ImportError)


def test_staging_over_every_backend(sim, cuda_standin, ascend_standin, host_device, streamed_device):
    np = numpy_or_skip()
    for backend in (sim, cuda_standin[0], ascend_standin[0], host_device.backend(), streamed_device.backend()):
        for pack_limit in (0, 4096):
            stager = devstage.Stager(backend, pack_limit=pack_limit, pipeline_slots=2)
            source = np.arange(1000, dtype=np.int16)
            out = np.zeros(1000, np.int16)
            run = stager.bind([devstage.In(source), devstage.Out(out)])
            written = source + 1
            backend.copy_to_device(run.device_pointers[1], written.ctypes.data, source.nbytes)
            stager.finish(run)
            assert (out == source + 1).all(), (backend, pack_limit)


def test_the_library_search_and_its_hint(tmp_path):
    """Without DEVSTAGE_C_LIBRARY and with nothing to find, the hint names the library path."""
    env = dict(os.environ, DEVSTAGE_C_LIBRARY=str(tmp_path / "libdevstage_c.so"))
    package = os.path.dirname(os.path.dirname(devstage.__file__))
    env["PYTHONPATH"] = package
    done = subprocess.run([sys.executable, "-c", "import devstage"], env=env, capture_output=True, text=True,
                          check=False, cwd=tmp_path)
    assert done.returncode != 0
    assert "LibraryNotFound" in done.stderr and "DEVSTAGE_C_LIBRARY" in done.stderr
    assert "LD_LIBRARY_PATH" in done.stderr and "PREFIX/lib" in done.stderr
    assert str(tmp_path / "libdevstage_c.so") in done.stderr


def test_the_loaded_library_is_named():
    assert os.path.exists(_lib.lib.devstage_path) or "libdevstage_c" in _lib.lib.devstage_path
