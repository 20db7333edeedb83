/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A device in host memory behind devstage_callbacks, written in C as a runtime's platform
 * layer would be: for the tests of the C interface and its contract suites. It checks what a
 * driver checks (copies inside one allocation, known streams and events), fails the k-th call
 * of an operation on request, and with deferred streams runs enqueued work only when the host
 * waits for it (an event's synchronization, or a query that answered "not ready" once), so a
 * missing wait shows as stale data. Thread-safe (one lock).
 */
#ifndef DEVSTAGE_TESTS_FAKE_DEVICE_H
#define DEVSTAGE_TESTS_FAKE_DEVICE_H

#include <stddef.h>

#include "devstage/c/devstage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fake_device fake_device;

/* The operations a fault can be injected into. */
typedef enum fake_op {
    FAKE_DEVICE_MALLOC,
    FAKE_COPY_TO_DEVICE,
    FAKE_COPY_FROM_DEVICE,
    FAKE_PINNED_MALLOC,
    FAKE_CREATE_STREAM,
    FAKE_COPY_TO_DEVICE_ASYNC,
    FAKE_COPY_FROM_DEVICE_ASYNC,
    FAKE_CREATE_EVENT,
    FAKE_RECORD_EVENT,
    FAKE_EVENT_READY,
    FAKE_SYNCHRONIZE_EVENT,
    FAKE_STREAM_WAIT_EVENT,
    FAKE_DEVICE_MEMSET, /* both memsets */
    FAKE_SYNCHRONIZE,
    FAKE_LAUNCH_HOST_FUNCTION,
    FAKE_HOST_REGISTER, /* both host_register and host_unregister */
    FAKE_OP_COUNT
} fake_op;

/* A device whose allocations fail past `capacity` live bytes. `streams`: 0 gives callbacks
 * without streams (devstage's streams are then immediate), 1 gives deferred streams. NULL when
 * the host is out of memory. */
fake_device* fake_device_create(size_t capacity, int streams);
/* Frees what is still allocated. */
void fake_device_destroy(fake_device* device);
/* The callbacks of `device`, named "fake" (context: the device): every one, memsets included
 * (device_memset_async, synchronize and launch_host_function with streams only). */
void fake_device_callbacks(fake_device* device, devstage_callbacks* callbacks);

/* The k-th call of `op` from now (1-based) fails; 0 clears it. */
void fake_device_fail(fake_device* device, fake_op op, unsigned k);
/* Calls of `op` so far. */
unsigned fake_device_calls(const fake_device* device, fake_op op);
/* Device and pinned allocations live now, streams and events not destroyed, operations
 * enqueued and not run. */
size_t fake_device_live_device(const fake_device* device);
size_t fake_device_live_pinned(const fake_device* device);
size_t fake_device_live_streams(const fake_device* device);
size_t fake_device_live_events(const fake_device* device);
size_t fake_device_pending(const fake_device* device);
/* Host ranges registered now. */
size_t fake_device_registered(const fake_device* device);

#ifdef __cplusplus
}
#endif

#endif /* DEVSTAGE_TESTS_FAKE_DEVICE_H */
