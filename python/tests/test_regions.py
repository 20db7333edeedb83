# SPDX-License-Identifier: Apache-2.0
"""Regions for transfer engines from Python: a pool's and a stager's regions listed, described
and registered once through hooks — through grows, reserve, release, hooks set again and the
owners' going — regions made with create_region in background threads, and hooks that raise."""
import gc

import pytest

import devstage

from conftest import numpy_or_skip

I, O = devstage.IN, devstage.OUT


class Engine:
    """A transfer engine's registrations: the live regions by id, and every call."""

    def __init__(self):
        self.live = {}
        self.added = 0
        self.removed = 0
        self.errors = []

    def on_added(self, region):
        self.added += 1
        if region.id in self.live:
            self.errors.append(f"region {region.id} added twice")
        self.live[region.id] = region

    def on_removing(self, region):
        self.removed += 1
        if self.live.pop(region.id, None) is None:
            self.errors.append(f"region {region.id} removed but never added")


def test_a_stagers_hooks_are_called_once_per_region_through_grows_and_release(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=4096)
    engine = Engine()
    stager.set_region_hooks(added=engine.on_added, removing=engine.on_removing)
    assert stager.regions() == [] and engine.added == 0

    frame = stager.frame([devstage.TensorShape(1024, "int32", I), devstage.TensorShape(64, "float32", O)])
    regions = stager.regions()
    assert sorted(r.kind for r in regions) == ["device", "pinned_host"]
    assert {r.id for r in regions} == set(engine.live)
    mirror = next(r for r in regions if r.kind == "pinned_host")
    for array in frame.arrays:  # a frame's tensors are named (region, offset, bytes) in the mirror
        where = stager.describe(array)
        assert where.region == mirror.id
        assert mirror.base + where.offset == array.__array_interface__["data"][0]
        assert where.bytes >= array.nbytes
    frame.arrays[0][:] = np.arange(1024, dtype=np.int32)
    run = stager.bind(frame)
    device = stager.describe(run.device_args[0].data_ptr)
    assert engine.live[device.region].kind == "device"
    stager.finish(run)
    del frame, run, array, where, device
    gc.collect()

    stager.reserve(1 << 20)  # the buffer and the mirror grow: each removed, the new ones added
    assert engine.added == 4 and engine.removed == 2 and len(engine.live) == 2
    assert stager.describe(np.zeros(4)) is None  # memory of no region

    other = Engine()
    stager.set_region_hooks(added=other.on_added, removing=other.on_removing)
    assert engine.live == {} and len(other.live) == 2

    stager.release()
    assert other.live == {} and stager.regions() == []
    stager.reserve(4096)
    assert len(other.live) == 2
    stager.close()
    del stager
    gc.collect()
    assert other.live == {}  # the C stager's destruction removed what was left
    assert engine.errors == [] and other.errors == []


def test_an_added_hook_that_raises_refuses_the_region(sim, monkeypatch):
    np = numpy_or_skip()
    reported = []
    monkeypatch.setattr("sys.unraisablehook", reported.append)
    stager = devstage.Stager(sim)
    refusals = [1]

    def added(region):
        if refusals[0]:
            refusals[0] -= 1
            raise RuntimeError(f"the NIC refused region {region.id}")

    stager.set_region_hooks(added=added)
    x = np.arange(1000, dtype=np.float32)
    with pytest.raises(devstage.BackendFailure, match="the added hook returned 4"):
        stager.bind([devstage.In(x)])
    assert len(reported) == 1
    assert isinstance(reported[0].exc_value, RuntimeError)
    assert "refused" in reported[0].err_msg
    assert stager.regions() == []
    run = stager.bind([devstage.In(x)])  # the next grow lists the buffer again
    stager.finish(run)
    assert len(stager.regions()) == 1

    def removing(region):
        raise ValueError("deregistration failed")

    stager.set_region_hooks(added=None, removing=removing)
    stager.release()  # the region goes anyway; the exception is reported
    assert stager.regions() == []
    assert any(isinstance(r.exc_value, ValueError) for r in reported)
    with pytest.raises(TypeError, match="added must be callable"):
        stager.set_region_hooks(added=3)
    stager.close()


def test_a_pools_region_in_background_threads(sim):
    np = numpy_or_skip()
    pool = devstage.PinnedPool(sim)
    engine = Engine()
    pool.set_region_hooks(added=engine.on_added, removing=engine.on_removing)
    region = pool.create_region(8 << 20, background=True, threads=2)
    progress = region.progress()
    assert progress["bytes_total"] >= 8 << 20
    assert progress["state"] in ("registering", "ready")
    region.wait()
    assert region.ready() is True
    assert region.progress()["state"] == "ready"
    assert region.progress()["bytes_registered"] == region.progress()["bytes_total"]
    assert engine.live.keys() == {region.id}
    assert [r.id for r in pool.regions()] == [region.id]

    kv = region.allocate((16, 256), "float16")
    where = pool.describe(kv)
    assert where.region == region.id and region.data_ptr + where.offset == kv.data_ptr
    assert pool.describe(kv.data_ptr + 10).offset == where.offset + 10
    assert pool.describe(np.zeros(4)) is None
    np.asarray(kv)[:] = 1.5
    with pytest.raises(devstage.InvalidArgument):
        region.cancel()  # ready already

    buffer = pool.allocate(4096)  # a size-class block is a region too
    assert pool.describe(buffer).region in engine.live
    del buffer, region
    gc.collect()
    assert len(engine.live) == 2  # the region stays while a buffer of it does (and the cached block)
    del kv
    gc.collect()
    pool.trim()
    assert engine.live == {}
    assert engine.added == engine.removed and engine.errors == []


def test_a_region_cancelled_or_refused_leaves_nothing(sim):
    pool = devstage.PinnedPool(sim)
    region = pool.create_region(64 << 20, background=True, threads=1)
    try:
        region.cancel()
    except devstage.InvalidArgument:
        assert region.ready()  # it was ready before the cancel came
    else:
        assert region.progress()["state"] == "cancelled"
        with pytest.raises(devstage.Error):
            region.ready()
    del region
    gc.collect()

    def refuse(region):
        raise RuntimeError("no")

    import sys  # pylint: disable=import-outside-toplevel
    reported = []
    old, sys.unraisablehook = sys.unraisablehook, reported.append
    try:
        pool.set_region_hooks(added=refuse)
        region = pool.create_region(1 << 20, background=False)
        with pytest.raises(devstage.BackendFailure):
            region.wait()
        with pytest.raises(devstage.InvalidArgument, match="not registered"):
            region.allocate(64)  # nothing of a failed region is handed out
    finally:
        sys.unraisablehook = old
    assert reported and isinstance(reported[0].exc_value, RuntimeError)
    del region
    gc.collect()
    assert pool.regions() == []
    assert pool.stats["live_bytes"] == 0
    with pytest.raises(ValueError, match="threads -1"):
        pool.create_region(4096, threads=-1)
