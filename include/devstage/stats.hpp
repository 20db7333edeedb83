// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// StagerStats: the counters a Stager keeps (re-exported by stager.hpp). Every backend call a
/// stager or its strategy makes is counted here.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>

namespace devstage {

/// Counters of one Stager since construction. `stager.stats().device_mallocs`
struct StagerStats {
    std::uint64_t runs = 0;                  ///< successful binds
    std::uint64_t regrows = 0;               ///< allocations of a retained buffer, the first included
    std::uint64_t grow_failures = 0;         ///< grows that ended without a buffer big enough
    std::uint64_t grows_allocate_first = 0;  ///< regrows that allocated the new buffer before freeing the old
    std::uint64_t grows_free_first = 0;      ///< regrows that freed the old buffer first (GrowOrder or short memory)
    std::uint64_t grows_exact_fallback = 0;  ///< grows that fell back to exactly the plan's bytes
    std::uint64_t alignment_retries = 0;     ///< allocations freed and retried larger because they came back misaligned
    std::uint64_t mirror_alignment_retries = 0;  ///< the same for the pinned mirror (packed staging)
    std::uint64_t address_changes = 0;           ///< times a slot's base moved (a slot's first allocation excluded)
    std::uint64_t device_mallocs = 0;            ///< successful device_malloc calls
    std::uint64_t device_frees = 0;              ///< device_free calls (failed ones included)
    std::uint64_t free_failures = 0;     ///< device_free calls that failed (also reported to the sink or caller)
    std::uint64_t deferred_frees = 0;    ///< frees postponed until the slot's pending stream work completed
    std::uint64_t retained_bytes = 0;    ///< held from the backend now, alignment slack included
    std::uint64_t mirror_bytes = 0;      ///< pinned host mirror held now (packed staging)
    std::uint64_t high_water_bytes = 0;  ///< largest plan's required bytes
    std::uint64_t bytes_to_device = 0;
    std::uint64_t bytes_from_device = 0;
    std::uint64_t uploads = 0;            ///< copy calls to the device (a packed upload counts once)
    std::uint64_t copy_backs = 0;         ///< copy calls from the device (a packed copy-back counts once)
    std::uint64_t async_uploads = 0;      ///< uploads enqueued on a stream (not an immediate one)
    std::uint64_t async_copy_backs = 0;   ///< copy-backs enqueued on a stream (not an immediate one)
    std::uint64_t packed_args = 0;        ///< staged args moved inside a packed copy
    std::uint64_t mirror_copy_bytes = 0;  ///< bytes the host copied into or out of the packed mirror
    std::uint64_t host_waits = 0;         ///< times the host blocked on a device event (ring waits aside)
    std::uint64_t hazard_stream_waits =
        0;                              ///< binds ordered after a run in flight on another stream (shared host memory)
    std::uint64_t hazard_settles = 0;   ///< runs in flight settled on the host first (shared host memory, host copy)
    std::uint64_t ring_uploads = 0;     ///< args uploaded through the pageable ring
    std::uint64_t ring_copy_backs = 0;  ///< args copied back through the pageable ring
    std::uint64_t ring_chunks = 0;      ///< chunk copies the ring made
    std::uint64_t ring_waits = 0;       ///< times the host waited for a ring chunk to be free or to arrive
    std::uint64_t ring_bytes = 0;       ///< pinned host memory the ring holds now
    std::uint64_t uploads_skipped = 0;  ///< staged Out args (nothing to upload)
    std::uint64_t copy_backs_skipped = 0;  ///< staged In args, and every staged arg of a failed execution
    std::uint64_t zeroing_calls = 0;    ///< calls that zeroed Out args (OutputPolicy::zero): memsets, or zero uploads
    std::uint64_t zeroed_bytes = 0;     ///< device bytes they set to zero (padding between merged slices included)
    std::uint64_t zero_uploads = 0;     ///< of those calls, uploads of zeros (a backend without a device memset)
    std::uint64_t batched_uploads = 0;  ///< of the uploads, batch calls of several copies (BatchCopyBackend)
    std::uint64_t batched_copy_backs = 0;  ///< of the copy-backs, batch calls of several copies
    std::uint64_t batched_copies = 0;      ///< copies those batch calls carried, both directions
    std::uint64_t mapped_runs = 0;         ///< runs whose packed args the kernel used in a mapped mirror (MapSmall)
    std::uint64_t host_maps = 0;           ///< mirrors mapped for the device (map_host)
    std::uint64_t map_failures = 0;        ///< mirrors map_host refused (or mapped misaligned): their slot copies
    std::uint64_t mapped_bytes = 0;        ///< mirror bytes mapped for the device now
    std::uint64_t host_zeroed_bytes = 0;   ///< Out bytes zeroed in the mirror (carried by the packed upload, or mapped)
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
