// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the passes of a Stager that lay a run out and move its bytes — the fused slicing
// pass of retained unpacked strategies and its upload loop, the general staging pass (slices or
// per-tensor allocations, packed args gathered into the mirror), the copy-backs, the packed
// copies and their unpacking, and the pageable ring's part in them. A Transfers is made on the
// stack for one call: references to the stager's backend, stream view, counters and ring.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#include "devstage/backend.hpp"
#include "devstage/detail/schedule/immediate.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/stager/slot.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/pageable.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/stream.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

/// The pageable ring of a stager over B (nothing without pinned host memory).
template <class B, class A>
using RingOf = std::conditional_t<PinnedHostBackend<B>, PinnedRing<B, A>, void>;

template <class B, class Strategy, class Async>
class Transfers {
public:
    using Slot = StagerSlot<Strategy, Async>;
    using Stream = typename Async::Stream;
    using Ring = RingOf<B, Async>;
    static constexpr std::size_t pack_limit = pack_limit_of<Strategy>();
    static constexpr bool retained = Strategy::lease_kind == ReleaseKind::BufferNoop;
    static constexpr bool immediate = is_immediate_v<Async>;
    static constexpr bool batches = BatchCopyBackend<Async>;
    /// No ring: a threshold no arg reaches.
    static constexpr std::size_t no_ring = std::numeric_limits<std::size_t>::max();

    Transfers(B& backend, Async& async, StagerStats& stats, Ring* ring, std::size_t ring_from) noexcept
        : backend_(backend), async_(async), stats_(stats), ring_(ring), ring_from_(ring_from) {}

    // The fused pass of a retained, unpacked strategy: validates each arg (the plan's predicate
    // and layout rule), and writes its lease and device arg against the buffer held. Returns
    // the bytes the run requires; the slices are valid when that is within the capacity.
    Result<std::size_t> slice(Slot& slot, std::span<const TensorArg> args) noexcept {
        constexpr std::size_t mask = Strategy::alignment - 1;
        // Sizes and offsets up to a quarter of the address space cannot overflow when aligned and added.
        constexpr std::size_t small_size = std::numeric_limits<std::size_t>::max() >> 2;
        const auto base = reinterpret_cast<std::uintptr_t>(slot.strategy.base());
        TensorLease* lease = slot.lease_storage.data();
        TensorArg* device_arg = slot.device_args.data();
        std::size_t external = 0, end = 0;
        for (const TensorArg& arg : args) {
            const ArgCheck check = check_arg(arg);
            if (check != ArgCheck::staged) [[unlikely]] {
                if (check == ArgCheck::skipped) {
                    *device_arg++ = TensorArg{nullptr, 0, arg.direction, Placement::Device, arg.memory};
                } else if (check == ArgCheck::external) {
                    *lease++ = TensorLease{nullptr, arg.data, arg.bytes, false, ReleaseKind::ExternalNoop};
                    *device_arg++ = arg;
                    ++external;
                } else {
                    slot.lease_count = 0;
                    return plan_failure(check, static_cast<std::size_t>(&arg - args.data()), arg, end,
                                        Strategy::alignment);
                }
                continue;
            }
            const std::size_t offset = end;
            if ((arg.bytes | offset) > small_size) [[unlikely]] {
                std::size_t padded = 0, next = 0;
                if (__builtin_add_overflow(arg.bytes, mask, &padded) ||
                    __builtin_add_overflow(offset, padded & ~mask, &next)) {
                    slot.lease_count = 0;
                    return plan_failure(ArgCheck::staged, static_cast<std::size_t>(&arg - args.data()), arg, offset,
                                        Strategy::alignment);
                }
            }
            end = offset + ((arg.bytes + mask) & ~mask);
            // Integer arithmetic: past the capacity the pointers are not used (the run grows).
            // NOLINTNEXTLINE(performance-no-int-to-ptr): base is the buffer's address as an integer
            void* const device = reinterpret_cast<void*>(base + offset);
            *lease++ = TensorLease{arg.data,
                                   device,
                                   arg.bytes,
                                   copies_back(arg.direction),
                                   ReleaseKind::BufferNoop,
                                   nullptr,
                                   uploads(arg.direction),
                                   arg.memory};
            *device_arg = arg;
            device_arg->data = device;
            device_arg->placement = Placement::Device;
            ++device_arg;
        }
        const auto count = static_cast<std::size_t>(lease - slot.lease_storage.data());
        slot.lease_count = count;
        slot.staged = count - external;
        return end;
    }

    // The uploads of the leases sliced by slice(); the pageable-ring check only when a ring is set.
    Status upload(Slot& slot, Stream stream, bool& enqueued) noexcept {
        return ring_from_ == no_ring ? upload<false>(slot, stream, enqueued) : upload<true>(slot, stream, enqueued);
    }

    // The general staging pass: a lease and a device arg per arg, the slice or allocation of
    // each staged arg, and its upload — enqueued directly, or gathered into the mirror for one
    // packed upload. With `zero_outs` the packed Out group is zeroed in the mirror, and the
    // packed upload carries it. Where the mirror is mapped (MapSmall), the packed args' device
    // pointers point into it and nothing of them is uploaded: the device buffer holds only the
    // direct args, from its base. On error the leases taken so far are in slot.leases(), for
    // the caller to release.
    template <bool AllPacked>
    Status stage(Slot& slot, std::span<const TensorArg> args, Stream stream, bool& enqueued, bool zero_outs) noexcept {
        constexpr std::size_t limit = AllPacked ? std::numeric_limits<std::size_t>::max() : pack_limit;
        auto* const base = static_cast<std::byte*>(slot.strategy.base());
        std::byte* const mirror = mirror_of(slot.strategy);
        auto* const mapped = static_cast<std::byte*>(mapped_mirror_of(slot.strategy));
        const std::size_t shift = mapped != nullptr ? slot.layout.packed_bytes : 0;  // the direct args' start
        slot.mapped = mapped != nullptr && slot.layout.packed_bytes > 0;
        if constexpr (HostAccessCheckBackend<B>) {
            if (slot.mapped) {  // the host writes the mapped mirror now
                if (Status clear = backend_.check_host_access(mirror, slot.layout.packed_bytes, true); !clear) {
                    slot.lease_count = slot.staged = 0;
                    return clear;
                }
            }
        }
        std::array<std::size_t, 4> next = slot.layout.base;
        TensorLease* const leases = slot.lease_storage.data();
        TensorArg* const device_args = slot.device_args.data();
        std::size_t count = 0, external = 0;
        std::uint64_t skipped = 0, uploaded = 0, calls = 0, packed = 0, host_copied = 0;
        Status status;
        [[maybe_unused]] const std::size_t batching = batch_limit(stream);
        if constexpr (batches) slot.batch.clear();
        for (std::size_t index = 0; index < args.size(); ++index) {
            const TensorArg& arg = args[index];
            TensorArg& device_arg = device_args[index];
            if (!is_staged(arg)) [[unlikely]] {  // the plan refused every invalid arg
                if (arg.bytes == 0) {
                    device_arg = TensorArg{nullptr, 0, arg.direction, Placement::Device, arg.memory};
                } else {
                    leases[count++] = TensorLease{nullptr, arg.data, arg.bytes, false, ReleaseKind::ExternalNoop};
                    device_arg = arg;
                    ++external;
                }
                continue;
            }
            TensorLease& lease = leases[count];
            std::size_t group = static_cast<std::size_t>(PackGroup::direct);
            std::size_t offset = 0;
            if constexpr (retained) {
                if constexpr (limit > 0) group = static_cast<std::size_t>(group_of(arg, limit));
                offset = next[group];
                next[group] += (arg.bytes + Strategy::alignment - 1) & ~(Strategy::alignment - 1);
                std::byte* const device = group != static_cast<std::size_t>(PackGroup::direct) && mapped != nullptr
                                              ? mapped + offset
                                              : base + (offset - shift);
                lease = TensorLease{arg.data,
                                    device,
                                    arg.bytes,
                                    copies_back(arg.direction),
                                    ReleaseKind::BufferNoop,
                                    nullptr,
                                    uploads(arg.direction),
                                    arg.memory};
            } else {
                const PlannedTensor tensor{index, 0, arg.bytes, arg.direction};
                if (Status acquired = slot.strategy.acquire(backend_, tensor, arg, lease, stats_); !acquired) {
                    status = std::move(acquired);
                    break;
                }
                lease.host_memory = arg.memory;
            }
            ++count;
            device_arg = TensorArg{lease.device, arg.bytes, arg.direction, Placement::Device, arg.memory};
            if constexpr (pack_limit > 0) {
                if (group != static_cast<std::size_t>(PackGroup::direct)) {
                    ++packed;
                    std::byte* const into = mirror + offset;
                    const bool in_place = arg.data == into;
                    if (!in_place && inside(arg.data, mirror, mirror_capacity_of(slot.strategy))) {
                        status = stale_frame_arg(index, arg, into - mirror, backend_.name());
                        break;
                    }
                    if (!uploads(arg.direction)) {
                        ++skipped;
                    } else if (!in_place) {
                        std::memcpy(into, arg.data, arg.bytes);
                        host_copied += arg.bytes;
                    }
                    continue;
                }
            }
            if (!uploads(arg.direction)) {
                ++skipped;
                continue;
            }
            if (lease.bytes >= ring_from_ && through_ring(lease)) [[unlikely]] {
                status = ring_upload(lease, stream, enqueued);
                if (!status) break;
                ++calls;
                continue;
            }
            if constexpr (batches) {
                if (batching > 0) {
                    slot.batch.add(lease.device, arg.data, arg.bytes);
                    continue;
                }
            }
            if (Status copied = async_.copy_to_device_async(lease.device, arg.data, arg.bytes, stream); !copied) {
                status = copy_failure(message("bind: upload of arg ", index), arg.bytes, copied, backend_.name());
                break;
            }
            enqueued = true;
            uploaded += arg.bytes;
            ++calls;
        }
        slot.lease_count = count;
        slot.staged = count - external;
        if constexpr (batches) {
            if (status.ok()) {
                typename Slot::Batch::Submitted done;
                status =
                    slot.batch.template submit<true>(async_, batching, stream, stats_, done, enqueued, "bind: upload");
                uploaded += done.bytes;
                calls += done.calls;
            }
        }
        if constexpr (pack_limit > 0) {
            if (status.ok()) status = packed_upload(slot, stream, enqueued, zero_outs, uploaded, calls);
        }
        stats_.uploads_skipped += skipped;
        stats_.bytes_to_device += uploaded;
        stats_.uploads += calls;
        stats_.packed_args += packed;
        stats_.mirror_copy_bytes += host_copied;
        if (!streams_immediate(async_)) stats_.async_uploads += calls;
        return status;
    }

    // The copy-backs of a finish: one per copied-back lease (packed ones counted here and moved
    // by packed_copy_back). The first failure goes to `first`; the others still run.
    struct CopyBacks {
        std::uint64_t calls = 0, failed = 0, packed = 0, bytes = 0;
        std::uint64_t batched = 0;  // copies carried in batch calls beyond one per call
    };
    CopyBacks copy_back(Slot& slot, Stream stream, Status& first) noexcept {
        return ring_from_ == no_ring ? copy_back<false>(slot, stream, first) : copy_back<true>(slot, stream, first);
    }

    // One copy brings every packed InOut/Out byte back into the mirror; the host copies them
    // out when the run is settled (unpack).
    Status packed_copy_back(Slot& slot, Stream stream, CopyBacks& backs) noexcept;

    // Copies the packed outputs of a completed run from the mirror to the callers' memory
    // (nothing when they are in place: a frame).
    void unpack(Slot& slot) noexcept;

private:
    // After the gather: the packed Out group zeroed in the mirror, and the one packed upload
    // (detail/transfer/packed.hpp).
    Status packed_upload(Slot& slot, Stream stream, bool& enqueued, bool zero_outs, std::uint64_t& uploaded,
                         std::uint64_t& calls) noexcept;

    template <bool Ring>
    Status upload(Slot& slot, Stream stream, bool& enqueued) noexcept {
        if constexpr (batches) {
            if (const std::size_t limit = batch_limit(stream); limit > 0)
                return batched_upload<Ring>(slot, stream, enqueued, limit);
        }
        std::uint64_t uploaded = 0, calls = 0;
        Status status;
        const std::size_t ring_from = ring_from_;
        for (const TensorLease& lease : slot.leases()) {
            if (!lease.upload) continue;  // Out args, and Device args
            if (Ring && lease.bytes >= ring_from && through_ring(lease)) [[unlikely]] {
                status = ring_upload(lease, stream, enqueued);
                if (!status) break;
                ++calls;  // the arg's upload, in chunks (StagerStats::ring_chunks)
                continue;
            }
            if (Status copied = async_.copy_to_device_async(lease.device, lease.host, lease.bytes, stream); !copied) {
                status = copy_failure("bind: upload", lease.bytes, copied, backend_.name());
                break;
            }
            uploaded += lease.bytes;
            ++calls;
        }
        enqueued = enqueued || calls > 0;
        if (status.ok()) stats_.uploads_skipped += slot.staged - calls;
        stats_.bytes_to_device += uploaded;
        stats_.uploads += calls;
        if (!streams_immediate(async_)) stats_.async_uploads += calls;
        return status;
    }

    template <bool Ring>
    CopyBacks copy_back(Slot& slot, Stream stream, Status& first) noexcept {
        if constexpr (batches) {
            if (const std::size_t limit = batch_limit(stream); limit > 0)
                return batched_copy_back<Ring>(slot, stream, first, limit);
        }
        CopyBacks backs;
        const std::size_t ring_from = ring_from_;
        for (const TensorLease& lease : slot.leases()) {
            if (!lease.copy_back) continue;  // In args, and Device args (never copied back)
            if (slot.packed(lease)) {
                ++backs.packed;
                continue;
            }
            if (Ring && lease.bytes >= ring_from && through_ring(lease)) [[unlikely]] {
                if (Status back = ring_copy_back(lease, stream); !back) {
                    failed(backs, first, std::move(back));
                    continue;
                }
                ++backs.calls;
                continue;
            }
            if (Status back = async_.copy_from_device_async(lease.host, lease.device, lease.bytes, stream); !back) {
                failed(backs, first, copy_failure("finish: copy back", lease.bytes, back, backend_.name()));
                continue;
            }
            backs.bytes += lease.bytes;
            ++backs.calls;
        }
        return backs;
    }
    // As upload<Ring>, with the direct copies in batches (limit copies a call).
    template <bool Ring>
    Status batched_upload(Slot& slot, Stream stream, bool& enqueued, std::size_t limit) noexcept {
        slot.batch.clear();
        std::uint64_t args = 0, calls = 0;
        Status status;
        for (const TensorLease& lease : slot.leases()) {
            if (!lease.upload) continue;
            ++args;
            if (Ring && lease.bytes >= ring_from_ && through_ring(lease)) [[unlikely]] {
                status = ring_upload(lease, stream, enqueued);
                if (!status) break;
                ++calls;
                continue;
            }
            slot.batch.add(lease.device, lease.host, lease.bytes);
        }
        typename Slot::Batch::Submitted done;
        if (status.ok()) {
            status = slot.batch.template submit<true>(async_, limit, stream, stats_, done, enqueued, "bind: upload");
        }
        if (status.ok()) stats_.uploads_skipped += slot.staged - args;
        stats_.bytes_to_device += done.bytes;
        stats_.uploads += calls + done.calls;
        if (!streams_immediate(async_)) stats_.async_uploads += calls + done.calls;
        return status;
    }

    // As copy_back<Ring>, with the direct copies in batches. A batch that fails counts its
    // copies as failed.
    template <bool Ring>
    CopyBacks batched_copy_back(Slot& slot, Stream stream, Status& first, std::size_t limit) noexcept {
        CopyBacks backs;
        slot.batch.clear();
        for (const TensorLease& lease : slot.leases()) {
            if (!lease.copy_back) continue;
            if (slot.packed(lease)) {
                ++backs.packed;
                continue;
            }
            if (Ring && lease.bytes >= ring_from_ && through_ring(lease)) [[unlikely]] {
                if (Status back = ring_copy_back(lease, stream); !back) {
                    failed(backs, first, std::move(back));
                    continue;
                }
                ++backs.calls;
                continue;
            }
            slot.batch.add(lease.host, lease.device, lease.bytes);
        }
        typename Slot::Batch::Submitted done;
        bool enqueued = false;
        Status back =
            slot.batch.template submit<false>(async_, limit, stream, stats_, done, enqueued, "finish: copy back");
        backs.calls += done.calls;
        backs.batched += done.copies - done.calls;
        backs.bytes += done.bytes;
        if (!back) {
            backs.failed += slot.batch.count - done.copies - 1;
            failed(backs, first, std::move(back));
        }
        return backs;
    }

    // The copies of a call go in batches when the backend takes them now (at least two a call).
    std::size_t batch_limit([[maybe_unused]] Stream stream) const noexcept {
        if constexpr (batches) {
            const std::size_t limit = async_.batch_copy_limit(stream);
            return limit >= 2 ? limit : 0;
        } else {
            return 0;
        }
    }

    [[gnu::cold]] static void failed(CopyBacks& backs, Status& first, Status failure) noexcept {
        ++backs.failed;
        if (first.ok()) first = std::move(failure);
    }

    // The pageable ring's part (detail/transfer/ring.hpp).
    bool through_ring(const TensorLease& lease) const noexcept;
    Status ring_upload(const TensorLease& lease, Stream stream, bool& enqueued) noexcept;
    Status ring_copy_back(const TensorLease& lease, Stream stream) noexcept;

    B& backend_;
    Async& async_;
    StagerStats& stats_;
    Ring* ring_;
    std::size_t ring_from_;
};

}  // namespace devstage::detail

#include "devstage/detail/transfer/packed.hpp"  // IWYU pragma: export
#include "devstage/detail/transfer/ring.hpp"    // IWYU pragma: export
