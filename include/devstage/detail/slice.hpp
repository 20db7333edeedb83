// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the lease of one planned tensor inside a retained buffer, shared by the retained
// strategies. A slice outside the buffer is an error, never undefined behaviour.

#include <cstddef>
#include <string_view>

#include "devstage/detail/align.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

/// Writes into `lease` the slice [base + offset, + bytes) of a buffer of `capacity` bytes.
/// `what` and `backend` name the buffer in the error.
inline Status slice_lease(void* base, std::size_t capacity, const PlannedTensor& tensor, const TensorArg& arg,
                          TensorLease& lease, std::string_view what, std::string_view backend) noexcept {
    const auto end = add(tensor.offset, tensor.bytes);
    if (base == nullptr || !end || *end > capacity) {
        return Status(Errc::invalid_argument,
                      message(what, " slice miss: offset ", tensor.offset, " + ", tensor.bytes,
                              " bytes exceeds capacity ", capacity, " on backend '", backend, "'"));
    }
    lease = TensorLease{arg.data,
                        static_cast<std::byte*>(base) + tensor.offset,
                        tensor.bytes,
                        copies_back(arg.direction),
                        ReleaseKind::BufferNoop,
                        nullptr};
    return {};
}

}  // namespace devstage::detail
