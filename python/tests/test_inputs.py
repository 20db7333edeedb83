# SPDX-License-Identifier: Apache-2.0
"""What an arg can be: devstage's pinned buffers, torch CPU tensors (pinned or not), NumPy arrays,
anything with __dlpack__ or the buffer protocol; read-only memory as an In, never as an Out or
InOut; the shape and dtype travel with the arg to its device tensor."""
import array
import ctypes
import mmap

import pytest

import devstage

from conftest import numpy_or_skip, torch_or_skip


def staged_bytes(backend, tensor):
    """The bytes the device holds for `tensor` staged as an In."""
    stager = devstage.Stager(backend)
    run = stager.bind([devstage.In(tensor)])
    arg = run.device_args[0]
    out = bytearray(arg.nbytes)
    if arg.nbytes:
        backend.copy_from_device(ctypes.addressof((ctypes.c_char * arg.nbytes).from_buffer(out)), arg.data_ptr,
                                 arg.nbytes)
    shape, dtype = arg.shape, arg.dtype
    stager.finish(run)
    return bytes(out), shape, dtype


def test_read_only_inputs_are_staged(sim):
    np = numpy_or_skip()
    frozen = np.arange(16, dtype=np.int32)
    frozen.flags.writeable = False
    assert staged_bytes(sim, frozen) == (frozen.tobytes(), (16,), "int32")
    assert staged_bytes(sim, b"immutable bytes!") == (b"immutable bytes!", (16,), "uint8")
    view = memoryview(bytearray(b"abcdefgh")).toreadonly()
    assert staged_bytes(sim, view)[0] == b"abcdefgh"


@pytest.mark.parametrize("make", ["bytes", "numpy", "memoryview"])
@pytest.mark.parametrize("wrap", [devstage.Out, devstage.InOut])
def test_read_only_outputs_are_refused(sim, make, wrap):
    np = numpy_or_skip()
    if make == "bytes":
        target = bytes(32)
    elif make == "numpy":
        target = np.zeros(8, np.float32)
        target.flags.writeable = False
    else:
        target = memoryview(bytearray(32)).toreadonly()
    stager = devstage.Stager(sim)
    with pytest.raises(ValueError, match="read-only: an Out or InOut arg is written"):
        stager.bind([wrap(target)])
    stager.finish(stager.bind([devstage.In(np.zeros(4, np.uint8))]))  # nothing was left bound


def test_buffer_protocol_objects_keep_shape_and_dtype(sim):
    floats = array.array("f", [1.5, 2.5, 3.5])
    data, shape, dtype = staged_bytes(sim, floats)
    assert data == floats.tobytes() and shape == (3,) and dtype == "float32"
    mapped = mmap.mmap(-1, 4096)
    mapped[:5] = b"hello"
    assert staged_bytes(sim, mapped)[0][:5] == b"hello"
    grid = memoryview(bytearray(range(12))).cast("B", (3, 4))
    assert staged_bytes(sim, grid)[1:] == ((3, 4), "uint8")


def test_a_bytearray_cannot_be_resized_while_its_run_holds_it(sim):
    buffer = bytearray(64)
    stager = devstage.Stager(sim)
    run = stager.bind([devstage.Out(buffer)])
    with pytest.raises(BufferError):
        buffer.extend(b"more")  # the run holds an export of its buffer
    stager.finish(run)
    buffer.extend(b"more")


def test_numpy_arrays_keep_shape_and_dtype(sim):
    np = numpy_or_skip()
    for dtype in (np.int8, np.uint16, np.int64, np.float16, np.float64):
        source = np.arange(24, dtype=dtype).reshape(2, 3, 4)
        data, shape, name = staged_bytes(sim, source)
        assert data == source.tobytes() and shape == (2, 3, 4) and name == np.dtype(dtype).name
    with pytest.raises(ValueError, match="C-contiguous"):
        devstage.Stager(sim).bind([devstage.In(np.zeros((4, 4))[:, 1])])
    with pytest.raises(ValueError, match="typestr"):
        devstage.Stager(sim).bind([devstage.In(np.zeros(4, np.complex64))])


def test_torch_cpu_tensors_pinned_or_not(sim):
    torch = torch_or_skip()
    for tensor in (torch.arange(12, dtype=torch.float32).reshape(3, 4),
                   torch.arange(6, dtype=torch.bfloat16),
                   torch.arange(8, dtype=torch.int64)):
        data, shape, dtype = staged_bytes(sim, tensor)
        assert data == tensor.view(torch.uint8).numpy().tobytes() if tensor.dtype == torch.bfloat16 else \
            data == tensor.numpy().tobytes()
        assert shape == tuple(tensor.shape) and dtype == str(tensor.dtype).removeprefix("torch.")
    with pytest.raises(ValueError, match="contiguous"):
        devstage.Stager(sim).bind([devstage.In(torch.zeros(4, 4).t())])


def test_torch_pinned_tensor(sim):
    """A pinned torch tensor: torch's own where its build can pin, else a torch view of devstage's
    pinned memory (torch.from_dlpack of a PinnedBuffer) — pinned either way."""
    torch = torch_or_skip()
    try:
        pinned = torch.arange(32, dtype=torch.int32).pin_memory()
    except RuntimeError:  # a CPU-only build has no pinned-memory allocator
        buffer = devstage.PinnedPool(sim).allocate(32, "int32")
        pinned = torch.from_dlpack(buffer)
        pinned.copy_(torch.arange(32, dtype=torch.int32))
    assert staged_bytes(sim, pinned)[0] == pinned.numpy().tobytes()


class Producer:
    """Another library's tensor: only __dlpack__ and __dlpack_device__ (a NumPy array inside)."""

    def __init__(self, array):
        self.array = array
        self.taken = 0

    def __dlpack__(self, stream=None):
        self.taken += 1
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_producers_are_staged_and_given_back(sim):
    np = numpy_or_skip()
    source = np.arange(10, dtype=np.float32).reshape(2, 5)
    producer = Producer(source)
    data, shape, dtype = staged_bytes(sim, producer)
    assert data == source.tobytes() and shape == (2, 5) and dtype == "float32"
    assert producer.taken == 1
    out = np.zeros(4, np.int16)
    stager = devstage.Stager(sim)
    run = stager.bind([devstage.Out(Producer(out))])  # NumPy's DLPack export is read-only for NumPy, not for us
    stager.finish(run)


def test_shapes_and_dtypes_travel_with_pinned_buffers(sim):
    pool = devstage.PinnedPool(sim)
    buf = pool.allocate((4, 8), "bfloat16")
    stager = devstage.Stager(sim)
    run = stager.bind([devstage.In(buf), devstage.Device(sim.device_malloc(256), 256, shape=(8, 8), dtype="float32")])
    assert (run.device_args[0].shape, run.device_args[0].dtype) == ((4, 8), "bfloat16")
    assert (run.device_args[1].shape, run.device_args[1].dtype) == ((8, 8), "float32")
    device = run.device_args[1].data_ptr
    stager.finish(run)
    sim.device_free(device)


def test_what_cannot_be_staged(sim):
    stager = devstage.Stager(sim)
    with pytest.raises(TypeError, match="not a tensor devstage can stage"):
        stager.bind([devstage.In(object())])
    with pytest.raises(TypeError, match="wrap it as In"):
        stager.bind([b"raw"])
    with pytest.raises(TypeError, match="a list of args"):
        stager.bind(devstage.In(b"x"))
    with pytest.raises(ValueError, match="direction"):
        devstage.Arg(b"x", "sideways")
