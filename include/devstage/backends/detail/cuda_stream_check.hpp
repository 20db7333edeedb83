// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: CudaBackend's check of a stream it is given — cudaStreamGetDevice (CUDA 12.8 and
// later), resolved where the runtime exports it. A stream of another device is invalid_argument
// naming both devices: CUDA itself would run the copies of another device's stream, on that
// device's queue, and nothing would say so.

#include <cstdint>

#include "devstage/backends/cuda_abi.hpp"
#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/backends/detail/runtime_call.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

struct CudaStreamCheckApi {
    cudart::cudaError_t (*stream_get_device)(cudart::cudaStream_t, int*) = nullptr;

    void resolve(const DynamicLibrary& library) noexcept {
        if (!library.resolve("cudaStreamGetDevice", stream_get_device).ok()) stream_get_device = nullptr;
    }
    bool present() const noexcept { return stream_get_device != nullptr; }

    /// Ok when `stream` belongs to `device`; the default streams (null, cudaStreamLegacy,
    /// cudaStreamPerThread) are the current device's, which the backend makes its own for every
    /// call. Without cudaStreamGetDevice nothing can be told: ok.
    Status check(const CudaRuntimeErrors& errors, const CallSite& site, cudart::cudaStream_t stream,
                 int device) const noexcept {
        const auto value = reinterpret_cast<std::uintptr_t>(stream);
        if (stream_get_device == nullptr || value <= 2) return {};
        int owner = -1;
        const cudart::cudaError_t code = stream_get_device(stream, &owner);
        if (code != cudart::success) {
            Status failed = call_failure(errors, site, "cudaStreamGetDevice", code, 0);
            return Status(Errc::invalid_argument,
                          message(failed.message(), " (", static_cast<const void*>(stream), ": not a live stream)"));
        }
        if (owner == device) return {};
        return Status(Errc::invalid_argument,
                      message(site.backend, " device ", device, ": stream ", static_cast<const void*>(stream),
                              " belongs to cuda device ", owner, " (cudaStreamGetDevice)"));
    }
};

}  // namespace devstage::detail
