# SPDX-License-Identifier: Apache-2.0
"""The Stager's options as Python gives them: any pack limit, mapped small args, the retained_vmm
strategy, and what is refused, in Python's terms; a frame dropped unbound gives its slot back,
and a bound frame's handle, destroyed at bind, does not."""
import gc

import pytest

import devstage

from conftest import numpy_or_skip
from test_staging import kernel


def in_place_kernel(run):
    """out = in + 1 where the kernel reads and writes the args' memory itself (the simulator's device
    memory and its mapped host memory are both host memory)."""
    source, out = run[0].numpy(), run[1].numpy()
    out[:] = source + 1


def test_pack_limit_8192_with_mapped_small_args(sim, calls):  # pylint: disable=unused-argument
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=8192, map_small=True)
    for step in range(3):
        source = np.arange(6000, dtype=np.uint8) + step  # under the limit: mapped
        out = np.zeros(6000, np.uint8)
        run = stager.bind([devstage.In(source), devstage.Out(out)])
        in_place_kernel(run)
        stager.finish(run)
        assert (out == source + 1).all()
    stats = stager.stats
    assert stats["mapped_runs"] == 3 and stats["host_maps"] == 1
    assert stats["bytes_to_device"] == stats["bytes_from_device"] == 0  # mapped: no copy to or from the device
    assert stats["device_mallocs"] == 0
    big_in = np.full(9000, 7, np.uint8)  # over the limit: staged in device memory, copied
    big_out = np.zeros(9000, np.uint8)
    run = stager.bind([devstage.In(big_in), devstage.Out(big_out)])
    kernel(sim, run, 9000)
    stager.finish(run)
    assert (big_out == 8).all()
    assert stager.stats["bytes_to_device"] >= 9000 and stager.stats["mapped_runs"] == 3


def test_without_map_small_the_same_args_are_packed(sim):
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=8192)
    source = np.arange(6000, dtype=np.uint8)
    out = np.zeros(6000, np.uint8)
    run = stager.bind([devstage.In(source), devstage.Out(out)])
    kernel(sim, run, 6000)
    stager.finish(run)
    assert (out == source + 1).all()
    assert stager.stats["mapped_runs"] == 0 and stager.stats["bytes_to_device"] >= 6000


def test_a_retained_vmm_stager_grows_in_place(sim, calls):  # pylint: disable=unused-argument
    np = numpy_or_skip()
    stager = devstage.Stager(sim, strategy="retained_vmm", growth_cap=1 << 26)
    places = []
    for nbytes in (1000, 300000, 5000000):
        source = np.full(nbytes, nbytes % 251, np.uint8)
        out = np.zeros(nbytes, np.uint8)
        run = stager.bind([devstage.In(source), devstage.Out(out)])
        places.append(run.device_pointers[0])
        kernel(sim, run, nbytes)
        stager.finish(run)
        assert (out == source + 1).all()
    assert places[0] == places[1] == places[2]  # grown in place: the slot's buffer never moved
    assert stager.stats["address_changes"] == 0 and stager.stats["regrows"] >= 2
    stager.close()


@pytest.mark.parametrize("keywords,error,message", [
    (dict(strategy="vmm"), devstage.InvalidArgument, r"strategy 'vmm' is not one of retained, per_tensor, retained_vmm"),
    (dict(map_small=1, pack_limit=4096), devstage.InvalidArgument, r"map_small 1 is not True or False"),
    (dict(map_small=True), devstage.InvalidArgument, r"map_small=True needs a pack_limit above 0"),
    (dict(strategy="per_tensor", pack_limit=8192, map_small=True), devstage.InvalidArgument,
     r"pack_limit 8192 needs the retained strategy \(the per_tensor strategy packs nothing\)"),
    (dict(strategy="retained_vmm", pack_limit=4096), devstage.InvalidArgument,
     r"pack_limit 4096 needs the retained strategy \(the retained_vmm strategy packs nothing\)"),
    (dict(pack_limit=-8192), devstage.InvalidArgument, r"pack_limit -8192 is not a non-negative int"),
])
def test_bad_options_are_refused_in_python_terms(sim, keywords, error, message):
    with pytest.raises(error, match=r"^devstage Stager: .*" + message):
        devstage.Stager(sim, **keywords)


def test_retained_vmm_needs_a_backend_with_virtual_memory(host_device):
    backend = host_device.backend()
    with pytest.raises(devstage.NotSupported, match=r"^devstage Stager: the retained_vmm strategy needs virtual "
                                                    r"memory to grow in place; backend 'python-device' has none"):
        devstage.Stager(backend, strategy="retained_vmm")


def test_a_frame_dropped_unbound_gives_its_slot_back(sim, calls):  # pylint: disable=unused-argument
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=4096)  # one slot
    shapes = [devstage.TensorShape(16), devstage.TensorShape(16, direction="out")]
    frame = stager.frame(shapes)
    with pytest.raises(devstage.Busy):
        stager.frame(shapes)
    del frame  # dropped unbound: its slot (in Python and in the library) goes back
    frame = stager.frame(shapes)
    frame = None  # dropped by rebinding the name
    run = stager.bind([devstage.In(np.ones(16, np.uint8))])  # a bind of args takes the slot
    stager.finish(run)
    cycle = [stager.frame(shapes)]
    cycle.append(cycle)  # only the collector frees it
    del cycle
    gc.collect()
    frame = stager.frame(shapes)
    frame.write(0, np.full(16, 5, np.uint8))
    run = stager.bind(frame)
    kernel(sim, run, 16)
    stager.finish(run)
    assert (frame.arrays[1] == 6).all()


def test_a_bound_frames_handle_goes_and_its_slot_stays_held(sim, calls):  # pylint: disable=unused-argument
    """bind destroys the frame's C handle at once: the library keeps the slot for the run (and
    for its Completion), so a frame made in C behind the package's back is refused."""
    np = numpy_or_skip()
    stager = devstage.Stager(sim, pack_limit=4096)  # one slot
    layout = stager.layout([devstage.TensorShape(16), devstage.TensorShape(16, direction="out")])
    c_stager = stager._h  # pylint: disable=protected-access
    table = layout._address  # pylint: disable=protected-access

    def c_frame():
        devstage._calls.frame_destroy(devstage._calls.frame_create(c_stager, table, 2, "test"))  # pylint: disable=protected-access

    frame = stager.frame(layout)
    frame.write(0, np.full(16, 9, np.uint8))
    run = stager.bind(frame)
    assert frame.bound
    with pytest.raises(devstage.Busy):
        c_frame()  # the run holds the slot in the library
    kernel(sim, run, 16)
    with sim.create_stream() as stream:
        done = stager.finish(run, stream)
        with pytest.raises(devstage.Busy):
            c_frame()  # its Completion holds it
        done.wait()
        with pytest.raises(devstage.Busy):
            c_frame()  # waited, and still held until the Completion is closed: the outputs are in the frame
        assert (frame.arrays[1] == 10).all()  # the frame's memory is still the run's outputs
        done.close()
    c_frame()  # the run ended: the slot is free in the library
    assert (frame.arrays[1] == 10).all()
