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
#include <string>
#include <type_traits>
#include <span>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/completion.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/detail/slot_fence.hpp"
#include "devstage/frame.hpp"
#include "devstage/lease.hpp"
#include "devstage/pageable.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/stream.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

class StagedRun;

namespace detail {
/// What a StagedRun calls back into; implemented by every Stager.
class RunOwner {
public:
    virtual void drop_run(std::size_t slot) noexcept = 0;
    virtual void relink_run(std::size_t slot, StagedRun* handle) noexcept = 0;

protected:
    RunOwner() = default;
    RunOwner(const RunOwner&) = default;
    RunOwner& operator=(const RunOwner&) = default;
    ~RunOwner() = default;
};

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

/// The packing limit of a strategy (0 when it does not pack).
template <class S>
constexpr std::size_t pack_limit_of() noexcept {
    if constexpr (requires { S::packing::limit; }) {
        return S::packing::limit;
    } else {
        return 0;
    }
}
}  // namespace detail

/// A live run: the device view of its args and the leases that back them. Move-only.
/// `auto run = stager.bind(args); launch(run->device_args()); (void)stager.finish(std::move(*run));`
/// Destroyed without finish, it releases its leases without copying back. Once its stager
/// finished, released or abandoned it, the handle is inert.
class StagedRun {
public:
    StagedRun(StagedRun&& other) noexcept { take(other); }
    StagedRun& operator=(StagedRun&& other) noexcept {
        if (this != &other) {
            reset();
            take(other);
        }
        return *this;
    }
    StagedRun(const StagedRun&) = delete;
    StagedRun& operator=(const StagedRun&) = delete;
    ~StagedRun() { reset(); }

    /// The args in input order: staged ones point at device memory (Placement::Device),
    /// Device args are unchanged, zero-byte args have a null pointer.
    std::span<const TensorArg> device_args() const noexcept { return device_args_; }
    /// One lease per staged arg and per Device arg with bytes, in input order.
    std::span<const TensorLease> leases() const noexcept { return leases_; }
    /// False once finished, dropped by its stager, or moved from.
    bool live() const noexcept { return owner_ != nullptr; }
    /// The pipeline slot the run is bound on.
    std::size_t slot() const noexcept { return slot_; }

private:
    template <Backend, class>
    friend class Stager;

    StagedRun(detail::RunOwner* owner, std::size_t slot, std::span<const TensorArg> device_args,
              std::span<const TensorLease> leases) noexcept
        : owner_(owner), slot_(slot), device_args_(device_args), leases_(leases) {
        owner_->relink_run(slot_, this);
    }

    void take(StagedRun& other) noexcept {
        owner_ = std::exchange(other.owner_, nullptr);
        slot_ = other.slot_;
        device_args_ = std::exchange(other.device_args_, {});
        leases_ = std::exchange(other.leases_, {});
        if (owner_ != nullptr) owner_->relink_run(slot_, this);
    }
    void reset() noexcept {
        if (detail::RunOwner* owner = std::exchange(owner_, nullptr)) owner->drop_run(slot_);
        device_args_ = {};
        leases_ = {};
    }
    void unlink() noexcept {
        owner_ = nullptr;
        device_args_ = {};
        leases_ = {};
    }

    detail::RunOwner* owner_ = nullptr;
    std::size_t slot_ = 0;
    std::span<const TensorArg> device_args_;
    std::span<const TensorLease> leases_;
};

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
    static_assert(StagingStrategy<Strategy, B>, "the strategy does not model devstage::StagingStrategy for this backend");
    static_assert(detail::streams_complete<B>());

public:
    /// The stream-ordered view of the backend: B itself, or SynchronousAdapter<B>.
    using Async = stream_backend_t<B>;
    using Stream = typename Async::Stream;

    explicit Stager(B& backend, Strategy strategy = {}, std::size_t pipeline_slots = 1)
        : backend_(&backend), async_(backend) {
        slots_.reserve(std::max<std::size_t>(pipeline_slots, 1));
        for (std::size_t i = 1; i < pipeline_slots; ++i) slots_.emplace_back(Strategy(strategy));
        slots_.emplace_back(std::move(strategy));
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
        Result<Stream> stream = synchronous_stream();
        if (!stream) return stream.status();
        return bind_and_drain(pick_slot(args), args, *stream);
    }
    /// As bind(args), on the slot the caller chooses (invalid_argument out of range, busy when
    /// it holds a live run or an unbound frame).
    Result<StagedRun> bind_slot(std::size_t slot, std::span<const TensorArg> args) noexcept {
        Result<Stream> stream = synchronous_stream();
        if (!stream) return stream.status();
        return bind_and_drain(chosen_slot(slot, args), args, *stream);
    }
    /// Binds a frame from frame() (uploads its In/InOut bytes with one copy).
    Result<StagedRun> bind(const HostFrame& frame) noexcept {
        Result<Stream> stream = synchronous_stream();
        if (!stream) return stream.status();
        return bind_and_drain(frame_slot(frame), frame.args(), *stream);
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
    /// stager, or one no longer live, is invalid_argument and is left untouched.
    Status finish(StagedRun&& run, const Status& execution = {}) noexcept {
        Result<Stream> stream = synchronous_stream();
        if (!stream) return stream.status();
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
        CopyBacks backs;
        if (execution.ok() && first.ok()) {
            backs = ring_threshold_ == std::numeric_limits<std::size_t>::max() ? copy_back<false>(slot, stream, first)
                                                                               : copy_back<true>(slot, stream, first);
        }
        const std::uint64_t wanted = backs.calls + backs.failed + backs.packed;
        std::uint64_t copied = backs.bytes, calls = backs.calls;
        const std::uint64_t packed = backs.packed;
        const std::uint64_t skipped = slot.staged - wanted;
        if constexpr (pack_limit > 0) {
            if (packed > 0) {
                const StagingLayout& layout = slot.layout;
                const std::size_t bytes = layout.copy_back_end - layout.copy_back_begin;
                auto* base = static_cast<std::byte*>(slot.strategy.base());
                Status back = async().copy_from_device_async(slot.strategy.mirror() + layout.copy_back_begin,
                                                            base + layout.copy_back_begin, bytes, stream);
                if (back) {
                    copied += bytes;
                    ++calls;
                    slot.unpack = true;
                } else if (first.ok()) {
                    first = copy_failure("finish: packed copy back", bytes, back);
                }
            }
        }
        stats_.copy_backs_skipped += skipped;
        stats_.bytes_from_device += copied;
        stats_.copy_backs += calls;
        if constexpr (!detail::SlotFence<Async>::immediate) stats_.async_copy_backs += calls;

        if (Status recorded = slot.fence.record(async(), stream); !recorded && first.ok()) first = recorded;
        slot.uses_mirror = slot.uses_mirror || slot.unpack;
        ++slot.generation;
        Status released = release_leases(slot);
        unlink_handle(slot);
        if (!first.ok()) {
            settle(index);  // what was enqueued completes before the error is returned
            return first;
        }
        Completion completion;
        link(completion, index, slot.generation);
        if (!released.ok()) {
            settle(index);
            return released;
        }
        return completion;
    }

    // ---- inputs written in place --------------------------------------------------------

    /// The pinned mirror of a slot that no pending work still reads or writes (waiting,
    /// counted in host_waits, if none is), laid out for `shapes` with every tensor packed; the
    /// caller writes its inputs into `host(i)`, then binds the frame (or `frame->args()`) on
    /// that slot. Busy when every slot holds a live run or an unbound frame. Needs a packing
    /// strategy (RetainedBump with PackSmall).
    Result<HostFrame> frame(std::span<const TensorShape> shapes) noexcept
        requires(detail::pack_limit_of<Strategy>() > 0) {
        const std::optional<std::size_t> free = free_slot();
        if (!free) return busy("frame");
        const std::size_t index = *free;
        Slot& slot = slots_[index];
        settle(index);
        if (slot.frame_args.capacity() < shapes.size() && !slot.frame_args.empty()) {
            // Keep the old storage: a stale frame's args still point there, and a bind of them
            // must be recognized (and refused), not read as freed memory.
            if (Status kept = keep(slot.retired_frames, std::move(slot.frame_args)); !kept) return kept;
            slot.frame_args = {};
        }
        if (Status sized = resize(slot.frame_args, shapes.size()); !sized) return sized;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
            slot.frame_args[i] = TensorArg{this, shapes[i].bytes, shapes[i].direction, Placement::Host};
        }
        const std::span<const TensorArg> args(slot.frame_args.data(), shapes.size());
        detail::PlanPass pass;
        Status planned = pass.run<true>(args, Strategy::alignment, std::numeric_limits<std::size_t>::max(),
                                        [](std::size_t, const TensorArg&, PackGroup, std::size_t) {});
        Result<StagingLayout> layout = planned.ok() ? pass.finish() : Result<StagingLayout>(planned);
        if (!layout) return Status(layout.status().code(), with_backend(layout.status().message()));
        if (Status grown = grow(index, *layout); !grown) return grown;
        std::array<std::size_t, 4> next = layout->base;
        std::byte* mirror = slot.strategy.mirror();
        for (TensorArg& arg : slot.frame_args) {
            if (arg.bytes == 0) {
                arg.data = nullptr;
                continue;
            }
            const auto group = static_cast<std::size_t>(detail::group_of(arg, std::numeric_limits<std::size_t>::max()));
            arg.data = mirror + next[group];
            next[group] += aligned(arg.bytes);
        }
        slot.frame_layout = *layout;
        slot.frame_count = shapes.size();
        slot.framed = true;
        ++slot.frame_generation;
        return HostFrame(this, index, slot.frame_generation, args);
    }

    // ---- growth control and buffer ownership --------------------------------------------

    /// Grows every slot's retained buffer (and mirror) to at least `bytes` now, so later runs
    /// up to that size never move device addresses (for captured graphs). Busy while a run is
    /// live.
    Status reserve(std::size_t bytes) noexcept {
        if (live_runs() > 0) return busy("reserve");
        const std::size_t mirror = detail::pack_limit_of<Strategy>() > 0 ? bytes : 0;
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            StagingLayout layout;
            layout.required_bytes = bytes;
            layout.packed_bytes = mirror;
            if (Status grown = grow(index, layout); !grown) return grown;
        }
        return {};
    }

    /// Takes ownership of a device buffer allocated elsewhere as slot `slot`'s retained buffer
    /// (an empty slot with no run; a later grow or release frees it).
    Status adopt(std::size_t slot, void* allocation, std::size_t bytes) noexcept
        requires requires(Strategy& s, B& b, void* p, std::size_t n, StagerStats& st) { s.adopt(b, p, n, st); } {
        if (slot >= slots_.size()) return out_of_range("adopt", slot);
        if (slots_[slot].live || slots_[slot].framed) return busy("adopt");
        settle(slot);
        if (Status adopted = slots_[slot].strategy.adopt(*backend_, allocation, bytes, stats_); !adopted) {
            return adopted;
        }
        note_base(slots_[slot]);
        return {};
    }

    /// Hands slot `slot`'s retained buffer to the caller without freeing it (after waiting for
    /// pending work that uses it); the slot is empty afterwards.
    Result<RetainedBuffer> detach(std::size_t slot) noexcept
        requires requires(Strategy& s, StagerStats& st) { s.detach(st); } {
        if (slot >= slots_.size()) return out_of_range("detach", slot);
        if (slots_[slot].live || slots_[slot].framed) return busy("detach");
        settle(slot);
        return slots_[slot].strategy.detach(stats_);
    }

    /// Gives back all device memory now: waits for pending work, releases a live run's leases
    /// (no copy-back; its handle becomes inert), then every retained buffer. Unbound frames are
    /// dropped. The stager stays usable.
    Status release() noexcept {
        Status first;
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            Slot& slot = slots_[index];
            if (slot.live) {
                Status dropped = end_live_run(slot);
                if (first.ok()) first = std::move(dropped);
            }
            slot.framed = false;
        }
        if constexpr (PinnedHostBackend<B>) {
            if (ring_) {
                Status freed = ring_->release(*backend_, async(), stats_);  // re-created at next use
                if (first.ok()) first = std::move(freed);
            }
        }
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            settle(index);
            Slot& slot = slots_[index];
            Status freed = slot.strategy.release_retained(*backend_, stats_);
            if (first.ok()) first = std::move(freed);
            // The per-arg host bookkeeping goes too: the next bind sizes it again.
            slot.lease_count = slot.staged = 0;
            std::vector<TensorLease>().swap(slot.lease_storage);
            std::vector<TensorArg>().swap(slot.device_args);
            std::vector<void*>().swap(slot.deferred);
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
            slot.framed = false;
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
    Status set_pageable_ring(const PageableRing& ring, HostCopyPool* pool = nullptr) noexcept
        requires PinnedHostBackend<B> {
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

    /// Stops staging through the ring and frees it (after the copies that use it completed).
    Status clear_pageable_ring() noexcept requires PinnedHostBackend<B> {
        if (live_runs() > 0) return busy("set_pageable_ring");
        ring_threshold_ = std::numeric_limits<std::size_t>::max();
        if (!ring_) return {};
        Status released = ring_->release(*backend_, async(), stats_);
        ring_.reset();
        return released;
    }

    // ---- inspection ---------------------------------------------------------------------

    const StagerStats& stats() const noexcept { return stats_; }
    /// The strategy instance of one pipeline slot (its retained buffer, for inspection).
    const Strategy& strategy(std::size_t slot = 0) const noexcept { return slots_[slot].strategy; }
    std::size_t pipeline_slots() const noexcept { return slots_.size(); }
    std::size_t live_runs() const noexcept {
        return static_cast<std::size_t>(
            std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.live; }));
    }
    B& backend() const noexcept { return *backend_; }
    /// Host memory the stager holds for its per-arg state (leases, device args); it grows to
    /// the largest run and is given back by release(). (The arg lists of frames stay, so that
    /// a stale frame is recognized.)
    std::size_t bookkeeping_bytes() const noexcept {
        std::size_t bytes = 0;
        for (const Slot& slot : slots_) {
            bytes += slot.lease_storage.capacity() * sizeof(TensorLease) +
                     slot.device_args.capacity() * sizeof(TensorArg) +
                     slot.deferred.capacity() * sizeof(void*);
        }
        return bytes;
    }
    /// Where failures with no caller to return to (a dropped run, an unwatched Completion, a
    /// replaced buffer whose free failed, the destructor) are reported.
    void set_error_sink(ErrorSink sink) noexcept { sink_ = sink; }

private:
    static constexpr std::size_t pack_limit = detail::pack_limit_of<Strategy>();
    static constexpr bool retained = Strategy::lease_kind == ReleaseKind::BufferNoop;
    static constexpr bool immediate = detail::SlotFence<Async>::immediate;
    // Retained and unpacked (the default): plan, slice and lease fused in one pass.
    static constexpr bool fused = retained && pack_limit == 0;
    // Sizes and offsets up to a quarter of the address space cannot overflow when added and aligned.
    static constexpr std::size_t small_size = std::numeric_limits<std::size_t>::max() >> 2;

    struct Slot {
        explicit Slot(Strategy s) : strategy(std::move(s)) {}
        Strategy strategy;
        std::vector<TensorLease> lease_storage;  // only grows; the first lease_count are the run's
        std::size_t lease_count = 0;
        std::size_t staged = 0;  // leases of staged args (the others are Device args)
        std::span<TensorLease> leases() noexcept { return {lease_storage.data(), lease_count}; }
        std::vector<TensorArg> device_args;  // only grows
        StagingLayout layout;                // of the bound (or last finished) run
        StagedRun* handle = nullptr;
        bool live = false;
        bool all_packed = false;              // the run is a frame: every staged arg in the mirror
        detail::SlotFence<Async> fence;
        std::vector<void*> deferred;          // device frees waiting for the fence
        std::uint64_t generation = 0;         // finishes so far
        std::uint64_t settled = 0;            // generations whose results were handed out
        bool unpack = false;                  // packed outputs wait in the mirror for the host
        bool uses_mirror = false;             // pending work reads or writes the mirror
        Stream bind_stream{};
        std::uint64_t bound_at = 0;           // for "the slot bound longest ago"
        std::vector<TensorArg> frame_args;    // only grows; kept by release(): frames point here
        std::vector<std::vector<TensorArg>> retired_frames;  // outgrown frame storage, for stale frames
        StagingLayout frame_layout;
        std::size_t frame_count = 0;
        std::uint64_t frame_generation = 0;
        bool framed = false;                  // a frame is handed out and not yet bound
        void* last_base = nullptr;            // for address_changes
        bool had_base = false;
    };

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

    Result<StagedRun> bind_and_drain(SlotChoice choice, std::span<const TensorArg> args, Stream stream) noexcept {
        Result<StagedRun> run = bind_on(std::move(choice), args, stream);
        if (!run || immediate) return run;
        Slot& slot = slots_[run->slot_];
        if (Status drained = slot.fence.drain(async(), stream, stats_); !drained) {
            run = Status(drained.code(), with_backend(detail::message("stager bind: the uploads failed: ",
                                                                      drained.message())));
        }
        return run;
    }

    Result<StagedRun> bind_on(SlotChoice choice, std::span<const TensorArg> args, Stream stream) noexcept {
        if (!choice) return choice.status();
        const std::size_t index = *choice;
        Slot& slot = slots_[index];
        const bool frame = slot.framed && args.data() == slot.frame_args.data();
        if (Status ready = make_ready(index, stream, frame || pack_limit > 0); !ready) return ready;
        if (Status sized = size_for(slot, args.size()); !sized) return sized;

        if constexpr (fused) {
            // Plan, slice and lease in one pass against the buffer held; a plan that outgrows it
            // grows the buffer and is sliced again (only then). Uploads follow in one loop.
            Result<std::size_t> required = slice(slot, args);
            if (!required) return Status(required.status().code(), with_backend(required.status().message()));
            slot.layout = StagingLayout{};
            slot.layout.required_bytes = *required;
            if (live_runs() > 0) {
                if (Status overlap = check_overlap(index, args); !overlap) return overlap;
            }
            if (*required > slot.strategy.capacity()) {
                if (Status grown = grow(index, slot.layout); !grown) return grown;
                (void)slice(slot, args);
            }
            bool enqueued = false;
            if (Status uploaded = upload(slot, stream, enqueued); !uploaded) return failed_bind(slot, stream, enqueued, uploaded);
            return bound(index, args.size(), stream);
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
            if (live_runs() > 0) {
                if (Status overlap = check_overlap(index, args); !overlap) return overlap;
            }
        }
        if (Status grown = grow(index, slot.layout); !grown) return grown;

        slot.all_packed = frame;
        bool enqueued = false;
        Status staged;
        if constexpr (pack_limit > 0) {
            staged = frame ? stage<true>(slot, args, stream, enqueued) : stage<false>(slot, args, stream, enqueued);
        } else {
            staged = stage<false>(slot, args, stream, enqueued);
        }
        if (!staged) return failed_bind(slot, stream, enqueued, staged);
        if (frame) slot.framed = false;
        return bound(index, args.size(), stream);
    }

    Result<StagedRun> bound(std::size_t index, std::size_t count, Stream stream) noexcept {
        Slot& slot = slots_[index];
        slot.live = true;
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

    // The fused pass of a retained, unpacked strategy: validates each arg (the plan's predicate
    // and layout rule), and writes its lease and device arg against the buffer held. Returns
    // the bytes the run requires; the slices are valid when that is within the capacity.
    Result<std::size_t> slice(Slot& slot, std::span<const TensorArg> args) noexcept {
        constexpr std::size_t mask = Strategy::alignment - 1;
        const auto base = reinterpret_cast<std::uintptr_t>(slot.strategy.base());
        TensorLease* lease = slot.lease_storage.data();
        TensorArg* device_arg = slot.device_args.data();
        std::size_t external = 0, end = 0;
        for (const TensorArg& arg : args) {
            const detail::ArgCheck check = detail::check_arg(arg);
            if (check != detail::ArgCheck::staged) [[unlikely]] {
                if (check == detail::ArgCheck::skipped) {
                    *device_arg++ = TensorArg{nullptr, 0, arg.direction, Placement::Device, arg.memory};
                } else if (check == detail::ArgCheck::external) {
                    *lease++ = TensorLease{nullptr, arg.data, arg.bytes, false, ReleaseKind::ExternalNoop};
                    *device_arg++ = arg;
                    ++external;
                } else {
                    slot.lease_count = 0;
                    const auto index = static_cast<std::size_t>(&arg - args.data());
                    return detail::plan_failure(check, index, arg, end, Strategy::alignment);
                }
                continue;
            }
            const std::size_t offset = end;
            if ((arg.bytes | offset) > small_size) [[unlikely]] {  // below it, nothing can wrap
                std::size_t padded = 0, next = 0;
                if (__builtin_add_overflow(arg.bytes, mask, &padded) || __builtin_add_overflow(offset, padded & ~mask, &next)) {
                    slot.lease_count = 0;
                    const auto index = static_cast<std::size_t>(&arg - args.data());
                    return detail::plan_failure(detail::ArgCheck::staged, index, arg, offset, Strategy::alignment);
                }
            }
            end = offset + ((arg.bytes + mask) & ~mask);
            // Integer arithmetic: past the capacity the pointers are not used (the run grows).
            void* const device = reinterpret_cast<void*>(base + offset);
            *lease++ = TensorLease{arg.data,          device,  arg.bytes,
                                   copies_back(arg.direction), ReleaseKind::BufferNoop,
                                   nullptr,           uploads(arg.direction), arg.memory};
            *device_arg = arg;
            device_arg->data = device;
            device_arg->placement = Placement::Device;
            ++device_arg;
        }
        const auto count = static_cast<std::size_t>(lease - slot.lease_storage.data());
        slot.lease_count = count;
        slot.staged = count - external;
        return end;
    }

    // The uploads of the leases sliced by slice(); the pageable-ring check only when a ring is set.
    Status upload(Slot& slot, Stream stream, bool& enqueued) noexcept {
        return ring_threshold_ == std::numeric_limits<std::size_t>::max() ? upload<false>(slot, stream, enqueued)
                                                                          : upload<true>(slot, stream, enqueued);
    }
    template <bool Ring>
    Status upload(Slot& slot, Stream stream, bool& enqueued) noexcept {
        std::uint64_t uploaded = 0, calls = 0;
        Status status;
        const std::size_t ring_from = ring_threshold_;
        for (const TensorLease& lease : slot.leases()) {
            if (!lease.upload) continue;  // Out args, and Device args
            if (Ring && lease.bytes >= ring_from && through_ring(lease)) [[unlikely]] {
                status = ring_upload(lease, stream, enqueued);
                if (!status) break;
                ++calls;  // the arg's upload, in chunks (StagerStats::ring_chunks)
                continue;
            }
            if (Status copied = async().copy_to_device_async(lease.device, lease.host, lease.bytes, stream); !copied) {
                status = copy_failure("bind: upload", lease.bytes, copied);
                break;
            }
            uploaded += lease.bytes;
            ++calls;
        }
        enqueued = enqueued || calls > 0;
        if (status.ok()) stats_.uploads_skipped += slot.staged - calls;
        stats_.bytes_to_device += uploaded;
        stats_.uploads += calls;
        if constexpr (!immediate) stats_.async_uploads += calls;
        return status;
    }

    // Before a slot is used on `stream`: settle what completed; order `stream` after the
    // slot's pending work, or wait on the host when the host is about to write the mirror.
    Status make_ready(std::size_t index, Stream stream, bool host_writes_mirror) noexcept {
        Slot& slot = slots_[index];
        if (Status prepared = slot.fence.prepare(async()); !prepared) {
            return Status(prepared.code(), with_backend(detail::message("stager bind: creating the slot's events failed: ",
                                                                        prepared.message())));
        }
        if (slot.fence.pending()) {
            Result<bool> ready = slot.fence.poll(async());
            if (!ready) {
                settle_with(index, ready.status());
            } else if (!*ready && host_writes_mirror && slot.uses_mirror) {
                settle(index);
            } else if (!*ready) {
                return slot.fence.order_before(async(), stream);
            }
        }
        if (slot.settled < slot.generation || !slot.deferred.empty()) settle_with(index, Status());
        return {};
    }

    // The staging pass: a lease and a device arg per arg, the slice of each staged arg, and its
    // upload — enqueued directly, or gathered into the mirror for one packed upload. On error
    // the leases taken so far are in slot.leases(), for the caller to release.
    template <bool AllPacked>
    Status stage(Slot& slot, std::span<const TensorArg> args, Stream stream, bool& enqueued) noexcept {
        constexpr std::size_t limit = AllPacked ? std::numeric_limits<std::size_t>::max() : pack_limit;
        auto* const base = static_cast<std::byte*>(slot.strategy.base());
        std::byte* const mirror = mirror_of(slot.strategy);
        std::array<std::size_t, 4> next = slot.layout.base;
        TensorLease* const leases = slot.lease_storage.data();
        TensorArg* const device_args = slot.device_args.data();
        std::size_t count = 0;
        std::uint64_t skipped = 0, uploaded = 0, calls = 0, packed = 0, host_copied = 0;
        std::size_t external = 0;
        Status status;
        for (std::size_t index = 0; index < args.size(); ++index) {
            const TensorArg& arg = args[index];
            TensorArg& device_arg = device_args[index];
            if (!detail::is_staged(arg)) [[unlikely]] {  // the plan refused every invalid arg
                if (arg.bytes == 0) {
                    device_arg = TensorArg{nullptr, 0, arg.direction, Placement::Device};
                } else {
                    leases[count++] = TensorLease{nullptr, arg.data, arg.bytes, false, ReleaseKind::ExternalNoop};
                    device_arg = arg;
                    ++external;
                }
                continue;
            }
            TensorLease& lease = leases[count];
            std::size_t group = static_cast<std::size_t>(PackGroup::direct);
            std::size_t offset = 0;
            if constexpr (retained) {
                if constexpr (limit > 0) group = static_cast<std::size_t>(detail::group_of(arg, limit));
                offset = next[group];
                next[group] += aligned(arg.bytes);
                lease = TensorLease{arg.data,          base + offset, arg.bytes, copies_back(arg.direction),
                                    ReleaseKind::BufferNoop, nullptr,        uploads(arg.direction), arg.memory};
            } else {
                const PlannedTensor tensor{index, 0, arg.bytes, arg.direction};
                if (Status acquired = slot.strategy.acquire(*backend_, tensor, arg, lease, stats_); !acquired) {
                    status = std::move(acquired);
                    break;
                }
                lease.host_memory = arg.memory;
            }
            ++count;
            device_arg = TensorArg{lease.device, arg.bytes, arg.direction, Placement::Device};
            if constexpr (pack_limit > 0) {
                if (group != static_cast<std::size_t>(PackGroup::direct)) {
                    ++packed;
                    std::byte* const into = mirror + offset;
                    const bool in_place = arg.data == into;
                    if (!in_place && inside(arg.data, mirror, mirror_capacity(slot.strategy))) {
                        status = stale_frame_arg(index, arg, into - mirror);
                        break;
                    }
                    if (!uploads(arg.direction)) {
                        ++skipped;
                    } else if (!in_place) {
                        std::memcpy(into, arg.data, arg.bytes);
                        host_copied += arg.bytes;
                    }
                    continue;
                }
            }
            if (!uploads(arg.direction)) {
                ++skipped;
                continue;
            }
            if (lease.bytes >= ring_threshold_ && through_ring(lease)) [[unlikely]] {
                status = ring_upload(lease, stream, enqueued);
                if (!status) break;
                ++calls;
                continue;
            }
            if (Status copied = async().copy_to_device_async(lease.device, arg.data, arg.bytes, stream); !copied) {
                status = copy_failure(detail::message("bind: upload of arg ", index).c_str(), arg.bytes, copied);
                break;
            }
            enqueued = true;
            uploaded += arg.bytes;
            ++calls;
        }
        slot.lease_count = count;
        slot.staged = count - external;
        if (status.ok() && slot.layout.upload_end > 0) {
            const std::size_t bytes = slot.layout.upload_end;  // one copy: every packed In/InOut byte
            if (Status copied = async().copy_to_device_async(base, mirror, bytes, stream); !copied) {
                status = copy_failure("bind: packed upload", bytes, copied);
            } else {
                enqueued = true;
                slot.uses_mirror = true;
                uploaded += bytes;
                ++calls;
            }
        }
        stats_.uploads_skipped += skipped;
        stats_.bytes_to_device += uploaded;
        stats_.uploads += calls;
        stats_.packed_args += packed;
        stats_.mirror_copy_bytes += host_copied;
        if constexpr (!immediate) stats_.async_uploads += calls;
        return status;
    }

    // Grows slot `index` to hold `layout`, giving replaced memory back in stream order.
    Status grow(std::size_t index, const StagingLayout& layout) noexcept {
        Slot& slot = slots_[index];
        const Requirement need{layout.required_bytes, pack_limit > 0 ? layout.packed_bytes : 0};
        if constexpr (retained) {
            const std::size_t mirror = mirror_capacity(slot.strategy);
            if (need.device_bytes <= slot.strategy.capacity() && need.mirror_bytes <= mirror) return {};
            // The host frees and rewrites the mirror as it grows: no pending work may use it.
            if (slot.uses_mirror && need.mirror_bytes > mirror) settle(index);
        }
        QueueContext context{this, index};
        Status grown = with_queue(slot, context, [&](FreeQueue<B>& queue) {
            return slot.strategy.prepare(*backend_, need, stats_, queue);
        });
        note_base(slot);
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
        Slot& slot = queue->stager->slots_[queue->index];
        Status status = slot.fence.wait(queue->stager->async(), queue->stager->stats_);
        queue->stager->settle_with(queue->index, status);
        return status;
    }

    void note_base(Slot& slot) noexcept {
        void* base = slot.strategy.base();
        if (base == nullptr || base == slot.last_base) return;
        if (slot.had_base) ++stats_.address_changes;
        slot.last_base = base;
        slot.had_base = true;
    }

    // A bind while other runs are live must not read or write host memory their copy-backs
    // will still write (InOut state shared across pipelined steps).
    Status check_overlap(std::size_t index, std::span<const TensorArg> args) noexcept {
        for (std::size_t other = 0; other < slots_.size(); ++other) {
            if (other == index || !slots_[other].live) continue;
            for (const TensorLease& lease : slots_[other].leases()) {
                if (!lease.copy_back) continue;
                const auto* begin = static_cast<const std::byte*>(lease.host);
                for (std::size_t i = 0; i < args.size(); ++i) {
                    const TensorArg& arg = args[i];
                    if (arg.placement != Placement::Host || arg.bytes == 0) continue;
                    const auto* at = static_cast<const std::byte*>(arg.data);
                    if (at < begin + lease.bytes && begin < at + arg.bytes) {
                        return overlap_failure(i, arg, other, lease);
                    }
                }
            }
        }
        return {};
    }

    // The copy-backs of a finish, one per copied-back lease (packed ones counted, not copied).
    struct CopyBacks {
        std::uint64_t calls = 0, failed = 0, packed = 0, bytes = 0;
    };
    template <bool Ring>
    CopyBacks copy_back(Slot& slot, Stream stream, Status& first) noexcept {
        CopyBacks backs;
        const std::size_t ring_from = ring_threshold_;
        for (const TensorLease& lease : slot.leases()) {
            if (!lease.copy_back) continue;  // In args, and Device args (never copied back)
            if (packed_lease(slot, lease)) {
                ++backs.packed;
                continue;
            }
            if (Ring && lease.bytes >= ring_from && through_ring(lease)) [[unlikely]] {
                if (Status back = ring_copy_back(lease, stream); !back) {
                    copy_back_failed(backs, first, std::move(back));
                    continue;
                }
                ++backs.calls;
                continue;
            }
            if (Status back = async().copy_from_device_async(lease.host, lease.device, lease.bytes, stream); !back) {
                copy_back_failed(backs, first, copy_failure("finish: copy back", lease.bytes, back));
                continue;
            }
            backs.bytes += lease.bytes;
            ++backs.calls;
        }
        return backs;
    }
    [[gnu::cold]] static void copy_back_failed(CopyBacks& backs, Status& first, Status failure) noexcept {
        ++backs.failed;
        if (first.ok()) first = std::move(failure);
    }

    // ---- the pageable ring -------------------------------------------------------------------

    // True when a large lease's host memory is pageable (see set_pageable_ring).
    bool through_ring(const TensorLease& lease) const noexcept {
        if (lease.host_memory == HostMemory::pinned) return false;
        if (lease.host_memory == HostMemory::pageable) return true;
        if constexpr (PinnedQueryBackend<B>) {
            return !backend_->is_pinned(lease.host);
        } else {
            return true;
        }
    }

    Status ring_upload(const TensorLease& lease, Stream stream, bool& enqueued) noexcept {
        if constexpr (PinnedHostBackend<B>) {
            Status status = ring_->upload(*backend_, async(), lease.device, lease.host, lease.bytes, stream, stats_);
            enqueued = true;
            if (!status) return copy_failure("bind: upload through the pageable ring", lease.bytes, status);
            ++stats_.ring_uploads;
            stats_.bytes_to_device += lease.bytes;
            if constexpr (!immediate) ++stats_.async_uploads;
            return status;
        } else {
            (void)lease, (void)stream, (void)enqueued;
            return {};
        }
    }

    Status ring_copy_back(const TensorLease& lease, Stream stream) noexcept {
        if constexpr (PinnedHostBackend<B>) {
            Status status = ring_->download(*backend_, async(), lease.host, lease.device, lease.bytes, stream, stats_);
            if (!status) return copy_failure("finish: copy back through the pageable ring", lease.bytes, status);
            ++stats_.ring_copy_backs;
            stats_.bytes_from_device += lease.bytes;
            if constexpr (!immediate) ++stats_.async_copy_backs;
            return status;
        } else {
            (void)lease, (void)stream;
            return {};
        }
    }

    // ---- finish, settle, release ----------------------------------------------------------

    Status check_run(const StagedRun& run) const noexcept {
        if (run.owner_ == static_cast<const detail::RunOwner*>(this)) return {};
        return Status(Errc::invalid_argument,
                      run.owner_ == nullptr
                          ? detail::message("stager finish: the run is not live (finished, moved from, or "
                                            "dropped by release/abandon) on backend '",
                                            backend_->name(), "'")
                          : detail::message("stager finish: the run belongs to another stager (backend '",
                                            backend_->name(), "')"));
    }

    bool packed_lease(const Slot& slot, const TensorLease& lease) const noexcept {
        if constexpr (pack_limit > 0) {
            return lease.release_kind == ReleaseKind::BufferNoop && (slot.all_packed || lease.bytes <= pack_limit);
        }
        return false;
    }

    // Blocks until slot `index`'s pending work completed, then settles it.
    void settle(std::size_t index) noexcept {
        Slot& slot = slots_[index];
        settle_with(index, slot.fence.wait(async(), stats_));
    }

    // Settles slot `index` once its pending work is known complete (with `status`): frees what
    // waited for it, copies packed outputs to the callers, and hands the result to the
    // completions watching it (to the error sink when none does).
    void settle_with(std::size_t index, Status status) noexcept {
        Slot& slot = slots_[index];
        for (void* allocation : slot.deferred) {
            ++stats_.device_frees;
            if (Status freed = backend_->device_free(allocation); !freed) {
                ++stats_.free_failures;
                if (status.ok()) {
                    status = Status(freed.code(), with_backend(detail::message("stager: a deferred device_free failed: ",
                                                                               freed.message())));
                }
            }
        }
        slot.deferred.clear();
        if (slot.unpack && status.ok()) {
            std::byte* const mirror = mirror_of(slot.strategy);
            const auto* base = static_cast<const std::byte*>(slot.strategy.base());
            for (const TensorLease& lease : slot.leases()) {
                if (!lease.copy_back || !packed_lease(slot, lease)) continue;
                const std::byte* from = mirror + (static_cast<const std::byte*>(lease.device) - base);
                if (lease.host != from) {
                    std::memcpy(lease.host, from, lease.bytes);
                    stats_.mirror_copy_bytes += lease.bytes;
                }
            }
        }
        slot.unpack = false;
        slot.uses_mirror = false;
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
    void relink_run(std::size_t slot, StagedRun* handle) noexcept override { slots_[slot].handle = handle; }

    void settle_completion(Completion& completion) noexcept override { settle(completion_slot(completion)); }
    Result<bool> poll_completion(Completion& completion) noexcept override {
        const std::size_t index = completion_slot(completion);
        Result<bool> ready = slots_[index].fence.poll(async());
        if (!ready) {
            settle_with(index, ready.status());
            return true;
        }
        if (*ready) settle_with(index, Status());
        return *ready;
    }
    void settle_unwatched(std::size_t slot, std::uint64_t generation) noexcept override {
        if (slots_[slot].settled < generation) settle(slot);
    }
    static std::size_t completion_slot(const Completion& completion) noexcept { return slot_of(completion); }

    // ---- slot choice -------------------------------------------------------------------------

    std::optional<std::size_t> free_slot() noexcept {
        std::optional<std::size_t> oldest;
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            Slot& slot = slots_[index];
            if (slot.live || slot.framed) continue;
            if (!slot.fence.pending()) return index;
            Result<bool> ready = slot.fence.poll(async());
            if (ready && *ready) return index;
            if (!oldest || slot.bound_at < slots_[*oldest].bound_at) oldest = index;
        }
        return oldest;
    }

    SlotChoice pick_slot(std::span<const TensorArg> args) noexcept {
        if constexpr (pack_limit > 0) {
            if (std::optional<SlotChoice> framed = framed_slot(args)) return *framed;
        }
        const std::optional<std::size_t> free = free_slot();
        if (!free) return busy("bind");
        return *free;
    }

    SlotChoice chosen_slot(std::size_t index, std::span<const TensorArg> args) noexcept {
        if (index >= slots_.size()) return out_of_range("bind_slot", index);
        if constexpr (pack_limit > 0) {
            if (std::optional<SlotChoice> framed = framed_slot(args)) {
                if (*framed && **framed != index) {
                    return Status(Errc::invalid_argument,
                                  with_backend(detail::message("stager bind_slot: the frame belongs to slot ", **framed,
                                                              ", not slot ", index)));
                }
                return *framed;
            }
        }
        const Slot& slot = slots_[index];
        if (slot.live || slot.framed) {
            return Status(Errc::busy, with_backend(detail::message("stager bind_slot: slot ", index, " holds ",
                                                                  slot.live ? "a live run" : "an unbound frame")));
        }
        return index;
    }

    SlotChoice frame_slot(const HostFrame& frame) noexcept {
        if (frame.owner_ != static_cast<const void*>(this)) {
            return Status(Errc::invalid_argument,
                          with_backend("stager bind: the frame belongs to another stager"));
        }
        const std::optional<SlotChoice> framed = framed_slot(frame.args());
        if (framed && !*framed) return *framed;
        if (!framed || **framed != frame.slot_ || slots_[frame.slot_].frame_generation != frame.generation_) {
            return stale_frame(frame.slot_);
        }
        return *framed;
    }

    // The slot whose frame `args` is (a bound or dropped frame is stale: an error), or nothing
    // when `args` is not a frame of this stager.
    std::optional<SlotChoice> framed_slot(std::span<const TensorArg> args) noexcept {
        if (args.empty()) return std::nullopt;
        bool any_framed = false;
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            const Slot& slot = slots_[index];
            any_framed = any_framed || slot.framed;
            for (const std::vector<TensorArg>& retired : slot.retired_frames) {
                if (args.data() == retired.data()) return SlotChoice(stale_frame(index));
            }
            if (args.data() != slot.frame_args.data()) continue;
            if (!slot.framed || args.size() != slot.frame_count) return SlotChoice(stale_frame(index));
            return SlotChoice(index);
        }
        if (!any_framed) return std::nullopt;
        // Args that point into an unbound frame without being its own args: a copy of them,
        // changed since. Binding them would move the frame's bytes under its own layout.
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            const Slot& slot = slots_[index];
            if (!slot.framed) continue;
            for (std::size_t i = 0; i < args.size(); ++i) {
                if (args[i].bytes > 0 && inside(args[i].data, mirror_of(slot.strategy), mirror_capacity(slot.strategy))) {
                    return SlotChoice(Status(
                        Errc::invalid_argument,
                        with_backend(detail::message("stager bind: arg ", i, " (", args[i].bytes,
                                                    " bytes) points into the unbound frame of slot ", index,
                                                    ", but the args are not that frame's own: its sizes no longer "
                                                    "match; bind the frame's own args()"))));
                }
            }
        }
        return std::nullopt;
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

    static constexpr std::size_t aligned(std::size_t bytes) noexcept {
        return (bytes + Strategy::alignment - 1) & ~(Strategy::alignment - 1);
    }

    static std::byte* mirror_of(const Strategy& strategy) noexcept {
        if constexpr (pack_limit > 0) {
            return strategy.mirror();
        } else {
            return nullptr;
        }
    }

    static std::size_t mirror_capacity(const Strategy& strategy) noexcept {
        if constexpr (pack_limit > 0) {
            return strategy.mirror_capacity();
        } else {
            return 0;
        }
    }

    static bool inside(const void* pointer, const std::byte* begin, std::size_t bytes) noexcept {
        const auto* at = static_cast<const std::byte*>(pointer);
        return begin != nullptr && std::less_equal<>()(begin, at) && std::less<>()(at, begin + bytes);
    }

    template <class T>
    static Status resize(std::vector<T>& storage, std::size_t count) noexcept {
        if (storage.size() >= count) return {};
#if defined(__cpp_exceptions)
        try {
            storage.resize(count);
        } catch (const std::bad_alloc&) {
            return Status(Errc::out_of_memory,
                          detail::message("stager: host memory for ", count, " args could not be allocated"));
        }
#else
        storage.resize(count);
#endif
        return {};
    }
    static Status keep(std::vector<std::vector<TensorArg>>& retired, std::vector<TensorArg>&& storage) noexcept {
#if defined(__cpp_exceptions)
        try {
            retired.push_back(std::move(storage));
        } catch (const std::bad_alloc&) {
            return Status(Errc::out_of_memory, "stager frame: host memory for the frame's args could not be allocated");
        }
#else
        retired.push_back(std::move(storage));
#endif
        return {};
    }

    Status size_for(Slot& slot, std::size_t count) noexcept {
        if (Status leases = resize(slot.lease_storage, count); !leases) return leases;
        return resize(slot.device_args, count);
    }

    std::string with_backend(const std::string& message) const {
        return detail::message(message, " (stager on backend '", backend_->name(), "')");
    }
    [[gnu::cold]] Status busy(const char* what) const noexcept {
        return Status(Errc::busy, detail::message("stager ", what, ": all ", slots_.size(),
                                                  " pipeline slot(s) hold a live run or an unbound frame on backend '",
                                                  backend_->name(), "'; finish or bind one first"));
    }
    [[gnu::cold]] Status out_of_range(const char* what, std::size_t slot) const noexcept {
        return Status(Errc::invalid_argument, detail::message("stager ", what, ": slot ", slot, " out of range (",
                                                              slots_.size(), " pipeline slot(s)) on backend '",
                                                              backend_->name(), "'"));
    }
    [[gnu::cold]] Status stale_frame(std::size_t slot) const noexcept {
        return Status(Errc::invalid_argument,
                      with_backend(detail::message("stager bind: a stale frame of slot ", slot,
                                                  " (already bound, or dropped by release; ask frame() again)")));
    }
    [[gnu::cold]] Status stale_frame_arg(std::size_t index, const TensorArg& arg, std::ptrdiff_t planned) const noexcept {
        return Status(Errc::invalid_argument,
                      with_backend(detail::message("stager bind: arg ", index, " (", arg.bytes,
                                                  " bytes) points into this stager's frame mirror, but the layout "
                                                  "places it at offset ",
                                                  planned, ": a frame whose sizes no longer match; bind the frame's "
                                                  "own args()")));
    }
    [[gnu::cold]] Status copy_failure(const char* what, std::size_t bytes, const Status& cause) const noexcept {
        return Status(cause.code(), detail::message("stager ", what, " (", bytes, " bytes) failed on backend '",
                                                    backend_->name(), "': ", cause.message()));
    }
    [[gnu::cold]] Status overlap_failure(std::size_t index, const TensorArg& arg, std::size_t slot,
                                         const TensorLease& lease) const noexcept {
        return Status(Errc::busy,
                      with_backend(detail::message(
                          "stager bind: arg ", index, " (", arg.bytes, " bytes at ", static_cast<const void*>(arg.data),
                          ") overlaps a copied-back arg (", lease.bytes, " bytes at ", static_cast<const void*>(lease.host),
                          ") of the live run on slot ", slot,
                          ", which has not been finished: it would read or write stale data; finish that run first "
                          "(finished on one stream, the copy-back is ordered before this bind's uploads)")));
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
};

}  // namespace devstage
