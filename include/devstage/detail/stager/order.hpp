// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the ordering rules of detail/schedule/run_order.hpp applied by a Stager — which slot a bind
// or frame takes, and what a new run needs against the runs in flight whose host memory it
// shares (a stream wait, a settle on the host first, a settle order, or a refusal).
// Included at the end of devstage/stager.hpp; not for inclusion on its own.

#include "devstage/detail/stager/stream_check.hpp"
#include "devstage/stager.hpp"

namespace devstage {

// Before slot `index` runs `args` on `stream`: orders it after every run in flight whose
// host memory it conflicts with — a stream wait, a settle on the host first, or a settle
// order — or refuses it (busy) when a live run will still write that memory. The slot's own
// earlier runs are ordered before it by the slot's stream order; only a host copy at bind of
// memory they write needs them settled first.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::order_after_in_flight(std::size_t index, std::span<const TensorArg> args, Stream stream,
                                                  bool frame) noexcept {
    Slot& self = slots_[index];
    self.box_valid = false;
    if (self.fence.pending() && !self.carried.empty()) {
        const detail::Conflict own = carried_conflict(self, args, frame);
        if (own.need == detail::Need::settle_now) {
            ++stats_.hazard_settles;
            if (Status settled = settle_fully(index, "bind"); !settled) return settled;
        }
    }
    for (std::size_t other = 0; other < slots_.size(); ++other) {
        Slot& slot = slots_[other];
        if (other == index || !(slot.live || slot.fence.pending() || slot.unpack)) continue;
        // Without host copies every conflict with a finished run is a stream wait: nothing
        // to do on the stream its work is on.
        if (pack_limit == 0 && !ring_ && !slot.live && slot.fence.stream() == stream) continue;
        if (!self.box_valid) {
            self.box = bind_box(args);
            self.box_valid = true;
        }
        detail::Conflict conflict;
        if (slot.run_leases && slot.host_box().meets(self.box)) {
            conflict = detail::find_conflict(
                args, std::span<const TensorLease>(slot.leases()), slot.live,
                [&](const TensorArg& arg, detail::Touch& read, detail::Touch& write) {
                    new_touch(arg, frame, read, write);
                },
                [&](const TensorLease& lease, detail::Touch& read, detail::Touch& write) {
                    old_touch(slot, lease, read, write);
                });
        }
        if (slot.live && conflict.need != detail::Need::none) {  // refused, or after its uploads
            if (Status ordered = order_after(index, other, conflict, args, stream); !ordered) return ordered;
            conflict = {};
        }
        if (!slot.carried.empty() && slot.fence.pending() &&
            conflict.need < detail::Need::settle_now) {  // earlier runs of the slot
            const detail::Conflict earlier = carried_conflict(slot, args, frame);
            if (earlier.need > conflict.need) conflict = earlier;
        }
        if (conflict.need == detail::Need::none) continue;
        if (Status ordered = order_after(index, other, conflict, args, stream); !ordered) return ordered;
    }
    return {};
}

// The need of `args` against the earlier runs still pending on `slot` (see carry()): exact
// against their ranges, or against their host box when there were too many to keep.
template <Backend B, class Strategy>
detail::Conflict Stager<B, Strategy>::carried_conflict(const Slot& slot, std::span<const TensorArg> args,
                                                       bool frame) noexcept {
    if (!slot.carried.meets(bind_box(args))) return {};
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the box's start, compared, never dereferenced
    const detail::Touched everything{reinterpret_cast<const void*>(slot.carried.begin),
                                     slot.carried.end - slot.carried.begin, detail::Touch::device,
                                     detail::Touch::device};
    const std::span<const detail::Touched> olds = slot.carried_overflow
                                                      ? std::span<const detail::Touched>(&everything, 1)
                                                      : std::span<const detail::Touched>(slot.carried_touches);
    return detail::find_conflict(
        args, olds, false,
        [&](const TensorArg& arg, detail::Touch& read, detail::Touch& write) { new_touch(arg, frame, read, write); },
        [](const detail::Touched& old, detail::Touch& read, detail::Touch& write) {
            read = old.read;
            write = old.write;
        });
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::order_after_uploads(const StagedRun& run, Stream stream) noexcept {
    if (Status valid = check_run(run, "order_after_uploads"); !valid) return valid;
    if (Status checked = detail::check_stream(*backend_, stream, "order_after_uploads"); !checked) return checked;
    // Everything the bind enqueued: its uploads, and its stream waits for the work that used
    // the slot's memory before (a bind with nothing to upload still needs those).
    Slot& slot = slots_[run.slot_];
    if (slot.bind_stream == stream) return {};
    const auto ordered = slot.kernel_streams.begin() + static_cast<std::ptrdiff_t>(slot.kernel_stream_count);
    const bool known = std::find(slot.kernel_streams.begin(), ordered, stream) != ordered;
    if (!known && slot.kernel_stream_count == Slot::max_kernel_streams) {
        return Status(
            Errc::invalid_argument,
            with_backend(detail::message("stager order_after_uploads: the run of slot ", run.slot_, " is ordered onto ",
                                         Slot::max_kernel_streams, " other streams already, the most one run may be")));
    }
    if (Status joined = slot.fence.join(async(), slot.bind_stream, stream); !joined) {
        return Status(joined.code(), with_backend(detail::message("stager order_after_uploads: ordering the stream "
                                                                  "after the uploads of slot ",
                                                                  run.slot_, " failed: ", joined.message())));
    }
    if (!known) slot.kernel_streams[slot.kernel_stream_count++] = stream;  // finish and drop wait for it
    return {};
}

// Makes `stream` wait for what is enqueued so far on the streams order_after_uploads ordered
// after the live run of `slot` (its kernels may run there), and forgets them. When such a wait
// cannot be enqueued, the host waits for the whole device where the backend can, so nothing is
// freed or reused under a kernel; the failure is returned either way.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::join_kernel_streams(Slot& slot, Stream stream) noexcept {
    Status first;
    for (std::size_t i = 0; i < slot.kernel_stream_count; ++i) {
        if (slot.kernel_streams[i] == stream) continue;
        if (Status joined = slot.fence.join(async(), slot.kernel_streams[i], stream); !joined && first.ok()) {
            first = Status(joined.code(),
                           with_backend(detail::message("stager: ordering after the kernel streams of slot ",
                                                        &slot - slots_.data(), " failed: ", joined.message())));
        }
    }
    slot.kernel_stream_count = 0;
    if constexpr (SynchronizingBackend<B>) {
        if (!first.ok()) (void)backend_->synchronize();
    }
    return first;
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::order_after(std::size_t index, std::size_t other, const detail::Conflict& conflict,
                                        std::span<const TensorArg> args, Stream stream) noexcept {
    using detail::Need;
    Slot& slot = slots_[other];
    if (conflict.need == Need::refuse) {
        return detail::overlap_failure(conflict.arg, args[conflict.arg], other, conflict.host, conflict.bytes,
                                       backend_->name());
    }
    if (conflict.need == Need::after_uploads) {
        if (!slot.uploads_pending || slot.bind_stream == stream) return {};
        ++stats_.hazard_stream_waits;
        return slot.fence.join(async(), slot.bind_stream, stream);
    }
    if (!slot.fence.pending() || conflict.need == Need::settle_now) {
        if (slot.fence.pending()) ++stats_.hazard_settles;
        return settle_fully(other, "bind");  // complete already, or settled on the host now
    }
    if (slot.fence.stream() != stream) ++stats_.hazard_stream_waits;
    if (Status ordered = slot.fence.order_before(async(), stream); !ordered) return ordered;
    if (conflict.need == Need::settle_after) {
        slots_[index].settle_after[other] = slot.generation;
        slots_[index].has_settle_after = true;
    }
    return {};
}

// How the new run touches an arg's host memory.
template <Backend B, class Strategy>
void Stager<B, Strategy>::new_touch(const TensorArg& arg, bool frame, detail::Touch& read,
                                    detail::Touch& write) const noexcept {
    using detail::Touch;
    const bool packed = !frame && arg.bytes <= pack_limit;
    const bool ringed = !frame && arg.bytes >= ring_threshold_;
    if (uploads(arg.direction)) read = frame ? Touch::device : (packed || ringed) ? Touch::host_now : Touch::device;
    if (copies_back(arg.direction)) write = packed ? Touch::host_deferred : Touch::device;
}

// How the run in flight (or live) on `slot` touches a lease's host memory.
template <Backend B, class Strategy>
void Stager<B, Strategy>::old_touch(const Slot& slot, const TensorLease& lease, detail::Touch& read,
                                    detail::Touch& write) noexcept {
    using detail::Touch;
    const bool packed = slot.packed(lease);
    const bool device_pending = slot.live ? slot.uploads_pending : slot.fence.pending();
    if (lease.upload && packed && slot.all_packed && slot.mapped && slot.live) {
        read = Touch::in_place;  // a live mapped frame: its kernel reads the frame itself
    } else if (lease.upload && (!packed || slot.all_packed) && device_pending) {
        read = Touch::device;
    }
    if (lease.copy_back) {
        if (slot.live || !packed || slot.all_packed) {
            write = slot.live || slot.fence.pending() ? Touch::device : Touch::none;
        } else if (slot.unpack) {
            write = Touch::host_deferred;
        }
    }
}

// A slot rebound while its earlier work is pending keeps how that work touches host memory
// (its ranges, up to a bound; past it, or when host memory is short, their box only).
template <Backend B, class Strategy>
void Stager<B, Strategy>::carry(Slot& slot) noexcept {
    constexpr std::size_t most = 1024;
    const bool was_run = std::exchange(slot.run_leases, false);  // not after a failed bind, nor twice
    if (!slot.fence.pending() && slot.carried.empty() && !slot.has_settle_after) return;
    if (!slot.fence.pending()) {
        slot.carried = {};
        slot.carried_touches.clear();
        slot.carried_overflow = false;
    } else if (was_run) {
        slot.carried.add(slot.host_box());
        for (const TensorLease& lease : slot.leases()) {
            if (slot.carried_overflow) break;
            detail::Touched touched{lease.host, lease.bytes, detail::Touch::none, detail::Touch::none};
            old_touch(slot, lease, touched.read, touched.write);
            if (lease.host == nullptr ||
                (touched.read == detail::Touch::none && touched.write == detail::Touch::none)) {
                continue;
            }
            if (slot.carried_touches.size() >= most ||
                !detail::grow_storage(slot.carried_touches, slot.carried_touches.size() + 1).ok()) {
                slot.carried_overflow = true;
                break;
            }
            slot.carried_touches.back() = touched;
        }
    }
    if (slot.has_settle_after) {
        std::fill(slot.settle_after.begin(), slot.settle_after.end(), 0);
        slot.has_settle_after = false;
    }
}

// The host box of the args being bound, computed once per bind call.
template <Backend B, class Strategy>
const detail::HostBox& Stager<B, Strategy>::bind_box(std::span<const TensorArg> args) noexcept {
    if (!bind_box_ready_) {
        bind_box_ = detail::box_of(args);
        bind_box_ready_ = true;
    }
    return bind_box_;
}

// A packed bind must not read args from the mirror it is about to rewrite (or grow).
template <Backend B, class Strategy>
Status Stager<B, Strategy>::own_mirror(std::size_t index, std::span<const TensorArg> args) noexcept {
    const Slot& slot = slots_[index];
    const auto mirror = reinterpret_cast<std::uintptr_t>(detail::mirror_of(slot.strategy));
    if (!bind_box(args).meets(detail::HostBox{mirror, mirror + detail::mirror_capacity_of(slot.strategy)})) {
        return {};
    }
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (args[i].bytes > 0 && args[i].placement == Placement::Host &&
            detail::inside(args[i].data, detail::mirror_of(slot.strategy), detail::mirror_capacity_of(slot.strategy))) {
            return detail::arg_in_own_mirror(i, args[i], index, backend_->name());
        }
    }
    return {};
}

// The slot a bind of `args` (a frame: none) takes; see detail::choose_slot. A packed
// bind does not take a slot whose mirror holds one of its args.
template <Backend B, class Strategy>
std::optional<std::size_t> Stager<B, Strategy>::free_slot(std::span<const TensorArg> args) noexcept {
    return detail::choose_slot(
        slots_.size(),
        [this](std::size_t i) {
            const Slot& slot = slots_[i];
            return detail::SlotView{slot.live || slot.framed || slot.held, slot.fence.pending(), slot.bound_at};
        },
        [this](std::size_t i) {
            Result<bool> ready = slots_[i].fence.poll(async());
            return ready && *ready;
        },
        [this, args](std::size_t i) { return pack_limit == 0 || args.empty() || own_mirror(i, args).ok(); });
}

template <Backend B, class Strategy>
auto Stager<B, Strategy>::pick_slot(std::span<const TensorArg> args) noexcept -> SlotChoice {
    bind_box_ready_ = false;
    if (slots_.empty()) return broken_;
    if constexpr (pack_limit > 0) {
        if (std::optional<SlotChoice> framed = framed_slot(args)) return *framed;
    }
    const std::optional<std::size_t> free = free_slot(args);
    if (!free) return busy("bind");
    return *free;
}

template <Backend B, class Strategy>
auto Stager<B, Strategy>::chosen_slot(std::size_t index, std::span<const TensorArg> args) noexcept -> SlotChoice {
    bind_box_ready_ = false;
    if (slots_.empty()) return broken_;
    if (index >= slots_.size()) return out_of_range("bind_slot", index);
    if constexpr (pack_limit > 0) {
        if (std::optional<SlotChoice> framed = framed_slot(args)) {
            if (*framed && **framed != index) return detail::frame_of_another_slot(**framed, index, backend_->name());
            return *framed;
        }
    }
    const Slot& slot = slots_[index];
    if (slot.live || slot.framed || slot.held)
        return detail::slot_busy(index, slot.live, slot.framed, backend_->name());
    return index;
}

template <Backend B, class Strategy>
auto Stager<B, Strategy>::frame_slot(const HostFrame& frame) noexcept -> SlotChoice {
    bind_box_ready_ = false;
    if (frame.owner_ != static_cast<const void*>(this)) {
        return Status(Errc::invalid_argument, with_backend("stager bind: the frame belongs to another stager"));
    }
    const std::optional<SlotChoice> framed = framed_slot(frame.args());
    if (framed && !*framed) return *framed;
    if (!framed || **framed != frame.slot_ || slots_[frame.slot_].frame_generation != frame.generation_) {
        return detail::stale_frame(frame.slot_, backend_->name());
    }
    return *framed;
}

// The slot whose frame `args` is, if it is one (see detail::find_frame).
template <Backend B, class Strategy>
auto Stager<B, Strategy>::framed_slot(std::span<const TensorArg> args) noexcept -> std::optional<SlotChoice> {
    return detail::find_frame(std::span<const Slot>(slots_), args, backend_->name());
}

}  // namespace devstage
