// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The interface a temporary-buffer strategy offers the Stager: the StagingStrategy concept
/// (each operation its own named concept, so a strategy missing one is rejected naming it),
/// the Requirement a strategy must meet before a run, and the FreeQueue through which it gives
/// back device memory that pending stream work may still touch.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <bit>
#include <concepts>
#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// What a run (or Stager::reserve) needs of a slot: device bytes from the aligned base, and
/// bytes of pinned host mirror for packed args (0 without packing).
struct Requirement {
    std::size_t device_bytes = 0;
    std::size_t mirror_bytes = 0;
    /// A grow that fails keeps what the slot held (no free-first retry): Stager::reserve.
    bool keep = false;
    /// The backend returned a misaligned device (pinned) allocation before: allocate with the
    /// alignment slack straight away instead of asking for the exact size first. The Stager
    /// sets these for the rest of its life once a retry happened on any of its slots.
    bool device_slack_first = false;
    bool mirror_slack_first = false;
    /// Of device_bytes, those at the start that a mirror mapped for the device holds instead
    /// of the device buffer (the packed region of a MapSmall run): such a strategy's buffer
    /// needs device_bytes - mapped_bytes once its mirror is mapped. 0: none.
    std::size_t mapped_bytes = 0;
};

/// Device memory a strategy gives back goes through here: freed at once when no stream work
/// of the slot is pending, else queued and freed by the Stager once the slot's pending work
/// completed (StagerStats::deferred_frees). `queue.free(old_buffer)`
template <Backend B>
class FreeQueue {
public:
    using Settle = Status (*)(void* context) noexcept;

    /// A queue with nothing pending: every free is immediate. For a strategy used on its own.
    FreeQueue(B& backend, StagerStats& stats, ErrorSink sink = {}) noexcept
        : backend_(&backend), stats_(&stats), sink_(sink) {}
    /// A queue of a slot with pending work: frees go to `deferred` until `settle(context)`
    /// (which blocks until the work completed and frees them) is called.
    FreeQueue(B& backend, StagerStats& stats, ErrorSink sink, std::vector<void*>& deferred, Settle settle,
              void* context) noexcept
        : backend_(&backend), stats_(&stats), sink_(sink), deferred_(&deferred), settle_(settle), context_(context) {}

    /// True when pending work may still touch memory this queue is given.
    bool pending() const noexcept { return deferred_ != nullptr; }

    /// Gives `allocation` (what device_malloc returned) back to the backend, now or once the
    /// pending work completed. A failure is returned and counted (free_failures); the pointer
    /// is then the backend's to account for. Should there be neither host memory to remember
    /// the allocation nor a way to wait for the pending work, it stays allocated (counted in
    /// free_failures, reported to the error sink): freeing it could pull memory from under
    /// that work.
    Status free(void* allocation) noexcept {
        if (allocation == nullptr) return {};
        if (deferred_ != nullptr) {
            if (push(allocation)) {
                ++stats_->deferred_frees;
                return {};
            }
            if (deferred_ != nullptr) {
                ++stats_->free_failures;
                sink_(Status(Errc::out_of_memory,
                             detail::message("device_free of ", static_cast<const void*>(allocation), " on backend '",
                                             backend_->name(),
                                             "' skipped: no host memory to defer it and its pending work could not "
                                             "be waited for; it stays allocated")));
                return {};
            }
        }
        ++stats_->device_frees;
        Status status = backend_->device_free(allocation);
        if (!status) {
            ++stats_->free_failures;
            return Status(status.code(),
                          detail::message("device_free of ", static_cast<const void*>(allocation),
                                          " failed on backend '", backend_->name(), "': ", status.message()));
        }
        return status;
    }

    /// Blocks until the pending work completed and frees what was queued; afterwards every
    /// free is immediate. For a strategy that must free before it allocates (GrowOrder::free_first).
    Status settle() noexcept {
        if (deferred_ == nullptr) return {};
        Status status = settle_(context_);
        if (status.ok()) deferred_ = nullptr;  // else the work may still run: frees stay deferred
        return status;
    }

    /// Reports a failure no caller will see (the run it happened in still succeeds).
    void report(const Status& status) const noexcept { sink_(status); }

private:
    bool push(void* allocation) noexcept {
#if defined(__cpp_exceptions)
        try {
            deferred_->push_back(allocation);
        } catch (const std::bad_alloc&) {
            // No host memory to remember it: wait for the work instead, then free now (the
            // caller sees deferred_ still set when that wait failed).
            (void)settle();
            return false;
        }
#else
        deferred_->push_back(allocation);
#endif
        return true;
    }

    B* backend_;
    StagerStats* stats_;
    ErrorSink sink_;
    std::vector<void*>* deferred_ = nullptr;
    Settle settle_ = nullptr;
    void* context_ = nullptr;
};

namespace strategy_requires {

/// `S::alignment`: a static constexpr power of two; slices start at multiples of it.
template <class S>
concept alignment = requires {
    requires std::has_single_bit(std::integral_constant<std::size_t, S::alignment>::value);
};

/// `S::lease_kind`: ReleaseKind::BufferNoop (slices of `base()`, cut by the Stager) or
/// ReleaseKind::Free (one allocation per tensor, made by `acquire`).
template <class S>
concept lease_kind = requires {
    requires S::lease_kind == ReleaseKind::BufferNoop || S::lease_kind == ReleaseKind::Free;
};

/// `s.prepare(b, requirement, stats, queue)` noexcept -> Status: make the slot meet the
/// requirement (grow), giving back replaced memory through the queue.
template <class S, class B>
concept prepare = requires(S& s, B& b, const Requirement& r, StagerStats& stats, FreeQueue<B>& queue) {
    { s.prepare(b, r, stats, queue) }
    noexcept->std::same_as<Status>;
};

/// `s.acquire(b, tensor, arg, lease, stats)` noexcept -> Status: writes the lease of one
/// staged arg (an allocation for Free strategies, a slice for BufferNoop ones).
template <class S, class B>
concept acquire = requires(S& s, B& b, const PlannedTensor& t, const TensorArg& a, TensorLease& l, StagerStats& st) {
    { s.acquire(b, t, a, l, st) }
    noexcept->std::same_as<Status>;
};

/// `s.release_retained(b, stats)` noexcept -> Status: gives back memory kept across runs.
template <class S, class B>
concept release_retained = requires(S& s, B& b, StagerStats& stats) {
    { s.release_retained(b, stats) }
    noexcept->std::same_as<Status>;
};

/// `s.abandon(stats)` noexcept: forgets retained memory without calling the backend.
template <class S>
concept abandon = requires(S& s, StagerStats& stats) {
    { s.abandon(stats) }
    noexcept;
};

/// `cs.capacity()` and `cs.base()`: usable bytes from the aligned base, and that base.
template <class S>
concept inspection = requires(const S& cs) {
    { cs.capacity() }
    noexcept->std::convertible_to<std::size_t>;
    { cs.base() }
    noexcept->std::convertible_to<const void*>;
};

}  // namespace strategy_requires

/// A temporary-buffer strategy the Stager can stage runs of backend B through.
/// `static_assert(devstage::StagingStrategy<RetainedBump<>, SimBackend>);`
template <class S, class B>
concept StagingStrategy =
    Backend<B> && std::move_constructible<S> && std::copy_constructible<S> && strategy_requires::alignment<S> &&
    strategy_requires::lease_kind<S> && strategy_requires::prepare<S, B> && strategy_requires::acquire<S, B> &&
    strategy_requires::release_retained<S, B> && strategy_requires::abandon<S> && strategy_requires::inspection<S>;

/// A strategy whose args live in one retained buffer the Stager slices itself.
template <class S, class B>
concept RetainedStrategy = StagingStrategy<S, B> && S::lease_kind == ReleaseKind::BufferNoop;

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
