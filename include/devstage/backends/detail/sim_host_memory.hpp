// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: SimBackend's existing host memory pinned in place (host_register, host_unregister)
// and its stream queries (assembled by backends/sim.hpp).

#include <mutex>

#include "devstage/backends/detail/sim_backend.hpp"

namespace devstage {

inline Status SimBackend::host_register(void* host, std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    return host_.state_->host_register(host, bytes, config_.lock_pinned, stats_);
}

inline Status SimBackend::host_unregister(void* host) noexcept {
    if (on_worker()) return refuse("host_unregister");
    auto lock = lock_idle();  // copies in flight may still read or write the range
    return host_.state_->host_unregister(host, stats_);
}

inline bool SimBackend::has_stream(Stream stream) noexcept {
    std::unique_lock queue = streams_.lock();
    return streams_.find_stream(stream.id) != nullptr;
}

inline Status SimBackend::check_stream(Stream stream) noexcept {
    std::lock_guard lock(mutex_);
    std::unique_lock queue = streams_.lock();
    if (streams_.find_stream(stream.id) != nullptr) return {};
    return streams_.unknown_stream("check_stream", stream.id);
}

}  // namespace devstage
