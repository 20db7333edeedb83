# SPDX-License-Identifier: Apache-2.0
"""A bound run: its staged device args as tensors (DLPack), made per run (`run.device_args`) or
once per slot (`run.tensors()`, `run.arrays()`), and what keeps the memory under them valid."""
import threading
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

from . import _calls, _dlpack, _dtypes, _host
from .args import DIRECTION_NAMES
from .errors import Busy


class DeviceTensor:
    """One device arg of a bound run: `data_ptr` (an int; also what int() and ctypes give),
    `nbytes`, `shape`, `dtype`, `direction`, `device` ((DLPack device type, id)).
    `torch.from_dlpack(t)` is a zero-copy tensor of the staged memory, of its shape and dtype (on a
    host-memory device, the simulator's, `t.numpy()` and `numpy.asarray(t)` are writable NumPy
    views too). Each such tensor keeps the run's device memory valid while it lives: the run's
    copy-backs wait for it (see Stager.finish). A finished run's args cannot be exported."""

    __slots__ = ("_run_ref", "_backend", "index", "data_ptr", "nbytes", "shape", "dtype", "direction")

    def __init__(self, run: "Run", index: int, data_ptr: int, nbytes: int, shape: Tuple[int, ...], dtype: str,
                 direction: int) -> None:
        self._run_ref = weakref.ref(run)  # the run holds its tensors, an export holds the run
        self._backend = run.stager.backend
        self.index, self.data_ptr, self.nbytes = index, data_ptr, nbytes
        self.shape, self.dtype, self.direction = shape, dtype, direction

    @property
    def _run(self) -> "Run":
        run = self._run_ref()
        if run is None:
            raise BufferError(f"devstage: device arg {self.index} belongs to a run that was dropped")
        return run

    @property
    def device(self) -> Optional[Tuple[int, int]]:
        return self._backend.dlpack_device

    def __dlpack_device__(self) -> Tuple[int, int]:
        device = self.device
        if device is None:
            raise BufferError(f"devstage: {self._backend.describe()} has no DLPack device (give dlpack_device= to "
                              "from_callbacks)")
        return device

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:  # pylint: disable=unused-argument
        """A "dltensor" capsule of the staged memory on the backend's device. `stream` (a CUDA or
        ACL stream handle of the consumer; None or -1: none) is ordered after the run's uploads
        with a stream wait, as the DLPack protocol asks of a producer."""
        device = self.__dlpack_device__()
        if copy:
            raise BufferError("devstage: a staged device arg is exported without a copy (copy=True refused)")
        run = self._run
        run._exportable(self.index)  # pylint: disable=protected-access
        if stream is not None and stream != -1 and device[0] != _dlpack.CPU and run.stream is not None:
            if run.stream.native != stream:
                run.stager.order_after_uploads(run, stream)
        code, bits, _ = _dtypes.DTYPES[self.dtype]
        if self.nbytes == 0:  # no memory to keep valid
            return _dlpack.capsule((self, run), None, self.shape, code, bits, device)
        run._exported(1)  # pylint: disable=protected-access
        try:
            return _dlpack.capsule((self, run), self.data_ptr, self.shape, code, bits, device,
                                   on_release=run._released_export)  # pylint: disable=protected-access
        except BaseException:
            run._exported(-1)  # pylint: disable=protected-access
            raise

    def numpy(self) -> Any:
        """A writable NumPy view of the staged memory (host-memory devices only: the simulator's,
        a callbacks backend whose dlpack_device is kDLCPU); it keeps the run's memory valid while
        it lives, as a DLPack export does."""
        import numpy  # pylint: disable=import-outside-toplevel
        _host_device(self._backend)
        self._run._exportable(self.index)  # pylint: disable=protected-access
        return numpy.asarray(_HostExport(self))

    def __array__(self, dtype: Any = None) -> Any:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __index__(self) -> int:
        return self.data_ptr

    __int__ = __index__

    @property
    def _as_parameter_(self) -> Any:
        from ctypes import c_void_p  # pylint: disable=import-outside-toplevel
        return c_void_p(self.data_ptr or None)

    def __repr__(self) -> str:
        return (f"DeviceTensor({DIRECTION_NAMES[self.direction]}, shape={self.shape}, dtype={self.dtype}, "
                f"data_ptr={self.data_ptr:#x})")


def _host_device(backend: Any) -> None:
    device = backend.dlpack_device
    if device is None or device[0] != _dlpack.CPU:
        raise BufferError(f"devstage: the staged memory is on {device} device memory, not host memory: use "
                          "torch.from_dlpack")


class _HostExport:
    """What a NumPy view of host-visible staged memory is made from: counted as an export of its
    run while the view (its base) lives."""

    __slots__ = ("__array_interface__", "_run", "__weakref__")

    def __init__(self, tensor: DeviceTensor) -> None:
        run = self._run = tensor._run  # pylint: disable=protected-access
        self.__array_interface__ = _host.array_interface(tensor.data_ptr, tensor.shape, tensor.dtype)
        if tensor.nbytes:  # no memory to keep valid otherwise
            run._exported(1)  # pylint: disable=protected-access
            weakref.finalize(self, run._released_export)  # pylint: disable=protected-access


class Run:
    """A bound run: `device_args`, the DeviceTensors to launch the kernel on (in the args' order;
    device args unchanged, zero-byte args at address 0; also run[i]), `device_pointers` their
    addresses, `tensors()` / `arrays()` the slot's torch tensors / NumPy views of them (exported
    once per slot), `slot` its pipeline slot, `stream` the bind's stream (None: synchronous),
    `frame` the Frame it binds (None: args). Dropped without finish, it copies nothing back."""

    __slots__ = ("stager", "stream", "frame", "slot", "_handle", "_memory", "_of", "_finishing", "_exports",
                 "_exports_lock", "_pointers", "_args", "_launched", "_streams", "__weakref__")

    def __init__(self, stager: Any, handle: int, slot: int, of: Any, memory: Any, stream: Any, frame: Any) -> None:
        self.stager = stager
        self.stream = stream
        self.frame = frame
        self.slot = slot
        self._handle: Optional[int] = handle
        self._memory = memory  # the args' Memory (None for a frame's run): kept until the run ended
        self._of = of          # what the args are (dtypes, tensor_shapes, directions, nbytes): a Staged or Layout
        self._finishing = False
        self._exports = 0      # live DLPack and NumPy exports of device_args
        self._exports_lock: Optional[threading.Lock] = None
        self._pointers: Optional[Tuple[int, ...]] = None
        self._args: Optional[List[DeviceTensor]] = None
        self._launched = stager.backend._launches  # pylint: disable=protected-access  (host functions before it)
        self._streams: Tuple[int, ...] = () if stream is None else (stream.handle,)

    # ---- what it is ------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        """True until the run is finished (or its finish was asked for) or dropped."""
        return self._handle is not None and not self._finishing

    @property
    def device_pointers(self) -> Tuple[int, ...]:
        pointers = self._pointers
        if pointers is None:
            if self._handle is None or self._finishing:
                raise BufferError("devstage Run.device_args: the run's finish was asked for before its device args "
                                  "were: a finished run's memory is the next run's")
            pointers = self._pointers = _calls.run_device_args(self._handle, len(self._of.dtypes))
        return pointers

    @property
    def device_args(self) -> List[DeviceTensor]:
        args = self._args
        if args is None:
            of = self._of
            args = self._args = [
                DeviceTensor(self, i, pointer, of.nbytes[i], of.tensor_shapes[i], of.dtypes[i], of.directions[i])
                for i, pointer in enumerate(self.device_pointers)]
        return args

    def __getitem__(self, index: int) -> DeviceTensor:
        return self.device_args[index]

    def __len__(self) -> int:
        return len(self._of.dtypes)

    def tensors(self) -> List[Any]:
        """torch tensors of the device args (torch.from_dlpack), exported once per slot and kept:
        the same objects come back for every run bound on this slot with these shapes while the
        slot's device memory does not move (re-exported when it does: stats address_changes). They
        view the slot's memory, which is the bound run's from bind to finish; no stream ordering
        comes with them (bind on the kernel's stream, or order_after_uploads)."""
        return self.stager._exports.get(self, "torch")  # pylint: disable=protected-access

    def arrays(self) -> List[Any]:
        """NumPy views of the device args, as tensors() (host-memory devices: the simulator's)."""
        _host_device(self.stager.backend)
        return self.stager._exports.get(self, "numpy")  # pylint: disable=protected-access

    def _key(self) -> Any:
        """What the slot's cached exports of this run are keyed by, with the slot: its layout, or
        its args' shapes and dtypes."""
        of = self._of
        return of if self.frame is not None else (tuple(of.tensor_shapes), tuple(of.dtypes))

    # ---- checks ----------------------------------------------------------------------------

    def _check(self, stager: Any, call: str) -> int:
        if self._handle is None or self._finishing:
            raise ValueError(f"devstage {call}: this run was finished already")
        if stager is not self.stager:
            raise ValueError(f"devstage {call}: the run belongs to another stager")
        return self._handle

    def _exportable(self, index: int) -> None:
        if self._handle is None or self._finishing:
            raise BufferError(f"devstage: device arg {index} of a finished run cannot be exported: its memory is the "
                              "next run's")

    def _exported(self, delta: int) -> None:
        lock = self._exports_lock
        if lock is None:
            lock = self._exports_lock = threading.Lock()
        with lock:
            self._exports += delta

    def _released_export(self) -> None:
        self._exported(-1)

    def _exports_alive(self) -> int:
        if self._exports:
            _dlpack.collect()  # capsules their consumer refused or dropped are given back
        return self._exports

    def _check_exports(self, what: str) -> None:
        alive = self._exports_alive()
        if alive:
            raise Busy("busy", f"devstage {what}: {alive} tensor(s) exported from the device args of the run on slot "
                               f"{self.slot} (torch.from_dlpack, DeviceTensor.numpy()) are still alive; drop them (or "
                               ".clone() what you keep) first: the run's device memory is reused once it ends. The "
                               "run stays live.")

    def _on_stream(self, handle: int) -> bool:
        """Whether the run is bound on the stream `handle` and has not ended."""
        return self._handle is not None and self.stream is not None and self.stream.handle == handle

    def _slot_note(self) -> str:
        if self._finishing:
            return "a run whose finish waits for its exported tensors (drop them)"
        return "a live run (bound, not finished: finish it)"

    # ---- its end ---------------------------------------------------------------------------

    def _end(self) -> Optional[int]:
        """The run's handle, taken: its finish was issued (or it was dropped)."""
        handle, self._handle = self._handle, None
        return handle

    def _take_memory(self) -> Any:
        memory, self._memory = self._memory, None
        return memory

    def _released(self) -> None:
        """The stager released or abandoned this live run: it ended without copy-backs."""
        if self._finishing:
            return
        handle = self._end()
        if handle:
            _calls.run_destroy(handle)
            self.stager._ended(self, self._take_memory(), held=True)  # pylint: disable=protected-access

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle and not self._finishing:
            self._handle = None
            _calls.run_destroy(handle)
            self.stager._ended(self, self._take_memory(), held=True)  # pylint: disable=protected-access


class _DeviceKeeper:
    """What the slot's cached exports keep alive: the C stager (`core`), whose memory they view.
    Alive while an export is: DLPack's deleter lets it go, a NumPy view holds it through its base."""

    __slots__ = ("core", "__weakref__")

    def __init__(self, core: Any) -> None:
        self.core = core


class _DeviceView:
    """A NumPy view of one cached device arg of a host-memory device."""

    __slots__ = ("__array_interface__", "keeper")

    def __init__(self, keeper: _DeviceKeeper, address: int, shape: Tuple[int, ...], dtype: str) -> None:
        self.keeper = keeper
        self.__array_interface__ = _host.array_interface(address, shape, dtype)


class DeviceExports:
    """The stager's cache of exported device args: per (slot, kind, key) the device pointers they
    were made for and the tensors. A run whose pointers differ (the slot's memory moved) gets new
    ones, and the old are dropped."""

    def __init__(self, core: Any) -> None:
        self._core = core  # the C stager, which every export keeps
        self._entries: Dict[Any, Tuple[Tuple[int, ...], List[Any], _DeviceKeeper]] = {}

    def get(self, run: Run, kind: str) -> List[Any]:
        run._exportable(0)  # pylint: disable=protected-access
        pointers = run.device_pointers
        key = (run.slot, kind, run._key())  # pylint: disable=protected-access
        entry = self._entries.get(key)
        if entry is not None:
            if entry[0] == pointers:
                return entry[1]
            del self._entries[key]
            self._moved(run.slot, weakref.ref(entry[2]))
        keeper = _DeviceKeeper(self._core)
        tensors = self._make(run, pointers, kind, keeper)
        self._entries[key] = (pointers, tensors, keeper)
        return tensors

    def _make(self, run: Run, pointers: Tuple[int, ...], kind: str, keeper: _DeviceKeeper) -> List[Any]:
        of = run._of  # pylint: disable=protected-access
        if kind == "numpy":
            import numpy  # pylint: disable=import-outside-toplevel
            return [numpy.asarray(_DeviceView(keeper, pointer, shape, dtype))
                    for pointer, shape, dtype in zip(pointers, of.tensor_shapes, of.dtypes)]
        import torch  # pylint: disable=import-outside-toplevel
        device = run.stager.backend.dlpack_device
        if device is None:
            raise BufferError(f"devstage: {run.stager.backend.describe()} has no DLPack device (give dlpack_device= "
                              "to from_callbacks)")
        tensors = []
        for pointer, shape, dtype in zip(pointers, of.tensor_shapes, of.dtypes):
            code, bits, _ = _dtypes.DTYPES[dtype]
            tensors.append(torch.from_dlpack(_dlpack.capsule(keeper, pointer or None, shape, code, bits, device)))
        return tensors

    @staticmethod
    def _moved(slot: int, keeper: "weakref.ref[_DeviceKeeper]") -> None:
        if keeper() is not None:
            warnings.warn(f"devstage: the device memory of slot {slot} moved (a larger run grew it) while tensors "
                          "exported from it (Run.tensors(), Run.arrays()) are still held: they view memory that was "
                          "given back; take the run's new ones", ResourceWarning, stacklevel=4)

    def retire(self) -> "List[Tuple[int, weakref.ref[_DeviceKeeper]]]":
        """Drops every cached export; (slot, weak reference) for each keeper something may still hold."""
        entries, self._entries = self._entries, {}
        return [(key[0], weakref.ref(keeper)) for key, (_, _, keeper) in entries.items()]
