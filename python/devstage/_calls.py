# SPDX-License-Identifier: Apache-2.0
"""The C calls of a step — frame, bind, finish, wait, close — and host-function launches, made
once per step, so made as cheaply as the interpreter allows.

They come from the compiled module devstage._native (Cython: a C call and a few conversions, the
GIL released around the calls that may block) where it is built, else from ctypes here, with the
same signatures and results. Which one: `IMPLEMENTATION` ("native" or "ctypes").
$DEVSTAGE_PY_NATIVE names the compiled module's file (a build tree's), "0" forces ctypes; else
it is the one inside the package, if any.

Handles, addresses and streams are ints (0: NULL). Calls that produce something raise on
failure (the message in Python's terms, see _lib.message_of); the others return the status, for
the caller to decide what a failure means.
"""
import ctypes
import importlib.machinery
import importlib.util
import os
import threading
from ctypes import POINTER, byref, c_int, c_size_t, c_void_p
from typing import Callable, Dict, Tuple

from . import _lib
from ._lib import lib

# Host functions launched and not yet run: key -> the function to call. Each launch hands the C
# side one trampoline made once and a key, so no callback object is built per launch.
host_functions: Dict[int, Callable[[], None]] = {}
_keys = iter(range(1, 1 << 62))
_keys_lock = threading.Lock()


def next_key() -> int:
    with _keys_lock:
        return next(_keys)


def _run_host_function(key: int, functions=host_functions) -> None:
    """What the trampoline calls on the stream's thread: the function launched under `key`. It
    reports its own failures (see Backend.launch_host_function); nothing escapes here."""
    function = functions.pop(key, None)
    if function is not None:
        function()


def _function(name: str, restype, argtypes):
    """A fresh ctypes function of the library (the _lib prototypes take structures; these take
    addresses)."""
    function = lib[name]
    function.restype, function.argtypes = restype, argtypes
    return function


_S, _P, _N = c_int, c_void_p, c_size_t
_PP = POINTER(c_void_p)
_c = {name: _function(name, _S, argtypes) for name, argtypes in {
    "devstage_frame_create": [_P, _P, _N, _PP],
    "devstage_frame_slot": [_P, POINTER(c_size_t)],
    "devstage_frame_hosts": [_P, _PP, _P, _N],
    "devstage_frame_destroy": [_P],
    "devstage_bind": [_P, _P, _N, _PP],
    "devstage_bind_on": [_P, _P, _N, _P, _PP],
    "devstage_bind_frame": [_P, _P, _PP],
    "devstage_bind_frame_on": [_P, _P, _P, _PP],
    "devstage_run_slot": [_P, POINTER(c_size_t)],
    "devstage_run_device_args": [_P, _PP, _N],
    "devstage_run_destroy": [_P],
    "devstage_finish": [_P, _P, c_int],
    "devstage_finish_on": [_P, _P, _P, c_int, _PP],
    "devstage_completion_wait": [_P],
    "devstage_completion_ready": [_P, POINTER(c_int)],
    "devstage_completion_destroy": [_P],
    "devstage_launch_host_function": [_P, _P, _lib.HOST_FUNCTION, _P],
}.items()}


# ---- the ctypes implementation ----------------------------------------------------------------

def _made(status: int, out, call: str) -> int:
    if status != 0:
        raise _lib.error_of(status, call)
    return out.value or 0


def _frame_create(stager: int, shapes: int, count: int, call: str) -> int:
    out = c_void_p()
    return _made(_c["devstage_frame_create"](stager, shapes, count, byref(out)), out, call)


def _frame_open(stager: int, shapes: int, count: int, call: str) -> Tuple[int, int, Tuple[int, ...]]:
    handle = _frame_create(stager, shapes, count, call)
    try:
        return handle, _frame_slot(handle), _frame_hosts(handle, count)
    except BaseException:
        _c["devstage_frame_destroy"](handle)
        raise


def _frame_slot(frame: int) -> int:
    out = c_size_t()
    return _made(_c["devstage_frame_slot"](frame, byref(out)), out, None)


def _frame_hosts(frame: int, count: int) -> Tuple[int, ...]:
    data = (c_void_p * count)()
    _lib.check(_c["devstage_frame_hosts"](frame, data, None, count))
    return tuple(p or 0 for p in data)


def _bind(stager: int, args: int, count: int, stream: int, call: str) -> int:
    out = c_void_p()
    if stream:
        return _made(_c["devstage_bind_on"](stager, args, count, stream, byref(out)), out, call)
    return _made(_c["devstage_bind"](stager, args, count, byref(out)), out, call)


def _bind_frame(stager: int, frame: int, stream: int, call: str) -> int:
    """Binds the frame and, once bound, destroys its handle (a view the run no longer needs)."""
    out = c_void_p()
    if stream:
        run = _made(_c["devstage_bind_frame_on"](stager, frame, stream, byref(out)), out, call)
    else:
        run = _made(_c["devstage_bind_frame"](stager, frame, byref(out)), out, call)
    _c["devstage_frame_destroy"](frame)
    return run


def _run_slot(run: int) -> int:
    out = c_size_t()
    return _made(_c["devstage_run_slot"](run, byref(out)), out, None)


def _run_device_args(run: int, count: int) -> Tuple[int, ...]:
    pointers = (c_void_p * max(count, 1))()
    _lib.check(_c["devstage_run_device_args"](run, pointers, count))
    return tuple(p or 0 for p in pointers[:count])


def _finish_on(stager: int, run: int, stream: int, execution: int) -> Tuple[int, int]:
    out = c_void_p()
    status = _c["devstage_finish_on"](stager, run, stream, execution, byref(out))
    return status, out.value or 0


def _completion_ready(completion: int) -> bool:
    out = c_int()
    _lib.check(_c["devstage_completion_ready"](completion, byref(out)))
    return bool(out.value)


_TRAMPOLINE = _lib.HOST_FUNCTION(lambda user, run=_run_host_function: run(user or 0))
# Streams keep the trampoline's address past this module's teardown at interpreter exit.
ctypes.pythonapi.Py_IncRef.argtypes = [ctypes.py_object]
ctypes.pythonapi.Py_IncRef(_TRAMPOLINE)


def _launch_host_function(backend: int, stream: int, key: int) -> int:
    return _c["devstage_launch_host_function"](backend, stream, _TRAMPOLINE, key)


def _write(address: int, nbytes: int, value, chars: bytes, itemsize: int, shape) -> bool:  # pylint: disable=unused-argument
    """The compiled module's checked copy into a frame; here always False: Frame.write copies
    through the package's own reading of the value."""
    return False


def _write_all(hosts, nbytes, chars, itemsizes, shapes, first, values) -> bool:  # pylint: disable=unused-argument
    """The compiled module's checked copies of a frame's values; here always False (see _write)."""
    return False


_CTYPES = {
    "frame_create": _frame_create, "frame_open": _frame_open, "frame_slot": _frame_slot, "frame_hosts": _frame_hosts,
    "frame_destroy": _c["devstage_frame_destroy"], "bind": _bind, "bind_frame": _bind_frame, "run_slot": _run_slot,
    "run_device_args": _run_device_args, "run_destroy": _c["devstage_run_destroy"], "finish": _c["devstage_finish"],
    "finish_on": _finish_on, "completion_wait": _c["devstage_completion_wait"], "completion_ready": _completion_ready,
    "completion_destroy": _c["devstage_completion_destroy"], "launch_host_function": _launch_host_function,
    "write": _write, "write_all": _write_all,
}


# ---- the compiled implementation, where there is one -----------------------------------------

def _load_native():
    """devstage._native, from $DEVSTAGE_PY_NATIVE or inside the package; None without it."""
    where = os.environ.get("DEVSTAGE_PY_NATIVE")
    if where == "0":
        return None
    if where:
        loader = importlib.machinery.ExtensionFileLoader(__package__ + "._native", where)
        spec = importlib.util.spec_from_file_location(__package__ + "._native", where, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    try:
        from . import _native  # pylint: disable=import-outside-toplevel,no-name-in-module
    except ImportError:
        return None
    return _native


# The calls, as select() sets them.
frame_create: Callable[..., int]
frame_open: Callable[..., Tuple[int, int, Tuple[int, ...]]]
frame_slot: Callable[[int], int]
frame_hosts: Callable[[int, int], Tuple[int, ...]]
frame_destroy: Callable[[int], int]
bind: Callable[..., int]
bind_frame: Callable[..., int]
run_slot: Callable[[int], int]
run_device_args: Callable[[int, int], Tuple[int, ...]]
run_destroy: Callable[[int], int]
finish: Callable[[int, int, int], int]
finish_on: Callable[[int, int, int, int], Tuple[int, int]]
completion_wait: Callable[[int], int]
completion_ready: Callable[[int], bool]
completion_destroy: Callable[[int], int]
launch_host_function: Callable[[int, int, int], int]
write: Callable[..., bool]
write_all: Callable[..., bool]


def select(implementation: str) -> None:
    """Makes the calls through `implementation`, "native" or "ctypes" (the tests run both)."""
    global IMPLEMENTATION  # pylint: disable=global-statement
    if implementation == "native":
        if native is None:
            raise ImportError("devstage._native is not built (or DEVSTAGE_PY_NATIVE is 0)")
        missing = [name for name in _CTYPES if not hasattr(native, name)]
        if missing:
            raise ImportError(f"devstage._native ({native.__file__}) has no {', '.join(missing)}: it is older than "
                              "this package; build both from one devstage (or set DEVSTAGE_PY_NATIVE=0)")
        globals().update({name: getattr(native, name) for name in _CTYPES})
    elif implementation == "ctypes":
        globals().update(_CTYPES)
    else:
        raise ValueError(f"devstage: implementation {implementation!r} is not native or ctypes")
    IMPLEMENTATION = implementation


native = _load_native()
if native is not None:
    native.init({name: ctypes.cast(function, c_void_p).value for name, function in _c.items()},
                _lib.error_of, _run_host_function)
IMPLEMENTATION = ""
select("ctypes" if native is None else "native")
