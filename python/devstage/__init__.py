# SPDX-License-Identifier: Apache-2.0
"""devstage from Python, over its C interface (libdevstage_c) through ctypes: stage a run's
tensors on an accelerator, and generate inputs straight into pinned memory that NumPy and
PyTorch view without a copy.

    import devstage, torch
    backend = devstage.Backend.simulator()
    pool = devstage.PinnedPool(backend)
    hidden = pool.allocate((16, 5120), "bfloat16")
    torch.from_dlpack(hidden).normal_()                # written in place, in pinned memory
    stager = devstage.Stager(backend, pack_limit=16384)
    run = stager.bind([devstage.In(hidden)])            # run.device_args: the kernel's pointers
    stager.finish(run)

See docs/python.md.
"""
from .backend import Backend, Stream
from .errors import (BackendFailure, Busy, Error, InvalidArgument, Leaked, LibraryNotFound, NotSupported,
                     OutOfMemory, UnknownPointer)
from .pinned import PinnedBuffer, PinnedPool
from .staging import Arg, Completion, Device, In, InOut, Out, Run, Stager

__all__ = [
    "Arg", "Backend", "BackendFailure", "Busy", "Completion", "Device", "Error", "In", "InOut", "InvalidArgument",
    "Leaked", "LibraryNotFound", "NotSupported", "Out", "OutOfMemory", "PinnedBuffer", "PinnedPool", "Run", "Stager",
    "Stream", "UnknownPointer",
]
