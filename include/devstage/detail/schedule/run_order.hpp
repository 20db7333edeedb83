// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the ordering rules of a Stager's runs in flight, kept apart from the moves — which
// slot a bind or frame takes, when a slot is free, and what a new run whose host memory
// conflicts with a run in flight needs so that host memory ends as the same runs one at a
// time, in call order, would leave it (read after write, write after read, write after write).
//
// A run touches an arg's host memory in one of these ways:
//   device         an enqueued copy (a direct upload or copy-back, a frame's in-place packed
//                  copy, a pageable-ring copy): the device orders it, a stream wait orders it
//                  after other work;
//   host_now       the host reads it during bind (a packed arg gathered into the mirror, a
//                  pageable arg filling ring chunks);
//   host_deferred  the host writes it when the run is settled (a packed output unpacked from
//                  the mirror), which is after the run's own work completed;
//   in_place       the run's kernel reads it where it lies, in a mapped mirror (a live mapped
//                  frame's input): no copy marks when that ends, so nothing is ordered after it.
// The rules (`order_for`): two reads never conflict. A live run (bound, not finished) that will
// write what the new run touches cannot be ordered before work it has not enqueued: refused; so
// is writing what a live run's kernel reads in place.
// A host_now read of what a run in flight writes, or a device access of what a run in flight
// writes host_deferred, needs that run settled on the host first. Two host_deferred writes
// are ordered on the device and then settled in finish order. Everything else is a stream
// wait (nothing when both are on one stream).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>

#include "devstage/lease.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

/// How a run touches one arg's host memory (see the file comment).
enum class Touch : std::uint8_t { none, device, host_now, host_deferred, in_place };

/// What a new run needs before it may use host memory that a run in flight also uses; the
/// stronger need wins when several conflicts meet (refuse strongest).
enum class Need : std::uint8_t {
    none,
    stream_wait,    // order the new run's stream after the run in flight
    after_uploads,  // order the new run's stream after the live run's uploads
    settle_after,   // stream wait, and settle the run in flight before the new run
    settle_now,     // settle the run in flight on the host before the new run touches memory
    refuse,         // a live run will still write it: busy
};

/// The need for one overlapping pair: the new run's read and write of the range against the
/// other run's read and write of it; `live` when the other run is not finished.
constexpr Need order_for(Touch new_read, Touch new_write, Touch old_read, Touch old_write, bool live) noexcept {
    const bool new_touches = new_read != Touch::none || new_write != Touch::none;
    Need need = Need::none;
    auto raise = [&need](Need n) {
        if (n > need) need = n;
    };
    if (old_write != Touch::none && new_touches) {  // read after write, write after write
        if (live) return Need::refuse;
        if (new_read == Touch::host_now || old_write == Touch::host_deferred) {
            const bool both_deferred = old_write == Touch::host_deferred && new_write == Touch::host_deferred &&
                                       new_read != Touch::host_now && new_read != Touch::device;
            raise(both_deferred ? Need::settle_after : Need::settle_now);
        } else {
            raise(Need::stream_wait);
        }
    }
    if (old_read == Touch::in_place && new_write != Touch::none) return Need::refuse;
    if (old_read == Touch::device && new_write != Touch::none) {  // write after read
        raise(live ? Need::after_uploads : Need::stream_wait);
    }
    return need;
}

/// The smallest address range that holds a set of host ranges; empty when it holds none.
struct HostBox {
    std::uintptr_t begin = std::numeric_limits<std::uintptr_t>::max();
    std::uintptr_t end = 0;

    void add(const void* data, std::size_t bytes) noexcept {
        const auto at = reinterpret_cast<std::uintptr_t>(data);
        begin = at < begin ? at : begin;
        end = at + bytes > end ? at + bytes : end;
    }
    void add(const HostBox& other) noexcept {
        begin = other.begin < begin ? other.begin : begin;
        end = other.end > end ? other.end : end;
    }
    bool empty() const noexcept { return end <= begin; }
    bool meets(const HostBox& other) const noexcept { return begin < other.end && other.begin < end; }
};

/// The host box of a new run's args (host-placed args with bytes only).
inline HostBox box_of(std::span<const TensorArg> args) noexcept {
    std::uintptr_t begin = std::numeric_limits<std::uintptr_t>::max(), end = 0;
    for (const TensorArg& arg : args) {
        const auto at = reinterpret_cast<std::uintptr_t>(arg.data);
        const bool host = (arg.placement == Placement::Host) & (arg.bytes != 0);
        begin = host && at < begin ? at : begin;
        end = host && at + arg.bytes > end ? at + arg.bytes : end;
    }
    return HostBox{begin, end};
}

/// The host box of a run's leases (staged ones only: the others have no host memory).
inline HostBox box_of(std::span<const TensorLease> leases) noexcept {
    HostBox box;
    for (const TensorLease& lease : leases) {
        if (lease.host != nullptr && lease.bytes > 0) box.add(lease.host, lease.bytes);
    }
    return box;
}

inline bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
    const auto x = reinterpret_cast<std::uintptr_t>(a);
    const auto y = reinterpret_cast<std::uintptr_t>(b);
    return x < y + b_bytes && y < x + a_bytes;
}

/// How an earlier run of a slot, rebound while that run was still pending, touches one range
/// of host memory (computed when the slot was rebound).
struct Touched {
    const void* host;
    std::size_t bytes;
    Touch read;
    Touch write;
};

/// The strongest need between a new run's args and another run's host ranges (its leases, or
/// Touched entries), and the first pair that needs it (for the message of a refusal).
/// `new_touch(arg, read, write)` says how the new run touches an arg; `old_touch(old, read,
/// write)` how the other run touches one of its ranges.
struct Conflict {
    Need need = Need::none;
    std::size_t arg = 0;
    const void* host = nullptr;
    std::size_t bytes = 0;
};
template <class Old, class NewTouch, class OldTouch>
Conflict find_conflict(std::span<const TensorArg> args, std::span<const Old> olds, bool live, NewTouch&& new_touch,
                       OldTouch&& old_touch) noexcept {
    Conflict found;
    for (const Old& old : olds) {
        if (old.host == nullptr || old.bytes == 0) continue;
        Touch old_read = Touch::none, old_write = Touch::none;
        old_touch(old, old_read, old_write);
        if (old_read == Touch::none && old_write == Touch::none) continue;
        for (std::size_t i = 0; i < args.size(); ++i) {
            const TensorArg& arg = args[i];
            if (arg.placement != Placement::Host || arg.bytes == 0) continue;
            if (!overlap(arg.data, arg.bytes, old.host, old.bytes)) continue;
            Touch new_read = Touch::none, new_write = Touch::none;
            new_touch(arg, new_read, new_write);
            const Need need = order_for(new_read, new_write, old_read, old_write, live);
            if (need > found.need) found = Conflict{need, i, old.host, old.bytes};
            if (need == Need::refuse) return found;
        }
    }
    return found;
}

/// A slot as slot choice sees it.
struct SlotView {
    bool taken;              // a live run, an unbound frame, or a frame held by its Completion
    bool pending;            // work may still run (a poll may find it complete)
    std::uint64_t bound_at;  // when it was last bound (least recently used first)
};

/// The slot a bind or frame takes: among the slots not taken, the least recently used one
/// whose work is known complete (`idle(i)` polls without blocking), else the least recently
/// used one; nothing when every slot is taken. Slots that `usable(i)` rules out for this run
/// are taken only when no other is free (the bind then says why it cannot use it).
template <class View, class Idle, class Usable>
std::optional<std::size_t> choose_slot(std::size_t slots, View&& view, Idle&& idle, Usable&& usable) noexcept {
    constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
    std::size_t oldest = none, oldest_idle = none, unusable = none;
    std::uint64_t oldest_at = 0, idle_at = 0;
    for (std::size_t index = 0; index < slots; ++index) {
        const SlotView slot = view(index);
        if (slot.taken) continue;
        if (!usable(index)) {
            if (unusable == none) unusable = index;
            continue;
        }
        if (oldest == none || slot.bound_at < oldest_at) {
            oldest = index;
            oldest_at = slot.bound_at;
        }
        if (oldest_idle != none && idle_at <= slot.bound_at) continue;
        if (!slot.pending || idle(index)) {
            oldest_idle = index;
            idle_at = slot.bound_at;
        }
    }
    const std::size_t chosen = oldest_idle != none ? oldest_idle : oldest != none ? oldest : unusable;
    if (chosen == none) return std::nullopt;
    return chosen;
}

}  // namespace devstage::detail
