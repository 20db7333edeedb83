// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: how a Stager binds a run — the synchronous and stream-ordered entry, making a slot
// ready on a stream, growing it, staging the args and handing the run out (or releasing what a
// failed bind took) — and how finish enqueues the copy-backs and hands back a Completion.
// Included at the end of devstage/stager.hpp; not for inclusion on its own.

#include "devstage/detail/stager/stream_check.hpp"
#include "devstage/stager.hpp"

namespace devstage {

template <Backend B, class Strategy>
Status Stager<B, Strategy>::finish(StagedRun&& run, const Status& execution) noexcept {
    if (Status valid = check_run(run); !valid) return valid;
    Result<Stream> stream = synchronous_stream();
    if (!stream) {  // the run ends, without copy-backs
        const std::size_t index = run.slot_;
        if (Status ended = end_live_run(slots_[index]); !ended) sink_(ended);
        settle(index);
        return stream.status();
    }
    Result<Completion> done = finish(std::move(run), *stream, execution);
    if (!done) return done.status();
    return done->wait();
}

// The stream of synchronous calls: the immediate one, or the stager's own, made at first use.
template <Backend B, class Strategy>
auto Stager<B, Strategy>::synchronous_stream() noexcept -> Result<Stream> {
    if constexpr (immediate) {
        return Stream{};
    } else {
        if (!own_stream_) {
            Result<Stream> created = async().create_stream();
            if (!created) {
                return Status(
                    created.status().code(),
                    with_backend(detail::message("stager: creating its stream failed: ", created.status().message())));
            }
            own_stream_ = *created;
        }
        return *own_stream_;
    }
}

// A synchronous bind: the slot (or why none) first, then the stager's own stream.
template <Backend B, class Strategy>
Result<StagedRun> Stager<B, Strategy>::bind_synchronously(SlotChoice choice, std::span<const TensorArg> args) noexcept {
    if (!choice) return choice.status();
    Result<Stream> stream = synchronous_stream();
    if (!stream) return stream.status();
    return bind_and_drain(std::move(choice), args, *stream);
}

template <Backend B, class Strategy>
Result<StagedRun> Stager<B, Strategy>::bind_and_drain(SlotChoice choice, std::span<const TensorArg> args,
                                                      Stream stream) noexcept {
    Result<StagedRun> run = bind_on(std::move(choice), args, stream);
    if (!run || immediate) return run;
    Slot& slot = slots_[run->slot_];
    slot.uploads_pending = false;
    if (Status drained = slot.fence.drain(async(), stream, stats_); !drained) {
        run = Status(drained.code(),
                     with_backend(detail::message("stager bind: the uploads failed: ", drained.message())));
    }
    return run;
}

template <Backend B, class Strategy>
Result<StagedRun> Stager<B, Strategy>::bind_on(SlotChoice choice, std::span<const TensorArg> args,
                                               Stream stream) noexcept {
    if (!choice) return choice.status();
    if (Status checked = detail::check_stream(*backend_, stream, "bind"); !checked) return checked;
    const std::size_t index = *choice;
    Slot& slot = slots_[index];
    const bool frame = slot.framed && args.data() == slot.frame_args.data();
    if (Status ready = make_ready(index, stream, frame || pack_limit > 0); !ready) return ready;
    if (Status sized = slot.size_for(args.size()); !sized) return sized;
    if (slots_.size() > 1 || pack_limit > 0 || ring_) carry(slot);

    if constexpr (fused) {
        // Plan, slice and lease in one pass against the buffer held; a plan that outgrows it
        // grows the buffer and is sliced again (only then). Uploads follow in one loop.
        Result<std::size_t> required = moves().slice(slot, args);
        if (!required) return Status(required.status().code(), with_backend(required.status().message()));
        slot.layout = StagingLayout{};
        slot.layout.required_bytes = *required;
        if (Status ordered = order_after_in_flight(index, args, stream, false); !ordered) return ordered;
        if (*required > slot.strategy.capacity()) {
            if (Status grown = grow(index, slot.layout); !grown) return grown;
            (void)moves().slice(slot, args);
        }
        bool enqueued = false;
        if (Status uploaded = moves().upload(slot, stream, enqueued); !uploaded) {
            return failed_bind(slot, stream, enqueued, uploaded);
        }
        return bound(index, args.size(), stream, enqueued);
    }
    if (frame) {
        slot.layout = slot.frame_layout;
    } else {
        detail::PlanPass pass;
        Status planned = pass.run<(pack_limit > 0)>(args, Strategy::alignment, pack_limit,
                                                    [](std::size_t, const TensorArg&, PackGroup, std::size_t) {});
        Result<StagingLayout> layout = planned.ok() ? pass.finish() : Result<StagingLayout>(planned);
        if (!layout) return Status(layout.status().code(), with_backend(layout.status().message()));
        slot.layout = *layout;
        if constexpr (pack_limit > 0) {
            if (Status own = own_mirror(index, args); !own) return own;
        }
    }
    if (Status ordered = order_after_in_flight(index, args, stream, frame); !ordered) return ordered;
    if (Status grown = grow(index, slot.layout); !grown) return grown;

    slot.all_packed = frame;
    bool enqueued = false;
    Status staged;
    const bool zero = outputs_ == OutputPolicy::zero;  // the packed Outs are zeroed in the mirror
    if constexpr (pack_limit > 0) {
        staged = frame ? moves().template stage<true>(slot, args, stream, enqueued, zero)
                       : moves().template stage<false>(slot, args, stream, enqueued, zero);
    } else {
        staged = moves().template stage<false>(slot, args, stream, enqueued, zero);
    }
    if (!staged) return failed_bind(slot, stream, enqueued, staged);
    Result<StagedRun> run = bound(index, args.size(), stream, enqueued);
    if (run && frame) slot.framed = false;  // a bind that failed leaves the frame to bind again
    return run;
}

// The run is staged: its Out args are zeroed (OutputPolicy::zero), then it is live.
template <Backend B, class Strategy>
Result<StagedRun> Stager<B, Strategy>::bound(std::size_t index, std::size_t count, Stream stream,
                                             bool enqueued) noexcept {
    Slot& slot = slots_[index];
    if (outputs_ == OutputPolicy::zero) {
        if (Status zeroed = detail::zero_outputs(*backend_, async(), slot, stream, stats_, enqueued); !zeroed) {
            return failed_bind(slot, stream, enqueued, zeroed);
        }
    }
    if constexpr (detail::maps_of<Strategy>()) stats_.mapped_runs += slot.mapped ? 1 : 0;
    slot.live = true;
    slot.uploads_pending = enqueued && !detail::streams_immediate(async());
    slot.run_leases = true;
    slot.bind_stream = stream;
    slot.kernel_stream_count = 0;
    slot.bound_at = ++ticks_;
    ++stats_.runs;
    stats_.high_water_bytes = std::max<std::uint64_t>(stats_.high_water_bytes, slot.layout.required_bytes);
    return StagedRun(this, index, {slot.device_args.data(), count}, slot.leases());
}

// Releases what a failed bind took, once what it already enqueued completed: the bind
// returns with nothing held.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::failed_bind(Slot& slot, Stream stream, bool enqueued, Status failure) noexcept {
    if (enqueued) {
        (void)slot.fence.record(async(), stream);
        slot.uses_mirror = slot.uses_mirror || slot.layout.upload_end > 0;
    }
    if (Status released = release_leases(slot); !released) sink_(released);
    if (enqueued) settle(static_cast<std::size_t>(&slot - slots_.data()));
    return failure;
}

// Before a slot is used on `stream`: settle what completed; order `stream` after the
// slot's pending work, or wait on the host when the host is about to write the mirror.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::make_ready(std::size_t index, Stream stream, bool host_writes_mirror) noexcept {
    Slot& slot = slots_[index];
    if (Status prepared = slot.fence.prepare(async()); !prepared) {
        return Status(prepared.code(), with_backend(detail::message("stager bind: creating the slot's events failed: ",
                                                                    prepared.message())));
    }
    if constexpr (pack_limit > 0) {
        if (host_writes_mirror) {
            if (Status settled = settle_mirror_users(index, "bind"); !settled) return settled;
        }
    }
    if (slot.fence.pending()) {
        Result<bool> ready = slot.fence.poll(async());
        if (!ready || (!*ready && host_writes_mirror && slot.uses_mirror)) {
            if (Status settled = settle_fully(index, "bind"); !settled) return settled;
        } else if (!*ready) {
            return slot.fence.order_before(async(), stream);
        }
    }
    if (slot.settled < slot.generation || !slot.deferred.empty()) {
        if (Status settled = settle_with(index, Status()); !settled) {
            return Status(settled.code(), with_backend(detail::message("stager bind: ", settled.message())));
        }
    }
    return {};
}

// Before the host rewrites, grows or frees slot `index`'s mirror: settles the other slots
// whose pending work reads or writes it (an output of a frame fed back as an input), and
// waits for the uploads of a live run that reads it.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::settle_mirror_users(std::size_t index, const char* what) noexcept {
    const auto begin = reinterpret_cast<std::uintptr_t>(detail::mirror_of(slots_[index].strategy));
    if (begin == 0) return {};
    const detail::HostBox mirror{begin, begin + detail::mirror_capacity_of(slots_[index].strategy)};
    for (std::size_t other = 0; other < slots_.size(); ++other) {
        Slot& slot = slots_[other];
        if (other == index || !(slot.live ? slot.uploads_pending : slot.fence.pending())) continue;
        if (!uses_range(slot, mirror)) continue;
        ++stats_.hazard_settles;
        if (slot.live) {
            if (Status drained = slot.fence.drain(async(), slot.bind_stream, stats_); !drained) {
                return Status(drained.code(), with_backend(detail::message("stager ", what, ": the uploads of slot ",
                                                                           other, " failed: ", drained.message())));
            }
            slot.uploads_pending = false;
        } else if (Status settled = settle_fully(other, what); !settled) {
            return settled;
        }
    }
    return {};
}

// True when the pending work of `slot` (its run, and earlier runs under its fence) touches
// host memory in `range`.
template <Backend B, class Strategy>
bool Stager<B, Strategy>::uses_range(Slot& slot, const detail::HostBox& range) noexcept {
    auto inside = [&range](const void* host, std::size_t bytes) {
        const auto at = reinterpret_cast<std::uintptr_t>(host);
        return host != nullptr && bytes > 0 && at < range.end && range.begin < at + bytes;
    };
    if (slot.run_leases && slot.host_box().meets(range)) {
        for (const TensorLease& lease : slot.leases()) {
            detail::Touch read = detail::Touch::none, write = detail::Touch::none;
            old_touch(slot, lease, read, write);
            if ((read != detail::Touch::none || write != detail::Touch::none) && inside(lease.host, lease.bytes)) {
                return true;
            }
        }
    }
    if (slot.carried.empty() || !slot.fence.pending() || !slot.carried.meets(range)) return false;
    if (slot.carried_overflow) return true;
    for (const detail::Touched& touched : slot.carried_touches) {
        if (inside(touched.host, touched.bytes)) return true;
    }
    return false;
}

// Every slot grown to `bytes` (and its mirror, packing), all settled first; a failed grow keeps
// what the slot held.
template <Backend B, class Strategy>
Status Stager<B, Strategy>::reserve(std::size_t bytes) noexcept
    requires(Strategy::lease_kind == ReleaseKind::BufferNoop) {
    if (slots_.empty()) return broken_;
    const auto framed =
        static_cast<std::size_t>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.framed; }));
    const auto held = static_cast<std::size_t>(
        std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.held && !s.framed; }));
    if (live_runs() > 0 || framed + held > 0) {
        return detail::slots_in_use("reserve", live_runs(), framed, held, backend_->name());
    }
    const std::size_t mirror = detail::pack_limit_of<Strategy>() > 0 ? bytes : 0;
    for (std::size_t index = 0; index < slots_.size(); ++index) {  // all settled before any grows
        if (Status settled = settle_fully(index, "reserve"); !settled) return settled;
    }
    for (std::size_t index = 0; index < slots_.size(); ++index) {
        StagingLayout layout;
        layout.required_bytes = bytes;
        layout.packed_bytes = mirror;
        if (Status grown = grow(index, layout, true); !grown) return grown;
    }
    return {};
}

// Grows slot `index` to hold `layout`, giving replaced memory back in stream order.
// `keep`: a failed grow keeps what the slot held (reserve).
template <Backend B, class Strategy>
Status Stager<B, Strategy>::grow(std::size_t index, const StagingLayout& layout, bool keep) noexcept {
    Slot& slot = slots_[index];
    // Once the backend misaligned an allocation, the slack is asked for at once from then on.
    // A mapped mirror holds the packed region instead of the device buffer; reserve (keep)
    // grows the buffer to the whole size, so that any run up to it fits, mapped or not.
    const Requirement need{layout.required_bytes,
                           pack_limit > 0 ? layout.packed_bytes : 0,
                           keep,
                           stats_.alignment_retries > 0,
                           stats_.mirror_alignment_retries > 0,
                           detail::maps_of<Strategy>() && !keep ? layout.packed_bytes : 0};
    if constexpr (retained) {
        const std::size_t mirror = detail::mirror_capacity_of(slot.strategy);
        if (detail::device_need_of(slot.strategy, need) <= slot.strategy.capacity() && need.mirror_bytes <= mirror) {
            return {};
        }
        // The host frees and rewrites the mirror as it grows: no pending work may use it.
        if (slot.uses_mirror && need.mirror_bytes > mirror) {
            if (Status settled = settle_fully(index, "grow"); !settled) return settled;
        }
    }
    QueueContext context{this, index};
    Status grown = with_queue(
        slot, context, [&](FreeQueue<B>& queue) { return slot.strategy.prepare(*backend_, need, stats_, queue); });
    slot.note_base(stats_);
    return grown;
}

template <Backend B, class Strategy>
Status Stager<B, Strategy>::settle_for_queue(void* context) noexcept {
    auto* queue = static_cast<QueueContext*>(context);
    return queue->stager->settle_fully(queue->index, "free");
}

template <Backend B, class Strategy>
Result<Completion> Stager<B, Strategy>::finish(StagedRun&& run, Stream stream, const Status& execution) noexcept {
    if (Status valid = check_run(run); !valid) return valid;
    if (Status checked = detail::check_stream(*backend_, stream, "finish"); !checked) return checked;
    const std::size_t index = run.slot_;
    Slot& slot = slots_[index];
    Status first = slot.fence.join(async(), slot.bind_stream, stream);
    if (Status joined = join_kernel_streams(slot, stream); !joined && first.ok()) first = joined;
    // Without the join nothing is enqueued on `stream` but the caller's kernel, which may use
    // the run's memory: the uploads are waited for on the host, and the memory is then kept
    // until `stream`'s work completed (or, if the uploads cannot be waited for, until they do).
    Stream fenced = stream;
    if (!first.ok()) {
        (void)slot.fence.record(async(), slot.bind_stream);
        (void)slot.fence.wait(async(), stats_);
        if (slot.fence.pending()) fenced = slot.bind_stream;
    }
    typename Moves::CopyBacks backs;
    if (execution.ok() && first.ok()) backs = moves().copy_back(slot, stream, first);
    stats_.copy_backs_skipped += slot.staged - (backs.calls + backs.failed + backs.packed);
    if constexpr (BatchCopyBackend<Async>) stats_.copy_backs_skipped -= backs.batched;
    if constexpr (pack_limit > 0) {
        if (backs.packed > 0 && slot.mapped) {
            slot.unpack = true;  // the kernel wrote them in the mapped mirror: no copy
        } else if (backs.packed > 0) {
            if (Status back = moves().packed_copy_back(slot, stream, backs); !back && first.ok()) first = back;
        }
    }
    stats_.bytes_from_device += backs.bytes;
    stats_.copy_backs += backs.calls;
    if (!detail::streams_immediate(async())) stats_.async_copy_backs += backs.calls;

    if (Status recorded = slot.fence.record(async(), fenced); !recorded && first.ok()) first = recorded;
    slot.uses_mirror = slot.uses_mirror || slot.unpack;
    ++slot.generation;
    // Watched before the leases go back: a release that waits for the slot settles this run.
    Completion completion;
    if (first.ok()) {
        link(completion, index, slot.generation, slot.all_packed);  // a frame's run holds the frame
        slot.held = slot.all_packed;
        slot.held_generation = slot.generation;
    }
    Status released = release_leases(slot);
    unlink_handle(slot);
    if (!first.ok() || !released.ok()) {
        settle(index);  // what was enqueued completes before the error is returned
        if (!first.ok()) return first;
        if (Status work = completion.wait(); !work) sink_(work);  // the run's own failure, too
        return released;
    }
    return completion;
}

}  // namespace devstage
