# SPDX-License-Identifier: Apache-2.0
"""Pinned host memory as tensors: a PinnedPool hands out PinnedBuffers that NumPy and PyTorch
view without a copy (the NumPy array interface, DLPack), so inputs are generated straight into
the memory a stager uploads from."""
import math
from ctypes import byref, c_void_p

from . import _dlpack, _lib
from ._lib import lib
from .errors import check

# dtype name -> (DLPack type code, bits, NumPy typestr). bfloat16 has no NumPy type: NumPy sees
# its elements as 2-byte void.
_DTYPES = {
    "int8": (0, 8, "|i1"), "int16": (0, 16, "<i2"), "int32": (0, 32, "<i4"), "int64": (0, 64, "<i8"),
    "uint8": (1, 8, "|u1"), "uint16": (1, 16, "<u2"), "uint32": (1, 32, "<u4"), "uint64": (1, 64, "<u8"),
    "float16": (2, 16, "<f2"), "float32": (2, 32, "<f4"), "float64": (2, 64, "<f8"),
    "bfloat16": (4, 16, "|V2"),
}


def dtype_name(dtype):
    """The name of a dtype given as a string, a NumPy dtype or scalar type, or a torch.dtype."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(getattr(dtype, "name", None), str):
        name = dtype.name            # numpy.dtype
    elif isinstance(getattr(dtype, "__name__", None), str):
        name = dtype.__name__        # numpy.float32 and the like
    else:
        name = str(dtype)            # torch.float32 -> "torch.float32"
    name = name.removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"devstage: dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    return name


class _PoolHandle:
    """The C pool, destroyed when the pool object and every buffer from it are gone."""

    def __init__(self, backend, max_cached_bytes):
        self.backend = backend  # outlives the pool (and its callbacks)
        self.handle = c_void_p()
        check(lib.devstage_pinned_pool_create(backend._handle, max_cached_bytes, byref(self.handle)))  # pylint: disable=protected-access

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            lib.devstage_pinned_pool_destroy(handle)


class PinnedPool:
    """A thread-safe cache of page-locked host memory over a backend that has it.
    `pool = PinnedPool(backend); buf = pool.allocate((16, 5120), "bfloat16")`. Released blocks
    are kept by size class, up to max_cached_bytes in all."""

    def __init__(self, backend, max_cached_bytes=1 << 30):
        self._pool = _PoolHandle(backend, max_cached_bytes)

    def allocate(self, shape, dtype="uint8"):
        """A C-contiguous tensor of `shape` (an int or a tuple) and `dtype` in pinned memory.
        Its memory goes back to the pool when the buffer and every view of it are gone."""
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"devstage: shape {shape} has a negative dimension")
        name = dtype_name(dtype)
        nbytes = math.prod(shape) * _DTYPES[name][1] // 8
        address = c_void_p()
        check(lib.devstage_pinned_pool_allocate(self._pool.handle, max(nbytes, 1), byref(address)))
        return PinnedBuffer(self._pool, address.value, shape, name, nbytes)

    def record(self, buffer, stream):
        """Work enqueued on `stream` uses `buffer`: once the buffer is given back, its block is
        reused only after that work completed. Never blocks."""
        check(lib.devstage_pinned_pool_record(self._pool.handle, buffer.data_ptr, stream.handle))

    def trim(self):
        """Frees the cached blocks now (waiting for their recorded work)."""
        check(lib.devstage_pinned_pool_trim(self._pool.handle))

    @property
    def stats(self):
        """The pool's counters as a dict (PinnedStats)."""
        stats = _lib.PinnedStats()
        check(lib.devstage_pinned_pool_stats(self._pool.handle, byref(stats)))
        return {name: getattr(stats, name) for name in _lib.PINNED_STATS_FIELDS}


class PinnedBuffer:
    """A tensor in pinned memory: `numpy.asarray(buf)` and `torch.from_dlpack(buf)` are views of
    it (no copy); the memory goes back to its pool when the last of the buffer and its views is
    gone. It outlives its PinnedPool object."""

    def __init__(self, pool, address, shape, dtype, nbytes):
        self._pool = pool
        self.data_ptr = address
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes

    @property
    def __array_interface__(self):
        return {"shape": self.shape, "typestr": _DTYPES[self.dtype][2], "data": (self.data_ptr, False),
                "strides": None, "version": 3}

    def __dlpack__(self, stream=None, **_ignored):
        """A DLPack capsule of the buffer (kDLCPU: the CPU reads and writes pinned memory
        directly, so no stream applies)."""
        code, bits, _ = _DTYPES[self.dtype]
        return _dlpack.capsule(self, self.data_ptr, self.shape, code, bits)

    def __dlpack_device__(self):
        return (_dlpack.CPU, 0)

    def __repr__(self):
        return f"PinnedBuffer(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes}, data_ptr={self.data_ptr:#x})"

    def __del__(self):
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None and pool.handle:
            lib.devstage_pinned_pool_free(pool.handle, self.data_ptr)
