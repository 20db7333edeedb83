# SPDX-License-Identifier: Apache-2.0
"""Frames and layouts: each slot's views made once and kept (the same NumPy arrays whenever the
slot is framed for a layout, made again when its mirror moves), checked writes, and the memory's
lifetime — the stager never frees a mirror the engine still views: release(), reserve() and
close() drop the package's own views, then refuse while the engine's are alive."""
import gc

import pytest

import devstage

from conftest import numpy_or_skip, torch_or_skip

I, O = devstage.IN, devstage.OUT


def decode_shapes(batch, width=32, vocab=64):
    return [devstage.TensorShape(batch, "int32", I), devstage.TensorShape(batch, "int64", I),
            devstage.TensorShape((batch, width), "int32", I), devstage.TensorShape((batch, vocab), "float32", O)]


def step(np, stager, frame, stream, value):
    """Writes the inputs, binds, copies the ids into the logits on the device (a host function on
    the simulator), finishes and waits; the completion."""
    arrays = frame.arrays
    arrays[0][:] = value
    arrays[1][:] = value * 2
    arrays[2][:] = value
    run = stager.bind(frame, stream)
    ids, logits = run.arrays()[0], run.arrays()[3]
    stager.backend.launch_host_function(stream, lambda ids=ids, logits=logits: logits.__setitem__(slice(None), ids[:, None]))
    del ids, logits
    done = stager.finish(run, stream)
    done.wait()
    return done


def test_each_slot_keeps_its_views_across_steps(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384, pipeline_slots=2)
    stream = sim.create_stream()
    layout = stager.layout(decode_shapes(8))
    seen = {}
    for value in range(6):
        frame = stager.frame(layout)
        arrays = frame.arrays
        assert [a.shape for a in arrays] == [(8,), (8,), (8, 32), (8, 64)]
        assert [a.dtype for a in arrays] == [np.int32, np.int64, np.int32, np.float32]
        if frame.slot in seen:
            assert all(a is b for a, b in zip(arrays, seen[frame.slot]))  # made once per slot
            assert np.asarray(frame[0]).ctypes.data == arrays[0].ctypes.data and frame[2] is frame[2]
        seen[frame.slot] = arrays
        done = step(np, stager, frame, stream, value)
        assert (frame.arrays[3] == value).all()
        done.close()
    assert sorted(seen) == [0, 1]
    tensors = {}
    for value in range(4):  # the device args are exported once per slot too
        frame = stager.frame(layout)
        frame.arrays[0][:] = value
        run = stager.bind(frame, stream)
        exported = run.arrays()
        assert exported is run.arrays()
        if run.slot in tensors:
            assert exported is tensors[run.slot]
        tensors[run.slot] = exported
        stager.finish(run, stream).close()
    assert stager.stats["address_changes"] == 0
    stream.close()


def test_cached_torch_tensors_of_the_device_args(sim):
    torch = torch_or_skip()
    numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384)
    layout = stager.layout(decode_shapes(4))
    first = None
    for value in range(3):
        frame = stager.frame(layout)
        frame.arrays[0][:] = value
        run = stager.bind(frame)
        tensors = run.tensors()
        assert tensors[0].data_ptr() == run.device_pointers[0] and tensors[3].dtype == torch.float32
        tensors[3].copy_(tensors[0].float()[:, None].expand(4, 64))
        if first is not None:
            assert tensors is first
        first = tensors
        del tensors
        stager.finish(run)  # cached exports do not hold the run: the slot's memory is its runs'
        assert (frame.arrays[3] == value).all()


def test_the_slot_moves_and_everything_is_made_again(sim):
    """A larger run grows the slot: its mirror and device memory move (address_changes), the
    layout's views and the cached exports are made again at the new addresses."""
    numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384)
    layout = stager.layout(decode_shapes(4))
    frame = stager.frame(layout)
    old_arrays, old_places = frame.arrays, frame._memory.hosts  # pylint: disable=protected-access
    run = stager.bind(frame)
    old_pointers = run.device_pointers
    run.arrays()
    stager.finish(run)
    del frame, old_arrays
    big = stager.frame(decode_shapes(64, vocab=512))  # another layout, larger: the slot grows
    stager.finish(stager.bind(big))
    del big
    assert stager.stats["address_changes"] >= 1
    frame = stager.frame(layout)
    assert frame._memory.hosts != old_places  # pylint: disable=protected-access
    frame.arrays[0][:] = 5
    run = stager.bind(frame)
    assert run.device_pointers != old_pointers
    assert (run.arrays()[0] == 5).all()
    stager.finish(run)


def frame_with_outputs(np, stager):
    frame = stager.frame(decode_shapes(4))
    np.asarray(frame[0])[:] = 3
    run = stager.bind(frame)
    stager.finish(run)
    return frame


@pytest.mark.parametrize("call", ["release", "reserve", "close"])
def test_memory_the_engine_views_is_never_freed(sim, call):
    """A NumPy view of a frame (and a view of that view) outlives the frame, its run and its
    completion: the calls that would free the mirror refuse, Busy, and free it once it is gone."""
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384, pipeline_slots=2)
    frame = frame_with_outputs(np, stager)
    kept = np.asarray(frame[0])[1:]  # a view of a view: its base is the frame's memory all the same
    del frame
    gc.collect()
    act = {"release": stager.release, "reserve": lambda: stager.reserve(1 << 20), "close": stager.close}[call]
    with pytest.raises(devstage.Busy, match="slot 0's frame memory"):
        act()
    assert (kept == 3).all()  # still the frame's bytes, still valid memory
    del kept
    act()
    if call == "close":
        assert stager.closed
        with pytest.raises(ValueError, match="closed"):
            stager.frame(decode_shapes(4))


def test_a_torch_view_of_a_frame_and_cached_tensors_count_too(sim):
    torch = torch_or_skip()
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384)
    frame = frame_with_outputs(np, stager)
    view = torch.from_dlpack(frame[0])
    del frame
    with pytest.raises(devstage.Busy, match="frame memory"):
        stager.release()
    del view
    stager.release()
    frame = stager.frame(decode_shapes(4))
    run = stager.bind(frame)
    device = run.tensors()[2][1:]  # a torch view of a cached export
    stager.finish(run)
    del run, frame
    with pytest.raises(devstage.Busy, match="slot 0's device memory"):
        stager.release()
    del device
    stager.release()


def test_frames_after_their_memory_went_back_refuse(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384)
    frame = frame_with_outputs(np, stager)
    stager.release()  # nothing but the frame object: it is cut off, not a reason to refuse
    with pytest.raises(ValueError, match="given back"):
        frame.arrays  # pylint: disable=pointless-statement
    with pytest.raises(ValueError, match="given back"):
        np.asarray(frame[0])
    with pytest.raises(ValueError, match="given back"):
        frame.write(0, np.zeros(4, np.int32))


def test_release_is_refused_while_a_frame_is_unbound_or_its_completion_open(sim):
    numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384, pipeline_slots=2)
    stream = sim.create_stream()
    frame = stager.frame(decode_shapes(4))
    with pytest.raises(devstage.Busy, match="slot 0: an unbound frame"):
        stager.release()
    done = stager.finish(stager.bind(frame, stream), stream)
    with pytest.raises(devstage.Busy, match="Completion is not closed"):
        stager.release()
    done.close()
    del frame
    stager.release()
    stream.close()


def test_checked_writes_never_cast(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384)
    frame = stager.frame(decode_shapes(4))
    frame.write(0, np.arange(4, dtype=np.int32))
    frame[1] = np.arange(4, dtype=np.int64) * 10
    assert list(frame.arrays[0]) == [0, 1, 2, 3] and list(frame.arrays[1]) == [0, 10, 20, 30]
    with pytest.raises(TypeError, match="tensor 0 is int32 .*the value is float64.*would cast"):
        frame.write(0, np.ones(4))
    with pytest.raises(TypeError, match="int32 .*int64"):
        frame[0] = np.ones(4, np.int64)
    with pytest.raises(ValueError, match=r"shape \(4, 32\), the value \(32,\)"):
        frame.write(2, np.zeros(32, np.int32))
    with pytest.raises(IndexError, match="tensor 7 of a frame of 4 tensors"):
        frame.write(7, np.zeros(4, np.int32))
    assert list(frame.arrays[0]) == [0, 1, 2, 3]  # a refused write wrote nothing
    frame.write_all([np.full(4, 5, np.int32), np.full(4, 6, np.int64)])
    assert (frame.arrays[0] == 5).all() and (frame.arrays[1] == 6).all()
    frame.write_all([np.full(4, 7, np.int64), np.zeros((4, 32), np.int32)], first=1)
    assert (frame.arrays[1] == 7).all()
    with pytest.raises(TypeError, match="tensor 1 is int64 .*the value is int32"):
        frame.write_all([np.full(4, 1, np.int32), np.full(4, 1, np.int32)])  # the second is refused
    assert (frame.arrays[0] == 5).all()  # and the first not written either
    with pytest.raises(IndexError, match="3 values from tensor 2 of a frame of 4 tensors"):
        frame.write_all([np.zeros((4, 32), np.int32)] * 3, first=2)
    torch = pytest.importorskip("torch")
    frame.write(0, torch.full((4,), 9, dtype=torch.int32))
    assert (frame.arrays[0] == 9).all()
    with pytest.raises(TypeError, match="would cast"):
        frame.write(0, torch.ones(4))
    stager.finish(stager.bind(frame))


def test_an_index_past_the_end_names_the_frames_size(sim):
    numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384)
    frame = stager.frame(decode_shapes(4))
    with pytest.raises(IndexError, match="tensor 99 of a frame of 4 tensors"):
        frame[99]  # pylint: disable=pointless-statement
    with pytest.raises(IndexError, match="tensor -5 of a frame of 4 tensors"):
        frame[-5]  # pylint: disable=pointless-statement
    assert frame[-1].shape == (4, 64)
    assert len(frame) == 4


def test_a_host_view_is_a_view(sim):
    """A HostView the engine keeps is a view of the memory: it counts, and once the memory went
    back it gives none (its buffer, its array, its DLPack export refused)."""
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=16384)
    frame = frame_with_outputs(np, stager)
    view = frame[0]
    assert (np.asarray(view) == 3).all() and np.asarray(view).ctypes.data == view.data_ptr
    with pytest.raises(devstage.Busy, match="frame memory"):
        stager.release()
    with pytest.raises(ValueError, match="given back"):
        np.asarray(view)
    with pytest.raises(ValueError, match="given back"):
        view.__dlpack__()
    del view
    stager.release()
