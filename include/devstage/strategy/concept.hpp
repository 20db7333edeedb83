// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The interface a temporary-buffer strategy offers the Stager: the StagingStrategy concept
/// (each operation its own named concept, so a strategy missing one is rejected naming it),
/// its refinements for retained buffers and for buffers with a pinned host mirror, the
/// Requirement a strategy must meet before a run, and the FreeQueue through which it gives back
/// device memory that pending stream work may still touch. The Stager uses nothing of a
/// strategy beyond these concepts (docs/staging.md has them as a table).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <bit>
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "devstage/backend.hpp"
#include "devstage/detail/strategy/free_queue.hpp"
#include "devstage/detail/strategy/slice.hpp"
#include "devstage/lease.hpp"
#include "devstage/mirror_source.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/strategy/packing.hpp"
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
    /// of the device buffer (the packed region of a mapped run): such a strategy's buffer
    /// needs device_bytes - mapped_bytes once its mirror is mapped. 0: none.
    std::size_t mapped_bytes = 0;
    /// Map a new mirror for the device where the backend can (the stager maps small args).
    bool map_mirror = false;
    /// Where a new mirror's pinned memory comes from (StagerOptions::mirror_source); null: the
    /// backend's pinned_malloc. It outlives the mirrors made from it.
    const MirrorSource* mirror_source = nullptr;
};

/// Device memory a strategy gives back goes through here: freed at once when no stream work
/// of the slot is pending, else queued and freed by the Stager once the slot's pending work
/// completed (StagerStats::deferred_frees). `queue.free(old_buffer)`
template <Backend B>
using FreeQueue = detail::FreeQueue<B>;

namespace strategy_requires {

/// `S::alignment`: a static constexpr power of two; slices start at multiples of it.
template <class S>
concept alignment = requires {
    requires std::has_single_bit(std::integral_constant<std::size_t, S::alignment>::value);
};

/// `S::lease_kind`: ReleaseKind::BufferNoop (slices of `base()`, laid out by the bump rule) or
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
/// staged arg, its own allocation (a Free strategy's only).
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

/// `cs.mirror()` -> std::byte*, `cs.mirror_capacity()` -> std::size_t: the pinned host mirror
/// of the buffer's packed region (null and 0 before any packed run); `cs.mirror_device()` ->
/// void*: its device address where it is mapped for the device, else null.
template <class S>
concept mirror = requires(const S& cs) {
    { cs.mirror() }
    noexcept->std::same_as<std::byte*>;
    { cs.mirror_capacity() }
    noexcept->std::same_as<std::size_t>;
    { cs.mirror_device() }
    noexcept->std::same_as<void*>;
};

/// `cs.device_need(requirement)` noexcept -> std::size_t: the device buffer bytes the
/// requirement takes of the slot as its mirror is now (less the mapped region once mapped).
template <class S>
concept device_need = requires(const S& cs, const Requirement& r) {
    { cs.device_need(r) }
    noexcept->std::same_as<std::size_t>;
};

/// `S::packing`: a PackingPolicy, the defaults of the stager's pack limit and mapping.
template <class S>
concept packing = requires {
    typename S::packing;
    requires PackingPolicy<typename S::packing>;
};

/// `s.set_growth(rule)` noexcept: takes a GrowthRule chosen at run time (StagerOptions::growth).
template <class S>
concept growth_rule = requires(S& s, const GrowthRule& rule) {
    { s.set_growth(rule) }
    noexcept;
};

/// `s.set_grow_order(order)` noexcept: takes a GrowOrder chosen at run time (StagerOptions::grow_order).
template <class S>
concept grow_order = requires(S& s, GrowOrder order) {
    { s.set_grow_order(order) }
    noexcept;
};

/// `s.adopt(backend, allocation, bytes, stats)`: takes a device buffer allocated elsewhere as
/// the retained buffer (Stager::adopt).
template <class S, class B>
concept adopt = requires(S& s, B& b, void* p, std::size_t n, StagerStats& stats) {
    s.adopt(b, p, n, stats);
};

/// `s.detach(stats)`: hands the retained buffer out without freeing it (Stager::detach).
template <class S>
concept detach = requires(S& s, StagerStats& stats) {
    s.detach(stats);
};

}  // namespace strategy_requires

/// A temporary-buffer strategy the Stager can stage runs of backend B through.
/// `static_assert(devstage::StagingStrategy<RetainedBump<>, SimBackend>);`
template <class S, class B>
concept StagingStrategy = Backend<B> && std::move_constructible<S> && std::copy_constructible<S> &&
    strategy_requires::alignment<S> && strategy_requires::lease_kind<S> && strategy_requires::prepare<S, B> &&
    strategy_requires::release_retained<S, B> && strategy_requires::abandon<S> && strategy_requires::inspection<S>;

/// A strategy with one allocation per staged arg (ReleaseKind::Free), made by `acquire` and
/// freed by the Stager through the lease when the run ends.
template <class S, class B>
concept AllocatingStrategy =
    StagingStrategy<S, B> && S::lease_kind == ReleaseKind::Free&& strategy_requires::acquire<S, B>;

/// A strategy whose args live in one retained buffer: each run's staged args are slices of
/// `base()`, laid out by the bump rule at `alignment` (the Stager cuts them, in one pass with
/// the plan), within `capacity()` once `prepare` met the run's Requirement.
template <class S, class B>
concept RetainedStrategy = StagingStrategy<S, B> && S::lease_kind == ReleaseKind::BufferNoop;

/// A retained strategy with a pinned host mirror of its packed region: a stager over it packs
/// small args (one copy each way), maps them for the device where the backend can, and hands
/// out frames. Its `packing` policy gives the defaults of the stager's options.
template <class S, class B>
concept MirroredStrategy = RetainedStrategy<S, B> && strategy_requires::mirror<S> &&
    strategy_requires::device_need<S> && strategy_requires::packing<S>;

/// The lease of `tensor` (planned at S::alignment) in a retained strategy's buffer: the slice
/// the Stager cuts for it. One outside the buffer is invalid_argument, never undefined behaviour.
/// `Status s = devstage::slice(strategy, backend, tensor, args[tensor.arg_index], lease);`
template <class S, class B>
requires RetainedStrategy<S, B> Status slice(const S& strategy, const B& backend, const PlannedTensor& tensor,
                                             const TensorArg& arg, TensorLease& lease)
noexcept {
    void* const base = const_cast<void*>(static_cast<const void*>(strategy.base()));  // NOLINT: the buffer's
    return detail::slice_lease(base, strategy.capacity(), tensor, arg, lease, "retained buffer", backend);
}

namespace detail {

/// The pack limit a stager over S defaults to: its packing policy's (0 without a mirror).
template <class S>
constexpr std::size_t pack_limit_of() noexcept {
    if constexpr (strategy_requires::packing<S> && strategy_requires::mirror<S>) {
        return S::packing::limit;
    } else {
        return 0;
    }
}

/// Whether a stager over S maps its small args by default: its packing policy's choice.
template <class S>
constexpr bool maps_of() noexcept {
    if constexpr (strategy_requires::packing<S> && strategy_requires::mirror<S>) {
        return S::packing::map;
    } else {
        return false;
    }
}

/// A strategy's base, as bytes (null when it holds nothing).
template <class S>
std::byte* base_of(const S& strategy) noexcept {
    return static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(strategy.base())));  // NOLINT
}

/// A strategy's mirror (null without one).
template <class S>
std::byte* mirror_of(const S& strategy) noexcept {
    if constexpr (strategy_requires::mirror<S>) {
        return strategy.mirror();
    } else {
        (void)strategy;
        return nullptr;
    }
}
template <class S>
std::size_t mirror_capacity_of(const S& strategy) noexcept {
    if constexpr (strategy_requires::mirror<S>) {
        return strategy.mirror_capacity();
    } else {
        (void)strategy;
        return 0;
    }
}
/// The device address of a strategy's mapped mirror; null when it is not mapped.
template <class S>
std::byte* mapped_mirror_of(const S& strategy) noexcept {
    if constexpr (strategy_requires::mirror<S>) {
        return static_cast<std::byte*>(strategy.mirror_device());
    } else {
        (void)strategy;
        return nullptr;
    }
}
/// The device buffer bytes `need` takes of a strategy's slot as its mirror is now.
template <class S>
std::size_t device_need_of(const S& strategy, const Requirement& need) noexcept {
    if constexpr (strategy_requires::device_need<S>) {
        return strategy.device_need(need);
    } else {
        (void)strategy;
        return need.device_bytes;
    }
}

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
