# SPDX-License-Identifier: Apache-2.0
"""Frames: a slot's pinned mirror laid out for a run's tensors, so the inputs are written in place
(no host copy) and the outputs arrive there.

A Layout is a list of TensorShapes made ready once: its C table, and for each pipeline slot the
place of every tensor in that slot's mirror with the views of it (NumPy arrays, HostViews), made
the first time the slot is framed and kept while the slot's mirror does not move. A Frame is one
step's use of one slot: `frame = stager.frame(layout)`, `frame.arrays[i][:] = ...`, bind, finish,
wait, read `frame.arrays[j]`.

Who owns the memory: the stager. Every view of one slot's mirror leads to one _Mirror object (a
NumPy view's base is the slot's region array, whose base is the _Mirror; a DLPack export holds
the _Mirror), so the package can tell whether anything but its own caches still views a mirror:
it drops its caches and looks whether the _Mirror is still alive (Stager.release() and close()
then refuse, Busy, rather than free it).
"""
import ctypes
import weakref
from typing import Any, List, Optional, Sequence, Tuple

from . import _calls, _dlpack, _dtypes, _host
from .args import TensorShape, frame_shapes


class _Mirror:
    """The memory of one slot's mirror that a layout's tensors span, as NumPy sees it (uint8); what
    every view of it keeps alive, and with it the C stager (`core`)."""

    __slots__ = ("__array_interface__", "core", "__weakref__")

    def __init__(self, address: int, nbytes: int, core: Any) -> None:
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "strides": None,
                                    "version": 3}
        self.core = core


class SlotMemory:
    """One slot's mirror as a layout places its tensors there: `hosts` (each tensor's address; 0
    for a device-resident or zero-byte one), and the views of them, made once. Retired when the
    mirror moves or goes back (a grow, release(), reserve(), close()): its frames and views then
    refuse to give memory."""

    __slots__ = ("layout", "slot", "hosts", "retired", "_mirror", "_arrays", "_views")

    def __init__(self, layout: "Layout", slot: int, hosts: Tuple[int, ...]) -> None:
        self.layout, self.slot, self.hosts = layout, slot, hosts
        self.retired = False
        self._mirror: Optional[_Mirror] = None
        self._arrays: Optional[List[Any]] = None
        self._views: Optional[List[Optional["HostView"]]] = None

    def mirror(self) -> _Mirror:
        if self._mirror is None:
            self._check()
            shapes = self.layout.shapes
            spans = [(address, address + shape.nbytes) for address, shape in zip(self.hosts, shapes) if address]
            low = min((start for start, _ in spans), default=_dlpack.EMPTY_ADDRESS)
            high = max((end for _, end in spans), default=low)
            self._mirror = _Mirror(low, high - low, self.layout._core)  # pylint: disable=protected-access
        return self._mirror

    def arrays(self) -> List[Any]:
        """NumPy arrays of the tensors (None for device-resident ones), made once."""
        arrays = self._arrays
        if arrays is None:
            arrays = self._arrays = self._make_arrays()
        return arrays

    def _make_arrays(self) -> List[Any]:
        import numpy  # pylint: disable=import-outside-toplevel
        mirror = self.mirror()
        region = numpy.asarray(mirror)
        low = mirror.__array_interface__["data"][0]
        arrays: List[Any] = []
        for address, shape in zip(self.hosts, self.layout.shapes):
            typestr = _dtypes.DTYPES[shape.dtype][2]
            if shape.device is not None:
                arrays.append(None)
            elif not address:  # no bytes: nothing of the mirror
                arrays.append(numpy.empty(shape.shape, numpy.dtype(typestr)))
            else:
                start = address - low
                arrays.append(region[start:start + shape.nbytes].view(numpy.dtype(typestr)).reshape(shape.shape))
        return arrays

    def view(self, index: int) -> "HostView":
        views = self._views
        if views is None:
            self._check()
            views = self._views = [None] * len(self.hosts)
        view = views[index]
        if view is None:
            shape = self.layout.shapes[index]
            view = views[index] = HostView(self, index, self.hosts[index], shape.nbytes, shape.shape, shape.dtype)
        return view

    def _check(self) -> None:
        if self.retired:
            raise ValueError(f"devstage: the frame memory of slot {self.slot} was given back to its stager (released, "
                             "reserved, closed, or moved by a grow): make a new frame")

    def retire(self) -> "Optional[weakref.ref[_Mirror]]":
        """Drops this cache's views of the mirror; a weak reference to the _Mirror when there was
        one: alive afterwards only if something else still views the memory."""
        self.retired = True
        for view in self._views or ():
            if view is not None and _ViewBase is not object:
                view._shut()  # no new buffer of it
        mirror, self._mirror, self._arrays, self._views = self._mirror, None, None, None
        return None if mirror is None else weakref.ref(mirror)


# Where the compiled calls are built, a HostView has the buffer protocol (NumPy reads it first).
_ViewBase: Any = getattr(_calls.native, "HostBuffer", object)


class HostView(_ViewBase):  # type: ignore[misc,valid-type]
    """Tensor i of a frame, in pinned memory: `numpy.asarray(view)` is a NumPy array of it (through
    the buffer protocol where the compiled calls are built, else the frame's array itself),
    `torch.from_dlpack(view)` a torch view (kDLCPU), of the TensorShape's shape and dtype; staged
    as an arg, it is that memory. It keeps the slot's memory from being freed while it lives (as an
    array of it does)."""

    __slots__ = ("_memory", "_mirror", "index", "data_ptr", "nbytes", "shape", "dtype")

    def __init__(self, memory: SlotMemory, index: int, data_ptr: int, nbytes: int, shape: Tuple[int, ...],
                 dtype: str) -> None:
        self._memory = memory
        self._mirror = memory.mirror()
        self.index, self.data_ptr, self.nbytes, self.shape, self.dtype = index, data_ptr, nbytes, shape, dtype
        if _ViewBase is not object:
            self._expose(data_ptr, nbytes, _dtypes.FORMAT_CHARS[dtype][:1], _dtypes.itemsize(dtype), shape)

    def __array__(self, dtype: Any = None) -> Any:
        memory = self._memory
        memory._check()  # pylint: disable=protected-access
        array = memory.arrays()[self.index]
        return array if dtype is None else array.astype(dtype)

    def __dlpack__(self, stream: Any = None, **_ignored: Any) -> Any:  # pylint: disable=unused-argument
        self._memory._check()  # pylint: disable=protected-access
        code, bits, _ = _dtypes.DTYPES[self.dtype]
        return _dlpack.capsule(self._memory.mirror(), self.data_ptr, self.shape, code, bits)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_dlpack.CPU, 0)

    def _devstage_memory(self) -> _host.Memory:
        self._memory._check()  # pylint: disable=protected-access
        return _host.Memory(self.data_ptr, self.nbytes, self.shape, self.dtype, keep=self._memory.mirror())

    def __repr__(self) -> str:
        return f"HostView(frame tensor {self.index}, shape={self.shape}, dtype={self.dtype})"


class Layout:
    """A frame's TensorShapes, made ready once for a stager (`layout = stager.layout(shapes)`;
    stager.frame(shapes) makes one per distinct list and keeps the latest): the C table, the
    memory of device-resident tensors, and per slot the place of each tensor and its views."""

    def __init__(self, stager: Any, shapes: Sequence[TensorShape]) -> None:
        self._core = stager._core  # pylint: disable=protected-access  (the C stager: its views keep it)
        self.shapes: Tuple[TensorShape, ...] = tuple(shapes)
        self.count = len(self.shapes)
        self._table, self._keep = frame_shapes(self.shapes, stager.backend)
        self._address = ctypes.addressof(self._table)
        self._memories: List[Optional[SlotMemory]] = [None] * stager.pipeline_slots
        # What a run of the layout is, per tensor (see Run).
        self.dtypes = tuple(shape.dtype for shape in self.shapes)
        self.tensor_shapes = tuple(shape.shape for shape in self.shapes)
        self.directions = tuple(shape.direction for shape in self.shapes)
        self.nbytes = tuple(shape.nbytes for shape in self.shapes)
        self._chars = tuple(shape._chars if shape.device is None else b"" for shape in self.shapes)  # pylint: disable=protected-access
        self._itemsizes = tuple(shape._itemsize for shape in self.shapes)  # pylint: disable=protected-access

    def memory(self, slot: int, hosts: Tuple[int, ...]) -> SlotMemory:
        """Slot `slot`'s SlotMemory for these tensor addresses: the one kept while they stay, a new
        one (the old retired) when the mirror moved."""
        memory = self._memories[slot]
        if memory is not None and memory.hosts == hosts:
            return memory
        if memory is not None:
            memory.retire()
        memory = self._memories[slot] = SlotMemory(self, slot, hosts)
        return memory

    def retire(self) -> "List[Tuple[int, weakref.ref[_Mirror]]]":
        """Drops every slot's views; (slot, weak reference) for each mirror something may still view."""
        alive = []
        for slot, memory in enumerate(self._memories):
            if memory is not None:
                ref = memory.retire()
                if ref is not None:
                    alive.append((slot, ref))
        self._memories = [None] * len(self._memories)
        return alive

    def close(self) -> None:
        keep, self._keep = self._keep, []
        for memory in keep:
            memory.close()

    def __repr__(self) -> str:
        return f"Layout({list(self.shapes)})"


class Frame:
    """One slot's mirror laid out for a run (Stager.frame): `frame[i]` is tensor i's HostView,
    `frame.arrays` the NumPy arrays of all of them (made once per slot and layout, so the same
    objects come back whenever this slot is framed for this layout), `frame[i] = value` or
    `frame.write(i, value)` a checked write. Bind it with stager.bind(frame[, stream]). The frame
    holds its slot from frame() until its run ended (its Completion closed, or its synchronous
    finish returned); its memory stays the stager's, readable through the frame until the slot is
    framed or bound again."""

    __slots__ = ("stager", "layout", "slot", "_handle", "_memory", "__weakref__")

    def __init__(self, stager: Any, layout: Layout, handle: int, slot: int, memory: SlotMemory) -> None:
        self.stager = stager
        self.layout = layout
        self.slot = slot
        self._handle = handle  # the C frame until it is bound
        self._memory = memory

    @property
    def shapes(self) -> Tuple[TensorShape, ...]:
        return self.layout.shapes

    @property
    def bound(self) -> bool:
        return self._handle is None

    @property
    def arrays(self) -> List[Any]:
        """The NumPy arrays of the frame's tensors, in order (None for a device-resident one)."""
        arrays = self._memory._arrays  # pylint: disable=protected-access  (None once retired)
        if arrays is None:
            memory = self._memory
            memory._check()  # pylint: disable=protected-access
            arrays = memory.arrays()
        return arrays

    def __len__(self) -> int:
        return self.layout.count

    def _index(self, index: int, call: str) -> int:
        count = self.layout.count
        try:
            position = int(index)
        except (TypeError, ValueError):
            raise TypeError(f"devstage Frame.{call}: the index is a {type(index).__name__}, not an int") from None
        if position < 0:
            position += count
        if not 0 <= position < count:
            raise IndexError(f"devstage Frame.{call}: tensor {index} of a frame of {count} tensors")
        if self.layout.shapes[position].device is not None:
            raise ValueError(f"devstage Frame.{call}: frame tensor {position} is device-resident: it has no host "
                             "memory")
        return position

    def __getitem__(self, index: int) -> HostView:
        views = self._memory._views  # pylint: disable=protected-access  (None until made, and once retired)
        if views is not None and type(index) is int and 0 <= index < len(views):  # pylint: disable=unidiomatic-typecheck
            view = views[index]
            if view is not None:
                return view
        return self._memory.view(self._index(index, "__getitem__"))

    host = __getitem__

    def write(self, index: int, value: Any) -> None:
        """Copies `value` into tensor `index`: a NumPy array, a CPU torch tensor, a buffer, of the
        tensor's exact dtype and shape (TypeError for another dtype, ValueError for another shape:
        nothing is cast or broadcast, nothing written)."""
        memory = self._memory
        shapes = self.layout.shapes
        if type(index) is int and 0 <= index < len(shapes) and not memory.retired:  # pylint: disable=unidiomatic-typecheck
            shape = shapes[index]
            if shape.device is None and _calls.write(memory.hosts[index], shape.nbytes, value, shape._chars,  # pylint: disable=protected-access
                                                     shape._itemsize, shape.shape):  # pylint: disable=protected-access
                return
        self._write_checked(self._index(index, "write"), (value,), "write")

    def write_all(self, values: Sequence[Any], first: int = 0) -> None:
        """Frame.write of each of `values` into tensors first, first + 1, ...: all of them, or —
        when one is refused — none. One call for a step's inputs."""
        memory = self._memory
        layout = self.layout
        if type(first) is int and 0 <= first and not memory.retired:  # pylint: disable=unidiomatic-typecheck
            if _calls.write_all(memory.hosts, layout.nbytes, layout._chars, layout._itemsizes, layout.tensor_shapes,  # pylint: disable=protected-access
                                first, values):
                return
        values = list(values)
        if len(values) > layout.count - first:
            raise IndexError(f"devstage Frame.write_all: {len(values)} values from tensor {first} of a frame of "
                             f"{layout.count} tensors")
        self._write_checked(self._index(first, "write_all") if values else first, values, "write_all")

    def _write_checked(self, first: int, values: Sequence[Any], call: str) -> None:
        """Frame.write through the package's reading of each value (what it is, its dtype and
        shape): every value checked, then every one copied."""
        memories = []
        try:
            for position, value in enumerate(values, first):
                shape = self.layout.shapes[self._index(position, call)]
                memory = _ndarray_memory(value, shape)
                if memory is None:
                    memory = _host.memory_of(value, writable=False)
                memories.append(memory)
                if memory.device is not None:
                    raise ValueError(f"devstage Frame.{call}: the value for tensor {position} is device memory; write "
                                     "host memory (copy it to the host first)")
                if memory.dtype != shape.dtype:
                    raise TypeError(f"devstage Frame.{call}: tensor {position} is {shape.dtype} {shape.shape}, the "
                                    f"value is {memory.dtype} {memory.shape}: the write would cast (convert the value "
                                    "first)")
                if memory.shape != shape.shape:
                    raise ValueError(f"devstage Frame.{call}: tensor {position} has shape {shape.shape}, the value "
                                     f"{memory.shape}: nothing is broadcast")
            self._memory._check()  # pylint: disable=protected-access
            for position, memory in enumerate(memories, first):
                if memory.nbytes:
                    ctypes.memmove(self._memory.hosts[position], memory.address, memory.nbytes)
        finally:
            for memory in memories:
                memory.close()

    __setitem__ = write

    def _on_stream(self, handle: int) -> bool:  # pylint: disable=unused-argument
        return False

    def _slot_note(self) -> str:
        return "an unbound frame (bind it, or drop it)"

    def __repr__(self) -> str:
        state = "bound" if self._handle is None else "unbound"
        return f"<devstage Frame of {self.layout.count} tensors on slot {self.slot}, {state}>"

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle:  # dropped unbound: gives its slot back
            self._handle = None
            self.stager._frame_dropped(self, handle)  # pylint: disable=protected-access


def _ndarray_memory(value: Any, shape: TensorShape) -> Optional[_host.Memory]:
    """The Memory of a C-contiguous NumPy array of `shape`'s dtype and shape, read the short way;
    None for anything else (the package's general reading of a value then says what it is)."""
    interface = getattr(type(value), "__array_interface__", None)
    if interface is None or type(value).__name__ != "ndarray" or not value.flags.c_contiguous:
        return None
    if value.shape != shape.shape or value.dtype.name != shape.dtype or not value.dtype.isnative:
        return None
    return _host.Memory(value.ctypes.data, value.nbytes, value.shape, shape.dtype, keep=value)
