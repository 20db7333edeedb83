// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Stager: stages a run's host tensors on the device through a strategy, hands back device
/// pointers and leases, and at the end of the run copies back what it must and releases exactly
/// what it owns — synchronously, or on the caller's stream (one path: a synchronous backend is
/// seen through SynchronousAdapter). The run lifecycle reads here top to bottom; its steps are
/// the components of detail/stager/ (docs/design.md), a slot's life detail/stager/slot_state.hpp.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/completion.hpp"
#include "devstage/detail/stager/bind.hpp"
#include "devstage/detail/stager/core.hpp"
#include "devstage/detail/stager/finish.hpp"
#include "devstage/detail/stager/release.hpp"
#include "devstage/detail/stager/select.hpp"
#include "devstage/detail/stager/settle.hpp"
#include "devstage/detail/stager/stream_check.hpp"
#include "devstage/frame.hpp"
#include "devstage/host_copy.hpp"
#include "devstage/output_policy.hpp"
#include "devstage/pageable.hpp"
#include "devstage/region.hpp"
#include "devstage/run.hpp"
#include "devstage/stager_options.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/stream.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// Stages runs for one runner on one backend. `Stager<SimBackend> stager(sim); auto run = stager.bind(args);`
///
/// Synchronous: `bind(args)` returns once the uploads are done, `finish(run)` once the outputs
/// are in host memory. Stream-ordered: `bind(args, stream)` and `finish(run, stream)` enqueue
/// them, the latter returning a Completion. Each pipeline slot has its own strategy instance;
/// a slot is reused in stream order, and memory pending work may touch is freed once it
/// completed. The backend must outlive the stager. Not thread-safe: one runner drives it.
template <Backend B, class Strategy = RetainedBump<>>
class Stager final : private detail::RunOwner, private detail::CompletionOwner, private detail::FrameOwner {
    static_assert(detail::strategy_complete<Strategy, B>());
    static_assert(detail::streams_complete<B>());
    using Core = detail::StagerCore<B, Strategy>;
    using Slot = typename Core::Slot;
    using Choice = Result<std::size_t>;
    static constexpr bool mirrored = Core::mirrored;

public:
    using Async = stream_backend_t<B>;  ///< the stream-ordered view: B, or SynchronousAdapter<B>
    using Stream = typename Async::Stream;
    static constexpr std::size_t max_pipeline_slots = 256;

    /// A stager configured by `options` (unset ones take the strategy's defaults). Options it
    /// cannot honour (too many slots, packing without a mirror or pinned memory, a growth rule
    /// the strategy does not take) or host memory short for the slots leave a stager with no
    /// slot whose every call returns why (status() tells at once).
    explicit Stager(B& backend, Strategy strategy = {}, StagerOptions options = {}) noexcept : core_(backend) {
        core_.completions = this;
        core_.configure(options, std::move(strategy), max_pipeline_slots);
    }
    /// `Stager(backend, strategy, slots)`: StagerOptions{.pipeline_slots = slots}.
    Stager(B& backend, Strategy strategy, std::size_t pipeline_slots) noexcept
        : Stager(backend, std::move(strategy), StagerOptions{.pipeline_slots = pipeline_slots}) {}
    Stager(const Stager&) = delete;
    Stager& operator=(const Stager&) = delete;
    /// Waits for pending work, ends runs and frames, frees everything. Failures go to the sink.
    ~Stager();

    // ---- the run lifecycle --------------------------------------------------------------

    /// Plans, grows if needed, takes device memory for every staged arg and uploads In/InOut
    /// args; returns once they are on the device. On failure everything taken is released. A
    /// free slot is taken, least recently used first (busy when none is). A run sharing host
    /// memory with a run in flight is ordered after it (docs/async.md); busy against a live one.
    Result<StagedRun> bind(std::span<const TensorArg> args) noexcept {
        return bind_synchronously(select().pick(args), args);
    }
    /// As bind(args), on the slot the caller chooses (invalid_argument out of range, busy held).
    Result<StagedRun> bind_slot(std::size_t slot, std::span<const TensorArg> args) noexcept {
        return bind_synchronously(select().chosen(slot, args), args);
    }
    /// Binds a frame from frame() (uploads its In/InOut bytes with one copy).
    Result<StagedRun> bind(const HostFrame& frame) noexcept {
        return bind_synchronously(frame_slot(frame), frame.args());
    }

    /// Enqueues the uploads on `stream`: the device args are valid for work enqueued there after
    /// this call. In args' host memory must not change until the run's Completion is ready.
    Result<StagedRun> bind(std::span<const TensorArg> args, Stream stream) noexcept {
        return bind_on(select().pick(args), args, stream);
    }
    Result<StagedRun> bind_slot(std::size_t slot, std::span<const TensorArg> args, Stream stream) noexcept {
        return bind_on(select().chosen(slot, args), args, stream);
    }
    Result<StagedRun> bind(const HostFrame& frame, Stream stream) noexcept {
        return bind_on(frame_slot(frame), frame.args(), stream);
    }

    /// Work enqueued on `stream` after this call runs after the live `run`'s bind (its uploads and
    /// waits; the host does not wait): uploads on a copy stream, the kernel on a compute stream.
    /// No-op on the bind's stream. On error the run stays live.
    Status order_after_uploads(const StagedRun& run, Stream stream) noexcept {
        if (Status valid = check_run(run, "order_after_uploads"); !valid) return valid;
        return detail::Finisher<B, Strategy>(core_).order_after_uploads(RunOwner::slot_of(run), stream);
    }

    /// Ends a run: copies back Out/InOut args when `execution` is ok, releases every lease by
    /// its kind, and returns the first error of its own copy-backs and releases (not `execution`).
    /// The kernel must have completed. A run of another stager, or no longer live, is
    /// invalid_argument and left untouched. Without the stager's own stream (its creation
    /// failed) the run ends without copy-backs and that failure is returned.
    Status finish(StagedRun&& run, const Status& execution = {}) noexcept {
        if (Status valid = check_run(run); !valid) return valid;
        Result<Stream> stream = core_.synchronous_stream();
        if (!stream) {  // the run ends, without copy-backs
            const std::size_t index = RunOwner::slot_of(run);
            if (Status ended = end_live_run(index); !ended) core_.sink(ended);
            settler().settle(index);
            return stream.status();
        }
        Result<Completion> done = finish(std::move(run), *stream, execution);
        return done ? done->wait() : done.status();
    }

    /// Enqueues the run's copy-backs on `stream` (after the work the caller enqueued there: its
    /// kernel), records the slot's event and returns the run's Completion; Out/InOut host data
    /// is valid once its wait() returned ok. On another stream than the bind's, `stream` first
    /// waits for the bind's. An error at the call (nothing could be enqueued, or a copy-back was
    /// refused) is returned after waiting for what was enqueued; such a run's outputs are never
    /// delivered, and its host memory is the engine's again (docs/async.md).
    Result<Completion> finish(StagedRun&& run, Stream stream, const Status& execution = {}) noexcept;

    // ---- inputs written in place --------------------------------------------------------

    /// The pinned mirror of a free slot, settled (host_waits counts a wait), laid out for `shapes`
    /// with every tensor packed: write the inputs into `host(i)`, then bind the frame, which owns
    /// the slot until then (see HostFrame). Busy when every slot is held; invalid_argument for
    /// no shapes; not_supported with pack limit 0.
    Result<HostFrame> frame(std::span<const TensorShape> shapes) noexcept requires mirrored {
        Result<std::size_t> index = detail::Binder<B, Strategy>(core_).lay_out_frame(shapes);
        if (!index) return index.status();
        Slot& slot = core_.slots[*index];
        FrameOwner::retire_frames(*index, slot.frames.generation);
        slot.go(detail::SlotEvent::hand_out_frame);
        return FrameOwner::make_frame(*index, slot.frames.generation, slot.frames.frame());
    }

    // ---- growth control and buffer ownership --------------------------------------------

    /// Grows every slot (and mirror) to at least `bytes` now, after waiting for pending work, so
    /// later runs up to that size never move device addresses (captured graphs). Busy while a run
    /// is live or a frame unbound or held; a slot that fails to grow keeps what it held. Unless
    /// busy, frames of runs that ended become inert: a grown mirror moves.
    Status reserve(std::size_t bytes) noexcept requires(Strategy::lease_kind == ReleaseKind::BufferNoop) {
        Status reserved = detail::Binder<B, Strategy>(core_).reserve(bytes);
        if (reserved.code() != Errc::busy) FrameOwner::retire_all_frames();
        return reserved;
    }

    /// Takes ownership of a device buffer allocated elsewhere as slot `slot`'s retained buffer
    /// (an empty slot with no run; a later grow or release frees it).
    Status adopt(std::size_t slot, void* allocation,
                 std::size_t bytes) noexcept requires strategy_requires::adopt<Strategy, B> {
        return detail::Releaser<B, Strategy>(core_).adopt(slot, allocation, bytes);
    }
    /// Hands slot `slot`'s retained buffer to the caller without freeing it (after waiting for
    /// pending work that uses it); the slot is empty afterwards.
    Result<RetainedBuffer> detach(std::size_t slot) noexcept requires strategy_requires::detach<Strategy> {
        return detail::Releaser<B, Strategy>(core_).detach(slot);
    }

    /// Gives back all device memory now, after pending work: ends live runs (no copy-back, the
    /// handles inert), frees every buffer and mirror; frames become inert. Busy, naming the
    /// slots, and nothing changed while a frame is unbound or held by its run's Completion. A slot
    /// whose work cannot be waited for keeps its memory (the failure returned; retry later).
    Status release() noexcept {
        if (Status held = detail::Releaser<B, Strategy>(core_).frames_held(); !held) return held;
        Status first;
        for (std::size_t index = 0; index < core_.slots.size(); ++index) {
            if (!core_.slots[index].bound()) continue;
            Status ended = end_live_run(index);
            if (first.ok()) first = std::move(ended);
        }
        Status freed = detail::Releaser<B, Strategy>(core_).release_memory();
        FrameOwner::retire_all_frames();
        return first.ok() ? freed : first;
    }

    /// Forgets all device memory, pending work, events and its stream without calling the backend
    /// (after a device reset): runs and frames become inert, watched Completions resolve with
    /// backend_failure. The stager stays usable.
    void abandon() noexcept {
        for (Slot& slot : core_.slots) unlink_handle(slot);
        FrameOwner::retire_all_frames();
        detail::Releaser<B, Strategy>(core_).forget();
        resolve_all(Status(Errc::backend_failure, "stager abandon: the run's pending work was forgotten"));
    }

    // ---- pageable args through a pinned ring ----------------------------------------------

    /// From now on, staged args of at least `ring.threshold` bytes in pageable host memory (as
    /// TensorArg::memory says, else the backend's `is_pinned`, else assumed) move through a ring
    /// of pinned chunks filled by host threads (`pool`, which must outlive the stager, else the
    /// stager's own) while the copy engine drains the previous one. Busy while a run is live.
    Status set_pageable_ring(const PageableRing& ring,
                             HostCopyPool* pool = nullptr) noexcept requires PinnedHostBackend<B> {
        return detail::Releaser<B, Strategy>(core_).set_ring(ring, pool);
    }
    /// Stops staging through the ring and frees it once its copies completed (chunks whose
    /// copies cannot be waited for are kept, the failure returned).
    Status clear_pageable_ring() noexcept requires PinnedHostBackend<B> {
        return detail::Releaser<B, Strategy>(core_).clear_ring();
    }

    // ---- regions for transfer engines (each call's rules: docs/staging.md) ---------------

    /// Each slot's retained device buffer (RegionKind::device) and pinned mirror, as they are now.
    std::vector<PinnedRegion> regions() const { return detail::RegionBook::list(core_.slots); }
    /// `added` for every region listed now and each one made later, before anything is staged
    /// in it; `removing` before one is freed, moved, released, detached, forgotten or left by the
    /// destructor. Hooks run in the thread driving the stager and must not call it.
    Status set_region_hooks(RegionHooks hooks) noexcept {
        return core_.regions.set_hooks(core_.slots, std::move(hooks));
    }
    /// The slice of a region `pointer` lies in (a frame's host(i), a run's device args); else nullopt.
    std::optional<RegionSlice> describe(const void* pointer) const noexcept {
        return detail::RegionBook::describe(core_.slots, pointer);
    }

    // ---- outputs and inspection -----------------------------------------------------------

    /// What binds do with Out args' device bytes (StagerOptions::outputs), from the next bind.
    void set_output_policy(OutputPolicy policy) noexcept { core_.outputs = policy; }
    OutputPolicy output_policy() const noexcept { return core_.outputs; }
    /// The pack limit and mapping the stager runs with (StagerOptions::pack_limit, map_small).
    std::size_t pack_limit() const noexcept { return core_.pack_limit; }
    bool maps_small() const noexcept { return core_.map_small; }

    const StagerStats& stats() const noexcept { return core_.stats; }
    /// Ok, or why the stager has no slot (see the constructor).
    const Status& status() const noexcept { return core_.broken; }
    /// The strategy instance of one pipeline slot (its retained buffer, for inspection).
    const Strategy& strategy(std::size_t slot = 0) const noexcept { return core_.slots[slot].strategy; }
    std::size_t pipeline_slots() const noexcept { return core_.slots.size(); }
    std::size_t live_runs() const noexcept { return core_.live_runs(); }
    B& backend() const noexcept { return *core_.backend; }
    /// Host memory for per-arg state (to the largest run; given back by release()).
    std::size_t bookkeeping_bytes() const noexcept { return core_.bookkeeping_bytes(); }
    /// Where failures with no caller to return to (a dropped run, an unwatched Completion) go.
    void set_error_sink(ErrorSink sink) noexcept { core_.sink = sink; }

private:
    detail::Settler<B, Strategy> settler() noexcept { return detail::Settler<B, Strategy>(core_); }
    detail::SlotSelect<B, Strategy> select() noexcept { return detail::SlotSelect<B, Strategy>(core_); }

    Result<StagedRun> bind_synchronously(Choice choice, std::span<const TensorArg> args) noexcept;
    Result<StagedRun> bind_on(Choice choice, std::span<const TensorArg> args, Stream stream) noexcept;
    Choice frame_slot(const HostFrame& frame) noexcept {
        const bool ours = FrameOwner::ours(frame, this);
        return select().of_frame(frame, ours, FrameOwner::slot_of(frame), FrameOwner::generation_of(frame));
    }
    Status check_run(const StagedRun& run, const char* what = "finish") const noexcept {
        if (RunOwner::ours(run)) return {};
        return detail::run_not_ours(what, RunOwner::dead(run), core_.backend->name());
    }
    // Ends slot `index`'s live run without a finish: its handle becomes inert.
    Status end_live_run(std::size_t index) noexcept {
        unlink_handle(core_.slots[index]);
        return detail::Finisher<B, Strategy>(core_).end_run(index);
    }
    void unlink_handle(Slot& slot) noexcept {
        if (slot.handle != nullptr) RunOwner::unlink(*slot.handle);
        slot.handle = nullptr;
    }

    // ---- RunOwner, CompletionOwner and FrameOwner ---------------------------------------------
    void drop_run(std::size_t slot) noexcept override {
        core_.slots[slot].handle = nullptr;
        detail::Finisher<B, Strategy>(core_).drop(slot);
    }
    void relink_run(std::size_t slot, StagedRun* handle) noexcept override { core_.slots[slot].handle = handle; }
    Status settle_completion(Completion& completion) noexcept override {
        return settler().settle_fully(CompletionOwner::slot_of(completion), "wait");
    }
    Result<bool> poll_completion(Completion& completion) noexcept override {
        return settler().poll(CompletionOwner::slot_of(completion));
    }
    void settle_unwatched(std::size_t slot, std::uint64_t gen) noexcept override {
        settler().settle_through(slot, gen);
    }
    void release_hold(std::size_t slot, std::uint64_t gen) noexcept override { core_.slots[slot].end_hold(gen); }
    void drop_frame(std::size_t slot, std::uint64_t gen) noexcept override { core_.slots[slot].drop_frame(gen); }

    Core core_;
};

// ---- destruction -----------------------------------------------------------------------------

template <Backend B, class Strategy>
Stager<B, Strategy>::~Stager() {
    for (Slot& slot : core_.slots) slot.end_frames();  // frames end with the stager: inert
    FrameOwner::retire_all_frames();
    if (Status status = release(); !status) core_.sink(status);
    for (Slot& slot : core_.slots) core_.regions.remove(slot.regions, true, true);  // what release kept
    resolve_all(detail::Releaser<B, Strategy>(core_).close());                      // runs still pending end unsettled
}

// ---- bind ------------------------------------------------------------------------------------

// A synchronous bind: the slot (or why none), the stager's own stream, then the host waits.
template <Backend B, class Strategy>
Result<StagedRun> Stager<B, Strategy>::bind_synchronously(Choice choice, std::span<const TensorArg> args) noexcept {
    if (!choice) return choice.status();
    Result<Stream> stream = core_.synchronous_stream();
    if (!stream) return stream.status();
    Result<StagedRun> run = bind_on(std::move(choice), args, *stream);
    if (!run || Core::immediate) return run;
    if (Status drained = detail::Binder<B, Strategy>(core_).drain(RunOwner::slot_of(*run), *stream); !drained) {
        run = drained;  // the run, dropped, ends
    }
    return run;
}

// The run lifecycle's first half: the slot made ready on `stream` (ordered after its pending
// work), its earlier run carried, the run staged (planned, ordered after the runs in flight it
// shares host memory with, the slot grown, slices taken, uploads enqueued, Outs zeroed), then
// live: uploading until the host waits for its uploads (or live at once, with none pending).
template <Backend B, class Strategy>
Result<StagedRun> Stager<B, Strategy>::bind_on(Choice choice, std::span<const TensorArg> args, Stream stream) noexcept {
    if (!choice) return choice.status();
    if (Status checked = detail::check_stream(*core_.backend, stream, "bind"); !checked) return checked;
    const std::size_t index = *choice;
    Slot& slot = core_.slots[index];
    const bool frame = slot.state == detail::SlotState::framed && slot.frames.is(args);
    detail::Binder<B, Strategy> binder(core_);
    if (Status ready = binder.make_ready(index, stream, frame || core_.pack_limit > 0); !ready) return ready;
    if (Status sized = slot.run.size_for(args.size()); !sized) return sized;
    if (core_.slots.size() > 1 || core_.pack_limit > 0 || core_.ring) detail::Hazards<B, Strategy>(core_).carry(slot);
    if (mirrored && core_.pack_limit > 0) FrameOwner::retire_frames(index, frame ? slot.frames.generation : 0);
    bool enqueued = false;
    if (Status staged = binder.stage(index, args, stream, frame, enqueued); !staged) {
        slot.run.lease_count = 0;  // nothing of it is held: the leases describe no run
        return staged;             // a frame stays unbound, to bind again
    }
    binder.went_live(index, stream, frame, enqueued);
    return RunOwner::make_run(index, {slot.run.device_args.data(), args.size()}, slot.run.leases());
}

// ---- finish ----------------------------------------------------------------------------------

// The run lifecycle's second half: ordered after the bind (and its kernels' streams), the
// copy-backs enqueued, the slot's event recorded, then the slot's next state — a failed
// finish drops its outputs, a frame's run holds its frame, packed outputs wait for delivery —
// the Completion linked before the leases go back (a release that waits settles this run).
template <Backend B, class Strategy>
Result<Completion> Stager<B, Strategy>::finish(StagedRun&& run, Stream stream, const Status& execution) noexcept {
    if (Status valid = check_run(run); !valid) return valid;
    if (Status checked = detail::check_stream(*core_.backend, stream, "finish"); !checked) return checked;
    const std::size_t index = RunOwner::slot_of(run);
    Slot& slot = core_.slots[index];
    detail::Finisher<B, Strategy> finisher(core_);
    Stream fenced = stream;
    Status first = finisher.order_after_bind(index, stream, fenced);
    const bool deliver = finisher.copy_backs(index, stream, execution, first);
    if (Status recorded = slot.fence.record(core_.async(), fenced); !recorded && first.ok()) first = recorded;
    ++slot.generation;
    const bool frame = slot.run.frame();
    slot.go(detail::finish_event(!first.ok(), frame, deliver));
    Completion completion;
    if (first.ok()) {
        link(completion, index, slot.generation, frame);  // a frame's run holds the frame
        slot.held_generation = slot.generation;
    }
    Status released = finisher.release_leases(index);
    unlink_handle(slot);
    if (!first.ok() || !released.ok()) {
        settler().settle(index);  // what was enqueued completes before the error is returned
        if (!first.ok()) return first;
        if (Status work = completion.wait(); !work) core_.sink(work);  // the run's own failure, too
        return released;
    }
    return completion;
}

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
