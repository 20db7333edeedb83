# SPDX-License-Identifier: Apache-2.0
"""Backends and streams: the simulator, a CUDA or Ascend device, or a runtime's own callbacks;
streams made by devstage or adopted from the runtime (torch's, a raw handle); host functions on
a stream; host memory pinned in place."""
import atexit
import collections
import ctypes
import itertools
import threading
import traceback
import warnings
import weakref
from ctypes import byref, c_int, c_void_p

from . import _dlpack, _lib
from ._lib import lib
from .errors import Busy, HostFunctionError, check, error_of

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

    def __init__(self, handle, keepalive=(), dlpack_device=None):
        self._handle = handle
        self._keepalive = keepalive  # the ctypes callbacks the C backend calls
        # Tracebacks of exceptions raised inside Python callbacks and host functions (the latest).
        self.callback_errors = collections.deque(maxlen=CALLBACK_ERRORS_KEPT)
        self.number = next(_serials)
        self._adopted = {}            # native stream handle -> devstage's handle of it
        self._owned = weakref.WeakSet()  # the Streams and Events made through this backend
        self._stream_users = {}          # stream handle -> the runs and completions that use it
        self._stream_failures = {}       # stream handle -> host functions that raised there, unreported
        self._lock = threading.Lock()
        self._host_functions = {}     # key -> (its ctypes function, [the function] until it ran)
        self._host_function_keys = itertools.count(1)
        self._retired_host_functions = []
        kind, device = c_int(), c_int()
        check(lib.devstage_backend_device(handle, byref(kind), byref(device)))
        self.kind = _KIND_NAMES.get(kind.value, "unknown")
        self.device = device.value
        _live_backends.add(self)
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
        peer = host_of._handle if host_of is not None else None  # pylint: disable=protected-access
        check(lib.devstage_backend_create_sim_device(device, device_capacity, peer, byref(handle)))
        return cls(handle)

    @classmethod
    def cuda(cls, device=0, library_path=None):
        """CUDA device `device` through libcudart, loaded at run time (library_path None: as
        CudaBackend::create looks for it). LibraryNotFound names what it tried."""
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
        check(lib.devstage_backend_create_callbacks(byref(table), byref(handle)))
        backend = cls(handle, keepalive=tuple(made), dlpack_device=dlpack_device)
        backend.callback_errors = errors
        return backend

    # ---- what it is ------------------------------------------------------------------------

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

    def __repr__(self):
        return f"<devstage backend '{self.name}' #{self.number} ({self.kind}, device {self.device})>"

    def describe(self):
        """"backend 'sim' #2": how messages name it."""
        return f"backend '{self.name}' #{self.number}"

    # ---- memory ----------------------------------------------------------------------------

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

    def pinned_malloc(self, nbytes):
        """Page-locked host memory straight from the backend (a PinnedPool caches it instead)."""
        address = c_void_p()
        check(lib.devstage_pinned_malloc(self._handle, nbytes, byref(address)))
        return address.value

    def pinned_free(self, address):
        check(lib.devstage_pinned_free(self._handle, address))

    def copy_to_device_async(self, device_dst, host_src, nbytes, stream):
        """Enqueues a copy on `stream` (see Backend.stream)."""
        check(lib.devstage_copy_to_device_async(self._handle, device_dst, host_src, nbytes, self.stream(stream).handle))

    def copy_from_device_async(self, host_dst, device_src, nbytes, stream):
        check(lib.devstage_copy_from_device_async(self._handle, host_dst, device_src, nbytes,
                                                  self.stream(stream).handle))

    def create_event(self):
        """An event of this backend (never recorded: complete)."""
        handle = c_void_p()
        check(lib.devstage_event_create(self._handle, byref(handle)))
        event = Event(self, handle.value)
        self._owned.add(event)
        return event

    def host_register(self, address, nbytes):
        """Page-locks `nbytes` of existing host memory at `address` (cudaHostRegister and the
        like); NotSupported where the backend cannot. See PinnedPool.pin for the tensor form."""
        check(lib.devstage_host_register(self._handle, address, nbytes))

    def host_unregister(self, address):
        check(lib.devstage_host_unregister(self._handle, address))

    def synchronize(self):
        """Blocks until all work on the device completed."""
        check(lib.devstage_backend_synchronize(self._handle))

    # ---- streams ---------------------------------------------------------------------------

    def create_stream(self):
        """A new stream of this backend, destroyed by close() (or with the Stream object)."""
        handle = c_void_p()
        check(lib.devstage_stream_create(self._handle, byref(handle)))
        stream = Stream(self, handle.value, adopted=False)
        self._owned.add(stream)
        return stream

    def adopt_stream(self, native):
        """The runtime's stream `native` (a cudaStream_t or aclrtStream as an int; 0: the default
        stream) as a Stream of this backend; devstage never destroys it. The handle devstage keeps
        for it lives as long as the backend (or until close())."""
        native = int(native)
        with self._lock:
            handle = self._adopted.get(native)
            if handle is None:
                out = c_void_p()
                check(lib.devstage_stream_adopt(self._handle, native or None, byref(out)))
                handle = self._adopted[native] = out.value
        return Stream(self, handle, adopted=True)

    def stream(self, stream):
        """`stream` as a Stream of this backend: a Stream (of this backend, else ValueError naming
        both), a torch stream or any object with `cuda_stream` (or `npu_stream`, torch_npu's), or a
        raw handle (an int)."""
        if isinstance(stream, Stream):
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
        if isinstance(stream, int):
            return self.adopt_stream(stream)
        raise TypeError(f"devstage: {type(stream).__name__} is not a stream: pass a devstage Stream, a torch stream "
                        "(or anything with cuda_stream), or a raw handle (an int)")

    def launch_host_function(self, stream, function):
        """Enqueues `function()` on `stream` (see Backend.stream): it runs on the stream, after the
        work enqueued there before it (on the simulator, on the stream's worker thread; on CUDA,
        through cudaLaunchHostFunc). It must not call devstage. An exception inside it is kept in
        `callback_errors`. NotSupported where the backend cannot."""
        target = self.stream(stream)
        errors = self.callback_errors
        state = [function, False]  # the function until it runs; whether it returned
        with self._lock:
            key = next(self._host_function_keys)
            # A ctypes callback must not be freed while it runs: those that returned are kept
            # one more launch (their last instructions may still be executing), then freed.
            for retired in self._retired_host_functions:
                self._host_functions.pop(retired, None)
            self._retired_host_functions = [k for k, entry in self._host_functions.items() if entry[1][1]]

        failures = self._stream_failures
        handle = target.handle

        def run(_user):
            work, state[0] = state[0], None
            try:
                if work is not None:
                    work()
            except BaseException as error:  # pylint: disable=broad-except  (nothing above it to catch it)
                errors.append(traceback.format_exc())
                failures.setdefault(handle, []).append(f"{type(error).__name__}: {error}")
            finally:
                del work  # what the function holds (a run's tensors) goes when it returns
                state[1] = True

        pointer = _lib.HOST_FUNCTION(run)
        with self._lock:
            self._host_functions[key] = (pointer, state)
        status = lib.devstage_launch_host_function(self._handle, target.handle, pointer, None)
        if status != 0:
            state[0] = None
            with self._lock:
                self._host_functions.pop(key, None)
        check(status)

    def _raise_host_function_errors(self, handles):
        """Raises HostFunctionError for the host functions that raised on these streams since last
        asked (the first of them, and how many)."""
        found = []
        with self._lock:
            for handle in handles:
                found += self._stream_failures.pop(handle, [])
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise HostFunctionError("backend_failure", f"devstage: a host function on a stream of {self.describe()} "
                                    f"raised {found[0]}{more}; the traceback is in backend.callback_errors")

    def _use(self, handle, user):
        with self._lock:
            self._stream_users.setdefault(handle, weakref.WeakSet()).add(user)

    def _unuse(self, handle, user):
        with self._lock:
            users = self._stream_users.get(handle)
            if users is not None:
                users.discard(user)

    def _users_of(self, handle):
        with self._lock:
            return [user for user in self._stream_users.get(handle, ()) if user._uses_stream()]  # pylint: disable=protected-access

    def close(self):
        """Destroys the backend now, if nothing of devstage still uses it (stagers and pools keep
        it; Busy while a stream or event of it lives). A callbacks backend frees what was
        allocated through it and never freed, and raises Leaked saying what."""
        handle = self._handle
        if not handle:
            return
        for adopted in list(self._adopted.values()):
            check(self._stream_destroy(handle, adopted))
        self._adopted.clear()
        status = self._destroy(handle)
        if status in (0, LEAKED):
            self._handle = None
        if status != 0:
            raise error_of(status)

    def _info(self):
        info = _lib.BackendInfo()
        check(lib.devstage_backend_get_info(self._handle, byref(info)))
        return info

    def _forget_adopted(self, handle):
        with self._lock:
            for native, known in list(self._adopted.items()):
                if known == handle:
                    del self._adopted[native]

    def __del__(self):
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


class Stream:
    """A stream of a backend: made by `backend.create_stream()` (devstage destroys the runtime's
    stream with it) or adopted, `backend.adopt_stream(handle)`, `backend.stream(torch_stream)`
    (the runtime's; devstage never destroys it). `native` is the runtime's handle as an int (for
    launching kernels on it); `cuda_stream` too, so torch.cuda.ExternalStream(s.cuda_stream)
    wraps it."""

    def __init__(self, backend, handle, adopted):
        self.backend = backend
        self.handle = handle
        self.adopted = adopted

    @property
    def native(self):
        out = c_void_p()
        check(lib.devstage_stream_native(self._live(), byref(out)))
        return out.value or 0

    cuda_stream = native

    def synchronize(self):
        """Blocks until the work enqueued on the stream so far completed; HostFunctionError when a
        host function raised on it (since the failure was last reported)."""
        check(lib.devstage_stream_synchronize(self.backend._handle, self._live()))  # pylint: disable=protected-access
        self.backend._raise_host_function_errors((self.handle,))  # pylint: disable=protected-access

    def _synchronize_quietly(self):
        backend = getattr(self.backend, "_handle", None)
        if self.handle is not None and backend:
            lib.devstage_stream_synchronize(backend, self.handle)

    def _use(self, user):
        self.backend._use(self.handle, user)  # pylint: disable=protected-access

    def _unuse(self, user):
        self.backend._unuse(self.handle, user)  # pylint: disable=protected-access

    def close(self):
        """Destroys the stream (an adopted one: only devstage's handle of it, which a later
        adoption makes again)."""
        if self.handle is None:
            return
        users = self.backend._users_of(self.handle)  # pylint: disable=protected-access
        if users:
            raise Busy("busy", f"devstage Stream.close: {len(users)} run(s) of {self.backend.describe()} are bound on "
                               "this stream or finish on it and have not ended; finish them (and wait) first")
        handle, self.handle = self.handle, None
        if self.adopted:
            self.backend._forget_adopted(handle)  # pylint: disable=protected-access
        check(lib.devstage_stream_destroy(self.backend._handle, handle))  # pylint: disable=protected-access

    def _live(self):
        if self.handle is None:
            raise ValueError(f"devstage: the stream of {self.backend.describe()} was closed")
        return self.handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.handle is None else ("adopted" if self.adopted else "owned")
        return f"<devstage Stream of {self.backend.describe()}, {state}>"

    def _destroy_quietly(self):
        handle, self.handle = self.handle, None
        backend = getattr(self.backend, "_handle", None)
        if handle is not None and backend:
            Backend._stream_destroy(backend, handle)  # pylint: disable=protected-access

    def __del__(self):
        if not getattr(self, "adopted", True):  # an adopted stream's handle is the backend's
            self._destroy_quietly()


class Event:
    """An event of a backend: record(stream) marks the work enqueued there so far; ready() asks
    without blocking, synchronize() blocks until it completed, and wait_on(stream) makes work
    enqueued on `stream` afterwards wait for it. close() (or when it goes) destroys it."""

    _event_destroy = lib.devstage_event_destroy

    def __init__(self, backend, handle):
        self.backend, self.handle = backend, handle

    def _live(self):
        if self.handle is None:
            raise ValueError(f"devstage: the event of {self.backend.describe()} was closed")
        return self.handle

    def record(self, stream):
        check(lib.devstage_event_record(self.backend._handle, self._live(), self.backend.stream(stream).handle))  # pylint: disable=protected-access

    def ready(self):
        answer = c_int()
        check(lib.devstage_event_ready(self.backend._handle, self._live(), byref(answer)))  # pylint: disable=protected-access
        return bool(answer.value)

    def synchronize(self):
        check(lib.devstage_event_synchronize(self.backend._handle, self._live()))  # pylint: disable=protected-access

    def wait_on(self, stream):
        check(lib.devstage_stream_wait_event(self.backend._handle, self.backend.stream(stream).handle,  # pylint: disable=protected-access
                                             self._live()))

    def close(self):
        handle, self.handle = self.handle, None
        if handle is not None:
            check(lib.devstage_event_destroy(self.backend._handle, handle))  # pylint: disable=protected-access

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _destroy_quietly(self):
        handle, self.handle = getattr(self, "handle", None), None
        backend = getattr(getattr(self, "backend", None), "_handle", None)
        if handle is not None and backend:
            self._event_destroy(backend, handle)

    def __del__(self):
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

# The backends alive, for the shutdown at interpreter exit.
_live_backends = weakref.WeakSet()


@atexit.register
def _shutdown():
    """At interpreter exit, before Python stops its threads: the stagers end (their pending work
    waited for while a Python runtime's stream threads can still run it), then each backend waits
    for its device, so that no host function is left to call into a stopping interpreter."""
    from . import staging  # pylint: disable=import-outside-toplevel
    for stager in list(staging._live_stagers):  # pylint: disable=protected-access
        stager._shutdown()  # pylint: disable=protected-access
    for backend in list(_live_backends):
        handle = getattr(backend, "_handle", None)
        if handle:
            lib.devstage_backend_synchronize(handle)


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
