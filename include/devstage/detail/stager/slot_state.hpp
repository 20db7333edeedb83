// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the life of one pipeline slot of a Stager, as a state machine. What the engine has
// on a slot is one of six states; every change is an event, and the one table below says which
// events each state admits and where they lead. What a slot holds besides (its retained memory,
// the stream work still pending under its fence, the runs whose results are not yet handed
// out) is kept apart: a slot in any state may have work pending on the device.
//
//   idle ──hand_out_frame──► framed ──bind_frame──┐        ┌──finish──────────► idle
//     │                        └──drop_frame─► idle       │
//     └──bind──► uploading ──uploads_done──► live ────────┼──finish_delivering─► delivering ──settle──► idle
//                    │                         │          ├──finish_frame──────► held ──release_hold──► idle
//                    └────────(the same finish events)────┼──finish_failed─────► idle   (outputs dropped)
//                                                         └──end───────────────► idle   (no copy-back)
//   abandon: any state ──► idle
//
// A failed finish leads to idle, never to delivering: the outputs of a run whose finish failed
// are dropped, so no later settle copies them over memory the engine owns again.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace devstage::detail {

enum class SlotState : std::uint8_t {
    idle,        // nothing of the engine's: a bind or a frame may take the slot
    framed,      // a frame is handed out and not bound: only that frame binds here
    uploading,   // a run is bound; its uploads may still be running on the device
    live,        // a run is bound; its uploads completed (or there were none to wait for)
    delivering,  // the run finished; its packed outputs wait in the mirror until the slot is settled
    held,        // a frame's run finished; its Completion holds the frame until destroyed or detached
};
inline constexpr std::size_t slot_state_count = 6;

enum class SlotEvent : std::uint8_t {
    hand_out_frame,     // frame()
    drop_frame,         // the unbound frame was destroyed (or its stager is going away)
    bind,               // a run bound from plain args
    bind_frame,         // the slot's frame bound
    uploads_done,       // the host waited for the live run's uploads
    finish,             // finished, nothing left for the host to deliver
    finish_delivering,  // finished; packed outputs to copy out when the slot is settled
    finish_frame,       // a frame's run finished; its Completion holds the frame
    finish_failed,      // the finish failed at the call: its outputs are dropped
    end,                // the run ended without a finish (dropped, released): no copy-back
    settle,             // the packed outputs were copied out
    release_hold,       // the frame's Completion was destroyed or detached
    abandon,            // forgotten (after a device reset), or the stager is going away
};
inline constexpr std::size_t slot_event_count = 13;

namespace slot_table {
using S = SlotState;
inline constexpr std::uint8_t none = 0xff;
constexpr std::uint8_t to(S state) noexcept {
    return static_cast<std::uint8_t>(state);
}
// One row per state, one column per event, both in the order of the enums: the state an event
// leads to, or none where the state does not admit it.
inline constexpr std::uint8_t I = to(S::idle), F = to(S::framed), U = to(S::uploading), L = to(S::live),
                              D = to(S::delivering), H = to(S::held), N = none;
// clang-format off
inline constexpr std::array<std::array<std::uint8_t, slot_event_count>, slot_state_count> next{{
    //               hand_out_frame, drop_frame, bind, bind_frame, uploads_done, finish,
    //               finish_delivering, finish_frame, finish_failed, end, settle, release_hold, abandon
    /* idle       */ {F, N, U, N, N, N, N, N, N, N, N, N, I},
    /* framed     */ {N, I, N, U, N, N, N, N, N, N, N, N, I},
    /* uploading  */ {N, N, N, N, L, I, D, H, I, I, N, N, I},
    /* live       */ {N, N, N, N, N, I, D, H, I, I, N, N, I},
    /* delivering */ {N, N, N, N, N, N, N, N, N, N, I, N, I},
    /* held       */ {N, N, N, N, N, N, N, N, N, N, N, I, I},
}};
// clang-format on
}  // namespace slot_table

/// The state after `event` in `state`, or nullopt when the state does not admit the event.
constexpr std::optional<SlotState> next_state(SlotState state, SlotEvent event) noexcept {
    const std::uint8_t next = slot_table::next[static_cast<std::size_t>(state)][static_cast<std::size_t>(event)];
    if (next == slot_table::none) return std::nullopt;
    return static_cast<SlotState>(next);
}

/// The event a finish is: a failure at the call drops the outputs, whatever the run was; a
/// frame's run holds its frame; a run with packed outputs to copy out is delivering.
constexpr SlotEvent finish_event(bool failed, bool frame, bool delivers) noexcept {
    if (failed) return SlotEvent::finish_failed;
    if (frame) return SlotEvent::finish_frame;
    return delivers ? SlotEvent::finish_delivering : SlotEvent::finish;
}

/// A run is bound on the slot (uploading or live).
constexpr bool bound(SlotState state) noexcept {
    return state == SlotState::uploading || state == SlotState::live;
}
/// The engine holds the slot: a bind or frame() cannot take it.
constexpr bool taken(SlotState state) noexcept {
    return state == SlotState::framed || bound(state) || state == SlotState::held;
}

constexpr std::string_view to_string(SlotState state) noexcept {
    constexpr std::array<std::string_view, slot_state_count> names{"idle", "framed",     "uploading",
                                                                   "live", "delivering", "held"};
    return names[static_cast<std::size_t>(state)];
}

}  // namespace devstage::detail
