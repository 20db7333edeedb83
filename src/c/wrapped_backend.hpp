// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: a concrete devstage backend seen as an AnyBackend. Its Stream and
// Event handles (a runtime pointer, or the simulator's id) travel as `void*`, bit for bit.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>

#include "any_backend.hpp"
#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::capi {

/// A handle of `H` (at most pointer-sized, trivially copyable) as a `void*`, and back.
template <class H>
void* to_pointer(H handle) noexcept {
    static_assert(sizeof(H) <= sizeof(void*) && std::is_trivially_copyable_v<H>);
    std::uintptr_t bits = 0;
    std::memcpy(&bits, &handle, sizeof handle);
    return reinterpret_cast<void*>(bits);  // NOLINT(performance-no-int-to-ptr): a handle, never dereferenced
}
template <class H>
H from_pointer(void* pointer) noexcept {
    static_assert(sizeof(H) <= sizeof(void*) && std::is_trivially_copyable_v<H>);
    const auto bits = reinterpret_cast<std::uintptr_t>(pointer);
    H handle{};
    std::memcpy(static_cast<void*>(&handle), &bits, sizeof handle);  // trivially copyable: bit for bit
    return handle;
}

/// `B` (a PinnedHostBackend and AsyncMemsetBackend) behind AnyBackend.
template <class B>
class Wrapped final : public AnyBackend {
    static_assert(PinnedHostBackend<B> && AsyncMemsetBackend<B>);
    using S = typename B::Stream;
    using E = typename B::Event;

public:
    /// `kind`: the DEVSTAGE_BACKEND_* value of B.
    Wrapped(int kind, B&& backend) noexcept : kind_(kind), backend_(std::move(backend)) {}
    template <class... Args>
    Wrapped(int kind, std::in_place_t /*tag*/, Args&&... args) noexcept
        : kind_(kind), backend_(std::forward<Args>(args)...) {}

    std::string_view name() const noexcept override { return backend_.name(); }
    bool has_pinned() const noexcept override { return true; }
    bool has_streams() const noexcept override { return true; }
    int kind() const noexcept override { return kind_; }
    int device() const noexcept override {
        if constexpr (requires(const B& b) { b.device_id(); }) {
            return static_cast<int>(backend_.device_id());
        } else {
            return 0;
        }
    }

    const SimHost* sim_host() const noexcept override {
        if constexpr (requires(const B& b) { b.host(); }) {
            return &backend_.host();
        } else {
            return nullptr;
        }
    }

    Result<void*> device_malloc(std::size_t bytes) noexcept override { return backend_.device_malloc(bytes); }
    Status device_free(void* pointer) noexcept override { return backend_.device_free(pointer); }
    Status copy_to_device(void* dst, const void* src, std::size_t bytes) noexcept override {
        return backend_.copy_to_device(dst, src, bytes);
    }
    Status copy_from_device(void* dst, const void* src, std::size_t bytes) noexcept override {
        return backend_.copy_from_device(dst, src, bytes);
    }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept override { return backend_.pinned_malloc(bytes); }
    Status pinned_free(void* pointer) noexcept override { return backend_.pinned_free(pointer); }

    Result<Stream> create_stream() noexcept override {
        Result<S> stream = backend_.create_stream();
        if (!stream) return stream.status();
        return Stream{to_pointer(*stream)};
    }
    Status destroy_stream(Stream stream) noexcept override { return backend_.destroy_stream(native(stream)); }
    Status copy_to_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept override {
        return backend_.copy_to_device_async(dst, src, bytes, native(stream));
    }
    Status copy_from_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept override {
        return backend_.copy_from_device_async(dst, src, bytes, native(stream));
    }
    Result<Event> create_event() noexcept override {
        Result<E> event = backend_.create_event();
        if (!event) return event.status();
        return Event{to_pointer(*event)};
    }
    Status destroy_event(Event event) noexcept override { return backend_.destroy_event(native(event)); }
    Status record_event(Event event, Stream stream) noexcept override {
        return backend_.record_event(native(event), native(stream));
    }
    Result<bool> event_ready(Event event) noexcept override { return backend_.event_ready(native(event)); }
    Status synchronize_event(Event event) noexcept override { return backend_.synchronize_event(native(event)); }
    Status stream_wait_event(Stream stream, Event event) noexcept override {
        return backend_.stream_wait_event(native(stream), native(event));
    }
    Status device_memset_async(void* dst, int value, std::size_t bytes, Stream stream) noexcept override {
        return backend_.device_memset_async(dst, value, bytes, native(stream));
    }

    std::size_t batch_copy_limit(Stream stream) const noexcept override {
        if constexpr (BatchCopyBackend<B>) {
            return backend_.batch_copy_limit(native(stream));
        } else {
            return 0;
        }
    }
    Status copy_to_device_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                                Stream stream) noexcept override {
        if constexpr (BatchCopyBackend<B>) {
            return backend_.copy_to_device_batch(dsts, srcs, sizes, count, native(stream));
        } else {
            return unsupported("batches of copies");
        }
    }
    Status copy_from_device_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                  std::size_t count, Stream stream) noexcept override {
        if constexpr (BatchCopyBackend<B>) {
            return backend_.copy_from_device_batch(dsts, srcs, sizes, count, native(stream));
        } else {
            return unsupported("batches of copies");
        }
    }

    // A backend that can tell its streams (the simulator) checks a native value and has no
    // default stream; the runtimes take any value, null being their default stream.
    Status check_stream(Stream stream) noexcept override {
        if constexpr (StreamCheckBackend<B>) {
            return backend_.check_stream(native(stream));
        } else {
            return {};
        }
    }
    Result<Stream> adopt_stream(void* native_stream) noexcept override {
        if constexpr (requires(B & b, S s) { b.has_stream(s); }) {
            if (native_stream == nullptr) {
                return Status(Errc::not_supported,
                              detail::message("backend '", name(), "' #", number(), " has no default stream to adopt"));
            }
            if (!backend_.has_stream(from_pointer<S>(native_stream))) {
                return Status(Errc::invalid_argument,
                              detail::message("backend '", name(), "' #", number(), ": ", native_stream,
                                              " is not one of its live streams"));
            }
        }
        return Stream{native_stream};
    }
    Status launch_host_function(Stream stream, HostFunction function, void* user) noexcept override {
        if constexpr (HostFunctionBackend<B>) {
            if (function == nullptr) {
                return Status(Errc::invalid_argument,
                              detail::message("backend '", name(), "' #", number(), ": a null host function"));
            }
            return backend_.launch_host_func(native(stream), function, user);
        } else {
            return unsupported("host functions on streams");
        }
    }
    Status host_register(void* host, std::size_t bytes) noexcept override {
        if constexpr (HostRegisterBackend<B>) {
            return backend_.host_register(host, bytes);
        } else {
            return unsupported("pinning existing host memory in place");
        }
    }
    Status host_unregister(void* host) noexcept override {
        if constexpr (HostRegisterBackend<B>) {
            return backend_.host_unregister(host);
        } else {
            return unsupported("pinning existing host memory in place");
        }
    }
    Status synchronize() noexcept override {
        if constexpr (SynchronizingBackend<B>) {
            return backend_.synchronize();
        } else {
            return unsupported("a device-wide synchronize");
        }
    }

    bool has_vmm() const noexcept override { return VirtualMemoryBackend<B>; }
    std::size_t vmm_granularity() const noexcept override {
        if constexpr (VirtualMemoryBackend<B>) return backend_.vmm_granularity();
        return 0;
    }
    Result<void*> vmm_reserve(std::size_t bytes) noexcept override {
        if constexpr (VirtualMemoryBackend<B>) return backend_.vmm_reserve(bytes);
        return unsupported("virtual memory");
    }
    Status vmm_release(void* va) noexcept override {
        if constexpr (VirtualMemoryBackend<B>) return backend_.vmm_release(va);
        return unsupported("virtual memory");
    }
    Result<PhysicalHandle> vmm_create(std::size_t bytes) noexcept override {
        if constexpr (VirtualMemoryBackend<B>) {
            auto handle = backend_.vmm_create(bytes);
            if (!handle) return handle.status();
            return to_pointer(*handle);
        }
        return unsupported("virtual memory");
    }
    Status vmm_free(PhysicalHandle handle) noexcept override {
        if constexpr (VirtualMemoryBackend<B>) {
            return backend_.vmm_free(from_pointer<typename B::PhysicalHandle>(handle));
        }
        return unsupported("virtual memory");
    }
    Status vmm_map(void* va, std::size_t bytes, PhysicalHandle handle) noexcept override {
        if constexpr (VirtualMemoryBackend<B>) {
            return backend_.vmm_map(va, bytes, from_pointer<typename B::PhysicalHandle>(handle));
        }
        return unsupported("virtual memory");
    }
    Status vmm_unmap(void* va, std::size_t bytes) noexcept override {
        if constexpr (VirtualMemoryBackend<B>) return backend_.vmm_unmap(va, bytes);
        return unsupported("virtual memory");
    }
    Result<void*> map_host(void* host, std::size_t bytes) noexcept override {
        if constexpr (MappedHostBackend<B>) return backend_.map_host(host, bytes);
        return unsupported("pinned memory mapped for the device");
    }
    Status unmap_host(void* host) noexcept override {
        if constexpr (MappedHostBackend<B>) return backend_.unmap_host(host);
        return unsupported("pinned memory mapped for the device");
    }

private:
    Status unsupported(const char* what) const noexcept {
        return Status(Errc::not_supported, detail::message("backend '", name(), "' #", number(), " has no ", what));
    }

    static S native(Stream stream) noexcept { return from_pointer<S>(stream.handle); }
    static E native(Event event) noexcept { return from_pointer<E>(event.handle); }

    int kind_;
    B backend_;
};

}  // namespace devstage::capi
