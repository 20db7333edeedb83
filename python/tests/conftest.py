# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the devstage Python tests: the simulator; a device in host memory behind Python
callbacks that counts what it is asked for (immediate streams); the same with real streams, each
a worker thread that runs its work late (a slow user-style backend); and the CUDA and ACL
stand-in runtimes the C++ tests use, when Meson says where they are."""
import ctypes
import gc
import os
import queue
import random
import threading

import pytest

import devstage


@pytest.fixture
def sim():
    return devstage.sim()


class HostDevice:
    """A runtime's platform layer in Python: device and pinned memory are ctypes buffers."""

    def __init__(self, capacity=1 << 30):
        self.capacity = capacity
        self.device = {}
        self.pinned = {}
        self.calls = {"device_malloc": 0, "device_free": 0, "pinned_malloc": 0, "pinned_free": 0, "copies": 0}
        self.fail_copies = False
        self.lock = threading.Lock()

    def _malloc(self, blocks, nbytes, what):
        with self.lock:
            self.calls[what] += 1
            if blocks is self.device and sum(len(b) for b in self.device.values()) + nbytes > self.capacity:
                return 0
            block = ctypes.create_string_buffer(nbytes)
            blocks[ctypes.addressof(block)] = block
            return ctypes.addressof(block)

    def device_malloc(self, nbytes):
        return self._malloc(self.device, nbytes, "device_malloc")

    def device_free(self, address):
        with self.lock:
            self.calls["device_free"] += 1
            del self.device[address]

    def pinned_malloc(self, nbytes):
        return self._malloc(self.pinned, nbytes, "pinned_malloc")

    def pinned_free(self, address):
        with self.lock:
            self.calls["pinned_free"] += 1
            del self.pinned[address]

    def copy(self, dst, src, nbytes):
        with self.lock:
            self.calls["copies"] += 1
            if self.fail_copies:
                return -7
        ctypes.memmove(dst, src, nbytes)
        return 0

    def callbacks(self):
        return dict(device_malloc=self.device_malloc, device_free=self.device_free, copy_to_device=self.copy,
                    copy_from_device=self.copy, pinned_malloc=self.pinned_malloc, pinned_free=self.pinned_free)

    def backend(self):
        return devstage.Backend.from_callbacks(name="python-device", dlpack_device=(1, 0), **self.callbacks())


class StreamedDevice(HostDevice):
    """HostDevice with real streams: each a worker thread running its work in order, late (a random
    delay before each item), so a caller that does not wait reads stale memory. Events record the
    stream's position; a stream wait blocks that stream until the event's work ran."""

    def __init__(self, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.random = random.Random(seed)
        self.streams = {}
        self.events = {}
        self.next_handle = 0x100
        self.fail_copy_at = None  # fail the k-th async copy when it runs (a sticky stream failure)
        self.async_copies = 0
        self.failing_waits = 0    # the next this many synchronize_event calls fail, waiting for nothing

    def _handle(self):
        with self.lock:
            self.next_handle += 0x10
            return self.next_handle

    def create_stream(self):
        handle = self._handle()
        work = queue.Queue()
        state = {"done": 0, "enqueued": 0, "cv": threading.Condition(), "failed": False}

        def worker():
            while True:
                item = work.get()
                if item is None:
                    return
                if self.random.random() < 0.3:
                    threading.Event().wait(self.random.random() * 0.002)
                try:
                    item()
                except Exception:  # pylint: disable=broad-except
                    state["failed"] = True
                with state["cv"]:
                    state["done"] += 1
                    state["cv"].notify_all()

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        self.streams[handle] = (work, state, thread)
        return handle

    def _enqueue(self, stream, item):
        work, state, _ = self.streams[stream]
        with state["cv"]:
            state["enqueued"] += 1
        work.put(item)

    def destroy_stream(self, stream):
        work, _, thread = self.streams.pop(stream)
        work.put(None)
        thread.join()

    def copy_async(self, dst, src, nbytes, stream):
        with self.lock:
            self.async_copies += 1
            fails = self.fail_copy_at == self.async_copies

        def run():
            if fails:
                raise RuntimeError("injected copy failure")
            ctypes.memmove(dst, src, nbytes)
        self._enqueue(stream, run)

    def create_event(self):
        handle = self._handle()
        self.events[handle] = None  # (stream, position) once recorded
        return handle

    def destroy_event(self, event):
        del self.events[event]

    def record_event(self, event, stream):
        _, state, _ = self.streams[stream]
        with state["cv"]:
            self.events[event] = (stream, state["enqueued"])

    def _complete(self, event):
        mark = self.events[event]
        if mark is None:
            return True
        _, state, _ = self.streams[mark[0]]
        return state["done"] >= mark[1]

    def event_ready(self, event):
        return self._complete(event)

    def synchronize_event(self, event):
        if self.failing_waits:
            self.failing_waits -= 1
            return -11
        mark = self.events[event]
        if mark is None:
            return 0
        _, state, _ = self.streams[mark[0]]
        with state["cv"]:
            state["cv"].wait_for(lambda: state["done"] >= mark[1])
        return -5 if state["failed"] else 0

    def stream_wait_event(self, stream, event):
        mark = self.events[event]
        if mark is None:
            return

        def wait():
            _, state, _ = self.streams[mark[0]]
            with state["cv"]:
                state["cv"].wait_for(lambda: state["done"] >= mark[1])
        self._enqueue(stream, wait)

    def synchronize(self):
        for stream in list(self.streams):
            _, state, _ = self.streams[stream]
            with state["cv"]:
                state["cv"].wait_for(lambda state=state: state["done"] >= state["enqueued"])
        return 0

    def launch_host_function(self, stream, run):
        self._enqueue(stream, run)

    def backend(self, synchronize=True):
        return devstage.Backend.from_callbacks(
            name="python-streams", dlpack_device=(1, 0), create_stream=self.create_stream,
            destroy_stream=self.destroy_stream, copy_to_device_async=self.copy_async,
            copy_from_device_async=self.copy_async, create_event=self.create_event, destroy_event=self.destroy_event,
            record_event=self.record_event, event_ready=self.event_ready, synchronize_event=self.synchronize_event,
            stream_wait_event=self.stream_wait_event, synchronize=self.synchronize if synchronize else None,
            launch_host_function=self.launch_host_function, **self.callbacks())


@pytest.fixture
def host_device():
    device = HostDevice()
    yield device
    gc.collect()


@pytest.fixture
def streamed_device():
    device = StreamedDevice()
    yield device
    gc.collect()


def standin(variable):
    """The path of a stand-in runtime library Meson built (skips without it)."""
    path = os.environ.get(variable)
    if not path or not os.path.exists(path):
        pytest.skip(f"{variable} is not set: the stand-in runtime is built and named by Meson (meson test python)")
    return path


@pytest.fixture
def cuda_standin():
    """A CUDA backend over the CUDA stand-in runtime (device memory is host memory there), and the
    stand-in library itself through ctypes, for making native streams."""
    path = standin("DEVSTAGE_TEST_CUDART")
    return devstage.cuda(0, path), ctypes.CDLL(path)


@pytest.fixture
def ascend_standin():
    path = standin("DEVSTAGE_TEST_ACL")
    return devstage.ascend(0, path), ctypes.CDLL(path)


IMPLEMENTATIONS = ["native", "ctypes"] if devstage._calls.native is not None else ["ctypes"]  # pylint: disable=protected-access


@pytest.fixture(params=IMPLEMENTATIONS)
def calls(request):
    """Each way the package makes its C calls (devstage._native where it is built, and ctypes), in
    turn; the one in use is put back after."""
    before = devstage._calls.IMPLEMENTATION  # pylint: disable=protected-access
    devstage._calls.select(request.param)  # pylint: disable=protected-access
    yield request.param
    devstage._calls.select(before)  # pylint: disable=protected-access


def torch_or_skip():
    return pytest.importorskip("torch", reason="python3-torch is not installed: the PyTorch cases are skipped")


def numpy_or_skip():
    return pytest.importorskip("numpy", reason="python3-numpy is not installed")
