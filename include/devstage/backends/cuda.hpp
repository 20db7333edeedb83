// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// CudaBackend: NVIDIA GPUs through the CUDA runtime, loaded at run time with dlopen — no
/// CUDA header or library is needed to compile. Bound to one device: before each call it makes
/// that device current on the calling thread if another one is. Streams and events are the
/// runtime's; virtual memory (in-place growth) goes through the driver API, loaded too.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/dynamic_library.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/detail/runtime_call.hpp"
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
inline constexpr unsigned stream_non_blocking = 0x01;
inline constexpr unsigned event_disable_timing = 0x02;
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

/// One CUDA device through libcudart. `auto gpu = CudaBackend::create(0); if (!gpu) …`
/// Move-only. `create` fails with library_not_found when libcudart cannot be loaded, and with
/// not_supported when it loads but finds no usable device (no driver, no GPU).
class CudaBackend {
public:
    /// cudaMalloc guarantees at least 256 bytes.
    static constexpr std::size_t device_alignment = 256;

    /// A CUDA stream (cudaStream_t). Streams made by create_stream are non-blocking (they do
    /// not synchronize with the legacy default stream); the caller destroys them. A stream
    /// made elsewhere can be wrapped: `CudaBackend::Stream{my_stream}`.
    struct Stream {
        cudart::cudaStream_t handle = nullptr;
        friend bool operator==(Stream, Stream) = default;
    };
    /// A CUDA event (cudaEvent_t), made without timing.
    struct Event {
        cudart::cudaEvent_t handle = nullptr;
        friend bool operator==(Event, Event) = default;
    };
    /// A physical chunk of device memory (CUmemGenericAllocationHandle).
    using PhysicalHandle = cudrv::CUmemGenericAllocationHandle;

    /// Loads the runtime (`library_path`, else $DEVSTAGE_CUDART_LIBRARY, else libcudart.so.13,
    /// libcudart.so.12, libcudart.so) and binds to `device_id`. Then loads the driver for
    /// virtual memory (`driver_library_path`, else $DEVSTAGE_CUDA_DRIVER_LIBRARY, else
    /// libcuda.so.1, libcuda.so); a driver that cannot be loaded or lacks virtual memory only
    /// turns virtual memory off (vmm_granularity() 0), never fails creation.
    static Result<CudaBackend> create(int device_id, std::string library_path = {},
                                      std::string driver_library_path = {}) noexcept {
        Result<detail::DynamicLibrary> library = detail::DynamicLibrary::open(
            std::move(library_path), "DEVSTAGE_CUDART_LIBRARY", {"libcudart.so.13", "libcudart.so.12", "libcudart.so"});
        if (!library) return Status(Errc::library_not_found, detail::message("cuda: ", library.status().message()));
        CudaBackend backend;
        backend.library_ = std::move(*library);
        backend.device_ = device_id;
        if (Status resolved = backend.resolve(); !resolved) return resolved;
        int count = 0;
        if (Status s = detail::checked_call(backend.errors_, backend.site(), "cudaGetDeviceCount", 0,
                                            backend.api_.get_device_count, &count);
            !s) {
            return s;
        }
        if (device_id < 0 || device_id >= count) {
            return Status(Errc::invalid_argument,
                          detail::message("cuda: device ", device_id, " requested, ", count, " device(s) present"));
        }
        if (Status bound = backend.bind(); !bound) return bound;
        backend.probe_vmm(std::move(driver_library_path));
        return backend;
    }

    CudaBackend(CudaBackend&& other) noexcept
        : library_(std::move(other.library_)),
          api_(other.api_),
          errors_(other.errors_),
          device_(other.device_),
          driver_library_(std::move(other.driver_library_)),
          driver_(other.driver_),
          driver_errors_(other.driver_errors_),
          granularity_(std::exchange(other.granularity_, 0)),
          vmm_unavailable_(std::move(other.vmm_unavailable_)),
          reservations_(std::move(other.reservations_)) {}
    CudaBackend& operator=(CudaBackend&&) = delete;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;
    ~CudaBackend() = default;

    std::string_view name() const noexcept { return "cuda"; }
    int device_id() const noexcept { return device_; }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        void* pointer = nullptr;
        if (Status s = call("cudaMalloc", api_.malloc, bytes, &pointer, bytes); !s) return s;
        return pointer;
    }
    Status device_free(void* pointer) noexcept { return call("cudaFree", api_.free, 0, pointer); }
    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpy(host to device)", api_.memcpy, bytes, device_dst, host_src, bytes,
                    cudart::memcpy_host_to_device);
    }
    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpy(device to host)", api_.memcpy, bytes, host_dst, device_src, bytes,
                    cudart::memcpy_device_to_host);
    }
    Status device_memset(void* device_dst, int value, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemset", api_.memset, bytes, device_dst, value, bytes);
    }
    Status synchronize() noexcept { return call("cudaDeviceSynchronize", api_.device_synchronize, 0); }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        void* pointer = nullptr;
        if (Status s = call("cudaHostAlloc", api_.host_alloc, bytes, &pointer, bytes, cudart::host_alloc_default); !s) {
            return s;
        }
        return pointer;
    }
    Status pinned_free(void* pointer) noexcept { return call("cudaFreeHost", api_.free_host, 0, pointer); }

    // ---- streams and events ----------------------------------------------------------------
    // An error of earlier asynchronous work (a faulting kernel, a copy that failed) is sticky
    // in the device's context: any later call may report it, not only the one that waits.

    /// cudaStreamCreateWithFlags(cudaStreamNonBlocking).
    Result<Stream> create_stream() noexcept {
        Stream stream;
        if (Status s =
                call("cudaStreamCreateWithFlags", api_.stream_create, 0, &stream.handle, cudart::stream_non_blocking);
            !s) {
            return s;
        }
        return stream;
    }
    /// cudaStreamDestroy: returns at once; work already enqueued still completes.
    Status destroy_stream(Stream stream) noexcept {
        return call("cudaStreamDestroy", api_.stream_destroy, 0, stream.handle);
    }
    /// cudaMemcpyAsync host to device on `stream`; zero bytes are not sent. From pageable host
    /// memory the runtime stages the copy and returns only once the source was read.
    Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpyAsync(host to device)", api_.memcpy_async, bytes, device_dst, host_src, bytes,
                    cudart::memcpy_host_to_device, stream.handle);
    }
    /// cudaMemcpyAsync device to host on `stream`; zero bytes are not sent.
    Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpyAsync(device to host)", api_.memcpy_async, bytes, host_dst, device_src, bytes,
                    cudart::memcpy_device_to_host, stream.handle);
    }
    /// cudaEventCreateWithFlags(cudaEventDisableTiming).
    Result<Event> create_event() noexcept {
        Event event;
        if (Status s =
                call("cudaEventCreateWithFlags", api_.event_create, 0, &event.handle, cudart::event_disable_timing);
            !s) {
            return s;
        }
        return event;
    }
    /// cudaEventDestroy: allowed while the event is pending; its resources go when it completes.
    Status destroy_event(Event event) noexcept { return call("cudaEventDestroy", api_.event_destroy, 0, event.handle); }
    /// cudaEventRecord(event, stream).
    Status record_event(Event event, Stream stream) noexcept {
        return call("cudaEventRecord", api_.event_record, 0, event.handle, stream.handle);
    }
    /// cudaEventQuery: true on cudaSuccess (a never-recorded event too), false on
    /// cudaErrorNotReady, an error otherwise — possibly a sticky one of earlier work.
    Result<bool> event_ready(Event event) noexcept {
        if (Status bound = bind(); !bound) return bound;
        const cudart::cudaError_t code = api_.event_query(event.handle);
        if (code == cudart::success) return true;
        if (code == cudart::error_not_ready) return false;
        return detail::call_failure(errors_, site(), "cudaEventQuery", code, 0);
    }
    /// cudaEventSynchronize: the host blocks until the event completed.
    Status synchronize_event(Event event) noexcept {
        return call("cudaEventSynchronize", api_.event_synchronize, 0, event.handle);
    }
    /// cudaStreamWaitEvent(stream, event, 0): later work on `stream` waits for `event`.
    Status stream_wait_event(Stream stream, Event event) noexcept {
        return call("cudaStreamWaitEvent", api_.stream_wait_event, 0, stream.handle, event.handle, 0U);
    }
    /// cudaLaunchHostFunc: `function(user_data)` runs on a runtime thread in stream order. It
    /// must not call CUDA.
    Status launch_host_func(Stream stream, HostFunction function, void* user_data) noexcept {
        return call("cudaLaunchHostFunc", api_.launch_host_func, 0, stream.handle, function, user_data);
    }

    // ---- virtual memory (in-place growth), through the driver API ---------------------------
    // Each call first makes the device's primary context — the runtime's — current with
    // cudaSetDevice. When the driver, an entry point or the device's support is missing,
    // vmm_granularity() is 0 and every vmm_ call is not_supported, saying why.

    /// The minimum granularity of physical chunks on this device; 0 when unsupported.
    std::size_t vmm_granularity() const noexcept { return granularity_; }

    /// cuMemAddressReserve(&va, bytes, 0, 0, 0).
    Result<void*> vmm_reserve(std::size_t bytes) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        cudrv::CUdeviceptr base = 0;
        if (Status s = driver_call("cuMemAddressReserve", driver_.address_reserve, bytes, &base, bytes, std::size_t{0},
                                   cudrv::CUdeviceptr{0}, 0ULL);
            !s) {
            return s;
        }
        const std::lock_guard lock(reservations_mutex_);
        reservations_.push_back(Reservation{base, bytes});
        return to_pointer(base);
    }
    /// cuMemAddressFree(va, size reserved); `va` must be a reservation of this backend.
    Status vmm_release(void* base) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        const cudrv::CUdeviceptr address = to_address(base);
        std::size_t bytes = 0;
        {
            const std::lock_guard lock(reservations_mutex_);
            for (auto it = reservations_.begin(); it != reservations_.end(); ++it) {
                if (it->base != address) continue;
                bytes = it->bytes;
                reservations_.erase(it);
                break;
            }
        }
        if (bytes == 0) {
            return Status(Errc::invalid_argument,
                          detail::message("cuda cuMemAddressFree: ", static_cast<const void*>(base),
                                          " is not a reservation of this backend on device ", device_));
        }
        Status freed = driver_call("cuMemAddressFree", driver_.address_free, bytes, address, bytes);
        if (!freed) {
            const std::lock_guard lock(reservations_mutex_);
            reservations_.push_back(Reservation{address, bytes});
        }
        return freed;
    }
    /// cuMemCreate(&handle, bytes, {pinned, device}, 0).
    Result<PhysicalHandle> vmm_create(std::size_t bytes) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        PhysicalHandle handle = 0;
        const cudrv::MemAllocationProp prop = device_prop();
        if (Status s = driver_call("cuMemCreate", driver_.create, bytes, &handle, bytes, &prop, 0ULL); !s) return s;
        return handle;
    }
    /// cuMemRelease(handle).
    Status vmm_free(PhysicalHandle handle) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        return driver_call("cuMemRelease", driver_.release, 0, handle);
    }
    /// cuMemMap(va, bytes, 0, handle, 0), then cuMemSetAccess read-write for this device; if
    /// granting access fails the range is unmapped again.
    Status vmm_map(void* address, std::size_t bytes, PhysicalHandle handle) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        const cudrv::CUdeviceptr va = to_address(address);
        if (Status s = driver_call("cuMemMap", driver_.map, bytes, va, bytes, std::size_t{0}, handle, 0ULL); !s) {
            return s;
        }
        cudrv::MemAccessDesc access;
        access.location.id = device_;
        Status granted = driver_call("cuMemSetAccess", driver_.set_access, bytes, va, bytes, &access, std::size_t{1});
        if (!granted) (void)driver_.unmap(va, bytes);
        return granted;
    }
    /// cuMemUnmap(va, bytes).
    Status vmm_unmap(void* address, std::size_t bytes) noexcept {
        if (Status s = vmm_ready(); !s) return s;
        return driver_call("cuMemUnmap", driver_.unmap, bytes, to_address(address), bytes);
    }

private:
    struct Api {
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
        cudart::cudaError_t (*event_create)(cudart::cudaEvent_t*, unsigned) = nullptr;
        cudart::cudaError_t (*event_destroy)(cudart::cudaEvent_t) = nullptr;
        cudart::cudaError_t (*event_record)(cudart::cudaEvent_t, cudart::cudaStream_t) = nullptr;
        cudart::cudaError_t (*event_query)(cudart::cudaEvent_t) = nullptr;
        cudart::cudaError_t (*event_synchronize)(cudart::cudaEvent_t) = nullptr;
        cudart::cudaError_t (*stream_wait_event)(cudart::cudaStream_t, cudart::cudaEvent_t, unsigned) = nullptr;
        cudart::cudaError_t (*launch_host_func)(cudart::cudaStream_t, cudart::cudaHostFn_t, void*) = nullptr;
    };

    // How runtime calls fail: a cudaError_t and its cudaGetErrorString.
    struct RuntimeErrors {
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

    struct DriverApi {
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
        cudrv::CUresult (*set_access)(cudrv::CUdeviceptr, std::size_t, const cudrv::MemAccessDesc*,
                                      std::size_t) = nullptr;
        cudrv::CUresult (*unmap)(cudrv::CUdeviceptr, std::size_t) = nullptr;
    };

    // How driver calls fail: a CUresult and its cuGetErrorString.
    struct DriverErrors {
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

    struct Reservation {
        cudrv::CUdeviceptr base;
        std::size_t bytes;
    };

    CudaBackend() = default;

    Status resolve() noexcept {
        using detail::entry_point;
        return detail::resolve_entry_points(
            library_, "cuda", entry_point("cudaGetDeviceCount", api_.get_device_count),
            entry_point("cudaGetDevice", api_.get_device), entry_point("cudaSetDevice", api_.set_device),
            entry_point("cudaMalloc", api_.malloc), entry_point("cudaFree", api_.free),
            entry_point("cudaHostAlloc", api_.host_alloc), entry_point("cudaFreeHost", api_.free_host),
            entry_point("cudaMemcpy", api_.memcpy), entry_point("cudaMemset", api_.memset),
            entry_point("cudaDeviceSynchronize", api_.device_synchronize),
            entry_point("cudaGetErrorString", errors_.error_string),
            entry_point("cudaStreamCreateWithFlags", api_.stream_create),
            entry_point("cudaStreamDestroy", api_.stream_destroy), entry_point("cudaMemcpyAsync", api_.memcpy_async),
            entry_point("cudaEventCreateWithFlags", api_.event_create),
            entry_point("cudaEventDestroy", api_.event_destroy), entry_point("cudaEventRecord", api_.event_record),
            entry_point("cudaEventQuery", api_.event_query),
            entry_point("cudaEventSynchronize", api_.event_synchronize),
            entry_point("cudaStreamWaitEvent", api_.stream_wait_event),
            entry_point("cudaLaunchHostFunc", api_.launch_host_func));
    }

    // Loads the driver and keeps its virtual-memory entry points if the device supports them;
    // otherwise records why not.
    void probe_vmm(std::string driver_library_path) noexcept {
        Result<detail::DynamicLibrary> driver = detail::DynamicLibrary::open(
            std::move(driver_library_path), "DEVSTAGE_CUDA_DRIVER_LIBRARY", {"libcuda.so.1", "libcuda.so"});
        if (!driver) {
            vmm_unavailable_ = driver.status().message();
            return;
        }
        using detail::entry_point;
        DriverApi api;
        DriverErrors errors;
        if (Status s = detail::resolve_entry_points(
                *driver, "cuda driver", entry_point("cuDeviceGet", api.device_get),
                entry_point("cuDeviceGetAttribute", api.device_get_attribute),
                entry_point("cuMemGetAllocationGranularity", api.granularity),
                entry_point("cuMemAddressReserve", api.address_reserve),
                entry_point("cuMemAddressFree", api.address_free), entry_point("cuMemCreate", api.create),
                entry_point("cuMemRelease", api.release), entry_point("cuMemMap", api.map),
                entry_point("cuMemSetAccess", api.set_access), entry_point("cuMemUnmap", api.unmap),
                entry_point("cuGetErrorString", errors.error_string));
            !s) {
            vmm_unavailable_ = s.message();
            return;
        }
        cudrv::CUdevice device = 0;
        int supported = 0;
        std::size_t granularity = 0;
        const cudrv::MemAllocationProp prop = device_prop();
        Status probed = bind_primary_context();
        if (probed) probed = detail::checked_call(errors, site(), "cuDeviceGet", 0, api.device_get, &device, device_);
        if (probed) {
            probed =
                detail::checked_call(errors, site(), "cuDeviceGetAttribute", 0, api.device_get_attribute, &supported,
                                     cudrv::device_attribute_virtual_memory_management_supported, device);
        }
        if (probed && supported == 0) {
            probed = Status(Errc::not_supported, "the device reports no virtual memory management");
        }
        if (probed) {
            probed = detail::checked_call(errors, site(), "cuMemGetAllocationGranularity", 0, api.granularity,
                                          &granularity, &prop, cudrv::mem_alloc_granularity_minimum);
        }
        if (probed && granularity == 0) probed = Status(Errc::not_supported, "the driver reports granularity 0");
        if (!probed) {
            vmm_unavailable_ = probed.message();
            return;
        }
        driver_library_ = std::move(*driver);
        driver_ = api;
        driver_errors_ = errors;
        granularity_ = granularity;
    }

    Status vmm_ready() const noexcept {
        if (granularity_ != 0) return {};
        return Status(Errc::not_supported, detail::message("cuda: virtual memory is not available for device ", device_,
                                                           ": ", vmm_unavailable_));
    }

    cudrv::MemAllocationProp device_prop() const noexcept {
        cudrv::MemAllocationProp prop;
        prop.location.id = device_;
        return prop;
    }

    static cudrv::CUdeviceptr to_address(void* pointer) noexcept {
        return static_cast<cudrv::CUdeviceptr>(reinterpret_cast<std::uintptr_t>(pointer));
    }
    static void* to_pointer(cudrv::CUdeviceptr address) noexcept {
        // NOLINTNEXTLINE(performance-no-int-to-ptr): the driver hands out device addresses as integers
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
    }

    detail::CallSite site() const noexcept { return {name(), device_}; }

    // Makes this backend's device current on the calling thread when another one is.
    Status bind() noexcept {
        int current = -1;
        if (Status s = detail::checked_call(errors_, site(), "cudaGetDevice", 0, api_.get_device, &current); !s) {
            return s;
        }
        if (current == device_) return {};
        return detail::checked_call(errors_, site(), "cudaSetDevice", 0, api_.set_device, device_);
    }

    // Makes the device's primary context current on the calling thread, as the driver calls
    // need: since CUDA 12, cudaSetDevice does that even when the device is already current.
    Status bind_primary_context() noexcept {
        return detail::checked_call(errors_, site(), "cudaSetDevice", 0, api_.set_device, device_);
    }

    template <class F, class... Args>
    Status call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        if (Status bound = bind(); !bound) return bound;
        return detail::checked_call(errors_, site(), what, bytes, function, args...);
    }

    template <class F, class... Args>
    Status driver_call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        if (Status bound = bind_primary_context(); !bound) return bound;
        return detail::checked_call(driver_errors_, site(), what, bytes, function, args...);
    }

    detail::DynamicLibrary library_;
    Api api_;
    RuntimeErrors errors_;
    int device_ = 0;
    detail::DynamicLibrary driver_library_;
    DriverApi driver_;
    DriverErrors driver_errors_;
    std::size_t granularity_ = 0;
    std::string vmm_unavailable_;
    std::mutex reservations_mutex_;
    std::vector<Reservation> reservations_;
};

static_assert(Backend<CudaBackend>);
static_assert(PinnedHostBackend<CudaBackend>);
static_assert(MemsetBackend<CudaBackend>);
static_assert(SynchronizingBackend<CudaBackend>);
static_assert(AsyncBackend<CudaBackend>);
static_assert(HostFunctionBackend<CudaBackend>);
static_assert(VirtualMemoryBackend<CudaBackend>);

}  // namespace devstage
