// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// PinnedStats: the counters of a PinnedHostPool (live, cached, pending and retiring blocks,
/// backend calls, finalized and detached allocations, host waits, events, locked bytes and
/// regions).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstdint>

namespace devstage {

/// Counters of a PinnedHostPool. Bytes are the bytes callers asked for unless named "cached".
/// `PinnedStats s = pool.stats(); if (s.live_allocations != 0) ...`
struct PinnedStats {
    std::uint64_t live_allocations = 0;  ///< granted and not yet given back (detached ones too)
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_live_bytes = 0;
    std::uint64_t cached_blocks = 0;
    std::uint64_t cached_bytes = 0;  ///< capacity of blocks held in the cache
    std::uint64_t cache_hits = 0;
    std::uint64_t cache_misses = 0;  ///< block requests that went to the backend
    std::uint64_t backend_allocations = 0;
    std::uint64_t backend_frees = 0;
    /// Allocations that finalize() (or the pool's destruction) found live, each counted once.
    std::uint64_t finalized_allocations = 0;
    std::uint64_t finalized_bytes = 0;
    /// Live allocations that outlived a finalize(): still valid, freed (not cached) when released.
    std::uint64_t detached_allocations = 0;
    std::uint64_t detached_bytes = 0;
    /// Released blocks whose recorded stream work is not known to have completed (capacity
    /// bytes): cached ones (also counted in cached_blocks) and retiring ones.
    std::uint64_t pending_blocks = 0;
    std::uint64_t pending_bytes = 0;
    /// Released blocks with pending work that go back to the backend, not into the cache, once
    /// it completed (capacity bytes): the pool does not cache them (DirectPinned, a full cache,
    /// detached, the pool destroyed).
    std::uint64_t retiring_blocks = 0;
    std::uint64_t retiring_bytes = 0;
    /// Allocations that found a cached block of their class still pending and took another.
    std::uint64_t pending_skips = 0;
    /// Times the host blocked for recorded work: trim(), finalize() and the destruction waiting
    /// for a pending block, and a release whose event could not be recorded.
    std::uint64_t host_waits = 0;
    /// Events the pool created; each is re-recorded for later releases.
    std::uint64_t events_created = 0;
    /// With NUMA placement: blocks taken from the backend bound to a node (mapped, bound with
    /// mbind, touched, then pinned with host_register), and allocations that asked for a node
    /// the kernel refused to bind to and took the backend's pinned_malloc memory instead.
    std::uint64_t numa_blocks = 0;
    std::uint64_t numa_fallbacks = 0;
    /// Bytes pinned from the backend now: every block and region the pool holds — live, cached,
    /// pending, or a region's — at its full size (a size class, or whole pages of an exact
    /// request). `locked_bytes / live_bytes` is the over-lock of what is held.
    std::uint64_t locked_bytes = 0;
    /// Regions listed now (regions(): every block from the backend, and each create_region).
    std::uint64_t regions = 0;
    /// host_register calls that pinned a chunk of an exact-size block or a region.
    std::uint64_t registered_chunks = 0;
    /// Big requests refused before anything was pinned: past the cgroup's memory limit or
    /// RLIMIT_MEMLOCK (pinned/limits.hpp).
    std::uint64_t limit_refusals = 0;
    /// Allocations still held when the backend was torn down whose pinned_malloc memory went
    /// back then (their holders must not touch it), and their bytes.
    std::uint64_t revoked_allocations = 0;
    std::uint64_t revoked_bytes = 0;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
