// SPDX-License-Identifier: Apache-2.0
// The backend entry points of the C interface: making a backend, and its memory, stream and
// event operations.

#include <cstddef>
#include <new>
#include <utility>

#include "any_backend.hpp"
#include "devstage/c/devstage.h"
#include "devstage/detail/util/message.hpp"
#include "handles.hpp"

using namespace devstage::capi;  // the entry points' helpers
using devstage::Result;
using devstage::Status;

namespace {

devstage_status made(Result<BackendPtr> backend, devstage_backend** out) {
    if (!backend) return report(backend.status());
    *out = new devstage_backend{std::move(*backend)};
    return report(Status());
}

AnyBackend::Stream native(devstage_stream stream) noexcept {
    return AnyBackend::Stream{static_cast<void*>(stream)};
}
AnyBackend::Event native(devstage_event event) noexcept {
    return AnyBackend::Event{static_cast<void*>(event)};
}

// Runs `operation(backend)` on a backend handle that must not be NULL.
template <class Operation>
devstage_status on_backend(const char* function, const devstage_backend* backend, Operation&& operation) noexcept {
    return guarded(function, [&] {
        if (backend == nullptr) return null_argument(function, "backend");
        return operation(*backend->backend);
    });
}

// Allocates `bytes` (> 0) with `allocate` into `*out` (not NULL; NULL on failure).
template <class Allocate>
devstage_status allocated(const char* function, std::size_t bytes, void** out, Allocate&& allocate) {
    if (out == nullptr) return null_argument(function, "the pointer to store the allocation in");
    *out = nullptr;
    if (bytes == 0) {
        return report(
            Status(devstage::Errc::invalid_argument,
                   devstage::detail::message(function, ": 0 bytes asked for (a zero-byte tensor needs none)")));
    }
    Result<void*> memory = allocate(bytes);
    if (!memory) return report(memory.status());
    *out = *memory;
    return report(Status());
}

// Stores a new stream or event handle in `*out` (not NULL), or reports why there is none.
template <class Out, class Handle>
devstage_status hand_out(Result<Handle> made, Out* out) {
    if (!made) return report(made.status());
    *out = static_cast<Out>(made->handle);
    return report(Status());
}

}  // namespace

extern "C" {

devstage_status devstage_backend_create_sim(size_t device_capacity, devstage_backend** out) {
    return guarded("devstage_backend_create_sim", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_sim", "out");
        *out = nullptr;
        return made(make_sim_backend(device_capacity), out);
    });
}

devstage_status devstage_backend_create_cuda(int device, const char* library_path, devstage_backend** out) {
    return guarded("devstage_backend_create_cuda", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_cuda", "out");
        *out = nullptr;
        return made(make_cuda_backend(device, library_path), out);
    });
}

devstage_status devstage_backend_create_ascend(int device, const char* library_path, devstage_backend** out) {
    return guarded("devstage_backend_create_ascend", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_ascend", "out");
        *out = nullptr;
        return made(make_ascend_backend(device, library_path), out);
    });
}

devstage_status devstage_backend_create_callbacks(const devstage_callbacks* callbacks, devstage_backend** out) {
    return guarded("devstage_backend_create_callbacks", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_callbacks", "out");
        *out = nullptr;
        if (callbacks == nullptr) return null_argument("devstage_backend_create_callbacks", "callbacks");
        return made(make_callback_backend(*callbacks), out);
    });
}

devstage_status devstage_backend_destroy(devstage_backend* backend) {
    return guarded("devstage_backend_destroy", [&] {
        if (backend == nullptr) return report(Status());
        // The last owner closes the backend here, so the caller hears what was left allocated.
        Status closed;
        if (backend->backend.use_count() == 1) closed = backend->backend->close();
        delete backend;
        return report(closed);
    });
}

devstage_status devstage_backend_get_info(const devstage_backend* backend, devstage_backend_info* info) {
    return on_backend("devstage_backend_get_info", backend, [&](AnyBackend& b) {
        if (info == nullptr) return null_argument("devstage_backend_get_info", "info");
        info->name = b.name().data();  // every backend's name is a null-terminated string
        info->pinned = b.has_pinned() ? 1 : 0;
        info->streams = b.has_streams() ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_device_malloc(devstage_backend* backend, size_t bytes, void** device) {
    return on_backend("devstage_device_malloc", backend, [&](AnyBackend& b) {
        return allocated("devstage_device_malloc", bytes, device, [&](std::size_t n) { return b.device_malloc(n); });
    });
}

devstage_status devstage_device_free(devstage_backend* backend, void* device) {
    return on_backend("devstage_device_free", backend, [&](AnyBackend& b) { return report(b.device_free(device)); });
}

devstage_status devstage_copy_to_device(devstage_backend* backend, void* device_dst, const void* host_src,
                                        size_t bytes) {
    return on_backend("devstage_copy_to_device", backend,
                      [&](AnyBackend& b) { return report(b.copy_to_device(device_dst, host_src, bytes)); });
}

devstage_status devstage_copy_from_device(devstage_backend* backend, void* host_dst, const void* device_src,
                                          size_t bytes) {
    return on_backend("devstage_copy_from_device", backend,
                      [&](AnyBackend& b) { return report(b.copy_from_device(host_dst, device_src, bytes)); });
}

devstage_status devstage_pinned_malloc(devstage_backend* backend, size_t bytes, void** host) {
    return on_backend("devstage_pinned_malloc", backend, [&](AnyBackend& b) {
        return allocated("devstage_pinned_malloc", bytes, host, [&](std::size_t n) { return b.pinned_malloc(n); });
    });
}

devstage_status devstage_pinned_free(devstage_backend* backend, void* host) {
    return on_backend("devstage_pinned_free", backend, [&](AnyBackend& b) { return report(b.pinned_free(host)); });
}

devstage_status devstage_stream_create(devstage_backend* backend, devstage_stream* stream) {
    return on_backend("devstage_stream_create", backend, [&](AnyBackend& b) {
        if (stream == nullptr) return null_argument("devstage_stream_create", "stream");
        return hand_out(b.create_stream(), stream);
    });
}

devstage_status devstage_stream_destroy(devstage_backend* backend, devstage_stream stream) {
    return on_backend("devstage_stream_destroy", backend,
                      [&](AnyBackend& b) { return report(b.destroy_stream(native(stream))); });
}

devstage_status devstage_stream_synchronize(devstage_backend* backend, devstage_stream stream) {
    return on_backend("devstage_stream_synchronize", backend, [&](AnyBackend& b) {
        Result<AnyBackend::Event> event = b.create_event();
        if (!event) return report(event.status());
        Status synchronized = b.record_event(*event, native(stream));
        if (synchronized) synchronized = b.synchronize_event(*event);
        Status destroyed = b.destroy_event(*event);
        return report(!synchronized ? synchronized : destroyed);
    });
}

devstage_status devstage_copy_to_device_async(devstage_backend* backend, void* device_dst, const void* host_src,
                                              size_t bytes, devstage_stream stream) {
    return on_backend("devstage_copy_to_device_async", backend, [&](AnyBackend& b) {
        return report(b.copy_to_device_async(device_dst, host_src, bytes, native(stream)));
    });
}

devstage_status devstage_copy_from_device_async(devstage_backend* backend, void* host_dst, const void* device_src,
                                                size_t bytes, devstage_stream stream) {
    return on_backend("devstage_copy_from_device_async", backend, [&](AnyBackend& b) {
        return report(b.copy_from_device_async(host_dst, device_src, bytes, native(stream)));
    });
}

devstage_status devstage_event_create(devstage_backend* backend, devstage_event* event) {
    return on_backend("devstage_event_create", backend, [&](AnyBackend& b) {
        if (event == nullptr) return null_argument("devstage_event_create", "event");
        return hand_out(b.create_event(), event);
    });
}

devstage_status devstage_event_destroy(devstage_backend* backend, devstage_event event) {
    return on_backend("devstage_event_destroy", backend,
                      [&](AnyBackend& b) { return report(b.destroy_event(native(event))); });
}

devstage_status devstage_event_record(devstage_backend* backend, devstage_event event, devstage_stream stream) {
    return on_backend("devstage_event_record", backend,
                      [&](AnyBackend& b) { return report(b.record_event(native(event), native(stream))); });
}

devstage_status devstage_event_ready(devstage_backend* backend, devstage_event event, int* ready) {
    return on_backend("devstage_event_ready", backend, [&](AnyBackend& b) {
        if (ready == nullptr) return null_argument("devstage_event_ready", "ready");
        Result<bool> answer = b.event_ready(native(event));
        if (!answer) return report(answer.status());
        *ready = *answer ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_event_synchronize(devstage_backend* backend, devstage_event event) {
    return on_backend("devstage_event_synchronize", backend,
                      [&](AnyBackend& b) { return report(b.synchronize_event(native(event))); });
}

devstage_status devstage_stream_wait_event(devstage_backend* backend, devstage_stream stream, devstage_event event) {
    return on_backend("devstage_stream_wait_event", backend,
                      [&](AnyBackend& b) { return report(b.stream_wait_event(native(stream), native(event))); });
}

}  // extern "C"
