// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: how the pinned pool's noexcept paths survive exhausted host memory — a host
/// allocation that reports std::bad_alloc instead of throwing it, error messages that come out
/// empty rather than throw, and the std::bad_alloc of the Allocator interfaces (an abort without
/// exceptions).

#include <cstdlib>
#include <new>
#include <string>
#include <utility>

#include "devstage/detail/util/message.hpp"

namespace devstage::detail {

[[noreturn]] inline void throw_bad_alloc() {
#if defined(__cpp_exceptions)
    throw std::bad_alloc();
#else
    std::abort();
#endif
}

/// Runs `insert`, a registry insertion that allocates host memory; false when the host is out
/// of memory (std::bad_alloc), so noexcept paths can recover instead of terminating. Without
/// exceptions a failed host allocation aborts, as everywhere.
template <class F>
bool try_host_allocation(F&& insert) noexcept {
#if defined(__cpp_exceptions)
    try {
        std::forward<F>(insert)();
    } catch (const std::bad_alloc&) {
        return false;
    }
#else
    std::forward<F>(insert)();
#endif
    return true;
}

/// detail::message for noexcept paths that may run with host memory exhausted: an empty
/// message instead of std::bad_alloc (the Errc still says what happened).
template <class... Pieces>
std::string message_or_empty(const Pieces&... pieces) noexcept {
    std::string out;
    (void)try_host_allocation([&] { out = detail::message(pieces...); });
    return out;
}

}  // namespace devstage::detail
