# SPDX-License-Identifier: Apache-2.0
"""Stager over the simulator and over a runtime's Python callbacks: synchronous and
stream-ordered runs, and the library's errors as Python exceptions with its messages."""
import gc

import pytest

import devstage

from conftest import numpy_or_skip


def kernel(backend, run, nbytes):
    """out = in + 1 (bytes), on the device, through the backend's copies."""
    np = numpy_or_skip()
    values = np.empty(nbytes, np.uint8)
    backend.copy_from_device(values.ctypes.data, run.device_pointers[0], nbytes)
    values += 1
    backend.copy_to_device(run.device_pointers[1], values.ctypes.data, nbytes)


@pytest.mark.parametrize("strategy,pack_limit", [("retained", 0), ("retained", 16384), ("per_tensor", 0)])
def test_synchronous_runs_over_the_simulator(sim, strategy, pack_limit):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, strategy=strategy, pack_limit=pack_limit)
    for step in range(3):
        source = np.arange(5000, dtype=np.uint8) + step
        out = np.zeros(5000, np.uint8)
        run = stager.bind([devstage.In(source), devstage.Out(out)])
        kernel(sim, run, 5000)
        stager.finish(run)
        assert (out == source + 1).all()
    assert stager.stats["runs"] == 3


def test_runs_on_a_stream(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pipeline_slots=2)
    with sim.create_stream() as stream:
        source = np.full(300, 41, np.uint8)
        out = np.zeros(300, np.uint8)
        run = stager.bind([devstage.In(source), devstage.Out(out)], stream=stream)
        stream.synchronize()
        kernel(sim, run, 300)
        with stager.finish(run, stream=stream) as done:
            done.wait()
            assert done.ready()
        assert (out == 42).all()
        assert stager.stats["async_uploads"] >= 1


def test_runs_over_python_callbacks(host_device):
    np = numpy_or_skip()
    backend = host_device.backend()
    assert backend.name == "python-device" and backend.has_pinned and not backend.has_streams
    stager = devstage.Stager(backend, pack_limit=4096)
    pool = devstage.PinnedPool(backend)
    source = pool.allocate(2000, "uint8")
    np.asarray(source)[:] = 3
    out = bytearray(2000)
    mallocs = []
    for _ in range(3):
        run = stager.bind([devstage.In(source), devstage.Out(out)])
        kernel(backend, run, 2000)
        stager.finish(run)
        mallocs.append(host_device.calls["device_malloc"])
    assert out == bytearray([4]) * 2000
    assert mallocs[0] > 0 and mallocs[2] == mallocs[0]  # retained: no allocation once grown
    with backend.create_stream() as stream:  # immediate: done when the calls return
        run = stager.bind([devstage.In(source), devstage.Out(out)], stream=stream)
        stager.finish(run, stream=stream).close()
    del stager, pool, source
    gc.collect()


def test_device_args_pass_through(sim):
    np = numpy_or_skip()
    weights = sim.device_malloc(4096)
    stager = devstage.Stager(sim)
    host = np.ones(16, np.float32)
    run = stager.bind([devstage.In(host), devstage.Device(weights, 4096)])
    assert run.device_pointers[1] == weights and int(run.device_args[1]) == weights
    assert run.device_pointers[0] not in (0, weights)
    stager.finish(run)
    sim.device_free(weights)


def test_the_librarys_errors_are_exceptions_with_its_messages(sim, host_device):
    np = numpy_or_skip()
    with pytest.raises(devstage.InvalidArgument) as caught:
        devstage.Stager(sim, strategy="per_tensor", pack_limit=1000)
    assert caught.value.status == "invalid_argument"
    assert "pack_limit 1000 needs the retained strategy" in str(caught.value)
    assert "backend 'sim'" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    # Every configuration error at once: the package's and the library's.
    with pytest.raises(devstage.Error) as caught:
        devstage.Stager(host_device.backend(), pipeline_slots=300, strategy="fastest", growth_cap=-1)
    message = str(caught.value)
    assert "strategy 'fastest'" in message and "growth_cap -1" in message and "300 pipeline slots" in message
    with pytest.raises(devstage.Error) as caught:
        devstage.Stager(devstage.Backend.from_callbacks(device_malloc=host_device.device_malloc,
                                                        device_free=host_device.device_free,
                                                        copy_to_device=host_device.copy,
                                                        copy_from_device=host_device.copy), pack_limit=1000)
    assert "pack_limit 1000" in str(caught.value) and "pinned" in str(caught.value)

    stager = devstage.Stager(sim)
    source = np.zeros(64, np.uint8)
    run = stager.bind([devstage.InOut(source)])
    with pytest.raises(devstage.Busy, match="sim"):
        stager.bind([devstage.In(source)])
    stager.finish(run)

    small = devstage.Backend.simulator(device_capacity=1 << 20)
    with pytest.raises(devstage.OutOfMemory, match="1048576|bytes") as caught:
        devstage.Stager(small).bind([devstage.In(np.zeros(4 << 20, np.uint8))])
    assert isinstance(caught.value, MemoryError)

    with pytest.raises(devstage.UnknownPointer, match="did not return"):
        host_device.backend().device_free(12345)

    backend = host_device.backend()
    failing = devstage.Stager(backend)
    host_device.fail_copies = True
    with pytest.raises(devstage.BackendFailure, match="the callback returned -7"):
        failing.bind([devstage.In(source)])
    host_device.fail_copies = False
    failing.finish(failing.bind([devstage.In(source)]))  # usable again


def test_an_exception_in_a_callback_fails_the_call(host_device):
    np = numpy_or_skip()

    def broken_copy(dst, src, nbytes):
        raise RuntimeError("the runtime's copy is broken")

    backend = devstage.Backend.from_callbacks(device_malloc=host_device.device_malloc,
                                              device_free=host_device.device_free,
                                              copy_to_device=broken_copy, copy_from_device=host_device.copy)
    stager = devstage.Stager(backend)
    with pytest.raises(devstage.BackendFailure, match="the callback returned -1"):
        stager.bind([devstage.In(np.zeros(8, np.uint8))])
    assert "the runtime's copy is broken" in backend.callback_errors[0]


def test_bad_python_arguments(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim)
    with pytest.raises(TypeError, match="wrap it as In"):
        stager.bind([np.zeros(4)])
    with pytest.raises(ValueError, match="C-contiguous"):
        stager.bind([devstage.In(np.zeros((4, 4))[:, 1])])
    with pytest.raises(ValueError, match="strategy 'fastest'"):
        devstage.Stager(sim, strategy="fastest")
    with pytest.raises(ValueError, match="read-only"):
        stager.bind([devstage.Out(b"immutable")])
    other = devstage.Stager(sim)
    run = stager.bind([devstage.In(np.zeros(4))])
    with pytest.raises(ValueError, match="another stager"):
        other.finish(run)
    stager.finish(run)
    with pytest.raises(ValueError, match="finished already"):
        stager.finish(run)


def test_ctypes_function_pointers_get_the_context(host_device):
    """A runtime's C hooks (here ctypes callbacks with the C signatures) plug in as they are."""
    np = numpy_or_skip()
    from devstage import _lib
    seen = []

    def device_malloc(context, nbytes):
        seen.append(context)
        return host_device.device_malloc(nbytes)

    hooks = dict(device_malloc=_lib.MALLOC(device_malloc),
                 device_free=_lib.FREE(lambda context, address: host_device.device_free(address)),
                 copy_to_device=_lib.COPY(lambda context, dst, src, n: host_device.copy(dst, src, n)),
                 copy_from_device=_lib.COPY(lambda context, dst, src, n: host_device.copy(dst, src, n)))
    backend = devstage.Backend.from_callbacks(name="hooks", context=0x1234, **hooks)
    stager = devstage.Stager(backend)
    data = np.arange(100, dtype=np.uint8)
    stager.finish(stager.bind([devstage.InOut(data)]))
    assert seen and all(context == 0x1234 for context in seen)
    assert (data == np.arange(100, dtype=np.uint8)).all()


def test_a_failed_wait_keeps_the_run_pending_until_a_wait_succeeds(streamed_device):
    """A wait that fails while the run's work may still run: the completion stays pending, close()
    refuses and keeps the run's memory, and a later wait delivers the outputs."""
    np = numpy_or_skip()
    backend = streamed_device.backend(synchronize=False)  # no device-wide wait to recover with
    stager = devstage.Stager(backend, pack_limit=4096, pipeline_slots=2)
    stream = backend.create_stream()
    source = np.arange(3000, dtype=np.int32)
    out = np.zeros(3000, np.int32)
    packed = np.zeros(16, np.int32)
    run = stager.bind([devstage.In(source), devstage.Out(out), devstage.Out(packed)], stream=stream)
    views = [t.numpy() for t in run.device_args]
    backend.launch_host_function(stream, lambda views=views: (views[1].__setitem__(slice(None), views[0]),
                                                              views[2].fill(7)))
    del views
    done = stager.finish(run, stream=stream)
    streamed_device.failing_waits = 2
    with pytest.raises(devstage.BackendFailure, match="returned -11"):
        done.wait()
    assert done.pending
    with pytest.raises(devstage.BackendFailure):
        done.close()  # refused: the run's memory is still devstage's
    assert done.pending
    done.wait()  # the device answers again: the outputs are delivered, packed ones included
    assert not done.pending
    assert (out == source).all() and (packed == 7).all()
    done.close()
    stream.close()


def test_abandon_lets_go_of_a_run_no_wait_recovers(streamed_device):
    np = numpy_or_skip()
    backend = streamed_device.backend(synchronize=False)
    stager = devstage.Stager(backend)
    stream = backend.create_stream()
    run = stager.bind([devstage.Out(np.zeros(64, np.uint8))], stream=stream)
    done = stager.finish(run, stream=stream)
    streamed_device.failing_waits = 1000
    with pytest.raises(devstage.BackendFailure):
        done.wait()
    stager.abandon()
    with pytest.raises(devstage.BackendFailure, match="abandon"):
        done.wait()
    done.close()
    streamed_device.failing_waits = 0
    stager.finish(stager.bind([devstage.In(b"again")]))
    stream.close()


def test_a_backend_without_streams_reports_no_asynchronous_work(host_device):
    np = numpy_or_skip()
    backend = host_device.backend()
    stager = devstage.Stager(backend, pipeline_slots=2)
    stream = backend.create_stream()
    out = np.zeros(100, np.uint8)
    for _ in range(3):
        run = stager.bind([devstage.In(np.ones(100, np.uint8)), devstage.Out(out)], stream=stream)
        stager.finish(run, stream=stream).close()
    stats = stager.stats
    assert stats["uploads"] == 3 and stats["async_uploads"] == 0 and stats["host_waits"] == 0
    stream.close()
