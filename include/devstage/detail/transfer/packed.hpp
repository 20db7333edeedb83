// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the packed mirror's part in a Transfers pass — the Out group zeroed in the mirror and
// the one packed upload at bind, the one packed copy back at finish, and the outputs copied out
// of the mirror once the run completed; none of the copies where the mirror is mapped for the
// device (MapSmall), whose kernel uses it in place (included by transfers.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "devstage/detail/transfer/transfers.hpp"

namespace devstage::detail {

// After the gather: the packed Out group zeroed in the mirror (`zero_outs`), then one upload
// of every packed In/InOut byte, and of the zeroed Outs with them; none where the mirror is
// mapped — the kernel reads it in place. Where no packed byte goes up otherwise and the
// device sets memory itself, the Out group is left to zero_outputs: one memset, no bytes.
template <class B, class Strategy, class Async>
Status Transfers<B, Strategy, Async>::packed_upload(Slot& slot, Stream stream, bool& enqueued, bool zero_outs,
                                                    std::uint64_t& uploaded, std::uint64_t& calls) noexcept {
    const StagingLayout& layout = slot.layout;
    std::byte* const mirror = mirror_of(slot.strategy);
    const std::size_t out = layout.base[static_cast<std::size_t>(PackGroup::out)];
    const bool outs = layout.base[static_cast<std::size_t>(PackGroup::direct)] > out && !packed_outs_on_device(slot);
    if (zero_outs && outs) {
        std::memset(mirror + out, 0, layout.copy_back_end - out);
        stats_.host_zeroed_bytes += layout.copy_back_end - out;
    }
    if (slot.mapped) {
        slot.uses_mirror = true;
        return {};
    }
    const std::size_t bytes = zero_outs && outs ? layout.copy_back_end : layout.upload_end;
    if (bytes == 0) return {};
    if (Status copied = async_.copy_to_device_async(slot.strategy.base(), mirror, bytes, stream); !copied) {
        return copy_failure("bind: packed upload", bytes, copied, backend_.name());
    }
    enqueued = true;
    slot.uses_mirror = true;
    uploaded += bytes;
    ++calls;
    return {};
}

// One copy brings every packed InOut/Out byte back into the mirror; the host copies them
// out when the run is settled (unpack).
template <class B, class Strategy, class Async>
Status Transfers<B, Strategy, Async>::packed_copy_back(Slot& slot, Stream stream, CopyBacks& backs) noexcept {
    const StagingLayout& layout = slot.layout;
    const std::size_t bytes = layout.copy_back_end - layout.copy_back_begin;
    auto* base = static_cast<std::byte*>(slot.strategy.base());
    Status back = async_.copy_from_device_async(mirror_of(slot.strategy) + layout.copy_back_begin,
                                                base + layout.copy_back_begin, bytes, stream);
    if (!back) return copy_failure("finish: packed copy back", bytes, back, backend_.name());
    backs.bytes += bytes;
    ++backs.calls;
    slot.unpack = true;
    return back;
}

// Copies the packed outputs of a completed run from the mirror to the callers' memory
// (nothing when they are in place: a frame).
template <class B, class Strategy, class Async>
void Transfers<B, Strategy, Async>::unpack(Slot& slot) noexcept {
    std::byte* const mirror = mirror_of(slot.strategy);
    const auto* base =
        static_cast<const std::byte*>(slot.mapped ? mapped_mirror_of(slot.strategy) : slot.strategy.base());
    for (const TensorLease& lease : slot.leases()) {
        if (!lease.copy_back || !slot.packed(lease)) continue;
        const std::byte* from = mirror + (static_cast<const std::byte*>(lease.device) - base);
        if (lease.host != from) {
            if constexpr (HostAccessCheckBackend<B>) {  // the host reads what the kernel wrote in place
                if (slot.mapped) (void)backend_.check_host_access(from, lease.bytes, false);
            }
            std::memcpy(lease.host, from, lease.bytes);
            stats_.mirror_copy_bytes += lease.bytes;
        }
    }
}

}  // namespace devstage::detail
