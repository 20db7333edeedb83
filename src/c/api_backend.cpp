// SPDX-License-Identifier: Apache-2.0
// The backend entry points of the C interface: making a backend, and its memory, stream and
// event operations. Streams and events are handles of their own, each belonging to the backend
// it was made through.

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "any_backend.hpp"
#include "devstage/c/devstage.h"
#include "devstage/detail/util/message.hpp"
#include "handles.hpp"

using namespace devstage::capi;  // the entry points' helpers
using devstage::Errc;
using devstage::Result;
using devstage::Status;

namespace {

devstage_status made(const char* function, Result<BackendPtr> backend, devstage_backend** out) {
    if (!backend) return report(backend.status());
    auto state = std::make_unique<BackendState>();
    state->backend = std::move(*backend);
    devstage_backend* handle = hand_out(std::move(state));
    if (handle == nullptr) return no_handle(function, HandleKind::backend);
    *out = handle;
    return report(Status());
}

// Runs `operation(state, backend)` on a backend handle that must be live.
template <class Operation>
devstage_status on_backend(const char* function, const devstage_backend* backend, Operation&& operation) noexcept {
    return guarded(function, [&] {
        BackendState* state = find<BackendState>(backend);
        if (state == nullptr) return bad_handle<BackendState>(function, backend);
        return operation(*state, *state->backend);
    });
}

// Allocates `bytes` (> 0) with `allocate` into `*out` (not NULL; NULL on failure).
template <class Allocate>
devstage_status allocated(const char* function, std::size_t bytes, void** out, Allocate&& allocate) {
    if (out == nullptr) return null_argument(function, "the pointer to store the allocation in");
    *out = nullptr;
    if (bytes == 0) {
        return report(
            Status(Errc::invalid_argument,
                   devstage::detail::message(function, ": 0 bytes asked for (a zero-byte tensor needs none)")));
    }
    Result<void*> memory = allocate(bytes);
    if (!memory) return report(memory.status());
    *out = *memory;
    return report(Status());
}

// A stream handle of `state`'s backend, or null after reporting why not.
StreamState* stream_of(const char* function, devstage_stream stream, const BackendState& state,
                       devstage_status& failed) noexcept {
    return checked_stream(function, stream, *state.backend, "", failed);
}

// An event handle of `state`'s backend, or null after reporting why not.
EventState* event_of(const char* function, devstage_event event, const BackendState& state,
                     devstage_status& failed) noexcept {
    EventState* e = find<EventState>(event);
    if (e == nullptr) {
        failed = bad_handle<EventState>(function, event);
        return nullptr;
    }
    if (e->owner->backend.get() != state.backend.get()) {
        failed = foreign(function, "an event", *e->owner->backend, *state.backend, "");
        return nullptr;
    }
    return e;
}

// A new stream handle over `native` (owned: destroyed with the handle).
devstage_status stream_handed_out(const char* function, BackendState& state, AnyBackend::Stream native, bool owned,
                                  devstage_stream* out) {
    auto made_state = std::make_unique<StreamState>(StreamState{&state, native, owned});
    devstage_stream handle = hand_out(std::move(made_state));
    if (handle == nullptr) {
        if (owned) (void)state.backend->destroy_stream(native);
        return no_handle(function, HandleKind::stream);
    }
    state.streams.fetch_add(1, std::memory_order_relaxed);
    *out = handle;
    return report(Status());
}

}  // namespace

extern "C" {

devstage_status devstage_backend_create_sim(size_t device_capacity, devstage_backend** out) {
    return guarded("devstage_backend_create_sim", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_sim", "out");
        *out = nullptr;
        return made("devstage_backend_create_sim", make_sim_backend(0, device_capacity, nullptr), out);
    });
}

devstage_status devstage_backend_create_sim_device(int device, size_t device_capacity, const devstage_backend* host_of,
                                                   devstage_backend** out) {
    constexpr const char* function = "devstage_backend_create_sim_device";
    return guarded(function, [&] {
        if (out == nullptr) return null_argument(function, "out");
        *out = nullptr;
        if (device < 0) {
            return report(Status(Errc::invalid_argument,
                                 devstage::detail::message(function, ": device ", device, " (a device is >= 0)")));
        }
        const devstage::SimHost* host = nullptr;
        if (host_of != nullptr) {
            BackendState* peer = find<BackendState>(host_of);
            if (peer == nullptr) return bad_handle<BackendState>(function, host_of);
            host = peer->backend->sim_host();
            if (host == nullptr) {
                return report(Status(Errc::invalid_argument,
                                     devstage::detail::message(function, ": host_of is backend '",
                                                               peer->backend->name(), "' #", peer->backend->number(),
                                                               ", not a simulator: only simulated devices share a "
                                                               "simulated host")));
            }
        }
        return made(function, make_sim_backend(device, device_capacity, host), out);
    });
}

devstage_status devstage_backend_create_cuda(int device, const char* library_path, devstage_backend** out) {
    return guarded("devstage_backend_create_cuda", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_cuda", "out");
        *out = nullptr;
        return made("devstage_backend_create_cuda", make_cuda_backend(device, library_path), out);
    });
}

devstage_status devstage_backend_create_ascend(int device, const char* library_path, devstage_backend** out) {
    return guarded("devstage_backend_create_ascend", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_ascend", "out");
        *out = nullptr;
        return made("devstage_backend_create_ascend", make_ascend_backend(device, library_path), out);
    });
}

devstage_status devstage_backend_create_callbacks(const devstage_callbacks* callbacks, devstage_backend** out) {
    return guarded("devstage_backend_create_callbacks", [&] {
        if (out == nullptr) return null_argument("devstage_backend_create_callbacks", "out");
        *out = nullptr;
        if (callbacks == nullptr) return null_argument("devstage_backend_create_callbacks", "callbacks");
        return made("devstage_backend_create_callbacks", make_callback_backend(*callbacks), out);
    });
}

devstage_status devstage_backend_destroy(devstage_backend* backend) {
    return guarded("devstage_backend_destroy", [&] {
        if (backend == nullptr) return report(Status());
        BackendState* state = find<BackendState>(backend);
        if (state == nullptr) return bad_handle<BackendState>("devstage_backend_destroy", backend);
        const std::size_t streams = state->streams.load(), events = state->events.load();
        if (streams + events > 0) {
            return report(Status(
                Errc::busy, devstage::detail::message("devstage_backend_destroy: ", backend_label(*state->backend),
                                                      " has ", streams, " stream(s) and ", events,
                                                      " event(s) not destroyed yet; destroy them first (they need the "
                                                      "backend handle)")));
        }
        // The last owner closes the backend here, so the caller hears what was left allocated.
        Status closed;
        if (state->backend.use_count() == 1) closed = state->backend->close();
        take_back(backend, state);
        return report(closed);
    });
}

devstage_status devstage_backend_get_info(const devstage_backend* backend, devstage_backend_info* info) {
    return on_backend("devstage_backend_get_info", backend, [&](BackendState&, AnyBackend& b) {
        if (info == nullptr) return null_argument("devstage_backend_get_info", "info");
        info->name = b.name().data();  // every backend's name is a null-terminated string
        info->pinned = b.has_pinned() ? 1 : 0;
        info->streams = b.has_streams() ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_backend_device(const devstage_backend* backend, int* kind, int* device) {
    return on_backend("devstage_backend_device", backend, [&](BackendState&, AnyBackend& b) {
        if (kind == nullptr) return null_argument("devstage_backend_device", "kind");
        if (device == nullptr) return null_argument("devstage_backend_device", "device");
        *kind = b.kind();
        *device = b.device();
        return report(Status());
    });
}

devstage_status devstage_backend_synchronize(devstage_backend* backend) {
    return on_backend("devstage_backend_synchronize", backend,
                      [&](BackendState&, AnyBackend& b) { return report(b.synchronize()); });
}

devstage_status devstage_device_malloc(devstage_backend* backend, size_t bytes, void** device) {
    return on_backend("devstage_device_malloc", backend, [&](BackendState&, AnyBackend& b) {
        return allocated("devstage_device_malloc", bytes, device, [&](std::size_t n) { return b.device_malloc(n); });
    });
}

devstage_status devstage_device_free(devstage_backend* backend, void* device) {
    return on_backend("devstage_device_free", backend,
                      [&](BackendState&, AnyBackend& b) { return report(b.device_free(device)); });
}

devstage_status devstage_copy_to_device(devstage_backend* backend, void* device_dst, const void* host_src,
                                        size_t bytes) {
    return on_backend("devstage_copy_to_device", backend, [&](BackendState&, AnyBackend& b) {
        return report(b.copy_to_device(device_dst, host_src, bytes));
    });
}

devstage_status devstage_copy_from_device(devstage_backend* backend, void* host_dst, const void* device_src,
                                          size_t bytes) {
    return on_backend("devstage_copy_from_device", backend, [&](BackendState&, AnyBackend& b) {
        return report(b.copy_from_device(host_dst, device_src, bytes));
    });
}

devstage_status devstage_pinned_malloc(devstage_backend* backend, size_t bytes, void** host) {
    return on_backend("devstage_pinned_malloc", backend, [&](BackendState&, AnyBackend& b) {
        return allocated("devstage_pinned_malloc", bytes, host, [&](std::size_t n) { return b.pinned_malloc(n); });
    });
}

devstage_status devstage_pinned_free(devstage_backend* backend, void* host) {
    return on_backend("devstage_pinned_free", backend,
                      [&](BackendState&, AnyBackend& b) { return report(b.pinned_free(host)); });
}

devstage_status devstage_stream_create(devstage_backend* backend, devstage_stream* stream) {
    return on_backend("devstage_stream_create", backend, [&](BackendState& state, AnyBackend& b) {
        if (stream == nullptr) return null_argument("devstage_stream_create", "stream");
        *stream = nullptr;
        Result<AnyBackend::Stream> native = b.create_stream();
        if (!native) return report(native.status());
        return stream_handed_out("devstage_stream_create", state, *native, true, stream);
    });
}

devstage_status devstage_stream_adopt(devstage_backend* backend, void* native, devstage_stream* stream) {
    return on_backend("devstage_stream_adopt", backend, [&](BackendState& state, AnyBackend& b) {
        if (stream == nullptr) return null_argument("devstage_stream_adopt", "stream");
        *stream = nullptr;
        Result<AnyBackend::Stream> adopted = b.adopt_stream(native);
        if (!adopted) return report(adopted.status());
        return stream_handed_out("devstage_stream_adopt", state, *adopted, false, stream);
    });
}

devstage_status devstage_stream_native(devstage_stream stream, void** native) {
    return guarded("devstage_stream_native", [&] {
        if (native == nullptr) return null_argument("devstage_stream_native", "native");
        StreamState* s = find<StreamState>(stream);
        if (s == nullptr) return bad_handle<StreamState>("devstage_stream_native", stream);
        *native = s->native.handle;
        return report(Status());
    });
}

devstage_status devstage_stream_destroy(devstage_backend* backend, devstage_stream stream) {
    return on_backend("devstage_stream_destroy", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        StreamState* s = stream_of("devstage_stream_destroy", stream, state, failed);
        if (s == nullptr) return failed;
        const Status destroyed = s->owned ? b.destroy_stream(s->native) : Status();
        take_back(stream, s);
        state.streams.fetch_sub(1, std::memory_order_relaxed);
        return report(destroyed);
    });
}

devstage_status devstage_stream_synchronize(devstage_backend* backend, devstage_stream stream) {
    return on_backend("devstage_stream_synchronize", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        StreamState* s = stream_of("devstage_stream_synchronize", stream, state, failed);
        if (s == nullptr) return failed;
        Result<AnyBackend::Event> event = b.create_event();
        if (!event) return report(event.status());
        Status synchronized = b.record_event(*event, s->native);
        if (synchronized) synchronized = b.synchronize_event(*event);
        Status destroyed = b.destroy_event(*event);
        return report(!synchronized ? synchronized : destroyed);
    });
}

devstage_status devstage_copy_to_device_async(devstage_backend* backend, void* device_dst, const void* host_src,
                                              size_t bytes, devstage_stream stream) {
    return on_backend("devstage_copy_to_device_async", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        StreamState* s = stream_of("devstage_copy_to_device_async", stream, state, failed);
        if (s == nullptr) return failed;
        return report(b.copy_to_device_async(device_dst, host_src, bytes, s->native));
    });
}

devstage_status devstage_copy_from_device_async(devstage_backend* backend, void* host_dst, const void* device_src,
                                                size_t bytes, devstage_stream stream) {
    return on_backend("devstage_copy_from_device_async", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        StreamState* s = stream_of("devstage_copy_from_device_async", stream, state, failed);
        if (s == nullptr) return failed;
        return report(b.copy_from_device_async(host_dst, device_src, bytes, s->native));
    });
}

devstage_status devstage_event_create(devstage_backend* backend, devstage_event* event) {
    return on_backend("devstage_event_create", backend, [&](BackendState& state, AnyBackend& b) {
        if (event == nullptr) return null_argument("devstage_event_create", "event");
        *event = nullptr;
        Result<AnyBackend::Event> native = b.create_event();
        if (!native) return report(native.status());
        devstage_event handle = hand_out(std::make_unique<EventState>(EventState{&state, *native}));
        if (handle == nullptr) {
            (void)b.destroy_event(*native);
            return no_handle("devstage_event_create", HandleKind::event);
        }
        state.events.fetch_add(1, std::memory_order_relaxed);
        *event = handle;
        return report(Status());
    });
}

devstage_status devstage_event_destroy(devstage_backend* backend, devstage_event event) {
    return on_backend("devstage_event_destroy", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        EventState* e = event_of("devstage_event_destroy", event, state, failed);
        if (e == nullptr) return failed;
        const Status destroyed = b.destroy_event(e->native);
        take_back(event, e);
        state.events.fetch_sub(1, std::memory_order_relaxed);
        return report(destroyed);
    });
}

devstage_status devstage_event_record(devstage_backend* backend, devstage_event event, devstage_stream stream) {
    return on_backend("devstage_event_record", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        EventState* e = event_of("devstage_event_record", event, state, failed);
        if (e == nullptr) return failed;
        StreamState* s = stream_of("devstage_event_record", stream, state, failed);
        if (s == nullptr) return failed;
        return report(b.record_event(e->native, s->native));
    });
}

devstage_status devstage_event_ready(devstage_backend* backend, devstage_event event, int* ready) {
    return on_backend("devstage_event_ready", backend, [&](BackendState& state, AnyBackend& b) {
        if (ready == nullptr) return null_argument("devstage_event_ready", "ready");
        devstage_status failed = DEVSTAGE_OK;
        EventState* e = event_of("devstage_event_ready", event, state, failed);
        if (e == nullptr) return failed;
        Result<bool> answer = b.event_ready(e->native);
        if (!answer) return report(answer.status());
        *ready = *answer ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_event_synchronize(devstage_backend* backend, devstage_event event) {
    return on_backend("devstage_event_synchronize", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        EventState* e = event_of("devstage_event_synchronize", event, state, failed);
        if (e == nullptr) return failed;
        return report(b.synchronize_event(e->native));
    });
}

devstage_status devstage_stream_wait_event(devstage_backend* backend, devstage_stream stream, devstage_event event) {
    return on_backend("devstage_stream_wait_event", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        StreamState* s = stream_of("devstage_stream_wait_event", stream, state, failed);
        if (s == nullptr) return failed;
        EventState* e = event_of("devstage_stream_wait_event", event, state, failed);
        if (e == nullptr) return failed;
        return report(b.stream_wait_event(s->native, e->native));
    });
}

devstage_status devstage_launch_host_function(devstage_backend* backend, devstage_stream stream,
                                              devstage_host_function fn, void* user) {
    return on_backend("devstage_launch_host_function", backend, [&](BackendState& state, AnyBackend& b) {
        devstage_status failed = DEVSTAGE_OK;
        StreamState* s = stream_of("devstage_launch_host_function", stream, state, failed);
        if (s == nullptr) return failed;
        if (fn == nullptr) return null_argument("devstage_launch_host_function", "fn");
        return report(b.launch_host_function(s->native, fn, user));
    });
}

devstage_status devstage_host_register(devstage_backend* backend, void* host, size_t bytes) {
    return on_backend("devstage_host_register", backend,
                      [&](BackendState&, AnyBackend& b) { return report(b.host_register(host, bytes)); });
}

devstage_status devstage_host_unregister(devstage_backend* backend, void* host) {
    return on_backend("devstage_host_unregister", backend,
                      [&](BackendState&, AnyBackend& b) { return report(b.host_unregister(host)); });
}

}  // extern "C"
