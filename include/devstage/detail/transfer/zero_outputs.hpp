// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: a run's Out args zeroed on the device before its kernels can see them
// (OutputPolicy::zero), for the Out args moved directly: adjacent slices of a retained buffer
// (by the bump rule) merged into one call; one call per allocation otherwise. Each range is set
// by a device memset on the bind's stream where the backend has one, else zeros are uploaded
// from the zero block. The packed Out group is one call here only when nothing packed goes up
// (packed_outs_on_device); else the staging pass zeroes it in the mirror: the packed upload
// carries it, or, mapped, the kernel reads it there.

#include <cstddef>
#include <cstdint>

#include "devstage/detail/layout/bump.hpp"
#include "devstage/detail/layout/plan_pass.hpp"
#include "devstage/detail/transfer/failures.hpp"
#include "devstage/detail/transfer/packed.hpp"
#include "devstage/detail/transfer/run_record.hpp"
#include "devstage/detail/transfer/zero_block.hpp"
#include "devstage/lease.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// Zeroes the device bytes of the Out args of `run` on `stream` that the staging pass did not
/// zero in the mirror; `Alignment` and `Retained` are the strategy's (slices of one buffer merge).
/// `enqueued` becomes true when a call was made. Counts StagerStats::zeroing_calls,
/// zeroed_bytes and zero_uploads. On failure the calls made before stay enqueued.
// Out of line: a bind that does not zero pays only the policy test.
template <std::size_t Alignment, bool Retained, class Async>
[[gnu::noinline]] Status zero_outputs(Async& async, const RunRecord<Async>& run, const RunMemory& memory,
                                      typename Async::Stream stream, StagerStats& stats, bool& enqueued) noexcept {
    const auto set = [&](std::byte* dst, std::size_t bytes) noexcept -> Status {
        Status status;
        if constexpr (SetsDeviceMemory<Async>) {
            status = async.device_memset_async(dst, 0, bytes, stream);
            if (status) ++stats.zeroing_calls;
        } else {
            std::uint64_t uploads = 0;
            status = upload_zeros(async, dst, bytes, stream, uploads);
            stats.zeroing_calls += uploads;
            stats.zero_uploads += uploads;
            enqueued = enqueued || uploads > 0;
        }
        if (!status) return copy_failure("bind: zeroing Out args", bytes, status, async.name());
        enqueued = true;
        stats.zeroed_bytes += bytes;
        return status;
    };
    std::byte* const base = memory.base;
    if (run.pack_limit > 0) {
        const StagingLayout& layout = run.layout;
        const std::size_t begin = layout.base[static_cast<std::size_t>(PackGroup::out)];
        const std::size_t end = layout.base[static_cast<std::size_t>(PackGroup::direct)];
        if (end > begin && packed_outs_on_device(run, memory)) {
            if (Status zeroed = set(base + begin, end - begin); !zeroed) return zeroed;
        }
    }
    std::byte* from = nullptr;  // the range being merged
    std::size_t bytes = 0;
    for (const TensorLease& lease : run.leases()) {
        if (!lease.copy_back || lease.upload || run.packed(lease)) continue;  // not a direct Out arg
        auto* const device = static_cast<std::byte*>(lease.device);
        if constexpr (Retained) {
            if (bytes > 0 && device == base + bumped(static_cast<std::size_t>(from - base), bytes, Alignment)) {
                bytes = static_cast<std::size_t>(device - from) + lease.bytes;  // the next slice: merged
                continue;
            }
        }
        if (bytes > 0) {
            if (Status zeroed = set(from, bytes); !zeroed) return zeroed;
        }
        from = device;
        bytes = lease.bytes;
    }
    if (bytes > 0) return set(from, bytes);
    return {};
}

}  // namespace devstage::detail
