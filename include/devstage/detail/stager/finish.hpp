// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: how a Stager ends a run — the finish's stream ordered after the bind's and after the
// streams its kernels ran on, the copy-backs (direct, then the one packed copy), the leases
// given back by their kind, and a run that ends without a finish.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "devstage/backend.hpp"
#include "devstage/detail/stager/core.hpp"
#include "devstage/detail/stager/settle.hpp"
#include "devstage/detail/stager/stream_check.hpp"
#include "devstage/detail/transfer/packed.hpp"
#include "devstage/detail/transfer/transfers.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B, class Strategy>
class Finisher {
public:
    using Core = StagerCore<B, Strategy>;
    using Slot = typename Core::Slot;
    using Stream = typename Core::Stream;
    using Async = typename Core::Async;

    explicit Finisher(Core& core) noexcept : core_(core) {}

    /// Orders `stream` after the live run of slot `index`: its bind's stream and the streams
    /// its kernels were ordered onto. When that cannot be enqueued, nothing but the caller's
    /// kernel is on `stream` that may use the run's memory: the uploads are waited for on the
    /// host, and `fenced` becomes the stream whose work keeps the memory (the bind's, when even
    /// that wait failed). Returns the failure.
    Status order_after_bind(std::size_t index, Stream stream, Stream& fenced) noexcept {
        Slot& slot = core_.slots[index];
        Status first = slot.fence.join(core_.async(), slot.bind_stream, stream);
        if (Status joined = join_kernel_streams(index, stream); !joined && first.ok()) first = joined;
        fenced = stream;
        if (!first.ok()) {
            (void)slot.fence.record(core_.async(), slot.bind_stream);
            (void)slot.fence.wait(core_.async(), core_.stats);
            if (slot.fence.pending()) fenced = slot.bind_stream;
        }
        return first;
    }

    /// Enqueues the copy-backs of the run on slot `index` on `stream` when `execution` and
    /// `first` are ok — one per direct output, then one packed copy of every packed output into
    /// the mirror — and counts them. The first failure goes to `first`. Returns true when packed
    /// outputs wait in the mirror (copied back, or written there in place by a mapped run's
    /// kernel), for the host to deliver when the slot is settled.
    bool copy_backs(std::size_t index, Stream stream, const Status& execution, Status& first) noexcept {
        Slot& slot = core_.slots[index];
        CopyBacks backs;
        if (execution.ok() && first.ok()) backs = core_.moves().copy_back(slot.run, stream, first);
        core_.stats.copy_backs_skipped += slot.run.staged - (backs.calls + backs.failed + backs.packed);
        if constexpr (BatchCopyBackend<Async>) core_.stats.copy_backs_skipped -= backs.batched;
        bool deliver = false;
        if (backs.packed > 0) {
            const RunMemory memory = slot.memory();
            Moved moved;
            // Mapped, the kernel wrote them in the mirror: no copy.
            Status back = mapped_run(slot.run, memory)
                              ? Status()
                              : packed_copy_back(core_.async(), slot.run, memory, stream, moved);
            deliver = back.ok();
            if (!back && first.ok()) first = std::move(back);
            backs.bytes += moved.bytes;
            backs.calls += moved.calls;
        }
        core_.stats.bytes_from_device += backs.bytes;
        core_.stats.copy_backs += backs.calls;
        if (!streams_immediate(core_.async())) core_.stats.async_copy_backs += backs.calls;
        slot.mirror_in_use = slot.mirror_in_use || deliver;
        return deliver;
    }

    /// Gives back the leases of slot `index`'s run by their kind: Free allocations through the
    /// slot's FreeQueue (after its pending work); retained slices need nothing.
    Status release_leases(std::size_t index) noexcept {
        if constexpr (Core::retained) {
            (void)index;
            return {};
        } else {
            Slot& slot = core_.slots[index];
            return Settler<B, Strategy>(core_).with_queue(index, [&](FreeQueue<B>& queue) {
                Status status;
                for (TensorLease& lease : slot.run.leases()) {
                    if (lease.release_kind != ReleaseKind::Free || lease.allocation == nullptr) continue;
                    Status released = queue.free(lease.allocation);
                    lease.allocation = nullptr;
                    if (!released && status.ok()) {
                        status = Status(released.code(), message("stager: releasing a lease of ", lease.bytes,
                                                                 " bytes: ", released.message()));
                    }
                }
                return status;
            });
        }
    }

    /// Ends the live run of slot `index` without a finish (dropped, released): nothing copied
    /// back; its leases go back once its uploads, and kernels on streams ordered after them,
    /// completed.
    Status end_run(std::size_t index) noexcept {
        Slot& slot = core_.slots[index];
        for (const TensorLease& lease : slot.run.leases()) {
            if (lease.release_kind != ReleaseKind::ExternalNoop) ++core_.stats.copy_backs_skipped;
        }
        Status joined = join_kernel_streams(index, slot.bind_stream);
        Status recorded = slot.fence.record(core_.async(), slot.bind_stream);
        slot.go(SlotEvent::end);
        Status released = release_leases(index);
        if (!joined.ok()) return joined;
        return recorded.ok() ? released : recorded;
    }

    /// A run dropped without finish: ended, its leases released once its uploads completed.
    void drop(std::size_t index) noexcept {
        if (Status status = end_run(index); !status) core_.sink(status);
        Settler<B, Strategy>(core_).settle(index);
    }

    /// Work enqueued on `stream` from now on runs after the live run's bind on slot `index`
    /// (see Stager::order_after_uploads).
    Status order_after_uploads(std::size_t index, Stream stream) noexcept {
        if (Status checked = check_stream(*core_.backend, stream, "order_after_uploads"); !checked) return checked;
        Slot& slot = core_.slots[index];
        if (slot.bind_stream == stream) return {};
        const auto ordered = slot.kernel_streams.begin() + static_cast<std::ptrdiff_t>(slot.kernel_stream_count);
        const bool known = std::find(slot.kernel_streams.begin(), ordered, stream) != ordered;
        if (!known && slot.kernel_stream_count == Slot::max_kernel_streams) {
            return Status(Errc::invalid_argument,
                          core_.with_backend(message("stager order_after_uploads: the run of slot ", index,
                                                     " is ordered onto ", Slot::max_kernel_streams,
                                                     " other streams already, the most one run may be")));
        }
        if (Status joined = slot.fence.join(core_.async(), slot.bind_stream, stream); !joined) {
            return Status(joined.code(), core_.with_backend(message("stager order_after_uploads: ordering the stream "
                                                                    "after the uploads of slot ",
                                                                    index, " failed: ", joined.message())));
        }
        if (!known) slot.kernel_streams[slot.kernel_stream_count++] = stream;  // finish and drop wait for it
        return {};
    }

private:
    // Makes `stream` wait for what is enqueued so far on the streams order_after_uploads ordered
    // after the live run of slot `index` (its kernels may run there), and forgets them. A stream
    // whose wait cannot be enqueued stays known (a later call orders after it again; once the
    // run ended, settling the slot waits for it on the host first), unless the host then waits
    // for the whole device where the backend can: nothing is freed or reused under a kernel. The
    // failure is returned either way.
    Status join_kernel_streams(std::size_t index, Stream stream) noexcept {
        Slot& slot = core_.slots[index];
        Status first;
        std::size_t kept = 0;
        for (std::size_t i = 0; i < slot.kernel_stream_count; ++i) {
            if (slot.kernel_streams[i] == stream) continue;
            if (Status joined = slot.fence.join(core_.async(), slot.kernel_streams[i], stream); !joined) {
                slot.kernel_streams[kept++] = slot.kernel_streams[i];
                if (first.ok()) {
                    first = Status(joined.code(),
                                   core_.with_backend(message("stager: ordering after the kernel streams of slot ",
                                                              index, " failed: ", joined.message())));
                }
            }
        }
        slot.kernel_stream_count = kept;
        if constexpr (SynchronizingBackend<B>) {
            if (!first.ok() && core_.backend->synchronize().ok()) slot.kernel_stream_count = 0;
        }
        return first;
    }

    Core& core_;
};

}  // namespace devstage::detail
