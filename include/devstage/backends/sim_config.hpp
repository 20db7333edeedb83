// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What a SimBackend is built with (SimConfig) and what it counts (SimStats). Every part of the
/// sim — its memory, its streams, its copies — counts into the one SimStats the backend returns.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>

#include "devstage/backends/sim_link.hpp"

namespace devstage {

/// Construction options of a SimBackend. `SimBackend sim(SimConfig{.device_capacity = 1 << 20});`
struct SimConfig {
    /// The device number: in messages, device_id(), and the owner of the backend's streams and
    /// events on its SimHost (sim_host.hpp).
    int device = 0;
    std::size_t device_capacity = std::size_t{64} << 30;     ///< bytes device_malloc may hand out
    std::size_t bounce_buffer_bytes = std::size_t{2} << 20;  ///< chunk size of pageable copies
    bool lock_pinned = true;  ///< mlock pinned allocations (refusal is tolerated and reported)
    SimLinkModel link{};      ///< the modeled cost of each copy, summed in SimStats::modeled_ns
    /// What batch_copy_limit() answers: the most copies one copy_*_batch call takes. 0 (the
    /// default): no batches, and a Stager copies one by one.
    std::size_t batch_copy_limit = 0;
};

/// Counters of a SimBackend since construction.
struct SimStats {
    std::uint64_t device_mallocs = 0, device_frees = 0;
    std::uint64_t pinned_mallocs = 0, pinned_frees = 0;
    std::uint64_t pinned_lock_failures = 0;  ///< pinned allocations left unlocked (mlock refused)
    /// Device allocations are this device's; live_pinned_bytes is the whole SimHost's (pinned
    /// memory any of its devices allocated); the other counters count this device's calls.
    /// Copies each way, synchronous and asynchronous; bytes each way.
    std::uint64_t copies_to_device = 0, copies_from_device = 0, memsets = 0, synchronizes = 0;
    std::uint64_t bytes_to_device = 0, bytes_from_device = 0;
    std::uint64_t bounced_bytes = 0;  ///< bytes that went through the bounce buffer (pageable)
    std::uint64_t direct_bytes = 0;   ///< bytes copied directly (from or to pinned memory)
    std::uint64_t failed_calls = 0;
    std::uint64_t live_device_bytes = 0, peak_device_bytes = 0, live_pinned_bytes = 0;
    std::uint64_t vmm_reservations = 0;  ///< live reserved address ranges
    std::uint64_t vmm_chunks = 0;        ///< live physical chunks
    std::uint64_t vmm_mapped_bytes = 0;  ///< bytes mapped into reservations now
    /// The link model's cost of every copy so far (SimConfig::link), in nanoseconds.
    std::uint64_t modeled_ns = 0;
    /// Copies enqueued on a stream, each way (also counted in copies_to/from_device).
    std::uint64_t async_copies_to_device = 0, async_copies_from_device = 0;
    std::uint64_t pageable_async_copies = 0;  ///< async copies of pageable memory: the host blocked
    /// Batch calls (copy_to/from_device_batch); their copies are counted as async copies.
    std::uint64_t batches = 0;
    std::uint64_t live_streams = 0, live_events = 0;
    std::uint64_t events_recorded = 0, stream_waits = 0, event_synchronizes = 0, host_functions = 0;
    /// map_host calls that mapped, and the bytes mapped now.
    std::uint64_t host_maps = 0, live_mapped_bytes = 0;
    /// Kernels launched with their accesses (launch_kernel; also counted in host_functions), and
    /// the bytes they read and wrote in mapped host memory: link bytes, in modeled_ns too.
    std::uint64_t kernel_launches = 0, mapped_read_bytes = 0, mapped_write_bytes = 0;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
