# SPDX-License-Identifier: Apache-2.0
"""Stagers: a run's host tensors staged on the device for its kernel, and copied back after."""
import ctypes
from ctypes import byref, c_int, c_size_t, c_void_p

from . import _lib
from ._lib import lib
from .errors import check
from .pinned import PinnedBuffer

IN, OUT, IN_OUT = 0, 1, 2
_HOST, _DEVICE = 0, 1

_STRATEGIES = {"retained": 0, "per_tensor": 1}
_GROWTHS = {"exact": 0, "geometric": 1, "granular": 2}
_ORDERS = {"allocate_first": 0, "free_first": 1}
_OUTPUTS = {"zero": 0, "kernel_writes_all": 1}


class Arg:
    """One argument of a run: a host tensor (a PinnedBuffer, a C-contiguous NumPy array or CPU
    torch tensor, a writable buffer such as a bytearray) and its direction; or, with
    `device=True`, a device address and its size (passed through untouched)."""

    def __init__(self, tensor, direction, nbytes=None, device=False):
        self.tensor = tensor
        self.direction = direction
        self.nbytes = nbytes
        self.device = device


def In(tensor):  # pylint: disable=invalid-name
    """Uploaded before the run, never copied back."""
    return Arg(tensor, IN)


def Out(tensor):  # pylint: disable=invalid-name
    """Not uploaded; copied back after a successful run."""
    return Arg(tensor, OUT)


def InOut(tensor):  # pylint: disable=invalid-name
    """Uploaded, and copied back after a successful run."""
    return Arg(tensor, IN_OUT)


def Device(address, nbytes, direction=IN):  # pylint: disable=invalid-name
    """Device memory the caller owns (weights, a KV cache): passed to the kernel unchanged."""
    return Arg(address, direction, nbytes=nbytes, device=True)


def _host_memory(tensor):
    """(address, nbytes) of a host tensor's contiguous memory."""
    if isinstance(tensor, PinnedBuffer):
        return tensor.data_ptr, tensor.nbytes
    if hasattr(tensor, "data_ptr") and hasattr(tensor, "element_size"):  # a torch tensor
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"devstage: a torch tensor must be contiguous and on the CPU (got {tensor.device}, "
                             f"contiguous={tensor.is_contiguous()})")
        return tensor.data_ptr(), tensor.numel() * tensor.element_size()
    interface = getattr(tensor, "__array_interface__", None)
    if interface is not None:  # a NumPy array
        if not tensor.flags["C_CONTIGUOUS"]:
            raise ValueError("devstage: a NumPy array must be C-contiguous")
        return interface["data"][0], tensor.nbytes
    view = memoryview(tensor)
    if view.readonly or not view.contiguous:
        raise ValueError("devstage: a buffer must be writable and contiguous")
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) if view.nbytes else 0, view.nbytes


def _to_args(args):
    table = (_lib.TensorArg * max(len(args), 1))()
    for i, arg in enumerate(args):
        if not isinstance(arg, Arg):
            raise TypeError(f"devstage: arg {i} is {type(arg).__name__}; wrap it as In(), Out(), InOut() or Device()")
        if arg.device:
            table[i] = _lib.TensorArg(arg.tensor, arg.nbytes, arg.direction, _DEVICE)
        else:
            address, nbytes = _host_memory(arg.tensor)
            table[i] = _lib.TensorArg(address, nbytes, arg.direction, _HOST)
    return table


class Stager:
    """Stages runs on one backend for one runner (use it from one thread).
    `stager = Stager(backend, pack_limit=16384); run = stager.bind([In(x), Out(y)])`

    strategy: "retained" (one device buffer per slot, kept across runs) or "per_tensor";
    pack_limit: 0, or 4096, 16384 or 65536 (args of at most that many bytes move in one copy
    each way; needs pinned memory); pipeline_slots: runs in flight; growth: "exact",
    "geometric" (growth_factor=(numerator, denominator)) or "granular" (growth_granule, a power
    of two), growth_cap (0: none) and grow_order ("allocate_first" or "free_first");
    output_policy: "zero" (Out args read as zeros where the kernel writes nothing) or
    "kernel_writes_all" (left as the device memory was: no zeroing call per run)."""

    def __init__(self, backend, strategy="retained", pack_limit=0, pipeline_slots=1, growth="exact",
                 growth_factor=(2, 1), growth_granule=0, growth_cap=0, grow_order="allocate_first",
                 output_policy="zero"):
        config = _lib.StagerConfig()
        config.strategy = _choice("strategy", strategy, _STRATEGIES)
        config.pack_limit = pack_limit
        config.pipeline_slots = pipeline_slots
        config.growth = _choice("growth", growth, _GROWTHS)
        if growth == "geometric":
            config.growth_numerator, config.growth_denominator = growth_factor
        config.growth_granule = growth_granule
        config.growth_cap = growth_cap
        config.grow_order = _choice("grow_order", grow_order, _ORDERS)
        config.output_policy = _choice("output_policy", output_policy, _OUTPUTS)
        self.backend = backend  # outlives the stager
        self._held = []
        self._handle = c_void_p()
        check(lib.devstage_stager_create(backend._handle, byref(config), byref(self._handle)))  # pylint: disable=protected-access

    def bind(self, args, stream=None):
        """Plans, grows if needed and uploads the In and InOut args: synchronously, or enqueued
        on `stream`. The Run holds the args (and so their memory) until it ends."""
        table = _to_args(args)
        run = c_void_p()
        if stream is None:
            check(lib.devstage_bind(self._handle, table, len(args), byref(run)))
        else:
            check(lib.devstage_bind_on(self._handle, table, len(args), stream.handle, byref(run)))
        return Run(self, run, list(args))

    def finish(self, run, stream=None, ok=True):
        """Ends a run: copies back Out and InOut args if `ok` (the kernel succeeded) and gives
        back its memory. Synchronously (the kernel must have completed), or enqueued on `stream`
        after the kernel there: then it returns a Completion to wait on."""
        handle = run._take(self)  # pylint: disable=protected-access
        args, run.args = run.args, None  # the run's memory is the completion's to hold now
        execution = 0 if ok else 4  # DEVSTAGE_BACKEND_FAILURE: nothing is copied back
        if stream is None:
            self._checked(lib.devstage_finish(self._handle, handle, execution), args)
            return None
        done = c_void_p()
        self._checked(lib.devstage_finish_on(self._handle, handle, stream.handle, execution, byref(done)), args)
        return Completion(done, args)

    def release(self):
        """Gives back all device memory now (waiting for pending work); the host memory of
        failed and dropped runs is let go then."""
        check(lib.devstage_stager_release(self._handle))
        self._held = []

    def _checked(self, status, args):
        # A run that failed (or was dropped) may still have copies pending on its host memory:
        # its args stay alive until the stager released or destroyed it.
        if status != 0:
            self._held.append(args)
        check(status)

    def reserve(self, nbytes):
        """Grows every slot to at least `nbytes` now (retained strategy)."""
        check(lib.devstage_stager_reserve(self._handle, nbytes))

    @property
    def stats(self):
        """The stager's counters as a dict (StagerStats)."""
        stats = _lib.StagerStats()
        check(lib.devstage_stager_stats_get(self._handle, byref(stats)))
        return {name: getattr(stats, name) for name in _lib.STAGER_STATS_FIELDS}

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            lib.devstage_stager_destroy(handle)


class Run:
    """A bound run: `device_args` are the addresses to launch the kernel on, in the args'
    order (device args unchanged, zero-byte args 0). Dropped without finish, it copies
    nothing back."""

    def __init__(self, stager, handle, args):
        self._stager = stager
        self._handle = handle
        self.args = args
        pointers = (c_void_p * max(len(args), 1))()
        check(lib.devstage_run_device_args(handle, pointers, len(args)))
        self.device_args = [p or 0 for p in pointers[:len(args)]]
        slot = c_size_t()
        check(lib.devstage_run_slot(handle, byref(slot)))
        self.slot = slot.value

    def _take(self, stager):
        if self._handle is None:
            raise ValueError("devstage: this run was finished already")
        if stager is not self._stager:
            raise ValueError("devstage: the run belongs to another stager")
        handle, self._handle = self._handle, None
        return handle

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            lib.devstage_run_destroy(handle)
            self._stager._held.append(self.args)  # pylint: disable=protected-access


class Completion:
    """The end of a run finished on a stream: wait() blocks until its outputs are in host
    memory, ready() asks without blocking. It holds the run's args until it is closed (close()
    waits if nothing did)."""

    def __init__(self, handle, args):
        self._handle = handle
        self._args = args

    def wait(self):
        check(lib.devstage_completion_wait(self._handle))

    def ready(self):
        answer = c_int()
        check(lib.devstage_completion_ready(self._handle, byref(answer)))
        return bool(answer.value)

    def close(self):
        handle, self._handle = self._handle, None
        if handle:
            check(lib.devstage_completion_destroy(handle))
        self._args = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            lib.devstage_completion_destroy(handle)


def _choice(field, value, choices):
    if value not in choices:
        raise ValueError(f"devstage: {field} {value!r} is not one of {', '.join(choices)}")
    return choices[value]
