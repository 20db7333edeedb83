# SPDX-License-Identifier: Apache-2.0
"""What a new user does wrong, or unusually, and what devstage must do then: zero-byte tensors
exported, a DLPack consumer that refuses a capsule, Device() shapes that do not fit, a dropped
completion whose kernel still holds tensors, callbacks returning nonsense, a stager used from two
threads, leaks, and interpreter exit with Python work still queued."""
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

import devstage
from devstage import _dlpack

from conftest import HostDevice, numpy_or_skip, torch_or_skip


def test_zero_byte_args_export_and_finish(sim):
    torch = torch_or_skip()
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=4096)
    run = stager.bind([devstage.In(np.zeros(0, np.float32)), devstage.Out(np.zeros(4, np.float32))])
    empty = torch.from_dlpack(run[0])
    assert empty.numel() == 0 and run[0].numpy().shape == (0,)
    del empty
    stager.finish(run)  # nothing of a zero-byte arg to keep valid
    frame = stager.frame([devstage.TensorShape((0,), "int32"), devstage.TensorShape(4, "int32")])
    assert np.asarray(frame[0]).shape == (0,)
    done = stager.finish(stager.bind(frame))
    assert done is None
    stager.finish(stager.bind([devstage.In(np.ones(4, np.int32))]))  # the slot is free again


def test_a_consumer_that_refuses_the_capsule_leaves_nothing_exported(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim)
    out = devstage.PinnedPool(sim).allocate(8, "bfloat16")
    run = stager.bind([devstage.Out(out)])
    with pytest.raises(Exception) as refused:  # NumPy has no bfloat16
        np.from_dlpack(run[0])
    assert not isinstance(refused.value, SystemError), refused.value
    stager.finish(run)
    assert _dlpack.exported() == 0


@pytest.mark.parametrize("shape,dtype,message", [((1000,), "float64", "8000 bytes, but nbytes is 16"),
                                                 ((-1,), "uint8", "negative"), (None, "float64", "whole number")])
def test_device_args_must_fit_their_bytes(sim, shape, dtype, message):
    address = sim.device_malloc(16 if dtype != "float64" or shape else 12)
    with pytest.raises(ValueError, match=message):
        devstage.Stager(sim).bind([devstage.Device(address, 16 if shape or dtype != "float64" else 12, shape=shape,
                                                   dtype=dtype)])
    sim.device_free(address)


def test_a_dropped_completion_still_delivers_when_its_kernel_let_go(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim)
    stream = sim.create_stream()
    source = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    run = stager.bind([devstage.In(source), devstage.Out(out)], stream=stream)
    views = [t.numpy() for t in run.device_args]

    def kernel(views=views):
        time.sleep(0.2)
        views[1][:] = views[0] + 1

    sim.launch_host_function(stream, kernel)
    del views, kernel
    done = stager.finish(run, stream=stream)  # deferred: the kernel holds the views
    del done  # dropped unwaited
    stream.synchronize()
    assert stager.stats["runs"] == 1  # a call of the stager: the finish is enqueued, then waited for
    assert (out == source + 1).all()
    del run
    gc.collect()
    stream.close()


def test_callbacks_returning_nonsense_fail_the_call(host_device):
    np = numpy_or_skip()
    callbacks = host_device.callbacks()
    for bad in (1.5, "0x1000", -16):
        callbacks["device_malloc"] = lambda nbytes, bad=bad: bad
        backend = devstage.callbacks(name="nonsense", **callbacks)
        with pytest.raises(devstage.OutOfMemory):
            devstage.Stager(backend).bind([devstage.In(np.zeros(64, np.uint8))])
        assert "not an address" in backend.callback_errors[-1]
    callbacks = host_device.callbacks()
    callbacks["copy_to_device"] = lambda dst, src, n: "fine"
    backend = devstage.callbacks(name="nonsense", **callbacks)
    with pytest.raises(devstage.BackendFailure):
        devstage.Stager(backend).bind([devstage.In(np.zeros(64, np.uint8))])


def test_a_stager_used_from_two_threads_at_once_is_refused(sim, calls):  # pylint: disable=unused-argument
    numpy_or_skip()
    stager = devstage.Stager(sim)
    stream = sim.create_stream()
    started, release = threading.Event(), threading.Event()
    out = devstage.PinnedPool(sim).allocate(4)  # pinned: the copy-back does not block the host (pageable would)
    run = stager.bind([devstage.Out(out)], stream=stream)
    sim.launch_host_function(stream, lambda: (started.set(), release.wait(5)))
    done = stager.finish(run, stream=stream)
    waiter = threading.Thread(target=done.wait)
    waiter.start()
    started.wait(5)
    time.sleep(0.05)  # the waiter is inside wait()
    with pytest.raises(devstage.Busy, match="another thread"):
        stager.bind([devstage.In(b"x")])
    release.set()
    waiter.join()
    done.close()
    stager.finish(stager.bind([devstage.In(b"x")]))  # usable again
    stream.close()


def test_leaks_are_reported(host_device):
    backend = host_device.backend()
    backend.device_malloc(100)  # never freed
    with pytest.raises(devstage.Leaked, match="never freed"):
        backend.close()
    assert not host_device.device  # freed through the callbacks
    other = HostDevice().backend()
    other.device_malloc(10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del other
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "never freed" in str(w.message) for w in caught)


EXIT_SCRIPTS = {
    "a host function still queued": """
        import time, devstage
        backend = devstage.sim()
        stream = backend.create_stream()
        backend.launch_host_function(stream, lambda: time.sleep(0.3))
    """,
    "a live run over Python stream threads": """
        import sys, numpy as np, devstage
        sys.path.insert(0, {tests!r})
        from conftest import StreamedDevice
        device = StreamedDevice()
        backend = device.backend()
        stager = devstage.Stager(backend, pipeline_slots=2)
        stream = backend.create_stream()
        run = stager.bind([devstage.In(np.ones(64, np.uint8)), devstage.Out(np.zeros(64, np.uint8))], stream=stream)
        done = stager.finish(stager.bind([devstage.In(np.ones(8, np.uint8))], stream=stream), stream=stream)
    """,
}


@pytest.mark.parametrize("name", list(EXIT_SCRIPTS))
def test_exit_with_python_work_in_flight(name, tmp_path):
    numpy_or_skip()
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(EXIT_SCRIPTS[name]).format(tests=os.path.dirname(__file__)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
