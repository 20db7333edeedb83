// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the messages of a Stager's refusals and failures, built only on those paths. Each
// names the operation, the sizes and the backend.

#include <cstddef>
#include <string>
#include <string_view>

#include "devstage/detail/stager/slot_state.hpp"
#include "devstage/detail/transfer/failures.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

inline std::string on_backend(std::string_view message, std::string_view backend) {
    return detail::message(message, " (stager on backend '", backend, "')");
}

[[gnu::cold]] inline Status all_slots_busy(const char* what, std::size_t slots, std::string_view backend) noexcept {
    return Status(Errc::busy, message("stager ", what, ": all ", slots,
                                      " pipeline slot(s) hold a live run, an unbound frame or a frame whose run's "
                                      "Completion is still held on backend '",
                                      backend, "'; finish or bind one, or destroy or detach a frame's Completion"));
}

// What holds the slots, and how the engine lets go of each: live runs (finish them), unbound
// frames (bind them), frames whose run's Completion is still held (destroy or detach it).
[[gnu::cold]] inline Status slots_in_use(const char* what, std::size_t live, std::size_t framed, std::size_t held,
                                         std::string_view backend) noexcept {
    const auto part = [](std::size_t count, const char* one, const char* many, const char* then) {
        if (count == 0) return std::string();
        return message(count, " ", count == 1 ? one : many, " (", then, ")");
    };
    std::string parts;
    for (const std::string& p :
         {part(live, "live run", "live runs", "finish it"), part(framed, "unbound frame", "unbound frames", "bind it"),
          part(held, "frame whose run's Completion is still held", "frames whose runs' Completions are still held",
               "destroy or detach that Completion")}) {
        if (p.empty()) continue;
        parts += parts.empty() ? p : "; " + p;
    }
    return Status(Errc::busy,
                  message("stager ", what, ": the slots' memory is in use on backend '", backend, "': ", parts));
}

[[gnu::cold]] inline Status slot_out_of_range(const char* what, std::size_t slot, std::size_t slots,
                                              std::string_view backend) noexcept {
    return Status(Errc::invalid_argument, message("stager ", what, ": slot ", slot, " out of range (", slots,
                                                  " pipeline slot(s)) on backend '", backend, "'"));
}

[[gnu::cold]] inline Status slot_busy(std::size_t slot, bool live, bool framed, std::string_view backend) noexcept {
    return Status(Errc::busy,
                  on_backend(message("stager bind_slot: slot ", slot, " holds ",
                                     live     ? "a live run"
                                     : framed ? "an unbound frame"
                                              : "a frame whose run's Completion is still held (destroy or detach it)"),
                             backend));
}

[[gnu::cold]] inline Status arg_in_own_mirror(std::size_t index, const TensorArg& arg, std::size_t slot,
                                              std::string_view backend) noexcept {
    return Status(Errc::busy,
                  on_backend(message("stager bind: arg ", index, " (", arg.bytes, " bytes at ",
                                     static_cast<const void*>(arg.data),
                                     ") points into this stager's frame mirror, of slot ", slot,
                                     ", which a packed bind on that slot rewrites (or grows); bind it on another "
                                     "slot, or copy it out first"),
                             backend));
}

[[gnu::cold]] inline Status run_not_ours(const char* what, bool dead, std::string_view backend) noexcept {
    return Status(Errc::invalid_argument,
                  dead ? message("stager ", what,
                                 ": the run is not live (finished, moved from, or dropped by "
                                 "release/abandon) on backend '",
                                 backend, "'")
                       : message("stager ", what, ": the run belongs to another stager (backend '", backend, "')"));
}

[[gnu::cold]] inline Status stale_frame(std::size_t slot, std::string_view backend) noexcept {
    return Status(Errc::invalid_argument,
                  on_backend(message("stager bind: a stale frame of slot ", slot,
                                     " (already bound, or inert: its slot taken again, or its memory released; ask frame() again)"),
                             backend));
}

[[gnu::cold]] inline Status frame_of_another_slot(std::size_t frame_slot, std::size_t slot,
                                                  std::string_view backend) noexcept {
    return Status(
        Errc::invalid_argument,
        on_backend(message("stager bind_slot: the frame belongs to slot ", frame_slot, ", not slot ", slot), backend));
}

[[gnu::cold]] inline Status frame_copy(std::size_t index, const TensorArg& arg, std::size_t slot,
                                       std::string_view backend) noexcept {
    return Status(Errc::invalid_argument,
                  on_backend(message("stager bind: arg ", index, " (", arg.bytes,
                                     " bytes) points into the unbound frame of slot ", slot,
                                     ", but the span is not that frame's own args(): bind frame->args() itself, "
                                     "unchanged (a copy, or one with args added, is refused; declare a "
                                     "device-resident tensor in the frame's shapes with TensorShape::device)"),
                             backend));
}

[[gnu::cold]] inline Status overlap_failure(std::size_t index, const TensorArg& arg, std::size_t slot, const void* host,
                                            std::size_t bytes, std::string_view backend) noexcept {
    return Status(Errc::busy,
                  on_backend(message("stager bind: arg ", index, " (", arg.bytes, " bytes at ",
                                     static_cast<const void*>(arg.data), ") overlaps a copied-back arg (", bytes,
                                     " bytes at ", host, ") of the live run on slot ", slot,
                                     ", which has not been finished (or an input its kernel reads in place, in a "
                                     "mapped frame): it would read or write stale data; finish that run first "
                                     "(finished on one stream, the copy-back is ordered before this bind's "
                                     "uploads)"),
                             backend));
}

// The frames that hold their slots' memory, by slot: unbound frames (bind or destroy them) and
// frames whose run's Completion is still held (destroy or detach it); `state(i)` is slot i's.
template <class State>
[[gnu::cold]] Status frames_in_use(const char* what, std::size_t slots, State&& state,
                                   std::string_view backend) noexcept {
    std::string held;
    for (std::size_t i = 0; i < slots; ++i) {
        const SlotState s = state(i);
        if (s != SlotState::framed && s != SlotState::held) continue;
        held +=
            message(held.empty() ? "" : "; ", "slot ", i,
                    s == SlotState::framed
                        ? " holds an unbound frame (bind it, or destroy the HostFrame)"
                        : " holds a frame whose run's Completion is still held (destroy or detach that Completion)");
    }
    return Status(Errc::busy, message("stager ", what, ": frame memory is in use on backend '", backend, "': ", held,
                                      "; nothing was released"));
}

[[gnu::cold]] inline Status with_context(const Status& cause, std::string_view context,
                                         std::string_view backend) noexcept {
    return Status(cause.code(), on_backend(message(context, cause.message()), backend));
}

}  // namespace devstage::detail
