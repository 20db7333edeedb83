# SPDX-License-Identifier: Apache-2.0
"""Streams: devstage's own, a runtime's adopted (a torch stream, anything with cuda_stream, a raw
handle) and never destroyed by devstage; a stream of another backend refused, naming both; Python
host functions on a stream, in stream order."""
import ctypes
import gc
import os
import threading

import pytest

import devstage

from conftest import numpy_or_skip


class TorchLikeStream:
    """What torch.cuda.Stream offers devstage: cuda_stream (the cudaStream_t) and device."""

    class _Device:
        def __init__(self, index):
            self.index = index

        def __str__(self):
            return f"cuda:{self.index}"

    def __init__(self, handle, device=0):
        self.cuda_stream = handle
        self.device = self._Device(device)


def native_stream(cudart):
    handle = ctypes.c_void_p()
    assert cudart.cudaStreamCreateWithFlags(ctypes.byref(handle), 1) == 0
    return handle


def test_a_torch_stream_and_a_raw_handle_are_adopted_and_never_destroyed(cuda_standin):
    np = numpy_or_skip()
    gpu, cudart = cuda_standin
    native = native_stream(cudart)
    stager = devstage.Stager(gpu, pipeline_slots=2)
    source = np.arange(256, dtype=np.uint8)
    out = np.zeros(256, np.uint8)
    for stream in (TorchLikeStream(native.value), native.value):
        run = stager.bind([devstage.In(source), devstage.InOut(out)], stream=stream)
        done = stager.finish(run, stream=stream)
        done.wait()
        done.close()
    adopted = gpu.stream(native.value)
    assert adopted.adopted and adopted.native == native.value
    adopted.close()  # devstage's handle only
    del stager, adopted
    gc.collect()
    assert cudart.cudaStreamDestroy(native) == 0  # the runtime's stream was still alive: devstage left it


def test_a_torch_stream_of_another_device_is_refused(cuda_standin):
    gpu, cudart = cuda_standin
    native = native_stream(cudart)
    with pytest.raises(ValueError, match="cuda:1.*cuda device 0"):
        gpu.stream(TorchLikeStream(native.value, device=1))
    cudart.cudaStreamDestroy(native)


def test_a_stream_of_another_backend_is_refused_naming_both():
    np = numpy_or_skip()
    first, second = devstage.sim(), devstage.sim()
    stager = devstage.Stager(first)
    with second.create_stream() as foreign:
        with pytest.raises(ValueError, match=rf"backend 'sim' #{second.number}.*backend 'sim' #{first.number}"):
            stager.bind([devstage.In(np.zeros(8, np.uint8))], stream=foreign)
        # The C interface refuses it as well when the stream's handle is passed directly.
        from devstage._lib import lib, TensorArg  # pylint: disable=import-outside-toplevel
        run = ctypes.c_void_p()
        table = (TensorArg * 1)(TensorArg(None, 0, 0, 0))
        assert lib.devstage_bind_on(stager._h, table, 0, foreign.handle, ctypes.byref(run)) == 2
        assert "'sim'" in lib.devstage_last_message().decode()
    run = stager.bind([devstage.In(np.zeros(8, np.uint8))])  # still usable
    stager.finish(run)


def test_torch_streams_are_refused_by_the_simulator(sim):
    with pytest.raises(ValueError, match="a sim backend"):
        sim.stream(TorchLikeStream(0x1234))
    with pytest.raises(TypeError, match="is not a stream"):
        sim.stream("stream 1")


def test_a_closed_stream_is_refused(sim):
    stream = sim.create_stream()
    stream.close()
    with pytest.raises(ValueError, match="closed"):
        devstage.Stager(sim).bind([], stream=stream)


def test_host_functions_run_in_stream_order(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pipeline_slots=2)
    stream = sim.create_stream()
    seen = []
    threads = set()
    values = np.arange(100, dtype=np.int32)
    out = np.zeros(100, np.int32)
    run = stager.bind([devstage.In(values), devstage.Out(out)], stream=stream)
    source, target = run.device_args[0].numpy(), run.device_args[1].numpy()

    def kernel(source=source, target=target):
        threads.add(threading.get_ident())
        seen.append("kernel")
        target[:] = source * 3  # runs after the uploads: the stream orders it

    sim.launch_host_function(stream, kernel)
    del source, target, kernel
    sim.launch_host_function(stream, lambda: seen.append("after"))
    done = stager.finish(run, stream=stream)
    done.wait()
    assert seen == ["kernel", "after"] and threading.get_ident() not in threads
    assert (out == values * 3).all()
    done.close()
    sim.launch_host_function(stream, lambda: 1 / 0)
    with pytest.raises(devstage.HostFunctionError, match="ZeroDivisionError"):
        stream.synchronize()  # the failure is the stream's, reported once
    assert "ZeroDivisionError" in sim.callback_errors[-1]
    stream.synchronize()
    # A run whose kernel raised: its wait says so.
    run = stager.bind([devstage.Out(out)], stream=stream)
    sim.launch_host_function(stream, lambda: (_ for _ in ()).throw(KeyboardInterrupt("stop")))
    done = stager.finish(run, stream=stream)
    with pytest.raises(devstage.HostFunctionError, match="KeyboardInterrupt"):
        done.wait()
    done.close()
    run = stager.bind([devstage.In(values)], stream=stream)
    with pytest.raises(devstage.Busy, match="Stream.close"):
        stream.close()  # a run is bound on it
    stager.finish(run, stream=stream).close()


def test_host_functions_where_a_backend_has_none(host_device):
    backend = host_device.backend()  # immediate streams, no launch callback
    stream = backend.create_stream()
    ran = []
    try:
        backend.launch_host_function(stream, lambda: ran.append(1))
    except devstage.NotSupported as error:
        assert "python-device" in str(error)
    else:
        assert ran == [1]  # immediate streams: at once
    stream.close()


def test_host_functions_over_python_stream_callbacks(streamed_device):
    np = numpy_or_skip()
    backend = streamed_device.backend()
    assert backend.has_streams
    stager = devstage.Stager(backend, pipeline_slots=2)
    stream = backend.create_stream()
    out = np.zeros(16, np.int64)
    run = stager.bind([devstage.Out(out)], stream=stream)
    view = run.device_args[0].numpy()
    backend.launch_host_function(stream, lambda view=view: view.fill(41))
    del view
    done = stager.finish(run, stream=stream)
    done.wait()
    assert (out == 41).all()
    done.close()
    stream.close()
    del stager
    gc.collect()


def test_events_and_async_copies(sim):
    np = numpy_or_skip()
    stream = sim.create_stream()
    device = sim.device_malloc(4096)
    host = np.arange(4096, dtype=np.uint8)
    back = np.zeros_like(host)
    sim.copy_to_device_async(device, host.ctypes.data, 4096, stream)
    sim.copy_from_device_async(back.ctypes.data, device, 4096, stream)
    with sim.create_event() as event:
        event.record(stream)
        event.synchronize()
        assert event.ready()
        other = sim.create_stream()
        event.wait_on(other)
        other.close()
    assert (back == host).all()
    foreign = devstage.sim().create_stream()
    with pytest.raises(ValueError, match="another|#"):
        sim.create_event().record(foreign)
    sim.device_free(device)
    stream.close()


def test_a_refused_finish_leaves_the_run_live(cuda_standin):
    """Device 1's stream adopted through device 0's backend: the stager refuses the finish, and the
    run is as it was — finished afterwards on its own stream, with its copy-backs."""
    np = numpy_or_skip()
    gpu, cudart = cuda_standin
    other = devstage.cuda(1, os.environ["DEVSTAGE_TEST_CUDART"])
    foreign = other.create_stream()
    adopted = gpu.stream(foreign.native)  # a raw handle: device 0's backend cannot tell it apart
    stager = devstage.Stager(gpu)
    mine = gpu.create_stream()
    out = np.zeros(64, np.uint8)
    run = stager.bind([devstage.In(np.full(64, 7, np.uint8)), devstage.Out(out)], stream=mine)
    with pytest.raises(devstage.InvalidArgument, match="device 1"):
        stager.finish(run, stream=adopted)
    assert run.live
    mine.synchronize()
    gpu.copy_to_device(run.device_pointers[1], np.full(64, 9, np.uint8).ctypes.data, 64)
    done = stager.finish(run, stream=mine)
    done.wait()
    assert (out == 9).all()
    done.close()
    mine.close()
    foreign.close()


def test_a_kernels_failure_belongs_to_its_own_run(sim):
    """Run A's host function raises; run B, later on the same stream, is waited first: B's wait
    is fine (its kernel ran), A's raises — and the stream reports nothing more."""
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pipeline_slots=2)
    stream = sim.create_stream()
    out_a, out_b = np.zeros(16, np.int32), np.zeros(16, np.int32)

    def bound(out, kernel):
        run = stager.bind([devstage.Out(out)], stream=stream)
        view = run.device_args[0].numpy()
        sim.launch_host_function(stream, lambda view=view: kernel(view))
        del view
        return stager.finish(run, stream=stream)

    def broken(view):
        raise RuntimeError("kernel A failed")

    done_a = bound(out_a, broken)
    done_b = bound(out_b, lambda view: view.fill(5))
    done_b.wait()
    assert (out_b == 5).all()
    with pytest.raises(devstage.HostFunctionError, match="kernel A failed"):
        done_a.wait()
    with pytest.raises(devstage.HostFunctionError, match="kernel A failed"):
        done_a.wait()  # the run's result, each time
    stream.synchronize()  # reported by its run already
    done_a.close()
    done_b.close()
    # A kernel launched for no run: the stream's synchronize reports it, once.
    sim.launch_host_function(stream, lambda: 1 / 0)
    with pytest.raises(devstage.HostFunctionError, match="ZeroDivisionError"):
        stream.synchronize()
    stream.synchronize()
    stream.close()


def test_host_functions_share_one_trampoline(streamed_device):
    """Every launch hands the runtime the same C function (a key tells the launches apart): no
    callback object is made per call, and none is left behind once they ran."""
    from devstage import _calls, _lib  # pylint: disable=import-outside-toplevel
    device = streamed_device
    functions, keys = set(), []

    def launch(_context, stream, function, user):
        functions.add(ctypes.cast(function, ctypes.c_void_p).value)
        keys.append(user)
        device.launch_host_function(stream, lambda: function(user))
        return 0

    callbacks = dict(device.callbacks(), create_stream=device.create_stream, destroy_stream=device.destroy_stream,
                     copy_to_device_async=device.copy_async, copy_from_device_async=device.copy_async,
                     create_event=device.create_event, destroy_event=device.destroy_event,
                     record_event=device.record_event, event_ready=device.event_ready,
                     synchronize_event=device.synchronize_event, stream_wait_event=device.stream_wait_event,
                     launch_host_function=_lib.LAUNCH(launch))
    backend = devstage.Backend.from_callbacks(name="python-streams", dlpack_device=(1, 0), **callbacks)
    ran = []
    with backend.create_stream() as stream:
        for i in range(5):
            backend.launch_host_function(stream, lambda i=i: ran.append(i))
        stream.synchronize()
    assert ran == [0, 1, 2, 3, 4]
    assert len(functions) == 1 and len(set(keys)) == 5
    assert not any(key in _calls.host_functions for key in keys)
