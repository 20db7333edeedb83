// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// StagerOptions: what a Stager is configured with at run time — its pipeline slots, what it
/// does with Out args, whether and up to what size it packs small args into a pinned mirror,
/// whether it maps that mirror for the device, and how its retained buffers grow. The backend,
/// the strategy kind and the alignment stay compile-time (the Stager's template parameters).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <optional>

#include "devstage/output_policy.hpp"
#include "devstage/strategy/growth.hpp"

namespace devstage {

/// `Stager<SimBackend> stager(sim, {}, StagerOptions{.pipeline_slots = 2, .pack_limit = 8192});`
/// An option left unset takes the strategy's default: `pack_limit` and `map_small` its packing
/// policy's (PackSmall<N>: N and no mapping; MapSmall<N>: N and mapping; none: 0), `growth` and
/// `grow_order` what the strategy was constructed with.
struct StagerOptions {
    /// Pipeline slots (0 counts as 1; at most Stager::max_pipeline_slots).
    std::size_t pipeline_slots = 1;
    /// What binds do with the device bytes of Out args (Stager::set_output_policy changes it later).
    OutputPolicy outputs = OutputPolicy::zero;
    /// Staged args of at most this many bytes go through the slot's pinned mirror, one copy each
    /// way; 0 packs nothing (and hands out no frames). Needs a strategy with a mirror
    /// (MirroredStrategy) over a PinnedHostBackend.
    std::optional<std::size_t> pack_limit = std::nullopt;
    /// Map the mirror for the device where the backend can (MappedHostBackend): the kernel uses
    /// the small args in place, with no copy. Needs a pack limit above 0.
    std::optional<bool> map_small = std::nullopt;
    /// How the retained buffers grow, and in which order a grow allocates and frees (strategies
    /// that take these at run time: RetainedBump<GrowthRule>).
    std::optional<GrowthRule> growth = std::nullopt;
    std::optional<GrowOrder> grow_order = std::nullopt;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
