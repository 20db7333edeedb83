# SPDX-License-Identifier: Apache-2.0
"""One stager per device: devstage.stagers(devices=8) over 8 simulated devices of one host, one
pinned pool for all of them, a checked decode-step shard on each, from 1 thread and from 8; a
stream of another device refused, naming both; bad device lists refused before anything is made."""
import ctypes
import gc
import threading

import pytest

import devstage

from conftest import numpy_or_skip, standin

TOKENS, WIDTH = 64, 16


def expected(np, ids, device, step):
    return ((ids.astype(np.uint32)[:, None] * 7 + np.arange(WIDTH, dtype=np.uint32)[None, :] + device * 13 + step)
            % 256).astype(np.uint8)


def drive(np, stager, pool, device, steps):
    """`steps` checked steps of one device's shard; the first failure, or None."""
    backend = stager.backend
    with backend.create_stream() as stream:
        for step in range(steps):
            ids = pool.allocate((TOKENS,), "uint8")
            logits = pool.allocate((TOKENS, WIDTH), "uint8")
            ids_host = np.asarray(ids)
            ids_host[:] = (np.arange(TOKENS) + device * 3 + step) % 256
            run = stager.bind([devstage.In(ids), devstage.Out(logits)], stream=stream)
            source, target = run.device_args[0].numpy(), run.device_args[1].numpy()

            def kernel(source=source, target=target, device=device, step=step):
                target[:] = expected(np, source, device, step)

            backend.launch_host_function(stream, kernel)
            del source, target, kernel
            done = stager.finish(run, stream=stream)
            ids_copy = ids_host.copy()
            pool.record(ids, stream)  # this device's stream uses it: back to the pool before the run completed
            del ids_host, ids
            done.wait()
            done.close()
            if not np.array_equal(np.asarray(logits), expected(np, ids_copy, device, step)):
                return f"device {device}: wrong logits at step {step}"
            del logits  # back to the pool
    return None


@pytest.mark.parametrize("threads", [1, 8])
def test_eight_simulated_devices_stage_a_checked_step_over_one_pinned_pool(threads):
    np = numpy_or_skip()
    stagers = devstage.stagers(devices=8, pipeline_slots=2)
    assert [s.backend.device for s in stagers] == list(range(8))
    assert {s.backend.kind for s in stagers} == {"sim"}
    pool = devstage.PinnedPool(stagers[0].backend)  # device 0's pool serves all eight
    failures = [None] * 8
    if threads == 1:
        for _ in range(2):  # one thread drives every device in turn
            for device, stager in enumerate(stagers):
                failures[device] = failures[device] or drive(np, stager, pool, device, 3)
    else:
        def work(device):
            failures[device] = drive(np, stagers[device], pool, device, 6)

        workers = [threading.Thread(target=work, args=(d,)) for d in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert failures == [None] * 8
    for stager in stagers:
        stats = stager.stats
        assert stats["runs"] == 6 and stats["device_mallocs"] >= 1
        stager.release()


def test_a_stream_of_another_device_is_refused_naming_both():
    np = numpy_or_skip()
    zero, one = devstage.stagers(devices=[0, 1])
    data = np.ones(256, np.uint8)
    with one.backend.create_stream() as foreign:
        with pytest.raises(ValueError, match="sim' #.*sim' #"):
            zero.bind([devstage.In(data)], stream=foreign)
    run = zero.bind([devstage.In(data)])  # the stager goes on
    zero.finish(run)


def test_simulated_devices_of_one_host_and_of_their_own():
    first = devstage.sim(device=2)
    joined = devstage.sim(device=5, host_of=first)
    assert (first.device, joined.device) == (2, 5)
    with pytest.raises(TypeError, match="host_of is a int"):
        devstage.sim(host_of=3)
    with pytest.raises(devstage.InvalidArgument, match="device -1"):
        devstage.sim(device=-1)


@pytest.mark.parametrize("devices, match", [
    (0, "a count of 0 devices"),
    ([0, 0], "repeated"),
    ([1, -2], r"device numbers \[-2\]"),
    ([], "no devices"),
])
def test_bad_device_lists_are_refused_before_anything_is_made(devices, match):
    with pytest.raises(devstage.InvalidArgument, match=match):
        devstage.stagers(devices=devices)


def test_a_bad_stager_keyword_closes_the_backends_made():
    with pytest.raises(devstage.InvalidArgument, match="pipeline_slots"):
        devstage.stagers(devices=3, pipeline_slots=-1)
    with pytest.raises(devstage.InvalidArgument, match="kind 'tpu'"):
        devstage.backends(2, kind="tpu")


def test_cuda_devices_and_a_raw_stream_of_device_1_given_to_device_0(cuda_standin):
    np = numpy_or_skip()
    _, cudart = cuda_standin
    zero, one = devstage.stagers(devices=2, kind="cuda", library_path=standin("DEVSTAGE_TEST_CUDART"))
    assert [s.backend.device for s in (zero, one)] == [0, 1]
    assert cudart.cudaSetDevice(1) == 0
    native = ctypes.c_void_p()
    assert cudart.cudaStreamCreateWithFlags(ctypes.byref(native), 1) == 0  # a stream of device 1
    data = np.arange(512, dtype=np.uint8)
    with pytest.raises(devstage.InvalidArgument, match="belongs to cuda device 1"):
        zero.bind([devstage.In(data)], stream=native.value)
    run = one.bind([devstage.In(data)], stream=native.value)  # device 1's stager takes it
    done = one.finish(run, stream=native.value)
    done.wait()
    done.close()
    del zero, one, run
    gc.collect()
    assert cudart.cudaStreamDestroy(native) == 0
