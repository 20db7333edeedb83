// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: settling a slot of a Stager — once its pending work is known complete: the device
// frees that waited for it, the packed outputs copied to the callers (after those of the runs
// it follows, in finish order), the result handed to the Completions watching it — and the
// FreeQueue through which its strategy and leases give memory back while work is pending.

#include <cstddef>
#include <cstdint>
#include <string>

#include "devstage/backend.hpp"
#include "devstage/detail/stager/core.hpp"
#include "devstage/detail/transfer/packed.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B, class Strategy>
class Settler {
public:
    using Core = StagerCore<B, Strategy>;
    using Slot = typename Core::Slot;

    explicit Settler(Core& core) noexcept : core_(core) {}

    /// Blocks until slot `index`'s pending work completed, then settles it; when it cannot be
    /// settled (its work, or that of a run it follows, stays pending) the failure goes to the
    /// error sink and the slot waits for a later settle.
    void settle(std::size_t index) noexcept {
        if (Status settled = settle_fully(index, "settle"); !settled) core_.sink(settled);
    }

    /// settle(), when the slot's results are not handed out through `generation` yet (a
    /// Completion given up on).
    void settle_through(std::size_t index, std::uint64_t generation) noexcept {
        if (core_.slots[index].settled < generation) settle(index);
    }

    /// settle(), and an error, reported to no sink, when the slot cannot be settled: its work
    /// stays pending (its event could not be waited for, and synchronize() is missing or failed),
    /// or so does the work of a run whose packed outputs come before its own. The slot's memory
    /// is then still in use and nothing of it is settled.
    Status settle_fully(std::size_t index, const char* what) noexcept {
        Slot& slot = core_.slots[index];
        if (Status drained = drain_kernel_streams(index); !drained) {
            return Status(drained.code(), core_.with_backend(message("stager ", what, ": ", drained.message())));
        }
        if (Status settled = settle_with(index, slot.fence.wait(core_.async(), core_.stats)); !settled) {
            return Status(settled.code(), core_.with_backend(message("stager ", what, ": ", settled.message())));
        }
        return {};
    }

    /// Settles slot `index` once its pending work is known complete (with `status`, the run's
    /// own failure as far as the backend told): frees what waited for it, delivers its packed
    /// outputs (after those of the runs finished before that share its settle order), and hands
    /// the result to the completions watching it (to the error sink when none does). While the
    /// work is not known complete nothing changes and the failure is returned; so it is while a
    /// run it follows is.
    Status settle_with(std::size_t index, Status status) noexcept {
        Slot& slot = core_.slots[index];
        if (slot.fence.pending()) {
            return Status(status.ok() ? Errc::backend_failure : status.code(),
                          message("the pending work of slot ", index, " could not be waited for",
                                  status.ok() ? std::string() : ": " + status.message()));
        }
        for (void* allocation : slot.deferred) {
            ++core_.stats.device_frees;
            if (Status freed = core_.backend->device_free(allocation); !freed) {
                ++core_.stats.free_failures;
                if (status.ok()) {
                    status =
                        Status(freed.code(),
                               core_.with_backend(message("stager: a deferred device_free failed: ", freed.message())));
                }
            }
        }
        slot.deferred.clear();
        if (!slot.carried.empty()) slot.carried.clear();  // the slot's earlier runs completed with it
        if (slot.settle_order.pending > 0) {
            if (Status before = settle_predecessors(index); !before) return before;
        }
        // Known complete, whatever the run's result: its direct copy-backs landed, so do the packed.
        if (slot.state == SlotState::delivering) {
            unpack_outputs(*core_.backend, slot.run, slot.memory(), core_.stats);
            slot.go(SlotEvent::settle);
        }
        if (!slot.bound()) slot.mirror_in_use = false;  // a live run's packed upload is not under the fence
        resolve_settled(index, status);
        return {};
    }

    /// Settles slot `index` if its work completed, without blocking: true once settled.
    Result<bool> poll(std::size_t index) noexcept {
        if (Status drained = drain_kernel_streams(index); !drained) {
            return Status(drained.code(), core_.with_backend(message("completion ready: ", drained.message())));
        }
        Result<bool> ready = core_.slots[index].fence.poll(core_.async());
        if (!ready || !*ready) return ready;  // a failed query settles nothing: wait() then does
        if (Status settled = settle_with(index, Status()); !settled) {
            return Status(settled.code(), core_.with_backend(message("completion ready: ", settled.message())));
        }
        return true;
    }

    /// Blocks until the streams that slot `index`'s ended run kept are done: its kernels were
    /// ordered onto them (order_after_uploads) and ordering after them failed when the run
    /// ended, so the slot's fence does not cover them. Nothing of the slot is freed, reused or
    /// delivered before. A stream that cannot be waited for stays kept (unless the host then
    /// waits for the whole device where the backend can); the failure is returned.
    Status drain_kernel_streams(std::size_t index) noexcept {
        Slot& slot = core_.slots[index];
        if (slot.bound() || slot.kernel_stream_count == 0) return {};  // a live run's end joins them
        Status first;
        std::size_t kept = 0;
        for (std::size_t i = 0; i < slot.kernel_stream_count; ++i) {
            if (Status drained = slot.fence.drain(core_.async(), slot.kernel_streams[i], core_.stats); !drained) {
                slot.kernel_streams[kept++] = slot.kernel_streams[i];
                if (first.ok()) {
                    first = Status(drained.code(), message("the kernels of slot ", index,
                                                           "'s last run could not be waited for: ", drained.message()));
                }
            }
        }
        slot.kernel_stream_count = kept;
        if constexpr (SynchronizingBackend<B>) {
            if (!first.ok() && core_.backend->synchronize().ok()) {
                slot.kernel_stream_count = 0;  // the device is idle
                first = Status();
            }
        }
        return first;
    }

    /// Runs `use(queue)` with a FreeQueue of slot `index`: deferring its frees while the slot has
    /// pending work (settling it when a free cannot wait).
    template <class Use>
    Status with_queue(std::size_t index, Use&& use) noexcept {
        Slot& slot = core_.slots[index];
        if (slot.fence.pending()) {
            Context context{&core_, index};
            FreeQueue<B> queue(*core_.backend, core_.stats, core_.sink, slot.deferred, &Settler::settle_for_queue,
                               &context);
            return use(queue);
        }
        FreeQueue<B> queue(*core_.backend, core_.stats, core_.sink);
        return use(queue);
    }

private:
    struct Context {
        Core* core;
        std::size_t index;
    };
    static Status settle_for_queue(void* context) noexcept {
        auto* queue = static_cast<Context*>(context);
        return Settler(*queue->core).settle_fully(queue->index, "free");
    }

    // Settles the runs in flight that slot `index`'s run must be settled after (packed outputs
    // in finish order). They completed before it: its stream waited for them. One that cannot
    // be settled keeps this slot unsettled too (its failure is returned).
    Status settle_predecessors(std::size_t index) noexcept {
        Slot& slot = core_.slots[index];
        for (std::size_t other = 0; other < core_.slots.size(); ++other) {
            const std::uint64_t generation = slot.settle_order.after[other];
            if (generation == 0) continue;
            if (core_.slots[other].settled < generation) {
                if (Status settled = settle_fully(other, "settle"); !settled) {
                    return Status(settled.code(),
                                  message("the packed outputs of slot ", index, " follow those of slot ", other,
                                          ", which cannot be settled: ", settled.message()));
                }
            }
            slot.settle_order.done(other);
        }
        return {};
    }

    // Hands `status` to the completions watching slot `index` (to the error sink when none does).
    void resolve_settled(std::size_t index, const Status& status) noexcept {
        Slot& slot = core_.slots[index];
        const std::uint64_t generation = slot.generation;
        const bool owed = slot.settled < generation;
        slot.settled = generation;
        const std::size_t watched = core_.completions->resolve(index, generation, status);
        if (!status.ok() && (watched == 0 || !owed)) core_.sink(status);
    }

    Core& core_;
};

}  // namespace devstage::detail
