// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: how a Stager gives its memory back — every slot settled first (a run may read
// another slot's mirror), then each settled slot's retained buffer, mirror and bookkeeping, and
// the pageable ring — or forgets it without calling the backend (after a device reset).

#include <cstddef>
#include <limits>
#include <memory>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/stager/core.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/stager/settle.hpp"
#include "devstage/detail/stager/slot_state.hpp"
#include "devstage/detail/transfer/pinned_ring.hpp"
#include "devstage/host_copy.hpp"
#include "devstage/pageable.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"

namespace devstage::detail {

template <class B, class Strategy>
class Releaser {
public:
    using Core = StagerCore<B, Strategy>;
    using Slot = typename Core::Slot;

    explicit Releaser(Core& core) noexcept : core_(core) {}

    /// Waits for pending work and gives back every slot's retained memory and the ring. A slot
    /// whose pending work cannot be waited for keeps its memory (and, while any slot is kept,
    /// every mirror stays: pending work may read another slot's); the first failure is returned,
    /// and a later release tries again. Precondition: no slot holds a run or a frame.
    Status release_memory() noexcept {
        Status first;
        if constexpr (PinnedHostBackend<B>) {
            if (core_.ring) {
                Status freed = core_.ring->release(*core_.backend, core_.async(), core_.stats);  // remade at next use
                if (first.ok()) first = std::move(freed);
            }
        }
        bool kept = false;
        for (std::size_t index = 0; index < core_.slots.size(); ++index) {
            if (Status settled = Settler<B, Strategy>(core_).settle_fully(index, "release"); !settled) {
                if (first.ok()) first = std::move(settled);
                kept = true;
            }
        }
        for (Slot& slot : core_.slots) {
            if (slot.fence.pending() || slot.settled < slot.generation) continue;  // not settled: still in use
            if (kept && mirror_of(slot.strategy) != nullptr) continue;             // pending work may read it
            Status freed = slot.strategy.release_retained(*core_.backend, core_.stats);
            if (first.ok()) first = std::move(freed);
            slot.drop_bookkeeping();  // the per-arg host bookkeeping goes too: the next bind sizes it again
        }
        return first;
    }

    /// Busy, naming the slots, while a frame is unbound or held by its run's Completion: frame
    /// memory is never given back under a frame.
    Status frames_held() const noexcept {
        if (core_.count(SlotState::framed) + core_.count(SlotState::held) == 0) return {};
        const auto state = [this](std::size_t i) { return core_.slots[i].state; };
        return frames_in_use("release", core_.slots.size(), state, core_.backend->name());
    }

    /// After the last release of a stager that is going away: destroys the slots' events and
    /// the stager's own stream; returns what the Completions still watched resolve with (a
    /// failure when some work could not be waited for: its outputs were not delivered).
    Status close() noexcept {
        bool stuck = false;
        for (Slot& slot : core_.slots) {
            stuck = stuck || slot.fence.pending() || slot.settled < slot.generation;
            if (Status destroyed = slot.fence.destroy(core_.async()); !destroyed) core_.sink(destroyed);
        }
        if (core_.own_stream) {
            if (Status destroyed = core_.async().destroy_stream(*core_.own_stream); !destroyed) core_.sink(destroyed);
        }
        if (!stuck) return {};
        return Status(Errc::backend_failure,
                      core_.with_backend("stager destroyed: the run's pending work could not be waited for; its "
                                         "outputs were not delivered, and the device may still write its host memory"));
    }

    /// Forgets every slot's memory, pending work and events without calling the backend; every
    /// slot is idle afterwards. The caller makes live run handles inert first.
    void forget() noexcept {
        for (Slot& slot : core_.slots) {
            slot.go(SlotEvent::abandon);
            slot.run.lease_count = 0;
            slot.kernel_stream_count = 0;
            slot.deferred.clear();
            slot.fence.forget();
            slot.settle_order.clear();
            slot.carried.clear();
            slot.mirror_in_use = false;
            slot.settled = slot.generation;
            slot.strategy.abandon(core_.stats);
        }
        core_.own_stream.reset();
        if constexpr (PinnedHostBackend<B>) {
            if (core_.ring) core_.ring->forget(core_.stats);
        }
    }

    /// Slot `slot`'s retained buffer taken over from another owner (see Stager::adopt).
    template <class S = Strategy>
    Status adopt(std::size_t slot, void* allocation, std::size_t bytes) noexcept {
        if (slot >= core_.slots.size()) return core_.out_of_range("adopt", slot);
        if (core_.slots[slot].taken()) return core_.busy("adopt");
        Settler<B, Strategy>(core_).settle(slot);
        Slot& held = core_.slots[slot];
        S& strategy = held.strategy;
        if (Status adopted = strategy.adopt(*core_.backend, allocation, bytes, core_.stats); !adopted) return adopted;
        held.note_base(core_.stats);
        return {};
    }

    /// Slot `slot`'s retained buffer handed over to the caller (see Stager::detach).
    template <class S = Strategy>
    auto detach(std::size_t slot) noexcept
        -> Result<decltype(std::declval<S&>().detach(std::declval<StagerStats&>()))> {
        if (slot >= core_.slots.size()) return core_.out_of_range("detach", slot);
        if (core_.slots[slot].taken()) return core_.busy("detach");
        if (Status settled = Settler<B, Strategy>(core_).settle_fully(slot, "detach"); !settled) return settled;
        return core_.slots[slot].strategy.detach(core_.stats);
    }

    /// The pageable ring set (see Stager::set_pageable_ring).
    Status set_ring(const PageableRing& ring, HostCopyPool* pool) noexcept {
        if (Status cleared = clear_ring(); !cleared) return cleared;
#if defined(__cpp_exceptions)
        try {
            core_.ring = std::make_unique<PinnedRing<B, typename Core::Async>>(ring, pool);
        } catch (...) {
            return Status(Errc::out_of_memory, core_.with_backend("stager: host memory for the pageable ring"));
        }
#else
        core_.ring = std::make_unique<PinnedRing<B, typename Core::Async>>(ring, pool);
#endif
        core_.ring_threshold = ring.threshold > 0 ? ring.threshold : 1;
        return {};
    }

    /// The pageable ring cleared (see Stager::clear_pageable_ring).
    Status clear_ring() noexcept {
        if (core_.live_runs() > 0) return core_.busy("set_pageable_ring");
        core_.ring_threshold = std::numeric_limits<std::size_t>::max();
        if (!core_.ring) return {};
        Status released = core_.ring->release(*core_.backend, core_.async(), core_.stats);
        if (core_.ring->chunks() == 0) core_.ring.reset();
        return released;
    }

private:
    Core& core_;
};

}  // namespace devstage::detail
