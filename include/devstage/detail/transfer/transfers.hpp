// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the passes that lay a run out and move its bytes — the fused slicing pass of a
// retained buffer without packing and its uploads, the general staging pass (slices or
// allocations, packed args gathered into the mirror), the copy-backs — over a run's RunRecord
// and its slot's memory (RunMemory), never the slot. Made on the stack for one call.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "devstage/backend.hpp"
#include "devstage/detail/layout/bump.hpp"
#include "devstage/detail/layout/plan_pass.hpp"
#include "devstage/detail/schedule/immediate.hpp"
#include "devstage/detail/transfer/failures.hpp"
#include "devstage/detail/transfer/packed.hpp"
#include "devstage/detail/transfer/ring.hpp"
#include "devstage/detail/transfer/run_record.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/lease.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

template <class B, class Strategy, class Async>
class Transfers {
public:
    using Run = RunRecord<Async>;
    using Stream = typename Async::Stream;
    using Ring = RingOf<B, Async>;
    static constexpr bool retained = Strategy::lease_kind == ReleaseKind::BufferNoop;
    static constexpr bool batches = BatchCopyBackend<Async>;
    static constexpr std::size_t alignment = Strategy::alignment;
    static constexpr std::size_t no_ring = std::numeric_limits<std::size_t>::max();  // a threshold no arg reaches

    Transfers(B& backend, Async& async, StagerStats& stats, Ring* ring, std::size_t ring_from) noexcept
        : backend_(backend), async_(async), stats_(stats), ring_(ring), ring_from_(ring_from) {}

    // The fused pass of a retained buffer without packing: checks each arg and writes its lease
    // and device arg against `base` by the bump rule. Returns the bytes the run requires; the
    // slices are valid when that is within the capacity.
    Result<std::size_t> slice(Run& run, void* base_pointer, std::span<const TensorArg> args) noexcept {
        const auto base = reinterpret_cast<std::uintptr_t>(base_pointer);
        TensorLease* lease = run.lease_storage.data();
        TensorArg* device_arg = run.device_args.data();
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
                    run.lease_count = 0;
                    return plan_failure(check, static_cast<std::size_t>(&arg - args.data()), arg, end, alignment);
                }
                continue;
            }
            const std::size_t offset = end;
            if ((arg.bytes | offset) > small_size) [[unlikely]] {  // the checked bump only where it can overflow
                if (!bump(offset, arg.bytes, alignment, end)) {
                    run.lease_count = 0;
                    return plan_failure(ArgCheck::staged, static_cast<std::size_t>(&arg - args.data()), arg, offset,
                                        alignment);
                }
            } else {
                end = bumped(offset, arg.bytes, alignment);
            }
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
        const auto count = static_cast<std::size_t>(lease - run.lease_storage.data());
        run.lease_count = count;
        run.staged = count - external;
        return end;
    }

    // The uploads of the leases slice() cut (checked against the pageable ring only with one).
    Status upload(Run& run, Stream stream, bool& enqueued) noexcept {
        return ring_from_ == no_ring ? upload<false>(run, stream, enqueued) : upload<true>(run, stream, enqueued);
    }

    // The general staging pass over `run.layout` (planned at run.pack_limit): a lease and a device
    // arg per arg, its slice or allocation, and its upload — direct, or gathered into the mirror
    // for one packed upload (carrying the packed Outs zeroed there, `zero_outs`). Mapped, packed
    // args point into the mirror and are not uploaded; the device buffer holds only the direct
    // args. On error the leases taken so far are in run.leases(), for the caller to release.
    Status stage(Run& run, Strategy& strategy, const RunMemory& memory, std::span<const TensorArg> args, Stream stream,
                 bool zero_outs, Moved& moved) noexcept {
        const std::size_t limit = run.pack_limit;
        const bool mapped = mapped_run(run, memory);
        const std::size_t shift = memory.mapped != nullptr ? run.layout.packed_bytes : 0;  // the direct args' start
        if constexpr (HostAccessCheckBackend<B>) {
            if (mapped) {  // the host writes the mapped mirror now
                if (Status clear = backend_.check_host_access(memory.mirror, run.layout.packed_bytes, true); !clear) {
                    run.lease_count = run.staged = 0;
                    return clear;
                }
            }
        }
        std::array<std::size_t, 4> next = run.layout.base;
        TensorLease* const leases = run.lease_storage.data();
        TensorArg* const device_args = run.device_args.data();
        std::size_t count = 0, external = 0;
        std::uint64_t skipped = 0, uploaded = 0, calls = 0, packed = 0, host_copied = 0;
        bool enqueued = false;
        Status status;
        [[maybe_unused]] const std::size_t batching = batch_limit(stream);
        if constexpr (batches) run.batch.clear();
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
            auto group = static_cast<std::size_t>(PackGroup::direct);
            std::size_t offset = 0;
            if constexpr (retained) {
                if (limit > 0) group = static_cast<std::size_t>(group_of(arg, limit));
                offset = next[group];
                next[group] = bumped(offset, arg.bytes, alignment);
                std::byte* const device = group != static_cast<std::size_t>(PackGroup::direct) && mapped
                                              ? memory.mapped + offset
                                              : memory.base + (offset - shift);
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
                if (Status acquired = strategy.acquire(backend_, tensor, arg, lease, stats_); !acquired) {
                    status = std::move(acquired);
                    break;
                }
                lease.host_memory = arg.memory;
            }
            ++count;
            device_arg = TensorArg{lease.device, arg.bytes, arg.direction, Placement::Device, arg.memory};
            if constexpr (retained) {
                if (group != static_cast<std::size_t>(PackGroup::direct)) {
                    ++packed;
                    std::byte* const into = memory.mirror + offset;
                    const bool in_place = arg.data == into;
                    if (!in_place && inside(arg.data, memory.mirror, memory.mirror_capacity)) {
                        status = stale_frame_arg(index, arg, into - memory.mirror, backend_.name());
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
            if (lease.bytes >= ring_from_ && through_ring(backend_, lease)) [[unlikely]] {
                status = ring_upload(backend_, async_, ring_, lease, stream, stats_, enqueued);
                if (!status) break;
                ++calls;
                continue;
            }
            if constexpr (batches) {
                if (batching > 0) {
                    run.batch.add(lease.device, arg.data, arg.bytes);
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
        run.lease_count = count;
        run.staged = count - external;
        if constexpr (batches) {
            if (status.ok()) {
                typename BatchCopies<Async>::Submitted done;
                status =
                    run.batch.template submit<true>(async_, batching, stream, stats_, done, enqueued, "bind: upload");
                uploaded += done.bytes;
                calls += done.calls;
            }
        }
        Moved packed_moves;
        if constexpr (retained) {
            if (limit > 0 && status.ok()) {
                status = packed_upload(async_, run, memory, stream, zero_outs, stats_, packed_moves);
            }
        }
        moved.enqueued = enqueued || packed_moves.enqueued;
        moved.mirror_used = packed_moves.mirror_used;
        stats_.uploads_skipped += skipped;
        stats_.bytes_to_device += uploaded + packed_moves.bytes;
        stats_.uploads += calls + packed_moves.calls;
        stats_.packed_args += packed;
        stats_.mirror_copy_bytes += host_copied;
        if (!streams_immediate(async_)) stats_.async_uploads += calls + packed_moves.calls;
        return status;
    }

    // The direct copy-backs of a finish (packed ones counted, for the caller's one packed copy).
    CopyBacks copy_back(Run& run, Stream stream, Status& first) noexcept {
        const bool ring = ring_from_ != no_ring;
        if (run.pack_limit == 0) {
            return ring ? copy_back<true, false>(run, stream, first) : copy_back<false, false>(run, stream, first);
        }
        return ring ? copy_back<true, true>(run, stream, first) : copy_back<false, true>(run, stream, first);
    }

private:
    template <bool Ring>
    Status upload(Run& run, Stream stream, bool& enqueued) noexcept {
        if constexpr (batches) {
            if (const std::size_t limit = batch_limit(stream); limit > 0)
                return batched_upload<Ring>(run, stream, enqueued, limit);
        }
        std::uint64_t uploaded = 0, calls = 0;
        Status status;
        const std::size_t ring_from = ring_from_;
        for (const TensorLease& lease : run.leases()) {
            if (!lease.upload) continue;  // Out args, and Device args
            if (Ring && lease.bytes >= ring_from && through_ring(backend_, lease)) [[unlikely]] {
                status = ring_upload(backend_, async_, ring_, lease, stream, stats_, enqueued);
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
        if (status.ok()) stats_.uploads_skipped += run.staged - calls;
        stats_.bytes_to_device += uploaded;
        stats_.uploads += calls;
        if (!streams_immediate(async_)) stats_.async_uploads += calls;
        return status;
    }

    template <bool Ring, bool Packs>
    CopyBacks copy_back(Run& run, Stream stream, Status& first) noexcept {
        if constexpr (batches) {
            if (const std::size_t limit = batch_limit(stream); limit > 0)
                return batched_copy_back<Ring>(run, stream, first, limit);
        }
        CopyBacks backs;  // counted in locals: the loop keeps them in registers
        std::uint64_t calls = 0, packed = 0, bytes = 0;
        const std::size_t ring_from = ring_from_;
        for (const TensorLease& lease : run.leases()) {
            if (!lease.copy_back) continue;  // In args, and Device args (never copied back)
            if (Packs && run.packed(lease)) {
                ++packed;
                continue;
            }
            if (Ring && lease.bytes >= ring_from && through_ring(backend_, lease)) [[unlikely]] {
                if (Status back = ring_copy_back(backend_, async_, ring_, lease, stream, stats_); !back) {
                    failed(backs, first, std::move(back));
                    continue;
                }
                ++calls;
                continue;
            }
            if (Status back = async_.copy_from_device_async(lease.host, lease.device, lease.bytes, stream); !back) {
                failed(backs, first, copy_failure("finish: copy back", lease.bytes, back, backend_.name()));
                continue;
            }
            bytes += lease.bytes;
            ++calls;
        }
        backs.calls = calls;
        backs.packed = packed;
        backs.bytes = bytes;
        return backs;
    }

    // As upload<Ring>, with the direct copies in batches (limit copies a call).
    template <bool Ring>
    Status batched_upload(Run& run, Stream stream, bool& enqueued, std::size_t limit) noexcept {
        run.batch.clear();
        std::uint64_t args = 0, calls = 0;
        Status status;
        for (const TensorLease& lease : run.leases()) {
            if (!lease.upload) continue;
            ++args;
            if (Ring && lease.bytes >= ring_from_ && through_ring(backend_, lease)) [[unlikely]] {
                status = ring_upload(backend_, async_, ring_, lease, stream, stats_, enqueued);
                if (!status) break;
                ++calls;
                continue;
            }
            run.batch.add(lease.device, lease.host, lease.bytes);
        }
        typename BatchCopies<Async>::Submitted done;
        if (status.ok()) {
            status = run.batch.template submit<true>(async_, limit, stream, stats_, done, enqueued, "bind: upload");
        }
        if (status.ok()) stats_.uploads_skipped += run.staged - args;
        stats_.bytes_to_device += done.bytes;
        stats_.uploads += calls + done.calls;
        if (!streams_immediate(async_)) stats_.async_uploads += calls + done.calls;
        return status;
    }

    // As copy_back<Ring>, with the direct copies in batches (a failed batch: all its copies failed).
    template <bool Ring>
    CopyBacks batched_copy_back(Run& run, Stream stream, Status& first, std::size_t limit) noexcept {
        CopyBacks backs;
        run.batch.clear();
        for (const TensorLease& lease : run.leases()) {
            if (!lease.copy_back) continue;
            if (run.packed(lease)) {
                ++backs.packed;
                continue;
            }
            if (Ring && lease.bytes >= ring_from_ && through_ring(backend_, lease)) [[unlikely]] {
                if (Status back = ring_copy_back(backend_, async_, ring_, lease, stream, stats_); !back) {
                    failed(backs, first, std::move(back));
                    continue;
                }
                ++backs.calls;
                continue;
            }
            run.batch.add(lease.host, lease.device, lease.bytes);
        }
        typename BatchCopies<Async>::Submitted done;
        bool enqueued = false;
        Status back =
            run.batch.template submit<false>(async_, limit, stream, stats_, done, enqueued, "finish: copy back");
        backs.calls += done.calls;
        backs.batched += done.copies - done.calls;
        backs.bytes += done.bytes;
        if (!back) {
            backs.failed += run.batch.count - done.copies - 1;
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

    B& backend_;
    Async& async_;
    StagerStats& stats_;
    Ring* ring_;
    std::size_t ring_from_;
};

}  // namespace devstage::detail
