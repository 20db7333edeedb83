// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the virtual memory of a CudaBackend (in-place growth), through the driver API. It
// loads the driver and probes the device's support once; afterwards it keeps the reservations
// the backend made (cuMemAddressFree needs the size reserved) and makes the vmm_ calls. Each
// driver call first makes the device's primary context — the runtime's — current with
// cudaSetDevice. When the driver, an entry point or the device's support is missing,
// granularity() is 0 and every call is not_supported, saying why.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "devstage/backends/cuda_abi.hpp"
#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/backends/detail/runtime_call.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class CudaVirtualMemory {
public:
    using Handle = cudrv::CUmemGenericAllocationHandle;

    /// Unavailable until probe() finds the driver and the device's support.
    CudaVirtualMemory() = default;
    /// Takes over the reservations; `other` is left unavailable.
    CudaVirtualMemory(CudaVirtualMemory&& other) noexcept
        : device_(other.device_),
          site_(other.site_),
          set_device_(other.set_device_),
          runtime_errors_(other.runtime_errors_),
          library_(std::move(other.library_)),
          driver_(other.driver_),
          errors_(other.errors_),
          granularity_(std::exchange(other.granularity_, 0)),
          unavailable_(std::move(other.unavailable_)),
          reservations_(std::move(other.reservations_)) {}
    CudaVirtualMemory& operator=(CudaVirtualMemory&&) = delete;
    CudaVirtualMemory(const CudaVirtualMemory&) = delete;
    CudaVirtualMemory& operator=(const CudaVirtualMemory&) = delete;
    ~CudaVirtualMemory() = default;

    /// Loads the driver (`driver_library_path`, else $DEVSTAGE_CUDA_DRIVER_LIBRARY, else
    /// libcuda.so.1, libcuda.so) and keeps its virtual-memory entry points if `device`
    /// supports them; otherwise records why not. `set_device` is the runtime's cudaSetDevice
    /// and `runtime_errors` how it fails; `site` names the backend and device in messages.
    void probe(std::string driver_library_path, int device, CallSite site, cudart::cudaError_t (*set_device)(int),
               const CudaRuntimeErrors& runtime_errors) noexcept {
        device_ = device;
        site_ = site;
        set_device_ = set_device;
        runtime_errors_ = runtime_errors;
        Result<DynamicLibrary> driver = DynamicLibrary::open(
            std::move(driver_library_path), "DEVSTAGE_CUDA_DRIVER_LIBRARY", {"libcuda.so.1", "libcuda.so"});
        if (!driver) {
            unavailable_ = driver.status().message();
            return;
        }
        CudaDriverApi api;
        CudaDriverErrors errors;
        if (Status s = resolve_cuda_driver(*driver, api, errors); !s) {
            unavailable_ = s.message();
            return;
        }
        cudrv::CUdevice handle = 0;
        int supported = 0;
        std::size_t granularity = 0;
        const cudrv::MemAllocationProp prop = device_prop();
        Status probed = bind_primary_context();
        if (probed) probed = checked_call(errors, site_, "cuDeviceGet", 0, api.device_get, &handle, device_);
        if (probed) {
            probed = checked_call(errors, site_, "cuDeviceGetAttribute", 0, api.device_get_attribute, &supported,
                                  cudrv::device_attribute_virtual_memory_management_supported, handle);
        }
        if (probed && supported == 0) {
            probed = Status(Errc::not_supported, "the device reports no virtual memory management");
        }
        if (probed) {
            probed = checked_call(errors, site_, "cuMemGetAllocationGranularity", 0, api.granularity, &granularity,
                                  &prop, cudrv::mem_alloc_granularity_minimum);
        }
        if (probed && granularity == 0) probed = Status(Errc::not_supported, "the driver reports granularity 0");
        if (!probed) {
            unavailable_ = probed.message();
            return;
        }
        library_ = std::move(*driver);
        driver_ = api;
        errors_ = errors;
        granularity_ = granularity;
    }

    /// The minimum granularity of physical chunks on the device; 0 when unsupported.
    std::size_t granularity() const noexcept { return granularity_; }

    /// cuMemAddressReserve(&va, bytes, 0, 0, 0).
    Result<void*> reserve(std::size_t bytes) noexcept {
        if (Status s = ready(); !s) return s;
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
    /// cuMemAddressFree(va, size reserved); `va` must be a reservation made by reserve().
    Status release(void* base) noexcept {
        if (Status s = ready(); !s) return s;
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
                          message(site_.backend, " cuMemAddressFree: ", static_cast<const void*>(base),
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
    Result<Handle> create(std::size_t bytes) noexcept {
        if (Status s = ready(); !s) return s;
        Handle handle = 0;
        const cudrv::MemAllocationProp prop = device_prop();
        if (Status s = driver_call("cuMemCreate", driver_.create, bytes, &handle, bytes, &prop, 0ULL); !s) return s;
        return handle;
    }
    /// cuMemRelease(handle).
    Status free(Handle handle) noexcept {
        if (Status s = ready(); !s) return s;
        return driver_call("cuMemRelease", driver_.release, 0, handle);
    }
    /// cuMemMap(va, bytes, 0, handle, 0), then cuMemSetAccess read-write for the device; if
    /// granting access fails the range is unmapped again.
    Status map(void* address, std::size_t bytes, Handle handle) noexcept {
        if (Status s = ready(); !s) return s;
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
    Status unmap(void* address, std::size_t bytes) noexcept {
        if (Status s = ready(); !s) return s;
        return driver_call("cuMemUnmap", driver_.unmap, bytes, to_address(address), bytes);
    }

private:
    struct Reservation {
        cudrv::CUdeviceptr base;
        std::size_t bytes;
    };

    Status ready() const noexcept {
        if (granularity_ != 0) return {};
        return Status(Errc::not_supported, message(site_.backend, ": virtual memory is not available for device ",
                                                   device_, ": ", unavailable_));
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

    // Makes the device's primary context current on the calling thread, as the driver calls
    // need: since CUDA 12, cudaSetDevice does that even when the device is already current.
    Status bind_primary_context() noexcept {
        return checked_call(runtime_errors_, site_, "cudaSetDevice", 0, set_device_, device_);
    }

    template <class F, class... Args>
    Status driver_call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        if (Status bound = bind_primary_context(); !bound) return bound;
        return checked_call(errors_, site_, what, bytes, function, args...);
    }

    int device_ = 0;
    CallSite site_{};
    cudart::cudaError_t (*set_device_)(int) = nullptr;
    CudaRuntimeErrors runtime_errors_;
    DynamicLibrary library_;
    CudaDriverApi driver_;
    CudaDriverErrors errors_;
    std::size_t granularity_ = 0;
    std::string unavailable_;
    std::mutex reservations_mutex_;
    std::vector<Reservation> reservations_;
};

}  // namespace devstage::detail
