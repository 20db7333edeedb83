// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: a run's Out args zeroed on the device before its kernels can see them
// (OutputPolicy::zero), for the Out args moved directly: adjacent slices of a retained buffer
// merged into one call; one call per allocation otherwise. Each range is set by a device memset
// on the bind's stream where the backend has one, else zeros are uploaded from a block of zeros
// in static storage. The packed Out group is one call here only when nothing packed goes up
// (detail::packed_outs_on_device); else the staging pass zeroes it in the mirror: the packed
// upload carries it, or, mapped, the kernel reads it there.

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "devstage/backend.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/stager/slot.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The zeros uploaded where the backend cannot set device memory: one block in static storage
/// (zero-initialized, so it costs no memory until read, and shared by every stager of the
/// program). Pending uploads may read it at any time: it is never freed.
inline constexpr std::size_t zero_block_bytes = std::size_t{1} << 20;
alignas(4096) inline std::byte zero_block[zero_block_bytes]{};

/// Zeroes the device bytes of the Out args of the run staged in `slot` on `stream` that the
/// staging pass did not zero in the mirror.
/// `enqueued` becomes true when a call was made. Counts StagerStats::zeroing_calls,
/// zeroed_bytes and zero_uploads. On failure the calls made before stay enqueued.
// Out of line: a bind that does not zero pays only the policy test.
template <class B, class Async, class Strategy>
[[gnu::noinline]] Status zero_outputs(B& backend, Async& async, StagerSlot<Strategy, Async>& slot,
                                      typename Async::Stream stream, StagerStats& stats, bool& enqueued) noexcept {
    constexpr bool retained = Strategy::lease_kind == ReleaseKind::BufferNoop;
    const auto set = [&](std::byte* dst, std::size_t bytes) noexcept -> Status {
        Status status;
        if constexpr (SetsDeviceMemory<Async>) {
            status = async.device_memset_async(dst, 0, bytes, stream);
            if (status) ++stats.zeroing_calls;
        } else {
            for (std::size_t done = 0; done < bytes && status; done += zero_block_bytes) {
                const std::size_t chunk = std::min(zero_block_bytes, bytes - done);
                status = async.copy_to_device_async(dst + done, zero_block, chunk, stream);
                if (status) {
                    ++stats.zeroing_calls;
                    ++stats.zero_uploads;
                    enqueued = true;
                }
            }
        }
        if (!status) return copy_failure("bind: zeroing Out args", bytes, status, backend.name());
        enqueued = true;
        stats.zeroed_bytes += bytes;
        return status;
    };
    auto* const base = static_cast<std::byte*>(slot.strategy.base());
    if constexpr (pack_limit_of<Strategy>() > 0) {
        const StagingLayout& layout = slot.layout;
        const std::size_t begin = layout.base[static_cast<std::size_t>(PackGroup::out)];
        const std::size_t end = layout.base[static_cast<std::size_t>(PackGroup::direct)];
        if (end > begin && packed_outs_on_device(slot)) {
            if (Status zeroed = set(base + begin, end - begin); !zeroed) return zeroed;
        }
    }
    std::byte* from = nullptr;  // the range being merged
    std::size_t bytes = 0;
    for (const TensorLease& lease : slot.leases()) {
        if (!lease.copy_back || lease.upload || slot.packed(lease)) continue;  // not a direct Out arg
        auto* const device = static_cast<std::byte*>(lease.device);
        if constexpr (retained) {
            constexpr std::size_t mask = Strategy::alignment - 1;
            if (bytes > 0 && device == base + ((static_cast<std::size_t>(from - base) + bytes + mask) & ~mask)) {
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
