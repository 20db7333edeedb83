// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the messages of the transfer passes' failures, built only on those paths. Each
// names the operation, the sizes and the backend.

#include <cstddef>
#include <string_view>

#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

[[gnu::cold]] inline Status copy_failure(std::string_view what, std::size_t bytes, const Status& cause,
                                         std::string_view backend) noexcept {
    return Status(cause.code(), message("stager ", what, " (", bytes, " bytes) failed on backend '", backend,
                                        "': ", cause.message()));
}

[[gnu::cold]] inline Status stale_frame_arg(std::size_t index, const TensorArg& arg, std::ptrdiff_t planned,
                                            std::string_view backend) noexcept {
    return Status(
        Errc::invalid_argument,
        message("stager bind: arg ", index, " (", arg.bytes,
                " bytes) points into this stager's frame mirror, but the layout places it at offset ", planned,
                ": a frame whose sizes no longer match; bind the frame's own args() (stager on "
                "backend '",
                backend, "')"));
}

}  // namespace devstage::detail
