# SPDX-License-Identifier: Apache-2.0
"""Pinned host memory as tensors: a PinnedPool hands out PinnedBuffers that NumPy and PyTorch
view without a copy (the NumPy array interface, DLPack), so inputs are generated straight into
the memory a stager uploads from; and existing host memory pinned in place."""
import math
import threading
from ctypes import byref, c_void_p

from . import _dtypes, _host, _lib
from ._dtypes import dtype_name
from ._lib import lib
from .backend import Stream
from ._lib import check


class _PoolHandle:
    """The C pool, destroyed once the pool object and every buffer from it are gone — in whatever
    order they go (at interpreter exit the garbage collector finalizes them in any order)."""

    _destroy = lib.devstage_pinned_pool_destroy
    _free = lib.devstage_pinned_pool_free

    def __init__(self, backend, max_cached_bytes):
        self.backend = backend  # outlives the pool (and its callbacks)
        self.lock = threading.Lock()
        self.buffers = 0        # live PinnedBuffers
        self.dropped = False    # the pool object went first
        self.handle = c_void_p()
        check(lib.devstage_pinned_pool_create(backend._handle, max_cached_bytes, byref(self.handle)))  # pylint: disable=protected-access

    def allocated(self):
        with self.lock:
            self.buffers += 1

    def free(self, address):
        with self.lock:
            self.buffers -= 1
            last = self.dropped and self.buffers == 0
        if self.handle:
            self._free(self.handle, address)
        if last:
            self._close()

    def _close(self):
        handle, self.handle = self.handle, None
        if handle:
            self._destroy(handle)

    def __del__(self):
        lock = getattr(self, "lock", None)
        if lock is None:
            return
        with lock:
            self.dropped = True
            last = self.buffers == 0
        if last:
            self._close()


class PinnedPool:
    """A thread-safe cache of page-locked host memory over a backend that has it.
    `pool = PinnedPool(backend); buf = pool.allocate((16, 5120), "bfloat16")`. Released blocks
    are kept by size class, up to max_cached_bytes in all."""

    def __init__(self, backend, max_cached_bytes=1 << 30):
        self._pool = _PoolHandle(backend, max_cached_bytes)
        self.backend = backend

    def allocate(self, shape, dtype="uint8"):
        """A C-contiguous tensor of `shape` (an int or a tuple) and `dtype` in pinned memory.
        Its memory goes back to the pool when the buffer and every view of it are gone."""
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"devstage: shape {shape} has a negative dimension")
        name = dtype_name(dtype)
        nbytes = math.prod(shape) * _dtypes.itemsize(name)
        address = c_void_p()
        check(lib.devstage_pinned_pool_allocate(self._pool.handle, max(nbytes, 1), byref(address)))
        self._pool.allocated()
        return PinnedBuffer(self._pool, address.value, shape, name, nbytes)

    def pin(self, tensor):
        """Page-locks the memory of an existing host tensor in place (a NumPy array, a CPU torch
        tensor, any writable C-contiguous buffer) with the pool's backend, as
        torch.Tensor.pin_memory() gives pinned memory, without the copy; returns a Pinned that
        keeps the tensor alive and unpins it on close() (or when it goes)."""
        return Pinned(self.backend, tensor)

    def record(self, buffer, stream):
        """Work enqueued on `stream` uses `buffer`: once the buffer is given back, its block is
        reused only after that work completed. Never blocks. A Stream of another backend (another
        device's) is recorded with that backend, which the pool then keeps alive."""
        target = stream if isinstance(stream, Stream) and stream.backend is not self.backend else \
            self.backend.stream(stream)
        check(lib.devstage_pinned_pool_record(self._pool.handle, buffer.data_ptr, target.handle))

    def trim(self):
        """Frees the cached blocks now (waiting for their recorded work)."""
        check(lib.devstage_pinned_pool_trim(self._pool.handle))

    @property
    def stats(self):
        """The pool's counters as a dict (PinnedStats)."""
        stats = _lib.PinnedStats()
        check(lib.devstage_pinned_pool_stats(self._pool.handle, byref(stats)))
        return {name: getattr(stats, name) for name in _lib.PINNED_STATS_FIELDS}


class PinnedBuffer(_host.HostTensor):
    """A tensor in pinned memory: `numpy.asarray(buf)` and `torch.from_dlpack(buf)` are views of
    it (no copy); the memory goes back to its pool when the last of the buffer and its views is
    gone. It outlives its PinnedPool object."""

    def __init__(self, pool, address, shape, dtype, nbytes):
        self._pool = pool
        self.data_ptr = address
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes

    def __repr__(self):
        return f"PinnedBuffer(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes}, data_ptr={self.data_ptr:#x})"

    def __del__(self):
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.free(self.data_ptr)


class Pinned:
    """Host memory of an existing tensor, page-locked in place by a backend (PinnedPool.pin):
    `tensor` is the tensor, `data_ptr` and `nbytes` its memory. close() (a context manager; or
    when the object goes) unpins it; the tensor must outlive the work that reads it."""

    _unregister = lib.devstage_host_unregister

    def __init__(self, backend, tensor):
        memory = _host.memory_of(tensor, writable=False)
        if memory.device is not None:
            memory.close()
            raise ValueError(f"devstage: pin needs host memory; the {type(tensor).__name__} is device memory")
        if memory.nbytes == 0:
            memory.close()
            raise ValueError("devstage: pin of a tensor of 0 bytes: there is nothing to page-lock")
        self.backend = backend
        self.tensor = tensor
        self.data_ptr = memory.address
        self.nbytes = memory.nbytes
        self._memory = memory  # keeps a buffer export open: the memory cannot move while pinned
        self._lock = threading.Lock()
        try:
            backend.host_register(memory.address, memory.nbytes)
        except BaseException:
            memory.close()
            raise
        self._registered = True

    def close(self):
        with self._lock:
            registered, self._registered = self._registered, False
        if registered:
            try:
                check(self._unregister(self.backend._handle, self.data_ptr))  # pylint: disable=protected-access
            finally:
                self._memory.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_registered", False):
            self._registered = False
            self._unregister(self.backend._handle, self.data_ptr)  # pylint: disable=protected-access
            self._memory.close()
