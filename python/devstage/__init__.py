# SPDX-License-Identifier: Apache-2.0
"""devstage from Python, over its C interface (libdevstage_c) through ctypes: stage a run's
tensors on an accelerator, hand the kernel the staged memory as tensors (DLPack), and generate
inputs straight into pinned memory that NumPy and PyTorch view without a copy.

    import devstage, torch
    gpu = devstage.cuda(0)                              # or devstage.sim(), devstage.ascend(0)
    stager = devstage.Stager(gpu, pack_limit=16384, pipeline_slots=2)
    stream = torch.cuda.current_stream()
    run = stager.bind([devstage.In(tokens), devstage.Out(logits)], stream=stream)
    ids = torch.from_dlpack(run.device_args[0])         # the staged memory, shape and dtype kept
    model(ids, out=torch.from_dlpack(run.device_args[1]))
    del ids
    done = stager.finish(run, stream=stream)
    done.wait()                                         # logits now holds the output

See docs/python.md.
"""
from typing import Any, Optional

from .args import IN, IN_OUT, OUT, Arg, Device, In, InOut, Out, TensorShape
from .backend import Backend, Event, Stream
from .devices import backends, stagers
from .errors import (BackendFailure, Busy, Error, HostFunctionError, InvalidArgument, Leaked, LibraryNotFound,
                     NotSupported, OutOfMemory, UnknownPointer)
from .completion import Completion
from .frames import Frame, HostView, Layout
from .pinned import Pinned, PinnedBuffer, PinnedPool
from .run import DeviceTensor, Run
from .stager import Stager

__version__ = "0.1.0"


def sim(device_capacity: int = 0, device: int = 0, host_of: Optional[Backend] = None) -> Backend:
    """The simulator (Backend.simulator): device `device`, of its own simulated host or of
    host_of's."""
    return Backend.simulator(device_capacity, device, host_of)


def cuda(device: int = 0, library_path: Optional[str] = None) -> Backend:
    """CUDA device `device` (Backend.cuda). NotSupported saying so where no GPU is usable (no
    driver, or no device); LibraryNotFound where the CUDA runtime is not installed."""
    return Backend.cuda(device, library_path)


def ascend(device: int = 0, library_path: Optional[str] = None) -> Backend:
    """Ascend device `device` (Backend.ascend)."""
    return Backend.ascend(device, library_path)


def callbacks(**callbacks_and_options: Any) -> Backend:
    """A backend over a runtime's callbacks (Backend.from_callbacks)."""
    return Backend.from_callbacks(**callbacks_and_options)


__all__ = [
    "Arg", "Backend", "BackendFailure", "Busy", "Completion", "Device", "DeviceTensor", "Error", "Event", "Frame",
    "HostFunctionError", "HostView", "IN", "IN_OUT", "In", "InOut", "InvalidArgument", "Layout", "Leaked",
    "LibraryNotFound", "NotSupported", "OUT", "Out", "OutOfMemory", "Pinned", "PinnedBuffer", "PinnedPool", "Run",
    "Stager", "Stream", "TensorShape", "UnknownPointer", "ascend", "backends", "callbacks", "cuda", "sim", "stagers",
]
