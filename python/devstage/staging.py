# SPDX-License-Identifier: Apache-2.0
"""Stagers: a run's host tensors staged on the device for its kernel, handed to it as device
tensors (DLPack), and copied back after."""
import threading
import weakref
from ctypes import byref, c_int, c_size_t, c_void_p

from . import _dlpack, _dtypes, _host, _lib
from ._lib import lib
from .args import DIRECTION_NAMES, frame_shapes, stage_args
from .errors import Busy, InvalidArgument, check, error_of
from .frames import Frame, PendingCompletion

_STRATEGIES = {"retained": 0, "per_tensor": 1}
_GROWTHS = {"exact": 0, "geometric": 1, "granular": 2}
_ORDERS = {"allocate_first": 0, "free_first": 1}
_OUTPUTS = {"zero": 0, "kernel_writes_all": 1}
_EXECUTION_FAILED = 4  # DEVSTAGE_BACKEND_FAILURE: the kernel failed, nothing is copied back


class Stager:
    """Stages runs on one backend for one runner (use it from one thread).
    `stager = Stager(backend, pack_limit=16384); run = stager.bind([In(x), Out(y)])`

    strategy: "retained" (one device buffer per slot, kept across runs) or "per_tensor";
    pack_limit: 0, or 4096, 16384 or 65536 (args of at most that many bytes move in one copy
    each way; needs pinned memory); pipeline_slots: runs in flight; growth: "exact",
    "geometric" (growth_factor=(numerator, denominator)) or "granular" (growth_granule, a power
    of two), growth_cap (0: none) and grow_order ("allocate_first" or "free_first");
    output_policy: "zero" (Out args read as zeros where the kernel writes nothing) or
    "kernel_writes_all" (left as the device memory was: no zeroing call per run). Every
    configuration error is reported at once, in one InvalidArgument (or NotSupported)."""

    _destroy = lib.devstage_stager_destroy

    def __init__(self, backend, strategy="retained", pack_limit=0, pipeline_slots=1, growth="exact",
                 growth_factor=(2, 1), growth_granule=0, growth_cap=0, grow_order="allocate_first",
                 output_policy="zero"):
        problems = []
        config = _lib.StagerConfig()
        config.strategy = _choice("strategy", strategy, _STRATEGIES, problems)
        config.growth = _choice("growth", growth, _GROWTHS, problems)
        config.grow_order = _choice("grow_order", grow_order, _ORDERS, problems)
        config.output_policy = _choice("output_policy", output_policy, _OUTPUTS, problems)
        for field, value in (("pack_limit", pack_limit), ("pipeline_slots", pipeline_slots),
                             ("growth_granule", growth_granule), ("growth_cap", growth_cap)):
            if isinstance(value, int) and value >= 0:
                setattr(config, field, value)
            else:
                problems.append(f"{field} {value!r} is not a non-negative int")
        if growth == "geometric":
            try:
                config.growth_numerator, config.growth_denominator = (int(v) for v in growth_factor)
            except (TypeError, ValueError):
                problems.append(f"growth_factor {growth_factor!r} is not (numerator, denominator)")
        self.backend = backend  # outlives the stager
        self._held = []         # the memory of runs that may still have copies pending
        self._lock = threading.Lock()
        self._own_stream = None  # for synchronous finishes of frame runs
        self._deferred = []      # Completions whose finish waits for the run's exported tensors
        self._runs = weakref.WeakSet()  # the live runs
        self._in_use = threading.Lock()  # held by the call in progress: a second thread is refused
        self._user = None                # the thread of the call in progress
        self._depth = 0
        self._handle = c_void_p()
        status = lib.devstage_stager_create(backend._handle, byref(config), byref(self._handle))  # pylint: disable=protected-access
        if status != 0:
            failure = error_of(status)
            problems.append(str(failure))
            raise type(failure)(failure.status, "devstage: Stager: " + "; ".join(problems))
        if problems:
            handle, self._handle = self._handle, None
            lib.devstage_stager_destroy(handle)
            raise _invalid("devstage: Stager: " + "; ".join(problems))
        _live_stagers.add(self)

    def _guard(self, what):
        """Held for one call: a call from a second thread at the same time is refused."""
        return _Guard(self, what)

    # ---- the run lifecycle -------------------------------------------------------------------

    def bind(self, args, stream=None):
        """Plans, grows if needed and uploads the In and InOut args: synchronously, or enqueued
        on `stream` (a devstage Stream of this backend, a torch stream, or a raw handle). `args`:
        a list of In(), Out(), InOut(), Device(); or a Frame from frame(). The Run holds the args
        (and so their memory) until it ends."""
        with self._guard("bind"):
            return self._bind(args, stream)

    def _bind(self, args, stream):
        self._flush()
        target = None if stream is None else self.backend.stream(stream)
        run = c_void_p()
        if isinstance(args, Frame):
            frame = args
            if frame.stager is not self:
                raise ValueError("devstage: the frame belongs to another stager")
            handle = frame._live_handle()  # pylint: disable=protected-access
            if target is None:
                status = lib.devstage_bind_frame(self._handle, handle, byref(run))
            else:
                status = lib.devstage_bind_frame_on(self._handle, handle, target.handle, byref(run))
            if status != 0:
                frame._bound = False  # pylint: disable=protected-access  (a failed bind leaves it bindable)
                self._raise(status)
            return Run(self, run, frame.staged(), target, frame)
        staged = stage_args(args, self.backend)
        try:
            if target is None:
                status = lib.devstage_bind(self._handle, staged.table, staged.count, byref(run))
            else:
                status = lib.devstage_bind_on(self._handle, staged.table, staged.count, target.handle, byref(run))
            if status != 0:
                self._raise(status)
        except BaseException:
            staged.close()
            raise
        return Run(self, run, staged, target, None)

    def frame(self, shapes):
        """A free slot's pinned mirror laid out for `shapes` (TensorShape), for inputs written in
        place: write frame[i] (a NumPy or torch view, see Frame), then bind(frame[, stream]).
        Needs a packing stager."""
        with self._guard("frame"):
            self._flush()
            table, keep = frame_shapes(shapes, self.backend)
            handle = c_void_p()
            status = lib.devstage_frame_create(self._handle, table, len(shapes), byref(handle))
            if status != 0:
                for memory in keep:
                    memory.close()
                self._raise(status)
            frame = Frame(self, handle, list(shapes), keep)
            _live_frames.add(frame)
            return frame

    def _raise(self, status):
        """Raises the failure of a bind or frame; a Busy one says what holds the slots in Python."""
        failure = error_of(status)
        if isinstance(failure, Busy):
            with self._lock:
                deferred = len(self._deferred)
            live = sum(1 for run in self._runs if run.live)
            notes = []
            if live:
                notes.append(f"{live} run(s) bound and not finished")
            if deferred:
                notes.append(f"{deferred} finished run(s) whose exported tensors are still alive")
            frames = sum(1 for frame in list(_live_frames) if frame.stager is self and frame._views_alive())  # pylint: disable=protected-access
            if frames:
                notes.append(f"{frames} frame(s) kept by NumPy or torch views still alive")
            if notes:
                failure = Busy(failure.status, f"{failure}. Here: " + "; ".join(notes) + " (in Python a frame's slot "
                               "is held until its Completion is closed and its last view is gone)")
        raise failure

    def order_after_uploads(self, run, stream):
        """Work enqueued on `stream` after this call runs after `run`'s bind (its uploads), with a
        stream wait: no host wait. Uploads on a copy stream, the kernel on a compute stream."""
        target = self.backend.stream(stream)
        check(lib.devstage_order_after_uploads(self._handle, run._live(self), target.handle))  # pylint: disable=protected-access

    def finish(self, run, stream=None, ok=True):
        """Ends a run: copies back Out and InOut args if `ok` (the kernel succeeded) and gives
        back its memory. Synchronously (the kernel must have completed; refused, Busy, while a
        device tensor of the run is still exported), or enqueued on `stream` after the kernel
        there: then it returns a Completion to wait on. While a tensor exported from the run's
        device args (torch.from_dlpack, DeviceTensor.numpy()) is alive, the run stays live — its
        device memory valid, its slot taken — and the copy-backs are enqueued on `stream` once
        the last such tensor is gone (at this stager's next call, or the Completion's)."""
        with self._guard("finish"):
            return self._finish(run, stream, ok)

    def _finish(self, run, stream, ok):
        run._live(self)  # pylint: disable=protected-access
        if run.stream is not None and run.stream.handle is None:
            raise ValueError("devstage finish: the stream the run was bound on was closed")
        self._flush()
        target = None if stream is None else self.backend.stream(stream)
        execution = 0 if ok else _EXECUTION_FAILED
        if target is None:
            run._check_exports("finish")  # pylint: disable=protected-access
            if run.frame is None:
                handle = run._end()  # pylint: disable=protected-access
                self._ended(run, lib.devstage_finish(self._handle, handle, execution))
                staged = run._take_memory()  # pylint: disable=protected-access
                if staged is not None:
                    staged.close()
                return None
            # A frame run ends through a completion, so the frame stays held while its views live.
            completion = Completion(self, run, self._frame_finish_stream(), execution)
            completion._issue()  # pylint: disable=protected-access
            completion.wait()
            completion.close()
            return None
        completion = Completion(self, run, target, execution)
        if run._exports_alive():  # pylint: disable=protected-access
            with self._lock:
                self._deferred.append(completion)
        else:
            completion._issue()  # pylint: disable=protected-access
        return completion

    def _flush(self):
        """Enqueues the finishes that waited for their runs' exported tensors, once those are gone."""
        if not self._deferred:
            return
        with self._lock:
            ready = [c for c in self._deferred if not c._run_exports_alive()]  # pylint: disable=protected-access
            self._deferred = [c for c in self._deferred if c not in ready]
        for completion in ready:
            completion._issue()  # pylint: disable=protected-access

    def _frame_finish_stream(self):
        if self._own_stream is None:
            self._own_stream = self.backend.create_stream()
        return self._own_stream

    def _ended(self, run, status):
        if status != 0:
            # A run that failed at finish may still have copies pending on its memory.
            failure = error_of(status)
            self._hold(run._take_memory())  # pylint: disable=protected-access
            raise failure

    def _hold(self, memory):
        if memory is not None:
            with self._lock:
                self._held.append(memory)

    def release(self):
        """Gives back all device memory now (waiting for pending work); the host memory of
        failed and dropped runs is let go then. Refused (Busy) while a device tensor of a live run
        or a view of a frame is still exported."""
        with self._guard("release"):
            self._release()

    def _release(self):
        self._flush()
        with self._lock:
            exported = [c for c in self._deferred if c._run_exports_alive()]  # pylint: disable=protected-access
        if exported:
            raise Busy("busy", f"devstage release: {len(exported)} finished run(s) still have device args exported "
                               "(tensors from torch.from_dlpack or DeviceTensor.numpy() alive); drop them first")
        for run in list(self._runs):
            run._check_exports("release")  # pylint: disable=protected-access
        check(lib.devstage_stager_release(self._handle))
        for run in list(self._runs):
            run._released()  # pylint: disable=protected-access
        self._let_go()

    def abandon(self):
        """Forgets all device memory and pending work without waiting (after a device reset or a
        failure no wait recovers from): completions resolve with BackendFailure and the host
        memory of their runs is let go, though the device may still write it."""
        with self._guard("abandon"):
            check(lib.devstage_stager_abandon(self._handle))
            with self._lock:
                deferred, self._deferred = self._deferred, []
            for completion in deferred:
                completion._abandoned()  # pylint: disable=protected-access
            for run in list(self._runs):
                run._released()  # pylint: disable=protected-access
            self._let_go()

    def _let_go(self):
        with self._lock:
            held, self._held = self._held, []
        for staged in held:
            staged.close()

    def reserve(self, nbytes):
        """Grows every slot to at least `nbytes` now (retained strategy)."""
        with self._guard("reserve"):
            self._flush()
            check(lib.devstage_stager_reserve(self._handle, nbytes))

    @property
    def stats(self):
        """The stager's counters as a dict (StagerStats)."""
        with self._guard("stats"):
            self._flush()
            stats = _lib.StagerStats()
            check(lib.devstage_stager_stats_get(self._handle, byref(stats)))
        return {name: getattr(stats, name) for name in _lib.STAGER_STATS_FIELDS}

    def _shutdown(self):
        """Ends the stager now: the finishes still waiting for exported tensors are enqueued (or,
        with tensors still alive, dropped: their runs end without copy-backs), pending work is
        waited for, and the C stager destroyed. At interpreter exit this runs while the threads of
        a Python runtime's streams can still work."""
        handle = getattr(self, "_handle", None)
        if not handle:
            return
        try:
            for completion in list(self._deferred):  # host functions holding tensors give them back
                completion._stream._synchronize_quietly()  # pylint: disable=protected-access
            self._flush()
        except Exception:  # pylint: disable=broad-except
            pass  # nothing to report to at this point: the stager's sink has the library's reports
        self._handle = None
        stream, self._own_stream = self._own_stream, None
        self._destroy(handle)
        if stream is not None:
            stream._destroy_quietly()  # pylint: disable=protected-access
        for staged in self._held:
            staged.close()
        self._held = []

    def __del__(self):
        self._shutdown()


class _Guard:
    """One call on a stager: re-entrant on the thread that makes it, Busy from another thread."""

    __slots__ = ("stager", "what", "entered")

    def __init__(self, stager, what):
        self.stager, self.what, self.entered = stager, what, False

    def __enter__(self):
        stager = self.stager
        me = threading.get_ident()
        if stager._user != me:  # pylint: disable=protected-access
            if not stager._in_use.acquire(blocking=False):  # pylint: disable=protected-access
                raise Busy("busy", f"devstage Stager.{self.what}: the stager is in a call on another thread; a "
                                   "stager, its runs, frames and completions are used from one thread at a time "
                                   "(give each thread a stager of its own)")
            stager._user = me  # pylint: disable=protected-access
            self.entered = True
        stager._depth += 1  # pylint: disable=protected-access
        return self

    def __exit__(self, *exc):
        stager = self.stager
        stager._depth -= 1  # pylint: disable=protected-access
        if self.entered:
            stager._user = None  # pylint: disable=protected-access
            stager._in_use.release()  # pylint: disable=protected-access


# The stagers alive, for the shutdown at interpreter exit (see _shutdown).
_live_stagers = weakref.WeakSet()
_live_frames = weakref.WeakSet()


class DeviceTensor:
    """One device arg of a bound run: `data_ptr` (an int; also what int() and ctypes give),
    `nbytes`, `shape`, `dtype`, `direction`, `device` ((DLPack device type, id)).
    `torch.from_dlpack(t)` is a zero-copy tensor of the staged memory, of its shape and dtype (on a
    host-memory device, the simulator's, `t.numpy()` and `numpy.asarray(t)` are writable NumPy
    views too). Each such tensor keeps the run's device memory valid while it lives: the run's
    copy-backs wait for it (see Stager.finish). A finished run's args cannot be exported."""

    __slots__ = ("_run_ref", "_backend", "index", "data_ptr", "nbytes", "shape", "dtype", "direction")

    def __init__(self, run, index, data_ptr, nbytes, shape, dtype, direction):
        self._run_ref = weakref.ref(run)  # the run holds its tensors, an export holds the run
        self._backend = run.stager.backend
        self.index, self.data_ptr, self.nbytes = index, data_ptr, nbytes
        self.shape, self.dtype, self.direction = shape, dtype, direction

    @property
    def _run(self):
        run = self._run_ref()
        if run is None:
            raise BufferError(f"devstage: device arg {self.index} belongs to a run that was dropped")
        return run

    @property
    def device(self):
        return self._backend.dlpack_device

    def __dlpack_device__(self):
        device = self.device
        if device is None:
            raise BufferError(f"devstage: {self._backend.describe()} has no DLPack device (give "
                              "dlpack_device= to from_callbacks)")
        return device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):  # pylint: disable=unused-argument
        """A "dltensor" capsule of the staged memory on the backend's device. `stream` (a CUDA or
        ACL stream handle of the consumer; None or -1: none) is ordered after the run's uploads
        with a stream wait, as the DLPack protocol asks of a producer."""
        device = self.__dlpack_device__()
        if copy:
            raise BufferError("devstage: a staged device arg is exported without a copy (copy=True refused)")
        run = self._run
        run._exportable(self.index)  # pylint: disable=protected-access
        if stream is not None and stream != -1 and device[0] != _dlpack.CPU and run.stream is not None:
            if run.stream.native != stream:
                run.stager.order_after_uploads(run, stream)
        code, bits, _ = _dtypes.DTYPES[self.dtype]
        if self.nbytes == 0:  # no memory to keep valid
            return _dlpack.capsule((self, run), None, self.shape, code, bits, device)
        run._exported(1)  # pylint: disable=protected-access
        try:
            return _dlpack.capsule((self, run), self.data_ptr, self.shape, code, bits, device,
                                   on_release=run._released_export)  # pylint: disable=protected-access
        except BaseException:
            run._exported(-1)  # pylint: disable=protected-access
            raise

    def numpy(self):
        """A writable NumPy view of the staged memory (host-memory devices only: the simulator's,
        a callbacks backend whose dlpack_device is kDLCPU); it keeps the run's memory valid while
        it lives, as a DLPack export does."""
        import numpy  # pylint: disable=import-outside-toplevel
        if self.device is None or self.device[0] != _dlpack.CPU:
            raise BufferError(f"devstage: the staged memory is on {self.device} device memory, not host memory: "
                              "use torch.from_dlpack")
        self._run._exportable(self.index)  # pylint: disable=protected-access
        return numpy.asarray(_HostExport(self))

    def __array__(self, dtype=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __index__(self):
        return self.data_ptr

    __int__ = __index__

    @property
    def _as_parameter_(self):
        return c_void_p(self.data_ptr or None)

    def __repr__(self):
        return (f"DeviceTensor({DIRECTION_NAMES[self.direction]}, shape={self.shape}, dtype={self.dtype}, "
                f"data_ptr={self.data_ptr:#x})")


class _HostExport:
    """What a NumPy view of host-visible staged memory is made from: counted as an export of its
    run while the view (its base) lives."""

    __slots__ = ("__array_interface__", "_run", "__weakref__")

    def __init__(self, tensor):
        run = self._run = tensor._run  # pylint: disable=protected-access
        self.__array_interface__ = _host.array_interface(tensor.data_ptr, tensor.shape, tensor.dtype)
        if tensor.nbytes:  # no memory to keep valid otherwise
            run._exported(1)  # pylint: disable=protected-access
            weakref.finalize(self, run._released_export)  # pylint: disable=protected-access


class Run:
    """A bound run: `device_args`, the DeviceTensors to launch the kernel on (in the args' order;
    device args unchanged, zero-byte args at address 0; also run[i]), `device_pointers` their
    addresses, `slot` its pipeline slot, `stream` the bind's stream (None: synchronous). Dropped
    without finish, it copies nothing back."""

    _run_destroy = lib.devstage_run_destroy

    def __init__(self, stager, handle, staged, stream, frame):
        self.stager = stager
        self.stream = stream
        self.frame = frame
        self._handle = handle
        self._staged = staged
        self._finishing = False
        self._exports = 0
        self._lock = threading.Lock()
        count = staged.count
        pointers = (c_void_p * max(count, 1))()
        check(lib.devstage_run_device_args(handle, pointers, count))
        self.device_pointers = [p or 0 for p in pointers[:count]]
        self.device_args = [
            DeviceTensor(self, i, self.device_pointers[i], staged.table[i].bytes, staged.shapes[i],
                         staged.dtypes[i], staged.directions[i]) for i in range(count)]
        slot = c_size_t()
        check(lib.devstage_run_slot(handle, byref(slot)))
        self.slot = slot.value
        stager._runs.add(self)  # pylint: disable=protected-access
        if stream is not None:
            stream._use(self)  # pylint: disable=protected-access  (closing the stream is refused meanwhile)

    def __getitem__(self, index):
        return self.device_args[index]

    def __len__(self):
        return len(self.device_args)

    @property
    def live(self):
        """True until the run is finished (or its finish was asked for) or dropped."""
        return self._handle is not None and not self._finishing

    def _live(self, stager):
        if self._handle is None or self._finishing:
            raise ValueError("devstage: this run was finished already")
        if stager is not self.stager:
            raise ValueError("devstage: the run belongs to another stager")
        return self._handle

    def _exportable(self, index):
        if self._handle is None or self._finishing:
            raise BufferError(f"devstage: device arg {index} of a finished run cannot be exported: its memory is the "
                              "next run's")

    def _exported(self, delta):
        with self._lock:
            self._exports += delta

    def _released_export(self):
        self._exported(-1)

    def _exports_alive(self):
        if self._exports:
            _dlpack.collect()  # capsules their consumer refused or dropped are given back
        with self._lock:
            return self._exports

    def _check_exports(self, what):
        alive = self._exports_alive()
        if alive:
            raise Busy("busy", f"devstage {what}: {alive} tensor(s) exported from the device args of the run on slot "
                               f"{self.slot} (torch.from_dlpack, DeviceTensor.numpy()) are still alive; drop them (or "
                               ".clone() what you keep) first: the run's device memory is reused once it ends. The "
                               "run stays live.")

    def _end(self):
        handle, self._handle = self._handle, None
        self.stager._runs.discard(self)  # pylint: disable=protected-access
        if self.stream is not None:
            self.stream._unuse(self)  # pylint: disable=protected-access
        return handle

    def _uses_stream(self):
        return self._handle is not None

    def _take_memory(self):
        staged, self._staged = self._staged, None
        return staged

    def _released(self):
        """The stager released or abandoned this live run: it ended without copy-backs."""
        if self._finishing:
            return
        handle = self._end()
        if handle:
            self._run_destroy(handle)
            self.stager._hold(self._take_memory())  # pylint: disable=protected-access

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and not self._finishing:
            self._run_destroy(handle)
            self.stager._hold(self._take_memory())  # pylint: disable=protected-access


class Completion:
    """The end of a run finished on a stream: wait() blocks until its outputs are in host memory
    (raising the run's failure), ready() asks without blocking, `pending` tells whether devstage
    still owns the run's host memory. close() (or destruction; a context manager) waits if
    nothing did and ends it. When a wait fails and the run's work may still be running, the
    Completion stays pending: wait() again (after the device recovered: backend.synchronize()),
    or stager.abandon(); close() raises and keeps the run's memory until then."""

    _destroy = lib.devstage_completion_destroy
    _ready = lib.devstage_completion_ready

    def __init__(self, stager, run, stream, execution):
        self._stager = stager
        self._run = run            # until the finish is enqueued
        self._stream = stream
        self._execution = execution
        self._handle = None
        self._staged = None
        self._frame = run.frame
        self._closed = False
        # The streams whose host-function failures this run's wait reports.
        self._streams = tuple(s.handle for s in (run.stream, stream) if s is not None)
        run._finishing = True  # pylint: disable=protected-access
        stream._use(self)  # pylint: disable=protected-access  (closing the stream is refused meanwhile)

    def _run_exports_alive(self):
        return self._run is not None and self._run._exports_alive()  # pylint: disable=protected-access

    def _issue(self):
        """Enqueues the finish: the copy-backs on the stream, the C completion."""
        run, self._run = self._run, None
        handle = run._end()  # pylint: disable=protected-access
        self._stream._unuse(self)  # pylint: disable=protected-access
        done = c_void_p()
        status = lib.devstage_finish_on(self._stager._handle, handle, self._stream.handle,  # pylint: disable=protected-access
                                        self._execution, byref(done))
        if status != 0:
            self._closed = True
            self._stager._ended(run, status)  # pylint: disable=protected-access  (raises)
        self._handle = done.value
        self._staged = run._take_memory()  # pylint: disable=protected-access

    def _abandoned(self):
        """Its stager was abandoned while the finish waited for exported tensors: the run ended
        without copy-backs."""
        run, self._run = self._run, None
        self._closed = True
        self._stream._unuse(self)  # pylint: disable=protected-access
        handle = run._end()  # pylint: disable=protected-access
        if handle:
            Run._run_destroy(handle)  # pylint: disable=protected-access  (inert after the abandon)
        staged = run._take_memory()  # pylint: disable=protected-access
        if staged is not None:
            staged.close()

    def _uses_stream(self):
        return self._handle is None and not self._closed

    def _enqueued(self, what):
        """The C completion, once the finish is enqueued; raises Busy while exported tensors of the
        run are alive after the finish stream's earlier work completed."""
        if self._handle is not None:
            return self._handle
        if self._closed:
            raise ValueError("devstage: this completion was closed")
        self._stager._flush()  # pylint: disable=protected-access
        if self._handle is None and what != "ready":
            self._stream.synchronize()  # host functions enqueued before the finish give their tensors back
            self._stager._flush()  # pylint: disable=protected-access
        if self._handle is None:
            if what == "ready":
                return None
            self._run._check_exports(f"Completion.{what}")  # pylint: disable=protected-access
            self._stager._flush()  # pylint: disable=protected-access
        return self._handle

    def wait(self):
        with self._stager._guard("Completion.wait"):  # pylint: disable=protected-access
            check(lib.devstage_completion_wait(self._enqueued("wait")))
            self._stager.backend._raise_host_function_errors(self._streams)  # pylint: disable=protected-access

    def ready(self):
        with self._stager._guard("Completion.ready"):  # pylint: disable=protected-access
            handle = self._enqueued("ready")
            if handle is None:
                return False
            answer = c_int()
            check(lib.devstage_completion_ready(handle, byref(answer)))
            return bool(answer.value)

    @property
    def pending(self):
        if self._closed:
            return False
        if self._handle is None:
            return True
        answer = c_int()
        check(lib.devstage_completion_pending(self._handle, byref(answer)))
        return bool(answer.value)

    def close(self):
        if self._closed:
            return
        with self._stager._guard("Completion.close"):  # pylint: disable=protected-access
            self._close()

    def _close(self):
        if self._closed:
            return
        handle = self._enqueued("close")
        if self._frame is not None and self._frame._views_alive():  # pylint: disable=protected-access
            # The frame stays held (its memory valid) until its last view is gone.
            self.wait()
            self._closed, self._handle = True, None
            self._frame._release_with_views(handle, self._staged)  # pylint: disable=protected-access
            self._staged = None
            return
        check(lib.devstage_completion_destroy(handle))
        self._closed, self._handle = True, None
        staged, self._staged = self._staged, None
        if staged is not None:
            staged.close()
        if self._frame is not None:
            self._frame._retire()  # pylint: disable=protected-access

    def _orphan(self):
        """Dropped unclosed: ends without a caller to report to."""
        handle, self._handle = self._handle, None
        frame = self._frame
        if frame is not None and frame._views_alive():  # pylint: disable=protected-access
            frame._release_with_views(handle, self._staged)  # pylint: disable=protected-access
            return
        if self._destroy(handle) != 0:
            # Still pending: the stager keeps the run's memory until it is released or abandoned.
            self._stager._hold(PendingCompletion(handle, self._staged))  # pylint: disable=protected-access
        elif self._staged is not None:
            self._staged.close()
        if frame is not None:
            frame._retire()  # pylint: disable=protected-access

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._handle is not None:
            self._orphan()
        # else: the stager's deferred list still holds this completion; its finish is enqueued
        # (and then orphaned) once the run's exported tensors are gone


def _choice(field, value, choices, problems):
    if value not in choices:
        problems.append(f"{field} {value!r} is not one of {', '.join(choices)}")
        return 0
    return choices[value]


def _invalid(message):
    return InvalidArgument("invalid_argument", message)
