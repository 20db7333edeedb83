# SPDX-License-Identifier: Apache-2.0
"""The C interface of libdevstage_c (include/devstage/c/devstage.h) through ctypes.

The library is loaded from $DEVSTAGE_C_LIBRARY when set, else by the names the loader finds
(libdevstage_c.so.0, then libdevstage_c.so). The structures below mirror the header's, field
for field; C enums are ints.
"""
import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_size_t, c_uint32, c_uint64, c_void_p)

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
ERROR_SINK = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
SYNCHRONIZE = CFUNCTYPE(c_int, c_void_p)
HOST_FUNCTION = CFUNCTYPE(None, c_void_p)
LAUNCH_HOST_FUNCTION = CFUNCTYPE(c_int, c_void_p, c_void_p, HOST_FUNCTION, c_void_p)
HOST_REGISTER = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)


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
        ("synchronize", SYNCHRONIZE), ("launch_host_function", LAUNCH_HOST_FUNCTION),
        ("host_register", HOST_REGISTER), ("host_unregister", DESTROY),
    ]


class BackendInfo(Structure):
    _fields_ = [("name", c_char_p), ("pinned", c_int), ("streams", c_int)]


class StagerConfig(Structure):
    _fields_ = [
        ("strategy", c_int), ("pack_limit", c_size_t), ("pipeline_slots", c_size_t),
        ("growth", c_int), ("growth_numerator", c_uint32), ("growth_denominator", c_uint32),
        ("growth_granule", c_size_t), ("growth_cap", c_size_t), ("grow_order", c_int),
        ("output_policy", c_int),
    ]


class TensorArg(Structure):
    _fields_ = [("data", c_void_p), ("bytes", c_size_t), ("direction", c_int), ("placement", c_int)]


STAGER_STATS_FIELDS = (
    "runs", "regrows", "grow_failures", "grows_allocate_first", "grows_free_first",
    "grows_exact_fallback", "alignment_retries", "mirror_alignment_retries", "address_changes",
    "device_mallocs", "device_frees", "free_failures", "deferred_frees", "retained_bytes",
    "mirror_bytes", "high_water_bytes", "bytes_to_device", "bytes_from_device", "uploads",
    "copy_backs", "async_uploads", "async_copy_backs", "packed_args", "mirror_copy_bytes",
    "host_waits", "hazard_stream_waits", "hazard_settles", "uploads_skipped", "copy_backs_skipped",
    "zeroing_calls", "zeroed_bytes", "zero_uploads", "batched_uploads", "batched_copy_backs",
    "batched_copies", "ring_uploads", "ring_copy_backs", "ring_chunks", "ring_waits", "ring_bytes",
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
    "devstage_backend_create_cuda": (_S, [c_int, c_char_p, POINTER(handle_p)]),
    "devstage_backend_create_ascend": (_S, [c_int, c_char_p, POINTER(handle_p)]),
    "devstage_backend_create_callbacks": (_S, [POINTER(Callbacks), POINTER(handle_p)]),
    "devstage_backend_destroy": (_S, [handle_p]),
    "devstage_backend_get_info": (_S, [handle_p, POINTER(BackendInfo)]),
    "devstage_device_malloc": (_S, [handle_p, c_size_t, POINTER(c_void_p)]),
    "devstage_device_free": (_S, [handle_p, c_void_p]),
    "devstage_copy_to_device": (_S, [handle_p, c_void_p, c_void_p, c_size_t]),
    "devstage_copy_from_device": (_S, [handle_p, c_void_p, c_void_p, c_size_t]),
    "devstage_stream_create": (_S, [handle_p, POINTER(c_void_p)]),
    "devstage_stream_destroy": (_S, [handle_p, c_void_p]),
    "devstage_stream_synchronize": (_S, [handle_p, c_void_p]),
    "devstage_stager_create": (_S, [handle_p, POINTER(StagerConfig), POINTER(handle_p)]),
    "devstage_stager_destroy": (_S, [handle_p]),
    "devstage_stager_set_error_sink": (_S, [handle_p, ERROR_SINK, c_void_p]),
    "devstage_stager_release": (_S, [handle_p]),
    "devstage_stager_reserve": (_S, [handle_p, c_size_t]),
    "devstage_stager_stats_get": (_S, [handle_p, POINTER(StagerStats)]),
    "devstage_bind": (_S, [handle_p, POINTER(TensorArg), c_size_t, POINTER(handle_p)]),
    "devstage_bind_on": (_S, [handle_p, POINTER(TensorArg), c_size_t, c_void_p, POINTER(handle_p)]),
    "devstage_run_device_args": (_S, [handle_p, POINTER(c_void_p), c_size_t]),
    "devstage_run_slot": (_S, [handle_p, POINTER(c_size_t)]),
    "devstage_finish": (_S, [handle_p, handle_p, c_int]),
    "devstage_finish_on": (_S, [handle_p, handle_p, c_void_p, c_int, POINTER(handle_p)]),
    "devstage_run_destroy": (_S, [handle_p]),
    "devstage_completion_wait": (_S, [handle_p]),
    "devstage_completion_ready": (_S, [handle_p, POINTER(c_int)]),
    "devstage_completion_destroy": (_S, [handle_p]),
    "devstage_pinned_pool_create": (_S, [handle_p, c_size_t, POINTER(handle_p)]),
    "devstage_pinned_pool_destroy": (_S, [handle_p]),
    "devstage_pinned_pool_allocate": (_S, [handle_p, c_size_t, POINTER(c_void_p)]),
    "devstage_pinned_pool_free": (_S, [handle_p, c_void_p]),
    "devstage_pinned_pool_record": (_S, [handle_p, c_void_p, c_void_p]),
    "devstage_pinned_pool_trim": (_S, [handle_p]),
    "devstage_pinned_pool_stats": (_S, [handle_p, POINTER(PinnedStats)]),
}


def _load():
    override = os.environ.get("DEVSTAGE_C_LIBRARY")
    names = [override] if override else [n for n in (ctypes.util.find_library("devstage_c"),
                                                   "libdevstage_c.so.0", "libdevstage_c.so") if n]
    reasons = []
    for name in names:
        try:
            library = ctypes.CDLL(name)
        except OSError as error:
            reasons.append(str(error))
            continue
        for function, (restype, argtypes) in _PROTOTYPES.items():
            f = getattr(library, function)
            f.restype = restype
            f.argtypes = argtypes
        return library
    from .errors import LibraryNotFound
    raise LibraryNotFound("library_not_found", "devstage: libdevstage_c could not be loaded (tried " +
                          ", ".join(names) + "): " + "; ".join(reasons) +
                          ". Set DEVSTAGE_C_LIBRARY to its path, or install devstage (./dev install).")


lib = _load()
