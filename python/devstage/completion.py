# SPDX-License-Identifier: Apache-2.0
"""The end of a run finished on a stream: waiting for its outputs, and the run's failures —
the library's, and those of the Python kernels launched for it."""
from typing import Any, Optional

from . import _calls, _lib
from .errors import HostFunctionError


class Completion:
    """The end of a run finished on a stream: wait() blocks until its outputs are in host memory
    (raising the run's failure, a Python kernel's included), ready() asks without blocking,
    `pending` tells whether devstage still owns the run's host memory. close() (or destruction; a
    context manager) waits if nothing did and ends it. When a wait fails and the run's work may
    still be running, the Completion stays pending: wait() again (after the device recovered:
    backend.synchronize()), or stager.abandon(); close() raises and keeps the run's memory until
    then."""

    __slots__ = ("_stager", "_run", "_stream", "_execution", "_handle", "_memory", "frame", "slot", "_closed",
                 "_ended", "_failure", "_window", "__weakref__")

    def __init__(self, stager: Any, run: Any, stream: Any, execution: int, handle: Optional[int]) -> None:
        """The completion of `run`, finished on `stream`: its C completion `handle`, or None while
        the finish waits for the run's exported tensors (the run is then kept until _issue())."""
        self._stager = stager
        self._stream = stream
        self._execution = execution
        self.frame = run.frame
        self.slot = run.slot
        self._closed = False
        self._ended = False          # the run ended for the engine: waited (or ready), or closed
        self._failure: Optional[HostFunctionError] = None
        # The Python kernels this run's wait answers for: those launched on its streams (the
        # finish's too) between its bind and its finish.
        self._window = (run._streams, stream.handle, run._launched, stager.backend._launches)  # pylint: disable=protected-access
        self._handle = handle
        if handle is None:
            self._run = run
            self._memory = None
            run._finishing = True  # pylint: disable=protected-access
        else:
            self._run = None
            run._handle = None  # pylint: disable=protected-access  (the finish took it)
            self._memory = run._memory  # pylint: disable=protected-access
            run._memory = None  # pylint: disable=protected-access

    # ---- the finish, enqueued ----------------------------------------------------------------

    def _issue(self) -> None:
        """Enqueues the deferred finish once the run's exported tensors are gone: the copy-backs on
        the stream, the C completion. A refused finish leaves the run live; one that failed after
        it ran ends it; either way the completion is closed and the failure raised."""
        run = self._run
        stager = self._stager
        status, handle = _calls.finish_on(stager._h, run._handle, self._stream.handle, self._execution)  # pylint: disable=protected-access
        if status != 0:
            self._run = None
            self._closed = self._ended = True
            run._finishing = False  # pylint: disable=protected-access
            stager._ledger.hand_over(self.slot, self, run)  # pylint: disable=protected-access
            stager._finish_failed(run, status)  # pylint: disable=protected-access  (raises)
        self._run = None
        run._handle = None  # pylint: disable=protected-access
        self._handle = handle
        self._memory = run._take_memory()  # pylint: disable=protected-access

    def _abandoned(self) -> None:
        """Its stager was abandoned while the finish waited for exported tensors: the run ended
        without copy-backs."""
        run, self._run = self._run, None
        self._closed = self._ended = True
        handle, run._handle = run._handle, None  # pylint: disable=protected-access
        if handle:
            _calls.run_destroy(handle)  # inert after the abandon
        memory = run._take_memory()  # pylint: disable=protected-access
        if memory is not None:
            memory.close()

    def _enqueued(self, what: str) -> Optional[int]:
        """The C completion, once the finish is enqueued; raises Busy while exported tensors of the
        run are alive after the finish stream's earlier work completed."""
        if self._handle is not None:
            return self._handle
        if self._closed:
            raise ValueError(f"devstage Completion.{what}: this completion was closed")
        stager = self._stager
        stager._flush()  # pylint: disable=protected-access
        if self._handle is None and what != "ready":
            self._stream._wait(f"Completion.{what}")  # pylint: disable=protected-access  (host functions enqueued before the finish give their tensors back)
            stager._flush()  # pylint: disable=protected-access
        if self._handle is None:
            if what == "ready":
                return None
            self._run._check_exports(f"Completion.{what}")  # pylint: disable=protected-access
            stager._flush()  # pylint: disable=protected-access
        return self._handle

    # ---- waiting -----------------------------------------------------------------------------

    def wait(self) -> None:
        stager = self._stager
        lock = stager._lock  # pylint: disable=protected-access
        if not lock.acquire(False):
            raise stager._concurrent("Completion.wait")  # pylint: disable=protected-access
        try:
            handle = self._handle
            if handle is None:
                handle = self._enqueued("wait")
            status = _calls.completion_wait(handle)
            if status != 0:
                raise _lib.error_of(status, "Completion.wait")
            if not self._ended:
                self._end()
            if self._failure is None and stager.backend._failures:  # pylint: disable=protected-access
                self._failure = stager.backend._claim_failures(self._window)  # pylint: disable=protected-access
            if self._failure is not None:
                raise self._failure
        finally:
            lock.release()

    def ready(self) -> bool:
        stager = self._stager
        stager._enter("Completion.ready")  # pylint: disable=protected-access
        try:
            handle = self._enqueued("ready")
            if handle is None:
                return False
            if _calls.completion_ready(handle):
                self._end()
                return True
            return False
        finally:
            stager._leave()  # pylint: disable=protected-access

    def _end(self) -> None:
        """The run ended for the engine: a run of args gives its slot back (a frame's keeps it
        until close, its outputs being read from the frame)."""
        if not self._ended:
            self._ended = True
            if self.frame is None:
                self._stager._ledger.give_back(self.slot, self)  # pylint: disable=protected-access

    @property
    def pending(self) -> bool:
        if self._closed:
            return False
        if self._handle is None:
            return True
        return _pending(self._handle)

    # ---- its end -----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        stager = self._stager
        lock = stager._lock  # pylint: disable=protected-access
        if not lock.acquire(False):
            raise stager._concurrent("Completion.close")  # pylint: disable=protected-access
        try:
            if not self._closed:
                handle = self._handle if self._handle is not None else self._enqueued("close")
                waited = self._ended
                status = _calls.completion_destroy(handle)  # waits unless a wait returned
                if status != 0:
                    failure = _lib.error_of(status, "Completion.close")
                    if _pending(handle):
                        raise failure  # kept: its memory may still be written
                    self._closed_now()
                    raise failure
                self._closed_now()
                if not waited and self._failure is None and stager.backend._failures:  # pylint: disable=protected-access
                    self._failure = stager.backend._claim_failures(self._window)  # pylint: disable=protected-access
                    if self._failure is not None:
                        raise self._failure
        finally:
            lock.release()

    def _closed_now(self) -> None:
        self._closed, self._handle = True, None
        self._ended = True
        memory, self._memory = self._memory, None
        if memory is not None:
            memory.close()
        self._stager._ledger.give_back(self.slot, self)  # pylint: disable=protected-access

    def _on_stream(self, handle: int) -> bool:
        """Whether the finish waits to be enqueued on the stream `handle`."""
        return self._run is not None and self._stream.handle == handle

    def _slot_note(self) -> str:
        if self.frame is not None:
            return "a frame's run whose Completion is not closed (close() it once its outputs are read)"
        return "a run finished on a stream whose Completion was not waited for (wait() or close() it)"

    def __enter__(self) -> "Completion":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        handle, self._handle = self._handle, None
        if handle is None:
            return  # the stager's deferred list still holds it: its finish is enqueued, then orphaned
        stager = self._stager
        if _calls.completion_destroy(handle) != 0 and _pending(handle):
            # Still pending: the stager keeps the run's memory until it is released or abandoned.
            stager._hold(PendingCompletion(handle, self._memory))  # pylint: disable=protected-access
        elif self._memory is not None:
            self._memory.close()
        self._memory = None
        stager._ledger.give_back(self.slot, self)  # pylint: disable=protected-access


def _pending(handle: int) -> bool:
    """Whether a C completion is still pending (False for one that is gone)."""
    from ctypes import byref, c_int  # pylint: disable=import-outside-toplevel
    answer = c_int()
    if _lib.lib.devstage_completion_pending(handle, byref(answer)) != 0:
        return False
    return bool(answer.value)


class PendingCompletion:
    """A completion whose wait failed when it was dropped: its handle and its run's memory, kept
    by the stager until release() or abandon(), then destroyed."""

    __slots__ = ("handle", "memory")

    def __init__(self, handle: int, memory: Any) -> None:
        self.handle, self.memory = handle, memory

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle:
            _calls.completion_destroy(handle)
        if self.memory is not None:
            self.memory.close()

