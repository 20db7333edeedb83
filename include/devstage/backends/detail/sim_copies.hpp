// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: SimBackend's synchronous copies — checked, counted, charged to the link model, and
// run directly from pinned memory or through the bounce buffer (assembled by backends/sim.hpp).

#include <cstring>
#include <limits>
#include <mutex>
#include <string_view>

#include "devstage/backends/detail/sim_backend.hpp"

namespace devstage {

// mutex_ held. Checks a copy between `host` and `device` (the two sides of dst and src).
inline Status SimBackend::check_copy(const void* host, const void* device, std::size_t bytes,
                                     std::string_view what) noexcept {
    if (!is_device(device, bytes)) {
        return fail(Errc::invalid_argument,
                    detail::message("sim ", what, ": ", bytes, " bytes at device address ", device,
                                    " are not inside one device allocation",
                                    mapped_.overlaps(device, bytes) ? " (they are mapped host memory)" : ""));
    }
    if (host == nullptr) return fail(Errc::invalid_argument, detail::message("sim ", what, ": null host pointer"));
    return {};
}

// mutex_ held. Counts a copy that will happen, and its modeled cost (without the per-call
// latency for a batch's copies after its first).
inline void SimBackend::account(bool to_device, bool pinned, std::size_t bytes, bool call) noexcept {
    ++(to_device ? stats_.copies_to_device : stats_.copies_from_device);
    (to_device ? stats_.bytes_to_device : stats_.bytes_from_device) += bytes;
    (pinned ? stats_.direct_bytes : stats_.bounced_bytes) += bytes;
    const SimLinkModel& link = config_.link;
    const SimLinkCost& cost = to_device ? (pinned ? link.to_device_pinned : link.to_device_pageable)
                                        : (pinned ? link.from_device_pinned : link.from_device_pageable);
    add_modeled(call ? cost.nanoseconds(bytes) : cost.nanoseconds(bytes) - cost.latency_ns);
}
inline void SimBackend::add_modeled(std::uint64_t ns) noexcept {
    stats_.modeled_ns = ns > std::numeric_limits<std::uint64_t>::max() - stats_.modeled_ns
                            ? std::numeric_limits<std::uint64_t>::max()
                            : stats_.modeled_ns + ns;
}

// mutex_ held. Pageable memory goes through the bounce buffer, mapped at the first such copy.
inline Status SimBackend::ensure_bounce(std::string_view what) noexcept {
    if (bounce_.map()) return {};
    return fail(Errc::out_of_memory,
                detail::message("sim ", what, ": bounce buffer of ", bounce_.size(), " bytes unavailable"));
}

// `host` is the host side of the copy, `device` the device side.
inline Status SimBackend::copy(void* dst, const void* src, std::size_t bytes, const void* host, const void* device,
                               std::string_view what) noexcept {
    std::unique_lock lock(mutex_);
    if (bytes == 0) return {};
    if (Status checked = check_copy(host, device, bytes, what); !checked) return checked;
    const bool pinned = host_.state_->pinned_contains(host, bytes);
    if (!pinned) {
        if (Status bounce = ensure_bounce(what); !bounce) return bounce;
    }
    account(device == dst, pinned, bytes);
    lock.unlock();
    if (pinned) {
        std::memcpy(dst, src, bytes);
    } else {
        bounce_.copy(dst, src, bytes);
    }
    return {};
}

}  // namespace devstage
