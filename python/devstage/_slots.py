# SPDX-License-Identifier: Apache-2.0
"""Which pipeline slot each frame, run and completion holds, as the Python package counts them.

A slot is held by an unbound Frame, by a live Run, then by the run's Completion until the run
ended for the engine: a frame's run until its Completion is closed (its outputs are read from the
frame until then), another run until its wait() returned, ready() said so, or it was closed. A
synchronous finish holds nothing past its return. A bind or frame() when every slot is held is
Busy, naming the holders — the same for both, and without waiting (the library itself would
queue a bind of args behind the oldest run in flight, and a pageable copy of it would block the
host until the stream got there).

Holders are referenced weakly: one the engine drops gives its slot back from its own destructor
(a dropped Run, Frame or Completion ends as the library's would).
"""
import weakref
from typing import Any, List, Optional


class SlotLedger:
    """The holder of each of `count` slots. `take`, `hand_over` (bind: frame -> run; finish:
    run -> completion) and `give_back` keep it; `full()` is the bind's check."""

    __slots__ = ("count", "_holders", "_held")

    def __init__(self, count: int) -> None:
        self.count = count
        self._holders: List[Optional["weakref.ref[Any]"]] = [None] * count
        self._held = 0

    def take(self, slot: int, holder: Any) -> None:
        if self._holders[slot] is None:
            self._held += 1
        self._holders[slot] = weakref.ref(holder)

    def hand_over(self, slot: int, old: Any, new: Any) -> None:
        current = self._holders[slot]
        if current is not None and current() is old:
            self._holders[slot] = weakref.ref(new)

    def give_back(self, slot: int, holder: Any) -> None:
        current = self._holders[slot]
        if current is not None and current() in (holder, None):
            self._holders[slot] = None
            self._held -= 1

    def holder(self, slot: int) -> Any:
        current = self._holders[slot]
        return None if current is None else current()

    def full(self) -> bool:
        if self._held < self.count:
            return False
        for slot, current in enumerate(self._holders):  # a holder that went without giving back
            if current is not None and current() is None:
                self._holders[slot] = None
                self._held -= 1
        return self._held >= self.count

    def clear(self) -> None:
        self._holders = [None] * self.count
        self._held = 0

    def describe(self) -> str:
        """What holds each slot, and what frees it: "slot 0: a live run (finish it); ..."."""
        notes = []
        for slot in range(self.count):
            holder = self.holder(slot)
            if holder is not None:
                notes.append(f"slot {slot}: {holder._slot_note()}")  # pylint: disable=protected-access
        return "; ".join(notes)
