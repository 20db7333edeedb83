# SPDX-License-Identifier: Apache-2.0
"""A run's args (In, Out, InOut, Device) and a frame's shapes (TensorShape), and their C form."""
import ctypes
import math

from . import _dlpack, _dtypes, _host, _lib

IN, OUT, IN_OUT = 0, 1, 2
_HOST, _DEVICE = 0, 1
_DIRECTIONS = {"in": IN, "out": OUT, "inout": IN_OUT, "in_out": IN_OUT, IN: IN, OUT: OUT, IN_OUT: IN_OUT}
DIRECTION_NAMES = {IN: "In", OUT: "Out", IN_OUT: "InOut"}


def direction_of(direction):
    try:
        return _DIRECTIONS[direction.lower() if isinstance(direction, str) else direction]
    except (KeyError, TypeError):
        raise ValueError(f"devstage: direction {direction!r} is not devstage.IN, OUT or IN_OUT (or 'in', 'out', "
                         "'inout')") from None


class Arg:
    """One argument of a run: a host tensor and its direction (In(t), Out(t), InOut(t)), or
    device memory passed through (Device(address, nbytes), or a device tensor such as a CUDA torch
    tensor given to In/Out/InOut). Host tensors: a PinnedBuffer or frame view, a CPU torch tensor,
    anything with the NumPy array interface, __dlpack__ or the buffer protocol (bytes, bytearray,
    memoryview, array.array); an In may be read-only, an Out or InOut must be writable. The shape
    and dtype travel with the arg to the staged device tensor."""

    __slots__ = ("tensor", "direction", "nbytes", "device", "shape", "dtype")

    def __init__(self, tensor, direction, nbytes=None, device=False, shape=None, dtype=None):
        self.tensor = tensor
        self.direction = direction_of(direction)
        self.nbytes = nbytes
        self.device = device
        self.shape = shape
        self.dtype = dtype

    def __repr__(self):
        what = f"{self.nbytes} device bytes at {self.tensor:#x}" if self.device else type(self.tensor).__name__
        return f"{DIRECTION_NAMES[self.direction]}({what})"


def In(tensor):  # pylint: disable=invalid-name
    """Uploaded before the run, never copied back (read-only memory is fine)."""
    return Arg(tensor, IN)


def Out(tensor):  # pylint: disable=invalid-name
    """Not uploaded; copied back after a successful run (must be writable)."""
    return Arg(tensor, OUT)


def InOut(tensor):  # pylint: disable=invalid-name
    """Uploaded, and copied back after a successful run (must be writable)."""
    return Arg(tensor, IN_OUT)


def Device(address, nbytes, direction=IN, shape=None, dtype="uint8"):  # pylint: disable=invalid-name
    """Device memory the caller owns (weights, a KV cache) at `address`: passed to the kernel
    unchanged. `shape` and `dtype` (default: nbytes bytes) describe it to DLPack."""
    return Arg(int(address), direction, nbytes=int(nbytes), device=True, shape=shape, dtype=dtype)


class TensorShape:
    """One tensor of a frame (Stager.frame): its `shape` (an int or a tuple), `dtype` and
    direction; `device`, an address (or a device tensor), makes it a device-resident tensor
    passed through at its position, with no space in the frame."""

    __slots__ = ("shape", "dtype", "direction", "device", "nbytes", "_key", "_hash", "_chars", "_itemsize")

    def __init__(self, shape, dtype="uint8", direction=IN, device=None):
        self.shape = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in self.shape):
            raise ValueError(f"devstage: shape {self.shape} has a negative dimension")
        self.dtype = _dtypes.dtype_name(dtype)
        self.direction = direction_of(direction)
        self.device = device
        self._itemsize = _dtypes.itemsize(self.dtype)
        self._chars = _dtypes.FORMAT_CHARS[self.dtype]  # what a checked write takes, with the item size
        self.nbytes = math.prod(self.shape) * self._itemsize
        # Equal shapes lay a frame out alike (a device tensor: the same object, which this holds).
        where = device if device is None or isinstance(device, int) else ("tensor", id(device))
        self._key = (self.shape, self.dtype, self.direction, where)
        self._hash = hash(self._key)

    def __eq__(self, other):
        return isinstance(other, TensorShape) and self._key == other._key

    def __hash__(self):
        return self._hash

    def __repr__(self):
        where = "" if self.device is None else ", device"
        return f"TensorShape({self.shape}, {self.dtype}, {DIRECTION_NAMES[self.direction]}{where})"


class Staged:
    """What a bind needs of its args: the C table, and per arg the Memory that keeps it valid
    (None for a Device arg), its shape, dtype and direction."""

    __slots__ = ("table", "address", "memories", "tensor_shapes", "dtypes", "directions", "nbytes", "count")

    def __init__(self, count):
        self.table = (_lib.TensorArg * max(count, 1))()
        self.address = ctypes.addressof(self.table)
        self.memories, self.tensor_shapes, self.dtypes, self.directions, self.nbytes = [], [], [], [], []
        self.count = count

    def close(self):
        memories, self.memories = self.memories, []
        for memory in memories:
            if memory is not None:
                memory.close()


def _check_device(index, memory, backend):
    if memory.device != backend.dlpack_device:
        where = {_dlpack.CUDA: "cuda", _dlpack.EXT_DEV: "npu", _dlpack.CPU: "cpu"}.get(memory.device[0],
                                                                                   str(memory.device[0]))
        raise ValueError(f"devstage: arg {index} is device memory of {where}:{memory.device[1]}, which "
                         f"{backend.describe()} ({backend.kind} device {backend.device}) cannot use")


def _device_shape(index, arg):
    """The dtype and shape of a Device arg, checked against its nbytes."""
    dtype = _dtypes.dtype_name(arg.dtype or "uint8")
    size = _dtypes.itemsize(dtype)
    if arg.nbytes < 0:
        raise ValueError(f"devstage: arg {index} (Device) has nbytes {arg.nbytes}")
    if arg.shape is None:
        if arg.nbytes % size:
            raise ValueError(f"devstage: arg {index} (Device): {arg.nbytes} bytes are not a whole number of {dtype} "
                             f"elements ({size} bytes each)")
        return dtype, (arg.nbytes // size,)
    shape = (int(arg.shape),) if isinstance(arg.shape, int) else tuple(int(d) for d in arg.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"devstage: arg {index} (Device): shape {shape} has a negative dimension")
    if math.prod(shape) * size != arg.nbytes:
        raise ValueError(f"devstage: arg {index} (Device): shape {shape} of {dtype} is {math.prod(shape) * size} bytes, "
                         f"but nbytes is {arg.nbytes}")
    return dtype, shape


def stage_args(args, backend):
    """The C form of `args` for `backend`; the caller closes it when the memory is no longer used
    (on failure here, everything taken is released)."""
    if isinstance(args, (Arg, TensorShape)) or not hasattr(args, "__len__"):
        raise TypeError("devstage: bind takes a list of args (In(), Out(), InOut(), Device()) or a frame")
    staged = Staged(len(args))
    try:
        for i, arg in enumerate(args):
            if not isinstance(arg, Arg):
                raise TypeError(f"devstage: arg {i} is {type(arg).__name__}; wrap it as In(), Out(), InOut() or "
                                "Device()")
            if arg.device:
                dtype, shape = _device_shape(i, arg)
                staged.table[i] = _lib.TensorArg(arg.tensor, arg.nbytes, arg.direction, _DEVICE)
                staged.memories.append(None)
            else:
                memory = _host.memory_of(arg.tensor, writable=arg.direction != IN)
                staged.memories.append(memory)
                shape, dtype = memory.shape, memory.dtype
                if memory.device is not None:
                    _check_device(i, memory, backend)
                    placement = _DEVICE
                else:
                    placement = _HOST
                staged.table[i] = _lib.TensorArg(memory.address or None, memory.nbytes, arg.direction, placement)
            staged.tensor_shapes.append(shape)
            staged.dtypes.append(dtype)
            staged.directions.append(arg.direction)
            staged.nbytes.append(staged.table[i].bytes)
    except BaseException:
        staged.close()
        raise
    return staged


def frame_shapes(shapes, backend):
    """The C form of a frame's TensorShapes, and the device memories of device-resident ones (on
    failure here, those taken are released)."""
    if not shapes:
        raise ValueError("devstage: a frame holds at least one tensor (bind an empty arg list instead)")
    table = (_lib.TensorShape * len(shapes))()
    keep = []
    try:
        for i, shape in enumerate(shapes):
            if not isinstance(shape, TensorShape):
                raise TypeError(f"devstage: shape {i} is {type(shape).__name__}; describe it as TensorShape(shape, "
                                "dtype, direction)")
            device = None
            if shape.device is not None:
                if isinstance(shape.device, int):
                    device = shape.device
                else:
                    memory = _host.memory_of(shape.device, writable=shape.direction != IN)
                    keep.append(memory)
                    if memory.device is None:
                        raise ValueError(f"devstage: shape {i}'s device tensor is host memory; a frame's device "
                                         "tensor is device memory")
                    _check_device(i, memory, backend)
                    device = memory.address
            table[i] = _lib.TensorShape(shape.nbytes, shape.direction, device)
    except BaseException:
        for memory in keep:
            memory.close()
        raise
    return table, keep
