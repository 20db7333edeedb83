# SPDX-License-Identifier: Apache-2.0
"""Two Python threads, each with its own stager, over one pinned pool (the pool and the backend are
thread-safe; a stager is one thread's): every run's bytes are right and the pool ends empty."""
import threading

import devstage

from conftest import StreamedDevice, numpy_or_skip


def stage_on(backend, pool, seed, errors, streams):
    np = numpy_or_skip()
    try:
        stager = devstage.Stager(backend, pack_limit=4096, pipeline_slots=2)
        stream = backend.create_stream() if streams else None
        for step in range(40):
            source = pool.allocate(1000 + step * 37, "uint8")
            np.asarray(source)[:] = (seed + step) % 251
            out = pool.allocate(source.nbytes, "uint8")
            run = stager.bind([devstage.In(source), devstage.Out(out)], stream=stream)
            if stream is None:
                backend.copy_to_device(run.device_pointers[1], source.data_ptr, source.nbytes)
            else:
                src, dst, n = run.device_pointers[0], run.device_pointers[1], source.nbytes
                backend.launch_host_function(stream, lambda src=src, dst=dst, n=n: __import__("ctypes").memmove(
                    dst, src, n))
            done = stager.finish(run, stream=stream)
            if done is not None:
                done.wait()
                done.close()
            if not (np.asarray(out) == (seed + step) % 251).all():
                errors.append(f"thread {seed}: step {step} came back wrong")
            pool.record(source, stream) if stream is not None else None
            del source, out
        if stream is not None:
            stream.close()
    except Exception as error:  # pylint: disable=broad-except
        errors.append(f"thread {seed}: {error!r}")


def run_threads(backend, streams):
    pool = devstage.PinnedPool(backend, max_cached_bytes=1 << 20)
    errors = []
    threads = [threading.Thread(target=stage_on, args=(backend, pool, seed, errors, streams)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert pool.stats["live_allocations"] == 0


def test_two_threads_two_stagers_one_pool_on_the_simulator(sim):
    run_threads(sim, streams=True)
    run_threads(sim, streams=False)


def test_two_threads_over_python_stream_callbacks():
    run_threads(StreamedDevice(3).backend(), streams=True)
