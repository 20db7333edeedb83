# SPDX-License-Identifier: Apache-2.0
"""Regions for transfer engines (docs/transfer_engines.md): long-lived memory a pinned pool or a
stager hands out slices of, listed (`regions()`), registered once through hooks
(`set_region_hooks(added=..., removing=...)`) and any slice of it named as (region, offset,
bytes) (`describe(array_or_pointer)`); and regions a pool pins at their exact size in chunks,
in background threads if asked (PinnedPool.create_region)."""
import math
import sys
import threading
import types
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from . import _dtypes, _host, _lib
from ._dtypes import dtype_name
from ._lib import check, lib

KINDS = {0: "pinned_host", 1: "device"}
STATES = {0: "registering", 1: "ready", 2: "failed", 3: "cancelled"}
_UNKNOWN_POINTER = 5
_BACKEND_FAILURE = 4


@dataclass(frozen=True)
class Region:
    """One region: `bytes` at address `base`; `id` unique in the process; `kind` "pinned_host" or
    "device" (`device` its device id; -1 for host memory); `numa_node` -1 when bound to none."""
    id: int
    base: int
    bytes: int
    numa_node: int
    kind: str
    device: int


@dataclass(frozen=True)
class RegionSlice:
    """A slice of region `region` (its id): `bytes` from `offset`."""
    region: int
    offset: int
    bytes: int


def _region(c: Any) -> Region:
    return Region(c.id, c.base or 0, c.bytes, c.numa_node, KINDS.get(c.kind, "unknown"), c.device)


def list_regions(function: Any, handle: Any, call: str) -> List[Region]:
    """The regions `function` (devstage_pinned_pool_regions or devstage_stager_regions) lists."""
    count = c_size_t()
    check(function(handle, None, 0, byref(count)), call)
    while True:
        capacity = count.value
        array = (_lib.Region * max(capacity, 1))()
        check(function(handle, array, capacity, byref(count)), call)
        if count.value <= capacity:
            return [_region(array[i]) for i in range(count.value)]


def address_of(array_or_pointer: Any) -> int:
    """The address an int names, or where a tensor's memory starts (PinnedBuffer, a frame's view,
    a NumPy array, a CPU torch tensor, anything with the buffer protocol)."""
    if isinstance(array_or_pointer, int):
        return array_or_pointer
    memory = _host.memory_of(array_or_pointer, writable=False)
    try:
        return memory.address
    finally:
        memory.close()


def describe(function: Any, handle: Any, array_or_pointer: Any, call: str) -> Optional[RegionSlice]:
    """The slice `array_or_pointer` lies in, or None when it lies in no region of the owner."""
    slice_ = _lib.RegionSlice()
    status = function(handle, c_void_p(address_of(array_or_pointer) or None), byref(slice_))
    if status == _UNKNOWN_POINTER:
        return None
    check(status, call)
    return RegionSlice(slice_.region, slice_.offset, slice_.bytes)


class Hooks:
    """Python callables as C region hooks. `added(region)` runs before anything of a new region is
    handed out; if it raises, the region is refused: the call that made it fails (BackendFailure
    naming the hook) and the exception goes to sys.unraisablehook, as exceptions of callbacks do.
    `removing(region)` runs before a region is freed or moved; what it raises goes to
    sys.unraisablehook and the region goes anyway. The owner keeps this object while the C side
    may call it."""

    def __init__(self, added: Optional[Callable[[Region], Any]], removing: Optional[Callable[[Region], Any]],
                 call: str) -> None:
        for name, hook in (("added", added), ("removing", removing)):
            if hook is not None and not callable(hook):
                raise TypeError(f"devstage {call}: {name} must be callable or None, not {type(hook).__name__}")
        self.added, self.removing = added, removing
        self._added = _lib.REGION_ADDED(self._on_added) if added is not None else _lib.REGION_ADDED()
        self._removing = _lib.REGION_REMOVING(self._on_removing) if removing is not None else _lib.REGION_REMOVING()
        self.struct = _lib.RegionHooks(self._added, None, self._removing, None)

    def _on_added(self, _context: Any, region: Any) -> int:
        try:
            self.added(_region(region.contents))  # type: ignore[misc]
        except BaseException:  # pylint: disable=broad-except  (nothing may cross the C boundary)
            _unraisable("devstage: the region hook added raised; the region was refused", self.added)
            return _BACKEND_FAILURE
        return 0

    def _on_removing(self, _context: Any, region: Any) -> None:
        try:
            self.removing(_region(region.contents))  # type: ignore[misc]
        except BaseException:  # pylint: disable=broad-except
            _unraisable("devstage: the region hook removing raised; the region went anyway", self.removing)


def _unraisable(message: str, hook: Any) -> None:
    kind, value, traceback = sys.exc_info()
    sys.unraisablehook(types.SimpleNamespace(exc_type=kind, exc_value=value, exc_traceback=traceback,
                                             err_msg=message, object=hook))


class _RegionHandle:
    """The C region, destroyed once the PinnedRegion and every buffer carved out of it are gone."""

    _destroy = lib.devstage_pinned_region_destroy
    _free = lib.devstage_pinned_region_free

    def __init__(self, pool: Any, nbytes: int, threads: int) -> None:
        self.pool = pool  # the pool's handle object: its hooks outlive the region
        self.handle = c_void_p()
        check(lib.devstage_pinned_region_create(pool.handle, nbytes, threads, byref(self.handle)),
              "PinnedPool.create_region")

    def free(self, address: int) -> None:
        if self.handle:
            self._free(self.handle, address)

    def __del__(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self._destroy(handle)


class PinnedRegion:
    """A region a PinnedPool pinned at its exact size in chunks (PinnedPool.create_region), in
    background threads if asked: `progress()`, `ready()`, `wait()`, `cancel()`; once ready,
    `allocate(shape, dtype)` carves tensors out of it. `id`, `data_ptr` and `nbytes` describe it.
    It goes (its hooks' `removing` first) once the object and every buffer of it are gone."""

    def __init__(self, pool: Any, nbytes: int, threads: int) -> None:
        if threads < 0:
            raise ValueError(f"devstage PinnedPool.create_region: threads {threads}; 0 registers in the calling thread")
        self._region = _RegionHandle(pool, nbytes, threads)
        region_id, base, size = c_uint64(), c_void_p(), c_size_t()
        check(lib.devstage_pinned_region_info(self._region.handle, byref(region_id), byref(base), byref(size)),
              "PinnedRegion")
        self.id, self.data_ptr, self.nbytes = region_id.value, base.value or 0, size.value

    def progress(self) -> Dict[str, Any]:
        """Bytes and chunks registered of the total, and the state ("registering", "ready",
        "failed", "cancelled")."""
        progress = _lib.RegionProgress()
        check(lib.devstage_pinned_region_progress(self._region.handle, byref(progress)), "PinnedRegion.progress")
        return {"bytes_registered": progress.bytes_registered, "bytes_total": progress.bytes_total,
                "chunks_registered": progress.chunks_registered, "chunks_total": progress.chunks_total,
                "state": STATES.get(progress.state, "unknown"), "cancel_requested": bool(progress.cancel_requested)}

    def ready(self) -> bool:
        """True once registered and accepted by the hooks, False while registering; raises the
        failure once it failed (a chunk, a hook, the cancellation). Never blocks."""
        ready = c_int()
        check(lib.devstage_pinned_region_ready(self._region.handle, byref(ready)), "PinnedRegion.ready")
        return bool(ready.value)

    def wait(self) -> None:
        """Blocks until the registration ended; raises its failure."""
        check(lib.devstage_pinned_region_wait(self._region.handle), "PinnedRegion.wait")

    def cancel(self) -> None:
        """Stops a registration in progress and rolls it back; InvalidArgument once ready."""
        check(lib.devstage_pinned_region_cancel(self._region.handle), "PinnedRegion.cancel")

    def allocate(self, shape: Any, dtype: str = "uint8", alignment: int = 256) -> "RegionBuffer":
        """A C-contiguous tensor of `shape` and `dtype` inside the region, aligned to `alignment`
        (a power of two); Busy while the region registers. Given back when it and its views go."""
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"devstage: shape {shape} has a negative dimension")
        name = dtype_name(dtype)
        nbytes = math.prod(shape) * _dtypes.itemsize(name)
        address = c_void_p()
        check(lib.devstage_pinned_region_allocate(self._region.handle, max(nbytes, 1), alignment, byref(address)),
              "PinnedRegion.allocate")
        return RegionBuffer(self._region, address.value, shape, name, nbytes)

    def __repr__(self) -> str:
        return f"PinnedRegion(id={self.id}, nbytes={self.nbytes}, data_ptr={self.data_ptr:#x})"


class RegionBuffer(_host.HostTensor):
    """A tensor carved out of a PinnedRegion (NumPy and DLPack views, no copy); its slice goes
    back to the region when the last of the buffer and its views is gone."""

    def __init__(self, region: _RegionHandle, address: int, shape: Any, dtype: str, nbytes: int) -> None:
        self._owner = region
        self.data_ptr = address
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"RegionBuffer(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes}, data_ptr={self.data_ptr:#x})"

    def __del__(self) -> None:
        owner, self._owner = getattr(self, "_owner", None), None
        if owner is not None:
            owner.free(self.data_ptr)


class HookHolder:
    """The Hooks an owner (a pool, a stager) gave the C side, kept while it may call them (the C
    owner's destruction runs `removing` for what is left)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hooks: List[Hooks] = []

    def set(self, function: Any, handle: Any, added: Any, removing: Any, call: str) -> None:
        hooks = Hooks(added, removing, call)
        with self.lock:
            self.hooks.append(hooks)  # before the call: added runs in it
        status = function(handle, byref(hooks.struct))
        with self.lock:  # taken over: the old ones are called no more; refused: the old ones stay
            self.hooks = [hooks] if status == 0 else [h for h in self.hooks if h is not hooks]
        check(status, call)
