// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: SimBackend's asynchronous copies and batches of copies — checked, counted in the
// link model and enqueued on the stream's worker; from pageable memory the call returns once
// the copy ran (assembled by backends/sim.hpp).

#include <memory>
#include <mutex>
#include <string_view>

#include "devstage/backends/detail/sim_backend.hpp"

namespace devstage {

inline Status SimBackend::copy_async(void* dst, const void* src, std::size_t bytes, const void* host,
                                     const void* device, Stream stream, std::string_view what) noexcept {
    if (on_worker()) return refuse(what);
    std::unique_lock lock(mutex_);
    std::unique_lock queue = streams_.lock();
    detail::SimStreams::Worker* worker = streams_.find_stream(stream.id);
    if (worker == nullptr) return streams_.unknown_stream(what, stream.id);
    if (bytes == 0) return {};
    if (Status checked = check_copy(host, device, bytes, what); !checked) return checked;
    const bool pinned = host_.state_->pinned_contains(host, bytes);
    if (!pinned) {
        if (Status bounce = ensure_bounce(what); !bounce) return bounce;
    }
    std::shared_ptr<detail::SimStreams::Marker> ran;
    if (!streams_.enqueue_copy(*worker, dst, src, bytes, !pinned, ran)) {
        return fail(Errc::out_of_memory,
                    detail::message("sim ", what, ": host memory exhausted enqueueing ", bytes, " bytes"));
    }
    const bool to_device = device == dst;
    account(to_device, pinned, bytes);
    ++(to_device ? stats_.async_copies_to_device : stats_.async_copies_from_device);
    if (!pinned) ++stats_.pageable_async_copies;
    if (pinned) return {};
    // Pageable memory: the call returns once the copy ran, as cudaMemcpyAsync does.
    lock.unlock();
    streams_.wait(queue, *ran);
    return {};
}

inline Status SimBackend::copy_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                     std::size_t count, bool to_device, Stream stream, std::string_view what) noexcept {
    if (on_worker()) return refuse(what);
    std::unique_lock lock(mutex_);
    std::unique_lock queue = streams_.lock();
    detail::SimStreams::Worker* worker = streams_.find_stream(stream.id);
    if (worker == nullptr) return streams_.unknown_stream(what, stream.id);
    if (count == 0 || count > config_.batch_copy_limit || dsts == nullptr || srcs == nullptr || sizes == nullptr) {
        return fail(Errc::invalid_argument, detail::message("sim ", what, ": a batch of ", count,
                                                            " copies (null arrays, none, or above the limit of ",
                                                            config_.batch_copy_limit, ")"));
    }
    ++stats_.batches;
    std::shared_ptr<detail::SimStreams::Marker> last_pageable;
    Status status;
    bool first = true;
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t bytes = sizes[i];
        if (bytes == 0) continue;
        const void* host = to_device ? srcs[i] : dsts[i];
        const void* device = to_device ? dsts[i] : srcs[i];
        if (Status checked = check_copy(host, device, bytes, what); !checked) {
            status = Status(checked.code(), detail::message(checked.message(), " (copy ", i, " of ", count, ")"));
            break;
        }
        const bool pinned = host_.state_->pinned_contains(host, bytes);
        if (!pinned) {
            if (status = ensure_bounce(what); !status) break;
        }
        std::shared_ptr<detail::SimStreams::Marker> ran;
        if (!streams_.enqueue_copy(*worker, dsts[i], srcs[i], bytes, !pinned, ran)) {
            status = fail(Errc::out_of_memory,
                          detail::message("sim ", what, ": host memory exhausted enqueueing ", bytes, " bytes"));
            break;
        }
        account(to_device, pinned, bytes, first);
        first = false;
        ++(to_device ? stats_.async_copies_to_device : stats_.async_copies_from_device);
        if (!pinned) {
            ++stats_.pageable_async_copies;
            last_pageable = std::move(ran);
        }
    }
    if (last_pageable) {
        lock.unlock();
        streams_.wait(queue, *last_pageable);  // in order: the earlier ones ran too
    }
    return status;
}

}  // namespace devstage
