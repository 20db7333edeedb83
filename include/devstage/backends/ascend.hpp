// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// AscendBackend: Huawei Ascend NPUs through the CANN ACL runtime, loaded at run time with
/// dlopen — no CANN header or library is needed to compile. Bound to one device: it makes its
/// own context current before every call, so the calling thread's current device never
/// decides where memory goes.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/dynamic_library.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// The ACL C ABI subset AscendBackend uses (prototypes as in CANN's acl_rt.h / acl_base.h).
namespace acl {
using aclError = int;
using aclrtContext = void*;
inline constexpr aclError success = 0;
inline constexpr aclError repeat_initialize = 100002;
inline constexpr aclError bad_alloc = 200000;
inline constexpr aclError rt_memory_allocation = 207001;
inline constexpr int mem_malloc_huge_first = 0;
inline constexpr int memcpy_host_to_device = 1;
inline constexpr int memcpy_device_to_host = 2;
inline constexpr aclError rt_feature_not_support = 207000;
inline constexpr aclError api_not_support = 200001;

using aclrtDrvMemHandle = void*;
/// aclrtPhysicalMemProp, laid out as in acl_rt.h (32 bytes on x86-64).
struct PhysicalMemProp {
    int handle_type = 0;      // ACL_MEM_HANDLE_TYPE_NONE
    int allocation_type = 0;  // ACL_MEM_ALLOCATION_TYPE_PINNED
    int mem_attr = 4;         // ACL_HBM_MEM_HUGE
    std::uint32_t location_id = 0;
    int location_type = 1;  // ACL_MEM_LOCATION_TYPE_DEVICE
    std::uint64_t reserve = 0;
};
static_assert(sizeof(PhysicalMemProp) == 32);
inline constexpr int granularity_minimum = 0;
}  // namespace acl

/// One Ascend device through libascendcl. `auto npu = AscendBackend::create(0); if (!npu) …`
/// Move-only. Thread-safe as ACL is: every call first makes this backend's context current
/// on the calling thread.
class AscendBackend {
public:
    /// aclrtMalloc guarantees 64 bytes; the strategies align their own slices to 1024.
    static constexpr std::size_t device_alignment = 64;

    /// Loads ACL (`library_path`, else $DEVSTAGE_ACL_LIBRARY, else libascendcl.so then
    /// libascendcl.so.1), initializes it, opens `device_id` and creates this backend's context.
    static Result<AscendBackend> create(std::int32_t device_id, std::string library_path = {}) noexcept {
        Result<detail::DynamicLibrary> library = detail::DynamicLibrary::open(
            std::move(library_path), "DEVSTAGE_ACL_LIBRARY", {"libascendcl.so", "libascendcl.so.1"});
        if (!library) return Status(Errc::library_not_found, detail::message("ascend: ", library.status().message()));
        AscendBackend backend;
        backend.library_ = std::move(*library);
        backend.device_ = device_id;
        if (Status resolved = backend.resolve(); !resolved) return resolved;
        const acl::aclError init = backend.api_.init(nullptr);
        if (init != acl::success && init != acl::repeat_initialize) return backend.failure("aclInit", init, 0);
        if (const acl::aclError e = backend.api_.set_device(device_id); e != acl::success) {
            return backend.failure("aclrtSetDevice", e, 0);
        }
        backend.device_open_ = true;
        if (const acl::aclError e = backend.api_.create_context(&backend.context_, device_id); e != acl::success) {
            return backend.failure("aclrtCreateContext", e, 0);
        }
        backend.probe_vmm();
        return backend;
    }

    AscendBackend(AscendBackend&& other) noexcept
        : library_(std::move(other.library_)),
          api_(other.api_),
          device_(other.device_),
          context_(std::exchange(other.context_, nullptr)),
          device_open_(std::exchange(other.device_open_, false)),
          vmm_(other.vmm_),
          granularity_(other.granularity_) {}
    AscendBackend& operator=(AscendBackend&&) = delete;
    AscendBackend(const AscendBackend&) = delete;
    AscendBackend& operator=(const AscendBackend&) = delete;
    /// Destroys the context and releases the device (aclFinalize is left to the process:
    /// other backends may still use ACL).
    ~AscendBackend() {
        if (context_ != nullptr) (void)api_.destroy_context(context_);
        if (device_open_) (void)api_.reset_device(device_);
    }

    std::string_view name() const noexcept { return "ascend"; }
    std::int32_t device_id() const noexcept { return device_; }
    const std::string& library_path() const noexcept { return library_.path(); }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        if (Status bound = bind(); !bound) return bound;
        void* pointer = nullptr;
        if (const acl::aclError e = api_.malloc(&pointer, bytes, acl::mem_malloc_huge_first); e != acl::success) {
            return failure("aclrtMalloc", e, bytes);
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
        if (Status bound = bind(); !bound) return bound;
        void* pointer = nullptr;
        if (const acl::aclError e = api_.malloc_host(&pointer, bytes); e != acl::success) {
            return failure("aclrtMallocHost", e, bytes);
        }
        return pointer;
    }
    Status pinned_free(void* pointer) noexcept { return call("aclrtFreeHost", api_.free_host, 0, pointer); }

    // ---- virtual memory (in-place growth) --------------------------------------------------
    // aclrtReserveMemAddress / aclrtMallocPhysical / aclrtMapMem and their inverses. When the
    // loaded ACL lacks them, vmm_granularity() is 0 and every vmm_ call is not_supported.
    using PhysicalHandle = acl::aclrtDrvMemHandle;

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

private:
    struct VmmApi {
        acl::aclError (*reserve)(void**, std::size_t, std::size_t, void*, std::uint64_t) = nullptr;
        acl::aclError (*release)(void*) = nullptr;
        acl::aclError (*malloc_physical)(acl::aclrtDrvMemHandle*, std::size_t, const acl::PhysicalMemProp*,
                                         std::uint64_t) = nullptr;
        acl::aclError (*free_physical)(acl::aclrtDrvMemHandle) = nullptr;
        acl::aclError (*map)(void*, std::size_t, std::size_t, acl::aclrtDrvMemHandle, std::uint64_t) = nullptr;
        acl::aclError (*unmap)(void*) = nullptr;
        acl::aclError (*granularity)(const acl::PhysicalMemProp*, int, std::size_t*) = nullptr;
    };

    acl::PhysicalMemProp device_prop() const noexcept {
        acl::PhysicalMemProp prop;
        prop.location_id = static_cast<std::uint32_t>(device_);
        return prop;
    }

    // Resolves the virtual-memory entry points if the library has them all.
    void probe_vmm() noexcept {
        VmmApi vmm;
        const bool all = library_.resolve("aclrtReserveMemAddress", vmm.reserve).ok() &&
                         library_.resolve("aclrtReleaseMemAddress", vmm.release).ok() &&
                         library_.resolve("aclrtMallocPhysical", vmm.malloc_physical).ok() &&
                         library_.resolve("aclrtFreePhysical", vmm.free_physical).ok() &&
                         library_.resolve("aclrtMapMem", vmm.map).ok() &&
                         library_.resolve("aclrtUnmapMem", vmm.unmap).ok() &&
                         library_.resolve("aclrtMemGetAllocationGranularity", vmm.granularity).ok();
        if (!all) return;
        std::size_t granularity = 0;
        const acl::PhysicalMemProp prop = device_prop();
        if (!bind().ok() || vmm.granularity(&prop, acl::granularity_minimum, &granularity) != acl::success) return;
        vmm_ = vmm;
        granularity_ = granularity;
    }

    Status vmm_ready() const noexcept {
        if (granularity_ != 0) return {};
        return Status(Errc::not_supported, detail::message("ascend: virtual memory is not available in ",
                                                           library_.path(), " for device ", device_));
    }

    struct Api {
        acl::aclError (*init)(const char*) = nullptr;
        acl::aclError (*set_device)(std::int32_t) = nullptr;
        acl::aclError (*reset_device)(std::int32_t) = nullptr;
        acl::aclError (*create_context)(acl::aclrtContext*, std::int32_t) = nullptr;
        acl::aclError (*destroy_context)(acl::aclrtContext) = nullptr;
        acl::aclError (*set_current_context)(acl::aclrtContext) = nullptr;
        acl::aclError (*malloc)(void**, std::size_t, int) = nullptr;
        acl::aclError (*free)(void*) = nullptr;
        acl::aclError (*malloc_host)(void**, std::size_t) = nullptr;
        acl::aclError (*free_host)(void*) = nullptr;
        acl::aclError (*memcpy)(void*, std::size_t, const void*, std::size_t, int) = nullptr;
        acl::aclError (*memset)(void*, std::size_t, std::int32_t, std::size_t) = nullptr;
        acl::aclError (*synchronize_device)() = nullptr;
        const char* (*recent_error_message)() = nullptr;
    };

    AscendBackend() = default;

    Status resolve() noexcept {
        const std::pair<const char*, Status> steps[] = {
            {"aclInit", library_.resolve("aclInit", api_.init)},
            {"aclrtSetDevice", library_.resolve("aclrtSetDevice", api_.set_device)},
            {"aclrtResetDevice", library_.resolve("aclrtResetDevice", api_.reset_device)},
            {"aclrtCreateContext", library_.resolve("aclrtCreateContext", api_.create_context)},
            {"aclrtDestroyContext", library_.resolve("aclrtDestroyContext", api_.destroy_context)},
            {"aclrtSetCurrentContext", library_.resolve("aclrtSetCurrentContext", api_.set_current_context)},
            {"aclrtMalloc", library_.resolve("aclrtMalloc", api_.malloc)},
            {"aclrtFree", library_.resolve("aclrtFree", api_.free)},
            {"aclrtMallocHost", library_.resolve("aclrtMallocHost", api_.malloc_host)},
            {"aclrtFreeHost", library_.resolve("aclrtFreeHost", api_.free_host)},
            {"aclrtMemcpy", library_.resolve("aclrtMemcpy", api_.memcpy)},
            {"aclrtMemset", library_.resolve("aclrtMemset", api_.memset)},
            {"aclrtSynchronizeDevice", library_.resolve("aclrtSynchronizeDevice", api_.synchronize_device)},
            {"aclGetRecentErrMsg", library_.resolve("aclGetRecentErrMsg", api_.recent_error_message)},
        };
        for (const auto& [symbol, status] : steps) {
            if (!status) return Status(Errc::library_not_found, detail::message("ascend: ", status.message()));
        }
        return {};
    }

    // Makes this backend's context current on the calling thread.
    Status bind() noexcept {
        if (const acl::aclError e = api_.set_current_context(context_); e != acl::success) {
            return failure("aclrtSetCurrentContext", e, 0);
        }
        return {};
    }

    template <class F, class... Args>
    Status call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        if (Status bound = bind(); !bound) return bound;
        if (const acl::aclError e = function(args...); e != acl::success) return failure(what, e, bytes);
        return {};
    }

    Status failure(const char* what, acl::aclError code, std::size_t bytes) const noexcept {
        const char* recent = api_.recent_error_message != nullptr ? api_.recent_error_message() : nullptr;
        const Errc errc =
            code == acl::rt_memory_allocation || code == acl::bad_alloc ? Errc::out_of_memory : Errc::backend_failure;
        return Status(
            errc, detail::message("ascend ", what, " failed", bytes > 0 ? " for " : "",
                                  bytes > 0 ? detail::message(bytes, " bytes") : std::string(), " on device ", device_,
                                  ": ACL error ", code, recent != nullptr && *recent != '\0' ? " (" : "",
                                  recent != nullptr ? recent : "", recent != nullptr && *recent != '\0' ? ")" : ""));
    }

    detail::DynamicLibrary library_;
    Api api_;
    std::int32_t device_ = 0;
    acl::aclrtContext context_ = nullptr;
    bool device_open_ = false;
    VmmApi vmm_;
    std::size_t granularity_ = 0;
};

static_assert(Backend<AscendBackend>);
static_assert(PinnedHostBackend<AscendBackend>);
static_assert(MemsetBackend<AscendBackend>);
static_assert(SynchronizingBackend<AscendBackend>);
static_assert(VirtualMemoryBackend<AscendBackend>);

}  // namespace devstage
