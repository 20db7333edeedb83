/* SPDX-License-Identifier: Apache-2.0 */
/*
 * devstage's C interface: staging a run's host tensors on an accelerator from C99, C++17 or
 * any language with a C FFI (Python's ctypes). Implemented by the compiled library devstage_c
 * (pkg-config devstage-c, CMake devstage::devstage_c); the C++20 headers stay header-only.
 *
 *   devstage_backend* sim;
 *   devstage_stager* stager;
 *   devstage_run* run;
 *   if (devstage_backend_create_sim(0, &sim) != DEVSTAGE_OK) die(devstage_last_message());
 *   devstage_stager_create(sim, NULL, &stager);          (NULL: retained buffer, one slot)
 *   devstage_bind(stager, args, 3, &run);                 (uploads In and InOut args)
 *   devstage_run_device_args(run, device_args, 3);        (launch the kernel on these)
 *   devstage_finish(stager, run, DEVSTAGE_OK);            (copies back Out and InOut args)
 *
 * Conventions. Every function returns a devstage_status; DEVSTAGE_OK is success. After a call
 * that did not return DEVSTAGE_OK, devstage_last_message() gives its message (which operation,
 * which sizes, which backend); a failed call takes nothing and leaves its outputs NULL. Handles
 * are opaque and checked: a destroyed, used-up or made-up handle, or one of another kind, is
 * DEVSTAGE_INVALID_ARGUMENT naming it, never a read of memory that is gone (a handle is not an
 * address, and an old one never reaches a new object). Each kind has a destroy function that
 * accepts NULL. Stagers and pools keep their
 * backend alive, so handles may be destroyed in any order (a frame's memory, though, lives with
 * its stager). A stager, its runs, frames and completions are used from one thread; backends
 * and pinned pools are thread-safe.
 * No exception crosses this interface. See docs/c_api.md.
 */
#ifndef DEVSTAGE_C_DEVSTAGE_H
#define DEVSTAGE_C_DEVSTAGE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define DEVSTAGE_C_API __attribute__((visibility("default")))
#else
#define DEVSTAGE_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------ */

/* The outcome of a call: one of the codes below (devstage's Errc, value for value). This and the
 * other enumerated types of the interface are ints, so a value from C outside the list is data
 * the library checks, not undefined behaviour in its C++. */
typedef int devstage_status;
enum devstage_status_code {
    DEVSTAGE_OK = 0,
    DEVSTAGE_OUT_OF_MEMORY = 1,     /* the backend (or a cap) could not provide the bytes */
    DEVSTAGE_INVALID_ARGUMENT = 2,  /* the caller passed something the contract forbids */
    DEVSTAGE_BUSY = 3,              /* in use by a live run, or every slot is held */
    DEVSTAGE_BACKEND_FAILURE = 4,   /* the backend failed (a callback returned non-zero) */
    DEVSTAGE_UNKNOWN_POINTER = 5,   /* never handed out, or already given back */
    DEVSTAGE_NOT_SUPPORTED = 6,     /* the backend or stager lacks the capability */
    DEVSTAGE_LIBRARY_NOT_FOUND = 7, /* a runtime library (libcudart, libascendcl) did not load */
    DEVSTAGE_LEAKED = 8             /* memory still held when its owner went away */
};

/* The message of the last devstage call made on this thread: why it failed, or "" when it
 * succeeded. Valid until the thread's next devstage call. */
DEVSTAGE_C_API const char* devstage_last_message(void);

/* A stable lower-case name: "ok", "out_of_memory", ... ("unknown" for other values). */
DEVSTAGE_C_API const char* devstage_status_name(devstage_status status);

/* ---- backends ---------------------------------------------------------------------------- */

typedef struct devstage_backend devstage_backend;

/* A stream or an event of a backend: a devstage handle wrapping the runtime's own (a
 * cudaStream_t, an aclrtStream, what a create_stream callback returned, a simulator stream),
 * made by devstage_stream_create / devstage_event_create or, for a stream, adopted with
 * devstage_stream_adopt. Each belongs to the backend it was made through: another backend's
 * is refused. A backend's streams and events need its handle to be destroyed, so the backend
 * handle cannot be destroyed before them (DEVSTAGE_BUSY). */
typedef struct devstage_stream_handle* devstage_stream;
typedef struct devstage_event_handle* devstage_event;

/* A function run on a stream (devstage_launch_host_function). */
typedef void (*devstage_host_function)(void* user);

/* The simulator: device memory emulated in host memory, page-locked pinned memory, a worker
 * thread per stream. device_capacity: bytes device_malloc may hand out (0: 64 GiB). */
DEVSTAGE_C_API devstage_status devstage_backend_create_sim(size_t device_capacity, devstage_backend** out);

/* Simulated device `device` (>= 0). host_of NULL: a host of its own; else a simulator backend
 * whose simulated host the new device joins, as the accelerators of one server share its host
 * memory: pinned memory of any device of the host is pinned for all of them. A stream or event
 * stays its own backend's. devstage_backend_create_sim is device 0 of a host of its own. */
DEVSTAGE_C_API devstage_status devstage_backend_create_sim_device(int device, size_t device_capacity,
                                                                  const devstage_backend* host_of,
                                                                  devstage_backend** out);

/* CUDA device `device` through libcudart, loaded at run time (library_path NULL: as
 * CudaBackend::create looks for it). DEVSTAGE_LIBRARY_NOT_FOUND when it cannot be loaded. */
DEVSTAGE_C_API devstage_status devstage_backend_create_cuda(int device, const char* library_path,
                                                            devstage_backend** out);

/* Ascend device `device` through libascendcl, loaded at run time (library_path NULL: as
 * AscendBackend::create looks for it). */
DEVSTAGE_C_API devstage_status devstage_backend_create_ascend(int device, const char* library_path,
                                                              devstage_backend** out);

/* A runtime's platform callbacks. Every callback gets `context` first. The four required ones
 * have the shape of a runtime's device_malloc / device_free / copy hooks; pinned memory and
 * streams are optional groups (all of a group or none of it), and so is each memset. A callback returning int returns 0 on success and
 * anything else on failure (reported as DEVSTAGE_BACKEND_FAILURE naming the value). Callbacks
 * may be called from several threads at once (a pinned pool is thread-safe) and must not call
 * back into devstage. */
typedef struct devstage_callbacks {
    const char* name; /* the backend's name in messages (copied; NULL: "callbacks") */
    void* context;    /* must outlive the backend and everything made from it */

    /* Required. device_malloc returns NULL when out of memory; it is never called with 0.
     * devstage keeps the set of live allocations: a pointer it did not get from device_malloc
     * (or already freed) is refused with DEVSTAGE_UNKNOWN_POINTER and never reaches device_free. */
    void* (*device_malloc)(void* context, size_t bytes);
    void (*device_free)(void* context, void* device);
    int (*copy_to_device)(void* context, void* device_dst, const void* host_src, size_t bytes);
    int (*copy_from_device)(void* context, void* host_dst, const void* device_src, size_t bytes);

    /* Optional: page-locked host memory (needed by pinned pools and packing stagers); tracked
     * like device memory. */
    void* (*pinned_malloc)(void* context, size_t bytes);
    void (*pinned_free)(void* context, void* host);

    /* Optional: streams and events. Without them every stream devstage hands out is immediate:
     * its copies are done when the call returns and its events are always complete. */
    int (*create_stream)(void* context, void** stream);
    int (*destroy_stream)(void* context, void* stream);
    int (*copy_to_device_async)(void* context, void* device_dst, const void* host_src, size_t bytes, void* stream);
    int (*copy_from_device_async)(void* context, void* host_dst, const void* device_src, size_t bytes, void* stream);
    int (*create_event)(void* context, void** event);
    int (*destroy_event)(void* context, void* event);
    int (*record_event)(void* context, void* event, void* stream);
    int (*event_ready)(void* context, void* event, int* ready); /* never blocks; *ready 1 or 0 */
    int (*synchronize_event)(void* context, void* event);       /* the host blocks */
    int (*stream_wait_event)(void* context, void* stream, void* event);

    /* Optional: setting device memory, which stagers use to zero Out args (see output_policy);
     * device_memset_async needs the stream callbacks. Without them devstage uploads zeros. */
    int (*device_memset)(void* context, void* device_dst, int value, size_t bytes);
    int (*device_memset_async)(void* context, void* device_dst, int value, size_t bytes, void* stream);

    /* Optional: waits until all work on every stream completed (a device-wide synchronize).
     * Stagers use it to recover when waiting for one run's event failed. */
    int (*synchronize)(void* context);
    /* Optional, needs the stream callbacks: enqueues fn(user) on `stream`, run once the work
     * enqueued there before it completed; later work there waits for it to return. */
    int (*launch_host_function)(void* context, void* stream, devstage_host_function fn, void* user);
    /* Optional, both or neither: pins existing host memory in place, and undoes it. */
    int (*host_register)(void* context, void* host, size_t bytes);
    int (*host_unregister)(void* context, void* host);
} devstage_callbacks;

/* A backend over `callbacks` (copied). A required callback missing, a group given in part, or
 * device_memset_async or launch_host_function without streams is DEVSTAGE_INVALID_ARGUMENT
 * naming what is missing. Fields are only ever appended to devstage_callbacks: a
 * zero-initialized struct keeps working, but a program must be compiled against the header of
 * the library it loads (the struct is read in full). */
DEVSTAGE_C_API devstage_status devstage_backend_create_callbacks(const devstage_callbacks* callbacks,
                                                                 devstage_backend** out);

/* Gives up the caller's reference. Stagers and pools made from the backend keep it alive; the
 * backend is destroyed with the last of them. A callbacks backend then frees what was allocated
 * through it and never freed, and reports it: DEVSTAGE_LEAKED when this call destroys it, a
 * line on stderr when a stager or pool does. DEVSTAGE_BUSY, taking nothing, while streams or
 * events made through this handle are not destroyed. */
DEVSTAGE_C_API devstage_status devstage_backend_destroy(devstage_backend* backend);

/* What a backend is and offers. */
typedef struct devstage_backend_info {
    const char* name; /* "sim", "cuda", "ascend" or the callbacks' name; valid with the backend */
    int pinned;       /* 1: page-locked host memory (pinned pools, packing stagers) */
    int streams;      /* 1: streams run asynchronously; 0: they are immediate */
} devstage_backend_info;

DEVSTAGE_C_API devstage_status devstage_backend_get_info(const devstage_backend* backend, devstage_backend_info* info);

/* Which runtime a backend is, and its device: the CUDA or ACL device id, the number of a
 * simulator device (devstage_backend_create_sim_device), 0 for callbacks. */
enum devstage_backend_kind_value {
    DEVSTAGE_BACKEND_SIM = 0,
    DEVSTAGE_BACKEND_CUDA = 1,
    DEVSTAGE_BACKEND_ASCEND = 2,
    DEVSTAGE_BACKEND_CALLBACKS = 3
};
DEVSTAGE_C_API devstage_status devstage_backend_device(const devstage_backend* backend, int* kind, int* device);

/* Blocks until all work on every stream of the device completed (cudaDeviceSynchronize,
 * aclrtSynchronizeDevice, the simulator's, the synchronize callback); DEVSTAGE_NOT_SUPPORTED
 * for a callbacks backend without it. Without stream callbacks there is nothing to wait for. */
DEVSTAGE_C_API devstage_status devstage_backend_synchronize(devstage_backend* backend);

/* Device memory, for tensors that stay on the device (weights, a KV cache). */
DEVSTAGE_C_API devstage_status devstage_device_malloc(devstage_backend* backend, size_t bytes, void** device);
DEVSTAGE_C_API devstage_status devstage_device_free(devstage_backend* backend, void* device);
DEVSTAGE_C_API devstage_status devstage_copy_to_device(devstage_backend* backend, void* device_dst,
                                                       const void* host_src, size_t bytes);
DEVSTAGE_C_API devstage_status devstage_copy_from_device(devstage_backend* backend, void* host_dst,
                                                         const void* device_src, size_t bytes);

/* Page-locked host memory straight from the backend (a pinned pool caches it instead). */
DEVSTAGE_C_API devstage_status devstage_pinned_malloc(devstage_backend* backend, size_t bytes, void** host);
DEVSTAGE_C_API devstage_status devstage_pinned_free(devstage_backend* backend, void* host);

/* Streams. devstage_stream_create makes a runtime stream owned by the handle;
 * devstage_stream_destroy frees the handle and destroys the stream it made (an adopted one is
 * left to its owner). The handle is freed even when the runtime fails to destroy its stream
 * (that failure is returned). */
DEVSTAGE_C_API devstage_status devstage_stream_create(devstage_backend* backend, devstage_stream* stream);
DEVSTAGE_C_API devstage_status devstage_stream_destroy(devstage_backend* backend, devstage_stream stream);
/* Wraps an existing runtime stream (a cudaStream_t, an aclrtStream, a stream of the callbacks'
 * runtime; for the simulator the native value of one of its streams) in a handle; devstage never
 * destroys it. NULL: the runtime's default stream (CUDA's legacy default stream, ACL's default
 * stream); DEVSTAGE_NOT_SUPPORTED where there is none (the simulator, callbacks). A value the
 * backend can tell is not one of its live streams (the simulator's, devstage's immediate ones)
 * is DEVSTAGE_INVALID_ARGUMENT. */
DEVSTAGE_C_API devstage_status devstage_stream_adopt(devstage_backend* backend, void* native, devstage_stream* stream);
/* The runtime's handle of `stream` (to launch kernels on a stream devstage made). */
DEVSTAGE_C_API devstage_status devstage_stream_native(devstage_stream stream, void** native);
/* Blocks until the work enqueued on `stream` so far completed. */
DEVSTAGE_C_API devstage_status devstage_stream_synchronize(devstage_backend* backend, devstage_stream stream);
DEVSTAGE_C_API devstage_status devstage_copy_to_device_async(devstage_backend* backend, void* device_dst,
                                                             const void* host_src, size_t bytes,
                                                             devstage_stream stream);
DEVSTAGE_C_API devstage_status devstage_copy_from_device_async(devstage_backend* backend, void* host_dst,
                                                               const void* device_src, size_t bytes,
                                                               devstage_stream stream);

/* Events: an event never recorded is complete. */
DEVSTAGE_C_API devstage_status devstage_event_create(devstage_backend* backend, devstage_event* event);
DEVSTAGE_C_API devstage_status devstage_event_destroy(devstage_backend* backend, devstage_event event);
DEVSTAGE_C_API devstage_status devstage_event_record(devstage_backend* backend, devstage_event event,
                                                     devstage_stream stream);
/* *ready: 1 once the work before the recording completed, else 0. Never blocks. */
DEVSTAGE_C_API devstage_status devstage_event_ready(devstage_backend* backend, devstage_event event, int* ready);
DEVSTAGE_C_API devstage_status devstage_event_synchronize(devstage_backend* backend, devstage_event event);
/* Work enqueued on `stream` afterwards waits for `event`; the host does not block. */
DEVSTAGE_C_API devstage_status devstage_stream_wait_event(devstage_backend* backend, devstage_stream stream,
                                                          devstage_event event);

/* Enqueues fn(user) on `stream`: it runs in stream order, after the work enqueued there before
 * it, and later work there waits for it (a kernel written in the host language).
 * cudaLaunchHostFunc on CUDA (fn must not call CUDA); the stream's worker thread on the
 * simulator; the launch_host_function callback; at once on an immediate stream (a callbacks
 * backend without streams). DEVSTAGE_NOT_SUPPORTED on Ascend and on callbacks without it. */
DEVSTAGE_C_API devstage_status devstage_launch_host_function(devstage_backend* backend, devstage_stream stream,
                                                             devstage_host_function fn, void* user);

/* Pins existing host memory [host, host + bytes) in place for the backend's copies
 * (cudaHostRegister with cudaHostRegisterPortable; mlock and the simulator's pinned accounting;
 * the host_register callback), until devstage_host_unregister(backend, host). NULL, 0 bytes, a
 * range registered already or overlapping one: DEVSTAGE_INVALID_ARGUMENT; unregistering a
 * pointer that starts no registered range: DEVSTAGE_UNKNOWN_POINTER (callbacks: what they
 * return). DEVSTAGE_NOT_SUPPORTED on Ascend (aclrtHostRegister only maps memory for the device)
 * and on callbacks without them. */
DEVSTAGE_C_API devstage_status devstage_host_register(devstage_backend* backend, void* host, size_t bytes);
DEVSTAGE_C_API devstage_status devstage_host_unregister(devstage_backend* backend, void* host);

/* ---- stagers ----------------------------------------------------------------------------- */

typedef struct devstage_stager devstage_stager;
typedef struct devstage_run devstage_run;
typedef struct devstage_completion devstage_completion;
typedef struct devstage_frame devstage_frame;

typedef int devstage_strategy;
enum devstage_strategy_value {
    DEVSTAGE_STRATEGY_RETAINED = 0,    /* RetainedBump: one device buffer per slot, kept across runs */
    DEVSTAGE_STRATEGY_PER_TENSOR = 1,  /* PerTensorMalloc: one allocation per staged arg per run */
    DEVSTAGE_STRATEGY_RETAINED_VMM = 2 /* RetainedVmm: one buffer per slot grown in place (virtual memory):
                                          its address never changes; the backend needs virtual memory */
};

typedef int devstage_growth;
enum devstage_growth_value {
    DEVSTAGE_GROWTH_EXACT = 0,     /* to exactly what the run requires */
    DEVSTAGE_GROWTH_GEOMETRIC = 1, /* to max(required, current * numerator / denominator) */
    DEVSTAGE_GROWTH_GRANULAR = 2   /* required rounded up to a multiple of granule */
};

typedef int devstage_grow_order;
enum devstage_grow_order_value {
    DEVSTAGE_GROW_ALLOCATE_FIRST = 0, /* allocate the new buffer, then free the old */
    DEVSTAGE_GROW_FREE_FIRST = 1      /* free the old buffer first (least peak memory) */
};

/* Packing limits in common use (a stager packs args of at most this many bytes into one copy each
 * way); pack_limit takes any value. */
#define DEVSTAGE_PACK_LIMIT_4K ((size_t)4096)
#define DEVSTAGE_PACK_LIMIT_16K ((size_t)16384)
#define DEVSTAGE_PACK_LIMIT_64K ((size_t)65536)

/* What a bind does with the device bytes of Out args before the kernel can see them. */
typedef int devstage_output_policy;
enum devstage_output_policy_value {
    DEVSTAGE_OUTPUT_ZERO = 0,             /* set to zero (a device memset, else zeros uploaded) */
    DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL = 1 /* left as they are: the kernel writes every byte */
};

/* How a stager stages. All zeros (or NULL) is the default: retained, no packing, one slot,
 * exact growth, allocate first, no cap, Out args zeroed. Slices are aligned to 1024 bytes. New
 * fields are appended at the end: a config zeroed before its fields are set keeps its meaning. */
typedef struct devstage_stager_config {
    devstage_strategy strategy;
    size_t pack_limit;          /* 0: one copy per arg; else args of at most this many bytes move in
                                   one copy each way through a pinned mirror (retained only, and the
                                   backend needs pinned memory); frames need it above 0 */
    size_t pipeline_slots;      /* 0 counts as 1; at most 256 */
    devstage_growth growth;     /* the retained strategy only, as are the next five fields */
    uint32_t growth_numerator;  /* geometric: a factor above 1 (numerator > denominator > 0) */
    uint32_t growth_denominator;
    size_t growth_granule;      /* granular: a power of two */
    size_t growth_cap;          /* 0: none; else a plan over it fails, a grow past it is clamped;
                                   retained_vmm: the bytes reserved, 0: 64 GiB (a plan over it fails) */
    devstage_grow_order grow_order;
    devstage_output_policy output_policy;
    int map_small;              /* nonzero: the small args (pack_limit) lie in the mirror mapped for
                                   the device where the backend maps it, read and written by the
                                   kernel in place (no copy); elsewhere they are copied */
} devstage_stager_config;

/* Where a stager or pool reports failures that have no caller to return to (a dropped run, a
 * completion destroyed unwaited, a free that failed while destroying). Default: stderr. */
typedef void (*devstage_error_sink)(void* context, devstage_status status, const char* message);

/* A stager over `backend` as `config` says (NULL: the defaults). Every error of the config is
 * named in one message; DEVSTAGE_NOT_SUPPORTED when all that is wrong is a capability the backend
 * lacks (pinned memory, for packing), else DEVSTAGE_INVALID_ARGUMENT. */
DEVSTAGE_C_API devstage_status devstage_stager_create(devstage_backend* backend, const devstage_stager_config* config,
                                                      devstage_stager** out);
/* Waits for pending work, releases a live run and every retained buffer. Returns the first
 * failure met doing so (also given to the error sink), else DEVSTAGE_OK. */
DEVSTAGE_C_API devstage_status devstage_stager_destroy(devstage_stager* stager);
DEVSTAGE_C_API devstage_status devstage_stager_set_error_sink(devstage_stager* stager, devstage_error_sink sink,
                                                              void* context);
/* Gives back all device memory now (waiting for pending work); the stager stays usable. */
DEVSTAGE_C_API devstage_status devstage_stager_release(devstage_stager* stager);
/* Forgets all device memory, pending work and events without calling the backend, for after a
 * device reset made them invalid (Stager::abandon): live runs become inert, completions still
 * pending resolve with DEVSTAGE_BACKEND_FAILURE. The stager stays usable. */
DEVSTAGE_C_API devstage_status devstage_stager_abandon(devstage_stager* stager);
/* Grows every slot to at least `bytes` now (retained strategy only). */
DEVSTAGE_C_API devstage_status devstage_stager_reserve(devstage_stager* stager, size_t bytes);

typedef int devstage_direction;
enum devstage_direction_value {
    DEVSTAGE_IN = 0,    /* uploaded before the run, never copied back */
    DEVSTAGE_OUT = 1,   /* not uploaded, copied back after a successful run */
    DEVSTAGE_IN_OUT = 2 /* uploaded, and copied back after a successful run */
};

typedef int devstage_placement;
enum devstage_placement_value {
    DEVSTAGE_HOST = 0,  /* host memory, staged on the device for the run */
    DEVSTAGE_DEVICE = 1 /* caller-owned device memory, passed through untouched */
};

/* One argument of a run. bytes > 0 needs data != NULL; a zero-byte arg stages as NULL. */
typedef struct devstage_tensor_arg {
    void* data;
    size_t bytes;
    devstage_direction direction;
    devstage_placement placement;
} devstage_tensor_arg;

/* Plans, grows if needed and uploads the In and InOut args; *run holds the device view until
 * finish. DEVSTAGE_BUSY when every slot holds a live run. On failure everything taken is
 * released. devstage_bind returns once the uploads are on the device; devstage_bind_on enqueues
 * them on `stream` (the device args are valid for work enqueued there afterwards, and In data
 * must not change until the run's completion is ready). */
DEVSTAGE_C_API devstage_status devstage_bind(devstage_stager* stager, const devstage_tensor_arg* args, size_t count,
                                             devstage_run** run);
DEVSTAGE_C_API devstage_status devstage_bind_on(devstage_stager* stager, const devstage_tensor_arg* args, size_t count,
                                                devstage_stream stream, devstage_run** run);

/* Copies the run's device pointers, in input order, into device_args[0..count): staged args
 * point at device memory, device args are unchanged, zero-byte args are NULL. `count` must be
 * the bind's count. */
DEVSTAGE_C_API devstage_status devstage_run_device_args(const devstage_run* run, void** device_args, size_t count);
DEVSTAGE_C_API devstage_status devstage_run_slot(const devstage_run* run, size_t* slot);

/* Work enqueued on `stream` afterwards runs after the live `run`'s bind — its uploads and the
 * waits it made — without a host wait (uploads on a copy stream, the kernel on another). No-op
 * on the bind's stream. On failure the run stays live. */
DEVSTAGE_C_API devstage_status devstage_order_after_uploads(devstage_stager* stager, const devstage_run* run,
                                                            devstage_stream stream);

/* Ends the run: copies back Out and InOut args when `execution` is DEVSTAGE_OK (pass the
 * kernel's failure to copy nothing back), releases what the run holds, and returns the first
 * failure of its own copy-backs and releases. The kernel must have completed. A finish that
 * ran consumes the run handle, whatever it returned; a refused one (a run of another stager, a
 * stream that is not a live stream of the stager's backend and device: DEVSTAGE_INVALID_ARGUMENT)
 * leaves the run live and usable, as it was. */
DEVSTAGE_C_API devstage_status devstage_finish(devstage_stager* stager, devstage_run* run, devstage_status execution);
/* As devstage_finish, enqueued on `stream` after the kernel there; *completion tells when the
 * outputs are in host memory. On another stream than the bind's, `stream` first waits for the
 * bind's. */
DEVSTAGE_C_API devstage_status devstage_finish_on(devstage_stager* stager, devstage_run* run, devstage_stream stream,
                                                  devstage_status execution, devstage_completion** completion);
/* Drops a run without finishing it: releases its memory, copies nothing back. */
DEVSTAGE_C_API devstage_status devstage_run_destroy(devstage_run* run);

/* Blocks until the run's copy-backs are in host memory; the run's asynchronous failure, or
 * DEVSTAGE_OK. Repeated calls return the same once it is complete. A wait that fails while the
 * run's work is not known complete (its event cannot be waited for, and the backend cannot wait
 * for the whole device) returns the failure and leaves the completion pending: its host memory
 * is still devstage's, and a later wait tries again; the one that succeeds delivers every
 * output. Ways out: wait again, devstage_backend_synchronize then wait, or
 * devstage_stager_abandon / devstage_stager_destroy (the outputs are then lost). */
DEVSTAGE_C_API devstage_status devstage_completion_wait(devstage_completion* completion);
/* *ready: 1 once the outputs are in host memory, else 0. Never blocks. */
DEVSTAGE_C_API devstage_status devstage_completion_ready(devstage_completion* completion, int* ready);
/* *pending: 1 while the run is not known complete (its host memory is devstage's), else 0. */
DEVSTAGE_C_API devstage_status devstage_completion_pending(const devstage_completion* completion, int* pending);
/* Waits if no wait ended it (returning that wait's result), then frees the handle. When that
 * wait fails and the run stays pending, the failure is returned and the handle is kept (a failed
 * call takes nothing): destroy it again once a wait succeeds, or once its stager was abandoned
 * or destroyed (which resolves it with a failure). */
DEVSTAGE_C_API devstage_status devstage_completion_destroy(devstage_completion* completion);

/* Inputs written in place (packing stagers). `device` NULL: a host tensor, given space in the
 * frame; set: a device-resident tensor passed through at its position. */
typedef struct devstage_tensor_shape {
    size_t bytes;
    devstage_direction direction;
    void* device;
} devstage_tensor_shape;

/* The pinned mirror of a free slot laid out for `shapes`: write the inputs into
 * devstage_frame_host(), then bind the frame. The frame holds its slot until the run that bound
 * it ends (a synchronous finish, or the destruction of its completion); while a frame is unbound
 * or its run's completion is held, devstage_stager_release is DEVSTAGE_BUSY. DEVSTAGE_NOT_SUPPORTED
 * on a stager with pack_limit 0. */
DEVSTAGE_C_API devstage_status devstage_frame_create(devstage_stager* stager, const devstage_tensor_shape* shapes,
                                                     size_t count, devstage_frame** frame);
/* Tensor i's bytes in the frame (aligned to 1024); NULL and 0 for a device-resident or
 * zero-byte tensor. Outputs are copied back here. A frame answers while its memory is its own:
 * from devstage_frame_create until its slot is taken by a later frame or bind (which the stager
 * allows once the frame's run ended), or the stager is released, reserved, abandoned or
 * destroyed; then DEVSTAGE_INVALID_ARGUMENT, never an address that is another run's or freed. */
DEVSTAGE_C_API devstage_status devstage_frame_host(const devstage_frame* frame, size_t i, void** data, size_t* bytes);
/* Every tensor's place at once, as devstage_frame_host gives each: data[0..count) and, unless
 * `bytes` is NULL, bytes[0..count). `count` must be the frame's number of tensors. */
DEVSTAGE_C_API devstage_status devstage_frame_hosts(const devstage_frame* frame, void** data, size_t* bytes,
                                                    size_t count);
/* The pipeline slot the frame lays out (its memory is that slot's mirror). */
DEVSTAGE_C_API devstage_status devstage_frame_slot(const devstage_frame* frame, size_t* slot);
DEVSTAGE_C_API devstage_status devstage_bind_frame(devstage_stager* stager, const devstage_frame* frame,
                                                   devstage_run** run);
DEVSTAGE_C_API devstage_status devstage_bind_frame_on(devstage_stager* stager, const devstage_frame* frame,
                                                      devstage_stream stream, devstage_run** run);
/* Frees the handle. A frame not yet bound gives its slot back (its memory is no longer the
 * caller's); a bound frame's memory stays its run's until the run ends. */
DEVSTAGE_C_API devstage_status devstage_frame_destroy(devstage_frame* frame);

/* A stager's counters since its creation: every StagerStats counter, field for field (new
 * counters are appended). */
typedef struct devstage_stager_stats {
    uint64_t runs;
    uint64_t regrows;
    uint64_t grow_failures;
    uint64_t grows_allocate_first;
    uint64_t grows_free_first;
    uint64_t grows_exact_fallback;
    uint64_t alignment_retries;
    uint64_t mirror_alignment_retries;
    uint64_t address_changes;
    uint64_t device_mallocs;
    uint64_t device_frees;
    uint64_t free_failures;
    uint64_t deferred_frees;
    uint64_t retained_bytes;
    uint64_t mirror_bytes;
    uint64_t high_water_bytes;
    uint64_t bytes_to_device;
    uint64_t bytes_from_device;
    uint64_t uploads;
    uint64_t copy_backs;
    uint64_t async_uploads;
    uint64_t async_copy_backs;
    uint64_t packed_args;
    uint64_t mirror_copy_bytes;
    uint64_t host_waits;
    uint64_t hazard_stream_waits;
    uint64_t hazard_settles;
    uint64_t uploads_skipped;
    uint64_t copy_backs_skipped;
    uint64_t zeroing_calls;
    uint64_t zeroed_bytes;
    uint64_t zero_uploads;
    uint64_t batched_uploads;
    uint64_t batched_copy_backs;
    uint64_t batched_copies;
    uint64_t ring_uploads;
    uint64_t ring_copy_backs;
    uint64_t ring_chunks;
    uint64_t ring_waits;
    uint64_t ring_bytes;
    uint64_t mapped_runs;
    uint64_t host_maps;
    uint64_t map_failures;
    uint64_t mapped_bytes;
    uint64_t host_zeroed_bytes;
} devstage_stager_stats;

DEVSTAGE_C_API devstage_status devstage_stager_stats_get(const devstage_stager* stager, devstage_stager_stats* stats);

/* ---- the pinned host pool ---------------------------------------------------------------- */

typedef struct devstage_pinned_pool devstage_pinned_pool;

/* A thread-safe cache of page-locked host memory over `backend` (which needs pinned memory).
 * Released blocks are kept by size class, up to max_cached_bytes in all (0 caches nothing). */
DEVSTAGE_C_API devstage_status devstage_pinned_pool_create(devstage_backend* backend, size_t max_cached_bytes,
                                                           devstage_pinned_pool** out);
/* Frees the cache and every allocation never freed (waiting for recorded work first). Returns
 * DEVSTAGE_LEAKED naming what was still allocated, else the first failure, else DEVSTAGE_OK. */
DEVSTAGE_C_API devstage_status devstage_pinned_pool_destroy(devstage_pinned_pool* pool);
DEVSTAGE_C_API devstage_status devstage_pinned_pool_set_error_sink(devstage_pinned_pool* pool, devstage_error_sink sink,
                                                                   void* context);
DEVSTAGE_C_API devstage_status devstage_pinned_pool_allocate(devstage_pinned_pool* pool, size_t bytes, void** host);
/* Gives an allocation back: to the cache, or once recorded work completed. A pointer the pool
 * did not hand out, or one already given back, is DEVSTAGE_UNKNOWN_POINTER. */
DEVSTAGE_C_API devstage_status devstage_pinned_pool_free(devstage_pinned_pool* pool, void* host);
/* Work enqueued on `stream` uses the allocation: once given back it is reused only after that
 * work completed. Never blocks. `stream` may be of another backend than the pool's (another
 * device's): its events are then made on that backend, which the pool keeps alive until it is
 * destroyed. */
DEVSTAGE_C_API devstage_status devstage_pinned_pool_record(devstage_pinned_pool* pool, const void* host,
                                                           devstage_stream stream);
/* Frees the cached blocks now (waiting for their recorded work). */
DEVSTAGE_C_API devstage_status devstage_pinned_pool_trim(devstage_pinned_pool* pool);

typedef struct devstage_pinned_stats {
    uint64_t live_allocations;
    uint64_t live_bytes;
    uint64_t peak_live_bytes;
    uint64_t cached_blocks;
    uint64_t cached_bytes;
    uint64_t cache_hits;
    uint64_t cache_misses;
    uint64_t backend_allocations;
    uint64_t backend_frees;
    uint64_t pending_blocks;
    uint64_t pending_bytes;
} devstage_pinned_stats;

DEVSTAGE_C_API devstage_status devstage_pinned_pool_stats(const devstage_pinned_pool* pool,
                                                          devstage_pinned_stats* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DEVSTAGE_C_DEVSTAGE_H */
