// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedObtain, how blocks come out in a pinned pool's core. A request takes an idle
/// cached block of its size, else a pending one whose work a query (never a wait) finds
/// complete, else a fresh block from the source — after trimming the cache once when the
/// backend is out of memory; then the grant is enrolled in the registry. It counts cache hits,
/// misses and pending skips. The cache, the registry, the phase and those counters are guarded
/// by the core's mutex, passed in; every backend call is made without it.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/block_source.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/pinned/detail/retire.hpp"
#include "devstage/pinned/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B, class Cache>
class PinnedObtain {
public:
    static constexpr bool streams = AsyncBackend<B>;
    static constexpr bool caching = !std::is_same_v<Cache, DirectPinned>;
    using Lock = std::unique_lock<std::mutex>;
    using Grant = PinnedCore::Grant;

    /// `mutex` guards `phase`, `registry`, `cache` and the counters here.
    PinnedObtain(std::mutex& mutex, const PinnedPhase& phase, PinnedRegistry<B>& registry, PinnedBlockCache<B>& cache,
                 PinnedEvents<B>& events, PinnedBlockSource<B>& source, PinnedRetire<B>& retire,
                 const PinnedSink& sink) noexcept
        : mutex_(&mutex),
          phase_(&phase),
          registry_(&registry),
          cache_(&cache),
          events_(&events),
          source_(&source),
          retire_(&retire),
          sink_(&sink) {}
    PinnedObtain(const PinnedObtain&) = delete;
    PinnedObtain& operator=(const PinnedObtain&) = delete;

    /// The bytes of the block that serves `bytes`: whole pages at the exact threshold and above,
    /// else the cache policy's size class.
    std::size_t block_size(std::size_t bytes) const noexcept {
        if (const std::optional<std::size_t> exact = source_->exact_size(bytes)) return *exact;
        if constexpr (caching) return Cache::size_class(bytes);
        return bytes;
    }

    /// Precondition: `lock` holds the core's mutex. A block for `bytes` (`asked` by the caller)
    /// on NUMA node `node`: from the cache, else from the source, called without the lock (it
    /// is slow on real devices). A cached block whose recorded work is pending is queried once,
    /// without the lock, and passed over unless the work completed: this never blocks. On
    /// success the lock is held again; a pool closed meanwhile gets nothing, and the block goes
    /// straight back.
    Result<PinnedBlock> obtain(Lock& lock, std::size_t bytes, std::size_t asked, int node) noexcept {
        if (Status open = phase_->refusal(name()); !open) return open;
        const std::optional<std::size_t> exact = source_->exact_size(bytes);
        const std::size_t capacity = block_size(bytes);
        Status query_failure;
        if constexpr (caching) {
            if (const std::optional<PinnedBlock> cached = cache_->take_idle(capacity, node)) {
                ++hits_;
                return *cached;
            }
            if constexpr (streams) {
                if (std::optional<typename PinnedBlockCache<B>::Node> pending = cache_->take_pending(capacity, node)) {
                    PinnedEntry<B>& entry = pending->mapped();
                    lock.unlock();
                    const Result<bool> done = events_->poll(entry);
                    if (done && *done) events_->recycle(entry);
                    lock.lock();
                    if (done && *done) {
                        ++hits_;
                        if (phase_->closed()) {
                            lock.unlock();
                            if (Status freed = retire_->free_block(entry.block); !freed) sink_->report(freed);
                            return phase_->refusal(name());
                        }
                        return entry.block;
                    }
                    ++pending_skips_;
                    if (!done) {
                        entry.unknown = true;
                        query_failure = Status(
                            done.status().code(),
                            message_or_empty("pinned pool allocate: querying the work recorded on a cached ", capacity,
                                             "-byte block failed on backend '", name(), "': ", done.status().message(),
                                             "; the block stays pending until trim(), finalize() or the pool's "
                                             "destruction waits for it"));
                    }
                    cache_->put_back(std::move(*pending), phase_->cacheable());
                }
            }
        }
        lock.unlock();
        if (!query_failure.ok()) sink_->report(query_failure);
        Result<PinnedBlock> block = source_->obtain(capacity, asked, node, exact.has_value());
        if (!block && block.status().code() == Errc::out_of_memory && trim_idle()) {
            block = source_->obtain(capacity, asked, node, exact.has_value());
        }
        if (!block) return block.status();
        lock.lock();
        ++misses_;
        if (Status open = phase_->refusal(name()); !open) {
            lock.unlock();
            if (Status freed = retire_->free_block(*block); !freed) sink_->report(freed);
            return open;
        }
        return block;
    }

    /// Precondition: `lock` holds the core's mutex. Records the grant of `block` as `pointer`;
    /// when the host has no memory for the record, the block goes back.
    Result<Grant> enroll(Lock& lock, const PinnedBlock& block, void* pointer, std::size_t bytes,
                         PinnedHolder holder) noexcept {
        if (const std::optional<Grant> grant = registry_->enroll(block, pointer, bytes, holder)) return *grant;
        lock.unlock();
        if (Status freed = retire_->free_block(block); !freed) sink_->report(freed);
        return Status(Errc::out_of_memory,
                      message_or_empty("pinned pool allocate: host memory exhausted recording a ", block.capacity,
                                       "-byte pinned block (", bytes, " asked) from backend '", name(),
                                       "'; the block went back"));
    }

    /// Precondition: the core's mutex held. Adds the counters to `stats`.
    void add_to(PinnedStats& stats) const noexcept {
        stats.cache_hits = hits_;
        stats.cache_misses = misses_;
        stats.pending_skips = pending_skips_;
    }

private:
    const std::string& name() const noexcept { return source_->name(); }

    /// Frees the cached blocks with no pending work after an out-of-memory (pending ones stay:
    /// allocation never waits); true when anything was freed.
    bool trim_idle() noexcept {
        if constexpr (caching) {
            typename PinnedBlockCache<B>::Map batch;
            {
                std::lock_guard lock(*mutex_);
                if (!cache_->has_cached()) return false;
                cache_->take_all(batch, false);
            }
            Tally tally;
            retire_->free_all(batch, false, "trim", tally);
            if (Status trimmed = tally.status("trim", name()); !trimmed) sink_->report(trimmed);
            return tally.total > 0;
        }
        return false;
    }

    std::mutex* mutex_;
    const PinnedPhase* phase_;
    PinnedRegistry<B>* registry_;
    PinnedBlockCache<B>* cache_;
    PinnedEvents<B>* events_;
    PinnedBlockSource<B>* source_;
    PinnedRetire<B>* retire_;
    const PinnedSink* sink_;
    std::uint64_t hits_ = 0, misses_ = 0, pending_skips_ = 0;  ///< under *mutex_
};

}  // namespace devstage::detail
