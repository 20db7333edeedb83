// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedRegistry, the live allocations of a pinned pool's core — each grant by the
/// pointer handed out, with its block, size, id, holder and the streams record() named — and
/// their counters. Not thread-safe: the core calls it under its mutex.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/stats.hpp"

namespace devstage::detail {

template <class B>
class PinnedRegistry {
public:
    using Grant = PinnedCore::Grant;
    using Use = PinnedUse<B>;
    using Stream = typename Use::Stream;

    /// A granted allocation; the key is the pointer handed out (the block's base, or aligned up).
    struct Live {
        PinnedBlock block;
        std::size_t requested = 0;
        std::uint64_t id = 0;
        PinnedHolder holder = PinnedHolder::raw;
        bool detached = false;  ///< outlived a finalize(): freed, not cached, when given back
        bool revoked = false;   ///< its block went back to the backend when the backend was torn down
        std::vector<Use> uses;  ///< the streams record() named
    };
    using Map = std::map<void*, Live, std::less<>>;

    /// Records the grant of `block` as `pointer`; nullopt when the host has no memory for it.
    std::optional<Grant> enroll(const PinnedBlock& block, void* pointer, std::size_t bytes,
                                PinnedHolder holder) noexcept {
        const std::uint64_t id = next_id_ + 1;
        if (!try_host_allocation([&] { live_.emplace(pointer, Live{block, bytes, id, holder, false, false, {}}); })) {
            return std::nullopt;
        }
        next_id_ = id;
        live_bytes_ += bytes;
        peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
        return Grant{pointer, id};
    }

    /// The live allocation at `pointer` (grant `id` unless 0), or null.
    Live* find(const void* pointer, std::uint64_t id) noexcept {
        const auto found = live_.find(pointer);
        if (found == live_.end() || (id != 0 && found->second.id != id)) return nullptr;
        return &found->second;
    }
    typename Map::iterator lookup(const void* pointer) noexcept { return live_.find(pointer); }
    typename Map::iterator end() noexcept { return live_.end(); }
    bool contains(const void* pointer) const noexcept { return live_.find(pointer) != live_.end(); }

    /// The live allocation whose bytes hold `pointer`, and where it starts.
    std::optional<std::pair<const void*, const Live*>> containing(const void* pointer) const noexcept {
        auto next = live_.upper_bound(pointer);
        if (next == live_.begin()) return std::nullopt;
        const auto found = std::prev(next);
        const auto offset = reinterpret_cast<std::uintptr_t>(pointer) - reinterpret_cast<std::uintptr_t>(found->first);
        if (offset >= std::max<std::size_t>(found->second.requested, 1)) return std::nullopt;
        return std::pair<const void*, const Live*>{found->first, &found->second};
    }

    /// Drops a live allocation from the registry and the counters; returns it.
    Live unlist(typename Map::iterator found) noexcept {
        Live live = std::move(found->second);
        live_bytes_ -= live.requested;
        if (live.detached) {
            --detached_allocations_;
            detached_bytes_ -= live.requested;
        }
        live_.erase(found);
        return live;
    }

    /// A raw allocation, out of the registry; nullopt when none is left. One at a time, so no
    /// host memory is needed to collect them.
    std::optional<Live> take_raw() noexcept {
        const auto found = std::find_if(live_.begin(), live_.end(),
                                        [](const auto& entry) { return entry.second.holder == PinnedHolder::raw; });
        if (found == live_.end()) return std::nullopt;
        return unlist(found);
    }

    /// Marks every live allocation detached (counted once in the finalized counters); returns
    /// how many (and how many bytes) are held by buffers or containers — and by raw pointers
    /// too unless `skip_raw`.
    std::pair<std::uint64_t, std::uint64_t> detach_all(bool skip_raw) noexcept {
        std::uint64_t held = 0, held_bytes = 0;
        for (auto& [pointer, live] : live_) {
            if (!live.detached) {
                live.detached = true;
                ++detached_allocations_;
                detached_bytes_ += live.requested;
                ++finalized_allocations_;
                finalized_bytes_ += live.requested;
            }
            if (skip_raw && live.holder == PinnedHolder::raw) continue;
            ++held;
            held_bytes += live.requested;
        }
        return {held, held_bytes};
    }

    /// Calls `f(pointer, live)` for every live allocation.
    template <class F>
    void for_each(F&& f) noexcept {
        for (auto& [pointer, live] : live_) f(pointer, live);
    }

    /// The use of `stream` of `backend` recorded on `live`, or null.
    static Use* find_use(Live& live, const B& backend, Stream stream) noexcept {
        for (Use& use : live.uses) {
            if (use.backend == &backend && use.stream == stream) return &use;
        }
        return nullptr;
    }

    bool empty() const noexcept { return live_.empty(); }

    /// Adds the registry's counters to `stats`.
    void add_to(PinnedStats& stats) const noexcept {
        stats.live_allocations = live_.size();
        stats.live_bytes = live_bytes_;
        stats.peak_live_bytes = peak_live_bytes_;
        stats.detached_allocations = detached_allocations_;
        stats.detached_bytes = detached_bytes_;
        stats.finalized_allocations = finalized_allocations_;
        stats.finalized_bytes = finalized_bytes_;
    }

private:
    Map live_;
    std::uint64_t next_id_ = 0;
    std::uint64_t live_bytes_ = 0, peak_live_bytes_ = 0;
    std::uint64_t detached_allocations_ = 0, detached_bytes_ = 0;
    std::uint64_t finalized_allocations_ = 0, finalized_bytes_ = 0;
};

}  // namespace devstage::detail
