// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Cache policies of a PinnedHostPool: DirectPinned (no cache) and CachingPinned (released
/// blocks kept by size class and reused).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <bit>
#include <cstddef>

#include "devstage/detail/util/align.hpp"

namespace devstage {

/// Cache policy: no caching; every block is exactly the bytes asked for and every release
/// frees it to the backend. `PinnedHostPool<SimBackend, DirectPinned> pool(sim);`
struct DirectPinned {};

/// Cache policy: released blocks are kept by size class and reused. Classes are powers of two
/// up to 1 MiB, then eight classes per doubling (at most 12.5% over the bytes asked for, not
/// the 2x of pure power-of-two classes). At most `max_cached_bytes` are kept; trim() frees them.
/// `PinnedHostPool<SimBackend> pool(sim, CachingPinned{.max_cached_bytes = 64 << 20});`
struct CachingPinned {
    std::size_t max_cached_bytes = std::size_t{1} << 30;

    /// The block size that serves a request of `bytes`; `bytes` itself when rounding up would
    /// overflow.
    static constexpr std::size_t size_class(std::size_t bytes) noexcept {
        constexpr std::size_t smallest = 256, fine_from = std::size_t{1} << 20;
        if (bytes <= smallest) return smallest;
        if (bytes <= fine_from) return std::bit_ceil(bytes);
        const std::size_t step = std::bit_floor(bytes) / 8;
        const auto rounded = detail::align_up(bytes, step);
        return rounded ? *rounded : bytes;
    }
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
