// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the released blocks a pinned pool's core keeps (PinnedBlockCache, the fourth layer
/// of its core): the cache, by size class, of blocks given back for reuse, and the retiring
/// blocks, given back with recorded work pending and freed once it completed; their counters,
/// the release of a block into one or the other, and trim().

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The cached and the retiring blocks of a pool's core, under the cache policy `Cache`. A
/// pending block (recorded work not known to have completed) waits in the cache when the policy
/// would keep it, handed out only once a query finds its work complete, else it is retiring.
template <PinnedHostBackend B, class Cache>
class PinnedBlockCache : public PinnedRegistry<B> {
    using Base = PinnedRegistry<B>;

protected:
    static constexpr bool caching = !std::is_same_v<Cache, DirectPinned>;
    using Base::free_block;
    using Base::mark;
    using Base::mutex_;
    using Base::name_;
    using Base::poll;
    using Base::recycle;
    using Base::stats_;
    using Base::streams;
    using Base::wait_for;
    using typename Base::Block;
    using typename Base::Cached;
    using typename Base::Lock;
    using typename Base::Tally;
    using typename Base::Use;

public:
    PinnedBlockCache(B& backend, Cache cache) : Base(backend), cache_policy_(std::move(cache)) {}
    using Base::report;

    /// Frees every cached and retiring block, waiting first for the recorded work of pending
    /// ones (the host blocks); nothing live is touched. A block whose wait fails stays
    /// allocated (retiring, never reused) and the failure is returned.
    Status trim() noexcept {
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            take_all(batch);
        }
        Tally tally;
        free_all(batch, true, "trim", tally);
        return tally.status("trim", name_);
    }

protected:
    using CacheMap = std::multimap<std::size_t, Cached>;
    enum class Where : std::uint8_t { cache, retiring };

    std::size_t block_size(std::size_t bytes) const noexcept {
        if constexpr (caching) return Cache::size_class(bytes);
        return bytes;
    }

    /// Precondition: mutex_ held. A cached block of exactly `capacity` on NUMA node `node` (-1:
    /// the backend's pinned_malloc memory) with no pending work, out of the cache.
    std::optional<Block> take_cached(std::size_t capacity, int node) noexcept {
        const auto [first, last] = cache_.equal_range(capacity);
        const auto found = std::find_if(first, last, [node](const auto& entry) {
            return !entry.second.pending() && entry.second.block.node == node;
        });
        if (found == last) return std::nullopt;
        const Block block = found->second.block;
        count(found->second, Where::cache, -1);
        cache_.erase(found);
        return block;
    }

    /// Precondition: `lock` holds mutex_; returns with it held. The oldest cached block of
    /// `capacity` whose recorded work is pending, if a query (made without the lock) finds
    /// that work completed; else that block goes back and a query failure lands in `failure`
    /// (the block then counts as pending until a wait settles it).
    std::optional<Block> take_completed(Lock& lock, std::size_t capacity, int numa_node,
                                        Status& failure) noexcept requires streams {
        const auto [first, last] = cache_.equal_range(capacity);
        const auto found = std::find_if(first, last, [numa_node](const auto& entry) {
            return !entry.second.unknown && entry.second.block.node == numa_node;
        });
        if (found == last) return std::nullopt;
        count(found->second, Where::cache, -1);
        typename CacheMap::node_type node = cache_.extract(found);
        Cached& entry = node.mapped();
        lock.unlock();
        const Result<bool> done = poll(entry);
        lock.lock();
        if (done && *done) {
            recycle(entry);
            return entry.block;
        }
        ++stats_.pending_skips;
        if (!done) {
            entry.unknown = true;
            failure = Status(done.status().code(),
                             message_or_empty("pinned pool allocate: querying the work recorded on a cached ", capacity,
                                              "-byte block failed on backend '", name_, "': ", done.status().message(),
                                              "; the block stays pending until trim(), finalize() or the pool's "
                                              "destruction waits for it"));
        }
        refile(std::move(node));
        return std::nullopt;
    }

    /// Precondition: `lock` holds mutex_; returns with it released. A block no longer held and
    /// with no pending work: into the cache when `cacheable`, the pool is open and the policy
    /// has room (and the host has memory for the entry), else back to the backend.
    Status retire(Lock& lock, const Block& block, bool cacheable) noexcept {
        if constexpr (caching) {
            const Cached idle{block, {}, false};
            if (cacheable && !closed_ && fits(block.capacity) &&
                try_host_allocation([&] { cache_.emplace(block.capacity, idle); })) {
                count(idle, Where::cache, +1);
                lock.unlock();
                return {};
            }
        }
        lock.unlock();
        return free_block(block);
    }

    /// A block given back with recorded streams (no lock held): an event is recorded on each,
    /// then the block is kept pending, in the cache where retire() would cache it, else
    /// retiring. When an event cannot be had or recorded, the device is synchronized instead
    /// (mark()). When the host has no memory to keep the entry, the release waits for the work
    /// and frees the block.
    Status retire_recorded(Cached entry, bool cacheable, const char* what) noexcept requires streams {
        mark(entry, what);
        Lock lock(mutex_);
        if (!entry.pending()) return retire(lock, entry.block, cacheable);
        const Block block = entry.block;
        if constexpr (caching) {
            if (cacheable && !closed_ && fits(block.capacity) && file(cache_, Where::cache, entry)) return {};
        }
        if (file(retiring_, Where::retiring, entry)) return {};
        lock.unlock();
        if (Status waited = wait_for(entry); !waited) {
            return Status(waited.code(),
                          message_or_empty("pinned pool ", what, ": host memory exhausted keeping a ", block.capacity,
                                           "-byte block with pending work, and waiting for that work failed on "
                                           "backend '",
                                           name_, "': ", waited.message(), "; the block stays allocated"));
        }
        return free_block(block);
    }

    /// Frees the retiring blocks whose recorded work completed, querying without blocking; a
    /// query failure makes the block `unknown` (left to a wait) and is reported.
    void collect() noexcept requires streams {
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            for (auto it = retiring_.begin(); it != retiring_.end();) {
                const auto next = std::next(it);
                if (!it->second.unknown) {
                    count(it->second, Where::retiring, -1);
                    batch.insert(retiring_.extract(it));
                }
                it = next;
            }
        }
        Tally tally;
        while (!batch.empty()) {
            typename CacheMap::node_type node = batch.extract(batch.begin());
            Cached& entry = node.mapped();
            const Result<bool> done = poll(entry);
            if (done && *done) {
                {
                    std::lock_guard lock(mutex_);
                    recycle(entry);
                }
                tally.add(free_block(entry.block));
                continue;
            }
            if (!done) {
                entry.unknown = true;
                report(Status(done.status().code(),
                              message_or_empty("pinned pool release: querying the work recorded on a retiring ",
                                               entry.block.capacity, "-byte block failed on backend '", name_,
                                               "': ", done.status().message(),
                                               "; it is freed after trim(), finalize() or the pool's destruction "
                                               "waits for it")));
            }
            std::lock_guard lock(mutex_);
            count(entry, Where::retiring, +1);
            retiring_.insert(std::move(node));
        }
        if (Status freed = tally.status("release", name_); !freed) report(freed);
    }

    /// Precondition: mutex_ held. Moves the cache and the retiring blocks into `batch`.
    void take_all(CacheMap& batch) noexcept {
        for (const auto& [capacity, entry] : cache_) count(entry, Where::cache, -1);
        for (const auto& [capacity, entry] : retiring_) count(entry, Where::retiring, -1);
        batch.merge(cache_);  // node moves: no host allocation
        batch.merge(retiring_);
    }

    /// Frees `batch` (no lock held). A pending block is first waited for when `wait` (the host
    /// blocks), else it goes back (refile); one whose wait fails stays allocated, retiring and
    /// `unknown`. Adds every free and wait to `tally`.
    void free_all(CacheMap& batch, bool wait, const char* what, Tally& tally) noexcept {
        while (!batch.empty()) {
            typename CacheMap::node_type node = batch.extract(batch.begin());
            Cached& entry = node.mapped();
            if constexpr (streams) {
                if (entry.pending()) {
                    if (!wait) {
                        std::lock_guard lock(mutex_);
                        refile(std::move(node));
                        continue;
                    }
                    if (const Status waited = wait_for(entry); !waited) {
                        tally.add(
                            Status(waited.code(),
                                   message_or_empty("pinned pool ", what, ": waiting for the work recorded on a ",
                                                    entry.block.capacity, "-byte block failed on backend '", name_,
                                                    "': ", waited.message(), "; the block stays allocated")));
                        entry.unknown = true;
                        std::lock_guard lock(mutex_);
                        count(entry, Where::retiring, +1);
                        retiring_.insert(std::move(node));
                        continue;
                    }
                    tally.add({});
                }
            }
            tally.add(free_block(entry.block));
        }
    }

    /// Precondition: mutex_ held. Files `entry` in `map` and counts it there; false, with
    /// `entry` untouched, when the host has no memory for the node (which is made before
    /// anything moves).
    bool file(CacheMap& map, Where where, Cached& entry) noexcept {
        typename CacheMap::iterator placed;
        if (!try_host_allocation([&] { placed = map.emplace(entry.block.capacity, Cached{entry.block, {}, false}); })) {
            return false;
        }
        placed->second.uses = std::move(entry.uses);
        placed->second.unknown = entry.unknown;
        count(placed->second, where, +1);
        return true;
    }

    /// Precondition: mutex_ held. A pending block back where it may wait: the cache while the
    /// pool is open and the policy has room, else retiring.
    void refile(typename CacheMap::node_type node) noexcept {
        const Cached& entry = node.mapped();
        if (caching && !closed_ && fits(entry.block.capacity)) {
            count(entry, Where::cache, +1);
            cache_.insert(std::move(node));
        } else {
            count(entry, Where::retiring, +1);
            retiring_.insert(std::move(node));
        }
    }

    /// Precondition: mutex_ held.
    bool fits(std::size_t capacity) const noexcept {
        if constexpr (caching) return stats_.cached_bytes + capacity <= cache_policy_.max_cached_bytes;
        return false;
    }

    /// Precondition: mutex_ held. Adds (`sign` +1) or removes (-1) `entry` in the counters of
    /// `where` and of pending blocks.
    void count(const Cached& entry, Where where, int sign) noexcept {
        const std::uint64_t bytes = entry.block.capacity;
        const auto apply = [sign](std::uint64_t& counter, std::uint64_t amount) {
            counter = sign > 0 ? counter + amount : counter - amount;
        };
        apply(where == Where::cache ? stats_.cached_blocks : stats_.retiring_blocks, 1);
        apply(where == Where::cache ? stats_.cached_bytes : stats_.retiring_bytes, bytes);
        if (entry.pending()) {
            apply(stats_.pending_blocks, 1);
            apply(stats_.pending_bytes, bytes);
        }
    }

    /// Frees the cached blocks with no pending work after an out-of-memory (pending ones stay:
    /// allocation never waits); true when anything was freed.
    bool trim_some() noexcept {
        if constexpr (caching) {
            CacheMap batch;
            {
                std::lock_guard lock(mutex_);
                if (cache_.empty()) return false;
                for (const auto& [capacity, entry] : cache_) count(entry, Where::cache, -1);
                batch.merge(cache_);
            }
            Tally tally;
            free_all(batch, false, "trim", tally);
            if (Status trimmed = tally.status("trim", name_); !trimmed) report(trimmed);
            return tally.total > 0;
        }
        return false;
    }

    Status closed_error() const noexcept {
        return Status(Errc::invalid_argument,
                      message_or_empty("pinned pool allocate: the pool was destroyed (backend '", name_, "')"));
    }

    Cache cache_policy_;
    CacheMap cache_;
    CacheMap retiring_;  ///< released blocks with pending work, freed (not cached) once it completed
    bool closed_ = false;
};

}  // namespace devstage::detail
