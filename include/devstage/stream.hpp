// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// SynchronousAdapter: any Backend seen as an AsyncBackend whose one stream is immediate —
/// every enqueued copy has completed when the call returns, every event is ready. The Stager
/// runs synchronous backends through it, so there is one staging path, not two.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "devstage/backend.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// The stream of a SynchronousAdapter: work on it completes before the enqueuing call returns.
struct ImmediateStream {
    friend constexpr bool operator==(ImmediateStream, ImmediateStream) noexcept { return true; }
};

/// The event of a SynchronousAdapter: always ready.
struct ImmediateEvent {};

/// A Backend with an immediate stream. `SynchronousAdapter<MyBackend> async(my_backend);`
/// Stream operations never fail except where the underlying copy fails; the adapter owns no
/// resources, so it is as cheap to copy as a pointer.
template <Backend B>
class SynchronousAdapter {
public:
    using Stream = ImmediateStream;
    using Event = ImmediateEvent;
    static constexpr std::size_t device_alignment = B::device_alignment;

    explicit SynchronousAdapter(B& backend) noexcept : backend_(&backend) {}

    B& underlying() const noexcept { return *backend_; }
    std::string_view name() const noexcept { return backend_->name(); }
    Result<void*> device_malloc(std::size_t bytes) noexcept { return backend_->device_malloc(bytes); }
    Status device_free(void* pointer) noexcept { return backend_->device_free(pointer); }
    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        return backend_->copy_to_device(device_dst, host_src, bytes);
    }
    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        return backend_->copy_from_device(host_dst, device_src, bytes);
    }

    Result<Stream> create_stream() noexcept { return Stream{}; }
    Status destroy_stream(Stream /*stream*/) noexcept { return {}; }
    Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, Stream /*s*/) noexcept {
        return backend_->copy_to_device(device_dst, host_src, bytes);
    }
    Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes, Stream /*s*/) noexcept {
        return backend_->copy_from_device(host_dst, device_src, bytes);
    }
    /// Where the backend has device_memset.
    Status device_memset_async(void* device_dst, int value, std::size_t bytes,
                               Stream /*s*/) noexcept requires MemsetBackend<B> {
        return backend_->device_memset(device_dst, value, bytes);
    }
    Result<Event> create_event() noexcept { return Event{}; }
    Status destroy_event(Event /*event*/) noexcept { return {}; }
    Status record_event(Event /*event*/, Stream /*stream*/) noexcept { return {}; }
    Result<bool> event_ready(Event /*event*/) noexcept { return true; }
    Status synchronize_event(Event /*event*/) noexcept { return {}; }
    Status stream_wait_event(Stream /*stream*/, Event /*event*/) noexcept { return {}; }

private:
    B* backend_;
};

/// The stream-ordered view of a backend: the backend itself when it is an AsyncBackend,
/// otherwise its SynchronousAdapter.
template <Backend B>
using stream_backend_t = std::conditional_t<AsyncBackend<B>, B, SynchronousAdapter<B>>;

/// True when a stream-ordered backend's streams complete work before the call returns.
template <class A>
inline constexpr bool is_immediate_v = std::is_same_v<typename A::Stream, ImmediateStream>;

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
