// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The ACL C ABI subset AscendBackend uses, declared here so that neither a CANN header nor a
/// CANN library is needed to compile: its types and values (devstage::acl), with the layout of
/// the struct it passes; and, private, the tables of entry points the backend fills when it
/// loads the library, and how ACL calls fail.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/backends/detail/runtime_call.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// The ACL C ABI subset AscendBackend uses (prototypes as in CANN's acl_rt.h / acl_base.h).
namespace acl {
using aclError = int;
using aclrtContext = void*;
using aclrtStream = void*;
using aclrtEvent = void*;
inline constexpr aclError success = 0;
inline constexpr aclError repeat_initialize = 100002;
inline constexpr aclError bad_alloc = 200000;
inline constexpr aclError rt_memory_allocation = 207001;
inline constexpr int mem_malloc_huge_first = 0;
inline constexpr int memcpy_host_to_device = 1;
inline constexpr int memcpy_device_to_host = 2;
inline constexpr aclError rt_feature_not_support = 207000;
inline constexpr aclError api_not_support = 200001;
inline constexpr int event_recorded_status_not_ready = 0;
inline constexpr int event_recorded_status_complete = 1;
/// aclrtHostRegisterType: host memory mapped for the device, read and write
/// (`aclError aclrtHostRegister(void* ptr, uint64_t size, aclrtHostRegisterType type, void** devPtr)`).
inline constexpr int host_register_mapped = 0;
/// aclrtHostRegister takes 4 KiB-aligned host pointers.
inline constexpr std::size_t host_register_alignment = 4096;

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

inline constexpr int mem_location_type_host = 0;  // aclrtMemLocationType
inline constexpr int mem_location_type_device = 1;
/// aclrtMemLocation.
struct MemLocation {
    std::uint32_t id = 0;  // the device id (ignored for the host)
    int type = mem_location_type_host;
};
/// aclrtMemcpyBatchAttr: where the destination and the source of the copies it covers lie.
struct MemcpyBatchAttr {
    MemLocation dst_loc;
    MemLocation src_loc;
    std::uint8_t rsv[16] = {};  // reserved, 0
};
static_assert(sizeof(MemLocation) == 8 && sizeof(MemcpyBatchAttr) == 32);
static_assert(offsetof(MemcpyBatchAttr, src_loc) == 8 && offsetof(MemcpyBatchAttr, rsv) == 16);
}  // namespace acl

namespace detail {

// The entry points AscendBackend calls (prototypes as in acl_rt.h).
struct AclApi {
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
    acl::aclError (*create_stream)(acl::aclrtStream*) = nullptr;
    acl::aclError (*destroy_stream)(acl::aclrtStream) = nullptr;
    acl::aclError (*synchronize_stream)(acl::aclrtStream) = nullptr;
    acl::aclError (*memcpy_async)(void*, std::size_t, const void*, std::size_t, int, acl::aclrtStream) = nullptr;
    acl::aclError (*memset_async)(void*, std::size_t, std::int32_t, std::size_t, acl::aclrtStream) = nullptr;
    acl::aclError (*create_event)(acl::aclrtEvent*) = nullptr;
    acl::aclError (*destroy_event)(acl::aclrtEvent) = nullptr;
    acl::aclError (*record_event)(acl::aclrtEvent, acl::aclrtStream) = nullptr;
    acl::aclError (*query_event_status)(acl::aclrtEvent, int*) = nullptr;
    acl::aclError (*synchronize_event)(acl::aclrtEvent) = nullptr;
    acl::aclError (*stream_wait_event)(acl::aclrtStream, acl::aclrtEvent) = nullptr;
};

// The virtual-memory entry points, used only when the library has them all.
struct AclVmmApi {
    acl::aclError (*reserve)(void**, std::size_t, std::size_t, void*, std::uint64_t) = nullptr;
    acl::aclError (*release)(void*) = nullptr;
    acl::aclError (*malloc_physical)(acl::aclrtDrvMemHandle*, std::size_t, const acl::PhysicalMemProp*,
                                     std::uint64_t) = nullptr;
    acl::aclError (*free_physical)(acl::aclrtDrvMemHandle) = nullptr;
    acl::aclError (*map)(void*, std::size_t, std::size_t, acl::aclrtDrvMemHandle, std::uint64_t) = nullptr;
    acl::aclError (*unmap)(void*) = nullptr;
    acl::aclError (*granularity)(const acl::PhysicalMemProp*, int, std::size_t*) = nullptr;
};

// aclrtMemcpyBatchAsync (CANN 8.3 and later, experimental), when the library exports it.
struct AclBatchApi {
    acl::aclError (*memcpy_batch_async)(void**, std::size_t*, void**, std::size_t*, std::size_t, acl::MemcpyBatchAttr*,
                                        std::size_t*, std::size_t, std::size_t*, acl::aclrtStream) = nullptr;
};

// Resolves aclrtMemcpyBatchAsync; leaves `api` empty when it is missing (never an error).
inline void resolve_acl_batch(const DynamicLibrary& library, AclBatchApi& api) noexcept {
    AclBatchApi found;
    if (resolve_entry_points(library, "ascend", entry_point("aclrtMemcpyBatchAsync", found.memcpy_batch_async)).ok()) {
        api = found;
    }
}

// aclrtHostRegister / aclrtHostUnregister (Atlas A2 and A3), when the library exports them.
struct AclMappedApi {
    acl::aclError (*host_register)(void*, std::uint64_t, int, void**) = nullptr;
    acl::aclError (*host_unregister)(void*) = nullptr;
};

// Resolves both; leaves `api` empty when either is missing (never an error: the backend does
// not map then, and a Stager copies).
inline void resolve_acl_mapped(const DynamicLibrary& library, AclMappedApi& api) noexcept {
    AclMappedApi found;
    if (resolve_entry_points(library, "ascend", entry_point("aclrtHostRegister", found.host_register),
                             entry_point("aclrtHostUnregister", found.host_unregister))
            .ok()) {
        api = found;
    }
}

// How ACL calls fail: an aclError, and the thread's aclGetRecentErrMsg (read and cleared).
struct AclErrors {
    using Code = acl::aclError;
    static constexpr Code success = acl::success;
    static constexpr std::string_view code_name = "ACL error";
    const char* (*recent_error_message)() = nullptr;

    Errc errc(Code code) const noexcept {
        return code == acl::rt_memory_allocation || code == acl::bad_alloc ? Errc::out_of_memory
                                                                           : Errc::backend_failure;
    }
    const char* text(Code /*code*/) const noexcept {
        return recent_error_message != nullptr ? recent_error_message() : nullptr;
    }
};

// Resolves every runtime entry point, and aclGetRecentErrMsg; the first one missing is
// library_not_found.
inline Status resolve_acl_runtime(const DynamicLibrary& library, AclApi& api, AclErrors& errors) noexcept {
    return resolve_entry_points(
        library, "ascend", entry_point("aclInit", api.init), entry_point("aclrtSetDevice", api.set_device),
        entry_point("aclrtResetDevice", api.reset_device), entry_point("aclrtCreateContext", api.create_context),
        entry_point("aclrtDestroyContext", api.destroy_context),
        entry_point("aclrtSetCurrentContext", api.set_current_context), entry_point("aclrtMalloc", api.malloc),
        entry_point("aclrtFree", api.free), entry_point("aclrtMallocHost", api.malloc_host),
        entry_point("aclrtFreeHost", api.free_host), entry_point("aclrtMemcpy", api.memcpy),
        entry_point("aclrtMemset", api.memset), entry_point("aclrtSynchronizeDevice", api.synchronize_device),
        entry_point("aclGetRecentErrMsg", errors.recent_error_message),
        entry_point("aclrtCreateStream", api.create_stream), entry_point("aclrtDestroyStream", api.destroy_stream),
        entry_point("aclrtSynchronizeStream", api.synchronize_stream),
        entry_point("aclrtMemcpyAsync", api.memcpy_async), entry_point("aclrtMemsetAsync", api.memset_async),
        entry_point("aclrtCreateEvent", api.create_event), entry_point("aclrtDestroyEvent", api.destroy_event),
        entry_point("aclrtRecordEvent", api.record_event), entry_point("aclrtQueryEventStatus", api.query_event_status),
        entry_point("aclrtSynchronizeEvent", api.synchronize_event),
        entry_point("aclrtStreamWaitEvent", api.stream_wait_event));
}

// Resolves the virtual-memory entry points; the first one missing is library_not_found.
inline Status resolve_acl_vmm(const DynamicLibrary& library, AclVmmApi& vmm) noexcept {
    return resolve_entry_points(
        library, "ascend", entry_point("aclrtReserveMemAddress", vmm.reserve),
        entry_point("aclrtReleaseMemAddress", vmm.release), entry_point("aclrtMallocPhysical", vmm.malloc_physical),
        entry_point("aclrtFreePhysical", vmm.free_physical), entry_point("aclrtMapMem", vmm.map),
        entry_point("aclrtUnmapMem", vmm.unmap), entry_point("aclrtMemGetAllocationGranularity", vmm.granularity));
}

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
