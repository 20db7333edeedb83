// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The CUDA C ABI subset CudaBackend uses, declared here so that neither a CUDA header nor a
/// CUDA library is needed to compile: the runtime's types and values (devstage::cudart) and the
/// driver's, for virtual memory (devstage::cudrv), with the layouts of its structs; and,
/// private, the tables of entry points the backend fills when it loads each library, and how
/// each library's calls fail. The tests check the declarations against cuda.h where it is
/// installed.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <string_view>

#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/backends/detail/runtime_call.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// The CUDA runtime C ABI subset CudaBackend uses (prototypes as in cuda_runtime_api.h,
/// values as in driver_types.h).
namespace cudart {
using cudaError_t = int;
using cudaStream_t = void*;  // struct CUstream_st*
using cudaEvent_t = void*;   // struct CUevent_st*
using cudaHostFn_t = void (*)(void* user_data);
inline constexpr cudaError_t success = 0;
inline constexpr cudaError_t error_memory_allocation = 2;
inline constexpr cudaError_t error_insufficient_driver = 35;
inline constexpr cudaError_t error_no_device = 100;
inline constexpr cudaError_t error_not_ready = 600;
inline constexpr int memcpy_host_to_device = 1;
inline constexpr int memcpy_device_to_host = 2;
inline constexpr unsigned host_alloc_default = 0;
/// cudaHostAllocPortable: the memory is page-locked for every CUDA context, not only the
/// allocating device's.
inline constexpr unsigned host_alloc_portable = 0x01;
inline constexpr unsigned stream_non_blocking = 0x01;
inline constexpr unsigned event_disable_timing = 0x02;
inline constexpr int memory_type_unregistered = 0;
inline constexpr int memory_type_host = 1;
inline constexpr int memory_type_device = 2;
inline constexpr int memory_type_managed = 3;

inline constexpr int mem_location_type_device = 1;  // enum cudaMemLocationType
inline constexpr int mem_location_type_host = 2;
inline constexpr int memcpy_src_access_order_stream = 1;  // enum cudaMemcpySrcAccessOrder
/// cudaMemcpyBatchAsync came with this runtime version (CUDA 12.8); CUDA 13.0 (13000) dropped
/// its failIdx argument.
inline constexpr int batch_runtime_version = 12080;
inline constexpr int batch_without_fail_index_version = 13000;
/// enum cudaDeviceAttr: whether the device can map page-locked host memory, and shares one
/// address space with the host (then cudaHostAlloc memory is mapped, at its host address).
inline constexpr int device_attribute_can_map_host_memory = 19;
inline constexpr int device_attribute_unified_addressing = 41;
/// cudaDevAttrHostNumaId: the host NUMA node closest to the device, -1 where the system has no
/// NUMA (cudaDevAttrNumaId, 131, is the node of the device's own memory on coherent systems).
inline constexpr int device_attribute_host_numa_id = 134;
/// cudaDeviceGetPCIBusId writes at most this many characters, its NUL included.
inline constexpr int pci_bus_id_length = 13;

/// cudaMemLocation.
struct MemLocation {
    int type = 0;
    int id = 0;
};
/// cudaMemcpyAttributes: how the copies of a batch (from its index on) read their source.
struct MemcpyAttributes {
    int src_access_order = memcpy_src_access_order_stream;  // enum cudaMemcpySrcAccessOrder
    MemLocation src_loc_hint;                               // hints, ignored for cudaMalloc and page-locked memory
    MemLocation dst_loc_hint;
    unsigned flags = 0;  // cudaMemcpyFlagDefault
};
static_assert(sizeof(MemLocation) == 8 && sizeof(MemcpyAttributes) == 24);
static_assert(offsetof(MemcpyAttributes, src_loc_hint) == 4 && offsetof(MemcpyAttributes, dst_loc_hint) == 12 &&
              offsetof(MemcpyAttributes, flags) == 20);

/// cudaPointerAttributes as CUDA 13 lays it out. CUDA 12's struct is its first 24 bytes, all
/// that a CUDA 12 runtime writes.
struct PointerAttributes {
    int type = memory_type_unregistered;  // enum cudaMemoryType
    int device = 0;
    void* device_pointer = nullptr;
    void* host_pointer = nullptr;
    long reserved[8] = {};
};
static_assert(sizeof(PointerAttributes) == 88 && offsetof(PointerAttributes, host_pointer) == 16);
}  // namespace cudart

/// The CUDA driver API subset CudaBackend uses for virtual memory (prototypes, values and
/// layouts as in cuda.h, 64-bit).
namespace cudrv {
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
inline constexpr CUresult success = 0;
inline constexpr CUresult error_out_of_memory = 2;
inline constexpr CUresult error_not_supported = 801;
inline constexpr int device_attribute_virtual_memory_management_supported = 102;
inline constexpr int mem_allocation_type_pinned = 1;
inline constexpr int mem_handle_type_none = 0;
inline constexpr int mem_location_type_device = 1;
inline constexpr int mem_access_flags_prot_readwrite = 3;
inline constexpr int mem_alloc_granularity_minimum = 0;

/// CUmemLocation.
struct MemLocation {
    int type = mem_location_type_device;
    int id = 0;
};
/// CUmemAllocationProp: pinned device memory, not exportable.
struct MemAllocationProp {
    int type = mem_allocation_type_pinned;
    int requested_handle_types = mem_handle_type_none;
    MemLocation location;
    void* win32_handle_meta_data = nullptr;
    struct {
        unsigned char compression_type = 0;
        unsigned char gpu_direct_rdma_capable = 0;
        unsigned short usage = 0;
        unsigned char reserved[4] = {};
    } alloc_flags;
};
/// CUmemAccessDesc.
struct MemAccessDesc {
    MemLocation location;
    int flags = mem_access_flags_prot_readwrite;
};
// The layouts of cuda.h (CUDA 12 and 13, x86-64 and aarch64).
static_assert(sizeof(MemLocation) == 8 && offsetof(MemLocation, id) == 4);
static_assert(sizeof(MemAllocationProp) == 32);
static_assert(offsetof(MemAllocationProp, location) == 8);
static_assert(offsetof(MemAllocationProp, win32_handle_meta_data) == 16);
static_assert(offsetof(MemAllocationProp, alloc_flags) == 24);
static_assert(sizeof(MemAccessDesc) == 12 && offsetof(MemAccessDesc, flags) == 8);
static_assert(sizeof(CUdeviceptr) == 8 && sizeof(CUmemGenericAllocationHandle) == 8);
}  // namespace cudrv

namespace detail {

// The runtime entry points CudaBackend calls (prototypes as in cuda_runtime_api.h).
struct CudaRuntimeApi {
    cudart::cudaError_t (*get_device_count)(int*) = nullptr;
    cudart::cudaError_t (*get_device)(int*) = nullptr;
    cudart::cudaError_t (*set_device)(int) = nullptr;
    cudart::cudaError_t (*malloc)(void**, std::size_t) = nullptr;
    cudart::cudaError_t (*free)(void*) = nullptr;
    cudart::cudaError_t (*host_alloc)(void**, std::size_t, unsigned) = nullptr;
    cudart::cudaError_t (*free_host)(void*) = nullptr;
    cudart::cudaError_t (*memcpy)(void*, const void*, std::size_t, int) = nullptr;
    cudart::cudaError_t (*memset)(void*, int, std::size_t) = nullptr;
    cudart::cudaError_t (*device_synchronize)() = nullptr;
    cudart::cudaError_t (*stream_create)(cudart::cudaStream_t*, unsigned) = nullptr;
    cudart::cudaError_t (*stream_destroy)(cudart::cudaStream_t) = nullptr;
    cudart::cudaError_t (*memcpy_async)(void*, const void*, std::size_t, int, cudart::cudaStream_t) = nullptr;
    cudart::cudaError_t (*memset_async)(void*, int, std::size_t, cudart::cudaStream_t) = nullptr;
    cudart::cudaError_t (*event_create)(cudart::cudaEvent_t*, unsigned) = nullptr;
    cudart::cudaError_t (*event_destroy)(cudart::cudaEvent_t) = nullptr;
    cudart::cudaError_t (*event_record)(cudart::cudaEvent_t, cudart::cudaStream_t) = nullptr;
    cudart::cudaError_t (*event_query)(cudart::cudaEvent_t) = nullptr;
    cudart::cudaError_t (*event_synchronize)(cudart::cudaEvent_t) = nullptr;
    cudart::cudaError_t (*stream_wait_event)(cudart::cudaStream_t, cudart::cudaEvent_t, unsigned) = nullptr;
    cudart::cudaError_t (*launch_host_func)(cudart::cudaStream_t, cudart::cudaHostFn_t, void*) = nullptr;
    cudart::cudaError_t (*pointer_get_attributes)(cudart::PointerAttributes*, const void*) = nullptr;
};

// cudaMemcpyBatchAsync, when the runtime has it: the CUDA 13 form, or the 12.8/12.9 one with
// `size_t* failIdx` before the stream; one of the two is set, by cudaRuntimeGetVersion.
struct CudaBatchApi {
    using Batch13 = cudart::cudaError_t(void* const*, const void* const*, const std::size_t*, std::size_t,
                                        cudart::MemcpyAttributes*, std::size_t*, std::size_t, cudart::cudaStream_t);
    using Batch12 = cudart::cudaError_t(void* const*, const void* const*, const std::size_t*, std::size_t,
                                        cudart::MemcpyAttributes*, std::size_t*, std::size_t, std::size_t*,
                                        cudart::cudaStream_t);
    Batch13* batch13 = nullptr;
    Batch12* batch12 = nullptr;
    int runtime_version = 0;

    bool present() const noexcept { return batch13 != nullptr || batch12 != nullptr; }
};

// Resolves cudaRuntimeGetVersion and cudaMemcpyBatchAsync; leaves `api` empty unless both are
// there and the version has the batch call. Never an error: the backend copies one by one then.
inline void resolve_cuda_batch(const DynamicLibrary& library, CudaBatchApi& api) noexcept {
    cudart::cudaError_t (*get_version)(int*) = nullptr;
    if (!library.resolve("cudaRuntimeGetVersion", get_version).ok()) return;
    int version = 0;
    if (get_version(&version) != cudart::success || version < cudart::batch_runtime_version) return;
    CudaBatchApi found;
    found.runtime_version = version;
    // The one symbol, read as the form of the runtime's version.
    const Status resolved = version >= cudart::batch_without_fail_index_version
                                ? library.resolve("cudaMemcpyBatchAsync", found.batch13)
                                : library.resolve("cudaMemcpyBatchAsync", found.batch12);
    if (resolved.ok()) api = found;
}

// Mapped pinned memory, when the runtime has it (every CUDA runtime does; a stand-in may not):
// cudaDeviceGetAttribute to ask the device, cudaHostGetDevicePointer for the device address.
struct CudaMappedApi {
    cudart::cudaError_t (*device_get_attribute)(int*, int, int) = nullptr;
    cudart::cudaError_t (*host_get_device_pointer)(void**, void*, unsigned) = nullptr;
    bool present() const noexcept { return device_get_attribute != nullptr && host_get_device_pointer != nullptr; }
};

// Resolves both entry points; leaves `api` empty when either is missing (never an error: the
// backend then does not map, and a Stager copies).
inline void resolve_cuda_mapped(const DynamicLibrary& library, CudaMappedApi& api) noexcept {
    CudaMappedApi found;
    if (resolve_entry_points(library, "cuda", entry_point("cudaDeviceGetAttribute", found.device_get_attribute),
                             entry_point("cudaHostGetDevicePointer", found.host_get_device_pointer))
            .ok()) {
        api = found;
    }
}

// How runtime calls fail: a cudaError_t and its cudaGetErrorString.
struct CudaRuntimeErrors {
    using Code = cudart::cudaError_t;
    static constexpr Code success = cudart::success;
    static constexpr std::string_view code_name = "cudaError";
    const char* (*error_string)(cudart::cudaError_t) = nullptr;

    Errc errc(Code code) const noexcept {
        if (code == cudart::error_memory_allocation) return Errc::out_of_memory;
        if (code == cudart::error_no_device || code == cudart::error_insufficient_driver) {
            return Errc::not_supported;
        }
        return Errc::backend_failure;
    }
    const char* text(Code code) const noexcept { return error_string != nullptr ? error_string(code) : nullptr; }
};

// Resolves every runtime entry point, and cudaGetErrorString; the first one missing is
// library_not_found.
inline Status resolve_cuda_runtime(const DynamicLibrary& library, CudaRuntimeApi& api,
                                   CudaRuntimeErrors& errors) noexcept {
    return resolve_entry_points(
        library, "cuda", entry_point("cudaGetDeviceCount", api.get_device_count),
        entry_point("cudaGetDevice", api.get_device), entry_point("cudaSetDevice", api.set_device),
        entry_point("cudaMalloc", api.malloc), entry_point("cudaFree", api.free),
        entry_point("cudaHostAlloc", api.host_alloc), entry_point("cudaFreeHost", api.free_host),
        entry_point("cudaMemcpy", api.memcpy), entry_point("cudaMemset", api.memset),
        entry_point("cudaDeviceSynchronize", api.device_synchronize),
        entry_point("cudaGetErrorString", errors.error_string),
        entry_point("cudaStreamCreateWithFlags", api.stream_create),
        entry_point("cudaStreamDestroy", api.stream_destroy), entry_point("cudaMemcpyAsync", api.memcpy_async),
        entry_point("cudaMemsetAsync", api.memset_async), entry_point("cudaEventCreateWithFlags", api.event_create),
        entry_point("cudaEventDestroy", api.event_destroy), entry_point("cudaEventRecord", api.event_record),
        entry_point("cudaEventQuery", api.event_query), entry_point("cudaEventSynchronize", api.event_synchronize),
        entry_point("cudaStreamWaitEvent", api.stream_wait_event),
        entry_point("cudaLaunchHostFunc", api.launch_host_func),
        entry_point("cudaPointerGetAttributes", api.pointer_get_attributes));
}

// The driver entry points of virtual memory (prototypes as in cuda.h).
struct CudaDriverApi {
    cudrv::CUresult (*device_get)(cudrv::CUdevice*, int) = nullptr;
    cudrv::CUresult (*device_get_attribute)(int*, int, cudrv::CUdevice) = nullptr;
    cudrv::CUresult (*granularity)(std::size_t*, const cudrv::MemAllocationProp*, int) = nullptr;
    cudrv::CUresult (*address_reserve)(cudrv::CUdeviceptr*, std::size_t, std::size_t, cudrv::CUdeviceptr,
                                       unsigned long long) = nullptr;
    cudrv::CUresult (*address_free)(cudrv::CUdeviceptr, std::size_t) = nullptr;
    cudrv::CUresult (*create)(cudrv::CUmemGenericAllocationHandle*, std::size_t, const cudrv::MemAllocationProp*,
                              unsigned long long) = nullptr;
    cudrv::CUresult (*release)(cudrv::CUmemGenericAllocationHandle) = nullptr;
    cudrv::CUresult (*map)(cudrv::CUdeviceptr, std::size_t, std::size_t, cudrv::CUmemGenericAllocationHandle,
                           unsigned long long) = nullptr;
    cudrv::CUresult (*set_access)(cudrv::CUdeviceptr, std::size_t, const cudrv::MemAccessDesc*, std::size_t) = nullptr;
    cudrv::CUresult (*unmap)(cudrv::CUdeviceptr, std::size_t) = nullptr;
};

// How driver calls fail: a CUresult and its cuGetErrorString.
struct CudaDriverErrors {
    using Code = cudrv::CUresult;
    static constexpr Code success = cudrv::success;
    static constexpr std::string_view code_name = "CUresult";
    cudrv::CUresult (*error_string)(cudrv::CUresult, const char**) = nullptr;

    Errc errc(Code code) const noexcept {
        if (code == cudrv::error_out_of_memory) return Errc::out_of_memory;
        if (code == cudrv::error_not_supported) return Errc::not_supported;
        return Errc::backend_failure;
    }
    const char* text(Code code) const noexcept {
        const char* words = nullptr;
        if (error_string == nullptr || error_string(code, &words) != cudrv::success) return nullptr;
        return words;
    }
};

// Resolves every driver entry point, and cuGetErrorString; the first one missing is
// library_not_found.
inline Status resolve_cuda_driver(const DynamicLibrary& library, CudaDriverApi& api,
                                  CudaDriverErrors& errors) noexcept {
    return resolve_entry_points(
        library, "cuda driver", entry_point("cuDeviceGet", api.device_get),
        entry_point("cuDeviceGetAttribute", api.device_get_attribute),
        entry_point("cuMemGetAllocationGranularity", api.granularity),
        entry_point("cuMemAddressReserve", api.address_reserve), entry_point("cuMemAddressFree", api.address_free),
        entry_point("cuMemCreate", api.create), entry_point("cuMemRelease", api.release),
        entry_point("cuMemMap", api.map), entry_point("cuMemSetAccess", api.set_access),
        entry_point("cuMemUnmap", api.unmap), entry_point("cuGetErrorString", errors.error_string));
}

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
