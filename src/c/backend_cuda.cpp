// SPDX-License-Identifier: Apache-2.0
// A CUDA device as a C backend (libcudart loaded at run time).
#include <string>
#include <utility>

#include "any_backend.hpp"
#include "devstage/backends/cuda.hpp"
#include "wrapped_backend.hpp"

namespace devstage::capi {

Result<BackendPtr> make_cuda_backend(int device, const char* library_path) {
    Result<CudaBackend> cuda = CudaBackend::create(device, library_path != nullptr ? library_path : "");
    if (!cuda) return cuda.status();
    return share(new Wrapped<CudaBackend>(DEVSTAGE_BACKEND_CUDA, std::move(*cuda)));
}

}  // namespace devstage::capi
