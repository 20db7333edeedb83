// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: a Stager's regions — each slot's retained device buffer (RegionKind::device, with
// the backend's device id) and its pinned mirror (RegionKind::pinned_host), as the strategy
// holds them now — their ids, the hooks a transfer engine registers them with, and describe().
// The memory itself is the strategy's; what is kept here per slot is the region each one was
// listed as (id, base, bytes), so that a region that moved, grew or went is removed once and the
// new one added once. Nothing here runs in the steady state: only a grow, a release, an adopt
// or detach, abandon and the destructor call it.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "devstage/detail/util/message.hpp"
#include "devstage/region.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"

namespace devstage::detail {

/// The regions one slot is listed as: its device buffer and its mirror (id 0: none listed).
/// `unlisted`: the slot holds memory whose `added` hook failed; the next grow tries again.
struct SlotRegions {
    PinnedRegion device{};
    PinnedRegion mirror{};
    void* mirror_device = nullptr;  // the mapped mirror's device address, for describe()
    bool unlisted = false;
};

/// The backend's device id where it tells one (`device_id()`, or an int `device()`), else -1.
template <class B>
int device_id_of(const B& backend) noexcept {
    if constexpr (requires {
                      { backend.device_id() } -> std::convertible_to<int>;
                  }) {
        return static_cast<int>(backend.device_id());
    } else if constexpr (requires {
                             { backend.device() } -> std::same_as<int>;
                         }) {
        return backend.device();
    } else {
        (void)backend;
        return -1;
    }
}

/// The hooks of one stager and the calls that keep its slots' regions listed.
class RegionBook {
public:
    /// The regions listed across `slots`, device buffers first within each slot.
    template <class Slots>
    static std::vector<PinnedRegion> list(const Slots& slots) {
        std::vector<PinnedRegion> regions;
        for (const auto& slot : slots) {
            if (slot.regions.device.id != 0) regions.push_back(slot.regions.device);
            if (slot.regions.mirror.id != 0) regions.push_back(slot.regions.mirror);
        }
        return regions;
    }

    /// The slice `pointer` lies in, in any slot's listed device buffer, mirror, or the mapped
    /// mirror's device address (described as the mirror region): bytes to the end of the region.
    template <class Slots>
    static std::optional<RegionSlice> describe(const Slots& slots, const void* pointer) noexcept {
        const auto at = reinterpret_cast<std::uintptr_t>(pointer);
        const auto in = [at](const void* base, const PinnedRegion& region) -> std::optional<RegionSlice> {
            const auto start = reinterpret_cast<std::uintptr_t>(base);
            if (region.id == 0 || base == nullptr || at < start || at - start >= region.bytes) return std::nullopt;
            return RegionSlice{region.id, at - start, region.bytes - (at - start)};
        };
        for (const auto& slot : slots) {
            if (auto s = in(slot.regions.device.base, slot.regions.device)) return s;
            if (auto s = in(slot.regions.mirror.base, slot.regions.mirror)) return s;
            if (auto s = in(slot.regions.mirror_device, slot.regions.mirror)) return s;
        }
        return std::nullopt;
    }

    /// New hooks: the new `added` runs for every listed region first; when one fails, the new
    /// `removing` runs for those it accepted, the old hooks stay and the failure is returned.
    /// Then the old `removing` runs for every listed region and the new hooks take over.
    template <class Slots>
    Status set_hooks(const Slots& slots, RegionHooks next) noexcept {
        std::vector<PinnedRegion> listed;
#if defined(__cpp_exceptions)
        try {
            listed = list(slots);
        } catch (...) {
            return Status(Errc::out_of_memory, "stager set_region_hooks: host memory to list the regions");
        }
#else
        listed = list(slots);
#endif
        for (std::size_t i = 0; i < listed.size(); ++i) {
            Status accepted = next.added ? next.added(listed[i]) : Status{};
            if (accepted.ok()) continue;
            const std::uint64_t refused = listed[i].id;
            while (i > 0) {
                --i;
                if (next.removing) next.removing(listed[i]);
            }
            return Status(accepted.code(), message("stager set_region_hooks: the added hook refused region ", refused,
                                                   ": ", accepted.message(), "; the old hooks stay"));
        }
        for (const PinnedRegion& region : listed) {
            if (hooks_.removing) hooks_.removing(region);
        }
        hooks_ = std::move(next);
        return {};
    }

    /// Removes slot's listed device buffer (`device`) and/or mirror (`mirror`): `removing` runs
    /// and the entry is cleared.
    void remove(SlotRegions& slot, bool device, bool mirror) noexcept {
        if (device) drop(slot.device);
        if (mirror) {
            drop(slot.mirror);
            slot.mirror_device = nullptr;
        }
    }

    /// Lists the memory `strategy` holds now: a listed region that no longer matches it is
    /// removed, memory not listed is added (a new id, then `added`). An `added` that fails leaves
    /// that memory unlisted (`unlisted`: tried again at the next grow) and is returned.
    /// `mirrors`: list the mirror too (false when it lies in a pool's region, which the pool lists).
    template <class Strategy>
    Status sync(SlotRegions& slot, const Strategy& strategy, int device, bool mirrors = true) noexcept {
        Status first;
        void* base = base_of(strategy);
        const std::size_t bytes = base != nullptr ? strategy.capacity() : 0;
        list_one(slot.device, base, bytes, RegionKind::device, device, first);
        void* mirror = mirrors ? static_cast<void*>(mirror_of(strategy)) : nullptr;
        const std::size_t mirror_bytes = mirror != nullptr ? mirror_capacity_of(strategy) : 0;
        list_one(slot.mirror, mirror, mirror_bytes, RegionKind::pinned_host, -1, first);
        slot.mirror_device = slot.mirror.id != 0 ? static_cast<void*>(mapped_mirror_of(strategy)) : nullptr;
        slot.unlisted = !first.ok();
        return first;
    }

private:
    void drop(PinnedRegion& region) noexcept {
        if (region.id == 0) return;
        if (hooks_.removing) hooks_.removing(region);
        region = {};
    }

    void list_one(PinnedRegion& listed, void* base, std::size_t bytes, RegionKind kind, int device,
                  Status& first) noexcept {
        if (listed.id != 0 && (listed.base == base && listed.bytes == bytes)) return;
        drop(listed);
        if (base == nullptr || bytes == 0) return;
        PinnedRegion region{next_region_id(), base, bytes, -1, kind, device};
        if (hooks_.added) {
            if (Status accepted = hooks_.added(region); !accepted) {
                if (first.ok()) {
                    first = Status(accepted.code(),
                                   message("stager: the added hook refused ",
                                           kind == RegionKind::device ? "a retained device buffer" : "a pinned mirror",
                                           " of ", bytes, " bytes: ", accepted.message()));
                }
                return;
            }
        }
        listed = region;
    }

    RegionHooks hooks_;
};

}  // namespace devstage::detail
