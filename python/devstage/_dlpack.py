# SPDX-License-Identifier: Apache-2.0
"""DLPack export through ctypes: a DLManagedTensor (the legacy, unversioned layout every
DLPack consumer reads) in a PyCapsule named "dltensor".

The consumer renames the capsule "used_dltensor" once it owns the tensor and calls the
tensor's deleter when it is done with it; a capsule never consumed calls the deleter itself
when it is destroyed. Until the deleter runs, the exported tensor keeps its owner (the buffer)
alive.
"""
import ctypes
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

CPU = 1  # kDLCPU: host memory the CPU reads and writes, page-locked or not


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

# Exported tensors not yet given back: the DLManagedTensor's address -> what it keeps alive.
_live = {}


@_DELETER
def _delete(address):
    _live.pop(address, None)


# The capsule destructor gets the capsule as a plain address: no reference is taken to an
# object being destroyed.
_CAPSULE_DESTRUCTOR = CFUNCTYPE(None, c_void_p)
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [c_void_p, c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = c_int
_api.PyCapsule_IsValid.argtypes = [c_void_p, c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_GetPointer.argtypes = [c_void_p, c_char_p]


@_CAPSULE_DESTRUCTOR
def _destroy_capsule(capsule):
    if _api.PyCapsule_IsValid(capsule, _UNUSED):  # never consumed: the tensor is still ours
        _delete(_api.PyCapsule_GetPointer(capsule, _UNUSED))


def capsule(owner, address, shape, code, bits):
    """A "dltensor" capsule of the C-contiguous tensor of `shape` at `address` (host memory),
    elements of DLPack type (code, bits); it keeps `owner` alive until the consumer is done."""
    managed = DLManagedTensor()
    dims = (c_int64 * max(len(shape), 1))(*shape)
    tensor = managed.dl_tensor
    tensor.data = address
    tensor.device = DLDevice(CPU, 0)
    tensor.ndim = len(shape)
    tensor.dtype = DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(dims, POINTER(c_int64))
    tensor.strides = None  # compact, row-major
    tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _delete
    key = ctypes.addressof(managed)
    _live[key] = (managed, dims, owner)
    return _api.PyCapsule_New(key, _UNUSED, _destroy_capsule)


def exported():
    """How many exported tensors are not yet given back (for tests)."""
    return len(_live)
