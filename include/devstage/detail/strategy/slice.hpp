// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the lease of one planned tensor inside a retained buffer, shared by the retained
// strategies. A slice outside the buffer is an error, never undefined behaviour.

#include <cstddef>
#include <string_view>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

// The error of a slice outside the buffer, kept out of line: the per-tensor path stays small
// enough to inline.
[[gnu::cold]] [[gnu::noinline]] inline Status slice_miss(std::string_view what, const PlannedTensor& tensor,
                                                         std::size_t capacity, std::string_view backend) noexcept {
    return Status(Errc::invalid_argument, message(what, " slice miss: offset ", tensor.offset, " + ", tensor.bytes,
                                                  " bytes exceeds capacity ", capacity, " on backend '", backend, "'"));
}

/// Writes into `lease` the slice [base + offset, + bytes) of a buffer of `capacity` bytes.
/// `what` and `backend` name the buffer in the error.
template <Backend B>
Status slice_lease(void* base, std::size_t capacity, const PlannedTensor& tensor, const TensorArg& arg,
                   TensorLease& lease, std::string_view what, const B& backend) noexcept {
    const auto end = add(tensor.offset, tensor.bytes);
    if (base == nullptr || !end || *end > capacity) [[unlikely]] {
        return slice_miss(what, tensor, capacity, backend.name());
    }
    lease = TensorLease{arg.data,
                        static_cast<std::byte*>(base) + tensor.offset,
                        tensor.bytes,
                        copies_back(arg.direction),
                        ReleaseKind::BufferNoop,
                        nullptr,
                        uploads(arg.direction)};
    return {};
}

}  // namespace devstage::detail
