# SPDX-License-Identifier: Apache-2.0
"""A run's device args through DLPack: the backend's real device type (kDLCPU for the simulator's
host-memory device, kDLCUDA with the device id for CUDA, kDLExtDev for Ascend as torch_npu reads
it), zero-copy, shape and dtype kept; and the lifetime: a tensor keeps the run's memory valid —
a synchronous finish is refused while one lives, a finish on a stream waits for it, a finished
run's args cannot be exported."""
import ctypes
import gc

import pytest

import devstage
from devstage import _dlpack

from conftest import numpy_or_skip, torch_or_skip


def consume(capsule):
    """A DLPack consumer written here: takes the capsule over, returns (its DLTensor fields, a
    function that gives it back)."""
    imported = _dlpack.Imported(capsule)
    return imported, imported.close


def test_simulator_args_are_cpu_tensors_of_the_staged_memory(sim):
    torch = torch_or_skip()
    np = numpy_or_skip()
    stager = devstage.Stager(sim)
    tokens = np.arange(8, dtype=np.int32)
    logits = np.zeros((2, 4), np.float32)
    run = stager.bind([devstage.In(tokens), devstage.Out(logits)])
    assert run.device_args[0].__dlpack_device__() == (1, 0)
    ids = torch.from_dlpack(run.device_args[0])
    out = torch.from_dlpack(run.device_args[1])
    assert ids.data_ptr() == run.device_pointers[0] and ids.dtype == torch.int32 and tuple(ids.shape) == (8,)
    assert out.dtype == torch.float32 and tuple(out.shape) == (2, 4)
    out.copy_((ids[:8].float() * 2).reshape(2, 4))  # the "kernel", on the staged memory
    with pytest.raises(devstage.Busy, match="still alive"):
        stager.finish(run)
    assert run.live
    del ids, out
    stager.finish(run)
    assert (logits == (np.arange(8, dtype=np.float32) * 2).reshape(2, 4)).all()
    with pytest.raises(BufferError, match="finished run"):
        torch.from_dlpack(run.device_args[0])
    assert _dlpack.exported() == 0


def test_numpy_views_of_host_visible_device_memory_count_as_exports(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim)
    out = np.zeros(16, np.uint8)
    run = stager.bind([devstage.Out(out)])
    view = run.device_args[0].numpy()
    view[:] = 9
    with pytest.raises(devstage.Busy):
        stager.finish(run)
    del view
    gc.collect()
    stager.finish(run)
    assert (out == 9).all()
    run = stager.bind([devstage.In(out)])
    view = np.asarray(run.device_args[0])  # __array__: the same kind of view
    assert (view == 9).all()
    with pytest.raises(devstage.Busy):
        stager.finish(run)
    del view
    stager.finish(run)


def test_a_finish_on_a_stream_waits_for_the_exported_tensors(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pipeline_slots=2)
    stream = sim.create_stream()
    out = np.zeros(64, np.int32)
    run = stager.bind([devstage.Out(out)], stream=stream)
    view = run.device_args[0].numpy()
    sim.launch_host_function(stream, lambda view=view: view.__setitem__(slice(None), 5))
    done = stager.finish(run, stream=stream)  # deferred: `view` is alive (here and in the host function)
    assert done.pending and not done.ready()
    with pytest.raises(devstage.Busy, match="still alive"):
        done.wait()  # the stream ran the host function; this test still holds `view`
    del view
    gc.collect()
    done.wait()
    assert (out == 5).all()
    done.close()
    stream.close()


def test_host_functions_give_their_tensors_back_when_they_return(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim)
    stream = sim.create_stream()
    out = np.zeros(32, np.float32)
    for step in range(5):
        run = stager.bind([devstage.Out(out)], stream=stream)
        view = run.device_args[0].numpy()  # exported before the finish: held by the host function only
        sim.launch_host_function(stream, lambda view=view, step=step: view.fill(step))
        del view
        done = stager.finish(run, stream=stream)  # enqueued once the host function has returned
        done.wait()
        assert (out == step).all()
        done.close()
    assert not sim.callback_errors
    run = stager.bind([devstage.Out(out)], stream=stream)
    done = stager.finish(run, stream=stream)
    with pytest.raises(BufferError, match="finished run"):
        run.device_args[0].numpy()  # a finish asked for: no new exports
    done.close()
    stream.close()


def test_cuda_args_are_kdlcuda_with_the_device_id(cuda_standin):
    np = numpy_or_skip()
    gpu, _ = cuda_standin
    assert (gpu.kind, gpu.device, gpu.dlpack_device) == ("cuda", 0, (2, 0))
    stager = devstage.Stager(gpu, pack_limit=4096)
    source = np.arange(20, dtype=np.float16).reshape(4, 5)
    out = np.zeros(6, np.int64)
    run = stager.bind([devstage.In(source), devstage.Out(out)])
    arg = run.device_args[0]
    assert arg.__dlpack_device__() == (2, 0)
    tensor, give_back = consume(arg.__dlpack__())
    assert tensor.device == (2, 0) and tensor.data == run.device_pointers[0]
    assert tensor.shape == (4, 5) and tensor.dtype == (2, 16, 1) and tensor.strides is None
    staged = np.empty_like(source)  # the stand-in's device memory is host memory: the consumer reads it
    ctypes.memmove(staged.ctypes.data, tensor.data, staged.nbytes)
    assert (staged == source).all()
    with pytest.raises(devstage.Busy):
        stager.finish(run)
    give_back()
    result, give_back = consume(run.device_args[1].__dlpack__())
    ctypes.memmove(result.data, np.arange(6, dtype=np.int64).ctypes.data, 48)
    give_back()
    stager.finish(run)
    assert (out == np.arange(6)).all()


def test_a_consumer_stream_is_ordered_after_the_uploads(cuda_standin):
    np = numpy_or_skip()
    gpu, cudart = cuda_standin
    native = ctypes.c_void_p()
    assert cudart.cudaStreamCreateWithFlags(ctypes.byref(native), 1) == 0
    copy = gpu.create_stream()
    stager = devstage.Stager(gpu)
    run = stager.bind([devstage.In(np.ones(32, np.uint8))], stream=copy)
    tensor, give_back = consume(run.device_args[0].__dlpack__(stream=native.value))  # ordered: no error
    give_back()
    with pytest.raises(devstage.InvalidArgument, match="not a live stream"):
        run.device_args[0].__dlpack__(stream=0xDEAD0000)  # not a stream of the runtime: the run stays live
    done = stager.finish(run, stream=copy)
    done.wait()
    done.close()
    copy.close()
    assert cudart.cudaStreamDestroy(native) == 0


def test_cpu_torch_cannot_import_a_cuda_capsule(cuda_standin):
    torch = torch_or_skip()
    np = numpy_or_skip()
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    gpu, _ = cuda_standin
    stager = devstage.Stager(gpu)
    run = stager.bind([devstage.In(np.ones(8, np.float32))])
    with pytest.raises((RuntimeError, AssertionError, BufferError)):
        torch.from_dlpack(run.device_args[0])
    gc.collect()
    stager.finish(run)


def test_ascend_args_are_ext_dev_as_torch_npu_reads_them(ascend_standin):
    np = numpy_or_skip()
    npu, _ = ascend_standin
    assert (npu.kind, npu.dlpack_device) == ("ascend", (12, 0))
    stager = devstage.Stager(npu)
    run = stager.bind([devstage.In(np.ones((3, 3), np.float32))])
    tensor, give_back = consume(run.device_args[0].__dlpack__())
    assert tensor.device == (12, 0) and tensor.shape == (3, 3)
    give_back()
    stager.finish(run)


def test_release_is_refused_while_a_run_is_exported(sim):
    torch = torch_or_skip()
    stager = devstage.Stager(sim)
    run = stager.bind([devstage.In(b"12345678")])
    tensor = torch.from_dlpack(run.device_args[0])
    with pytest.raises(devstage.Busy):
        stager.release()
    del tensor
    stager.release()  # ends the live run without copying back
    assert not run.live
    with pytest.raises(ValueError, match="finished already"):
        stager.finish(run)
