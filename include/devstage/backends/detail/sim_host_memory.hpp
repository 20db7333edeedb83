// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: SimBackend's existing host memory pinned in place (host_register, host_unregister)
// and its stream query (included by backends/sim.hpp).

#include <mutex>

#include "devstage/backends/sim.hpp"

namespace devstage {

inline Status SimBackend::host_register(void* host, std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    return memory_.host_register(host, bytes);
}

inline Status SimBackend::host_unregister(void* host) noexcept {
    if (on_worker()) return refuse("host_unregister");
    auto lock = lock_idle();  // copies in flight may still read or write the range
    return memory_.host_unregister(host);
}

inline bool SimBackend::has_stream(Stream stream) noexcept {
    std::unique_lock queue = streams_.lock();
    return streams_.find_stream(stream.id) != nullptr;
}

}  // namespace devstage
