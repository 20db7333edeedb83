# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the devstage Python tests: the simulator, and a device in host memory behind
Python callbacks that counts what it is asked for."""
import ctypes
import gc

import pytest

import devstage


@pytest.fixture
def sim():
    return devstage.Backend.simulator()


class HostDevice:
    """A runtime's platform layer in Python: device and pinned memory are ctypes buffers."""

    def __init__(self, capacity=1 << 30):
        self.capacity = capacity
        self.device = {}
        self.pinned = {}
        self.calls = {"device_malloc": 0, "device_free": 0, "pinned_malloc": 0, "pinned_free": 0, "copies": 0}
        self.fail_copies = False

    def _malloc(self, blocks, nbytes, what):
        self.calls[what] += 1
        if sum(len(b) for b in self.device.values()) + nbytes > self.capacity and blocks is self.device:
            return 0
        block = ctypes.create_string_buffer(nbytes)
        blocks[ctypes.addressof(block)] = block
        return ctypes.addressof(block)

    def device_malloc(self, nbytes):
        return self._malloc(self.device, nbytes, "device_malloc")

    def device_free(self, address):
        self.calls["device_free"] += 1
        del self.device[address]

    def pinned_malloc(self, nbytes):
        return self._malloc(self.pinned, nbytes, "pinned_malloc")

    def pinned_free(self, address):
        self.calls["pinned_free"] += 1
        del self.pinned[address]

    def copy(self, dst, src, nbytes):
        self.calls["copies"] += 1
        if self.fail_copies:
            return -7
        ctypes.memmove(dst, src, nbytes)
        return 0

    def backend(self):
        return devstage.Backend.from_callbacks(
            device_malloc=self.device_malloc, device_free=self.device_free, copy_to_device=self.copy,
            copy_from_device=self.copy, pinned_malloc=self.pinned_malloc, pinned_free=self.pinned_free,
            name="python-device")


@pytest.fixture
def host_device():
    device = HostDevice()
    yield device
    gc.collect()


def torch_or_skip():
    return pytest.importorskip("torch", reason="python3-torch is not installed: the PyTorch cases are skipped")


def numpy_or_skip():
    return pytest.importorskip("numpy", reason="python3-numpy is not installed")
