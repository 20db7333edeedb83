# SPDX-License-Identifier: Apache-2.0
"""Stagers: a run's host tensors staged on the device for its kernel, handed to it as device
tensors (DLPack), and copied back after. The run lifecycle reads top to bottom here — frame,
bind, finish — and the ending of the stager after it: release, reserve, abandon, close."""
import gc
import weakref
from ctypes import byref, c_size_t, c_void_p
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _calls, _dlpack, _lib, lifecycle, regions as _regions
from ._lib import lib
from ._slots import SlotLedger
from .args import TensorShape, stage_args
from .backend import Stream
from .completion import Completion
from .errors import Busy, invalid
from .frames import Frame, Layout
from .run import DeviceExports, Run

_EXECUTION_FAILED = 4  # DEVSTAGE_BACKEND_FAILURE: the kernel failed, nothing is copied back
_LAYOUTS_KEPT = 8      # the latest distinct shape lists stager.frame(shapes) keeps laid out

# The keywords of the configuration given by name: keyword -> {name: the C value}.
_CHOICES = {
    "strategy": {"retained": 0, "per_tensor": 1, "retained_vmm": 2},
    "growth": {"exact": 0, "geometric": 1, "granular": 2},
    "grow_order": {"allocate_first": 0, "free_first": 1},
    "output_policy": {"zero": 0, "kernel_writes_all": 1},
}
# The keywords given as sizes (non-negative ints), each its field of devstage_stager_config.
_SIZES = ("pack_limit", "pipeline_slots", "growth_granule", "growth_cap")


def _config(problems: List[str], keywords: Dict[str, Any]) -> _lib.StagerConfig:
    """devstage_stager_config of the Stager keywords; what is wrong with them goes to `problems`."""
    config = _lib.StagerConfig()
    for field, choices in _CHOICES.items():
        value = keywords[field]
        if value in choices:
            setattr(config, field, choices[value])
        else:
            problems.append(f"{field} {value!r} is not one of {', '.join(choices)}")
    for field in _SIZES:
        value = keywords[field]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            setattr(config, field, value)
        else:
            problems.append(f"{field} {value!r} is not a non-negative int")
    if keywords["growth"] == "geometric":
        try:
            config.growth_numerator, config.growth_denominator = (int(v) for v in keywords["growth_factor"])
        except (TypeError, ValueError):
            problems.append(f"growth_factor {keywords['growth_factor']!r} is not (numerator, denominator)")
    if type(keywords["map_small"]) is bool:  # pylint: disable=unidiomatic-typecheck
        config.map_small = int(keywords["map_small"])
    else:
        problems.append(f"map_small {keywords['map_small']!r} is not True or False")
    return config


# The C configuration's words for the Stager keywords' values, in its messages.
_C_TERMS = (("map_small 1 ", "map_small=True "), ("per-tensor strategy", "per_tensor strategy"))


def _python_terms(message: str) -> str:
    for c_words, python_words in _C_TERMS:
        message = message.replace(c_words, python_words)
    return message


class _Core:
    """The C stager, destroyed by destroy() or with the last of the Stager and the views and
    exports of its memory (each keeps this object); and `held`, the memory of runs that may still
    have copies pending (a failed finish, a dropped run), let go once the C stager waited for them
    (release(), abandon(), its destruction)."""

    __slots__ = ("handle", "held", "backend", "hooks", "__weakref__")
    _destroy = lib.devstage_stager_destroy

    def __init__(self, handle: int, backend: Any) -> None:
        self.handle: Optional[int] = handle
        self.held: List[Any] = []
        self.backend = backend  # its callbacks outlive the C stager
        self.hooks = _regions.HookHolder()  # region hooks: called until the C stager goes

    def let_go(self) -> None:
        held, self.held = self.held, []
        for memory in held:
            memory.close()

    def destroy(self) -> int:
        handle, self.handle = self.handle, None
        status = self._destroy(handle) if handle else 0
        self.let_go()
        return status

    def __del__(self) -> None:
        self.destroy()


class Stager:
    """Stages runs on one backend for one runner (use it from one thread at a time).
    `stager = Stager(backend, pack_limit=16384); run = stager.bind([In(x), Out(y)])`

    strategy: "retained" (one device buffer per slot, kept across runs), "per_tensor" (one
    allocation per arg per run) or "retained_vmm" (one buffer per slot grown in place in reserved
    virtual memory, its address never changing; backends with virtual memory);
    pack_limit: 0, or any byte limit under which args move in one copy each way (needs pinned
    memory; frames need it); map_small: True puts those small args in the pinned mirror mapped for
    the device, where the backend maps it (the kernel reads and writes them in place, no copy;
    stats mapped_runs), copied as without it elsewhere; pipeline_slots: runs in flight; growth:
    "exact", "geometric" (growth_factor=(numerator, denominator)) or "granular" (growth_granule, a
    power of two), growth_cap (0: none; retained_vmm: the bytes reserved, 0: 64 GiB) and
    grow_order ("allocate_first" or "free_first"); output_policy: "zero" (Out args read as zeros
    where the kernel writes nothing) or "kernel_writes_all". Every
    configuration error is reported at once, in one InvalidArgument (or NotSupported).
    close() (or a `with` block) gives everything back."""

    def __init__(self, backend: Any, strategy: str = "retained", pack_limit: int = 0, pipeline_slots: int = 1,
                 growth: str = "exact", growth_factor: Tuple[int, int] = (2, 1), growth_granule: int = 0,
                 growth_cap: int = 0, grow_order: str = "allocate_first", output_policy: str = "zero",
                 map_small: bool = False) -> None:
        self._h: Optional[int] = None  # the C stager's handle (None: closed)
        backend_handle = backend._live("Stager(backend)")  # pylint: disable=protected-access
        problems: List[str] = []
        config = _config(problems, dict(strategy=strategy, pack_limit=pack_limit, pipeline_slots=pipeline_slots,
                                        growth=growth, growth_factor=growth_factor, growth_granule=growth_granule,
                                        growth_cap=growth_cap, grow_order=grow_order, output_policy=output_policy,
                                        map_small=map_small))
        handle = c_void_p()
        status = lib.devstage_stager_create(backend_handle, byref(config), byref(handle))
        if status != 0:
            failure = _lib.error_of(status)
            problems.append(_python_terms(str(failure).removeprefix("devstage_stager_create: ")))
            raise type(failure)(failure.status, "devstage Stager: " + "; ".join(problems))
        if problems:
            lib.devstage_stager_destroy(handle)
            raise invalid("devstage Stager: " + "; ".join(problems))
        self.backend = backend  # outlives the stager
        self.pipeline_slots = max(config.pipeline_slots, 1)
        self._core = _Core(handle.value, backend)
        self._h = handle.value
        self._ledger = SlotLedger(self.pipeline_slots)
        self._guard = _calls.Guard()  # held by the call in progress: a second thread is refused
        self._deferred: List[Completion] = []  # finishes waiting for the runs' exported tensors
        self._layouts: Dict[Tuple[TensorShape, ...], Layout] = {}  # frame(shapes)'s, latest last
        # The same, keyed by the identities of the TensorShape objects (hashed in C, where a
        # TensorShape hashes in Python): an engine that frames the same shape objects every step
        # finds its layout without hashing them. Each entry holds the shape objects of its key, so
        # an id is not reused while the entry is kept.
        self._layouts_by_id: Dict[Tuple[int, ...], Tuple[Layout, Tuple[TensorShape, ...]]] = {}
        self._all_layouts: "weakref.WeakSet[Layout]" = weakref.WeakSet()
        # Views the engine held when a call that would give memory back was refused (Busy): later
        # such calls are refused too while any lives.
        self._still_viewed: List[Tuple[str, int, Any]] = []
        self._exports = DeviceExports(self._core)
        lifecycle.stager_made(self)

    # ---- one call at a time ----------------------------------------------------------------

    def _enter(self, call: str) -> None:
        if not self._guard.enter():
            raise self._concurrent(call)
        if self._h is None:
            self._guard.leave()
            raise self._closed(call)

    @staticmethod
    def _concurrent(call: str) -> Busy:
        return Busy("busy", f"devstage {call}: the stager is in a call on another thread; a stager, its runs, frames "
                            "and completions are used from one thread at a time (give each thread a stager of its own)")

    @staticmethod
    def _closed(call: str) -> ValueError:
        return ValueError(f"devstage {call}: the stager was closed")

    def _leave(self) -> None:
        self._guard.leave()

    @property
    def closed(self) -> bool:
        return self._h is None

    # ---- frames: inputs written in place ----------------------------------------------------

    def layout(self, shapes: Sequence[TensorShape]) -> Layout:
        """`shapes` (TensorShape) laid out once for frames: frame(layout) then reuses, per slot, the
        places and views made the first time that slot was framed."""
        layout = Layout(self, shapes)
        self._all_layouts.add(layout)
        return layout

    def _layout_of(self, shapes: Sequence[TensorShape]) -> Layout:
        key = tuple(shapes)
        ids = tuple(map(id, key))
        entry = self._layouts_by_id.get(ids)
        if entry is not None:
            return entry[0]
        layout = self._layouts.get(key)
        if layout is None:
            layout = self.layout(key)
            if len(self._layouts) >= _LAYOUTS_KEPT:
                del self._layouts[next(iter(self._layouts))]
            self._layouts[key] = layout
        if len(self._layouts_by_id) >= _LAYOUTS_KEPT:
            del self._layouts_by_id[next(iter(self._layouts_by_id))]
        self._layouts_by_id[ids] = (layout, key)
        return layout

    def frame(self, shapes: Union[Layout, Sequence[TensorShape]]) -> Frame:
        """A free slot's pinned mirror laid out for `shapes` (a Layout, or TensorShapes), for inputs
        written in place: write frame.arrays[i] (or frame[i] = value, checked), then
        bind(frame[, stream]). Needs a packing stager. Busy when every slot is held."""
        if not self._guard.enter():
            raise self._concurrent("Stager.frame")
        try:
            if self._h is None:
                raise self._closed("Stager.frame")
            if self._deferred:
                self._flush()
            layout = shapes if type(shapes) is Layout else self._layout_of(shapes)  # pylint: disable=unidiomatic-typecheck
            if layout._core is not self._core:  # pylint: disable=protected-access
                raise ValueError("devstage Stager.frame: the layout belongs to another stager")
            ledger = self._ledger
            if ledger.full():
                raise self._busy("Stager.frame")
            memories = layout._memories  # pylint: disable=protected-access
            handle, slot, places = _calls.frame_open(self._h, layout._address, layout.count, "Stager.frame", memories)  # pylint: disable=protected-access
            memory = memories[slot]
            if memory is None or memory.hosts is not places and memory.hosts != places:
                memory = layout.memory(slot, places)
            frame = Frame(self, layout, handle, slot, memory)
            ledger.take(slot, frame)
            return frame
        except Busy as busy:
            raise self._named(busy) from None
        finally:
            self._guard.leave()

    def _frame_dropped(self, frame: Frame, handle: int) -> None:
        """An unbound frame the engine dropped: its C frame goes, and with it its slot."""
        if self._h is not None:
            _calls.frame_destroy(handle)
        self._ledger.give_back(frame.slot, frame)

    # ---- the run lifecycle -----------------------------------------------------------------

    def bind(self, args: Union[Frame, Sequence[Any]], stream: Any = None) -> Run:
        """Plans, grows if needed and uploads the In and InOut args: synchronously, or enqueued
        on `stream` (a devstage Stream of this backend, a torch stream, or a raw handle). `args`:
        a list of In(), Out(), InOut(), Device(); or a Frame from frame(). The Run holds the args
        (and so their memory) until it ends. Busy when every slot is held."""
        if not self._guard.enter():
            raise self._concurrent("Stager.bind")
        try:
            if self._h is None:
                raise self._closed("Stager.bind")
            if self._deferred:
                self._flush()
            if stream is None:
                target, on = None, 0
            else:
                target = stream if type(stream) is Stream and stream.backend is self.backend else \
                    self.backend.stream(stream)  # pylint: disable=unidiomatic-typecheck
                on = target.handle
                if on is None:
                    raise ValueError(f"devstage Stager.bind: the stream of {self.backend.describe()} was closed")
            if type(args) is not Frame:  # pylint: disable=unidiomatic-typecheck
                return self._bind_args(args, target, on)
            frame = args
            handle = frame._handle  # pylint: disable=protected-access
            if handle is None or frame.stager is not self:
                raise ValueError("devstage Stager.bind: the frame belongs to another stager" if frame.stager is not self
                                 else "devstage Stager.bind: this frame was bound already (a frame is bound once; "
                                 "make a new one)")
            run = Run(self, _calls.bind_frame(self._h, handle, on, "Stager.bind"), frame.slot, frame.layout, None,
                      target, frame)
            frame._handle = None  # pylint: disable=protected-access  (bound: the C frame was destroyed)
            self._ledger.hand_over(frame.slot, frame, run)
            return run
        except Busy as busy:
            raise self._named(busy) from None
        finally:
            self._guard.leave()

    def _bind_args(self, args: Sequence[Any], target: Any, on: int) -> Run:
        if self._ledger.full():
            raise self._busy("Stager.bind")
        staged = stage_args(args, self.backend)
        try:
            handle = _calls.bind(self._h, staged.address, staged.count, on, "Stager.bind")
        except BaseException:
            staged.close()
            raise
        run = Run(self, handle, _calls.run_slot(handle), staged, staged, target, None)
        self._ledger.take(run.slot, run)
        return run

    def order_after_uploads(self, run: Run, stream: Any) -> None:
        """Work enqueued on `stream` after this call runs after `run`'s bind (its uploads), with a
        stream wait: no host wait. Uploads on a copy stream, the kernel on a compute stream."""
        self._enter("Stager.order_after_uploads")
        try:
            handle = run._check(self, "Stager.order_after_uploads")  # pylint: disable=protected-access
            target = self.backend.stream(stream)
            _lib.check(lib.devstage_order_after_uploads(self._h, handle, target.handle), "Stager.order_after_uploads")
            if target.handle not in run._streams:  # pylint: disable=protected-access
                run._streams += (target.handle,)  # pylint: disable=protected-access  (its kernels' failures are its)
        finally:
            self._guard.leave()

    def finish(self, run: Run, stream: Any = None, ok: bool = True) -> Optional[Completion]:
        """Ends a run: copies back Out and InOut args if `ok` (the kernel succeeded) and gives
        back its memory. Synchronously (the kernel must have completed; refused, Busy, while a
        device tensor exported from the run's device_args is alive), or enqueued on `stream`
        after the kernel there: then it returns a Completion to wait on. While a tensor exported
        from the run's device_args (torch.from_dlpack, DeviceTensor.numpy()) is alive, the run
        stays live — its device memory valid, its slot taken — and the copy-backs are enqueued on
        `stream` once the last such tensor is gone (at this stager's next call, or the
        Completion's). A refused finish (a bad stream) leaves the run live."""
        if not self._guard.enter():
            raise self._concurrent("Stager.finish")
        try:
            if self._h is None:
                raise self._closed("Stager.finish")
            handle = run._handle  # pylint: disable=protected-access
            if handle is None or run._finishing or run.stager is not self:  # pylint: disable=protected-access
                run._check(self, "Stager.finish")  # pylint: disable=protected-access  (raises why)
            if run.stream is not None and run.stream.handle is None:
                raise ValueError("devstage Stager.finish: the stream the run was bound on was closed")
            if self._deferred:
                self._flush()
            execution = 0 if ok else _EXECUTION_FAILED
            if stream is None:
                self._finish_now(run, handle, execution)
                return None
            target = stream if type(stream) is Stream and stream.backend is self.backend else \
                self.backend.stream(stream)  # pylint: disable=unidiomatic-typecheck
            on = target.handle
            if on is None:
                raise ValueError(f"devstage Stager.finish: the stream of {self.backend.describe()} was closed")
            if run._exports and run._exports_alive():  # pylint: disable=protected-access
                completion = Completion(self, run, target, execution, None)
                self._deferred.append(completion)
            else:
                status, done = _calls.finish_on(self._h, handle, on, execution)
                if status != 0:
                    self._finish_failed(run, status)
                completion = Completion(self, run, target, execution, done)
            self._ledger.hand_over(run.slot, run, completion)
            return completion
        finally:
            self._guard.leave()

    def _finish_now(self, run: Run, handle: int, execution: int) -> None:
        if run._exports:  # pylint: disable=protected-access
            run._check_exports("Stager.finish")  # pylint: disable=protected-access
        status = _calls.finish(self._h, handle, execution)
        if status != 0:
            self._finish_failed(run, status)
        run._handle = None  # pylint: disable=protected-access
        self._ended(run, run._take_memory(), held=False)  # pylint: disable=protected-access

    def _finish_failed(self, run: Run, status: int) -> None:
        """Raises a finish's failure: a refused finish leaves the run live; one that ran ended it,
        and its memory stays with the stager (copies may be pending on it)."""
        failure = _lib.error_of(status, "Stager.finish")
        if not self._refused(run):
            run._handle = None  # pylint: disable=protected-access
            self._ended(run, run._take_memory(), held=True)  # pylint: disable=protected-access
        raise failure

    def _refused(self, run: Run) -> bool:
        """After a finish that failed: whether it was refused (the run is still live in C)."""
        slot = c_size_t()
        return run._handle is not None and lib.devstage_run_slot(run._handle, byref(slot)) == 0  # pylint: disable=protected-access

    def _ended(self, run: Run, memory: Any, held: bool) -> None:
        """A run ended: its slot goes back; its memory too, or — `held`: copies may still be pending
        on it (a failed finish, a dropped run) — it stays with the stager until release()."""
        self._ledger.give_back(run.slot, run)
        if memory is not None:
            if held:
                self._core.held.append(memory)
            else:
                memory.close()

    def _hold(self, memory: Any) -> None:
        self._core.held.append(memory)

    def _flush(self) -> None:
        """Enqueues the finishes that waited for their runs' exported tensors, once those are gone."""
        ready = [c for c in self._deferred if not c._run._exports_alive()]  # pylint: disable=protected-access
        if not ready:
            return
        self._deferred = [c for c in self._deferred if c not in ready]
        for completion in ready:
            completion._issue()  # pylint: disable=protected-access

    # ---- slots run out ---------------------------------------------------------------------

    def _busy(self, call: str) -> Busy:
        busy = Busy("busy", f"devstage {call}: all {self.pipeline_slots} pipeline slot(s) of the stager on "
                            f"{self.backend.describe()} are held — {self._ledger.describe()}. A bind or frame never "
                            "waits for a slot: end a run first (the oldest), or make the stager with more "
                            "pipeline_slots")
        busy.holders_named = True
        return busy

    def _named(self, busy: Busy) -> Busy:
        """A Busy of the library, with what holds the slots in Python."""
        held = self._ledger.describe()
        if not held or getattr(busy, "holders_named", False):
            return busy
        return Busy("busy", f"{busy} (held in Python: {held})")

    # ---- growth control and giving memory back ----------------------------------------------

    def reserve(self, nbytes: int) -> None:
        """Grows every slot to at least `nbytes` now (retained strategy); the mirrors move, so it is
        refused (Busy) while NumPy arrays or torch tensors of frame memory are held."""
        self._enter("Stager.reserve")
        try:
            self._flush()
            self._refuse_while_held("Stager.reserve", runs=True)
            self._retire_views("Stager.reserve")
            _lib.check(lib.devstage_stager_reserve(self._h, nbytes), "Stager.reserve")
        finally:
            self._guard.leave()

    def release(self) -> None:
        """Gives back all device memory now (waiting for pending work); live runs end without
        copy-backs; the host memory of failed and dropped runs is let go. Refused (Busy) — nothing
        given back — while a frame is unbound or a frame's Completion is not closed, while a
        device tensor exported from a run's device_args is alive, or while NumPy arrays or torch
        tensors of the stager's memory (a frame's views, Run.tensors()) are held by the engine:
        the package drops its own views first, then the memory would be freed under the engine's."""
        self._enter("Stager.release")
        try:
            self._check_no_exports("Stager.release")
            self._refuse_while_held("Stager.release", runs=False)
            self._retire_views("Stager.release")
            _lib.check(lib.devstage_stager_release(self._h), "Stager.release")
            self._end_live_runs()
            self._core.let_go()
        finally:
            self._guard.leave()

    def abandon(self) -> None:
        """Forgets all device memory and pending work without waiting (after a device reset or a
        failure no wait recovers from): completions resolve with BackendFailure and the host
        memory of their runs is let go, though the device may still write it."""
        self._enter("Stager.abandon")
        try:
            lib.devstage_stager_abandon(self._h)
            deferred, self._deferred = self._deferred, []
            for completion in deferred:
                completion._abandoned()  # pylint: disable=protected-access
                self._ledger.give_back(completion.slot, completion)
            self._end_live_runs()
            self._retire_views(None)
            self._core.let_go()
        finally:
            self._guard.leave()

    def close(self) -> None:
        """Ends the stager now: live runs end without copy-backs, pending work is waited for, and
        all its memory goes back (refused, Busy, while the engine holds tensors or views of it, as
        release()). Later calls raise ValueError. A `with` block closes it."""
        if self._h is None:
            return
        self._enter("Stager.close")
        try:
            self._check_no_exports("Stager.close")
            self._retire_views("Stager.close")
            self._end(force=True)
        finally:
            self._guard.leave()

    def __enter__(self) -> "Stager":
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if kind is None:
            self.close()
        else:
            try:
                self.close()
            except Exception:  # pylint: disable=broad-except
                pass  # the exception in flight says more; the stager then ends when it is collected

    def _holders(self) -> List[Tuple[int, Any]]:
        return [(slot, holder) for slot in range(self.pipeline_slots)
                for holder in (self._ledger.holder(slot),) if holder is not None]

    def _check_no_exports(self, call: str) -> None:
        """Busy while a run (live, or finishing) has device_args exported."""
        self._flush()
        waiting = [c for c in self._deferred if c._run._exports_alive()]  # pylint: disable=protected-access
        if waiting:
            raise Busy("busy", f"devstage {call}: {len(waiting)} finished run(s) still have device args exported "
                               "(tensors from torch.from_dlpack or DeviceTensor.numpy() alive); drop them first")
        for _, holder in self._holders():
            if isinstance(holder, Run):
                holder._check_exports(call)  # pylint: disable=protected-access

    def _refuse_while_held(self, call: str, runs: bool) -> None:
        """Busy, before any view is dropped, while a frame is unbound or a frame's Completion is
        open (and, with `runs`, while a run is live): the library refuses then, and the frames
        stay usable."""
        held = [f"slot {slot}: {holder._slot_note()}" for slot, holder in self._holders()  # pylint: disable=protected-access
                if isinstance(holder, Frame) or isinstance(holder, Completion) and holder.frame is not None
                or runs and isinstance(holder, Run)]
        if held:
            raise Busy("busy", f"devstage {call}: the slots' memory is in use — " + "; ".join(held))

    def _retire_views(self, call: Optional[str]) -> None:
        """Drops the package's views of the stager's memory (frames' and Run.tensors()'). With
        `call`: raises Busy when the engine still holds any (their memory is about to go), and
        keeps them known, so that every later call is refused too until they are gone."""
        kept = self._still_viewed
        for layout in list(self._all_layouts):
            kept += [("frame memory", slot, ref) for slot, ref in layout.retire()]
        kept += [("device memory", slot, ref) for slot, ref in self._exports.retire()]
        self._still_viewed = []
        if call is None or not kept:
            return
        _dlpack.collect()
        held = [(what, slot) for what, slot, ref in kept if ref() is not None]
        if held:
            gc.collect()  # a view in a reference cycle nobody holds
            held = [(what, slot) for what, slot, ref in kept if ref() is not None]
        if held:
            self._still_viewed = [(what, slot, ref) for what, slot, ref in kept if ref() is not None]
            where = ", ".join(f"slot {slot}'s {what}" for what, slot in held)
            raise Busy("busy", f"devstage {call}: NumPy arrays or torch tensors of the stager's memory are still held "
                               f"({where}: a frame's views, Run.tensors() or Run.arrays(), or views made of them); "
                               "drop them first: the memory would be freed under them")

    def _end_live_runs(self) -> None:
        for _, holder in self._holders():
            if isinstance(holder, Run):
                holder._released()  # pylint: disable=protected-access

    def _end(self, force: bool) -> None:
        """Ends the stager: live runs end, and the C stager is destroyed (its pending work waited
        for) — now when `force`, else with the last export or view of its memory (at once when
        there is none)."""
        for _, holder in self._holders():  # unbound frames go before their stager
            if isinstance(holder, Frame) and holder._handle is not None:  # pylint: disable=protected-access
                handle, holder._handle = holder._handle, None  # pylint: disable=protected-access
                _calls.frame_destroy(handle)
        self._end_live_runs()
        self._h = None
        self._ledger.clear()
        for layout in list(self._all_layouts):
            layout.close()
        if force:
            self._core.destroy()

    # ---- inspection --------------------------------------------------------------------------

    def regions(self) -> List[Any]:
        """The stager's regions (devstage.regions.Region): each slot's retained device buffer
        (kind "device") and pinned mirror (kind "pinned_host"), as they are now."""
        self._enter("Stager.regions")
        try:
            return _regions.list_regions(lib.devstage_stager_regions, self._h, "Stager.regions")
        finally:
            self._guard.leave()

    def set_region_hooks(self, added: Any = None, removing: Any = None) -> None:
        """The callables an engine registers the stager's regions with (docs/staging.md): `added`
        at once for every region, then for each new buffer or mirror before anything is staged in
        it; `removing` before one is freed, moved, released or forgotten. They run in the thread
        driving the stager. An `added` that raises refuses the region: the call that made it
        raises BackendFailure (the exception goes to sys.unraisablehook)."""
        self._enter("Stager.set_region_hooks")
        try:
            self._core.hooks.set(lib.devstage_stager_set_region_hooks, self._h, added, removing,
                                 "Stager.set_region_hooks")
        finally:
            self._guard.leave()

    def describe(self, array_or_pointer: Any) -> Any:
        """The slice (devstage.regions.RegionSlice) an address or a tensor lies in — a frame's
        host view, a run's device arg's data_ptr — or None when it is in none of the regions."""
        self._enter("Stager.describe")
        try:
            return _regions.describe(lib.devstage_stager_describe, self._h, array_or_pointer, "Stager.describe")
        finally:
            self._guard.leave()

    @property
    def stats(self) -> Dict[str, int]:
        """The stager's counters as a dict (docs/python.md says what each counts)."""
        self._enter("Stager.stats")
        try:
            self._flush()
            stats = _lib.StagerStats()
            _lib.check(lib.devstage_stager_stats_get(self._h, byref(stats)), "Stager.stats")
        finally:
            self._guard.leave()
        return {name: getattr(stats, name) for name in _lib.STAGER_STATS_FIELDS}

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"{self.pipeline_slots} slot(s)"
        return f"<devstage Stager on {self.backend.describe()}, {state}>"

    # ---- the end, without a caller ------------------------------------------------------------

    def _shutdown(self, force: bool = True) -> None:
        """Ends the stager without a caller to report to (interpreter exit; `force` False: garbage):
        the finishes still waiting for exported tensors are enqueued (or, with tensors still alive,
        dropped: their runs end without copy-backs), pending work is waited for, and the C stager
        destroyed (see _end)."""
        if getattr(self, "_h", None) is None:
            return
        try:
            for completion in list(self._deferred):  # host functions holding tensors give them back
                completion._stream._synchronize_quietly()  # pylint: disable=protected-access
            self._flush()
        except Exception:  # pylint: disable=broad-except
            pass  # nothing to report to at this point: the stager's sink has the library's reports
        self._retire_views(None)
        self._end(force)

    def __del__(self) -> None:
        self._shutdown(force=False)
