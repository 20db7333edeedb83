# SPDX-License-Identifier: Apache-2.0
"""The C interface of libdevstage_c (include/devstage/c/devstage.h) through ctypes.

Where the library is loaded from, first found first: $DEVSTAGE_C_LIBRARY; the library inside this
package (a wheel, pip install); the library directory of a Meson install (./dev install, meson
install), recorded in _install.py at install time; then the names the dynamic loader finds
(libdevstage_c.so.0, libdevstage_c.so). The structures below mirror the header's, field for
field; C enums are ints.
"""
import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_size_t, c_uint32, c_uint64, c_void_p)
from typing import Optional

from . import errors

handle_p = c_void_p

# Callback types of devstage_callbacks.
MALLOC = CFUNCTYPE(c_void_p, c_void_p, c_size_t)
FREE = CFUNCTYPE(None, c_void_p, c_void_p)
COPY = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_size_t)
COPY_ASYNC = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_size_t, c_void_p)
CREATE = CFUNCTYPE(c_int, c_void_p, POINTER(c_void_p))
DESTROY = CFUNCTYPE(c_int, c_void_p, c_void_p)
RECORD = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p)
READY = CFUNCTYPE(c_int, c_void_p, c_void_p, POINTER(c_int))
MEMSET = CFUNCTYPE(c_int, c_void_p, c_void_p, c_int, c_size_t)
MEMSET_ASYNC = CFUNCTYPE(c_int, c_void_p, c_void_p, c_int, c_size_t, c_void_p)
HOST_FUNCTION = CFUNCTYPE(None, c_void_p)
LAUNCH = CFUNCTYPE(c_int, c_void_p, c_void_p, HOST_FUNCTION, c_void_p)
REGISTER = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)
UNREGISTER = CFUNCTYPE(c_int, c_void_p, c_void_p)
SYNCHRONIZE = CFUNCTYPE(c_int, c_void_p)
ERROR_SINK = CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class Callbacks(Structure):
    _fields_ = [
        ("name", c_char_p), ("context", c_void_p),
        ("device_malloc", MALLOC), ("device_free", FREE),
        ("copy_to_device", COPY), ("copy_from_device", COPY),
        ("pinned_malloc", MALLOC), ("pinned_free", FREE),
        ("create_stream", CREATE), ("destroy_stream", DESTROY),
        ("copy_to_device_async", COPY_ASYNC), ("copy_from_device_async", COPY_ASYNC),
        ("create_event", CREATE), ("destroy_event", DESTROY),
        ("record_event", RECORD), ("event_ready", READY),
        ("synchronize_event", DESTROY), ("stream_wait_event", RECORD),
        ("device_memset", MEMSET), ("device_memset_async", MEMSET_ASYNC),
        ("synchronize", SYNCHRONIZE),
        ("launch_host_function", LAUNCH),
        ("host_register", REGISTER), ("host_unregister", UNREGISTER),
    ]


class BackendInfo(Structure):
    _fields_ = [("name", c_char_p), ("pinned", c_int), ("streams", c_int)]


class StagerConfig(Structure):
    _fields_ = [
        ("strategy", c_int), ("pack_limit", c_size_t), ("pipeline_slots", c_size_t),
        ("growth", c_int), ("growth_numerator", c_uint32), ("growth_denominator", c_uint32),
        ("growth_granule", c_size_t), ("growth_cap", c_size_t), ("grow_order", c_int),
        ("output_policy", c_int), ("map_small", c_int),
    ]


class TensorArg(Structure):
    _fields_ = [("data", c_void_p), ("bytes", c_size_t), ("direction", c_int), ("placement", c_int)]


class TensorShape(Structure):
    _fields_ = [("bytes", c_size_t), ("direction", c_int), ("device", c_void_p)]


STAGER_STATS_FIELDS = (
    "runs", "regrows", "grow_failures", "grows_allocate_first", "grows_free_first",
    "grows_exact_fallback", "alignment_retries", "mirror_alignment_retries", "address_changes",
    "device_mallocs", "device_frees", "free_failures", "deferred_frees", "retained_bytes",
    "mirror_bytes", "high_water_bytes", "bytes_to_device", "bytes_from_device", "uploads",
    "copy_backs", "async_uploads", "async_copy_backs", "packed_args", "mirror_copy_bytes",
    "host_waits", "hazard_stream_waits", "hazard_settles", "uploads_skipped", "copy_backs_skipped",
    "zeroing_calls", "zeroed_bytes", "zero_uploads", "batched_uploads", "batched_copy_backs", "batched_copies",
    "ring_uploads", "ring_copy_backs", "ring_chunks", "ring_waits", "ring_bytes", "mapped_runs", "host_maps",
    "map_failures", "mapped_bytes", "host_zeroed_bytes",
)
PINNED_STATS_FIELDS = (
    "live_allocations", "live_bytes", "peak_live_bytes", "cached_blocks", "cached_bytes",
    "cache_hits", "cache_misses", "backend_allocations", "backend_frees", "pending_blocks",
    "pending_bytes",
)


class StagerStats(Structure):
    _fields_ = [(name, c_uint64) for name in STAGER_STATS_FIELDS]


class PinnedStats(Structure):
    _fields_ = [(name, c_uint64) for name in PINNED_STATS_FIELDS]


# name: (restype, argtypes); every function but the two queries returns a devstage_status.
_S = c_int
_PROTOTYPES = {
    "devstage_last_message": (c_char_p, []),
    "devstage_status_name": (c_char_p, [c_int]),
    "devstage_backend_create_sim": (_S, [c_size_t, POINTER(handle_p)]),
    "devstage_backend_create_sim_device": (_S, [c_int, c_size_t, handle_p, POINTER(handle_p)]),
    "devstage_backend_create_cuda": (_S, [c_int, c_char_p, POINTER(handle_p)]),
    "devstage_backend_create_ascend": (_S, [c_int, c_char_p, POINTER(handle_p)]),
    "devstage_backend_create_callbacks": (_S, [POINTER(Callbacks), POINTER(handle_p)]),
    "devstage_backend_destroy": (_S, [handle_p]),
    "devstage_backend_get_info": (_S, [handle_p, POINTER(BackendInfo)]),
    "devstage_backend_device": (_S, [handle_p, POINTER(c_int), POINTER(c_int)]),
    "devstage_backend_synchronize": (_S, [handle_p]),
    "devstage_device_malloc": (_S, [handle_p, c_size_t, POINTER(c_void_p)]),
    "devstage_device_free": (_S, [handle_p, c_void_p]),
    "devstage_copy_to_device": (_S, [handle_p, c_void_p, c_void_p, c_size_t]),
    "devstage_copy_from_device": (_S, [handle_p, c_void_p, c_void_p, c_size_t]),
    "devstage_host_register": (_S, [handle_p, c_void_p, c_size_t]),
    "devstage_host_unregister": (_S, [handle_p, c_void_p]),
    "devstage_stream_create": (_S, [handle_p, POINTER(c_void_p)]),
    "devstage_stream_adopt": (_S, [handle_p, c_void_p, POINTER(c_void_p)]),
    "devstage_stream_native": (_S, [c_void_p, POINTER(c_void_p)]),
    "devstage_stream_destroy": (_S, [handle_p, c_void_p]),
    "devstage_stream_synchronize": (_S, [handle_p, c_void_p]),
    "devstage_copy_to_device_async": (_S, [handle_p, c_void_p, c_void_p, c_size_t, c_void_p]),
    "devstage_copy_from_device_async": (_S, [handle_p, c_void_p, c_void_p, c_size_t, c_void_p]),
    "devstage_event_create": (_S, [handle_p, POINTER(c_void_p)]),
    "devstage_event_destroy": (_S, [handle_p, c_void_p]),
    "devstage_event_record": (_S, [handle_p, c_void_p, c_void_p]),
    "devstage_event_ready": (_S, [handle_p, c_void_p, POINTER(c_int)]),
    "devstage_event_synchronize": (_S, [handle_p, c_void_p]),
    "devstage_stream_wait_event": (_S, [handle_p, c_void_p, c_void_p]),
    "devstage_pinned_malloc": (_S, [handle_p, c_size_t, POINTER(c_void_p)]),
    "devstage_pinned_free": (_S, [handle_p, c_void_p]),
    "devstage_launch_host_function": (_S, [handle_p, c_void_p, HOST_FUNCTION, c_void_p]),
    "devstage_stager_create": (_S, [handle_p, POINTER(StagerConfig), POINTER(handle_p)]),
    "devstage_stager_destroy": (_S, [handle_p]),
    "devstage_stager_set_error_sink": (_S, [handle_p, ERROR_SINK, c_void_p]),
    "devstage_stager_release": (_S, [handle_p]),
    "devstage_stager_abandon": (_S, [handle_p]),
    "devstage_stager_reserve": (_S, [handle_p, c_size_t]),
    "devstage_stager_stats_get": (_S, [handle_p, POINTER(StagerStats)]),
    "devstage_bind": (_S, [handle_p, POINTER(TensorArg), c_size_t, POINTER(handle_p)]),
    "devstage_bind_on": (_S, [handle_p, POINTER(TensorArg), c_size_t, c_void_p, POINTER(handle_p)]),
    "devstage_run_device_args": (_S, [handle_p, POINTER(c_void_p), c_size_t]),
    "devstage_run_slot": (_S, [handle_p, POINTER(c_size_t)]),
    "devstage_order_after_uploads": (_S, [handle_p, handle_p, c_void_p]),
    "devstage_finish": (_S, [handle_p, handle_p, c_int]),
    "devstage_finish_on": (_S, [handle_p, handle_p, c_void_p, c_int, POINTER(handle_p)]),
    "devstage_run_destroy": (_S, [handle_p]),
    "devstage_completion_wait": (_S, [handle_p]),
    "devstage_completion_ready": (_S, [handle_p, POINTER(c_int)]),
    "devstage_completion_pending": (_S, [handle_p, POINTER(c_int)]),
    "devstage_completion_destroy": (_S, [handle_p]),
    "devstage_frame_create": (_S, [handle_p, POINTER(TensorShape), c_size_t, POINTER(handle_p)]),
    "devstage_frame_host": (_S, [handle_p, c_size_t, POINTER(c_void_p), POINTER(c_size_t)]),
    "devstage_frame_hosts": (_S, [handle_p, POINTER(c_void_p), POINTER(c_size_t), c_size_t]),
    "devstage_frame_slot": (_S, [handle_p, POINTER(c_size_t)]),
    "devstage_bind_frame": (_S, [handle_p, handle_p, POINTER(handle_p)]),
    "devstage_bind_frame_on": (_S, [handle_p, handle_p, c_void_p, POINTER(handle_p)]),
    "devstage_frame_destroy": (_S, [handle_p]),
    "devstage_pinned_pool_create": (_S, [handle_p, c_size_t, POINTER(handle_p)]),
    "devstage_pinned_pool_destroy": (_S, [handle_p]),
    "devstage_pinned_pool_set_error_sink": (_S, [handle_p, ERROR_SINK, c_void_p]),
    "devstage_pinned_pool_allocate": (_S, [handle_p, c_size_t, POINTER(c_void_p)]),
    "devstage_pinned_pool_free": (_S, [handle_p, c_void_p]),
    "devstage_pinned_pool_record": (_S, [handle_p, c_void_p, c_void_p]),
    "devstage_pinned_pool_trim": (_S, [handle_p]),
    "devstage_pinned_pool_stats": (_S, [handle_p, POINTER(PinnedStats)]),
}


def _install_libdir():
    """The library directory of the Meson install this package came with, if any."""
    try:
        from . import _install  # written by meson install; absent in the source tree and a wheel
    except ImportError:
        return None
    return _install.LIBDIR


def candidates():
    """Where the library is looked for, in order: (path or name, how it was chosen)."""
    override = os.environ.get("DEVSTAGE_C_LIBRARY")
    if override:
        return [(override, "$DEVSTAGE_C_LIBRARY")]
    found = []
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libdevstage_c.so")
    if os.path.exists(bundled):
        found.append((bundled, "inside the package"))
    libdir = _install_libdir()
    if libdir:
        found.append((os.path.join(libdir, "libdevstage_c.so.0"), "the Meson install's library directory"))
    system = ctypes.util.find_library("devstage_c")
    found += [(name, "the dynamic loader") for name in (system, "libdevstage_c.so.0", "libdevstage_c.so") if name]
    return found


class _Missing:
    """A function the loaded library does not have (a library older than the package)."""

    def __init__(self, name, path):
        self.name, self.path = name, path

    def __call__(self, *args):
        raise errors.LibraryNotFound("library_not_found", f"devstage: the libdevstage_c loaded from {self.path} has no "
                              f"{self.name}: it is older than this Python package; install both from one devstage "
                              "(pip install ., or ./dev install), or set DEVSTAGE_C_LIBRARY to a matching library")


def _load():
    tried = []
    for name, how in candidates():
        try:
            library = ctypes.CDLL(name)
        except OSError as error:
            tried.append(f"{name} ({how}): {error}")
            continue
        path = getattr(library, "_name", name)
        for function, (restype, argtypes) in _PROTOTYPES.items():
            f = getattr(library, function, None)
            if f is None:
                setattr(library, function, _Missing(function, path))
                continue
            f.restype = restype
            f.argtypes = argtypes
        library.devstage_path = path
        return library
    raise errors.LibraryNotFound(
        "library_not_found",
        "devstage: libdevstage_c could not be loaded; tried " + "; ".join(tried) + ". Install the package with pip "
        "(pip install . from a devstage checkout: the library is then inside it), or point DEVSTAGE_C_LIBRARY at the "
        "library (after ./dev install PREFIX: PREFIX/lib/<multiarch>/libdevstage_c.so.0; in a build tree: "
        "build/src/c/libdevstage_c.so), or add its directory to LD_LIBRARY_PATH.")


lib = _load()


def message_of(call: Optional[str]) -> str:
    """This thread's last message, in Python's terms: the C function it starts with
    ("devstage_bind: ...") is replaced by the Python call that made it ("devstage Stager.bind:
    ..."). Take it right after the call, on the same thread."""
    message = lib.devstage_last_message().decode(errors="replace")
    if call is None:
        return message
    if message.startswith("devstage_"):
        colon = message.find(": ")
        if colon > 0 and " " not in message[:colon]:
            message = message[colon + 2:]
    return f"{call}: {message}" if call.startswith("devstage") else f"devstage {call}: {message}"


def error_of(status: int, call: Optional[str] = None) -> errors.Error:
    """The exception of a devstage_status that is not DEVSTAGE_OK, with this thread's last message
    (see message_of)."""
    return errors.make(status, message_of(call))


def check(status: int, call: Optional[str] = None) -> None:
    """Raises the exception of a devstage_status that is not DEVSTAGE_OK."""
    if status != 0:
        raise error_of(status, call)
