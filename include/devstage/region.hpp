// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Regions: long-lived memory that devstage hands out slices of, described so that a transfer
/// engine (NIXL, Mooncake, UCX) registers each region once and names any slice as (region,
/// offset, bytes). PinnedRegion, RegionSlice and RegionHooks are plain vocabulary, owned by no
/// facility: the pinned pool lists its regions with them, and a stager can list its device
/// buffers the same way. Region ids are unique in the process.
/// `pool.set_region_hooks({.added = register_with_nic, .removing = deregister_from_nic});`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "devstage/status.hpp"

namespace devstage {

/// What memory a region is.
enum class RegionKind : std::uint8_t {
    pinned_host,  ///< page-locked host memory (a pinned pool's blocks and regions)
    device,       ///< device memory of `PinnedRegion::device`
};

/// One region: `bytes` of memory at `base`, registered once by an engine. `id` is unique in the
/// process and never reused; `numa_node` is the host node the memory is bound to (-1: none).
/// `for (const PinnedRegion& r : pool.regions()) nic.register_memory(r.base, r.bytes);`
struct PinnedRegion {
    std::uint64_t id = 0;
    void* base = nullptr;
    std::size_t bytes = 0;
    int numa_node = -1;
    RegionKind kind = RegionKind::pinned_host;
    int device = -1;  ///< the device of device memory; -1 for host memory
};

/// A slice of a region: `bytes` at `offset` from the base of region `region` (its id).
/// `auto s = pool.describe(buffer->data()); send(s->region, s->offset, s->bytes);`
struct RegionSlice {
    std::uint64_t region = 0;
    std::size_t offset = 0;
    std::size_t bytes = 0;
};

/// Called once per region: `added` after the region's memory is ready and before any slice of
/// it is handed out — an error fails what created the region, which is then freed, with that
/// error; `removing` before the region's memory is unregistered and freed (or moved). Empty
/// hooks are not called. `RegionHooks{.added = on_added, .removing = on_removing}`
struct RegionHooks {
    std::function<Status(const PinnedRegion&)> added;
    std::function<void(const PinnedRegion&)> removing;
};

namespace detail {
/// A region id never handed out before in this process (0 is never one).
inline std::uint64_t next_region_id() noexcept {
    static std::atomic<std::uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
}
}  // namespace detail

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
