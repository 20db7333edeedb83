// SPDX-License-Identifier: Apache-2.0
// An Ascend device as a C backend (libascendcl loaded at run time).
#include <cstdint>
#include <string>
#include <utility>

#include "any_backend.hpp"
#include "devstage/backends/ascend.hpp"
#include "wrapped_backend.hpp"

namespace devstage::capi {

Result<BackendPtr> make_ascend_backend(int device, const char* library_path) {
    Result<AscendBackend> ascend =
        AscendBackend::create(static_cast<std::int32_t>(device), library_path != nullptr ? library_path : "");
    if (!ascend) return ascend.status();
    return share(new Wrapped<AscendBackend>(DEVSTAGE_BACKEND_ASCEND, std::move(*ascend)));
}

}  // namespace devstage::capi
