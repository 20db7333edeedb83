// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// RetainedBump: one device buffer kept across runs, sized from each run's plan, grown only
/// when too small, never shrunk, bump-sliced per tensor. Once shapes settle a run makes no
/// device allocation at all. A pinned host mirror of the buffer's packed region, allocated at
/// the first packed run, lets a run's small args move with one copy each way (or, mapped, with
/// none); the Packing policy is the stager's default for packing and mapping.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/strategy/device_alloc.hpp"
#include "devstage/detail/strategy/pinned_mirror.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/strategy/packing.hpp"

namespace devstage {

/// A retained device buffer handed between a stager and another owner (Stager::adopt and
/// Stager::detach): what device_free takes, the aligned base, and the usable bytes from it.
struct RetainedBuffer {
    void* allocation = nullptr;
    void* base = nullptr;
    std::size_t bytes = 0;
};

/// Temporary-buffer strategy with one retained slot. `Stager<SimBackend, RetainedBump<>> s(sim);`
///
/// Per run: when the plan requires more than the slot holds, grow (no data kept: the buffer is
/// per-run scratch) to what the Growth policy answers, or to exactly the requirement when that
/// cannot be had (StagerStats::grows_exact_fallback). GrowOrder::allocate_first (default)
/// allocates the new buffer first and frees the old one after; when that fails it frees the
/// old one first and retries. GrowOrder::free_first always frees first. If every attempt fails
/// the slot is left empty and the run fails with out_of_memory naming the bytes. The old
/// buffer goes back through the FreeQueue, so pending stream work never loses it; a free that
/// fails is counted (free_failures) and reported to the queue's sink, and the grow stands.
/// Slices start at multiples of `Alignment` from a base aligned to `Alignment`: the exact size
/// is asked for first, and over-allocated only when the backend's pointer is not aligned
/// (StagerStats::alignment_retries). Leases are ReleaseKind::BufferNoop. Models
/// MirroredStrategy: `Packing` (NoPacking, PackSmall<N>, MapSmall<N>) gives the pack limit and
/// mapping a Stager over it uses unless its StagerOptions say otherwise.
///
/// Copying a RetainedBump copies its policy, not its buffer: the copy starts empty. Moving
/// transfers the buffer. The owner (a Stager) gives the buffer back with release_retained().
template <GrowthPolicy Growth = ExactGrowth, std::size_t Alignment = 1024, PackingPolicy Packing = NoPacking>
class RetainedBump {
    static_assert(Alignment > 0 && (Alignment & (Alignment - 1)) == 0, "Alignment must be a power of two");

public:
    static constexpr std::size_t alignment = Alignment;
    static constexpr ReleaseKind lease_kind = ReleaseKind::BufferNoop;
    using packing = Packing;

    RetainedBump() noexcept = default;
    explicit RetainedBump(Growth growth, GrowOrder order = GrowOrder::allocate_first) noexcept
        : growth_(std::move(growth)), order_(order) {}
    RetainedBump(const RetainedBump& other) noexcept : growth_(other.growth_), order_(other.order_) {}
    RetainedBump(RetainedBump&& other) noexcept
        : growth_(std::move(other.growth_)),
          order_(other.order_),
          slot_(std::exchange(other.slot_, {})),
          capacity_(std::exchange(other.capacity_, 0)),
          mirror_(std::move(other.mirror_)) {}
    RetainedBump& operator=(const RetainedBump&) = delete;
    RetainedBump& operator=(RetainedBump&&) = delete;
    ~RetainedBump() = default;  // the owner releases or abandons the buffer first

    /// Makes the slot hold at least `need.device_bytes` and a mirror of at least
    /// `need.mirror_bytes` (none asked: none made). Mapping (`need.map_mirror` on a
    /// MappedHostBackend), the mirror comes first: once it is mapped the buffer needs only
    /// `need.device_bytes - need.mapped_bytes`.
    template <Backend B>
    Status prepare(B& backend, const Requirement& need, StagerStats& stats, FreeQueue<B>& queue) noexcept {
        if constexpr (MappedHostBackend<B>) {
            if (need.map_mirror) {
                if (Status mirrored = prepare_mirror(backend, need, stats); !mirrored) return mirrored;
                Requirement device = need;
                device.device_bytes = device_need(need);
                if (device.device_bytes > capacity_) return grow(backend, device, stats, queue);
                return {};
            }
        }
        if (need.device_bytes > capacity_) {
            if (Status grown = grow(backend, need, stats, queue); !grown) return grown;
        }
        return prepare_mirror(backend, need, stats);
    }

    /// The device buffer bytes `need` takes of this slot as its mirror is now: without the
    /// packed region where the mirror is mapped for the device.
    std::size_t device_need(const Requirement& need) const noexcept {
        if (mirror_.device() != nullptr) return need.device_bytes - std::min(need.mapped_bytes, need.device_bytes);
        return need.device_bytes;
    }

    /// Gives the retained buffer (and the mirror) back to the backend now. The slot is empty
    /// afterwards even if the backend reports an error (the memory is then the backend's to
    /// account for).
    template <Backend B>
    Status release_retained(B& backend, StagerStats& stats) noexcept {
        Status first;
        if (slot_.allocation != nullptr) {
            ++stats.device_frees;
            stats.retained_bytes -= slot_.allocated;
            Status status = backend.device_free(slot_.allocation);
            slot_ = {};
            capacity_ = 0;
            if (!status) {
                ++stats.free_failures;
                first = Status(status.code(), detail::message("retained buffer free failed on backend '",
                                                              backend.name(), "': ", status.message()));
            }
        }
        if constexpr (PinnedHostBackend<B>) {
            Status mirror = mirror_.release(backend, stats);
            if (first.ok()) first = std::move(mirror);
        }
        return first;
    }

    /// Forgets the retained buffer without calling the backend (after a device reset).
    void abandon(StagerStats& stats) noexcept {
        stats.retained_bytes -= slot_.allocated;
        slot_ = {};
        capacity_ = 0;
        mirror_.abandon(stats);
    }

    /// Takes ownership of a device buffer another owner allocated, as this slot's retained
    /// buffer (it is freed by a later grow or release). The slot must be empty; the usable bytes
    /// start at `allocation` aligned up to Alignment.
    template <Backend B>
    Status adopt(B& backend, void* allocation, std::size_t bytes, StagerStats& stats) noexcept {
        if (slot_.allocation != nullptr) {
            return Status(Errc::busy,
                          detail::message("retained buffer adopt: the slot already holds ", capacity_,
                                          " bytes on backend '", backend.name(), "'; detach or release it first"));
        }
        void* base = allocation != nullptr ? detail::align_pointer(allocation, Alignment) : nullptr;
        const auto slack =
            static_cast<std::size_t>(static_cast<std::byte*>(base) - static_cast<std::byte*>(allocation));
        if (allocation == nullptr || bytes <= slack) {
            return Status(
                Errc::invalid_argument,
                detail::message("retained buffer adopt: ", bytes, " bytes at ", static_cast<const void*>(allocation),
                                " leave nothing aligned to ", Alignment, " on backend '", backend.name(), "'"));
        }
        slot_ = detail::AlignedAllocation{allocation, base, bytes};
        capacity_ = bytes - slack;
        stats.retained_bytes += bytes;
        return {};
    }

    /// Hands the retained buffer to the caller without freeing it; the slot is empty afterwards.
    RetainedBuffer detach(StagerStats& stats) noexcept {
        const RetainedBuffer buffer{slot_.allocation, slot_.base, capacity_};
        stats.retained_bytes -= slot_.allocated;
        slot_ = {};
        capacity_ = 0;
        return buffer;
    }

    /// Usable bytes from the aligned base.
    std::size_t capacity() const noexcept { return capacity_; }
    /// The aligned base of the retained buffer; null when empty.
    void* base() const noexcept { return slot_.base; }
    const Growth& growth() const noexcept { return growth_; }
    GrowOrder order() const noexcept { return order_; }
    /// The growth rule from now on (RetainedBump<GrowthRule>: a stager's StagerOptions::growth).
    void set_growth(const GrowthRule& rule) noexcept requires std::same_as<Growth, GrowthRule> { growth_ = rule; }
    /// The order of later grows (a stager's StagerOptions::grow_order).
    void set_grow_order(GrowOrder order) noexcept { order_ = order; }
    /// The pinned host mirror: byte i mirrors byte i of the device buffer; null before the
    /// first packed run.
    std::byte* mirror() const noexcept { return mirror_.data(); }
    std::size_t mirror_capacity() const noexcept { return mirror_.capacity(); }
    /// The device address of the mirror where it is mapped for the device (a stager mapping its
    /// small args on a MappedHostBackend whose map_host took it), else null: a slot then copies.
    void* mirror_device() const noexcept { return mirror_.device(); }

private:
    template <Backend B>
    Status prepare_mirror(B& backend, const Requirement& need, StagerStats& stats) noexcept {
        if (need.mirror_bytes <= mirror_.capacity()) return {};
        if constexpr (!PinnedHostBackend<B>) {  // a Stager refuses packing over such a backend first
            ++stats.grow_failures;
            return Status(Errc::not_supported,
                          detail::message("packed mirror: backend '", backend.name(), "' has no pinned host memory"));
        } else {
            return grow_mirror(backend, need, stats);
        }
    }

    template <Backend B>
    Status grow_mirror(B& backend, const Requirement& need, StagerStats& stats) noexcept {
        // A mapped mirror starts where map_host takes it (4 KiB for ACL).
        std::size_t alignment = Alignment;
        if constexpr (MappedHostBackend<B>) {
            if (need.map_mirror) alignment = std::max(Alignment, B::host_map_alignment);
        }
        Result<std::size_t> target = growth_.next_capacity(mirror_.capacity(), need.mirror_bytes);
        const std::size_t bytes = target && *target >= need.mirror_bytes ? *target : need.mirror_bytes;
        if (Status mirrored = mirror_.ensure(backend, bytes, need.mirror_bytes, alignment, stats, need.keep,
                                             need.mirror_slack_first, need.map_mirror, need.mirror_source);
            !mirrored) {
            ++stats.grow_failures;
            return mirrored;
        }
        return {};
    }

    template <Backend B>
    Status grow(B& backend, const Requirement& need, StagerStats& stats, FreeQueue<B>& queue) noexcept {
        const std::size_t required = need.device_bytes;
        const bool keep = need.keep;
        Result<std::size_t> target = growth_.next_capacity(capacity_, required);
        if (!target) {
            ++stats.grow_failures;
            return Status(target.status().code(),
                          detail::message(target.status().message(), " (backend '", backend.name(), "')"));
        }
        if (*target < required) {
            ++stats.grow_failures;
            return Status(Errc::invalid_argument, detail::message("retained buffer grow: growth policy returned ",
                                                                  *target, " bytes for a plan requiring ", required));
        }
        const std::size_t held = capacity_;
        const bool had = slot_.allocation != nullptr;
        Result<detail::AlignedAllocation> grown = Status(Errc::out_of_memory, "retained buffer grow: not attempted");
        std::size_t size = *target;
        const std::uint64_t free_failures = stats.free_failures;
        if (order_ == GrowOrder::allocate_first || !had || keep) {
            grown = allocate(backend, *target, need, stats, size);
            if (grown && had) ++stats.grows_allocate_first;
        }
        if (!grown && had && !keep && stats.free_failures == free_failures) {
            // Memory is short (or free_first asked): free the old buffer first, then retry.
            if (Status settled = queue.settle(); !settled) queue.report(settled);
            if (Status freed = give_back(queue, stats); !freed) queue.report(freed);
            grown = allocate(backend, *target, need, stats, size);
            if (grown) ++stats.grows_free_first;
        }
        if (!grown) {
            ++stats.grow_failures;
            const Status& cause = grown.status();
            return Status(cause.code(), detail::message(cause.message(), " (the slot held ", held,
                                                        " bytes; the run needs ", required, ")"));
        }
        if (slot_.allocation != nullptr) {
            // The new buffer stands whatever the free of the old one reports: a failed free is
            // counted and reported, and the run goes on.
            if (Status freed = give_back(queue, stats); !freed) queue.report(freed);
        }
        slot_ = *grown;
        capacity_ = size;
        ++stats.regrows;
        stats.retained_bytes += slot_.allocated;
        return {};
    }

    // The grown target, or exactly the requirement when the target cannot be had.
    template <Backend B>
    Result<detail::AlignedAllocation> allocate(B& backend, std::size_t target, const Requirement& need,
                                               StagerStats& stats, std::size_t& size) noexcept {
        const std::size_t required = need.device_bytes;
        const std::uint64_t retries = stats.alignment_retries;
        const std::uint64_t free_failures = stats.free_failures;
        Result<detail::AlignedAllocation> grown = detail::allocate_exact_first<Alignment>(
            backend, target, "retained buffer grow", stats, need.device_slack_first);
        size = target;
        // A misaligned try whose free failed: the grow fails with that failure (no fallback
        // may hide it), the slot keeps what it held.
        if (!grown && target > required && stats.free_failures == free_failures) {
            // A misaligned try just now: the fallback asks with the slack at once too.
            const bool slack_first = need.device_slack_first || stats.alignment_retries != retries;
            grown =
                detail::allocate_exact_first<Alignment>(backend, required, "retained buffer grow", stats, slack_first);
            size = required;
            if (grown) ++stats.grows_exact_fallback;
        }
        return grown;
    }

    template <Backend B>
    Status give_back(FreeQueue<B>& queue, StagerStats& stats) noexcept {
        stats.retained_bytes -= slot_.allocated;
        void* allocation = slot_.allocation;
        slot_ = {};
        capacity_ = 0;
        return queue.free(allocation);
    }

    Growth growth_;
    GrowOrder order_ = GrowOrder::allocate_first;
    detail::AlignedAllocation slot_;
    std::size_t capacity_ = 0;
    detail::PinnedMirror mirror_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
