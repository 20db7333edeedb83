// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: which slot of a Stager a bind or frame() takes — the choice of detail/schedule/
// run_order.hpp over the slots' states, the caller's slot (bind_slot), or the slot of a frame.

#include <cstddef>
#include <optional>
#include <span>
#include <utility>

#include "devstage/detail/schedule/run_order.hpp"
#include "devstage/detail/stager/core.hpp"
#include "devstage/detail/stager/frames.hpp"
#include "devstage/detail/stager/hazards.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/frame.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

template <class B, class Strategy>
class SlotSelect {
public:
    using Core = StagerCore<B, Strategy>;
    using Slot = typename Core::Slot;
    /// A slot choice, or why there is none.
    using Choice = Result<std::size_t>;

    explicit SlotSelect(Core& core) noexcept : core_(core) {}

    /// The slot a bind of `args` (a frame: none) takes: not taken, least recently used, one
    /// with no pending work first (see choose_slot). A packed bind does not take a slot whose
    /// mirror holds one of its args.
    std::optional<std::size_t> free_slot(std::span<const TensorArg> args) noexcept {
        return choose_slot(
            core_.slots.size(),
            [this](std::size_t i) {
                const Slot& slot = core_.slots[i];
                return SlotView{slot.taken(), slot.fence.pending(), slot.bound_at};
            },
            [this](std::size_t i) {
                Result<bool> ready = core_.slots[i].fence.poll(core_.async());
                return ready && *ready;
            },
            [this, args](std::size_t i) {
                return core_.pack_limit == 0 || args.empty() || Hazards<B, Strategy>(core_).own_mirror(i, args).ok();
            });
    }

    /// The slot of a bind of `args`: its frame's, if `args` are a frame's, else a free one.
    Choice pick(std::span<const TensorArg> args) noexcept {
        core_.bind_box.reset();
        if (core_.slots.empty()) return core_.broken;
        if (core_.pack_limit > 0) {
            if (std::optional<Choice> framed = frame_of(args)) return *framed;
        }
        const std::optional<std::size_t> free = free_slot(args);
        if (!free) return core_.busy("bind");
        return *free;
    }

    /// Slot `index` for a bind of `args` (bind_slot): invalid_argument out of range, busy when
    /// the engine holds it.
    Choice chosen(std::size_t index, std::span<const TensorArg> args) noexcept {
        core_.bind_box.reset();
        if (core_.slots.empty()) return core_.broken;
        if (index >= core_.slots.size()) return core_.out_of_range("bind_slot", index);
        if (core_.pack_limit > 0) {
            if (std::optional<Choice> framed = frame_of(args)) {
                if (*framed && **framed != index) {
                    return frame_of_another_slot(**framed, index, core_.backend->name());
                }
                return *framed;
            }
        }
        const Slot& slot = core_.slots[index];
        if (slot.taken()) {
            return slot_busy(index, slot.bound(), slot.state == SlotState::framed, core_.backend->name());
        }
        return index;
    }

    /// The slot of `frame` (`ours`: a live frame of this stager, handed out on `slot` as
    /// `generation`), when it is still that slot's unbound frame.
    Choice of_frame(const HostFrame& frame, bool ours, std::size_t slot, std::uint64_t generation) noexcept {
        core_.bind_box.reset();
        if (!ours) {
            if (frame.live()) {
                return Status(Errc::invalid_argument,
                              core_.with_backend("stager bind: the frame belongs to another stager"));
            }
            return stale_frame(slot, core_.backend->name());
        }
        const std::optional<Choice> framed = frame_of(frame.args());
        if (framed && !*framed) return *framed;
        if (!framed || **framed != slot || core_.slots[slot].frames.generation != generation) {
            return stale_frame(slot, core_.backend->name());
        }
        return *framed;
    }

    /// The slot whose frame `args` is, if it is one (see find_frame).
    std::optional<Choice> frame_of(std::span<const TensorArg> args) noexcept {
        return find_frame(
            std::span<const Slot>(core_.slots), args, core_.backend->name(),
            [this](std::size_t i) { return core_.slots[i].state == SlotState::framed; },
            [this](std::size_t i) {
                const RunMemory memory = core_.slots[i].memory();
                return std::pair<std::byte*, std::size_t>(memory.mirror, memory.mirror_capacity);
            });
    }

private:
    Core& core_;
};

}  // namespace devstage::detail
