# SPDX-License-Identifier: Apache-2.0
"""Frames: a slot's pinned mirror laid out for a run's tensors, so the inputs are written in place
(no host copy) and the outputs arrive there."""
import threading
import weakref
from ctypes import byref, c_size_t, c_void_p

from . import _host, _lib
from ._lib import lib
from .args import Staged
from .errors import check


class HostView(_host.HostTensor):
    """Tensor i of a frame, in pinned memory: `numpy.asarray(view)` and `torch.from_dlpack(view)`
    are views of it (kDLCPU), of the TensorShape's shape and dtype. The frame's memory stays the
    engine's while a view lives (see Frame)."""

    __slots__ = ("_frame", "index", "data_ptr", "nbytes", "shape", "dtype", "__weakref__")

    def __init__(self, frame, index, data_ptr, nbytes, shape, dtype):
        self._frame = frame
        self.index, self.data_ptr, self.nbytes, self.shape, self.dtype = index, data_ptr, nbytes, shape, dtype

    def __repr__(self):
        return f"HostView(frame tensor {self.index}, shape={self.shape}, dtype={self.dtype})"


class Frame:
    """A free slot's pinned mirror laid out for a list of TensorShapes (Stager.frame). `frame[i]`
    is tensor i's HostView, where its input is written and its output arrives; bind the frame
    with stager.bind(frame[, stream]). The frame holds its slot until the run that bound it ended
    (its Completion closed, or its synchronous finish returned) and the last of its views is gone:
    until then no other frame or bind takes that slot."""

    _completion_destroy = lib.devstage_completion_destroy
    _frame_destroy = lib.devstage_frame_destroy

    def __init__(self, stager, handle, shapes, keep):
        self.stager = stager
        self.shapes = shapes
        self._handle = handle
        self._keep = keep          # the device tensors of device-resident shapes
        self._lock = threading.Lock()
        self._views = 0            # HostViews alive
        self._deferred = None      # a completion handle to destroy with the last view
        self._bound = False
        self._places = []
        for i in range(len(shapes)):
            data, nbytes = c_void_p(), c_size_t()
            check(lib.devstage_frame_host(handle, i, byref(data), byref(nbytes)))
            self._places.append((data.value or 0, nbytes.value))

    def __len__(self):
        return len(self.shapes)

    def __getitem__(self, index):
        return self.host(index)

    def host(self, index):
        """Tensor `index`'s HostView (IndexError past the end; ValueError for a device-resident
        tensor, which has no place in the frame)."""
        shape = self.shapes[index]
        if self._handle is None:
            raise ValueError("devstage: the frame was given back to its stager (its run ended)")
        if shape.device is not None:
            raise ValueError(f"devstage: frame tensor {index} is device-resident: it has no host memory")
        data, nbytes = self._places[index]
        view = HostView(self, index, data, nbytes, shape.shape, shape.dtype)
        with self._lock:
            self._views += 1
        weakref.finalize(view, self._view_gone)
        return view

    def _views_alive(self):
        with self._lock:
            return self._views > 0

    def _view_gone(self):
        with self._lock:
            self._views -= 1
            deferred = self._deferred if self._views == 0 else None
            if deferred is not None:
                self._deferred = None
        if deferred is not None:
            handle, staged = deferred
            self._give_back(handle, staged)

    def _release_with_views(self, completion, staged):
        """The run ended while views of the frame live: its completion (which holds the slot) is
        destroyed with the last view."""
        with self._lock:
            if self._views > 0:
                self._deferred = (completion, staged)
                return
        self._give_back(completion, staged)

    def _give_back(self, completion, staged):
        if self._completion_destroy(completion) != 0:
            self.stager._hold(PendingCompletion(completion, staged))  # pylint: disable=protected-access
        elif staged is not None:
            staged.close()
        self._retire()

    def _retire(self):
        handle, self._handle = self._handle, None
        if handle:
            self._frame_destroy(handle)

    def _live_handle(self):
        if self._handle is None or self._bound:
            raise ValueError("devstage: this frame was bound already (a frame is bound once; make a new one)")
        self._bound = True
        return self._handle

    def staged(self):
        """What a Run of this frame needs: its shapes, dtypes and directions, and the memory of its
        device-resident tensors."""
        staged = Staged(len(self.shapes))
        for i, shape in enumerate(self.shapes):
            staged.table[i] = _lib.TensorArg(None, shape.nbytes, shape.direction, 0)
            staged.shapes.append(shape.shape)
            staged.dtypes.append(shape.dtype)
            staged.directions.append(shape.direction)
        staged.memories, self._keep = self._keep, []
        return staged

    def __del__(self):
        self._retire()


class PendingCompletion:
    """A completion whose wait failed when it was dropped (or its frame's last view went): its
    handle and its run's memory, kept by the stager until release() or abandon(), then destroyed."""

    def __init__(self, handle, staged):
        self.handle, self.staged = handle, staged

    def close(self):
        handle, self.handle = self.handle, None
        if handle:
            Frame._completion_destroy(handle)  # pylint: disable=protected-access
        if self.staged is not None:
            self.staged.close()
