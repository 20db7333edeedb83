# SPDX-License-Identifier: Apache-2.0
"""DLPack through ctypes, both ways.

Export: a DLManagedTensor (the legacy, unversioned layout every DLPack consumer reads) in a
PyCapsule named "dltensor". The consumer renames the capsule "used_dltensor" once it owns the
tensor and calls the tensor's deleter when it is done with it; a capsule never consumed calls
the deleter itself when it is destroyed. Until the deleter runs, the exported tensor keeps its
owner alive, and the owner is told when it runs.

Import: the capsule of another library's __dlpack__(): its device, data, shape, strides and
dtype, taken over (renamed "used_dltensor") and given back through its deleter when devstage is
done with the memory.
"""
import ctypes
import sys
import threading
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

# DLDeviceType values devstage uses.
CPU = 1       # kDLCPU: host memory the CPU reads and writes, page-locked or not (the simulator's
              # device memory is host memory too)
CUDA = 2      # kDLCUDA: CUDA device memory
CUDA_HOST = 3  # kDLCUDAHost: page-locked host memory of CUDA
EXT_DEV = 12  # kDLExtDev: what PyTorch exports and imports for a PrivateUse1 device, torch_npu's "npu"


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


# The deleter takes the DLManagedTensor's address.
_DELETER = CFUNCTYPE(None, c_void_p)


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", _DELETER)]


_UNUSED = b"dltensor"
_USED = b"used_dltensor"

# Exported tensors not yet given back: the DLManagedTensor's address -> [the structures, what
# it keeps alive, the callback to run when it is given back, the capsule]. The capsule is held
# here until the tensor is given back, so that a capsule its consumer refused (its name still
# "dltensor") is found and given back by collect(), not left to a destructor that may be called
# with the consumer's exception pending.
_live = {}
_lock = threading.Lock()


# (What the two callbacks use is bound as defaults: at interpreter exit module globals may be
# gone before the last capsule.)
@_DELETER
def _delete(address, live=_live, lock=_lock):
    with lock:
        entry = live.pop(address, None)
    if entry is not None and entry[2] is not None:
        entry[2]()


# The capsule destructor gets the capsule as a plain address: no reference is taken to an
# object being destroyed.
_CAPSULE_DESTRUCTOR = CFUNCTYPE(None, c_void_p)
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [c_void_p, c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_SetName.restype = c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid_raw = CFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_get_pointer_raw = CFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))


@_CAPSULE_DESTRUCTOR
def _destroy_capsule(capsule, is_valid=_is_valid_raw, pointer=_get_pointer_raw, unused=_UNUSED, delete=_delete):
    if is_valid(capsule, unused):  # never consumed: the tensor is still ours
        delete(pointer(capsule, unused))


# Consumers keep the deleter's address and capsules the destructor's, possibly past this module's
# teardown at interpreter exit: the two C callbacks are never freed.
ctypes.pythonapi.Py_IncRef.argtypes = [ctypes.py_object]
ctypes.pythonapi.Py_IncRef(_delete)
ctypes.pythonapi.Py_IncRef(_destroy_capsule)

# A non-null address for tensors of no elements: consumers may give back a tensor only when its
# data is not NULL, and NumPy's array interface needs one.
_EMPTY = ctypes.c_uint64(0)
EMPTY_ADDRESS = ctypes.addressof(_EMPTY)


def capsule(owner, address, shape, code, bits, device=(CPU, 0), on_release=None):
    """A "dltensor" capsule of the C-contiguous tensor of `shape` at `address` on `device`
    (DLDeviceType, id), elements of DLPack type (code, bits); it keeps `owner` alive until the
    consumer is done, then calls `on_release()` (if given)."""
    managed = DLManagedTensor()
    dims = (c_int64 * max(len(shape), 1))(*shape)
    tensor = managed.dl_tensor
    tensor.data = address or EMPTY_ADDRESS
    tensor.device = DLDevice(*device)
    tensor.ndim = len(shape)
    tensor.dtype = DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(dims, POINTER(c_int64))
    tensor.strides = None  # compact, row-major
    tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _delete
    key = ctypes.addressof(managed)
    made = _api.PyCapsule_New(key, _UNUSED, _destroy_capsule)
    with _lock:
        _live[key] = [(managed, dims), owner, on_release, made]
    return made


def collect():
    """Gives back the exported tensors whose capsule nobody took: only this module holds it and
    its name is still "dltensor" (a consumer that refused it, or a capsule dropped unused)."""
    with _lock:
        abandoned = [key for key, entry in _live.items()
                     if sys.getrefcount(entry[3]) <= 2 and _is_valid(entry[3], _UNUSED)]
    for key in abandoned:
        _delete(key)


def exported():
    """How many exported tensors are not yet given back (for tests)."""
    collect()
    return len(_live)


class Imported:
    """The tensor of another library's DLPack capsule, taken over: `device` (type, id), `data`
    (the address of its first element), `shape`, `strides` (in elements; None when compact),
    `dtype` ((code, bits, lanes)), `nbytes`. close() (or destruction) gives it back to its
    producer."""

    def __init__(self, capsule):
        if not _is_valid(capsule, _UNUSED):
            raise ValueError("devstage: __dlpack__() did not return an unused \"dltensor\" capsule")
        address = _api.PyCapsule_GetPointer(capsule, _UNUSED)
        managed = DLManagedTensor.from_address(address)
        tensor = managed.dl_tensor
        self.device = (tensor.device.device_type, tensor.device.device_id)
        self.shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
        self.strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else None
        self.dtype = (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
        self.data = (tensor.data or 0) + tensor.byte_offset
        count = 1
        for extent in self.shape:
            count *= extent
        self.nbytes = count * tensor.dtype.bits * tensor.dtype.lanes // 8
        _api.PyCapsule_SetName(capsule, _USED)  # ours now: the capsule's destructor leaves it alone
        self._managed = address

    def compact(self):
        """True when the elements are laid out C-contiguously (strides absent or row-major)."""
        if self.strides is None:
            return True
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True

    def close(self):
        address, self._managed = self._managed, None
        if address:
            managed = DLManagedTensor.from_address(address)
            if managed.deleter:
                managed.deleter(address)

    def __del__(self):
        self.close()
