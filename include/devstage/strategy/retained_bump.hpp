// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// RetainedBump: one device buffer kept across runs, sized from each run's plan, grown only
/// when too small, never shrunk, bump-sliced per tensor. Once shapes settle a run makes no
/// device allocation at all.

#include <cstddef>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/device_alloc.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/detail/slice.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// Temporary-buffer strategy with one retained slot. `Stager<SimBackend, RetainedBump<>> s(sim);`
///
/// Per run: when the plan requires more than the slot holds, grow (no data kept: the buffer
/// is per-run scratch). The grow is transactional where memory allows: the new buffer is
/// allocated first and the old one freed after; when that allocation fails, the old buffer is
/// freed first and the allocation retried. If the retry fails too, the slot is left empty and
/// the run fails with out_of_memory naming the bytes. StagerStats::grows_allocate_first and
/// grows_free_first say which order each grow took. Slices start at
/// multiples of `Alignment` from a base aligned to `Alignment`, over-allocating when the
/// backend guarantees less. Leases are ReleaseKind::BufferNoop.
///
/// Copying a RetainedBump copies its policy, not its buffer: the copy starts empty. Moving
/// transfers the buffer. The owner (a Stager) gives the buffer back with release_retained().
template <GrowthPolicy Growth = ExactGrowth, std::size_t Alignment = 1024>
class RetainedBump {
    static_assert(Alignment > 0 && (Alignment & (Alignment - 1)) == 0, "Alignment must be a power of two");

public:
    static constexpr std::size_t alignment = Alignment;
    static constexpr ReleaseKind lease_kind = ReleaseKind::BufferNoop;

    RetainedBump() noexcept = default;
    explicit RetainedBump(Growth growth) noexcept : growth_(std::move(growth)) {}
    RetainedBump(const RetainedBump& other) noexcept : growth_(other.growth_) {}
    RetainedBump(RetainedBump&& other) noexcept
        : growth_(std::move(other.growth_)),
          slot_(std::exchange(other.slot_, {})),
          capacity_(std::exchange(other.capacity_, 0)) {}
    RetainedBump& operator=(const RetainedBump&) = delete;
    RetainedBump& operator=(RetainedBump&&) = delete;
    ~RetainedBump() = default;  // the owner releases or abandons the buffer first

    /// Makes the slot hold at least `plan.required_bytes()`.
    template <Backend B>
    Status prepare(B& backend, const StagingPlan& plan, StagerStats& stats) noexcept {
        const std::size_t required = plan.required_bytes();
        if (required <= capacity_) return {};
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
        // Transactional where memory allows: the new buffer is allocated while the old one is
        // still held; only if that fails is the old one freed first and the allocation retried.
        const std::size_t held = capacity_;
        Result<detail::AlignedAllocation> grown =
            detail::allocate_aligned<Alignment>(backend, *target, "retained buffer grow", stats);
        if (grown) {
            if (slot_.allocation != nullptr) {
                ++stats.grows_allocate_first;
                // The new buffer is in place whatever the free reports; a failed free is the
                // backend's memory to account for and does not fail the run.
                (void)release_retained(backend, stats);
            }
        } else if (slot_.allocation != nullptr) {
            if (Status freed = release_retained(backend, stats); !freed) {
                ++stats.grow_failures;
                return freed;
            }
            grown = detail::allocate_aligned<Alignment>(backend, *target, "retained buffer grow", stats);
            if (grown) ++stats.grows_free_first;
        }
        if (!grown) {
            ++stats.grow_failures;
            const Status& cause = grown.status();
            return Status(cause.code(),
                          detail::message(cause.message(), " (capacity ", held, ", plan requires ", required, ")"));
        }
        slot_ = *grown;
        capacity_ = *target;
        ++stats.regrows;
        stats.retained_bytes += slot_.allocated;
        return {};
    }

    /// Writes the slice for one planned tensor into `lease`. Precondition: prepare() succeeded
    /// for this plan; a slice outside the buffer is still reported, never undefined behaviour.
    template <Backend B>
    Status acquire(B& backend, const PlannedTensor& tensor, const TensorArg& arg, TensorLease& lease,
                   StagerStats& /*stats*/) noexcept {
        return detail::slice_lease(slot_.base, capacity_, tensor, arg, lease, "retained buffer", backend);
    }

    /// Gives the retained buffer back to the backend now. The slot is empty afterwards even if
    /// the backend reports an error (the memory is then the backend's to account for).
    template <Backend B>
    Status release_retained(B& backend, StagerStats& stats) noexcept {
        if (slot_.allocation == nullptr) return {};
        ++stats.device_frees;
        stats.retained_bytes -= slot_.allocated;
        Status status = backend.device_free(slot_.allocation);
        slot_ = {};
        capacity_ = 0;
        if (!status) {
            return Status(status.code(), detail::message("retained buffer free failed on backend '", backend.name(),
                                                         "': ", status.message()));
        }
        return status;
    }

    /// Forgets the retained buffer without calling the backend (after a device reset).
    void abandon(StagerStats& stats) noexcept {
        stats.retained_bytes -= slot_.allocated;
        slot_ = {};
        capacity_ = 0;
    }

    /// Usable bytes from the aligned base.
    std::size_t capacity() const noexcept { return capacity_; }
    /// The aligned base of the retained buffer; null when empty.
    const void* base() const noexcept { return slot_.base; }
    const Growth& growth() const noexcept { return growth_; }

private:
    Growth growth_;
    detail::AlignedAllocation slot_;
    std::size_t capacity_ = 0;
};

}  // namespace devstage
