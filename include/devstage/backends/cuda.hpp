// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// CudaBackend: NVIDIA GPUs through the CUDA runtime, loaded at run time with dlopen — no
/// CUDA header or library is needed to compile. Bound to one device: before each call it makes
/// that device current on the calling thread if another one is.

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

/// The CUDA runtime C ABI subset CudaBackend uses (prototypes as in cuda_runtime_api.h).
namespace cudart {
using cudaError_t = int;
inline constexpr cudaError_t success = 0;
inline constexpr cudaError_t error_memory_allocation = 2;
inline constexpr cudaError_t error_insufficient_driver = 35;
inline constexpr cudaError_t error_no_device = 100;
inline constexpr int memcpy_host_to_device = 1;
inline constexpr int memcpy_device_to_host = 2;
inline constexpr unsigned host_alloc_default = 0;
}  // namespace cudart

/// One CUDA device through libcudart. `auto gpu = CudaBackend::create(0); if (!gpu) …`
/// Move-only. `create` fails with library_not_found when libcudart cannot be loaded, and with
/// not_supported when it loads but finds no usable device (no driver, no GPU).
class CudaBackend {
public:
    /// cudaMalloc guarantees at least 256 bytes.
    static constexpr std::size_t device_alignment = 256;

    /// Loads the runtime (`library_path`, else $DEVSTAGE_CUDART_LIBRARY, else libcudart.so.13,
    /// libcudart.so.12, libcudart.so) and binds to `device_id`.
    static Result<CudaBackend> create(int device_id, std::string library_path = {}) noexcept {
        Result<detail::DynamicLibrary> library = detail::DynamicLibrary::open(
            std::move(library_path), "DEVSTAGE_CUDART_LIBRARY", {"libcudart.so.13", "libcudart.so.12", "libcudart.so"});
        if (!library) return Status(Errc::library_not_found, detail::message("cuda: ", library.status().message()));
        CudaBackend backend;
        backend.library_ = std::move(*library);
        backend.device_ = device_id;
        if (Status resolved = backend.resolve(); !resolved) return resolved;
        int count = 0;
        if (const cudart::cudaError_t e = backend.api_.get_device_count(&count); e != cudart::success) {
            return backend.failure("cudaGetDeviceCount", e, 0);
        }
        if (device_id < 0 || device_id >= count) {
            return Status(Errc::invalid_argument,
                          detail::message("cuda: device ", device_id, " requested, ", count, " device(s) present"));
        }
        if (Status bound = backend.bind(); !bound) return bound;
        return backend;
    }

    CudaBackend(CudaBackend&& other) noexcept
        : library_(std::move(other.library_)), api_(other.api_), device_(other.device_) {}
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
        const char* (*error_string)(cudart::cudaError_t) = nullptr;
    };

    CudaBackend() = default;

    Status resolve() noexcept {
        const Status steps[] = {
            library_.resolve("cudaGetDeviceCount", api_.get_device_count),
            library_.resolve("cudaGetDevice", api_.get_device),
            library_.resolve("cudaSetDevice", api_.set_device),
            library_.resolve("cudaMalloc", api_.malloc),
            library_.resolve("cudaFree", api_.free),
            library_.resolve("cudaHostAlloc", api_.host_alloc),
            library_.resolve("cudaFreeHost", api_.free_host),
            library_.resolve("cudaMemcpy", api_.memcpy),
            library_.resolve("cudaMemset", api_.memset),
            library_.resolve("cudaDeviceSynchronize", api_.device_synchronize),
            library_.resolve("cudaGetErrorString", api_.error_string),
        };
        for (const Status& status : steps) {
            if (!status) return Status(Errc::library_not_found, detail::message("cuda: ", status.message()));
        }
        return {};
    }

    // Makes this backend's device current on the calling thread when another one is.
    Status bind() noexcept {
        int current = -1;
        if (const cudart::cudaError_t e = api_.get_device(&current); e != cudart::success) {
            return failure("cudaGetDevice", e, 0);
        }
        if (current == device_) return {};
        if (const cudart::cudaError_t e = api_.set_device(device_); e != cudart::success) {
            return failure("cudaSetDevice", e, 0);
        }
        return {};
    }

    template <class F, class... Args>
    Status call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        if (Status bound = bind(); !bound) return bound;
        if (const cudart::cudaError_t e = function(args...); e != cudart::success) return failure(what, e, bytes);
        return {};
    }

    Status failure(const char* what, cudart::cudaError_t code, std::size_t bytes) const noexcept {
        const char* text = api_.error_string != nullptr ? api_.error_string(code) : nullptr;
        Errc errc = Errc::backend_failure;
        if (code == cudart::error_memory_allocation) errc = Errc::out_of_memory;
        if (code == cudart::error_no_device || code == cudart::error_insufficient_driver) errc = Errc::not_supported;
        return Status(errc, detail::message("cuda ", what, " failed", bytes > 0 ? " for " : "",
                                            bytes > 0 ? detail::message(bytes, " bytes") : std::string(), " on device ",
                                            device_, ": cudaError ", code, " (", text != nullptr ? text : "?", ")"));
    }

    detail::DynamicLibrary library_;
    Api api_;
    int device_ = 0;
};

static_assert(Backend<CudaBackend>);
static_assert(PinnedHostBackend<CudaBackend>);
static_assert(MemsetBackend<CudaBackend>);
static_assert(SynchronizingBackend<CudaBackend>);

}  // namespace devstage
