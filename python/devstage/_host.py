# SPDX-License-Identifier: Apache-2.0
"""What an arg's tensor is: its memory (host, or already on a device), its shape and dtype, and
whether it may be written; and what keeps that memory valid while devstage uses it.

Recognised, in this order: devstage's PinnedBuffer and frame views; a torch tensor (CPU, or on a
device: then it is passed through as device memory); anything with the NumPy array interface;
anything with __dlpack__ (CPU memory, or device memory passed through); anything with the buffer
protocol (bytes, bytearray, memoryview, array.array, mmap), read-only ones included.
"""
import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_ssize_t, c_void_p

from . import _dlpack, _dtypes


class Memory:
    """One tensor's memory as devstage stages it: `address`, `nbytes`, `shape`, `dtype` (a name of
    _dtypes.DTYPES), `readonly`; `device` is None for host memory, else the DLPack (type, id) of
    the device memory it already is; `keep` holds what keeps the memory valid (released by
    close())."""

    __slots__ = ("address", "nbytes", "shape", "dtype", "readonly", "device", "keep", "_close")

    def __init__(self, address, nbytes, shape, dtype, readonly=False, device=None, keep=None, close=None):
        self.address, self.nbytes, self.shape, self.dtype = address, nbytes, tuple(shape), dtype
        self.readonly, self.device, self.keep, self._close = readonly, device, keep, close

    def close(self):
        close, self._close = self._close, None
        self.keep = None
        if close is not None:
            close()


def array_interface(address, shape, dtype):
    """The NumPy array interface of a C-contiguous tensor in host memory (writable)."""
    return {"shape": tuple(shape), "typestr": _dtypes.DTYPES[dtype][2], "data": (address or _dlpack.EMPTY_ADDRESS, False),
            "strides": None, "version": 3}


class HostTensor:
    """What devstage's own host tensors share (PinnedBuffer, a frame's HostView): `data_ptr`,
    `nbytes`, `shape` and `dtype`, seen by NumPy (the array interface) and DLPack (kDLCPU: the CPU
    reads and writes pinned memory directly, so no stream applies), and staged as args."""

    __slots__ = ()

    @property
    def __array_interface__(self):
        return array_interface(self.data_ptr, self.shape, self.dtype)

    def __dlpack__(self, stream=None, **_ignored):  # pylint: disable=unused-argument
        code, bits, _ = _dtypes.DTYPES[self.dtype]
        return _dlpack.capsule(self, self.data_ptr, self.shape, code, bits)

    def __dlpack_device__(self):
        return (_dlpack.CPU, 0)

    def _devstage_memory(self):
        return Memory(self.data_ptr, self.nbytes, self.shape, self.dtype, keep=self)


class _PyBuffer(Structure):
    _fields_ = [("buf", c_void_p), ("obj", c_void_p), ("len", c_ssize_t), ("itemsize", c_ssize_t),
                ("readonly", c_int), ("ndim", c_int), ("format", c_char_p), ("shape", POINTER(c_ssize_t)),
                ("strides", POINTER(c_ssize_t)), ("suboffsets", POINTER(c_ssize_t)), ("internal", c_void_p)]


_PYBUF_WRITABLE, _PYBUF_FORMAT, _PYBUF_ND, _PYBUF_STRIDES = 0x0001, 0x0004, 0x0008, 0x0010 | 0x0008
_PYBUF_C_CONTIGUOUS = 0x0020 | _PYBUF_STRIDES
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, POINTER(_PyBuffer), c_int]
_get_buffer.restype = c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [POINTER(_PyBuffer)]
_release_buffer.restype = None


def _describe(tensor):
    return type(tensor).__name__


def _torch_dtype(tensor):
    try:
        return _dtypes.dtype_name(tensor.dtype)
    except ValueError:
        raise ValueError(f"devstage: a torch tensor of dtype {tensor.dtype} cannot be staged (devstage knows "
                         f"{', '.join(_dtypes.DTYPES)})") from None


def _from_torch(tensor):
    dtype = _torch_dtype(tensor)
    if not tensor.is_contiguous():
        raise ValueError(f"devstage: a torch tensor must be contiguous (shape {tuple(tensor.shape)}, strides "
                         f"{tuple(tensor.stride())}); pass tensor.contiguous()")
    nbytes = tensor.numel() * tensor.element_size()
    kind = tensor.device.type
    if kind == "cpu":
        return Memory(tensor.data_ptr(), nbytes, tuple(tensor.shape), dtype, keep=tensor)
    device_type = {"cuda": _dlpack.CUDA, "npu": _dlpack.EXT_DEV, "privateuseone": _dlpack.EXT_DEV}.get(kind)
    if device_type is None:
        raise ValueError(f"devstage: a torch tensor on device {tensor.device} is neither host memory nor memory of a "
                         "devstage backend (cpu, cuda, npu)")
    return Memory(tensor.data_ptr(), nbytes, tuple(tensor.shape), dtype, device=(device_type, tensor.device.index or 0),
                  keep=tensor)


def _from_array_interface(tensor, interface):
    address, readonly = interface["data"]
    shape = tuple(interface["shape"])
    typestr = interface["typestr"]
    dtype = _dtypes.from_typestr(typestr)
    if dtype is None:
        raise ValueError(f"devstage: an array of typestr {typestr!r} cannot be staged (devstage knows "
                         f"{', '.join(_dtypes.DTYPES)})")
    size = _dtypes.itemsize(dtype)
    count = 1
    for extent in shape:
        count *= extent
    strides = interface.get("strides")
    if strides is not None:
        expected = size
        for extent, stride in zip(reversed(shape), reversed(strides)):
            if extent != 1 and stride != expected:
                raise ValueError(f"devstage: a NumPy array must be C-contiguous (shape {shape}, strides "
                                 f"{tuple(strides)}); pass numpy.ascontiguousarray(array)")
            expected *= extent
    return Memory(address or 0, count * size, shape, dtype, readonly=bool(readonly), keep=tensor)


def _from_dlpack(tensor):
    imported = _dlpack.Imported(tensor.__dlpack__())
    try:
        code, bits, lanes = imported.dtype
        dtype = _dtypes.BY_DLPACK.get((code, bits)) if lanes == 1 else None
        if dtype is None:
            raise ValueError(f"devstage: a DLPack tensor of type (code {code}, bits {bits}, lanes {lanes}) cannot be "
                             "staged")
        if not imported.compact():
            raise ValueError(f"devstage: a DLPack tensor must be C-contiguous (shape {imported.shape}, strides "
                             f"{imported.strides})")
        device = None if imported.device[0] in (_dlpack.CPU, _dlpack.CUDA_HOST) else imported.device
    except Exception:
        imported.close()
        raise
    return Memory(imported.data, imported.nbytes, imported.shape, dtype, device=device, keep=(tensor, imported),
                  close=imported.close)


def _get(tensor, flags):
    """A Py_buffer of `tensor` with `flags`, or the BufferError that refused it."""
    view = _PyBuffer()
    try:
        _get_buffer(tensor, ctypes.byref(view), flags)
    except BufferError as error:
        return None, error
    return view, None


def _from_buffer(tensor, writable):
    if not isinstance(tensor, (bytes, bytearray, memoryview)):
        try:
            memoryview(tensor).release()
        except TypeError:
            raise TypeError(f"devstage: {_describe(tensor)} is not a tensor devstage can stage: a PinnedBuffer, a "
                            "torch tensor, a NumPy array, an object with __dlpack__ or the buffer protocol") from None
    flags = _PYBUF_C_CONTIGUOUS | _PYBUF_FORMAT
    view, refused = _get(tensor, flags | (_PYBUF_WRITABLE if writable else 0))
    if view is None:
        if writable:
            readable, _ = _get(tensor, flags)
            if readable is not None:
                _release_buffer(ctypes.byref(readable))
                raise ValueError(f"devstage: the {_describe(tensor)} is read-only: an Out or InOut arg is written "
                                 "(copied back into); pass a writable buffer (a bytearray, a writable array)")
        raise ValueError(f"devstage: the {_describe(tensor)} has no C-contiguous buffer: {refused}")
    fmt = view.format.decode() if view.format else "B"
    dtype = _dtypes.from_format(fmt)
    if dtype is None or view.ndim == 0:
        shape, dtype = (view.len,), "uint8"  # a struct, an unknown format, a scalar: its bytes
    else:
        shape = tuple(view.shape[i] for i in range(view.ndim))
    holder = [view]

    def release():
        if holder:
            _release_buffer(ctypes.byref(holder.pop()))

    return Memory(view.buf or 0, view.len, shape, dtype, readonly=bool(view.readonly), keep=tensor, close=release)


def memory_of(tensor, writable):
    """The Memory of `tensor`; `writable`: the arg is written (Out, InOut), so read-only memory is
    refused. TypeError for what is not a tensor, ValueError for one that cannot be staged."""
    views = getattr(tensor, "_devstage_memory", None)
    if views is not None:  # PinnedBuffer, a frame's host view
        memory = views()
    elif hasattr(tensor, "data_ptr") and hasattr(tensor, "element_size") and hasattr(tensor, "device"):
        memory = _from_torch(tensor)
    elif getattr(tensor, "__array_interface__", None) is not None:
        memory = _from_array_interface(tensor, tensor.__array_interface__)
    elif hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__"):
        memory = _from_dlpack(tensor)
    else:
        return _from_buffer(tensor, writable)
    if writable and memory.readonly:
        memory.close()
        raise ValueError(f"devstage: the {_describe(tensor)} is read-only: an Out or InOut arg is written (copied "
                         "back into); pass a writable one")
    return memory
