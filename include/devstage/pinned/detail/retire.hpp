// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedRetire, how blocks go back in a pinned pool's core. A block no longer held
/// goes into the cache when the pool keeps it, else back where it came from (a slice to its
/// region, a block to the source). A block given back with recorded streams gets an event
/// recorded on each and is *pending*: cached, or *retiring* (freed once its work completed,
/// which later releases query without blocking). Batches of cached and retiring blocks are
/// freed here, waiting for their work where asked. The cache is guarded by the core's mutex,
/// passed in; every backend call is made without it.

#include <cstddef>
#include <mutex>
#include <string>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/block_source.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/region_set.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class PinnedRetire {
public:
    static constexpr bool streams = AsyncBackend<B>;
    using Lock = std::unique_lock<std::mutex>;
    using Entry = PinnedEntry<B>;
    using Batch = typename PinnedBlockCache<B>::Map;

    /// `mutex` guards `cache` and `phase`.
    PinnedRetire(std::mutex& mutex, const PinnedPhase& phase, PinnedBlockCache<B>& cache, PinnedEvents<B>& events,
                 PinnedBlockSource<B>& source, PinnedRegionSet<B>& regions, const PinnedSink& sink) noexcept
        : mutex_(&mutex),
          phase_(&phase),
          cache_(&cache),
          events_(&events),
          source_(&source),
          regions_(&regions),
          sink_(&sink) {}
    PinnedRetire(const PinnedRetire&) = delete;
    PinnedRetire& operator=(const PinnedRetire&) = delete;

    /// Whether `block` may be cached at all: blocks of the backend only, not slices.
    static bool keeps(const PinnedBlock& block) noexcept {
        return block.source == BlockSource::malloc || block.source == BlockSource::mapped;
    }

    /// Precondition: `lock` holds the core's mutex; returns with it released. A block no longer
    /// held and with no pending work: into the cache when `keep` and the bound has room (and
    /// the host has memory for the entry), else back to where it came from.
    Status retire(Lock& lock, const PinnedBlock& block, bool keep) noexcept {
        if (keep && keeps(block)) {
            Entry idle{block, {}, false};
            if (cache_->keep(idle, true)) {
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
    /// (PinnedEvents::mark). When the host has no memory to keep the entry, the release waits
    /// for the work and frees the block. `what` names the operation.
    Status retire_recorded(Entry entry, bool keep, const char* what) noexcept requires streams {
        events_->mark(entry, what, name());
        Lock lock(*mutex_);
        const bool cache = keep && !phase_->closed() && keeps(entry.block);
        if (!entry.pending()) return retire(lock, entry.block, cache);
        const PinnedBlock block = entry.block;
        if (cache_->keep(entry, cache)) return {};
        lock.unlock();
        if (Status waited = events_->wait_for(entry); !waited) {
            return Status(waited.code(),
                          message_or_empty("pinned pool ", what, ": host memory exhausted keeping a ", block.capacity,
                                           "-byte block with pending work, and waiting for that work failed on "
                                           "backend '",
                                           name(), "': ", waited.message(), "; the block stays allocated"));
        }
        return free_block(block);
    }

    /// Frees the retiring blocks whose recorded work completed, querying without blocking; a
    /// query failure makes the block `unknown` (left to a wait) and is reported.
    void collect() noexcept requires streams {
        Batch batch;
        {
            std::lock_guard lock(*mutex_);
            cache_->take_queryable_retiring(batch);
        }
        Tally tally;
        while (!batch.empty()) {
            typename Batch::node_type node = batch.extract(batch.begin());
            Entry& entry = node.mapped();
            const Result<bool> done = events_->poll(entry);
            if (done && *done) {
                events_->recycle(entry);
                tally.add(free_block(entry.block));
                continue;
            }
            if (!done) {
                entry.unknown = true;
                sink_->report(Status(done.status().code(),
                                     message_or_empty("pinned pool release: querying the work recorded on a retiring ",
                                                      entry.block.capacity, "-byte block failed on backend '", name(),
                                                      "': ", done.status().message(),
                                                      "; it is freed after trim(), finalize() or the pool's "
                                                      "destruction waits for it")));
            }
            std::lock_guard lock(*mutex_);
            cache_->retire(std::move(node));
        }
        if (Status freed = tally.status("release", name()); !freed) sink_->report(freed);
    }

    /// Frees `batch` (no lock held). A pending block is first waited for when `wait` (the host
    /// blocks), else it goes back to the cache; one whose wait fails stays allocated, retiring
    /// and `unknown`. Adds every free and wait to `tally`; `what` names the operation.
    void free_all(Batch& batch, bool wait, const char* what, Tally& tally) noexcept {
        while (!batch.empty()) {
            typename Batch::node_type node = batch.extract(batch.begin());
            Entry& entry = node.mapped();
            if constexpr (streams) {
                if (entry.pending()) {
                    if (!wait) {
                        std::lock_guard lock(*mutex_);
                        cache_->put_back(std::move(node), phase_->cacheable());
                        continue;
                    }
                    if (const Status waited = events_->wait_for(entry); !waited) {
                        tally.add(
                            Status(waited.code(),
                                   message_or_empty("pinned pool ", what, ": waiting for the work recorded on a ",
                                                    entry.block.capacity, "-byte block failed on backend '", name(),
                                                    "': ", waited.message(), "; the block stays allocated")));
                        entry.unknown = true;
                        std::lock_guard lock(*mutex_);
                        cache_->retire(std::move(node));
                        continue;
                    }
                    tally.add({});
                }
            }
            tally.add(free_block(entry.block));
        }
    }

    /// Moves every cached and retiring block out of the cache into `batch`.
    void take_cached(Batch& batch) noexcept {
        std::lock_guard lock(*mutex_);
        cache_->take_all(batch, true);
    }

    /// Every cached and retiring block, freed as free_all() does, waiting for pending work.
    void free_cached(const char* what, Tally& tally) noexcept {
        Batch batch;
        take_cached(batch);
        free_all(batch, true, what, tally);
    }

    /// A block back where it came from (no lock held): a slice to its region, else the source.
    Status free_block(const PinnedBlock& block) noexcept {
        if (block.source != BlockSource::slice) return source_->free(block);
        regions_->give_back(block);
        return {};
    }

private:
    const std::string& name() const noexcept { return source_->name(); }

    std::mutex* mutex_;
    const PinnedPhase* phase_;
    PinnedBlockCache<B>* cache_;
    PinnedEvents<B>* events_;
    PinnedBlockSource<B>* source_;
    PinnedRegionSet<B>* regions_;
    const PinnedSink* sink_;
};

}  // namespace devstage::detail
