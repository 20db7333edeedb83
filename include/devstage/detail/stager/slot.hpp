// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: one pipeline slot of a Stager — its state (slot_state.hpp), its strategy (retained
// buffer, mirror), the record of its bound (or last finished) run, its stream-order state and
// its frame storage — and the small helpers around it. What can be derived (whether a run is
// live, framed, held, mapped, whether its outputs wait to be delivered) is derived from the
// state, the run record and the strategy, not stored.

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "devstage/detail/schedule/run_order.hpp"
#include "devstage/detail/schedule/slot_fence.hpp"
#include "devstage/detail/stager/frames.hpp"
#include "devstage/detail/stager/slot_state.hpp"
#include "devstage/detail/transfer/packed.hpp"
#include "devstage/detail/transfer/run_record.hpp"
#include "devstage/detail/util/storage.hpp"
#include "devstage/lease.hpp"
#include "devstage/stats.hpp"
#include "devstage/strategy/concept.hpp"

namespace devstage {
class StagedRun;
}  // namespace devstage

namespace devstage::detail {

/// Host ranges that earlier runs of a slot, rebound while their work was pending, still touch
/// (up to a bound; past it, or when host memory is short, their box only: `overflow`).
struct Carried {
    HostBox box;
    std::vector<Touched> touches;
    bool overflow = false;

    bool empty() const noexcept { return box.empty(); }
    void clear() noexcept {
        box = {};
        touches.clear();
        overflow = false;
    }
};

/// Settle order: before a slot's run is settled, slot i is settled through generation after[i]
/// (0: no need). Sized to the slot count.
struct SettleOrder {
    std::vector<std::uint64_t> after;
    std::size_t pending = 0;  // entries above 0

    void need(std::size_t slot, std::uint64_t generation) noexcept {
        if (after[slot] == 0) ++pending;
        after[slot] = generation;
    }
    void done(std::size_t slot) noexcept {
        if (after[slot] != 0) --pending;
        after[slot] = 0;
    }
    void clear() noexcept {
        if (pending == 0) return;
        std::fill(after.begin(), after.end(), 0);
        pending = 0;
    }
};

template <class Strategy, class Async>
struct StagerSlot {
    using Stream = typename Async::Stream;
    static constexpr std::size_t max_kernel_streams = 4;

    explicit StagerSlot(Strategy s) : strategy(std::move(s)) {}

    SlotState state = SlotState::idle;
    Strategy strategy;
    RunRecord<Async> run;  // of the bound (or last finished) run
    SlotFence<Async> fence;
    std::vector<void*> deferred;   // device frees waiting for the fence
    std::uint64_t generation = 0;  // finishes so far
    std::uint64_t settled = 0;     // generations whose results were handed out
    std::uint64_t bound_at = 0;    // for "the slot bound longest ago"
    std::uint64_t held_generation = 0;
    FrameStore frames;
    StagedRun* handle = nullptr;
    std::optional<HostBox> box;  // of the bound (or last finished) run's host memory, once computed
    Carried carried;             // earlier runs on this slot still pending under the fence
    SettleOrder settle_order;
    void* last_base = nullptr;    // for address_changes
    void* last_mapped = nullptr;  // the mapped mirror's device address, likewise
    Stream bind_stream{};
    // The other streams order_after_uploads ordered after the live run's bind: its kernels may
    // run there, so its finish, or its release when it is dropped, waits for them too.
    std::array<Stream, max_kernel_streams> kernel_streams{};
    std::size_t kernel_stream_count = 0;
    bool mirror_in_use = false;  // pending work (or the live run's uploads) reads or writes the mirror

    /// Moves the slot along the state machine; `event` must be one the state admits.
    void go(SlotEvent event) noexcept {
        const std::uint8_t next = slot_table::next[static_cast<std::size_t>(state)][static_cast<std::size_t>(event)];
        assert(next != slot_table::none && "a slot event its state does not admit");
        state = static_cast<SlotState>(next);
    }
    bool bound() const noexcept { return detail::bound(state); }
    /// The Completion holding the frame of run `generation` went: the slot is free again.
    void end_hold(std::uint64_t generation) noexcept {
        if (state == SlotState::held && held_generation == generation) go(SlotEvent::release_hold);
    }
    /// The stager is going away: its frames end, bound or not.
    void end_frames() noexcept {
        if (state == SlotState::framed) go(SlotEvent::drop_frame);
        if (state == SlotState::held) go(SlotEvent::release_hold);
    }
    /// The frame handed out as `generation` was destroyed: unbound, it gives the slot back.
    void drop_frame(std::uint64_t generation) noexcept {
        if (state == SlotState::framed && frames.generation == generation) go(SlotEvent::drop_frame);
    }
    bool taken() const noexcept { return detail::taken(state); }

    /// The slot's memory as the transfer passes see it.
    RunMemory memory() const noexcept {
        return RunMemory{base_of(strategy), mirror_of(strategy), mirror_capacity_of(strategy),
                         mapped_mirror_of(strategy)};
    }
    /// The run's packed args lie in the mapped mirror.
    bool mapped() const noexcept { return mapped_run(run, memory()); }

    /// Counts a move of the slot's base, or of its mapped mirror's device address, where its
    /// kernels' small args lie (a first allocation is not one).
    void note_base(StagerStats& stats) noexcept {
        note(base_of(strategy), last_base, stats);
        note(mapped_mirror_of(strategy), last_mapped, stats);
    }
    static void note(void* address, void*& last, StagerStats& stats) noexcept {
        if (address == nullptr || address == last) return;
        if (last != nullptr) ++stats.address_changes;
        last = address;
    }

    /// The host box of the slot's bound (or last finished) run.
    const HostBox& host_box() noexcept {
        if (!box) box = box_of(std::span<const TensorLease>(run.leases()));
        return *box;
    }

    /// Gives back the per-arg host bookkeeping (not the frame storage: frames point there).
    void drop_bookkeeping() noexcept {
        run.drop();
        box.reset();
        carried = {};
        std::vector<void*>().swap(deferred);
    }

    std::size_t bookkeeping_bytes() const noexcept {
        return run.bytes() + deferred.capacity() * sizeof(void*) + carried.touches.capacity() * sizeof(Touched);
    }
};

/// Fills `slots` with `count` slots, each with its own copy of `strategy`; false when host
/// memory is short (nothing is kept then).
template <class Slot, class Strategy>
bool make_slots(std::vector<Slot>& slots, std::size_t count, Strategy strategy) noexcept {
#if defined(__cpp_exceptions)
    try {
#endif
        slots.reserve(count);
        for (std::size_t i = 1; i < count; ++i) slots.emplace_back(Strategy(strategy));
        slots.emplace_back(std::move(strategy));
        for (Slot& slot : slots) slot.settle_order.after.assign(count, 0);
        return true;
#if defined(__cpp_exceptions)
    } catch (...) {
        slots.clear();
        return false;
    }
#endif
}

}  // namespace devstage::detail
