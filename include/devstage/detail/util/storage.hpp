// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: growing the stager's per-arg host storage without a throw.

#include <cstddef>
#include <new>
#include <vector>

#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// Grows `storage` to at least `count` elements; out_of_memory instead of a throw.
template <class T>
Status grow_storage(std::vector<T>& storage, std::size_t count) noexcept {
    if (storage.size() >= count) return {};
#if defined(__cpp_exceptions)
    try {
        storage.resize(count);
    } catch (const std::bad_alloc&) {
        return Status(Errc::out_of_memory, message("stager: host memory for ", count, " args could not be allocated"));
    }
#else
    storage.resize(count);
#endif
    return {};
}

}  // namespace devstage::detail
