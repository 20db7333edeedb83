// SPDX-License-Identifier: Apache-2.0
#pragma once
// Backends that miss exactly one required operation, for the concept's negative tests.

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "devstage/status.hpp"

namespace devstage::test {

enum class Missing {
    nothing,
    name,
    device_malloc,
    device_free,
    copy_to_device,
    copy_from_device,
    pinned_malloc,
    pinned_free
};

template <Missing M>
struct FakeBackend {
    static constexpr std::size_t device_alignment = 64;
    std::string_view name() const noexcept requires(M != Missing::name) { return "fake"; }
    Result<void*> device_malloc(std::size_t) noexcept requires(M != Missing::device_malloc) {
        return Status(Errc::out_of_memory, "fake");
    }
    Status device_free(void*) noexcept requires(M != Missing::device_free) { return {}; }
    Status copy_to_device(void*, const void*, std::size_t) noexcept requires(M != Missing::copy_to_device) {
        return {};
    }
    Status copy_from_device(void*, const void*, std::size_t) noexcept requires(M != Missing::copy_from_device) {
        return {};
    }
    Result<void*> pinned_malloc(std::size_t) noexcept requires(M != Missing::pinned_malloc) {
        return Status(Errc::out_of_memory, "fake");
    }
    Status pinned_free(void*) noexcept requires(M != Missing::pinned_free) { return {}; }
};

/// Operations of AsyncBackend, for its negative tests.
enum class MissingAsync {
    nothing,
    stream_type,
    create_stream,
    destroy_stream,
    copy_to_device_async,
    copy_from_device_async,
    create_event,
    destroy_event,
    record_event,
    event_ready,
    synchronize_event,
    stream_wait_event,
    same_handles,  // Stream and Event are one type
};

struct FakeStream {
    void* handle = nullptr;
    friend bool operator==(FakeStream, FakeStream) = default;
};
struct FakeEvent {
    void* handle = nullptr;
};

template <MissingAsync M>
struct FakeAsyncBackend : FakeBackend<Missing::nothing> {
    using Stream = std::conditional_t<M == MissingAsync::stream_type, void, FakeStream>;
    using Event = std::conditional_t<M == MissingAsync::same_handles, FakeStream, FakeEvent>;
    using S = std::conditional_t<M == MissingAsync::stream_type, FakeStream, Stream>;

    Result<S> create_stream() noexcept requires(M != MissingAsync::create_stream) { return S{}; }
    Status destroy_stream(S) noexcept requires(M != MissingAsync::destroy_stream) { return {}; }
    Status copy_to_device_async(void*, const void*, std::size_t, S) noexcept
        requires(M != MissingAsync::copy_to_device_async) {
        return {};
    }
    Status copy_from_device_async(void*, const void*, std::size_t, S) noexcept
        requires(M != MissingAsync::copy_from_device_async) {
        return {};
    }
    Result<Event> create_event() noexcept requires(M != MissingAsync::create_event) { return Event{}; }
    Status destroy_event(Event) noexcept requires(M != MissingAsync::destroy_event) { return {}; }
    Status record_event(Event, S) noexcept requires(M != MissingAsync::record_event) { return {}; }
    Result<bool> event_ready(Event) noexcept requires(M != MissingAsync::event_ready) { return true; }
    Status synchronize_event(Event) noexcept requires(M != MissingAsync::synchronize_event) { return {}; }
    Status stream_wait_event(S, Event) noexcept requires(M != MissingAsync::stream_wait_event) { return {}; }
};

}  // namespace devstage::test
