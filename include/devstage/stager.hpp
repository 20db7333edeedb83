// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Stager: stages a run's host tensors on the device through a strategy, hands back device
/// pointers and leases, and at the end of the run copies back what it must and releases
/// exactly what it owns — synchronously, or enqueued on the caller's stream. Both go through
/// one path: a synchronous backend is seen through SynchronousAdapter, whose stream is
/// immediate.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/completion.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/detail/slot_fence.hpp"
#include "devstage/detail/stager_messages.hpp"
#include "devstage/detail/stager_slot.hpp"
#include "devstage/detail/transfers.hpp"
#include "devstage/frame.hpp"
#include "devstage/lease.hpp"
#include "devstage/pageable.hpp"
#include "devstage/plan.hpp"
#include "devstage/run.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/stream.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

namespace detail {
/// A backend that declares a Stream type means to be an AsyncBackend: one that misses an
/// operation must not be staged synchronously without a word.
template <class B>
consteval bool streams_complete() {
    if constexpr (requires { typename B::Stream; }) {
        static_assert(AsyncBackend<B>,
                      "the backend declares a Stream type but does not model devstage::AsyncBackend (see the "
                      "unsatisfied operation below): add it, or the backend would stage synchronously");
    }
    return true;
}
}  // namespace detail

/// Stages runs for one runner on one backend. `Stager<SimBackend> stager(sim); auto run = stager.bind(args);`
///
/// Synchronous: `bind(args)` returns once the uploads are on the device; `finish(run)` once
/// the copy-backs are in host memory. Stream-ordered: `bind(args, stream)` enqueues the
/// uploads on the caller's stream; `finish(run, stream)` enqueues the copy-backs and returns a
/// Completion. Each pipeline slot has its own strategy instance (its own retained buffer); a
/// slot is reused in stream order — on the same stream with no host wait, from another stream
/// through a stream wait — and device memory pending work may touch is freed only once that
/// work completed.
///
/// The backend must outlive the stager. Not thread-safe: one runner drives it.
template <Backend B, class Strategy = RetainedBump<>>
class Stager final : private detail::RunOwner, private detail::CompletionOwner {
    static_assert(StagingStrategy<Strategy, B>,
                  "the strategy does not model devstage::StagingStrategy for this backend");
    static_assert(detail::streams_complete<B>());

public:
    /// The stream-ordered view of the backend: B itself, or SynchronousAdapter<B>.
    using Async = stream_backend_t<B>;
    using Stream = typename Async::Stream;

    /// At most this many pipeline slots.
    static constexpr std::size_t max_pipeline_slots = 256;

    /// A stager of `pipeline_slots` slots (0 counts as 1). More than max_pipeline_slots, or
    /// host memory short for them, leaves a stager with no slot whose every call returns why
    /// (status() tells at once).
    explicit Stager(B& backend, Strategy strategy = {}, std::size_t pipeline_slots = 1) noexcept
        : backend_(&backend), async_(backend) {
        const std::size_t count = std::max<std::size_t>(pipeline_slots, 1);
        if (count > max_pipeline_slots) {
            broken_ = Status(Errc::invalid_argument,
                             with_backend(detail::message("stager: ", pipeline_slots,
                                                          " pipeline slots asked for; at most ", max_pipeline_slots)));
            return;
        }
        if (!detail::make_slots(slots_, count, std::move(strategy))) {
            broken_ = Status(Errc::out_of_memory,
                             with_backend(detail::message("stager: host memory for ", count, " pipeline slots")));
        }
    }
    Stager(const Stager&) = delete;
    Stager& operator=(const Stager&) = delete;
    /// Waits for pending work, releases a live run and every retained buffer, destroys the
    /// stager's events and stream. Failures go to the error sink.
    ~Stager() {
        if (Status status = release(); !status) sink_(status);
        for (Slot& slot : slots_) {
            if (Status destroyed = slot.fence.destroy(async()); !destroyed) sink_(destroyed);
        }
        if (own_stream_) {
            if (Status destroyed = async().destroy_stream(*own_stream_); !destroyed) sink_(destroyed);
        }
        resolve_all(Status());
    }

    // ---- the run lifecycle --------------------------------------------------------------

    /// Plans, grows if needed, takes device memory for every staged arg and uploads In/InOut
    /// args; returns once they are on the device. On failure everything taken is released and
    /// the stager is ready for the next bind. A free slot is taken (busy when none is).
    Result<StagedRun> bind(std::span<const TensorArg> args) noexcept {
        return bind_synchronously(pick_slot(args), args);
    }
    /// As bind(args), on the slot the caller chooses (invalid_argument out of range, busy when
    /// it holds a live run or an unbound frame).
    Result<StagedRun> bind_slot(std::size_t slot, std::span<const TensorArg> args) noexcept {
        return bind_synchronously(chosen_slot(slot, args), args);
    }
    /// Binds a frame from frame() (uploads its In/InOut bytes with one copy).
    Result<StagedRun> bind(const HostFrame& frame) noexcept {
        return bind_synchronously(frame_slot(frame), frame.args());
    }

    /// Enqueues the run's uploads on `stream`: the device args are valid for work enqueued on
    /// `stream` after this call. The host memory of In args must not change until the run's
    /// Completion is ready.
    Result<StagedRun> bind(std::span<const TensorArg> args, Stream stream) noexcept {
        return bind_on(pick_slot(args), args, stream);
    }
    Result<StagedRun> bind_slot(std::size_t slot, std::span<const TensorArg> args, Stream stream) noexcept {
        return bind_on(chosen_slot(slot, args), args, stream);
    }
    Result<StagedRun> bind(const HostFrame& frame, Stream stream) noexcept {
        return bind_on(frame_slot(frame), frame.args(), stream);
    }

    /// Ends a run: copies back Out/InOut args when `execution` is ok, releases every lease by
    /// its kind, and returns the first error of its own copy-backs and releases (it does not
    /// echo `execution`). The kernel must have completed before this call. A run of another
    /// stager, or one no longer live, is invalid_argument and is left untouched. When the
    /// stager's own stream cannot be created, the run ends without copy-backs (its leases are
    /// released) and that failure is returned.
    Status finish(StagedRun&& run, const Status& execution = {}) noexcept {
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

    /// Enqueues the run's copy-backs on `stream` (after the work the caller enqueued there: its
    /// kernel), records the slot's event and returns the run's Completion; Out/InOut host data
    /// is valid once the Completion's wait() returned ok. On another stream than the bind's,
    /// `stream` first waits for the bind's. An error at the call (nothing could be enqueued, or
    /// a copy-back was refused) is returned after waiting for what was enqueued.
    Result<Completion> finish(StagedRun&& run, Stream stream, const Status& execution = {}) noexcept {
        if (Status valid = check_run(run); !valid) return valid;
        const std::size_t index = run.slot_;
        Slot& slot = slots_[index];
        Status first = slot.fence.join(async(), slot.bind_stream, stream);
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
        if constexpr (pack_limit > 0) {
            if (backs.packed > 0) {
                if (Status back = moves().packed_copy_back(slot, stream, backs); !back && first.ok()) first = back;
            }
        }
        stats_.bytes_from_device += backs.bytes;
        stats_.copy_backs += backs.calls;
        if constexpr (!immediate) stats_.async_copy_backs += backs.calls;

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

    // ---- inputs written in place --------------------------------------------------------

    /// The pinned mirror of a slot that no pending work still reads or writes (waiting,
    /// counted in host_waits, if none is), laid out for `shapes` with every tensor packed; the
    /// caller writes its inputs into `host(i)`, then binds the frame (or `frame->args()`) on
    /// that slot. Busy when every slot holds a live run or an unbound frame; invalid_argument
    /// for no shapes. Needs a packing strategy (RetainedBump with PackSmall).
    Result<HostFrame> frame(std::span<const TensorShape> shapes) noexcept
        requires(detail::pack_limit_of<Strategy>() > 0) {
        if (shapes.empty()) {
            return Status(Errc::invalid_argument,
                          with_backend("stager frame: no shapes; a frame holds at least one tensor (bind an empty "
                                       "arg list instead)"));
        }
        if (slots_.empty()) return broken_;
        const std::optional<std::size_t> free = free_slot({});
        if (!free) return busy("frame");
        const std::size_t index = *free;
        Slot& slot = slots_[index];
        if (Status settled = settle_fully(index, "frame"); !settled) return settled;
        Result<StagingLayout> layout = slot.plan_frame(shapes, this);
        if (!layout) return Status(layout.status().code(), with_backend(layout.status().message()));
        if (Status grown = grow(index, *layout); !grown) return grown;
        const std::span<const TensorArg> args = slot.place_frame(*layout, shapes.size());
        return HostFrame(this, index, slot.frame_generation, args);
    }

    // ---- growth control and buffer ownership --------------------------------------------

    /// Grows every slot's retained buffer (and mirror) to at least `bytes` now, so later runs
    /// up to that size never move device addresses (for captured graphs), after waiting for
    /// the slots' pending work. Busy while a run is live or a frame unbound.
    /// A slot that fails to grow keeps what it held. Retained strategies only.
    Status reserve(std::size_t bytes) noexcept requires(Strategy::lease_kind == ReleaseKind::BufferNoop) {
        if (slots_.empty()) return broken_;
        const auto framed = static_cast<std::size_t>(
            std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.framed || s.held; }));
        if (live_runs() > 0 || framed > 0)
            return detail::slots_in_use("reserve", live_runs(), framed, backend_->name());
        const std::size_t mirror = detail::pack_limit_of<Strategy>() > 0 ? bytes : 0;
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            if (Status settled = settle_fully(index, "reserve"); !settled) return settled;
            StagingLayout layout;
            layout.required_bytes = bytes;
            layout.packed_bytes = mirror;
            if (Status grown = grow(index, layout, true); !grown) return grown;
        }
        return {};
    }

    /// Takes ownership of a device buffer allocated elsewhere as slot `slot`'s retained buffer
    /// (an empty slot with no run; a later grow or release frees it).
    Status adopt(std::size_t slot, void* allocation, std::size_t bytes) noexcept requires
        requires(Strategy& s, B& b, void* p, std::size_t n, StagerStats& st) {
        s.adopt(b, p, n, st);
    }
    {
        if (slot >= slots_.size()) return out_of_range("adopt", slot);
        if (slots_[slot].live || slots_[slot].framed || slots_[slot].held) return busy("adopt");
        settle(slot);
        if (Status adopted = slots_[slot].strategy.adopt(*backend_, allocation, bytes, stats_); !adopted) {
            return adopted;
        }
        slots_[slot].note_base(stats_);
        return {};
    }

    /// Hands slot `slot`'s retained buffer to the caller without freeing it (after waiting for
    /// pending work that uses it); the slot is empty afterwards.
    Result<RetainedBuffer> detach(std::size_t slot) noexcept requires requires(Strategy& s, StagerStats& st) {
        s.detach(st);
    }
    {
        if (slot >= slots_.size()) return out_of_range("detach", slot);
        if (slots_[slot].live || slots_[slot].framed || slots_[slot].held) return busy("detach");
        if (Status settled = settle_fully(slot, "detach"); !settled) return settled;
        return slots_[slot].strategy.detach(stats_);
    }

    /// Gives back all device memory now: waits for pending work, releases a live run's leases
    /// (no copy-back; its handle becomes inert), then every retained buffer. Unbound frames are
    /// dropped. A slot whose pending work cannot be waited for keeps its memory (the failure
    /// is returned; a later release() tries again). The stager stays usable.
    Status release() noexcept {
        Status first;
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            Slot& slot = slots_[index];
            if (slot.live) {
                Status dropped = end_live_run(slot);
                if (first.ok()) first = std::move(dropped);
            }
            slot.framed = slot.held = false;
        }
        if constexpr (PinnedHostBackend<B>) {
            if (ring_) {
                Status freed = ring_->release(*backend_, async(), stats_);  // re-created at next use
                if (first.ok()) first = std::move(freed);
            }
        }
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            if (Status settled = settle_fully(index, "release"); !settled) {
                // Pending work may still use the slot's memory: it is kept for a later release().
                if (first.ok()) first = std::move(settled);
                continue;
            }
            Slot& slot = slots_[index];
            Status freed = slot.strategy.release_retained(*backend_, stats_);
            if (first.ok()) first = std::move(freed);
            slot.drop_bookkeeping();  // the per-arg host bookkeeping goes too: the next bind sizes it again
        }
        return first;
    }

    /// Forgets all device memory, pending work, events and the stager's own stream without
    /// calling the backend, for after a device reset invalidated them. Live run handles become
    /// inert; Completions still watched resolve with backend_failure. The stager stays usable.
    void abandon() noexcept {
        for (Slot& slot : slots_) {
            if (slot.live) {
                slot.lease_count = 0;
                unlink_handle(slot);
            }
            slot.lease_count = 0;
            slot.deferred.clear();
            slot.fence.forget();
            slot.framed = slot.held = false;
            slot.has_settle_after = false;
            std::fill(slot.settle_after.begin(), slot.settle_after.end(), 0);
            slot.carried = {};
            slot.unpack = slot.uses_mirror = false;
            slot.settled = slot.generation;
            slot.strategy.abandon(stats_);
        }
        own_stream_.reset();
        if constexpr (PinnedHostBackend<B>) {
            if (ring_) ring_->forget(stats_);
        }
        resolve_all(Status(Errc::backend_failure, "stager abandon: the run's pending work was forgotten"));
    }

    // ---- pageable args through a pinned ring ----------------------------------------------

    /// From now on, staged args of at least `ring.threshold` bytes in pageable host memory move
    /// through a ring of `ring.chunks` pinned chunks of `ring.chunk_bytes`, filled and emptied by
    /// host threads (the engine's `pool` when given, else `ring.threads` threads the stager
    /// starts once) while the copy engine drains the previous chunk. An arg's memory is pageable
    /// when its TensorArg says so, else when the backend's `is_pinned` query (if it has one)
    /// says it is not pinned, else it is assumed pageable. The chunks are allocated at first
    /// use; busy while a run is live. See docs/staging.md for when it pays.
    Status set_pageable_ring(const PageableRing& ring,
                             HostCopyPool* pool = nullptr) noexcept requires PinnedHostBackend<B> {
        if (Status cleared = clear_pageable_ring(); !cleared) return cleared;
#if defined(__cpp_exceptions)
        try {
            ring_ = std::make_unique<detail::PinnedRing<B, Async>>(ring, pool);
        } catch (...) {
            return Status(Errc::out_of_memory, with_backend("stager: host memory for the pageable ring"));
        }
#else
        ring_ = std::make_unique<detail::PinnedRing<B, Async>>(ring, pool);
#endif
        ring_threshold_ = std::max<std::size_t>(ring.threshold, 1);
        return {};
    }

    /// Stops staging through the ring and frees it (after the copies that use it completed;
    /// chunks whose copies cannot be waited for are kept, the failure returned, until a later
    /// clear_pageable_ring() or release() can).
    Status clear_pageable_ring() noexcept requires PinnedHostBackend<B> {
        if (live_runs() > 0) return busy("set_pageable_ring");
        ring_threshold_ = std::numeric_limits<std::size_t>::max();
        if (!ring_) return {};
        Status released = ring_->release(*backend_, async(), stats_);
        if (ring_->chunks() == 0) ring_.reset();
        return released;
    }

    // ---- inspection ---------------------------------------------------------------------

    const StagerStats& stats() const noexcept {
        return stats_;
    }
    /// Ok, or why the stager has no slot (see the constructor).
    const Status& status() const noexcept {
        return broken_;
    }
    /// The strategy instance of one pipeline slot (its retained buffer, for inspection).
    const Strategy& strategy(std::size_t slot = 0) const noexcept {
        return slots_[slot].strategy;
    }
    std::size_t pipeline_slots() const noexcept {
        return slots_.size();
    }
    std::size_t live_runs() const noexcept {
        return static_cast<std::size_t>(
            std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.live; }));
    }
    B& backend() const noexcept {
        return *backend_;
    }
    /// Host memory the stager holds for its per-arg state (leases, device args); it grows to
    /// the largest run and is given back by release(). (The arg lists of frames stay, so that
    /// a stale frame is recognized.)
    std::size_t bookkeeping_bytes() const noexcept {
        std::size_t bytes = 0;
        for (const Slot& slot : slots_) bytes += slot.bookkeeping_bytes();
        return bytes;
    }
    /// Where failures with no caller to return to (a dropped run, an unwatched Completion, a
    /// replaced buffer whose free failed, the destructor) are reported.
    void set_error_sink(ErrorSink sink) noexcept {
        sink_ = sink;
    }

private:
    static constexpr std::size_t pack_limit = detail::pack_limit_of<Strategy>();
    static constexpr bool retained = Strategy::lease_kind == ReleaseKind::BufferNoop;
    static constexpr bool immediate = is_immediate_v<Async>;
    // Retained and unpacked (the default): plan, slice and lease fused in one pass.
    static constexpr bool fused = retained && pack_limit == 0;

    using Slot = detail::StagerSlot<Strategy, Async>;
    using Moves = detail::Transfers<B, Strategy, Async>;

    // A slot choice, or why there is none.
    using SlotChoice = Result<std::size_t>;

    struct NoAdapter {
        explicit NoAdapter(B& /*backend*/) noexcept {}
    };
    using Adapter = std::conditional_t<AsyncBackend<B>, NoAdapter, Async>;
    Async& async() noexcept {
        if constexpr (AsyncBackend<B>) {
            return *backend_;
        } else {
            return async_;
        }
    }

    // ---- bind -----------------------------------------------------------------------------

    // A synchronous bind: the slot (or why none) first, then the stager's own stream.
    Result<StagedRun> bind_synchronously(SlotChoice choice, std::span<const TensorArg> args) noexcept {
        if (!choice) return choice.status();
        Result<Stream> stream = synchronous_stream();
        if (!stream) return stream.status();
        return bind_and_drain(std::move(choice), args, *stream);
    }

    Result<StagedRun> bind_and_drain(SlotChoice choice, std::span<const TensorArg> args, Stream stream) noexcept {
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

    Result<StagedRun> bind_on(SlotChoice choice, std::span<const TensorArg> args, Stream stream) noexcept {
        if (!choice) return choice.status();
        const std::size_t index = *choice;
        Slot& slot = slots_[index];
        const bool frame = slot.framed && args.data() == slot.frame_args.data();
        if (Status ready = make_ready(index, stream, frame || pack_limit > 0); !ready) return ready;
        if (Status sized = slot.size_for(args.size()); !sized) return sized;
        if (slots_.size() > 1) carry(slot);

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
        if constexpr (pack_limit > 0) {
            staged = frame ? moves().template stage<true>(slot, args, stream, enqueued)
                           : moves().template stage<false>(slot, args, stream, enqueued);
        } else {
            staged = moves().template stage<false>(slot, args, stream, enqueued);
        }
        if (!staged) return failed_bind(slot, stream, enqueued, staged);
        if (frame) slot.framed = false;
        return bound(index, args.size(), stream, enqueued);
    }

    Result<StagedRun> bound(std::size_t index, std::size_t count, Stream stream, bool enqueued) noexcept {
        Slot& slot = slots_[index];
        slot.live = true;
        slot.uploads_pending = enqueued && !immediate;
        slot.bind_stream = stream;
        slot.bound_at = ++ticks_;
        ++stats_.runs;
        stats_.high_water_bytes = std::max<std::uint64_t>(stats_.high_water_bytes, slot.layout.required_bytes);
        return StagedRun(this, index, {slot.device_args.data(), count}, slot.leases());
    }

    // Releases what a failed bind took, once what it already enqueued completed: the bind
    // returns with nothing held.
    Status failed_bind(Slot& slot, Stream stream, bool enqueued, Status failure) noexcept {
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
    Status make_ready(std::size_t index, Stream stream, bool host_writes_mirror) noexcept {
        Slot& slot = slots_[index];
        if (Status prepared = slot.fence.prepare(async()); !prepared) {
            return Status(
                prepared.code(),
                with_backend(detail::message("stager bind: creating the slot's events failed: ", prepared.message())));
        }
        if (slot.fence.pending()) {
            Result<bool> ready = slot.fence.poll(async());
            if (!ready || (!*ready && host_writes_mirror && slot.uses_mirror)) {
                if (Status settled = settle_fully(index, "bind"); !settled) return settled;
            } else if (!*ready) {
                return slot.fence.order_before(async(), stream);
            }
        }
        if (slot.settled < slot.generation || !slot.deferred.empty()) settle_with(index, Status());
        return {};
    }

    // Grows slot `index` to hold `layout`, giving replaced memory back in stream order.
    // `keep`: a failed grow keeps what the slot held (reserve).
    Status grow(std::size_t index, const StagingLayout& layout, bool keep = false) noexcept {
        Slot& slot = slots_[index];
        const Requirement need{layout.required_bytes, pack_limit > 0 ? layout.packed_bytes : 0, keep};
        if constexpr (retained) {
            const std::size_t mirror = detail::mirror_capacity_of(slot.strategy);
            if (need.device_bytes <= slot.strategy.capacity() && need.mirror_bytes <= mirror) return {};
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

    // Runs `use(queue)` with the slot's FreeQueue: deferring while the slot has pending work.
    struct QueueContext {
        Stager* stager;
        std::size_t index;
    };
    template <class Use>
    Status with_queue(Slot& slot, QueueContext& context, Use&& use) noexcept {
        if (slot.fence.pending()) {
            FreeQueue<B> queue(*backend_, stats_, sink_, slot.deferred, &Stager::settle_for_queue, &context);
            return use(queue);
        }
        FreeQueue<B> queue(*backend_, stats_, sink_);
        return use(queue);
    }
    static Status settle_for_queue(void* context) noexcept {
        auto* queue = static_cast<QueueContext*>(context);
        return queue->stager->settle_fully(queue->index, "free");
    }

    // ---- host hazards between runs in flight (the rules: detail/run_order.hpp) -------------

    // Before slot `index` runs `args` on `stream`: orders it after every run in flight whose
    // host memory it conflicts with — a stream wait, a settle on the host first, or a settle
    // order — or refuses it (busy) when a live run will still write that memory.
    Status order_after_in_flight(std::size_t index, std::span<const TensorArg> args, Stream stream,
                                 bool frame) noexcept {
        Slot& self = slots_[index];
        self.box_valid = false;
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
            if (slot.host_box().meets(self.box)) {
                conflict = detail::find_conflict(
                    args, slot.leases(), slot.live,
                    [&](const TensorArg& arg, detail::Touch& read, detail::Touch& write) {
                        new_touch(arg, frame, read, write);
                    },
                    [&](const TensorLease& lease, detail::Touch& read, detail::Touch& write) {
                        old_touch(slot, lease, read, write);
                    });
            }
            if (slot.fence.pending() && slot.carried.meets(self.box) && conflict.need < detail::Need::stream_wait) {
                conflict.need = detail::Need::stream_wait;  // earlier runs of that slot: device order
                for (const TensorArg& arg : args) {
                    detail::Touch read = detail::Touch::none, write = detail::Touch::none;
                    new_touch(arg, frame, read, write);
                    if (read == detail::Touch::host_now) conflict.need = detail::Need::settle_now;
                }
            }
            if (conflict.need == detail::Need::none) continue;
            if (Status ordered = order_after(index, other, conflict, args, stream); !ordered) return ordered;
        }
        return {};
    }

    Status order_after(std::size_t index, std::size_t other, const detail::Conflict& conflict,
                       std::span<const TensorArg> args, Stream stream) noexcept {
        using detail::Need;
        Slot& slot = slots_[other];
        if (conflict.need == Need::refuse) {
            return detail::overlap_failure(conflict.arg, args[conflict.arg], other, *conflict.lease, backend_->name());
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
    void new_touch(const TensorArg& arg, bool frame, detail::Touch& read, detail::Touch& write) const noexcept {
        using detail::Touch;
        const bool packed = !frame && arg.bytes <= pack_limit;
        const bool ringed = !frame && arg.bytes >= ring_threshold_;
        if (uploads(arg.direction)) read = frame ? Touch::device : (packed || ringed) ? Touch::host_now : Touch::device;
        if (copies_back(arg.direction)) write = packed ? Touch::host_deferred : Touch::device;
    }

    // How the run in flight (or live) on `slot` touches a lease's host memory.
    static void old_touch(const Slot& slot, const TensorLease& lease, detail::Touch& read,
                          detail::Touch& write) noexcept {
        using detail::Touch;
        const bool packed = slot.packed(lease);
        const bool device_pending = slot.live ? slot.uploads_pending : slot.fence.pending();
        if (lease.upload && (!packed || slot.all_packed) && device_pending) read = Touch::device;
        if (lease.copy_back) {
            if (slot.live || !packed || slot.all_packed) {
                write = slot.live || slot.fence.pending() ? Touch::device : Touch::none;
            } else if (slot.unpack) {
                write = Touch::host_deferred;
            }
        }
    }

    // A slot rebound while its earlier work is pending keeps that work's host box.
    static void carry(Slot& slot) noexcept {
        if (!slot.fence.pending()) {
            slot.carried = {};
        } else {
            slot.carried.add(slot.host_box());
        }
        if (slot.has_settle_after) {
            std::fill(slot.settle_after.begin(), slot.settle_after.end(), 0);
            slot.has_settle_after = false;
        }
    }

    // The host box of the args being bound, computed once per bind call.
    const detail::HostBox& bind_box(std::span<const TensorArg> args) noexcept {
        if (!bind_box_ready_) {
            bind_box_ = detail::box_of(args);
            bind_box_ready_ = true;
        }
        return bind_box_;
    }

    // A packed bind must not read args from the mirror it is about to rewrite (or grow).
    Status own_mirror(std::size_t index, std::span<const TensorArg> args) noexcept {
        const Slot& slot = slots_[index];
        const auto mirror = reinterpret_cast<std::uintptr_t>(detail::mirror_of(slot.strategy));
        if (!bind_box(args).meets(detail::HostBox{mirror, mirror + detail::mirror_capacity_of(slot.strategy)})) {
            return {};
        }
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i].bytes > 0 && args[i].placement == Placement::Host &&
                detail::inside(args[i].data, detail::mirror_of(slot.strategy),
                               detail::mirror_capacity_of(slot.strategy))) {
                return detail::arg_in_own_mirror(i, args[i], index, backend_->name());
            }
        }
        return {};
    }

    // ---- finish, settle, release ----------------------------------------------------------

    Status check_run(const StagedRun& run) const noexcept {
        if (run.owner_ == static_cast<const detail::RunOwner*>(this)) return {};
        return detail::run_not_ours(run.owner_ == nullptr, backend_->name());
    }

    // Blocks until slot `index`'s pending work completed, then settles it.
    void settle(std::size_t index) noexcept {
        Slot& slot = slots_[index];
        settle_with(index, slot.fence.wait(async(), stats_));
    }

    // settle(), and an error when the work stays pending (its event could not be waited for,
    // on a backend without synchronize()): the slot's memory is then still in use.
    Status settle_fully(std::size_t index, const char* what) noexcept {
        Slot& slot = slots_[index];
        Status waited = slot.fence.wait(async(), stats_);
        settle_with(index, waited);
        if (!slot.fence.pending()) return {};
        return Status(waited.code(), with_backend(detail::message("stager ", what, ": the pending work of slot ", index,
                                                                  " could not be waited for: ", waited.message())));
    }

    // Settles slot `index` once its pending work is known complete (with `status`): frees what
    // waited for it, copies packed outputs to the callers, and hands the result to the
    // completions watching it (to the error sink when none does).
    void settle_with(std::size_t index, Status status) noexcept {
        Slot& slot = slots_[index];
        if (slot.fence.pending()) {
            // Not known complete: what waits for it stays held; the outputs are not delivered.
            slot.unpack = false;
            resolve_settled(index, status);
            return;
        }
        for (void* allocation : slot.deferred) {
            ++stats_.device_frees;
            if (Status freed = backend_->device_free(allocation); !freed) {
                ++stats_.free_failures;
                if (status.ok()) {
                    status = Status(freed.code(), with_backend(detail::message(
                                                      "stager: a deferred device_free failed: ", freed.message())));
                }
            }
        }
        slot.deferred.clear();
        if (slot.has_settle_after) settle_predecessors(index);
        if (slot.unpack && status.ok()) moves().unpack(slot);
        slot.unpack = false;
        slot.uses_mirror = false;
        resolve_settled(index, status);
    }

    // Settles the runs in flight that slot `index`'s run must be settled after (packed outputs
    // in finish order). They completed before it: its stream waited for them.
    void settle_predecessors(std::size_t index) noexcept {
        Slot& slot = slots_[index];
        slot.has_settle_after = false;
        for (std::size_t other = 0; other < slots_.size(); ++other) {
            const std::uint64_t generation = std::exchange(slot.settle_after[other], 0);
            if (generation != 0 && slots_[other].settled < generation) settle(other);
        }
    }

    // Hands `status` to the completions watching slot `index` (to the error sink when none does).
    void resolve_settled(std::size_t index, const Status& status) noexcept {
        Slot& slot = slots_[index];
        const std::uint64_t generation = slot.generation;
        const bool owed = slot.settled < generation;
        slot.settled = generation;
        const std::size_t watched = resolve(index, generation, status);
        if (!status.ok() && (watched == 0 || !owed)) sink_(status);
    }

    Status release_leases(Slot& slot) noexcept {
        Status first;
        if constexpr (!retained) {
            QueueContext context{this, static_cast<std::size_t>(&slot - slots_.data())};
            first = with_queue(slot, context, [&](FreeQueue<B>& queue) {
                Status status;
                for (TensorLease& lease : slot.leases()) {
                    if (lease.release_kind != ReleaseKind::Free || lease.allocation == nullptr) continue;
                    Status released = queue.free(lease.allocation);
                    lease.allocation = nullptr;
                    if (!released && status.ok()) {
                        status = Status(released.code(), detail::message("stager: releasing a lease of ", lease.bytes,
                                                                         " bytes: ", released.message()));
                    }
                }
                return status;
            });
        }
        slot.live = false;
        return first;
    }

    Status end_live_run(Slot& slot) noexcept {
        for (const TensorLease& lease : slot.leases()) {
            if (lease.release_kind != ReleaseKind::ExternalNoop) ++stats_.copy_backs_skipped;
        }
        Status recorded = slot.fence.record(async(), slot.bind_stream);  // the uploads complete before any free
        unlink_handle(slot);
        Status released = release_leases(slot);
        return recorded.ok() ? released : recorded;
    }

    void unlink_handle(Slot& slot) noexcept {
        if (slot.handle != nullptr) slot.handle->unlink();
        slot.handle = nullptr;
        slot.live = false;
    }

    // ---- RunOwner and CompletionOwner ------------------------------------------------------

    // A run dropped without finish: its leases are released once its uploads completed, before
    // the handle's destructor returns.
    void drop_run(std::size_t slot) noexcept override {
        Slot& s = slots_[slot];
        s.handle = nullptr;
        if (Status status = end_live_run(s); !status) sink_(status);
        settle(slot);
    }
    void relink_run(std::size_t slot, StagedRun* handle) noexcept override {
        slots_[slot].handle = handle;
    }

    void settle_completion(Completion& completion) noexcept override {
        settle(completion_slot(completion));
    }
    Result<bool> poll_completion(Completion& completion) noexcept override {
        const std::size_t index = completion_slot(completion);
        Result<bool> ready = slots_[index].fence.poll(async());
        if (ready && *ready) settle_with(index, Status());
        return ready;  // a failed query settles nothing: wait() then does
    }
    void settle_unwatched(std::size_t slot, std::uint64_t generation) noexcept override {
        if (slots_[slot].settled < generation) settle(slot);
    }
    void release_hold(std::size_t slot, std::uint64_t generation) noexcept override {
        if (slot < slots_.size() && slots_[slot].held_generation == generation) slots_[slot].held = false;
    }
    static std::size_t completion_slot(const Completion& completion) noexcept {
        return slot_of(completion);
    }

    // ---- slot choice -------------------------------------------------------------------------

    // The slot a bind of `args` (a frame: none) takes; see detail::choose_slot. A packed
    // bind does not take a slot whose mirror holds one of its args.
    std::optional<std::size_t> free_slot(std::span<const TensorArg> args) noexcept {
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
            [this, args](std::size_t i) {
                if constexpr (pack_limit > 0) {
                    return args.empty() || own_mirror(i, args).ok();
                } else {
                    (void)i;
                    return true;
                }
            });
    }

    SlotChoice pick_slot(std::span<const TensorArg> args) noexcept {
        bind_box_ready_ = false;
        if (slots_.empty()) return broken_;
        if constexpr (pack_limit > 0) {
            if (std::optional<SlotChoice> framed = framed_slot(args)) return *framed;
        }
        const std::optional<std::size_t> free = free_slot(args);
        if (!free) return busy("bind");
        return *free;
    }

    SlotChoice chosen_slot(std::size_t index, std::span<const TensorArg> args) noexcept {
        bind_box_ready_ = false;
        if (slots_.empty()) return broken_;
        if (index >= slots_.size()) return out_of_range("bind_slot", index);
        if constexpr (pack_limit > 0) {
            if (std::optional<SlotChoice> framed = framed_slot(args)) {
                if (*framed && **framed != index)
                    return detail::frame_of_another_slot(**framed, index, backend_->name());
                return *framed;
            }
        }
        const Slot& slot = slots_[index];
        if (slot.live || slot.framed || slot.held)
            return detail::slot_busy(index, slot.live, slot.framed, backend_->name());
        return index;
    }

    SlotChoice frame_slot(const HostFrame& frame) noexcept {
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
    std::optional<SlotChoice> framed_slot(std::span<const TensorArg> args) noexcept {
        return detail::find_frame(std::span<const Slot>(slots_), args, backend_->name());
    }

    // ---- helpers -----------------------------------------------------------------------------

    Result<Stream> synchronous_stream() noexcept {
        if constexpr (immediate) {
            return Stream{};
        } else {
            if (!own_stream_) {
                Result<Stream> created = async().create_stream();
                if (!created) {
                    return Status(created.status().code(),
                                  with_backend(detail::message("stager: creating its stream failed: ",
                                                               created.status().message())));
                }
                own_stream_ = *created;
            }
            return *own_stream_;
        }
    }

    Moves moves() noexcept {
        if constexpr (PinnedHostBackend<B>) {
            return Moves(*backend_, async(), stats_, ring_.get(), ring_threshold_);
        } else {
            return Moves(*backend_, async(), stats_, nullptr, ring_threshold_);
        }
    }
    std::string with_backend(std::string_view message) const {
        return detail::on_backend(message, backend_->name());
    }
    Status busy(const char* what) const noexcept {
        return detail::all_slots_busy(what, slots_.size(), backend_->name());
    }
    Status out_of_range(const char* what, std::size_t slot) const noexcept {
        return detail::slot_out_of_range(what, slot, slots_.size(), backend_->name());
    }

    struct NoRing {
        explicit operator bool() const noexcept { return false; }
    };
    using Ring = std::conditional_t<PinnedHostBackend<B>, std::unique_ptr<detail::PinnedRing<B, Async>>, NoRing>;

    B* backend_;
    [[no_unique_address]] Adapter async_;
    Ring ring_{};
    std::size_t ring_threshold_ = std::numeric_limits<std::size_t>::max();  // max: no ring
    std::vector<Slot> slots_;
    StagerStats stats_;
    ErrorSink sink_;
    std::optional<Stream> own_stream_;
    std::uint64_t ticks_ = 0;
    Status broken_;  // why the stager has no slot
    detail::HostBox bind_box_;
    bool bind_box_ready_ = false;
};

}  // namespace devstage
