// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedStreamTypes, the stream and event types a pinned pool's signatures use.

#include "devstage/backend.hpp"

namespace devstage::detail {

/// The stream and event types of a backend, for the pool's signatures: the backend's own when
/// it models AsyncBackend, else placeholders that no call accepts.
template <class B, bool = AsyncBackend<B>>
struct PinnedStreamTypes {
    struct Stream {
        friend bool operator==(Stream, Stream) = default;
    };
    struct Event {};
};
template <class B>
struct PinnedStreamTypes<B, true> {
    using Stream = typename B::Stream;
    using Event = typename B::Event;
};

}  // namespace devstage::detail
