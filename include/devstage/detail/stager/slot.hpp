// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: one pipeline slot of a Stager — its strategy (retained buffer, mirror), the
// bookkeeping of its bound (or last finished) run, its stream-order state and its frame — and
// the small helpers around it.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/schedule/run_order.hpp"
#include "devstage/detail/schedule/slot_fence.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/transfer/batch_copies.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/detail/util/storage.hpp"
#include "devstage/frame.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/tensor.hpp"

namespace devstage {
class StagedRun;
}  // namespace devstage

namespace devstage::detail {

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

/// The pinned mirror of a packing strategy (null without packing).
template <class S>
std::byte* mirror_of(const S& strategy) noexcept {
    if constexpr (pack_limit_of<S>() > 0) {
        return strategy.mirror();
    } else {
        return nullptr;
    }
}
template <class S>
std::size_t mirror_capacity_of(const S& strategy) noexcept {
    if constexpr (pack_limit_of<S>() > 0) {
        return strategy.mirror_capacity();
    } else {
        return 0;
    }
}

/// True when a strategy maps its mirror for the device where the backend can (MapSmall).
template <class S>
constexpr bool maps_of() noexcept {
    if constexpr (requires { requires S::packing::map; }) {
        return true;
    } else {
        return false;
    }
}

/// The device address of a strategy's mapped mirror; null when it is not mapped (or the
/// strategy does not map): its runs then copy.
template <class S>
void* mapped_mirror_of(const S& strategy) noexcept {
    if constexpr (maps_of<S>()) {
        return strategy.mirror_device();
    } else {
        return nullptr;
    }
}

/// The device buffer bytes `need` takes of a strategy's slot as its mirror is now.
template <class S>
std::size_t device_need_of(const S& strategy, const Requirement& need) noexcept {
    if constexpr (maps_of<S>()) {
        return strategy.device_need(need);
    } else {
        return need.device_bytes;
    }
}

/// True when `pointer` lies in [begin, begin + bytes).
inline bool inside(const void* pointer, const std::byte* begin, std::size_t bytes) noexcept {
    const auto* at = static_cast<const std::byte*>(pointer);
    return begin != nullptr && std::less_equal<>()(begin, at) && std::less<>()(at, begin + bytes);
}

template <class Strategy, class Async>
struct StagerSlot;

/// True when the stream view `A` sets device memory itself (AsyncMemsetBackend, or a
/// MemsetBackend seen through its SynchronousAdapter).
template <class A>
concept SetsDeviceMemory = requires(A& a, void* dst, std::size_t n, typename A::Stream s) {
    { a.device_memset_async(dst, 0, n, s) }
    noexcept->std::same_as<Status>;
};

/// Whether the packed Out group of the run staged in `slot` is zeroed by a device memset rather
/// than in the mirror: only when nothing packed goes up otherwise (no packed In or InOut), the
/// mirror is not mapped and the device sets memory itself — then one memset moves no bytes,
/// where an upload of zeros would. Else the zeros ride in the packed upload, or, mapped, are
/// read in place.
template <class Slot>
bool packed_outs_on_device(const Slot& slot) noexcept {
    if constexpr (SetsDeviceMemory<typename Slot::AsyncView>) {
        return !slot.mapped && slot.layout.upload_end == 0;
    } else {
        return false;
    }
}

/// Fills `slots` with `count` slots, each with its own copy of `strategy`; false when host
/// memory is short (nothing is kept then).
template <class Slot, class Strategy>
bool make_slots(std::vector<Slot>& slots, std::size_t count, Strategy strategy) noexcept {
#if defined(__cpp_exceptions)
    try {
#endif
        slots.reserve(count);
        for (std::size_t i = 1; i < count; ++i) slots.emplace_back(Strategy(strategy));
        slots.emplace_back(std::move(strategy));
        for (Slot& slot : slots) slot.settle_after.assign(count, 0);
        return true;
#if defined(__cpp_exceptions)
    } catch (...) {
        slots.clear();
        return false;
    }
#endif
}

template <class Strategy, class Async>
struct StagerSlot {
    using Stream = typename Async::Stream;
    using AsyncView = Async;
    using Batch = BatchCopies<Async>;
    static constexpr std::size_t all_packed_limit = std::numeric_limits<std::size_t>::max();

    explicit StagerSlot(Strategy s) : strategy(std::move(s)) {}

    Strategy strategy;
    std::vector<TensorLease> lease_storage;  // only grows; the first lease_count are the run's
    std::size_t lease_count = 0;
    std::size_t staged = 0;                          // leases of staged args (the others are Device args)
    std::vector<TensorArg> device_args;              // only grows
    [[no_unique_address]] BatchCopies<Async> batch;  // a run's direct copies, for a BatchCopyBackend
    StagingLayout layout;                            // of the bound (or last finished) run
    StagedRun* handle = nullptr;
    SlotFence<Async> fence;
    std::vector<void*> deferred;                         // device frees waiting for the fence
    std::uint64_t generation = 0;                        // finishes so far
    std::uint64_t settled = 0;                           // generations whose results were handed out
    std::uint64_t bound_at = 0;                          // for "the slot bound longest ago"
    std::vector<TensorArg> frame_args;                   // only grows; kept by release(): frames point here
    std::vector<std::vector<TensorArg>> retired_frames;  // outgrown frame storage, for stale frames
    StagingLayout frame_layout;
    std::size_t frame_count = 0;
    std::uint64_t frame_generation = 0;
    std::uint64_t held_generation = 0;
    HostBox box;                           // of the bound (or last finished) run's host memory
    HostBox carried;                       // of earlier runs on this slot still pending under the fence
    std::vector<Touched> carried_touches;  // their host ranges (unless too many: carried_overflow)
    // Settle order: before this slot's run is settled, slot i is settled through generation
    // settle_after[i] (0: no need). Sized to the slot count at construction.
    std::vector<std::uint64_t> settle_after;
    void* last_base = nullptr;    // for address_changes
    void* last_mapped = nullptr;  // the mapped mirror's device address, likewise
    Stream bind_stream{};
    // The other streams order_after_uploads ordered after the live run's bind: its kernels may
    // run there, so its finish, or its release when it is dropped, waits for them too.
    static constexpr std::size_t max_kernel_streams = 4;
    std::array<Stream, max_kernel_streams> kernel_streams{};
    std::size_t kernel_stream_count = 0;
    // flags
    bool live = false;
    bool all_packed = false;       // the run is a frame: every staged arg in the mirror
    bool mapped = false;           // the run's packed args are in the mapped mirror: the kernel uses them there
    bool unpack = false;           // packed outputs wait in the mirror for the host
    bool uses_mirror = false;      // pending work reads or writes the mirror
    bool framed = false;           // a frame is handed out and not yet bound
    bool held = false;             // a frame's run whose Completion the engine still holds
    bool uploads_pending = false;  // the live run's uploads were enqueued and not drained
    bool box_valid = false;
    bool carried_overflow = false;
    bool run_leases = false;  // leases() are those of a bound or finished run (not of a failed bind)
    bool has_settle_after = false;
    bool had_base = false;
    bool had_mapped = false;

    std::span<TensorLease> leases() noexcept { return {lease_storage.data(), lease_count}; }

    Status size_for(std::size_t count) noexcept {
        if (Status leases = grow_storage(lease_storage, count); !leases) return leases;
        if constexpr (BatchCopies<Async>::enabled) {
            if (Status batched = batch.size_for(count); !batched) return batched;
        }
        return grow_storage(device_args, count);
    }

    /// True when `lease` moved inside a packed copy.
    bool packed(const TensorLease& lease) const noexcept {
        if constexpr (pack_limit_of<Strategy>() > 0) {
            return lease.release_kind == ReleaseKind::BufferNoop &&
                   (all_packed || lease.bytes <= pack_limit_of<Strategy>());
        }
        return false;
    }

    /// Counts a move of the slot's base, or of its mapped mirror's device address, where its
    /// kernels' small args lie (a first allocation is not one).
    void note_base(StagerStats& stats) noexcept {
        note(strategy.base(), last_base, had_base, stats);
        if constexpr (maps_of<Strategy>()) note(mapped_mirror_of(strategy), last_mapped, had_mapped, stats);
    }
    static void note(void* address, void*& last, bool& had, StagerStats& stats) noexcept {
        if (address == nullptr || address == last) return;
        if (had) ++stats.address_changes;
        last = address;
        had = true;
    }

    /// Makes room for a frame of `count` args. Outgrown storage is kept: a stale frame's args
    /// still point there, and a bind of them must be recognized, not read as freed memory.
    Status frame_storage(std::size_t count) noexcept {
        if (frame_args.capacity() < count && !frame_args.empty()) {
#if defined(__cpp_exceptions)
            try {
                retired_frames.push_back(std::move(frame_args));
            } catch (const std::bad_alloc&) {
                return Status(Errc::out_of_memory,
                              "stager frame: host memory for the frame's args could not be allocated");
            }
#else
            retired_frames.push_back(std::move(frame_args));
#endif
            frame_args = {};
        }
        return grow_storage(frame_args, count);
    }

    /// Lays a frame of `shapes` out in frame_args: every host tensor packed (In, InOut, Out),
    /// each TensorArg's data a non-null placeholder until place_frame(); a device-resident one
    /// is a Device arg, passed through.
    Result<StagingLayout> plan_frame(std::span<const TensorShape> shapes, void* placeholder) noexcept {
        if (Status sized = frame_storage(shapes.size()); !sized) return sized;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
            const TensorShape& shape = shapes[i];
            frame_args[i] = shape.device != nullptr
                                ? TensorArg{shape.device, shape.bytes, shape.direction, Placement::Device}
                                : TensorArg{placeholder, shape.bytes, shape.direction, Placement::Host};
        }
        PlanPass pass;
        Status planned = pass.run<true>(frame(shapes.size()), Strategy::alignment, all_packed_limit,
                                        [](std::size_t, const TensorArg&, PackGroup, std::size_t) {});
        if (!planned) return planned;
        return pass.finish();
    }

    /// Points the frame's args into the mirror at the offsets of `planned` and hands the frame
    /// out (the slot is then framed until the frame is bound).
    std::span<const TensorArg> place_frame(const StagingLayout& planned, std::size_t count) noexcept {
        std::array<std::size_t, 4> next = planned.base;
        std::byte* const mirror = mirror_of(strategy);
        for (TensorArg& arg : std::span<TensorArg>(frame_args.data(), count)) {
            if (arg.placement == Placement::Device) continue;  // passed through
            if (arg.bytes == 0) {
                arg.data = nullptr;
                continue;
            }
            const auto group = static_cast<std::size_t>(group_of(arg, all_packed_limit));
            arg.data = mirror + next[group];
            next[group] += (arg.bytes + Strategy::alignment - 1) & ~(Strategy::alignment - 1);
        }
        frame_layout = planned;
        frame_count = count;
        framed = true;
        ++frame_generation;
        return frame(count);
    }

    std::span<const TensorArg> frame(std::size_t count) const noexcept {
        return {frame_args.data(), count};
    }

    /// The host box of the slot's bound (or last finished) run.
    const HostBox& host_box() noexcept {
        if (!box_valid) {
            box = box_of(std::span<const TensorLease>(lease_storage.data(), lease_count));
            box_valid = true;
        }
        return box;
    }

    /// Gives back the per-arg host bookkeeping (not the frame storage: frames point there).
    void drop_bookkeeping() noexcept {
        lease_count = staged = 0;
        box_valid = false;
        carried = {};
        carried_overflow = false;
        std::vector<Touched>().swap(carried_touches);
        std::vector<TensorLease>().swap(lease_storage);
        std::vector<TensorArg>().swap(device_args);
        std::vector<void*>().swap(deferred);
        batch.drop();
    }

    std::size_t bookkeeping_bytes() const noexcept {
        return lease_storage.capacity() * sizeof(TensorLease) + device_args.capacity() * sizeof(TensorArg) +
               deferred.capacity() * sizeof(void*) + carried_touches.capacity() * sizeof(Touched) + batch.bytes();
    }
};

/// The slot whose frame `args` is (a bound or dropped frame is stale: an error), or nothing when
/// `args` is not a frame of these slots. Args that point into an unbound frame without being
/// its own args are a changed copy of them: an error too.
template <class Slot>
std::optional<Result<std::size_t>> find_frame(std::span<const Slot> slots, std::span<const TensorArg> args,
                                              std::string_view backend) noexcept {
    if (args.empty()) return std::nullopt;
    bool any_framed = false;
    for (std::size_t index = 0; index < slots.size(); ++index) {
        const Slot& slot = slots[index];
        any_framed = any_framed || slot.framed;
        for (const std::vector<TensorArg>& retired : slot.retired_frames) {
            if (args.data() == retired.data()) return Result<std::size_t>(stale_frame(index, backend));
        }
        if (args.data() != slot.frame_args.data()) continue;
        if (!slot.framed || args.size() != slot.frame_count) return Result<std::size_t>(stale_frame(index, backend));
        return Result<std::size_t>(index);
    }
    if (!any_framed) return std::nullopt;
    for (std::size_t index = 0; index < slots.size(); ++index) {
        const Slot& slot = slots[index];
        if (!slot.framed) continue;
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i].bytes > 0 &&
                inside(args[i].data, mirror_of(slot.strategy), mirror_capacity_of(slot.strategy))) {
                return Result<std::size_t>(frame_copy(i, args[i], index, backend));
            }
        }
    }
    return std::nullopt;
}

}  // namespace devstage::detail
