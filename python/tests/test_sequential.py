# SPDX-License-Identifier: Apache-2.0
"""Sequential equivalence from Python: random engine programs — binds (args or frames) on random
streams, Python kernels enqueued as host functions, finishes on random streams, waits, polls and
closes in random order, the engine rewriting buffers no run in flight uses — compared byte for
byte with the same program run one call at a time, synchronously, in call order. Over the
simulator, a slow user-style backend (Python stream callbacks that run their work late) and the
CUDA stand-in, with the package's C calls made each way (devstage._native and ctypes). With a fault
injected, the failing call raises and nothing leaks."""
import ctypes
import gc
import os
import random

import pytest

import devstage

from conftest import HostDevice, StreamedDevice, numpy_or_skip, standin

PROGRAMS = int(os.environ.get("DEVSTAGE_PY_SEQ_PROGRAMS", "6"))
STEPS = 60
SIZES = (1, 7, 64, 300, 4095, 4096, 4097, 9000)


def kernel(step, ins, outs):
    """What a run's kernel computes, on device addresses (the backends here keep device memory in
    host memory): each Out/InOut j becomes a function of the run's inputs, the step and j."""
    seed = step
    for address, nbytes in ins:
        if nbytes:
            seed = (seed * 31 + ctypes.c_uint8.from_address(address).value + nbytes) & 0xFF
    for j, (address, nbytes, inout) in enumerate(outs):
        values = (ctypes.c_uint8 * nbytes).from_address(address)
        for i in range(0, nbytes, max(1, nbytes // 16)):
            values[i] = ((values[i] if inout else 0) + seed + j + i) & 0xFF
        if not inout:  # an Out's every byte is the kernel's
            for i in range(nbytes):
                if i % max(1, nbytes // 16):
                    values[i] = (seed ^ j) & 0xFF


def model_kernel(step, ins, outs):
    """kernel() on host byte arrays (the sequential model)."""
    seed = step
    for data in ins:
        if len(data):
            seed = (seed * 31 + data[0] + len(data)) & 0xFF
    for j, (data, inout) in enumerate(outs):
        n = len(data)
        for i in range(n):
            if i % max(1, n // 16) == 0:
                data[i] = ((data[i] if inout else 0) + seed + j + i) & 0xFF
            elif not inout:
                data[i] = (seed ^ j) & 0xFF


class Program:
    def __init__(self, backend, seed, pack_limit, slots, streams):
        np = numpy_or_skip()
        self.np = np
        self.random = random.Random(seed)
        self.backend = backend
        self.stager = devstage.Stager(backend, pack_limit=pack_limit, pipeline_slots=slots)
        self.streams = [backend.create_stream() for _ in range(streams)]
        self.buffers = [np.array([self.random.randrange(256) for _ in range(self.random.choice(SIZES))], np.uint8)
                        for _ in range(6)]
        self.model = [bytearray(b.tobytes()) for b in self.buffers]
        self.in_flight = []   # (completion or None, run record)
        self.live = []        # bound, not finished
        self.step = 0
        self.frames = pack_limit > 0
        self.trace = []

    def written(self, index):
        """True while a run bound or in flight will still write buffer `index`."""
        records = self.live + [record for _, record in self.in_flight]
        return any(b == index and d != devstage.IN for record in records
                   for b, d in zip(record["buffers"], record["directions"]))

    def used(self, index):
        return any(index in record["uses"] for record in self.live) or \
            any(index in record["uses"] for _, record in self.in_flight)

    def bind(self):
        r = self.random
        count = r.randrange(1, 4)
        chosen = r.sample(range(len(self.buffers)), count)
        directions = [r.choice((devstage.IN, devstage.OUT, devstage.IN_OUT)) for _ in chosen]
        stream = r.choice(self.streams + [None]) if self.streams else None
        # The engine copies a frame's inputs itself: only from buffers no run will still write.
        framed = self.frames and r.random() < 0.3 and not any(
            self.written(b) for b, d in zip(chosen, directions) if d != devstage.OUT)
        record = {"step": self.step, "uses": set(chosen), "directions": directions, "buffers": chosen,
                  "stream": stream, "framed": framed}
        self.step += 1
        try:
            if framed:
                shapes = [devstage.TensorShape(len(self.buffers[b]), "uint8", d) for b, d in zip(chosen, directions)]
                frame = self.stager.frame(shapes)
                for i, (b, d) in enumerate(zip(chosen, directions)):
                    if d != devstage.OUT:
                        self.np.asarray(frame[i])[:] = self.buffers[b]
                # Views of the outputs, taken now: they keep the frame the engine's until read.
                record["views"] = {b: self.np.asarray(frame[i]) for i, (b, d) in enumerate(zip(chosen, directions))
                                   if d != devstage.IN}
                run = self.stager.bind(frame, stream=stream)
                del frame
            else:
                args = [{devstage.IN: devstage.In, devstage.OUT: devstage.Out, devstage.IN_OUT: devstage.InOut}[d](
                    self.buffers[b]) for b, d in zip(chosen, directions)]
                run = self.stager.bind(args, stream=stream)
        except devstage.Busy:
            self.trace.append(f"bind {chosen} busy")
            return
        record["run"] = run
        # The model: the run reads its inputs now (and, unframed, writes its outputs at finish).
        record["inputs"] = [bytes(self.model[b]) if d != devstage.OUT else b"" for b, d in zip(chosen, directions)]
        ins = [(run.device_pointers[i], len(self.buffers[b])) for i, (b, d) in enumerate(zip(chosen, directions))
               if d != devstage.OUT]
        outs = [(run.device_pointers[i], len(self.buffers[b]), d == devstage.IN_OUT)
                for i, (b, d) in enumerate(zip(chosen, directions)) if d != devstage.IN]
        step = record["step"]
        if stream is None:
            kernel(step, ins, outs)
        else:
            self.backend.launch_host_function(stream, lambda: kernel(step, ins, outs))
        self.live.append(record)
        self.trace.append(f"bind {chosen} {directions} stream={'sync' if stream is None else self.streams.index(stream)}"
                          f"{' frame' if framed else ''}")

    def finish(self):
        record = self.live.pop(self.random.randrange(len(self.live)))
        r = self.random
        stream = record["stream"] if r.random() < 0.7 else (r.choice(self.streams) if self.streams else None)
        if record["stream"] is not None and stream is None:
            record["stream"].synchronize()  # a synchronous finish needs the kernel completed
        done = self.stager.finish(record["run"], stream=stream)
        del record["run"]
        self.apply_model(record)
        if done is None:
            self.settled(record)
        else:
            self.in_flight.append((done, record))
        self.trace.append(f"finish step {record['step']} on {'sync' if stream is None else self.streams.index(stream)}")

    def apply_model(self, record):
        outputs = []
        for b, d in zip(record["buffers"], record["directions"]):
            if d == devstage.IN:
                continue
            data = bytearray(record["inputs"][record["buffers"].index(b)]) if d == devstage.IN_OUT else \
                bytearray(len(self.model[b]))
            outputs.append((b, data, d == devstage.IN_OUT))
        ins = [data for data, d in zip(record["inputs"], record["directions"]) if d != devstage.OUT]
        model_kernel(record["step"], ins, [(data, inout) for _, data, inout in outputs])
        record["expected"] = {b: bytes(data) for b, data, _ in outputs}
        if not record["framed"]:
            for b, data, _ in outputs:
                self.model[b][:] = data

    def settled(self, record):
        if record["framed"]:
            for b, view in record.pop("views").items():
                assert view.tobytes() == record["expected"][b], f"frame output (buffer {b}) of step " \
                    f"{record['step']}\n" + "\n".join(self.trace)

    def complete(self):
        done, record = self.in_flight.pop(self.random.randrange(len(self.in_flight)))
        how = self.random.random()
        if how < 0.2 and not record["framed"]:
            del done  # dropped: its destructor waits
        elif how < 0.4:
            while not done.ready():
                pass
            self.settled(record)
            done.close()
        else:
            done.wait()
            self.settled(record)
            done.close()
        self.trace.append(f"complete step {record['step']}")

    def rewrite(self):
        index = self.random.randrange(len(self.buffers))
        if self.used(index):
            return
        value = self.random.randrange(256)
        self.buffers[index][:] = value
        self.model[index][:] = bytes([value]) * len(self.model[index])
        self.trace.append(f"rewrite {index}")

    def run(self):
        for _ in range(STEPS):
            choice = self.random.random()
            if choice < 0.35 and len(self.live) < 3:
                self.bind()
            elif choice < 0.6 and self.live:
                self.finish()
            elif choice < 0.85 and self.in_flight:
                self.complete()
            else:
                self.rewrite()
        while self.live:
            self.finish()
        while self.in_flight:
            done, record = self.in_flight.pop()
            done.wait()
            self.settled(record)
            done.close()
        for index, (buffer, model) in enumerate(zip(self.buffers, self.model)):
            assert buffer.tobytes() == bytes(model), f"buffer {index} differs\n" + "\n".join(self.trace)
        for stream in self.streams:
            stream.close()


def backends():
    yield "sim", lambda seed: devstage.sim()
    yield "python-streams", lambda seed: StreamedDevice(seed).backend()
    yield "python-immediate", lambda seed: HostDevice().backend()
    yield "cuda-standin", lambda seed: devstage.cuda(0, standin("DEVSTAGE_TEST_CUDART"))


@pytest.mark.parametrize("name,make", list(backends()), ids=[name for name, _ in backends()])
@pytest.mark.parametrize("pack_limit,slots", [(0, 1), (0, 2), (4096, 2), (16384, 3)])
def test_random_programs_equal_their_synchronous_run(name, make, pack_limit, slots, calls):  # pylint: disable=unused-argument
    for seed in range(PROGRAMS):
        backend = make(seed)
        Program(backend, seed * 7919 + slots, pack_limit, slots, streams=2 if backend.has_streams else 1).run()
        gc.collect()


class FailingDevice(StreamedDevice):
    """StreamedDevice whose k-th synchronous copy fails."""

    def __init__(self, k):
        super().__init__(k)
        self.k, self.copies_seen = k, 0

    def copy(self, dst, src, nbytes):
        self.copies_seen += 1
        return -9 if self.copies_seen == self.k else super().copy(dst, src, nbytes)


def stage_with_a_fault(device):
    """Eight runs, synchronous and on a stream, over `device`; how many calls raised."""
    np = numpy_or_skip()
    backend = device.backend()
    stager = devstage.Stager(backend, pack_limit=4096, pipeline_slots=2)
    stream = backend.create_stream()
    failures = 0
    for step in range(8):
        data = np.full(5000 if step % 2 else 100, step, np.uint8)
        out = np.full_like(data, 0xAB)
        on = stream if step % 3 else None
        try:
            run = stager.bind([devstage.In(data), devstage.Out(out)], stream=on)
            done = stager.finish(run, stream=on)
            if done is not None:
                done.wait()
                done.close()
            assert not out.any()  # no kernel wrote it: the zeroed Out came back
        except devstage.Error as error:
            failures += 1
            assert "python-streams" in str(error) and "returned -9" in str(error), str(error)
    stream.close()
    return failures


def test_a_fault_raises_and_nothing_leaks():
    for k in range(1, 30):
        device = FailingDevice(k)
        failures = stage_with_a_fault(device)
        gc.collect()
        assert failures == (1 if k <= device.copies_seen else 0), f"k={k}: {failures} failures"
        assert not device.device and not device.pinned, f"k={k}: {len(device.device)} device, " \
            f"{len(device.pinned)} pinned allocations left"
