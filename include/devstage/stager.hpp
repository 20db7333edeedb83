// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Stager: stages a run's host tensors on the device through a strategy, hands back device
/// pointers and leases, and at the end of the run copies back what it must and releases
/// exactly what it owns — synchronously, or enqueued on the caller's stream. Both go through
/// one path: a synchronous backend is seen through SynchronousAdapter, whose stream is
/// immediate.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

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
#include "devstage/detail/schedule/slot_fence.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/stager/slot.hpp"
#include "devstage/detail/transfer/transfers.hpp"
#include "devstage/detail/transfer/zero_outputs.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/frame.hpp"
#include "devstage/lease.hpp"
#include "devstage/output_policy.hpp"
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
    explicit Stager(B& backend, Strategy strategy = {}, std::size_t pipeline_slots = 1) noexcept;
    Stager(const Stager&) = delete;
    Stager& operator=(const Stager&) = delete;
    /// Waits for pending work, releases a live run and every retained buffer, destroys the
    /// stager's events and stream. Failures go to the error sink.
    ~Stager();

    // ---- the run lifecycle --------------------------------------------------------------

    /// Plans, grows if needed, takes device memory for every staged arg and uploads In/InOut
    /// args; returns once they are on the device. On failure everything taken is released and
    /// the stager is ready for the next bind. A free slot is taken, least recently used first
    /// (busy when none is). A run whose host memory a run still in flight writes, or reads
    /// while this one writes it, is ordered after that run (see docs/async.md); busy when that
    /// run is live (bound, not finished) and will still write it.
    Result<StagedRun> bind(std::span<const TensorArg> args) noexcept {
        return bind_synchronously(pick_slot(args), args);
    }
    /// As bind(args), on the slot the caller chooses (invalid_argument out of range, busy when
    /// it holds a live run, an unbound frame or a frame whose run's Completion is held).
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

    /// Work enqueued on `stream` after this call runs after the live `run`'s bind: its uploads
    /// and the waits it made for earlier work on the slot's memory (an event on the bind's
    /// stream and a stream wait; the host does not wait). Uploads on a copy stream, the kernel
    /// on a compute stream. No-op on the bind's stream. On error the run stays live.
    Status order_after_uploads(const StagedRun& run, Stream stream) noexcept;

    /// Ends a run: copies back Out/InOut args when `execution` is ok, releases every lease by
    /// its kind, and returns the first error of its own copy-backs and releases (it does not
    /// echo `execution`). The kernel must have completed before this call. A run of another
    /// stager, or one no longer live, is invalid_argument and is left untouched. When the
    /// stager's own stream cannot be created, the run ends without copy-backs (its leases are
    /// released) and that failure is returned.
    Status finish(StagedRun&& run, const Status& execution = {}) noexcept;

    /// Enqueues the run's copy-backs on `stream` (after the work the caller enqueued there: its
    /// kernel), records the slot's event and returns the run's Completion; Out/InOut host data
    /// is valid once the Completion's wait() returned ok. On another stream than the bind's,
    /// `stream` first waits for the bind's. An error at the call (nothing could be enqueued, or
    /// a copy-back was refused) is returned after waiting for what was enqueued.
    Result<Completion> finish(StagedRun&& run, Stream stream, const Status& execution = {}) noexcept;

    // ---- inputs written in place --------------------------------------------------------

    /// The pinned mirror of a slot that no pending work still reads or writes (waiting,
    /// counted in host_waits, if none is), laid out for `shapes` with every tensor packed; the
    /// caller writes its inputs into `host(i)`, then binds the frame (or `frame->args()`) on
    /// that slot. The frame (its host(i) views, and the outputs copied back into them) belongs
    /// to the caller until its run's Completion is destroyed or detached: no frame() or bind()
    /// takes its slot before. Busy when every slot holds a live run, an unbound frame or such a
    /// held frame; invalid_argument for no shapes. Needs a packing strategy (RetainedBump with
    /// PackSmall).
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
        if (Status settled = settle_mirror_users(index, "frame"); !settled) return settled;
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
    Status reserve(std::size_t bytes) noexcept requires(Strategy::lease_kind == ReleaseKind::BufferNoop);

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
    Status release() noexcept;

    /// Forgets all device memory, pending work, events and the stager's own stream without
    /// calling the backend, for after a device reset invalidated them. Live run handles become
    /// inert; Completions still watched resolve with backend_failure. The stager stays usable.
    void abandon() noexcept;

    // ---- pageable args through a pinned ring ----------------------------------------------

    /// From now on, staged args of at least `ring.threshold` bytes in pageable host memory move
    /// through a ring of `ring.chunks` pinned chunks of `ring.chunk_bytes`, filled and emptied by
    /// host threads (the engine's `pool` when given, else `ring.threads` threads the stager
    /// starts once) while the copy engine drains the previous chunk. An arg's memory is pageable
    /// when its TensorArg says so, else when the backend's `is_pinned` query (if it has one)
    /// says it is not pinned, else it is assumed pageable. The chunks are allocated at first
    /// use; busy while a run is live. An engine's pool is only pointed to: it must outlive this
    /// stager (declare it first). See docs/staging.md for when it pays.
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

    // ---- outputs ------------------------------------------------------------------------

    /// What binds do with the device bytes of Out args: OutputPolicy::zero (the default) sets
    /// them to zero on the bind's stream (StagerStats::zeroing_calls); kernel_writes_all leaves
    /// them. Takes effect at the next bind.
    void set_output_policy(OutputPolicy policy) noexcept {
        outputs_ = policy;
    }
    OutputPolicy output_policy() const noexcept {
        return outputs_;
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
    Result<StagedRun> bind_synchronously(SlotChoice choice, std::span<const TensorArg> args) noexcept;
    Result<StagedRun> bind_and_drain(SlotChoice choice, std::span<const TensorArg> args, Stream stream) noexcept;
    Result<StagedRun> bind_on(SlotChoice choice, std::span<const TensorArg> args, Stream stream) noexcept;
    Result<StagedRun> bound(std::size_t index, std::size_t count, Stream stream, bool enqueued) noexcept;
    Status failed_bind(Slot& slot, Stream stream, bool enqueued, Status failure) noexcept;
    Status make_ready(std::size_t index, Stream stream, bool host_writes_mirror) noexcept;
    Status grow(std::size_t index, const StagingLayout& layout, bool keep = false) noexcept;
    Status settle_mirror_users(std::size_t index, const char* what) noexcept;
    bool uses_range(Slot& slot, const detail::HostBox& range) noexcept;

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
    static Status settle_for_queue(void* context) noexcept;

    // ---- host hazards between runs in flight (the rules: detail/schedule/run_order.hpp) -------------
    Status order_after_in_flight(std::size_t index, std::span<const TensorArg> args, Stream stream,
                                 bool frame) noexcept;
    Status order_after(std::size_t index, std::size_t other, const detail::Conflict& conflict,
                       std::span<const TensorArg> args, Stream stream) noexcept;
    void new_touch(const TensorArg& arg, bool frame, detail::Touch& read, detail::Touch& write) const noexcept;
    static void old_touch(const Slot& slot, const TensorLease& lease, detail::Touch& read,
                          detail::Touch& write) noexcept;
    detail::Conflict carried_conflict(const Slot& slot, std::span<const TensorArg> args, bool frame) noexcept;
    static void carry(Slot& slot) noexcept;
    const detail::HostBox& bind_box(std::span<const TensorArg> args) noexcept;
    Status own_mirror(std::size_t index, std::span<const TensorArg> args) noexcept;

    // ---- finish, settle, release ----------------------------------------------------------
    Status check_run(const StagedRun& run, const char* what = "finish") const noexcept;
    Status join_kernel_streams(Slot& slot, Stream stream) noexcept;
    void settle(std::size_t index) noexcept;
    Status settle_fully(std::size_t index, const char* what) noexcept;
    Status settle_with(std::size_t index, Status status) noexcept;
    Status settle_predecessors(std::size_t index) noexcept;
    void resolve_settled(std::size_t index, const Status& status) noexcept;
    Status release_leases(Slot& slot) noexcept;
    Status end_live_run(Slot& slot) noexcept;
    void unlink_handle(Slot& slot) noexcept;

    // ---- RunOwner and CompletionOwner ------------------------------------------------------
    void drop_run(std::size_t slot) noexcept override;
    void relink_run(std::size_t slot, StagedRun* handle) noexcept override;
    Status settle_completion(Completion& completion) noexcept override;
    Result<bool> poll_completion(Completion& completion) noexcept override;
    void settle_unwatched(std::size_t slot, std::uint64_t generation) noexcept override;
    void release_hold(std::size_t slot, std::uint64_t generation) noexcept override;
    static std::size_t completion_slot(const Completion& completion) noexcept {
        return slot_of(completion);
    }

    // ---- slot choice (detail/stager/order.hpp) ------------------------------------------------
    std::optional<std::size_t> free_slot(std::span<const TensorArg> args) noexcept;
    SlotChoice pick_slot(std::span<const TensorArg> args) noexcept;
    SlotChoice chosen_slot(std::size_t index, std::span<const TensorArg> args) noexcept;
    SlotChoice frame_slot(const HostFrame& frame) noexcept;
    std::optional<SlotChoice> framed_slot(std::span<const TensorArg> args) noexcept;

    // ---- helpers -----------------------------------------------------------------------------
    Result<Stream> synchronous_stream() noexcept;

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
    OutputPolicy outputs_ = OutputPolicy::zero;
};

}  // namespace devstage

#include "devstage/detail/stager/bind.hpp"    // IWYU pragma: export
#include "devstage/detail/stager/order.hpp"   // IWYU pragma: export
#include "devstage/detail/stager/settle.hpp"  // IWYU pragma: export

#endif  // DEVSTAGE_CXX20
