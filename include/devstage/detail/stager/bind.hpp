// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: how a Stager stages a run on a slot it took — the slot made ready on the bind's
// stream, the run planned (in one pass with its slices, for a retained buffer without packing),
// ordered after the runs in flight it conflicts with, the slot grown, the slices or allocations
// taken, the uploads enqueued and the Out args zeroed; on failure everything taken is given
// back. Also the slot's growth itself (binds, frames, reserve).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "devstage/detail/layout/plan_pass.hpp"
#include "devstage/detail/stager/core.hpp"
#include "devstage/detail/stager/finish.hpp"
#include "devstage/detail/stager/hazards.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/stager/select.hpp"
#include "devstage/detail/stager/settle.hpp"
#include "devstage/detail/transfer/packed.hpp"
#include "devstage/detail/transfer/zero_outputs.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/frame.hpp"
#include "devstage/output_policy.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

template <class B, class Strategy>
class Binder {
public:
    using Core = StagerCore<B, Strategy>;
    using Slot = typename Core::Slot;
    using Stream = typename Core::Stream;

    explicit Binder(Core& core) noexcept : core_(core) {}

    /// Before slot `index` is used on `stream`: settles what completed; orders `stream` after
    /// the slot's pending work, or waits on the host when the host is about to write the mirror.
    Status make_ready(std::size_t index, Stream stream, bool host_writes_mirror) noexcept {
        Slot& slot = core_.slots[index];
        if (Status prepared = slot.fence.prepare(core_.async()); !prepared) {
            return Status(
                prepared.code(),
                core_.with_backend(message("stager bind: creating the slot's events failed: ", prepared.message())));
        }
        if (Status drained = settler().drain_kernel_streams(index); !drained) {
            return Status(drained.code(), core_.with_backend(message("stager bind: ", drained.message())));
        }
        if (Core::mirrored && host_writes_mirror) {
            if (Status settled = Hazards<B, Strategy>(core_).settle_mirror_users(index, "bind"); !settled) {
                return settled;
            }
        }
        if (slot.fence.pending()) {
            Result<bool> ready = slot.fence.poll(core_.async());
            if (!ready || (!*ready && host_writes_mirror && slot.mirror_in_use)) {
                if (Status settled = settler().settle_fully(index, "bind"); !settled) return settled;
            } else if (!*ready) {
                return slot.fence.order_before(core_.async(), stream);
            }
        }
        if (slot.settled < slot.generation || !slot.deferred.empty()) {
            if (Status settled = settler().settle_with(index, Status()); !settled) {
                return Status(settled.code(), core_.with_backend(message("stager bind: ", settled.message())));
            }
        }
        return {};
    }

    /// Slot `index`'s run, staged on `stream`, is bound: uploading while enqueued uploads are
    /// pending (live at once without), counted, and the slot last used now.
    void went_live(std::size_t index, Stream stream, bool frame, bool enqueued) noexcept {
        Slot& slot = core_.slots[index];
        slot.go(frame ? SlotEvent::bind_frame : SlotEvent::bind);
        if (!enqueued || streams_immediate(core_.async())) slot.go(SlotEvent::uploads_done);
        if (core_.map_small && slot.mapped()) ++core_.stats.mapped_runs;
        slot.bind_stream = stream;
        slot.kernel_stream_count = 0;
        slot.bound_at = ++core_.ticks;
        ++core_.stats.runs;
        core_.stats.high_water_bytes =
            std::max<std::uint64_t>(core_.stats.high_water_bytes, slot.run.layout.required_bytes);
    }

    /// After a synchronous bind on slot `index`: the host waits for its uploads on `stream`.
    Status drain(std::size_t index, Stream stream) noexcept {
        Slot& slot = core_.slots[index];
        if (slot.state == SlotState::uploading) slot.go(SlotEvent::uploads_done);
        if (Status drained = slot.fence.drain(core_.async(), stream, core_.stats); !drained) {
            return Status(drained.code(),
                          core_.with_backend(message("stager bind: the uploads failed: ", drained.message())));
        }
        return {};
    }

    /// Stages `args` on slot `index` (made ready, its earlier run carried): plans, orders it
    /// after the runs in flight, grows the slot, takes a slice or allocation per staged arg,
    /// enqueues the uploads on `stream` and zeroes the Out args (OutputPolicy::zero). `frame`:
    /// the args are the slot's frame (every host tensor in the mirror already). `enqueued`
    /// becomes true once a call was made on `stream`. On failure nothing is held: what was taken
    /// is given back once what was enqueued completed.
    Status stage(std::size_t index, std::span<const TensorArg> args, Stream stream, bool frame,
                 bool& enqueued) noexcept {
        Slot& slot = core_.slots[index];
        RunRecord<typename Core::Async>& run = slot.run;
        if constexpr (Core::retained) {
            if (core_.pack_limit == 0) return stage_fused(index, args, stream, enqueued);
        }
        if (frame) {
            run.layout = slot.frames.layout;
            run.pack_limit = pack_everything;
        } else {
            PlanPass pass;
            const auto ignore = [](std::size_t, const TensorArg&, PackGroup, std::size_t) {};
            Status planned = core_.pack_limit > 0 ? pass.run<true>(args, Strategy::alignment, core_.pack_limit, ignore)
                                                  : pass.run<false>(args, Strategy::alignment, 0, ignore);
            Result<StagingLayout> layout = planned.ok() ? pass.finish() : Result<StagingLayout>(planned);
            if (!layout) return Status(layout.status().code(), core_.with_backend(layout.status().message()));
            run.layout = *layout;
            run.pack_limit = core_.pack_limit;
            if (core_.pack_limit > 0) {
                if (Status own = Hazards<B, Strategy>(core_).own_mirror(index, args); !own) return own;
            }
        }
        if (Status ordered = Hazards<B, Strategy>(core_).order_after_in_flight(index, args, stream, frame); !ordered) {
            return ordered;
        }
        if (Status grown = grow(index, run.layout); !grown) return grown;
        Moved moved;
        const bool zero = core_.outputs == OutputPolicy::zero;  // the packed Outs are zeroed in the mirror
        Status staged = core_.moves().stage(run, slot.strategy, slot.memory(), args, stream, zero, moved);
        slot.mirror_in_use = slot.mirror_in_use || moved.mirror_used;
        enqueued = moved.enqueued;
        if (!staged) return failed(index, stream, enqueued, staged);
        if (core_.outputs != OutputPolicy::zero) return {};
        return zero_outputs(index, stream, enqueued);
    }

    /// Grows slot `index` to hold `layout`, giving replaced memory back in stream order.
    /// `keep`: a failed grow keeps what the slot held (reserve).
    Status grow(std::size_t index, const StagingLayout& layout, bool keep = false) noexcept {
        Slot& slot = core_.slots[index];
        // Once the backend misaligned an allocation, the slack is asked for at once from then on.
        // A mapped mirror holds the packed region instead of the device buffer; reserve (keep)
        // grows the buffer to the whole size, so that any run up to it fits, mapped or not.
        const bool packs = core_.pack_limit > 0;
        const Requirement need{layout.required_bytes,
                               packs ? layout.packed_bytes : 0,
                               keep,
                               core_.stats.alignment_retries > 0,
                               core_.stats.mirror_alignment_retries > 0,
                               core_.map_small && !keep ? layout.packed_bytes : 0,
                               core_.map_small,
                               core_.mirror_source ? &*core_.mirror_source : nullptr};
        if constexpr (Core::retained) {
            const std::size_t mirror = mirror_capacity_of(slot.strategy);
            const bool device_fits = device_need_of(slot.strategy, need) <= slot.strategy.capacity();
            if (device_fits && need.mirror_bytes <= mirror && !slot.regions.unlisted) return {};
            // The host frees and rewrites the mirror as it grows: no pending work may use it.
            if (slot.mirror_in_use && need.mirror_bytes > mirror) {
                if (Status settled = settler().settle_fully(index, "grow"); !settled) return settled;
            }
            // What may move is removed before the strategy frees it (a mapped slot's buffer may
            // grow once its mirror is mapped anew); what stays is listed again afterwards.
            const bool device_moves = need.map_mirror ? need.device_bytes > slot.strategy.capacity() : !device_fits;
            core_.regions.remove(slot.regions, device_moves, need.mirror_bytes > mirror);
        }
        Status grown = settler().with_queue(index, [&](FreeQueue<B>& queue) {
            return slot.strategy.prepare(*core_.backend, need, core_.stats, queue);
        });
        slot.note_base(core_.stats);
        if constexpr (Core::retained) {
            Status listed = core_.list_regions(slot);
            if (grown.ok() && !listed.ok()) return Status(listed.code(), core_.with_backend(listed.message()));
        }
        return grown;
    }

    /// Lays a frame of `shapes` out in the mirror of a free slot (settled first: no pending
    /// work may read or write the mirror the host rewrites), grown to hold it; returns the slot.
    Result<std::size_t> lay_out_frame(std::span<const TensorShape> shapes) noexcept {
        if (shapes.empty()) {
            return Status(Errc::invalid_argument,
                          core_.with_backend("stager frame: no shapes; a frame holds at least one tensor (bind an "
                                             "empty arg list instead)"));
        }
        if (core_.slots.empty()) return core_.broken;
        if (core_.pack_limit == 0) {
            return Status(Errc::not_supported,
                          core_.with_backend("stager frame: frames need packing, and this stager's pack limit is 0 "
                                             "(StagerOptions::pack_limit)"));
        }
        const std::optional<std::size_t> free = SlotSelect<B, Strategy>(core_).free_slot({});
        if (!free) return core_.busy("frame");
        const std::size_t index = *free;
        Slot& slot = core_.slots[index];
        if (Status settled = settler().settle_fully(index, "frame"); !settled) return settled;
        if (Status settled = Hazards<B, Strategy>(core_).settle_mirror_users(index, "frame"); !settled) return settled;
        Result<StagingLayout> layout = slot.frames.plan(shapes, Strategy::alignment, &core_);
        if (!layout) return Status(layout.status().code(), core_.with_backend(layout.status().message()));
        if (Status grown = grow(index, *layout); !grown) return grown;
        (void)slot.frames.place(*layout, shapes.size(), slot.memory().mirror, Strategy::alignment);
        return index;
    }

    /// Every slot grown to `bytes` (and its mirror, packing), all settled first; a failed grow
    /// keeps what the slot held.
    Status reserve(std::size_t bytes) noexcept {
        if (core_.slots.empty()) return core_.broken;
        const std::size_t framed = core_.count(SlotState::framed), held = core_.count(SlotState::held);
        if (core_.live_runs() > 0 || framed + held > 0) {
            return slots_in_use("reserve", core_.live_runs(), framed, held, core_.backend->name());
        }
        for (std::size_t index = 0; index < core_.slots.size(); ++index) {  // all settled before any grows
            if (Status settled = settler().settle_fully(index, "reserve"); !settled) return settled;
        }
        for (std::size_t index = 0; index < core_.slots.size(); ++index) {
            StagingLayout layout;
            layout.required_bytes = bytes;
            layout.packed_bytes = core_.pack_limit > 0 ? bytes : 0;
            if (Status grown = grow(index, layout, true); !grown) return grown;
        }
        return {};
    }

private:
    Settler<B, Strategy> settler() noexcept { return Settler<B, Strategy>(core_); }

    // A retained buffer without packing: plan, slice and lease in one pass against the buffer
    // held; a plan that outgrows it grows the buffer and is sliced again (only then). Uploads
    // follow in one loop.
    Status stage_fused(std::size_t index, std::span<const TensorArg> args, Stream stream, bool& enqueued) noexcept {
        Slot& slot = core_.slots[index];
        slot.run.pack_limit = 0;
        Result<std::size_t> required = core_.moves().slice(slot.run, base_of(slot.strategy), args);
        if (!required) return Status(required.status().code(), core_.with_backend(required.status().message()));
        slot.run.layout = StagingLayout{};
        slot.run.layout.required_bytes = *required;
        if (Status ordered = Hazards<B, Strategy>(core_).order_after_in_flight(index, args, stream, false); !ordered) {
            return ordered;
        }
        if (*required > slot.strategy.capacity() || slot.regions.unlisted) {  // unlisted: list it again
            if (Status grown = grow(index, slot.run.layout); !grown) return grown;
            (void)core_.moves().slice(slot.run, base_of(slot.strategy), args);
        }
        if (Status uploaded = core_.moves().upload(slot.run, stream, enqueued); !uploaded) {
            return failed(index, stream, enqueued, uploaded);
        }
        if (core_.outputs != OutputPolicy::zero) return {};
        return zero_outputs(index, stream, enqueued);
    }

    // Out of line: a bind that does not zero pays only the policy test at its call.
    [[gnu::noinline]] Status zero_outputs(std::size_t index, Stream stream, bool& enqueued) noexcept {
        Slot& slot = core_.slots[index];
        Status zeroed = detail::zero_outputs<Strategy::alignment, Core::retained>(
            core_.async(), slot.run, slot.memory(), stream, core_.stats, enqueued);
        if (!zeroed) return failed(index, stream, enqueued, zeroed);
        return zeroed;
    }

    // Gives back what a failed bind took, once what it already enqueued completed: the bind
    // returns with nothing held.
    Status failed(std::size_t index, Stream stream, bool enqueued, Status failure) noexcept {
        Slot& slot = core_.slots[index];
        if (enqueued) {
            (void)slot.fence.record(core_.async(), stream);
            slot.mirror_in_use = slot.mirror_in_use || slot.run.layout.upload_end > 0;
        }
        if (Status released = Finisher<B, Strategy>(core_).release_leases(index); !released) core_.sink(released);
        if (enqueued) settler().settle(index);
        return failure;
    }

    Core& core_;
};

}  // namespace devstage::detail
