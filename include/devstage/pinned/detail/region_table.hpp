// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: RegionTable, the regions of one owner (a pinned pool) and the hooks told about
/// them. Every region listed has had the current hooks' `added` called for it, and its
/// `removing` is called exactly once, before it leaves the table. Thread-safe: the table is
/// guarded by one mutex, the hook calls are serialized by another and made without the first,
/// so a hook may list or describe regions (but must not create or free one of the same owner:
/// that waits for the hook).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/region.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class RegionTable {
public:
    RegionTable() = default;
    RegionTable(const RegionTable&) = delete;
    RegionTable& operator=(const RegionTable&) = delete;

    /// Lists `region` (its id is set here unless it has one) once the hooks' `added` accepted it. A refusal, or no
    /// host memory to list it (then `removing` is called), leaves it unlisted: the caller frees
    /// the memory. `what` names the operation for the message.
    Status add(PinnedRegion& region, const char* what) noexcept {
        if (region.id == 0) region.id = next_region_id();
        std::lock_guard hooks(hooks_mutex_);
        if (Status accepted = call_added(hooks_, region); !accepted) {
            return Status(accepted.code(),
                          message_or_empty(what, ": the region hook refused region ", region.id, " (", region.bytes,
                                           " bytes at ", region.base, "): ", accepted.message()));
        }
        bool listed = false;
        {
            std::lock_guard lock(mutex_);
            listed = try_host_allocation([&] { regions_.emplace(key(region.base), region); });
        }
        if (!listed) {
            if (hooks_.removing) hooks_.removing(region);
            return Status(Errc::out_of_memory, message_or_empty(what, ": host memory exhausted listing region ",
                                                                region.id, " (", region.bytes, " bytes)"));
        }
        return {};
    }

    /// Calls `removing` for the region at `base`, then unlists it; nothing when none is listed.
    void remove(const void* base) noexcept {
        std::lock_guard hooks(hooks_mutex_);
        std::optional<PinnedRegion> found;
        {
            std::lock_guard lock(mutex_);
            const auto it = regions_.find(key(base));
            if (it == regions_.end()) return;
            found = it->second;
        }
        if (hooks_.removing) hooks_.removing(*found);
        std::lock_guard lock(mutex_);
        regions_.erase(key(base));
    }

    /// Replaces the hooks: the old ones' `removing` runs for every listed region, then the new
    /// ones' `added`. When a new `added` fails, the new `removing` runs for the regions it had
    /// accepted, the old hooks' `added` runs again for every region (their state is restored)
    /// and the failure is returned; the old hooks stay.
    Status set_hooks(RegionHooks hooks) noexcept {
        std::lock_guard guard(hooks_mutex_);
        std::vector<PinnedRegion> listed;
        if (!try_host_allocation([&] { listed = list(); })) {
            return Status(Errc::out_of_memory, "set_region_hooks: host memory exhausted listing the regions");
        }
        if (hooks_.removing) {
            for (const PinnedRegion& region : listed) hooks_.removing(region);
        }
        for (auto region = listed.begin(); region != listed.end(); ++region) {
            Status accepted = call_added(hooks, *region);
            if (accepted) continue;
            if (hooks.removing) {
                for (auto done = listed.begin(); done != region; ++done) hooks.removing(*done);
            }
            for (const PinnedRegion& again : listed) (void)call_added(hooks_, again);
            return Status(accepted.code(), message_or_empty("set_region_hooks: the new hook refused region ",
                                                            region->id, " (", region->bytes, " bytes at ", region->base,
                                                            "): ", accepted.message(), "; the previous hooks stay"));
        }
        hooks_ = std::move(hooks);
        return {};
    }

    /// The listed regions, by base address.
    std::vector<PinnedRegion> list() const {
        std::lock_guard lock(mutex_);
        std::vector<PinnedRegion> out;
        out.reserve(regions_.size());
        for (const auto& [base, region] : regions_) out.push_back(region);
        return out;
    }

    /// The listed region holding `pointer`, if any.
    std::optional<PinnedRegion> containing(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        auto next = regions_.upper_bound(key(pointer));
        if (next == regions_.begin()) return std::nullopt;
        const PinnedRegion& region = std::prev(next)->second;
        if (key(pointer) - key(region.base) >= region.bytes) return std::nullopt;
        return region;
    }

    std::size_t size() const noexcept {
        std::lock_guard lock(mutex_);
        return regions_.size();
    }

private:
    static std::uintptr_t key(const void* pointer) noexcept { return reinterpret_cast<std::uintptr_t>(pointer); }

    static Status call_added(const RegionHooks& hooks, const PinnedRegion& region) noexcept {
        if (!hooks.added) return {};
        return hooks.added(region);
    }

    mutable std::mutex mutex_;  ///< regions_
    std::mutex hooks_mutex_;    ///< hooks_, and every hook call
    std::map<std::uintptr_t, PinnedRegion> regions_;
    RegionHooks hooks_;
};

}  // namespace devstage::detail
