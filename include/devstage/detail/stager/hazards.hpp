// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the ordering rules of detail/schedule/run_order.hpp applied to a Stager's slots —
// what a new run needs against the runs in flight whose host memory it shares (a stream wait, a
// settle on the host first, a settle order, or a refusal), what earlier runs of a rebound slot
// still touch, and the host's own accesses to a slot's mirror (a packed bind rewriting it, a
// frame's output fed back as an input).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "devstage/detail/schedule/run_order.hpp"
#include "devstage/detail/stager/core.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/stager/settle.hpp"
#include "devstage/detail/util/storage.hpp"
#include "devstage/lease.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

template <class B, class Strategy>
class Hazards {
public:
    using Core = StagerCore<B, Strategy>;
    using Slot = typename Core::Slot;
    using Stream = typename Core::Stream;

    explicit Hazards(Core& core) noexcept : core_(core) {}

    /// Before slot `index` runs `args` on `stream`: orders it after every run in flight whose
    /// host memory it conflicts with — a stream wait, a settle on the host first, or a settle
    /// order — or refuses it (busy) when a live run will still write that memory. The slot's own
    /// earlier runs are ordered before it by the slot's stream order; only a host copy at bind of
    /// memory they write needs them settled first.
    Status order_after_in_flight(std::size_t index, std::span<const TensorArg> args, Stream stream,
                                 bool frame) noexcept {
        Slot& self = core_.slots[index];
        self.box.reset();
        if (self.fence.pending() && !self.carried.empty()) {
            const Conflict own = carried_conflict(self, args, frame);
            if (own.need == Need::settle_now) {
                ++core_.stats.hazard_settles;
                if (Status settled = Settler<B, Strategy>(core_).settle_fully(index, "bind"); !settled) return settled;
            }
        }
        for (std::size_t other = 0; other < core_.slots.size(); ++other) {
            Slot& slot = core_.slots[other];
            if (other == index || !(slot.bound() || slot.fence.pending() || slot.state == SlotState::delivering)) {
                continue;
            }
            // Without host copies every conflict with a finished run is a stream wait: nothing
            // to do on the stream its work is on.
            if (core_.pack_limit == 0 && !core_.ring && !slot.bound() && slot.fence.stream() == stream) continue;
            if (!self.box) self.box = bind_box(args);
            Conflict conflict;
            if (slot.run.lease_count > 0 && slot.host_box().meets(*self.box)) {
                conflict = find_conflict(
                    args, std::span<const TensorLease>(slot.run.leases()), slot.bound(),
                    [&](const TensorArg& arg, Touch& read, Touch& write) { new_touch(arg, frame, read, write); },
                    [&](const TensorLease& lease, Touch& read, Touch& write) { old_touch(slot, lease, read, write); });
            }
            if (slot.bound() && conflict.need != Need::none) {  // refused, or after its uploads
                if (Status ordered = order_after(index, other, conflict, args, stream); !ordered) return ordered;
                conflict = {};
            }
            if (!slot.carried.empty() && slot.fence.pending() && conflict.need < Need::settle_now) {
                const Conflict earlier = carried_conflict(slot, args, frame);  // earlier runs of the slot
                if (earlier.need > conflict.need) conflict = earlier;
            }
            if (conflict.need == Need::none) continue;
            if (Status ordered = order_after(index, other, conflict, args, stream); !ordered) return ordered;
        }
        return {};
    }

    /// A slot rebound while its earlier work is pending keeps how that work touches host memory
    /// (its ranges, up to a bound; past it, or when host memory is short, their box only). The
    /// run's leases are consumed: they no longer describe a run of the slot.
    void carry(Slot& slot) noexcept {
        constexpr std::size_t most = 1024;
        const bool was_run = slot.run.lease_count > 0;
        if (slot.fence.pending() && was_run) {
            slot.carried.box.add(slot.host_box());
            for (const TensorLease& lease : slot.run.leases()) {
                if (slot.carried.overflow) break;
                Touched touched{lease.host, lease.bytes, Touch::none, Touch::none};
                old_touch(slot, lease, touched.read, touched.write);
                if (lease.host == nullptr || (touched.read == Touch::none && touched.write == Touch::none)) continue;
                if (slot.carried.touches.size() >= most ||
                    !grow_storage(slot.carried.touches, slot.carried.touches.size() + 1).ok()) {
                    slot.carried.overflow = true;
                    break;
                }
                slot.carried.touches.back() = touched;
            }
        } else if (!slot.fence.pending() && !slot.carried.empty()) {
            slot.carried.clear();
        }
        slot.run.lease_count = 0;
        slot.box.reset();
        slot.settle_order.clear();
    }

    /// A packed bind must not read args from the mirror it is about to rewrite (or grow).
    Status own_mirror(std::size_t index, std::span<const TensorArg> args) noexcept {
        const Slot& slot = core_.slots[index];
        const RunMemory memory = slot.memory();
        const auto mirror = reinterpret_cast<std::uintptr_t>(memory.mirror);
        if (!bind_box(args).meets(HostBox{mirror, mirror + memory.mirror_capacity})) return {};
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i].bytes > 0 && args[i].placement == Placement::Host &&
                inside(args[i].data, memory.mirror, memory.mirror_capacity)) {
                return arg_in_own_mirror(i, args[i], index, core_.backend->name());
            }
        }
        return {};
    }

    /// Before the host rewrites, grows or frees slot `index`'s mirror: settles the other slots
    /// whose pending work reads or writes it (an output of a frame fed back as an input), and
    /// waits for the uploads of a live run that reads it.
    Status settle_mirror_users(std::size_t index, const char* what) noexcept {
        const RunMemory memory = core_.slots[index].memory();
        const auto begin = reinterpret_cast<std::uintptr_t>(memory.mirror);
        if (begin == 0) return {};
        const HostBox mirror{begin, begin + memory.mirror_capacity};
        for (std::size_t other = 0; other < core_.slots.size(); ++other) {
            Slot& slot = core_.slots[other];
            if (other == index || !(slot.bound() ? slot.state == SlotState::uploading : slot.fence.pending())) continue;
            if (!uses_range(slot, mirror)) continue;
            ++core_.stats.hazard_settles;
            if (slot.bound()) {
                if (Status drained = slot.fence.drain(core_.async(), slot.bind_stream, core_.stats); !drained) {
                    return Status(drained.code(), core_.with_backend(message("stager ", what, ": the uploads of slot ",
                                                                             other, " failed: ", drained.message())));
                }
                slot.go(SlotEvent::uploads_done);
            } else if (Status settled = Settler<B, Strategy>(core_).settle_fully(other, what); !settled) {
                return settled;
            }
        }
        return {};
    }

    /// The host box of the args being bound, computed once per bind call.
    const HostBox& bind_box(std::span<const TensorArg> args) noexcept {
        if (!core_.bind_box) core_.bind_box = box_of(args);
        return *core_.bind_box;
    }

private:
    // The need of `args` against the earlier runs still pending on `slot` (see carry()): exact
    // against their ranges, or against their host box when there were too many to keep.
    Conflict carried_conflict(const Slot& slot, std::span<const TensorArg> args, bool frame) noexcept {
        const HostBox& box = slot.carried.box;
        if (!box.meets(bind_box(args))) return {};
        // NOLINTNEXTLINE(performance-no-int-to-ptr): the box's start, compared, never dereferenced
        const Touched everything{reinterpret_cast<const void*>(box.begin), box.end - box.begin, Touch::device,
                                 Touch::device};
        const std::span<const Touched> olds = slot.carried.overflow ? std::span<const Touched>(&everything, 1)
                                                                    : std::span<const Touched>(slot.carried.touches);
        return find_conflict(
            args, olds, false,
            [&](const TensorArg& arg, Touch& read, Touch& write) { new_touch(arg, frame, read, write); },
            [](const Touched& old, Touch& read, Touch& write) {
                read = old.read;
                write = old.write;
            });
    }

    Status order_after(std::size_t index, std::size_t other, const Conflict& conflict, std::span<const TensorArg> args,
                       Stream stream) noexcept {
        Slot& slot = core_.slots[other];
        if (conflict.need == Need::refuse) {
            return overlap_failure(conflict.arg, args[conflict.arg], other, conflict.host, conflict.bytes,
                                   core_.backend->name());
        }
        if (conflict.need == Need::after_uploads) {
            if (slot.state != SlotState::uploading || slot.bind_stream == stream) return {};
            ++core_.stats.hazard_stream_waits;
            return slot.fence.join(core_.async(), slot.bind_stream, stream);
        }
        if (!slot.fence.pending() || conflict.need == Need::settle_now) {
            if (slot.fence.pending()) ++core_.stats.hazard_settles;
            return Settler<B, Strategy>(core_).settle_fully(other, "bind");  // complete, or settled on the host now
        }
        if (slot.fence.stream() != stream) ++core_.stats.hazard_stream_waits;
        if (Status ordered = slot.fence.order_before(core_.async(), stream); !ordered) return ordered;
        if (conflict.need == Need::settle_after) core_.slots[index].settle_order.need(other, slot.generation);
        return {};
    }

    // How the new run touches an arg's host memory.
    void new_touch(const TensorArg& arg, bool frame, Touch& read, Touch& write) const noexcept {
        const bool packed = !frame && arg.bytes <= core_.pack_limit;
        const bool ringed = !frame && arg.bytes >= core_.ring_threshold;
        if (uploads(arg.direction)) read = frame ? Touch::device : (packed || ringed) ? Touch::host_now : Touch::device;
        if (copies_back(arg.direction)) write = packed ? Touch::host_deferred : Touch::device;
    }

    // How the run in flight (or live) on `slot` touches a lease's host memory.
    static void old_touch(const Slot& slot, const TensorLease& lease, Touch& read, Touch& write) noexcept {
        const bool packed = slot.run.packed(lease);
        const bool frame = slot.run.frame();
        const bool live = slot.bound();
        const bool device_pending = live ? slot.state == SlotState::uploading : slot.fence.pending();
        if (lease.upload && packed && frame && live && slot.mapped()) {
            read = Touch::in_place;  // a live mapped frame: its kernel reads the frame itself
        } else if (lease.upload && (!packed || frame) && device_pending) {
            read = Touch::device;
        }
        if (lease.copy_back) {
            if (live || !packed || frame) {
                write = live || slot.fence.pending() ? Touch::device : Touch::none;
            } else if (slot.state == SlotState::delivering) {
                write = Touch::host_deferred;
            }
        }
    }

    // True when the pending work of `slot` (its run, and earlier runs under its fence) touches
    // host memory in `range`.
    bool uses_range(Slot& slot, const HostBox& range) noexcept {
        auto within = [&range](const void* host, std::size_t bytes) {
            const auto at = reinterpret_cast<std::uintptr_t>(host);
            return host != nullptr && bytes > 0 && at < range.end && range.begin < at + bytes;
        };
        if (slot.run.lease_count > 0 && slot.host_box().meets(range)) {
            for (const TensorLease& lease : slot.run.leases()) {
                Touch read = Touch::none, write = Touch::none;
                old_touch(slot, lease, read, write);
                if ((read != Touch::none || write != Touch::none) && within(lease.host, lease.bytes)) return true;
            }
        }
        if (slot.carried.empty() || !slot.fence.pending() || !slot.carried.box.meets(range)) return false;
        if (slot.carried.overflow) return true;
        for (const Touched& touched : slot.carried.touches) {
            if (within(touched.host, touched.bytes)) return true;
        }
        return false;
    }

    Core& core_;
};

}  // namespace devstage::detail
