# SPDX-License-Identifier: Apache-2.0
"""PinnedPool and PinnedBuffer: zero-copy views through NumPy's array interface and DLPack, and
the lifetimes of buffers, views and pools."""
import gc

import pytest

import devstage
from devstage import _dlpack

from conftest import numpy_or_skip, torch_or_skip


def test_numpy_views_pinned_memory_without_a_copy(sim):
    np = numpy_or_skip()
    pool = devstage.PinnedPool(sim)
    buf = pool.allocate((4, 6), "float32")
    array = np.asarray(buf)
    assert array.shape == (4, 6) and array.dtype == np.float32
    assert array.__array_interface__["data"][0] == buf.data_ptr
    assert array.base is buf
    array[:] = 7.5
    again = np.asarray(buf)
    assert (again == 7.5).all()


def test_torch_views_pinned_memory_without_a_copy(sim):
    torch = torch_or_skip()
    np = numpy_or_skip()
    pool = devstage.PinnedPool(sim)
    buf = pool.allocate((16, 512), torch.bfloat16)
    assert buf.__dlpack_device__() == (1, 0)
    tensor = torch.from_dlpack(buf)
    assert tensor.dtype == torch.bfloat16 and tuple(tensor.shape) == (16, 512)
    assert tensor.data_ptr() == buf.data_ptr
    tensor.fill_(2.0)
    raw = np.asarray(buf).view(np.uint16)  # NumPy has no bfloat16: the bits
    assert (raw == 0x4000).all()
    for dtype in (torch.float32, torch.int64, torch.uint8, torch.float16):
        view = torch.from_dlpack(pool.allocate(8, dtype))
        assert view.dtype == dtype and view.numel() == 8


def test_writes_through_a_tensor_are_what_the_stager_uploads(sim):
    torch = torch_or_skip()
    np = numpy_or_skip()
    pool = devstage.PinnedPool(sim)
    buf = pool.allocate((64, 64), "float32")
    torch.from_dlpack(buf).copy_(torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64))
    stager = devstage.Stager(sim)
    run = stager.bind([devstage.In(buf)])
    staged = np.empty((64, 64), np.float32)
    sim.copy_from_device(staged.ctypes.data, run.device_args[0], staged.nbytes)
    stager.finish(run)
    assert (staged == np.arange(64 * 64, dtype=np.float32).reshape(64, 64)).all()


def test_a_buffer_outlives_its_pool_object(host_device):
    np = numpy_or_skip()
    backend = host_device.backend()
    pool = devstage.PinnedPool(backend)
    buf = pool.allocate(1000, "uint8")
    del pool
    gc.collect()
    np.asarray(buf)[:] = 9  # still valid memory
    assert np.asarray(buf).sum() == 9000
    assert host_device.calls["pinned_free"] == 0
    del buf  # the last holder: the block goes back, and the pool with it
    gc.collect()
    assert host_device.calls["pinned_free"] == host_device.calls["pinned_malloc"] == 1
    assert not host_device.pinned


def test_views_outlive_the_buffer_and_give_it_back_when_the_last_one_dies(sim):
    torch = torch_or_skip()
    np = numpy_or_skip()
    pool = devstage.PinnedPool(sim)
    buf = pool.allocate(256, "int32")
    tensor = torch.from_dlpack(buf)
    array = np.asarray(buf)
    del buf
    gc.collect()
    tensor.fill_(5)
    assert (array == 5).all()
    assert pool.stats["live_allocations"] == 1
    del tensor
    gc.collect()
    assert pool.stats["live_allocations"] == 1  # the NumPy view still holds it
    del array
    gc.collect()
    assert pool.stats["live_allocations"] == 0
    assert _dlpack.exported() == 0


def test_a_capsule_never_consumed_gives_its_tensor_back(sim):
    pool = devstage.PinnedPool(sim)
    buf = pool.allocate(64)
    capsule = buf.__dlpack__()
    assert _dlpack.exported() == 1
    del capsule
    gc.collect()
    assert _dlpack.exported() == 0
    del buf
    gc.collect()
    assert pool.stats["live_allocations"] == 0


def test_the_cache_reuses_blocks(sim):
    pool = devstage.PinnedPool(sim, max_cached_bytes=1 << 20)
    first = pool.allocate(4096)
    address = first.data_ptr
    del first
    second = pool.allocate(4000)
    assert second.data_ptr == address
    assert pool.stats["cache_hits"] == 1
    pool.trim()


def test_bad_dtypes_and_shapes_are_refused(sim):
    pool = devstage.PinnedPool(sim)
    with pytest.raises(ValueError, match="dtype 'complex64'"):
        pool.allocate(4, "complex64")
    with pytest.raises(ValueError, match="negative dimension"):
        pool.allocate((4, -1))


def test_a_backend_without_pinned_memory_has_no_pool(host_device):
    backend = devstage.Backend.from_callbacks(device_malloc=host_device.device_malloc,
                                              device_free=host_device.device_free,
                                              copy_to_device=host_device.copy, copy_from_device=host_device.copy,
                                              name="no-pinned")
    assert not backend.has_pinned
    with pytest.raises(devstage.NotSupported, match="'no-pinned' has no pinned host memory") as caught:
        devstage.PinnedPool(backend)
    assert caught.value.status == "not_supported"


def test_pinning_an_existing_array_in_place(sim):
    np = numpy_or_skip()
    pool = devstage.PinnedPool(sim)
    array = np.arange(1 << 16, dtype=np.float32)
    with pool.pin(array) as pinned:
        assert pinned.data_ptr == array.ctypes.data and pinned.nbytes == array.nbytes
        stager = devstage.Stager(sim)
        run = stager.bind([devstage.In(array)])
        staged = np.empty_like(array)
        sim.copy_from_device(staged.ctypes.data, run.device_pointers[0], staged.nbytes)
        stager.finish(run)
        assert (staged == array).all()
        with pytest.raises(devstage.Error):
            pool.pin(array)  # already pinned
    with pytest.raises(devstage.UnknownPointer):
        sim.host_unregister(array.ctypes.data)  # unpinned on leaving the block
    with pytest.raises(ValueError, match="0 bytes"):
        pool.pin(np.zeros(0, np.uint8))


def test_pinning_a_torch_tensor_in_place(sim):
    torch = torch_or_skip()
    pool = devstage.PinnedPool(sim)
    tensor = torch.zeros(4096, dtype=torch.int16)
    pinned = pool.pin(tensor)
    assert pinned.tensor is tensor and pinned.data_ptr == tensor.data_ptr()
    pinned.close()
    pinned.close()  # twice is fine
