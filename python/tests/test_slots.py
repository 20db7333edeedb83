# SPDX-License-Identifier: Apache-2.0
"""When slots run out: bind and frame behave alike — Busy at once, naming what holds each slot —
and which object holds a slot when (devstage._slots.SlotLedger, and the stager driving it)."""
import gc

import pytest

import devstage
from devstage._slots import SlotLedger

from conftest import numpy_or_skip


class Holder:
    def __init__(self, note):
        self.note = note

    def _slot_note(self):
        return self.note


def test_the_ledger_counts_takes_hand_overs_and_give_backs():
    ledger = SlotLedger(2)
    frame, run, done = Holder("a frame"), Holder("a run"), Holder("a completion")
    ledger.take(0, frame)
    assert not ledger.full()
    ledger.hand_over(0, frame, run)
    ledger.hand_over(0, frame, done)  # not the holder any more: nothing changes
    assert ledger.holder(0) is run
    other = Holder("another run")
    ledger.take(1, other)
    assert ledger.full()
    assert ledger.describe() == "slot 0: a run; slot 1: another run"
    ledger.give_back(1, run)  # not slot 1's holder
    assert ledger.full()
    ledger.give_back(1, other)
    assert not ledger.full()
    ledger.take(1, other)
    del other
    gc.collect()
    assert not ledger.full()  # a holder that went without giving back frees its slot
    ledger.hand_over(0, run, done)
    ledger.give_back(0, done)
    assert ledger.holder(0) is None and ledger.describe() == ""


@pytest.mark.parametrize("kind", ["bind", "frame"])
def test_bind_and_frame_alike_raise_busy_naming_the_holders(sim, kind):
    """Three runs finished on a stream and not waited for, on two slots: the third is refused at
    once — the library would otherwise queue a bind of args behind the oldest run (and a pageable
    copy of it would block the host until the stream got there)."""
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=4096, pipeline_slots=2)
    stream = sim.create_stream()
    sim.launch_host_function(stream, lambda: __import__("time").sleep(0.05))  # the runs stay in flight
    shapes = [devstage.TensorShape(64, "uint8", devstage.IN), devstage.TensorShape(64, "uint8", devstage.OUT)]

    def start():
        if kind == "frame":
            return stager.bind(stager.frame(shapes), stream=stream)
        return stager.bind([devstage.In(np.ones(64, np.uint8)), devstage.Out(np.zeros(64, np.uint8))], stream=stream)

    first = stager.finish(start(), stream=stream)
    second = stager.finish(start(), stream=stream)
    with pytest.raises(devstage.Busy) as caught:
        start()
    message = str(caught.value)
    assert "all 2 pipeline slot(s)" in message and "backend 'sim'" in message
    note = "is not closed" if kind == "frame" else "was not waited for"
    assert f"slot 0: a {'frame' if kind == 'frame' else 'run'}" in message and note in message
    assert "slot 1:" in message
    with pytest.raises(devstage.Busy):  # the other kind alike
        stager.frame(shapes) if kind == "bind" else stager.bind([devstage.In(np.ones(4, np.uint8))])
    if kind == "frame":
        first.wait()
        with pytest.raises(devstage.Busy):  # a frame's slot is held until its completion is closed
            start()
        first.close()
    else:
        first.wait()  # a run of args gives its slot back once waited for
    third = stager.finish(start(), stream=stream)
    for done in (second, third):
        done.wait()
        done.close()
    first.close()
    stream.close()


def test_a_live_run_an_unbound_frame_and_a_dropped_one(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=4096, pipeline_slots=2)
    run = stager.bind([devstage.In(np.ones(8, np.uint8))])
    frame = stager.frame([devstage.TensorShape(8)])
    with pytest.raises(devstage.Busy, match=r"slot 0: a live run \(bound, not finished: finish it\); "
                                            r"slot 1: an unbound frame \(bind it, or drop it\)"):
        stager.bind([devstage.In(np.ones(8, np.uint8))])
    del run  # dropped: its slot goes back
    gc.collect()
    again = stager.bind([devstage.In(np.ones(8, np.uint8))])
    stager.finish(again)
    stager.finish(stager.bind(frame))
    # A synchronous finish holds nothing past its return.
    for _ in range(3):
        stager.finish(stager.bind([devstage.In(np.ones(8, np.uint8))]))
