// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: the one backend type the C library's stagers and pinned pools are
// instantiated on. Each C backend handle holds one AnyBackend: a concrete backend (SimBackend,
// CudaBackend, AscendBackend) wrapped by Wrapped<B>, or the runtime callbacks of a C caller.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "devstage/backend.hpp"
#include "devstage/c/devstage.h"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage {
class SimHost;
}  // namespace devstage

namespace devstage::capi {

/// A Backend, PinnedHostBackend and AsyncBackend whose operations are virtual. Streams and
/// events are the runtime's handles as `void*`. A backend without pinned memory answers
/// not_supported to pinned_malloc (has_pinned() tells first); one without streams hands out
/// immediate ones (has_streams() is false). Thread-safe where the runtime is.
class AnyBackend {
public:
    /// The alignment every runtime honours; the strategies align their slices to 1024 and ask
    /// for slack only when an allocation comes back misaligned.
    static constexpr std::size_t device_alignment = 1;

    struct Stream {
        void* handle = nullptr;
        friend bool operator==(Stream, Stream) = default;
    };
    struct Event {
        void* handle = nullptr;
        friend bool operator==(Event, Event) = default;
    };

    AnyBackend() noexcept : number_(next_number()) {}
    AnyBackend(const AnyBackend&) = delete;
    AnyBackend& operator=(const AnyBackend&) = delete;
    virtual ~AnyBackend() = default;

    virtual std::string_view name() const noexcept = 0;
    virtual bool has_pinned() const noexcept = 0;
    virtual bool has_streams() const noexcept = 0;
    /// ImmediateStreamsQuery: without real streams every enqueued copy is done at the call.
    bool streams_immediate() const noexcept { return !has_streams(); }
    /// A DEVSTAGE_BACKEND_* value, and the device id (0 for callbacks).
    virtual int kind() const noexcept = 0;
    virtual int device() const noexcept { return 0; }
    /// The simulated host a simulator device belongs to; null for every other backend.
    virtual const SimHost* sim_host() const noexcept { return nullptr; }
    /// This backend's number among those the process made (from 1), for messages.
    std::uint64_t number() const noexcept { return number_; }

    virtual Result<void*> device_malloc(std::size_t bytes) noexcept = 0;
    virtual Status device_free(void* pointer) noexcept = 0;
    virtual Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept = 0;
    virtual Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept = 0;
    virtual Result<void*> pinned_malloc(std::size_t bytes) noexcept = 0;
    virtual Status pinned_free(void* pointer) noexcept = 0;

    virtual Result<Stream> create_stream() noexcept = 0;
    virtual Status destroy_stream(Stream stream) noexcept = 0;
    virtual Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes,
                                        Stream stream) noexcept = 0;
    virtual Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes,
                                          Stream stream) noexcept = 0;
    virtual Result<Event> create_event() noexcept = 0;
    virtual Status destroy_event(Event event) noexcept = 0;
    virtual Status record_event(Event event, Stream stream) noexcept = 0;
    virtual Result<bool> event_ready(Event event) noexcept = 0;
    virtual Status synchronize_event(Event event) noexcept = 0;
    virtual Status stream_wait_event(Stream stream, Event event) noexcept = 0;
    /// Sets device memory on `stream` (the stagers zero Out args with it); a backend that
    /// cannot uploads zeros there instead, so only `value` 0 is sure to work everywhere.
    virtual Status device_memset_async(void* device_dst, int value, std::size_t bytes, Stream stream) noexcept = 0;

    /// Batches of copies (BatchCopyBackend): the most one call on `stream` takes, 0 without.
    virtual std::size_t batch_copy_limit(Stream stream) const noexcept = 0;
    virtual Status copy_to_device_batch(void* const* device_dsts, const void* const* host_srcs,
                                        const std::size_t* sizes, std::size_t count, Stream stream) noexcept = 0;
    virtual Status copy_from_device_batch(void* const* host_dsts, const void* const* device_srcs,
                                          const std::size_t* sizes, std::size_t count, Stream stream) noexcept = 0;

    /// A stream of the runtime's own, `native` (null: the runtime's default stream), as a Stream;
    /// devstage never destroys it. not_supported where there is no default stream; a native
    /// value the backend can tell is not one of its streams is invalid_argument.
    virtual Result<Stream> adopt_stream(void* native) noexcept = 0;
    /// StreamCheckBackend: whether this backend's device may use `stream` (ok unless the backend
    /// can tell it is another device's).
    virtual Status check_stream(Stream /*stream*/) noexcept { return {}; }
    /// Enqueues `function(user)` on `stream` (HostFunctionBackend); not_supported without.
    virtual Status launch_host_function(Stream stream, HostFunction function, void* user) noexcept = 0;
    /// Pins existing host memory in place (HostRegisterBackend); not_supported without.
    virtual Status host_register(void* host, std::size_t bytes) noexcept = 0;
    virtual Status host_unregister(void* host) noexcept = 0;
    /// Waits until the device is idle (SynchronizingBackend); not_supported without. The stagers
    /// use it to recover from a wait for one slot's work that failed.
    virtual Status synchronize() noexcept = 0;

    /// Virtual memory for in-place growth (VirtualMemoryBackend; RetainedVmm stagers): where the
    /// backend has none, has_vmm() is false, the granularity 0 and every call not_supported.
    using PhysicalHandle = void*;
    virtual bool has_vmm() const noexcept { return false; }
    virtual std::size_t vmm_granularity() const noexcept { return 0; }
    virtual Result<void*> vmm_reserve(std::size_t /*bytes*/) noexcept { return lacks("virtual memory"); }
    virtual Status vmm_release(void* /*va*/) noexcept { return lacks("virtual memory"); }
    virtual Result<PhysicalHandle> vmm_create(std::size_t /*bytes*/) noexcept { return lacks("virtual memory"); }
    virtual Status vmm_free(PhysicalHandle /*handle*/) noexcept { return lacks("virtual memory"); }
    virtual Status vmm_map(void* /*va*/, std::size_t /*bytes*/, PhysicalHandle /*handle*/) noexcept {
        return lacks("virtual memory");
    }
    virtual Status vmm_unmap(void* /*va*/, std::size_t /*bytes*/) noexcept { return lacks("virtual memory"); }

    /// Pinned memory mapped for the device (MappedHostBackend; stagers with map_small): where
    /// the backend cannot map, map_host is not_supported and such a stager copies instead. 4 KiB,
    /// the strictest alignment a runtime asks (ACL's), serves every backend.
    static constexpr std::size_t host_map_alignment = 4096;
    virtual Result<void*> map_host(void* /*host*/, std::size_t /*bytes*/) noexcept {
        return lacks("pinned memory mapped for the device");
    }
    virtual Status unmap_host(void* /*host*/) noexcept { return lacks("pinned memory mapped for the device"); }

    /// What is still allocated through this backend and was never freed, as a leaked Status
    /// (ok when nothing is); the callback backend frees it first. Called once, before destruction.
    virtual Status close() noexcept { return {}; }

protected:
    Status lacks(const char* what) const noexcept {
        return Status(Errc::not_supported, detail::message("backend '", name(), "' #", number(), " has no ", what));
    }

private:
    static std::uint64_t next_number() noexcept {
        static std::atomic<std::uint64_t> made{0};
        return made.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    std::uint64_t number_;
};

static_assert(Backend<AnyBackend>);
static_assert(PinnedHostBackend<AnyBackend>);
static_assert(AsyncBackend<AnyBackend>);
static_assert(AsyncMemsetBackend<AnyBackend>);
static_assert(SynchronizingBackend<AnyBackend>);
static_assert(BatchCopyBackend<AnyBackend>);
static_assert(ImmediateStreamsQuery<AnyBackend>);
static_assert(StreamCheckBackend<AnyBackend>);
static_assert(VirtualMemoryBackend<AnyBackend>);
static_assert(MappedHostBackend<AnyBackend>);

/// Shared by the C handles made from a backend: the last owner closes it (a leak report goes to
/// stderr then) and destroys it.
using BackendPtr = std::shared_ptr<AnyBackend>;

/// Owns `backend` (not null). Throws std::bad_alloc, after destroying it, when no host memory
/// is left for the shared state.
inline BackendPtr share(AnyBackend* backend) {
    return BackendPtr(backend, [](AnyBackend* owned) noexcept {
        if (Status closed = owned->close(); !closed) stderr_error_sink(closed);
        delete owned;
    });
}

/// The backends a C caller can choose at run time. They throw std::bad_alloc when host memory
/// runs out (the C entry points turn it into DEVSTAGE_OUT_OF_MEMORY).
/// Device `device` of `host` (null: a host of its own).
Result<BackendPtr> make_sim_backend(int device, std::size_t device_capacity, const SimHost* host);
Result<BackendPtr> make_cuda_backend(int device, const char* library_path);
Result<BackendPtr> make_ascend_backend(int device, const char* library_path);
Result<BackendPtr> make_callback_backend(const devstage_callbacks& callbacks);

}  // namespace devstage::capi
