// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: whether the streams of a stream-ordered backend are immediate — known at compile
// time for SynchronousAdapter (ImmediateStream), asked at run time of a backend that models
// ImmediateStreamsQuery, false otherwise. What waits for stream work (the slot fences) and what
// counts it (asynchronous uploads and copy-backs) asks here.

#include "devstage/backend.hpp"
#include "devstage/stream.hpp"

namespace devstage::detail {

/// True when work enqueued on `async`'s streams has completed when the call returns.
template <class A>
bool streams_immediate(const A& async) noexcept {
    if constexpr (is_immediate_v<A>) {
        return true;
    } else if constexpr (ImmediateStreamsQuery<A>) {
        return async.streams_immediate();
    } else {
        (void)async;
        return false;
    }
}

}  // namespace devstage::detail
