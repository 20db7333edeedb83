# SPDX-License-Identifier: Apache-2.0
"""Backends and streams: the simulator, a CUDA or Ascend device, or a runtime's own callbacks."""
import ctypes
import traceback
from ctypes import byref, c_void_p

from . import _lib
from ._lib import lib
from .errors import check


class Backend:
    """An accelerator, chosen at run time. `Backend.simulator()`, `Backend.cuda(0)`,
    `Backend.ascend(0)` or `Backend.from_callbacks(...)`. Stagers and pools made from it keep it
    alive; thread-safe where the runtime is."""

    def __init__(self, handle, keepalive=()):
        self._handle = handle
        self._keepalive = keepalive  # the ctypes callbacks the C backend calls
        self.callback_errors = []     # exceptions raised inside Python callbacks

    @classmethod
    def simulator(cls, device_capacity=0):
        """devstage's simulator: device memory emulated in host memory, page-locked pinned
        memory, real streams. device_capacity: bytes it may hand out (0: 64 GiB)."""
        handle = c_void_p()
        check(lib.devstage_backend_create_sim(device_capacity, byref(handle)))
        return cls(handle)

    @classmethod
    def cuda(cls, device=0, library_path=None):
        """CUDA device `device` through libcudart, loaded at run time."""
        handle = c_void_p()
        check(lib.devstage_backend_create_cuda(device, _path(library_path), byref(handle)))
        return cls(handle)

    @classmethod
    def ascend(cls, device=0, library_path=None):
        """Ascend device `device` through libascendcl, loaded at run time."""
        handle = c_void_p()
        check(lib.devstage_backend_create_ascend(device, _path(library_path), byref(handle)))
        return cls(handle)

    @classmethod
    def from_callbacks(cls, *, device_malloc, device_free, copy_to_device, copy_from_device,
                       pinned_malloc=None, pinned_free=None, device_memset=None, name="callbacks", context=None):
        """A backend over a runtime's platform callbacks (no streams: devstage's are then
        immediate). Each is either a ctypes function pointer with the C signature (it gets
        `context` first: a runtime's hooks loaded with ctypes.CDLL plug in unchanged) or a
        Python callable without the context:
        device_malloc(nbytes) -> address (0 or None: out of memory), device_free(address),
        copy_to_device(device_dst, host_src, nbytes) and copy_from_device(host_dst, device_src,
        nbytes) -> None or 0 on success, a non-zero int on failure; pinned_malloc and pinned_free
        (both or neither) like the device ones; device_memset(device_dst, value, nbytes) like the
        copies (without it, stagers upload zeros to zero Out args). An exception inside a Python callback fails the
        call (BackendFailure) and is kept in `callback_errors`."""
        errors = []
        table = _lib.Callbacks()
        table.name = name.encode()
        table.context = context
        made = []

        def wrap(field, function, kind):
            if function is None:
                return
            if isinstance(function, ctypes._CFuncPtr):  # pylint: disable=protected-access
                pointer = ctypes.cast(function, getattr(_lib, kind))
            else:
                pointer = getattr(_lib, kind)(_python_callback(function, kind, errors))
            made.append(pointer)
            setattr(table, field, pointer)

        wrap("device_malloc", device_malloc, "MALLOC")
        wrap("device_free", device_free, "FREE")
        wrap("copy_to_device", copy_to_device, "COPY")
        wrap("copy_from_device", copy_from_device, "COPY")
        wrap("pinned_malloc", pinned_malloc, "MALLOC")
        wrap("pinned_free", pinned_free, "FREE")
        wrap("device_memset", device_memset, "MEMSET")
        handle = c_void_p()
        check(lib.devstage_backend_create_callbacks(byref(table), byref(handle)))
        backend = cls(handle, keepalive=tuple(made))
        backend.callback_errors = errors
        return backend

    @property
    def name(self):
        return self._info().name.decode()

    @property
    def has_pinned(self):
        return bool(self._info().pinned)

    @property
    def has_streams(self):
        """False when streams are immediate (their copies are done when the call returns)."""
        return bool(self._info().streams)

    def device_malloc(self, nbytes):
        """Device memory for a tensor that stays on the device; its address."""
        address = c_void_p()
        check(lib.devstage_device_malloc(self._handle, nbytes, byref(address)))
        return address.value

    def device_free(self, address):
        check(lib.devstage_device_free(self._handle, address))

    def copy_to_device(self, device_dst, host_src, nbytes):
        """Copies nbytes from host address `host_src` to device address `device_dst`."""
        check(lib.devstage_copy_to_device(self._handle, device_dst, host_src, nbytes))

    def copy_from_device(self, host_dst, device_src, nbytes):
        check(lib.devstage_copy_from_device(self._handle, host_dst, device_src, nbytes))

    def create_stream(self):
        """A stream of this backend, destroyed by close() (or with the Stream object)."""
        handle = c_void_p()
        check(lib.devstage_stream_create(self._handle, byref(handle)))
        return Stream(self, handle.value, owned=True)

    def _info(self):
        info = _lib.BackendInfo()
        check(lib.devstage_backend_get_info(self._handle, byref(info)))
        return info

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            lib.devstage_backend_destroy(handle)


class Stream:
    """A stream of a backend: `backend.create_stream()`, or `Stream.wrap(backend, handle)` for a
    runtime's own (a cudaStream_t such as torch.cuda.current_stream().cuda_stream), which stays
    the caller's to destroy."""

    def __init__(self, backend, handle, owned):
        self.backend = backend
        self.handle = handle
        self._owned = owned

    @classmethod
    def wrap(cls, backend, handle):
        return cls(backend, handle, owned=False)

    def synchronize(self):
        """Blocks until the work enqueued on the stream so far completed."""
        check(lib.devstage_stream_synchronize(self.backend._handle, self.handle))  # pylint: disable=protected-access

    def close(self):
        if self._owned:
            self._owned = False
            check(lib.devstage_stream_destroy(self.backend._handle, self.handle))  # pylint: disable=protected-access

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_owned", False):
            self._owned = False
            lib.devstage_stream_destroy(self.backend._handle, self.handle)  # pylint: disable=protected-access


def _path(library_path):
    return None if library_path is None else str(library_path).encode()


def _python_callback(function, kind, errors):
    """`function` (no context argument) as the C callback of type `kind`; an exception becomes
    a failure (NULL, or -1) and is kept in `errors`."""
    def failed():
        errors.append(traceback.format_exc())

    if kind == "MALLOC":
        def malloc(_context, nbytes):
            try:
                return function(nbytes) or None
            except Exception:  # pylint: disable=broad-except
                failed()
                return None
        return malloc
    if kind == "FREE":
        def free(_context, address):
            try:
                function(address)
            except Exception:  # pylint: disable=broad-except
                failed()
        return free

    def call(_context, *args):  # a copy or a memset: 0 on success
        try:
            return int(function(*args) or 0)
        except Exception:  # pylint: disable=broad-except
            failed()
            return -1
    return call
