// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// AscendBackend: Huawei Ascend NPUs through the CANN ACL runtime, loaded at run time with
/// dlopen — no CANN header or library is needed to compile. Bound to one device: it makes its
/// own context current before every call, so the calling thread's current device never
/// decides where memory goes. Streams and events are ACL's, made in that context.
/// The header to include; its parts: ascend_abi.hpp (the C ABI subset it declares: acl) and
/// backends/detail/acl_events.hpp (its event records).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/backends/ascend_abi.hpp"
#include "devstage/backends/detail/acl_events.hpp"
#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/backends/detail/runtime_call.hpp"
#include "devstage/backends/detail/stream_owners.hpp"
#include "devstage/backends/detail/teardown_list.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage {

/// One Ascend device through libascendcl. `auto npu = AscendBackend::create(0); if (!npu) …`
/// Move-only. Thread-safe as ACL is: every call first makes this backend's context current
/// on the calling thread.
class AscendBackend {
public:
    /// aclrtMalloc guarantees 64 bytes; the strategies align their own slices to 1024.
    static constexpr std::size_t device_alignment = 64;
    /// The most a pinned pool asks of one aclrtMallocHost: 128 GiB. One call above about
    /// 200 GB fails with 207001 (ACL_ERROR_RT_MEMORY_ALLOCATION); ACL cannot pin existing memory
    /// for copies, so a bigger region cannot be registered in chunks either.
    static constexpr std::size_t pinned_malloc_limit = std::size_t{128} << 30;

    /// An ACL stream (aclrtStream), made in this backend's context; the caller destroys it.
    struct Stream {
        acl::aclrtStream handle = nullptr;
        friend bool operator==(Stream, Stream) = default;
    };
    /// An ACL event made by create_event (which allocates its small bookkeeping; destroy_event
    /// frees it, and the backend's destruction frees what was never destroyed — as destroying
    /// the context does the ACL events in it). `handle()` is the aclrtEvent.
    struct Event {
        detail::AclEvent* state = nullptr;
        acl::aclrtEvent handle() const noexcept { return state != nullptr ? state->handle : nullptr; }
        friend bool operator==(Event, Event) = default;
    };
    using PhysicalHandle = acl::aclrtDrvMemHandle;

    /// Loads ACL (`library_path`, else $DEVSTAGE_ACL_LIBRARY, else libascendcl.so then
    /// libascendcl.so.1), initializes it, opens `device_id` and creates this backend's context.
    static Result<AscendBackend> create(std::int32_t device_id, std::string library_path = {}) noexcept {
        Result<detail::DynamicLibrary> library = detail::DynamicLibrary::open(
            std::move(library_path), "DEVSTAGE_ACL_LIBRARY", {"libascendcl.so", "libascendcl.so.1"});
        if (!library) return Status(Errc::library_not_found, detail::message("ascend: ", library.status().message()));
        AscendBackend backend;
        backend.library_ = std::move(*library);
        backend.device_ = device_id;
        backend.teardown_ = std::unique_ptr<detail::TeardownList>(new (std::nothrow) detail::TeardownList);
        if (backend.teardown_ == nullptr) {
            return Status(Errc::out_of_memory, "ascend: host memory exhausted making the backend");
        }
        if (Status resolved = backend.resolve(); !resolved) return resolved;
        const acl::aclError init = backend.api_.init(nullptr);
        if (init != acl::success && init != acl::repeat_initialize) {
            return detail::call_failure(backend.errors_, backend.site(), "aclInit", init, 0);
        }
        if (Status s = backend.unbound_call("aclrtSetDevice", backend.api_.set_device, 0, device_id); !s) return s;
        backend.device_open_ = true;
        if (Status s = backend.unbound_call("aclrtCreateContext", backend.api_.create_context, 0, &backend.context_,
                                            device_id);
            !s) {
            return s;
        }
        backend.probe_vmm();
        detail::resolve_acl_batch(backend.library_, backend.batch_);
        detail::resolve_acl_mapped(backend.library_, backend.mapped_);
        return backend;
    }

    AscendBackend(AscendBackend&& other) noexcept
        : library_(std::move(other.library_)),
          api_(other.api_),
          errors_(other.errors_),
          device_(other.device_),
          context_(std::exchange(other.context_, nullptr)),
          device_open_(std::exchange(other.device_open_, false)),
          vmm_(other.vmm_),
          granularity_(other.granularity_),
          batch_(other.batch_),
          mapped_(other.mapped_),
          events_(std::move(other.events_)),
          teardown_(std::move(other.teardown_)) {}
    AscendBackend& operator=(AscendBackend&&) = delete;
    AscendBackend(const AscendBackend&) = delete;
    AscendBackend& operator=(const AscendBackend&) = delete;
    /// Runs the teardown hooks first (TeardownBackend: pinned pools give back their memory and
    /// destroy their events while the context is alive), then destroys the events never
    /// destroyed, the context (and with it any stream still in it) and releases the device
    /// (aclFinalize is left to the process: other backends may still use ACL).
    ~AscendBackend() {
        if (context_ != nullptr && teardown_) teardown_->run_all();
        if (context_ != nullptr) {
            events_.destroy_all(
                [this](acl::aclrtEvent handle) { (void)call("aclrtDestroyEvent", api_.destroy_event, 0, handle); });
            (void)api_.destroy_context(context_);
        }
        if (device_open_) (void)api_.reset_device(device_);
    }

    /// TeardownBackend: `hook` runs before the backend resets its device.
    Result<std::uint64_t> add_teardown_hook(TeardownHook hook) noexcept {
        if (!teardown_) return Status(Errc::invalid_argument, "ascend add_teardown_hook: a moved-from backend");
        return teardown_->add(hook, name());
    }
    void remove_teardown_hook(std::uint64_t id) noexcept {
        if (teardown_) teardown_->remove(id);
    }

    std::string_view name() const noexcept { return "ascend"; }
    std::int32_t device_id() const noexcept { return device_; }
    const std::string& library_path() const noexcept { return library_.path(); }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        void* pointer = nullptr;
        if (Status s = call("aclrtMalloc", api_.malloc, bytes, &pointer, bytes, acl::mem_malloc_huge_first); !s) {
            return s;
        }
        return pointer;
    }
    Status device_free(void* pointer) noexcept { return call("aclrtFree", api_.free, 0, pointer); }

    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        if (bytes == 0) return {};  // ACL rejects destMax == 0
        return call("aclrtMemcpy(host to device)", api_.memcpy, bytes, device_dst, bytes, host_src, bytes,
                    acl::memcpy_host_to_device);
    }
    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("aclrtMemcpy(device to host)", api_.memcpy, bytes, host_dst, bytes, device_src, bytes,
                    acl::memcpy_device_to_host);
    }
    Status device_memset(void* device_dst, int value, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("aclrtMemset", api_.memset, bytes, device_dst, bytes, value, bytes);
    }
    Status synchronize() noexcept { return call("aclrtSynchronizeDevice", api_.synchronize_device, 0); }

    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        void* pointer = nullptr;
        if (Status s = call("aclrtMallocHost", api_.malloc_host, bytes, &pointer, bytes); !s) return s;
        return pointer;
    }
    Status pinned_free(void* pointer) noexcept { return call("aclrtFreeHost", api_.free_host, 0, pointer); }

    // ---- streams and events ----------------------------------------------------------------
    // A task that fails on the device is reported by the next call that waits for it
    // (synchronize_event, destroy_stream); event_ready keeps answering false for an event
    // behind a failed task, as aclrtQueryEventStatus does.

    /// aclrtCreateStream, in this backend's context.
    Result<Stream> create_stream() noexcept {
        Stream stream;
        if (Status s = call("aclrtCreateStream", api_.create_stream, 0, &stream.handle); !s) return s;
        Owners::enroll(stream.handle, device_);
        return stream;
    }
    /// Ok unless `stream` was created by the backend of another device (ACL cannot be asked
    /// about a stream it created for the engine: such a stream passes).
    Status check_stream(Stream stream) noexcept { return Owners::check(name(), stream.handle, device_); }
    /// aclrtSynchronizeStream, then aclrtDestroyStream (ACL requires the stream's work to be
    /// complete first): the host blocks until the stream drained. The stream is destroyed even
    /// when its work failed; the first error is returned.
    Status destroy_stream(Stream stream) noexcept {
        Status drained = call("aclrtSynchronizeStream", api_.synchronize_stream, 0, stream.handle);
        Status destroyed = call("aclrtDestroyStream", api_.destroy_stream, 0, stream.handle);
        if (destroyed) Owners::withdraw(stream.handle);
        return !drained.ok() ? drained : destroyed;
    }
    /// aclrtMemcpyAsync(dst, n, src, n, HOST_TO_DEVICE, stream); zero bytes are not sent.
    Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("aclrtMemcpyAsync(host to device)", api_.memcpy_async, bytes, device_dst, bytes, host_src, bytes,
                    acl::memcpy_host_to_device, stream.handle);
    }
    /// aclrtMemcpyAsync(dst, n, src, n, DEVICE_TO_HOST, stream); zero bytes are not sent.
    Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("aclrtMemcpyAsync(device to host)", api_.memcpy_async, bytes, host_dst, bytes, device_src, bytes,
                    acl::memcpy_device_to_host, stream.handle);
    }
    // ---- batches of copies: aclrtMemcpyBatchAsync (CANN 8.3 and later, experimental) -----------
    // Resolved only where the library exports it. One aclrtMemcpyBatchAttr covers every copy of
    // a batch (host and this device as its locations); each copy's destMax is its size.

    /// No bound of devstage's own when the library has aclrtMemcpyBatchAsync; else 0 (the Stager
    /// then copies one by one).
    std::size_t batch_copy_limit(Stream /*stream*/) const noexcept {
        return batch_.memcpy_batch_async != nullptr ? std::numeric_limits<std::size_t>::max() : 0;
    }
    /// aclrtMemcpyBatchAsync of `count` host-to-device copies on `stream`.
    Status copy_to_device_batch(void* const* device_dsts, const void* const* host_srcs, const std::size_t* sizes,
                                std::size_t count, Stream stream) noexcept {
        return batch("aclrtMemcpyBatchAsync(host to device)", device_dsts, host_srcs, sizes, count, true, stream);
    }
    /// aclrtMemcpyBatchAsync of `count` device-to-host copies on `stream`.
    Status copy_from_device_batch(void* const* host_dsts, const void* const* device_srcs, const std::size_t* sizes,
                                  std::size_t count, Stream stream) noexcept {
        return batch("aclrtMemcpyBatchAsync(device to host)", host_dsts, device_srcs, sizes, count, false, stream);
    }
    /// aclrtMemsetAsync(dst, n, value, n, stream); zero bytes are not sent.
    Status device_memset_async(void* device_dst, int value, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("aclrtMemsetAsync", api_.memset_async, bytes, device_dst, bytes, value, bytes, stream.handle);
    }
    /// aclrtCreateEvent, in this backend's context.
    Result<Event> create_event() noexcept {
        auto* state = new (std::nothrow) detail::AclEvent;
        if (state == nullptr) {
            return Status(Errc::out_of_memory, detail::message("ascend create_event: no host memory on device ",
                                                               device_, " for ", sizeof(detail::AclEvent), " bytes"));
        }
        if (Status s = call("aclrtCreateEvent", api_.create_event, 0, &state->handle); !s) {
            delete state;
            return s;
        }
        events_.link(state);
        return Event{state};
    }
    /// aclrtDestroyEvent (allowed while a record is pending); then `event` is gone.
    Status destroy_event(Event event) noexcept {
        if (Status s = check(event, "aclrtDestroyEvent"); !s) return s;
        if (Status s = call("aclrtDestroyEvent", api_.destroy_event, 0, event.state->handle); !s) return s;
        events_.unlink(event.state);
        delete event.state;
        return {};
    }
    /// aclrtRecordEvent(event, stream).
    Status record_event(Event event, Stream stream) noexcept {
        if (Status s = check(event, "aclrtRecordEvent"); !s) return s;
        if (Status s = call("aclrtRecordEvent", api_.record_event, 0, event.state->handle, stream.handle); !s) return s;
        event.state->recorded.store(true, std::memory_order_release);
        return {};
    }
    /// aclrtQueryEventStatus: true when ACL_EVENT_RECORDED_STATUS_COMPLETE, and for an event
    /// never recorded (not sent to ACL, which would say not ready).
    Result<bool> event_ready(Event event) noexcept {
        if (Status s = check(event, "aclrtQueryEventStatus"); !s) return s;
        if (!event.state->recorded.load(std::memory_order_acquire)) return true;
        int status = acl::event_recorded_status_not_ready;
        if (Status s = call("aclrtQueryEventStatus", api_.query_event_status, 0, event.state->handle, &status); !s) {
            return s;
        }
        return status == acl::event_recorded_status_complete;
    }
    /// aclrtSynchronizeEvent: the host blocks until the event completed; an event never
    /// recorded returns at once.
    Status synchronize_event(Event event) noexcept {
        if (Status s = check(event, "aclrtSynchronizeEvent"); !s) return s;
        if (!event.state->recorded.load(std::memory_order_acquire)) return {};
        return call("aclrtSynchronizeEvent", api_.synchronize_event, 0, event.state->handle);
    }
    /// aclrtStreamWaitEvent(stream, event): later work on `stream` waits for the event's last
    /// record; an event never recorded makes no wait.
    Status stream_wait_event(Stream stream, Event event) noexcept {
        if (Status s = check(event, "aclrtStreamWaitEvent"); !s) return s;
        if (!event.state->recorded.load(std::memory_order_acquire)) return {};
        return call("aclrtStreamWaitEvent", api_.stream_wait_event, 0, stream.handle, event.state->handle);
    }

    // ---- virtual memory (in-place growth) --------------------------------------------------
    // aclrtReserveMemAddress / aclrtMallocPhysical / aclrtMapMem and their inverses. When the
    // loaded ACL lacks them, vmm_granularity() is 0 and every vmm_ call is not_supported.

    /// The minimum granularity of physical chunks on this device; 0 when unsupported.
    std::size_t vmm_granularity() const noexcept { return granularity_; }

    Result<void*> vmm_reserve(std::size_t bytes) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        void* base = nullptr;
        if (Status s = call("aclrtReserveMemAddress", vmm_.reserve, bytes, &base, bytes, std::size_t{0},
                            static_cast<void*>(nullptr), std::uint64_t{0});
            !s) {
            return s;
        }
        return base;
    }
    Status vmm_release(void* base) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        return call("aclrtReleaseMemAddress", vmm_.release, 0, base);
    }
    Result<PhysicalHandle> vmm_create(std::size_t bytes) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        PhysicalHandle handle = nullptr;
        const acl::PhysicalMemProp prop = device_prop();
        if (Status s =
                call("aclrtMallocPhysical", vmm_.malloc_physical, bytes, &handle, bytes, &prop, std::uint64_t{0});
            !s) {
            return s;
        }
        return handle;
    }
    Status vmm_free(PhysicalHandle handle) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        return call("aclrtFreePhysical", vmm_.free_physical, 0, handle);
    }
    Status vmm_map(void* address, std::size_t bytes, PhysicalHandle handle) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        return call("aclrtMapMem", vmm_.map, bytes, address, bytes, std::size_t{0}, handle, std::uint64_t{0});
    }
    Status vmm_unmap(void* address, std::size_t /*bytes*/) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        return call("aclrtUnmapMem", vmm_.unmap, 0, address);
    }

    // ---- mapped host memory: aclrtHostRegister (Atlas A2, A3), where the library has it ---------
    // The device address it gives is for kernels only: never a copy's or a memset's.

    /// aclrtHostRegister takes 4 KiB-aligned pointers.
    static constexpr std::size_t host_map_alignment = acl::host_register_alignment;
    /// aclrtHostRegister(host, bytes, ACL_HOST_REGISTER_MAPPED, &device) on page-locked memory
    /// (aclrtMallocHost's); not_supported when the library lacks it.
    Result<void*> map_host(void* host, std::size_t bytes) noexcept {
        if (mapped_.host_register == nullptr) {
            return Status(Errc::not_supported,
                          detail::message("ascend map_host: ", library_.path(), " has no aclrtHostRegister"));
        }
        void* device = nullptr;
        if (Status s = call("aclrtHostRegister", mapped_.host_register, bytes, host, static_cast<std::uint64_t>(bytes),
                            acl::host_register_mapped, &device);
            !s) {
            return s;
        }
        return device;
    }
    /// aclrtHostUnregister(host).
    Status unmap_host(void* host) noexcept {
        if (mapped_.host_unregister == nullptr) {
            return Status(Errc::not_supported,
                          detail::message("ascend unmap_host: ", library_.path(), " has no aclrtHostUnregister"));
        }
        return call("aclrtHostUnregister", mapped_.host_unregister, 0, host);
    }

private:
    struct OwnersTag {};
    using Owners = detail::StreamOwners<OwnersTag>;
    AscendBackend() = default;

    Status resolve() noexcept { return detail::resolve_acl_runtime(library_, api_, errors_); }

    acl::PhysicalMemProp device_prop() const noexcept {
        acl::PhysicalMemProp prop;
        prop.location_id = static_cast<std::uint32_t>(device_);
        return prop;
    }

    // Resolves the virtual-memory entry points if the library has them all.
    void probe_vmm() noexcept {
        detail::AclVmmApi vmm;
        const Status all = detail::resolve_acl_vmm(library_, vmm);
        if (!all) return;
        std::size_t granularity = 0;
        const acl::PhysicalMemProp prop = device_prop();
        if (!call("aclrtMemGetAllocationGranularity", vmm.granularity, 0, &prop, acl::granularity_minimum, &granularity)
                 .ok()) {
            return;
        }
        vmm_ = vmm;
        granularity_ = granularity;
    }

    // One attribute for all copies: host to device, or device to host. The arrays are only read
    // (ACL declares them non-const); each copy's destMax is its size.
    Status batch(const char* what, void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                 std::size_t count, bool to_device, Stream stream) noexcept {
        if (batch_.memcpy_batch_async == nullptr) {
            return Status(Errc::not_supported, detail::message("ascend ", what, ": ", library_.path(),
                                                               " has no aclrtMemcpyBatchAsync (CANN 8.3 or later)"));
        }
        if (count == 0) return {};
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < count; ++i) bytes += sizes[i];
        const acl::MemLocation device{static_cast<std::uint32_t>(device_), acl::mem_location_type_device};
        const acl::MemLocation host{};
        acl::MemcpyBatchAttr attribute{to_device ? device : host, to_device ? host : device, {}};
        std::size_t first = 0;  // attrsIndexes: the one attribute applies from copy 0 on
        std::size_t failed_at = std::numeric_limits<std::size_t>::max();
        auto* sizes_in = const_cast<std::size_t*>(sizes);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
        Status status = call(what, batch_.memcpy_batch_async, bytes, const_cast<void**>(dsts), sizes_in,
                             const_cast<void**>(srcs), sizes_in, count, &attribute, &first, std::size_t{1}, &failed_at,
                             stream.handle);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
        if (!status && failed_at < count) {
            return Status(status.code(), detail::message(status.message(), " (at copy ", failed_at, " of ", count,
                                                         "; the copies before it may have been enqueued)"));
        }
        return status;
    }

    Status vmm_ready() const noexcept {
        if (granularity_ != 0) return {};
        return Status(Errc::not_supported, detail::message("ascend: virtual memory is not available in ",
                                                           library_.path(), " for device ", device_));
    }

    // An Event must come from create_event.
    Status check(Event event, const char* what) const noexcept {
        if (event.state != nullptr) return {};
        return Status(Errc::invalid_argument, detail::message("ascend ", what, " on device ", device_,
                                                              ": the event was not made by create_event"));
    }

    detail::CallSite site() const noexcept { return {name(), device_}; }

    template <class F, class... Args>
    Status unbound_call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        return detail::checked_call(errors_, site(), what, bytes, function, args...);
    }

    // Makes this backend's context current on the calling thread, then calls.
    template <class F, class... Args>
    Status call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        if (Status bound = unbound_call("aclrtSetCurrentContext", api_.set_current_context, 0, context_); !bound) {
            return bound;
        }
        return unbound_call(what, function, bytes, args...);
    }

    detail::DynamicLibrary library_;
    detail::AclApi api_;
    detail::AclErrors errors_;
    std::int32_t device_ = 0;
    acl::aclrtContext context_ = nullptr;
    bool device_open_ = false;
    detail::AclVmmApi vmm_;
    std::size_t granularity_ = 0;
    detail::AclBatchApi batch_;
    detail::AclMappedApi mapped_;
    detail::AclEventList events_;
    std::unique_ptr<detail::TeardownList> teardown_;  // moves with the backend
};

static_assert(Backend<AscendBackend>);
static_assert(PinnedHostBackend<AscendBackend>);
static_assert(MemsetBackend<AscendBackend>);
static_assert(AsyncMemsetBackend<AscendBackend>);
static_assert(SynchronizingBackend<AscendBackend>);
static_assert(AsyncBackend<AscendBackend>);
static_assert(VirtualMemoryBackend<AscendBackend>);
static_assert(BatchCopyBackend<AscendBackend>);
static_assert(MappedHostBackend<AscendBackend>);
static_assert(StreamCheckBackend<AscendBackend>);
static_assert(TeardownBackend<AscendBackend>);

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
