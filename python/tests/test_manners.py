# SPDX-License-Identifier: Apache-2.0
"""The package in Python's terms: messages that name the Python call and argument, close() and
`with`, devstage.cuda() where no GPU is usable, type hints (py.typed), docs/python.md explaining
every stat the package returns; and both ways the package makes its calls (devstage._native and
ctypes) giving the same results."""
import ctypes.util
import inspect
import os
import re

import pytest

import devstage
from devstage import _calls, _lib, backend as backend_module

from conftest import numpy_or_skip

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "docs", "python.md")


def test_messages_name_the_python_call(sim):
    closed = devstage.sim()
    closed.close()
    with pytest.raises(ValueError, match=r"^devstage Stager\(backend\): backend 'sim' #\d+ was closed"):
        devstage.Stager(closed)
    with pytest.raises(ValueError, match=r"^devstage Backend.device_malloc: backend 'sim' #\d+ was closed"):
        closed.device_malloc(16)
    stager = devstage.Stager(sim)
    with pytest.raises(devstage.InvalidArgument) as caught:
        stager.bind([], stream=0x3039)
    assert str(caught.value).startswith("devstage Backend.adopt_stream: ")
    assert "devstage_" not in str(caught.value)
    with pytest.raises(devstage.NotSupported, match=r"^devstage Stager.frame: .*pack_limit 0"):
        stager.frame([devstage.TensorShape(4)])
    with pytest.raises(devstage.InvalidArgument, match=r"^devstage Stager: pack_limit -1 is not a non-negative int"):
        devstage.Stager(sim, pack_limit=-1)


def test_close_and_with(sim):
    np = numpy_or_skip()
    with devstage.Stager(sim, pack_limit=4096, pipeline_slots=2) as stager:
        run = stager.bind([devstage.In(np.ones(8, np.uint8))])
        frame = stager.frame([devstage.TensorShape(8)])
    assert stager.closed and not run.live  # the live run ended without copy-backs
    for call in (lambda: stager.bind([]), lambda: stager.frame([devstage.TensorShape(4)]), stager.release,
                 lambda: stager.stats, lambda: stager.finish(run)):
        with pytest.raises(ValueError, match="closed"):
            call()
    with pytest.raises(ValueError, match="given back"):
        frame.arrays  # pylint: disable=pointless-statement
    stager.close()  # again: nothing
    assert "closed" in repr(stager)
    # An exception leaving the block is not hidden by the close.
    with pytest.raises(KeyError):
        with devstage.Stager(sim) as other:
            raise KeyError("the engine's")
    assert other.closed


def test_cuda_says_plainly_that_no_gpu_is_usable():
    made = backend_module._no_gpu(devstage.NotSupported(  # pylint: disable=protected-access
        "not_supported", "devstage.cuda(0): cuda cudaGetDeviceCount failed on device 0: cudaError 100 (no CUDA-capable "
        "device is detected)"))
    assert str(made).startswith("devstage.cuda(0): no usable NVIDIA GPU here — the NVIDIA driver sees no CUDA device")
    assert "cudaError 100" in str(made)
    other = devstage.NotSupported("not_supported", "devstage.cuda(0): cudaError 2 (out of memory)")
    assert backend_module._no_gpu(other) is other  # pylint: disable=protected-access
    if not ctypes.util.find_library("cudart"):
        pytest.skip("no CUDA runtime installed: the case of a runtime without a driver is not here")
    try:
        gpu = devstage.cuda(0)
    except devstage.LibraryNotFound:
        pytest.skip("the CUDA runtime does not load here")
    except devstage.NotSupported as error:
        assert "no usable NVIDIA GPU here" in str(error), str(error)
        return
    gpu.close()  # a GPU: nothing to say


def test_type_hints_and_py_typed():
    package = os.path.dirname(devstage.__file__)
    assert os.path.exists(os.path.join(package, "py.typed"))
    for cls, names in ((devstage.Stager, ("bind", "frame", "finish", "layout", "release", "close")),
                       (devstage.Completion, ("wait", "ready", "close")), (devstage.Frame, ("write",)),
                       (devstage.Backend, ("launch_host_function", "stream", "create_stream"))):
        for name in names:
            hints = inspect.signature(getattr(cls, name)).return_annotation
            assert hints is not inspect.Signature.empty, f"{cls.__name__}.{name} has no return annotation"


def test_the_docs_explain_every_stat():
    if not os.path.exists(DOCS):
        pytest.skip("docs/python.md is not beside the package")
    with open(DOCS, encoding="utf-8") as text:
        docs = text.read()
    documented = set(re.findall(r"^\| `(\w+)` \|", docs, re.M))
    missing = [name for name in _lib.STAGER_STATS_FIELDS + _lib.PINNED_STATS_FIELDS if name not in documented]
    assert not missing, f"docs/python.md does not explain {missing}"


def steady_loop(np, backend, steps):
    """A steady-state loop and a naive one; what they produced."""
    stager = devstage.Stager(backend, pack_limit=16384, pipeline_slots=2)
    stream = backend.create_stream()
    shapes = [devstage.TensorShape(8, "int32"), devstage.TensorShape((8, 16), "float32", devstage.OUT)]
    layout = stager.layout(shapes)
    seen = []
    for step in range(steps):
        frame = stager.frame(layout if step % 2 else shapes)
        frame.write(0, np.full(8, step, np.int32))
        run = stager.bind(frame, stream)
        ids, out = run.arrays()
        backend.launch_host_function(stream, lambda ids=ids, out=out: out.__setitem__(slice(None), ids[:, None] * 2))
        del ids, out
        done = stager.finish(run, stream)
        done.wait()
        seen.append(frame.arrays[1].copy())
        done.close()
    counts = stager.stats
    stager.close()
    stream.close()
    return seen, counts["uploads"], counts["copy_backs"]


@pytest.mark.skipif(_calls.native is None, reason="devstage._native is not built: only ctypes here")
def test_native_and_ctypes_calls_agree(sim):
    np = numpy_or_skip()
    results = {}
    try:
        for implementation in ("ctypes", "native"):
            _calls.select(implementation)
            results[implementation] = steady_loop(np, devstage.sim(), 6)
    finally:
        _calls.select("native")
    native, through_ctypes = results["native"], results["ctypes"]
    assert all((a == b).all() for a, b in zip(native[0], through_ctypes[0])) and native[1:] == through_ctypes[1:]
    assert all((seen == step * 2).all() for step, seen in enumerate(native[0]))
    with pytest.raises(ValueError, match="not native or ctypes"):
        _calls.select("fortran")
