// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: how a Stager settles a slot once its pending work is known complete — deferred
// frees, packed outputs in finish order, results to the Completions — and releases leases, ends
// live runs, releases or forgets everything; the StagedRun and Completion callbacks.
// Included at the end of devstage/stager.hpp; not for inclusion on its own.

#include "devstage/stager.hpp"

namespace devstage {

template <Backend B, class Strategy>
Stager<B, Strategy>::Stager(B& backend, Strategy strategy, std::size_t pipeline_slots) noexcept
    : backend_(&backend), async_(backend) {
    const std::size_t count = std::max<std::size_t>(pipeline_slots, 1);
    if (count > max_pipeline_slots) {
        broken_ = Status(Errc::invalid_argument,
                         with_backend(detail::message("stager: ", pipeline_slots, " pipeline slots asked for; at most ",
                                                      max_pipeline_slots)));
        return;
    }
    if (!detail::make_slots(slots_, count, std::move(strategy))) {
        broken_ = Status(Errc::out_of_memory,
                         with_backend(detail::message("stager: host memory for ", count, " pipeline slots")));
    }
}

template <Backend B, class Strategy>
Stager<B, Strategy>::~Stager() {
    if (Status status = release(); !status) sink_(status);
    bool stuck = false;  // a slot whose work could not be waited for: its runs end unsettled
    for (Slot& slot : slots_) {
        stuck = stuck || slot.fence.pending() || slot.settled < slot.generation;
        if (Status destroyed = slot.fence.destroy(async()); !destroyed) sink_(destroyed);
    }
    if (own_stream_) {
        if (Status destroyed = async().destroy_stream(*own_stream_); !destroyed) sink_(destroyed);
    }
    if (!stuck) {
        resolve_all(Status());
    } else {
        resolve_all(Status(Errc::backend_failure,
                           with_backend("stager destroyed: the run's pending work could not be waited for; its outputs "
                                        "were not delivered, and the device may still write its host memory")));
    }
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::check_run(const StagedRun& run, const char* what) const noexcept {
    if (run.owner_ == static_cast<const detail::RunOwner*>(this)) return {};
    return detail::run_not_ours(what, run.owner_ == nullptr, backend_->name());
}

// Blocks until slot `index`'s pending work completed, then settles it; when it cannot be
// settled (its work, or that of a run it follows, stays pending) the failure goes to the error
// sink and the slot waits for a later settle.
template <Backend B, class Strategy>
void Stager<B, Strategy>::settle(std::size_t index) noexcept {
    if (Status settled = settle_fully(index, "settle"); !settled) sink_(settled);
}

// settle(), and an error, reported to no sink, when the slot cannot be settled: its work stays
// pending (its event could not be waited for, and synchronize() is missing or failed), or so
// does the work of a run whose packed outputs come before its own. The slot's memory is then
// still in use and nothing of it is settled.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::settle_fully(std::size_t index, const char* what) noexcept {
    Slot& slot = slots_[index];
    if (Status settled = settle_with(index, slot.fence.wait(async(), stats_)); !settled) {
        return Status(settled.code(), with_backend(detail::message("stager ", what, ": ", settled.message())));
    }
    return {};
}

// Settles slot `index` once its pending work is known complete (with `status`, the run's own
// failure as far as the backend told): frees what waited for it, copies packed outputs to the
// callers (after those of the runs finished before that share its settle order), and hands the
// result to the completions watching it (to the error sink when none does). While the work is
// not known complete nothing changes — what waits for it stays held, its outputs wait, its
// completions stay pending — and the failure is returned; so it is while a run it follows is.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::settle_with(std::size_t index, Status status) noexcept {
    Slot& slot = slots_[index];
    if (slot.fence.pending()) {
        return Status(status.ok() ? Errc::backend_failure : status.code(),
                      detail::message("the pending work of slot ", index, " could not be waited for",
                                      status.ok() ? std::string() : ": " + status.message()));
    }
    for (void* allocation : slot.deferred) {
        ++stats_.device_frees;
        if (Status freed = backend_->device_free(allocation); !freed) {
            ++stats_.free_failures;
            if (status.ok()) {
                status =
                    Status(freed.code(),
                           with_backend(detail::message("stager: a deferred device_free failed: ", freed.message())));
            }
        }
    }
    slot.deferred.clear();
    if (!slot.carried.empty()) {  // the slot's earlier runs completed with it
        slot.carried = {};
        slot.carried_touches.clear();
        slot.carried_overflow = false;
    }
    if (slot.has_settle_after) {
        if (Status before = settle_predecessors(index); !before) return before;
    }
    // Known complete, whatever the run's result: its direct copy-backs landed, so do the packed.
    if (slot.unpack) moves().unpack(slot);
    slot.unpack = false;
    if (!slot.live) slot.uses_mirror = false;  // a live run's packed upload is not under the fence
    resolve_settled(index, status);
    return {};
}

// Settles the runs in flight that slot `index`'s run must be settled after (packed outputs
// in finish order). They completed before it: its stream waited for them. One that cannot be
// settled keeps this slot unsettled too (its failure is returned).
template <Backend B, class Strategy>
Status Stager<B, Strategy>::settle_predecessors(std::size_t index) noexcept {
    Slot& slot = slots_[index];
    for (std::size_t other = 0; other < slots_.size(); ++other) {
        const std::uint64_t generation = slot.settle_after[other];
        if (generation == 0) continue;
        if (slots_[other].settled < generation) {
            if (Status settled = settle_fully(other, "settle"); !settled) {
                return Status(settled.code(),
                              detail::message("the packed outputs of slot ", index, " follow those of slot ", other,
                                              ", which cannot be settled: ", settled.message()));
            }
        }
        slot.settle_after[other] = 0;
    }
    slot.has_settle_after = false;
    return {};
}

// Hands `status` to the completions watching slot `index` (to the error sink when none does).
template <Backend B, class Strategy>
void Stager<B, Strategy>::resolve_settled(std::size_t index, const Status& status) noexcept {
    Slot& slot = slots_[index];
    const std::uint64_t generation = slot.generation;
    const bool owed = slot.settled < generation;
    slot.settled = generation;
    const std::size_t watched = resolve(index, generation, status);
    if (!status.ok() && (watched == 0 || !owed)) sink_(status);
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::release_leases(Slot& slot) noexcept {
    Status first;
    if constexpr (!retained) {
        QueueContext context{this, static_cast<std::size_t>(&slot - slots_.data())};
        first = with_queue(slot, context, [&](FreeQueue<B>& queue) {
            Status status;
            for (TensorLease& lease : slot.leases()) {
                if (lease.release_kind != ReleaseKind::Free || lease.allocation == nullptr) continue;
                Status released = queue.free(lease.allocation);
                lease.allocation = nullptr;
                if (!released && status.ok()) {
                    status = Status(released.code(), detail::message("stager: releasing a lease of ", lease.bytes,
                                                                     " bytes: ", released.message()));
                }
            }
            return status;
        });
    }
    slot.live = false;
    return first;
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::end_live_run(Slot& slot) noexcept {
    for (const TensorLease& lease : slot.leases()) {
        if (lease.release_kind != ReleaseKind::ExternalNoop) ++stats_.copy_backs_skipped;
    }
    // The uploads, and kernels on streams ordered after them, complete before any free.
    Status joined = join_kernel_streams(slot, slot.bind_stream);
    Status recorded = slot.fence.record(async(), slot.bind_stream);
    unlink_handle(slot);
    Status released = release_leases(slot);
    if (!joined.ok()) return joined;
    return recorded.ok() ? released : recorded;
}

template <Backend B, class Strategy>
void Stager<B, Strategy>::unlink_handle(Slot& slot) noexcept {
    if (slot.handle != nullptr) slot.handle->unlink();
    slot.handle = nullptr;
    slot.live = false;
}

// A run dropped without finish: its leases are released once its uploads completed, before
// the handle's destructor returns.
template <Backend B, class Strategy>
void Stager<B, Strategy>::drop_run(std::size_t slot) noexcept {
    Slot& s = slots_[slot];
    s.handle = nullptr;
    if (Status status = end_live_run(s); !status) sink_(status);
    settle(slot);
}

template <Backend B, class Strategy>
void Stager<B, Strategy>::relink_run(std::size_t slot, StagedRun* handle) noexcept {
    slots_[slot].handle = handle;
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::settle_completion(Completion& completion) noexcept {
    return settle_fully(completion_slot(completion), "wait");
}

template <Backend B, class Strategy>
Result<bool> Stager<B, Strategy>::poll_completion(Completion& completion) noexcept {
    const std::size_t index = completion_slot(completion);
    Result<bool> ready = slots_[index].fence.poll(async());
    if (!ready || !*ready) return ready;  // a failed query settles nothing: wait() then does
    if (Status settled = settle_with(index, Status()); !settled) {
        return Status(settled.code(), with_backend(detail::message("completion ready: ", settled.message())));
    }
    return true;
}

template <Backend B, class Strategy>
void Stager<B, Strategy>::settle_unwatched(std::size_t slot, std::uint64_t generation) noexcept {
    if (slots_[slot].settled < generation) settle(slot);
}

template <Backend B, class Strategy>
void Stager<B, Strategy>::release_hold(std::size_t slot, std::uint64_t generation) noexcept {
    if (slot < slots_.size() && slots_[slot].held_generation == generation) slots_[slot].held = false;
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::release() noexcept {
    Status first;
    for (std::size_t index = 0; index < slots_.size(); ++index) {
        Slot& slot = slots_[index];
        if (slot.live) {
            Status dropped = end_live_run(slot);
            if (first.ok()) first = std::move(dropped);
        }
        slot.framed = slot.held = false;
    }
    if constexpr (PinnedHostBackend<B>) {
        if (ring_) {
            Status freed = ring_->release(*backend_, async(), stats_);  // re-created at next use
            if (first.ok()) first = std::move(freed);
        }
    }
    // Every slot is settled before any memory goes: a run may read another slot's mirror (an
    // output fed back as an input).
    bool kept = false;
    for (std::size_t index = 0; index < slots_.size(); ++index) {
        if (Status settled = settle_fully(index, "release"); !settled) {
            // Pending work may still use the slot's memory: it is kept for a later release().
            if (first.ok()) first = std::move(settled);
            kept = true;
        }
    }
    for (std::size_t index = 0; index < slots_.size(); ++index) {
        Slot& slot = slots_[index];
        if (slot.fence.pending() || slot.settled < slot.generation) continue;  // not settled: still in use
        if (kept && detail::mirror_of(slot.strategy) != nullptr) continue;     // pending work may read it
        Status freed = slot.strategy.release_retained(*backend_, stats_);
        if (first.ok()) first = std::move(freed);
        slot.drop_bookkeeping();  // the per-arg host bookkeeping goes too: the next bind sizes it again
    }
    return first;
}

template <Backend B, class Strategy>
void Stager<B, Strategy>::abandon() noexcept {
    for (Slot& slot : slots_) {
        if (slot.live) {
            slot.lease_count = 0;
            unlink_handle(slot);
        }
        slot.lease_count = 0;
        slot.kernel_stream_count = 0;
        slot.deferred.clear();
        slot.fence.forget();
        slot.framed = slot.held = false;
        slot.has_settle_after = false;
        std::fill(slot.settle_after.begin(), slot.settle_after.end(), 0);
        slot.carried = {};
        slot.unpack = slot.uses_mirror = false;
        slot.settled = slot.generation;
        slot.strategy.abandon(stats_);
    }
    own_stream_.reset();
    if constexpr (PinnedHostBackend<B>) {
        if (ring_) ring_->forget(stats_);
    }
    resolve_all(Status(Errc::backend_failure, "stager abandon: the run's pending work was forgotten"));
}

}  // namespace devstage
