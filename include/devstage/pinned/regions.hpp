// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What a PinnedHostPool is configured with for big requests and regions: ExactPinning (above
/// a threshold a request is pinned at its exact size, registered in chunks), RegionOptions
/// (a region made with create_region), RegionProgress (how far its registration is), the
/// per-backend defaults (the bytes of one registration, the most one pinned_malloc may ask
/// for, whether pinning is mlock) and PinnedPoolOptions, which gathers them with NUMA
/// placement and the limits.
/// `PinnedHostPool<CudaBackend> pool(gpu, {}, PinnedPoolOptions{.exact = {.threshold = 8 << 20}});`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <limits>

#include "devstage/pinned/limits.hpp"
#include "devstage/pinned/numa.hpp"

namespace devstage {

/// Requests of at least `threshold` bytes are pinned at their exact size (rounded up to whole
/// pages only, never to a size class): mapped, then pinned in place with the backend's
/// host_register in chunks of `chunk_bytes` (a backend without host_register: one pinned_malloc
/// of that size). `threshold` 0: every request takes a size class. `chunk_bytes` 0: the
/// backend's default (host_register_chunk_bytes<B>()). `threads`: registration threads for one
/// request (0: the calling thread alone).
struct ExactPinning {
    std::size_t threshold = std::size_t{16} << 20;
    std::size_t chunk_bytes = 0;
    unsigned threads = 0;
};

/// A region made with PinnedHostPool::create_region: `bytes` (whole pages) pinned in place in
/// chunks of `chunk_bytes` (0: the backend's default), bound to `numa_node` first when >= 0.
/// `threads` 0: registered in the calling thread before create_region returns; n >= 1: by n
/// background threads, while the caller polls progress() or waits. `rdma`: the memory is meant
/// for RDMA registration, so RLIMIT_MEMLOCK applies to it.
/// `auto region = pool.create_region(64ull << 30, RegionOptions{.threads = 4});`
struct RegionOptions {
    std::size_t chunk_bytes = 0;
    unsigned threads = 0;
    int numa_node = -1;
    bool rdma = false;
};

/// Where a region's registration is.
enum class RegionState : std::uint8_t {
    registering,  ///< chunks are being registered; nothing of it is handed out
    ready,        ///< every chunk registered and the region hooks accepted it: slices are handed out
    failed,       ///< a chunk, or a region hook, failed: everything was rolled back
    cancelled,    ///< cancel() stopped it: everything was rolled back
};

/// Bytes and chunks of a region registered now, of the total. A rollback takes them down again.
struct RegionProgress {
    std::size_t bytes_registered = 0;
    std::size_t bytes_total = 0;
    std::size_t chunks_registered = 0;
    std::size_t chunks_total = 0;
    RegionState state = RegionState::registering;
    bool cancel_requested = false;  ///< cancel() was called: the chunks in flight finish, then it rolls back
};

/// Every option of a PinnedHostPool beyond its cache policy.
/// `PinnedPoolOptions{.numa = {.enabled = true}, .limits = {.rdma = true}}`
struct PinnedPoolOptions {
    NumaPlacement numa{};
    ExactPinning exact{};
    PinLimits limits{};
};

/// The bytes one host_register call of backend B pins by default: `B::host_register_chunk_bytes`
/// where B declares it, else 1 GiB — below every per-call limit known (see docs/pinned.md).
template <class B>
constexpr std::size_t host_register_chunk_bytes() noexcept {
    if constexpr (requires { B::host_register_chunk_bytes; }) {
        return B::host_register_chunk_bytes;
    } else {
        return std::size_t{1} << 30;
    }
}

/// The most bytes one pinned_malloc of backend B may ask for: `B::pinned_malloc_limit` where B
/// declares it, else no limit of devstage's own. A bigger exact request is refused up front.
template <class B>
constexpr std::size_t pinned_malloc_limit() noexcept {
    if constexpr (requires { B::pinned_malloc_limit; }) {
        return B::pinned_malloc_limit;
    } else {
        return std::numeric_limits<std::size_t>::max();
    }
}

/// True when backend B pins with mlock (`B::pins_with_mlock`), so RLIMIT_MEMLOCK bounds it.
template <class B>
constexpr bool pins_with_mlock() noexcept {
    if constexpr (requires { B::pins_with_mlock; }) {
        return B::pins_with_mlock;
    } else {
        return false;
    }
}

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
