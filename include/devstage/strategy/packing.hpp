// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Packing policies of RetainedBump: NoPacking (one copy per staged arg), PackSmall<Limit>
/// (args of at most Limit bytes gathered in a pinned host mirror and moved with one copy each
/// way) and MapSmall<Limit> (the same mirror mapped for the device, read and written by the
/// kernel in place: no copy). A policy is the default of a stager's run-time options
/// (StagerOptions::pack_limit and map_small): every retained stager can pack or map, chosen
/// when it is made.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <concepts>
#include <cstddef>

namespace devstage {

/// One copy per staged arg. `RetainedBump<ExactGrowth, 1024, NoPacking>` (the default)
struct NoPacking {
    static constexpr std::size_t limit = 0;
    static constexpr bool map = false;
};

/// Staged args of at most `Limit` bytes are laid out together, In then InOut then Out, in a
/// retained pinned host mirror with the device buffer's offsets, so one copy uploads them all
/// and one copy brings the outputs back; larger args are copied directly from and to the
/// caller's memory. Needs a PinnedHostBackend. `RetainedBump<ExactGrowth, 1024, PackSmall<>>`
template <std::size_t Limit = 16384>
struct PackSmall {
    static_assert(Limit > 0, "PackSmall<0> packs nothing: use NoPacking");
    static constexpr std::size_t limit = Limit;
    static constexpr bool map = false;
};

/// As PackSmall<Limit>, with the mirror mapped for the device where the backend maps pinned
/// host memory (MappedHostBackend): the kernel reads and writes a run's small args in the
/// mirror, in place — no upload, no copy back; Out args are zeroed by the host. Where the
/// backend cannot map (no such capability, or map_host refused for a slot's mirror), the slot
/// stages as PackSmall<Limit> does. `RetainedBump<ExactGrowth, 1024, MapSmall<>>`
template <std::size_t Limit = 16384>
struct MapSmall {
    static_assert(Limit > 0, "MapSmall<0> maps nothing: use NoPacking");
    static constexpr std::size_t limit = Limit;
    static constexpr bool map = true;
};

/// A packing policy: `P::limit`, the largest arg packed (0: none), and `P::map`, whether the
/// mirror is mapped for the device where the backend can.
template <class P>
concept PackingPolicy = requires {
    { P::limit } -> std::convertible_to<std::size_t>;
    { P::map } -> std::convertible_to<bool>;
};

static_assert(PackingPolicy<NoPacking>);
static_assert(PackingPolicy<PackSmall<>>);
static_assert(PackingPolicy<MapSmall<>>);

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
