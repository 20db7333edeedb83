// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedBlockCache, the released blocks a pinned pool's core keeps — the cache, by
/// block size, of blocks given back for reuse, and the retiring blocks, given back with
/// recorded work pending and freed once it completed — with their counters and the cache's
/// bound. A pending block (recorded work not known to have completed) waits in the cache when
/// the bound has room, handed out only once its work is known complete, else it is retiring.
/// Not thread-safe: the core calls it under its mutex; it makes no backend call.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/stats.hpp"

namespace devstage::detail {

template <class B>
class PinnedBlockCache {
public:
    using Entry = PinnedEntry<B>;
    using Map = std::multimap<std::size_t, Entry>;
    using Node = typename Map::node_type;

    /// `max_cached_bytes`: the most block bytes the cache keeps (0: it keeps none).
    explicit PinnedBlockCache(std::size_t max_cached_bytes) noexcept : max_cached_bytes_(max_cached_bytes) {}

    /// A cached block of exactly `capacity` on NUMA node `node` with no pending work, out of
    /// the cache.
    std::optional<PinnedBlock> take_idle(std::size_t capacity, int node) noexcept {
        const auto [first, last] = cache_.equal_range(capacity);
        const auto found = std::find_if(first, last, [node](const auto& entry) {
            return !entry.second.pending() && entry.second.block.node == node;
        });
        if (found == last) return std::nullopt;
        const PinnedBlock block = found->second.block;
        count(found->second, false, -1);
        cache_.erase(found);
        return block;
    }

    /// The oldest cached block of `capacity` on `node` whose pending work may be queried (not
    /// `unknown`), out of the cache: the caller queries it, then gives it back (put_back) or
    /// takes it.
    std::optional<Node> take_pending(std::size_t capacity, int node) noexcept {
        const auto [first, last] = cache_.equal_range(capacity);
        const auto found = std::find_if(first, last, [node](const auto& entry) {
            return !entry.second.unknown && entry.second.block.node == node;
        });
        if (found == last) return std::nullopt;
        count(found->second, false, -1);
        return cache_.extract(found);
    }

    /// Files `entry` (its uses moved out) in the cache when `cacheable` and the bound has room,
    /// else — pending, or when `retire_any` — among the retiring blocks. Returns where it went:
    /// nullopt when it went nowhere (an idle block the cache does not keep, or no host memory
    /// for the node: `entry` is then untouched and the caller frees or waits).
    enum class Where : std::uint8_t { cache, retiring };
    std::optional<Where> keep(Entry& entry, bool cacheable) noexcept {
        if (cacheable && fits(entry.block.capacity) && file(cache_, false, entry)) return Where::cache;
        if (entry.pending() && file(retiring_, true, entry)) return Where::retiring;
        return std::nullopt;
    }

    /// A pending block back where it may wait: the cache when `cacheable` and the bound has
    /// room, else retiring.
    void put_back(Node node, bool cacheable) noexcept {
        if (cacheable && fits(node.mapped().block.capacity)) {
            count(node.mapped(), false, +1);
            cache_.insert(std::move(node));
        } else {
            retire(std::move(node));
        }
    }
    void retire(Node node) noexcept {
        count(node.mapped(), true, +1);
        retiring_.insert(std::move(node));
    }

    /// Moves every cached block (and the retiring ones when `retiring`) into `batch`.
    void take_all(Map& batch, bool retiring) noexcept {
        for (const auto& [capacity, entry] : cache_) count(entry, false, -1);
        batch.merge(cache_);  // node moves: no host allocation
        if (!retiring) return;
        for (const auto& [capacity, entry] : retiring_) count(entry, true, -1);
        batch.merge(retiring_);
    }

    /// Moves the retiring blocks whose work may be queried into `batch`.
    void take_queryable_retiring(Map& batch) noexcept {
        for (auto it = retiring_.begin(); it != retiring_.end();) {
            const auto next = std::next(it);
            if (!it->second.unknown) {
                count(it->second, true, -1);
                batch.insert(retiring_.extract(it));
            }
            it = next;
        }
    }

    /// Moves the blocks (cached or retiring) for which `pred(entry)` holds into `batch`.
    template <class Pred>
    void take_if(Map& batch, Pred&& pred) noexcept {
        for (Map* map : {&cache_, &retiring_}) {
            for (auto it = map->begin(); it != map->end();) {
                const auto next = std::next(it);
                if (pred(it->second)) {
                    count(it->second, map == &retiring_, -1);
                    batch.insert(map->extract(it));
                }
                it = next;
            }
        }
    }

    /// Calls `f(entry)` for every cached and retiring block.
    template <class F>
    void for_each(F&& f) const {
        for (const auto& [capacity, entry] : cache_) f(entry);
        for (const auto& [capacity, entry] : retiring_) f(entry);
    }

    bool has_retiring() const noexcept { return !retiring_.empty(); }
    bool has_cached() const noexcept { return !cache_.empty(); }
    /// The retiring blocks, and their bytes.
    std::pair<std::uint64_t, std::uint64_t> retiring() const noexcept { return {retiring_.size(), retiring_bytes_}; }

    /// Adds the cache's counters to `stats`.
    void add_to(PinnedStats& stats) const noexcept {
        stats.cached_blocks = cache_.size();
        stats.cached_bytes = cached_bytes_;
        stats.retiring_blocks = retiring_.size();
        stats.retiring_bytes = retiring_bytes_;
        stats.pending_blocks = pending_blocks_;
        stats.pending_bytes = pending_bytes_;
    }

private:
    bool fits(std::size_t capacity) const noexcept { return cached_bytes_ + capacity <= max_cached_bytes_; }

    /// Files `entry` in `map` and counts it there; false, with `entry` untouched, when the host
    /// has no memory for the node (which is made before anything moves).
    bool file(Map& map, bool retiring, Entry& entry) noexcept {
        typename Map::iterator placed;
        if (!try_host_allocation([&] { placed = map.emplace(entry.block.capacity, Entry{entry.block, {}, false}); })) {
            return false;
        }
        placed->second.uses = std::move(entry.uses);
        placed->second.unknown = entry.unknown;
        count(placed->second, retiring, +1);
        return true;
    }

    /// Adds (`sign` +1) or removes (-1) `entry` in the byte counters of its map and of pending
    /// blocks.
    void count(const Entry& entry, bool retiring, int sign) noexcept {
        const std::uint64_t bytes = entry.block.capacity;
        const auto apply = [sign](std::uint64_t& counter, std::uint64_t amount) {
            counter = sign > 0 ? counter + amount : counter - amount;
        };
        apply(retiring ? retiring_bytes_ : cached_bytes_, bytes);
        if (entry.pending()) {
            apply(pending_blocks_, 1);
            apply(pending_bytes_, bytes);
        }
    }

    std::size_t max_cached_bytes_;
    Map cache_;
    Map retiring_;  ///< released blocks with pending work, freed (not cached) once it completed
    std::uint64_t cached_bytes_ = 0, retiring_bytes_ = 0, pending_blocks_ = 0, pending_bytes_ = 0;
};

}  // namespace devstage::detail
