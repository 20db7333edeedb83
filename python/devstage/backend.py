# SPDX-License-Identifier: Apache-2.0
"""Backends and streams: the simulator, a CUDA or Ascend device, or a runtime's own callbacks;
streams made by devstage or adopted from the runtime (torch's, a raw handle); host functions on
a stream; host memory pinned in place."""
import collections
import ctypes
import itertools
import re
import threading
import traceback
import warnings
import weakref
from ctypes import byref, c_int, c_void_p
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import _calls, _dlpack, _lib, lifecycle
from ._lib import check, error_of, lib
from .errors import Busy, HostFunctionError, NotSupported

SIM, CUDA, ASCEND, CALLBACKS = 0, 1, 2, 3  # devstage_backend_kind
_KIND_NAMES = {SIM: "sim", CUDA: "cuda", ASCEND: "ascend", CALLBACKS: "callbacks"}
_serials = itertools.count(1)


class Backend:
    """An accelerator, chosen at run time: `devstage.sim()`, `devstage.cuda(0)`,
    `devstage.ascend(0)` or `devstage.callbacks(...)`. Stagers, pools and streams made from it keep
    it alive; thread-safe where the runtime is."""

    # The C functions the destructors call, kept with the class: module globals may be gone
    # when an object is destroyed at interpreter exit.
    _destroy = lib.devstage_backend_destroy
    _stream_destroy = lib.devstage_stream_destroy

    def __init__(self, handle: int, keepalive: tuple = (), dlpack_device: Optional[Tuple[int, int]] = None) -> None:
        self._handle: Optional[int] = handle
        self._keepalive = keepalive  # the ctypes callbacks the C backend calls
        # Tracebacks of exceptions raised inside Python callbacks and host functions (the latest).
        self.callback_errors: Deque[str] = collections.deque(maxlen=CALLBACK_ERRORS_KEPT)
        self.number = next(_serials)
        self._adopted: Dict[int, int] = {}  # native stream handle -> devstage's handle of it
        self._owned: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the Streams and Events made through it
        self._lock = threading.Lock()
        # Host functions: how many were launched (each gets the count as its number), and those that
        # raised: [stream handle, number, what it raised, reported yet] (the latest).
        self._launches = 0
        self._failures: List[list] = []
        kind, device = c_int(), c_int()
        check(lib.devstage_backend_device(handle, byref(kind), byref(device)))
        self.kind = _KIND_NAMES.get(kind.value, "unknown")
        self.device = device.value
        lifecycle.backend_made(self)
        if dlpack_device is None and kind.value != CALLBACKS:
            dlpack_device = {SIM: (_dlpack.CPU, 0), CUDA: (_dlpack.CUDA, device.value),
                             ASCEND: (_dlpack.EXT_DEV, device.value)}[kind.value]
        self.dlpack_device = dlpack_device

    # ---- making one ------------------------------------------------------------------------

    @classmethod
    def simulator(cls, device_capacity=0, device=0, host_of=None):
        """devstage's simulator: device memory emulated in host memory (kDLCPU through DLPack),
        page-locked pinned memory, real streams (a worker thread each). device_capacity: bytes it
        may hand out (0: 64 GiB). device: its number. host_of: None for a simulated host of its
        own, or a simulator Backend whose host this device joins (pinned memory of any device of
        a host is pinned for all of them; streams stay their device's)."""
        handle = c_void_p()
        if host_of is not None and not isinstance(host_of, Backend):
            raise TypeError(f"devstage Backend.simulator: host_of is a {type(host_of).__name__}, not a Backend")
        peer = host_of._live("devstage.sim(host_of=...)") if host_of is not None else None  # pylint: disable=protected-access
        check(lib.devstage_backend_create_sim_device(device, device_capacity, peer, byref(handle)), "devstage.sim")
        return cls(handle.value)

    @classmethod
    def cuda(cls, device=0, library_path=None):
        """CUDA device `device` through libcudart, loaded at run time (library_path None: as
        CudaBackend::create looks for it). LibraryNotFound names what it tried."""
        handle = c_void_p()
        status = lib.devstage_backend_create_cuda(device, _path(library_path), byref(handle))
        if status != 0:
            raise _no_gpu(error_of(status, f"devstage.cuda({device})"))
        return cls(handle.value)

    @classmethod
    def ascend(cls, device=0, library_path=None):
        """Ascend device `device` through libascendcl, loaded at run time."""
        handle = c_void_p()
        check(lib.devstage_backend_create_ascend(device, _path(library_path), byref(handle)), f"devstage.ascend({device})")
        return cls(handle.value)

    @classmethod
    def from_callbacks(cls, *, device_malloc, device_free, copy_to_device, copy_from_device, name="callbacks",
                       context=None, dlpack_device=None, **optional):
        """A backend over a runtime's platform callbacks; see docs/python.md for every one.

        Each is either a ctypes function pointer with the C signature of devstage_callbacks (it
        gets `context` first: a runtime's hooks loaded with ctypes.CDLL plug in unchanged) or a
        Python callable without the context. Required: device_malloc(nbytes) -> address (0 or
        None: out of memory), device_free(address), copy_to_device(device_dst, host_src, nbytes)
        and copy_from_device(host_dst, device_src, nbytes), which return None or 0 on success and
        a non-zero int on failure. Optional (keyword): pinned_malloc and pinned_free; the stream
        group create_stream() -> handle, destroy_stream(stream), copy_to_device_async(dst, src,
        nbytes, stream), copy_from_device_async(...), create_event() -> handle,
        destroy_event(event), record_event(event, stream), event_ready(event) -> bool,
        synchronize_event(event), stream_wait_event(stream, event) (all or none: without them
        devstage's streams are immediate); device_memset(dst, value, nbytes),
        device_memset_async(dst, value, nbytes, stream), synchronize(), launch_host_function(
        stream, run) (run() calls the host function), host_register(address, nbytes),
        host_unregister(address). dlpack_device: the DLPack (device type, id) of the runtime's
        device memory, for exporting staged args (none given: they cannot be exported). An
        exception inside a Python callback fails the call (BackendFailure) and its traceback is
        kept in `callback_errors`."""
        errors = collections.deque(maxlen=CALLBACK_ERRORS_KEPT)
        table = _lib.Callbacks()
        table.name = name.encode()
        table.context = context
        made = []
        kinds = dict(_CALLBACK_KINDS)
        unknown = sorted(set(optional) - set(kinds))
        if unknown:
            raise TypeError(f"devstage: from_callbacks got unknown callbacks: {', '.join(unknown)}")
        given = dict(device_malloc=device_malloc, device_free=device_free, copy_to_device=copy_to_device,
                     copy_from_device=copy_from_device, **optional)
        for field, function in given.items():
            if function is None:
                continue
            kind = kinds[field]
            c_type = getattr(_lib, kind)
            if isinstance(function, ctypes._CFuncPtr):  # pylint: disable=protected-access
                pointer = ctypes.cast(function, c_type)
            else:
                pointer = c_type(_python_callback(function, kind, errors))
            made.append(pointer)
            setattr(table, field, pointer)
        handle = c_void_p()
        check(lib.devstage_backend_create_callbacks(byref(table), byref(handle)), "devstage.callbacks")
        backend = cls(handle.value, keepalive=tuple(made), dlpack_device=dlpack_device)
        backend.callback_errors = errors
        return backend

    # ---- what it is ------------------------------------------------------------------------

    def _live(self, call: str) -> int:
        """The C backend's handle; ValueError naming `call` once the backend was closed."""
        handle = self._handle
        if handle is None:
            raise ValueError(f"devstage {call}: {self.describe()} was closed (Backend.close())")
        return handle

    @property
    def name(self) -> str:
        return self._info().name.decode()

    @property
    def has_pinned(self) -> bool:
        return bool(self._info().pinned)

    @property
    def has_streams(self) -> bool:
        """False when streams are immediate (their copies are done when the call returns)."""
        return bool(self._info().streams)

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"{self.kind}, device {self.device}"
        return f"<devstage backend '{self._name_or_kind()}' #{self.number} ({state})>"

    def describe(self) -> str:
        """"backend 'sim' #2": how messages name it."""
        return f"backend '{self._name_or_kind()}' #{self.number}"

    def _name_or_kind(self) -> str:
        return self.kind if self._handle is None else self.name

    # ---- memory ----------------------------------------------------------------------------

    def device_malloc(self, nbytes: int) -> int:
        """Device memory for a tensor that stays on the device; its address."""
        address = c_void_p()
        check(lib.devstage_device_malloc(self._live("Backend.device_malloc"), nbytes, byref(address)),
              "Backend.device_malloc")
        return address.value

    def device_free(self, address: int) -> None:
        check(lib.devstage_device_free(self._live("Backend.device_free"), address), "Backend.device_free")

    def copy_to_device(self, device_dst: int, host_src: int, nbytes: int) -> None:
        """Copies nbytes from host address `host_src` to device address `device_dst`."""
        check(lib.devstage_copy_to_device(self._live("Backend.copy_to_device"), device_dst, host_src, nbytes),
              "Backend.copy_to_device")

    def copy_from_device(self, host_dst: int, device_src: int, nbytes: int) -> None:
        check(lib.devstage_copy_from_device(self._live("Backend.copy_from_device"), host_dst, device_src, nbytes),
              "Backend.copy_from_device")

    def pinned_malloc(self, nbytes: int) -> int:
        """Page-locked host memory straight from the backend (a PinnedPool caches it instead)."""
        address = c_void_p()
        check(lib.devstage_pinned_malloc(self._live("Backend.pinned_malloc"), nbytes, byref(address)),
              "Backend.pinned_malloc")
        return address.value

    def pinned_free(self, address: int) -> None:
        check(lib.devstage_pinned_free(self._live("Backend.pinned_free"), address), "Backend.pinned_free")

    def copy_to_device_async(self, device_dst: int, host_src: int, nbytes: int, stream: Any) -> None:
        """Enqueues a copy on `stream` (see Backend.stream)."""
        handle = self._live("Backend.copy_to_device_async")
        check(lib.devstage_copy_to_device_async(handle, device_dst, host_src, nbytes, self.stream(stream).handle),
              "Backend.copy_to_device_async")

    def copy_from_device_async(self, host_dst: int, device_src: int, nbytes: int, stream: Any) -> None:
        handle = self._live("Backend.copy_from_device_async")
        check(lib.devstage_copy_from_device_async(handle, host_dst, device_src, nbytes, self.stream(stream).handle),
              "Backend.copy_from_device_async")

    def create_event(self) -> "Event":
        """An event of this backend (never recorded: complete)."""
        handle = c_void_p()
        check(lib.devstage_event_create(self._live("Backend.create_event"), byref(handle)), "Backend.create_event")
        event = Event(self, handle.value)
        self._owned.add(event)
        return event

    def host_register(self, address: int, nbytes: int) -> None:
        """Page-locks `nbytes` of existing host memory at `address` (cudaHostRegister and the
        like); NotSupported where the backend cannot. See PinnedPool.pin for the tensor form."""
        check(lib.devstage_host_register(self._live("Backend.host_register"), address, nbytes), "Backend.host_register")

    def host_unregister(self, address: int) -> None:
        check(lib.devstage_host_unregister(self._live("Backend.host_unregister"), address), "Backend.host_unregister")

    def synchronize(self) -> None:
        """Blocks until all work on the device completed."""
        check(lib.devstage_backend_synchronize(self._live("Backend.synchronize")), "Backend.synchronize")

    def _synchronize_quietly(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle:
            lib.devstage_backend_synchronize(handle)

    # ---- streams ---------------------------------------------------------------------------

    def create_stream(self) -> "Stream":
        """A new stream of this backend, destroyed by close() (or with the Stream object)."""
        handle = c_void_p()
        check(lib.devstage_stream_create(self._live("Backend.create_stream"), byref(handle)), "Backend.create_stream")
        stream = Stream(self, handle.value, adopted=False)
        self._owned.add(stream)
        return stream

    def adopt_stream(self, native: int) -> "Stream":
        """The runtime's stream `native` (a cudaStream_t or aclrtStream as an int; 0: the default
        stream) as a Stream of this backend; devstage never destroys it. The handle devstage keeps
        for it lives as long as the backend (or until close())."""
        native = int(native)
        backend = self._live("Backend.adopt_stream")
        with self._lock:
            handle = self._adopted.get(native)
            if handle is None:
                out = c_void_p()
                check(lib.devstage_stream_adopt(backend, native or None, byref(out)), "Backend.adopt_stream")
                handle = self._adopted[native] = out.value
        return Stream(self, handle, adopted=True)

    def stream(self, stream: Any) -> "Stream":
        """`stream` as a Stream of this backend: a Stream (of this backend, else ValueError naming
        both), a torch stream or any object with `cuda_stream` (or `npu_stream`, torch_npu's), or a
        raw handle (an int)."""
        if type(stream) is Stream:  # pylint: disable=unidiomatic-typecheck
            if stream.backend is not self:
                raise ValueError(f"devstage: a stream of {stream.backend.describe()} was given to {self.describe()}; "
                                 "use a stream of the stager's own backend")
            if stream.handle is None:
                raise ValueError(f"devstage: the stream of {self.describe()} was closed")
            return stream
        for attribute, kinds in (("cuda_stream", ("cuda", "callbacks")), ("npu_stream", ("ascend", "callbacks"))):
            native = getattr(stream, attribute, None)
            if native is None:
                continue
            if self.kind not in kinds:
                raise ValueError(f"devstage: a {type(stream).__name__} ({attribute}) was given to {self.describe()}, "
                                 f"a {self.kind} backend: it takes its own streams or raw handles")
            index = getattr(getattr(stream, "device", None), "index", None)
            if self.kind != "callbacks" and index is not None and index != self.device:
                raise ValueError(f"devstage: a stream of {stream.device} was given to {self.describe()}, which is "
                                 f"{self.kind} device {self.device}")
            return self.adopt_stream(native)
        if isinstance(stream, int) and not isinstance(stream, bool):
            return self.adopt_stream(stream)
        raise TypeError(f"devstage: {type(stream).__name__} is not a stream: pass a devstage Stream, a torch stream "
                        "(or anything with cuda_stream), or a raw handle (an int)")

    # ---- Python kernels on a stream ----------------------------------------------------------

    def launch_host_function(self, stream: Any, function: Callable[[], Any]) -> None:
        """Enqueues `function()` on `stream` (see Backend.stream): it runs on the stream, after the
        work enqueued there before it (on the simulator, on the stream's worker thread; on CUDA,
        through cudaLaunchHostFunc). It must not call devstage. An exception inside it fails the
        run it was launched for — launched on the run's stream between its bind and its finish:
        that run's wait() raises HostFunctionError — else it is reported by the stream's
        synchronize(); its traceback is kept in `callback_errors`. NotSupported where the backend
        cannot."""
        backend = self._live("Backend.launch_host_function")
        handle = self.stream(stream).handle
        with self._lock:
            self._launches += 1
            number = self._launches
        key = _calls.next_key()
        _calls.host_functions[key] = _HostFunction(function, self, handle, number)
        status = _calls.launch_host_function(backend, handle, key)
        if status != 0:
            _calls.host_functions.pop(key, None)
            raise error_of(status, "Backend.launch_host_function")

    def _failed(self, handle: int, number: int, error: BaseException) -> None:
        """A host function on stream `handle`, launched as `number`, raised `error`."""
        self.callback_errors.append("".join(traceback.format_exception(type(error), error, error.__traceback__)))
        with self._lock:
            self._failures.append([handle, number, f"{type(error).__name__}: {error}", False])
            del self._failures[:-CALLBACK_ERRORS_KEPT]

    def _claim_failures(self, window: Tuple[Tuple[int, ...], int, int, int]) -> Optional[HostFunctionError]:
        """The failure of the host functions of a run's window (its streams, its finish's stream,
        and the numbers of the launches before its bind and before its finish: it owns those
        launched in between), marked reported; None when none raised."""
        streams, finish_stream, after, upto = window
        with self._lock:
            found = [f for f in self._failures
                     if (f[0] in streams or f[0] == finish_stream) and after < f[1] <= upto]
            for failure in found:
                failure[3] = True
        return self._host_function_error(found)

    def _raise_host_function_errors(self, handles: Tuple[int, ...]) -> None:
        """Raises HostFunctionError for the host functions that raised on these streams and were
        not reported yet (by a run's wait or a synchronize)."""
        with self._lock:
            found = [f for f in self._failures if f[0] in handles and not f[3]]
            for failure in found:
                failure[3] = True
        error = self._host_function_error(found)
        if error is not None:
            raise error

    def _host_function_error(self, found: List[list]) -> Optional[HostFunctionError]:
        if not found:
            return None
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return HostFunctionError("backend_failure", f"devstage: a host function on a stream of {self.describe()} "
                                 f"raised {found[0][2]}{more}; the traceback is in backend.callback_errors")

    # ---- its end ---------------------------------------------------------------------------

    def close(self) -> None:
        """Destroys the backend now, if nothing of devstage still uses it (stagers and pools keep
        it; Busy while a stream or event of it lives). A callbacks backend frees what was
        allocated through it and never freed, and raises Leaked saying what."""
        handle = self._handle
        if not handle:
            return
        for adopted in list(self._adopted.values()):
            check(self._stream_destroy(handle, adopted), "Backend.close")
        self._adopted.clear()
        status = self._destroy(handle)
        if status in (0, LEAKED):
            self._handle = None
        if status != 0:
            raise error_of(status, "Backend.close")

    def _info(self) -> Any:
        info = _lib.BackendInfo()
        check(lib.devstage_backend_get_info(self._live("Backend"), byref(info)), "Backend")
        return info

    def _forget_adopted(self, handle: int) -> None:
        with self._lock:
            for native, known in list(self._adopted.items()):
                if known == handle:
                    del self._adopted[native]

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if not handle:
            return
        # At interpreter exit the garbage collector may finalize the backend before its streams
        # and events: they go first (the library keeps a backend while they live).
        for owned in list(getattr(self, "_owned", ())):
            owned._destroy_quietly()  # pylint: disable=protected-access
        for adopted in getattr(self, "_adopted", {}).values():
            self._stream_destroy(handle, adopted)
        self._handle = None
        if self._destroy(handle) == LEAKED:
            warnings.warn(f"devstage: {lib.devstage_last_message().decode(errors='replace')}", ResourceWarning,
                          stacklevel=1)


class _HostFunction:
    """A launched host function, as the trampoline finds it by its key: runs it on the stream's
    thread and reports what it raised to its backend (what it holds goes when it returns)."""

    __slots__ = ("function", "backend", "stream", "number")

    def __init__(self, function: Callable[[], Any], backend: Backend, stream: int, number: int) -> None:
        self.function, self.backend, self.stream, self.number = function, backend, stream, number

    def __call__(self) -> None:
        function, self.function = self.function, None
        try:
            function()
        except BaseException as error:  # pylint: disable=broad-except  (nothing above it to catch it)
            self.backend._failed(self.stream, self.number, error)  # pylint: disable=protected-access


class Stream:
    """A stream of a backend: made by `backend.create_stream()` (devstage destroys the runtime's
    stream with it) or adopted, `backend.adopt_stream(handle)`, `backend.stream(torch_stream)`
    (the runtime's; devstage never destroys it). `native` is the runtime's handle as an int (for
    launching kernels on it); `cuda_stream` too, so torch.cuda.ExternalStream(s.cuda_stream)
    wraps it."""

    def __init__(self, backend: Backend, handle: int, adopted: bool) -> None:
        self.backend = backend
        self.handle: Optional[int] = handle
        self.adopted = adopted

    @property
    def native(self) -> int:
        out = c_void_p()
        check(lib.devstage_stream_native(self._live("Stream.native"), byref(out)), "Stream.native")
        return out.value or 0

    cuda_stream = native

    def synchronize(self) -> None:
        """Blocks until the work enqueued on the stream so far completed; HostFunctionError when a
        host function raised on it and no run's wait reported it yet."""
        self._wait("Stream.synchronize")
        if self.backend._failures:  # pylint: disable=protected-access
            self.backend._raise_host_function_errors((self.handle,))  # pylint: disable=protected-access

    def _wait(self, call: str) -> None:
        """Blocks until the work enqueued on the stream so far completed (its host functions'
        failures are left to whoever they belong to)."""
        backend = self.backend._live(call)  # pylint: disable=protected-access
        check(lib.devstage_stream_synchronize(backend, self._live(call)), call)

    def _synchronize_quietly(self) -> None:
        backend = getattr(self.backend, "_handle", None)
        if self.handle is not None and backend:
            lib.devstage_stream_synchronize(backend, self.handle)

    def close(self) -> None:
        """Destroys the stream (an adopted one: only devstage's handle of it, which a later
        adoption makes again). Busy while a run is bound or finishing on it."""
        if self.handle is None:
            return
        users = lifecycle.stream_users(self.backend, self.handle)
        if users:
            raise Busy("busy", f"devstage Stream.close: {users} run(s) of {self.backend.describe()} are bound on "
                               "this stream or finish on it and have not ended; finish them (and wait) first")
        backend = self.backend._live("Stream.close")  # pylint: disable=protected-access
        handle, self.handle = self.handle, None
        if self.adopted:
            self.backend._forget_adopted(handle)  # pylint: disable=protected-access
        check(lib.devstage_stream_destroy(backend, handle), "Stream.close")

    def _live(self, call: str) -> int:
        if self.handle is None:
            raise ValueError(f"devstage {call}: the stream of {self.backend.describe()} was closed")
        return self.handle

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.handle is None else ("adopted" if self.adopted else "owned")
        return f"<devstage Stream of {self.backend.describe()}, {state}>"

    def _destroy_quietly(self) -> None:
        handle, self.handle = self.handle, None
        backend = getattr(self.backend, "_handle", None)
        if handle is not None and backend:
            Backend._stream_destroy(backend, handle)  # pylint: disable=protected-access

    def __del__(self) -> None:
        if not getattr(self, "adopted", True):  # an adopted stream's handle is the backend's
            self._destroy_quietly()


class Event:
    """An event of a backend: record(stream) marks the work enqueued there so far; ready() asks
    without blocking, synchronize() blocks until it completed, and wait_on(stream) makes work
    enqueued on `stream` afterwards wait for it. close() (or when it goes) destroys it."""

    _event_destroy = lib.devstage_event_destroy

    def __init__(self, backend: Backend, handle: int) -> None:
        self.backend, self.handle = backend, handle

    def _live(self, call: str) -> Tuple[int, int]:
        """The backend's and the event's handles."""
        backend = self.backend._live(call)  # pylint: disable=protected-access
        if self.handle is None:
            raise ValueError(f"devstage {call}: the event of {self.backend.describe()} was closed")
        return backend, self.handle

    def record(self, stream: Any) -> None:
        backend, event = self._live("Event.record")
        check(lib.devstage_event_record(backend, event, self.backend.stream(stream).handle), "Event.record")

    def ready(self) -> bool:
        backend, event = self._live("Event.ready")
        answer = c_int()
        check(lib.devstage_event_ready(backend, event, byref(answer)), "Event.ready")
        return bool(answer.value)

    def synchronize(self) -> None:
        backend, event = self._live("Event.synchronize")
        check(lib.devstage_event_synchronize(backend, event), "Event.synchronize")

    def wait_on(self, stream: Any) -> None:
        backend, event = self._live("Event.wait_on")
        check(lib.devstage_stream_wait_event(backend, self.backend.stream(stream).handle, event), "Event.wait_on")

    def close(self) -> None:
        if self.handle is None:
            return
        backend, event = self._live("Event.close")
        self.handle = None
        check(lib.devstage_event_destroy(backend, event), "Event.close")

    def __enter__(self) -> "Event":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _destroy_quietly(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        backend = getattr(getattr(self, "backend", None), "_handle", None)
        if handle is not None and backend:
            self._event_destroy(backend, handle)

    def __del__(self) -> None:
        self._destroy_quietly()


def _address(value, function):
    """A callback's address result (None or 0: none), checked: ctypes would crash on another type."""
    if value is None or value == 0:
        return None
    if not isinstance(value, int) or value < 0:
        raise TypeError(f"{getattr(function, '__name__', 'callback')} returned {value!r}, not an address (an int; 0 or "
                        "None for none)")
    return value


CALLBACK_ERRORS_KEPT = 256  # the latest tracebacks each backend keeps
LEAKED = 8                  # DEVSTAGE_LEAKED


def _no_gpu(error: Any) -> Any:
    """devstage.cuda's failure, said plainly when it means that no GPU can be used here: the CUDA
    runtime loaded, but the driver is missing or older than the runtime (cudaError 35), it is a
    stub (34), or there is no device (100)."""
    found = re.search(r"cudaError (\d+)", str(error))
    if not isinstance(error, NotSupported) or found is None or int(found.group(1)) not in _NO_GPU:
        return error
    return NotSupported(error.status, f"{str(error).split(':', 1)[0]}: no usable NVIDIA GPU here — "
                        f"{_NO_GPU[int(found.group(1))]} (the CUDA runtime said: "
                        f"{str(error).split(': ', 1)[-1]})")


_NO_GPU = {35: "the NVIDIA driver is missing or older than the CUDA runtime (a machine without a GPU has no driver)",
           34: "the CUDA runtime found only a stub of the driver: no NVIDIA driver is installed",
           100: "the NVIDIA driver sees no CUDA device"}


def _path(library_path):
    return None if library_path is None else str(library_path).encode()


# The optional callbacks and their C types (the required four are in from_callbacks' signature).
_CALLBACK_KINDS = (
    ("device_malloc", "MALLOC"), ("device_free", "FREE"), ("copy_to_device", "COPY"), ("copy_from_device", "COPY"),
    ("pinned_malloc", "MALLOC"), ("pinned_free", "FREE"),
    ("create_stream", "CREATE"), ("destroy_stream", "DESTROY"),
    ("copy_to_device_async", "COPY_ASYNC"), ("copy_from_device_async", "COPY_ASYNC"),
    ("create_event", "CREATE"), ("destroy_event", "DESTROY"), ("record_event", "RECORD"), ("event_ready", "READY"),
    ("synchronize_event", "DESTROY"), ("stream_wait_event", "RECORD"),
    ("device_memset", "MEMSET"), ("device_memset_async", "MEMSET_ASYNC"),
    ("synchronize", "SYNCHRONIZE"), ("launch_host_function", "LAUNCH"),
    ("host_register", "REGISTER"), ("host_unregister", "UNREGISTER"),
)


def _python_callback(function, kind, errors):
    """`function` (no context argument) as the C callback of type `kind`; an exception becomes
    a failure (NULL, or -1) and is kept in `errors`."""
    def failed():
        errors.append(traceback.format_exc())

    if kind == "MALLOC":
        def malloc(_context, nbytes):
            try:
                return _address(function(nbytes), function)
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
    if kind == "CREATE":
        def create(_context, out):
            try:
                handle = _address(function(), function)
                if not handle:
                    raise ValueError(f"{getattr(function, '__name__', 'create')} returned no handle")
                out[0] = handle
                return 0
            except Exception:  # pylint: disable=broad-except
                failed()
                return -1
        return create
    if kind == "READY":
        def ready(_context, event, out):
            try:
                out[0] = 1 if function(event) else 0
                return 0
            except Exception:  # pylint: disable=broad-except
                failed()
                return -1
        return ready
    if kind == "LAUNCH":
        def launch(_context, stream, host_function, user):
            try:
                function(stream, lambda: host_function(user))
                return 0
            except Exception:  # pylint: disable=broad-except
                failed()
                return -1
        return launch

    def call(_context, *args):  # the rest: 0 on success
        try:
            result = function(*args)
            if result is not None and not isinstance(result, int):
                raise TypeError(f"{getattr(function, '__name__', 'callback')} returned {result!r}: None or 0 on "
                                "success, a non-zero int on failure")
            return int(result or 0)
        except Exception:  # pylint: disable=broad-except
            failed()
            return -1
    return call
