// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The shared core of a PinnedHostPool: the registry of live allocations, the cache of released
/// blocks, the blocks whose recorded stream work is still pending, the pool's events and the
/// counters (PinnedStats). The pool, its buffers and its allocator adaptors all hold the core,
/// so whichever of them goes last, the others find a registry, never freed memory; a block goes
/// back to the backend only when nothing holds it any more and no recorded work may still use it.
/// This header puts the core together (PinnedPoolCore: allocation, release, finalize() and the
/// pool's destruction) from its parts: PinnedStats in stats.hpp, and in pinned/detail/ the
/// type-erased interface (interface.hpp), the stream types (stream_types.hpp), the host-memory
/// guards (host_memory.hpp) and the layers of the core — the shared state and counters
/// (state.hpp), the recorded work and the events (events.hpp), the registry (registry.hpp), the
/// cached and retiring blocks (block_cache.hpp), letting go of one backend (forget.hpp), the
/// NUMA arenas (numa_arenas.hpp).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/forget.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/detail/numa_arenas.hpp"
#include "devstage/pinned/detail/stream_types.hpp"
#include "devstage/pinned/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The core of a PinnedHostPool<B, Cache>. Thread-safe; backend calls (allocations, frees,
/// event records and queries) are made without the lock. A block's life: obtained (from the
/// cache or the backend) → live (in the registry, keyed by the pointer handed out; record()
/// adds the streams whose work uses it) → given back → cached (when the policy keeps it and the
/// pool is neither finalized since the grant nor destroyed) or freed to the backend. A block
/// given back with recorded streams gets an event recorded on each and is *pending* until they
/// all completed: cached but handed out only once a query finds them complete, or *retiring*
/// (kept out of the cache, freed once they completed) when the policy would free it.
template <PinnedHostBackend B, class Cache>
class PinnedPoolCore final : public PinnedNumaArenas<B, Cache> {
    using Base = PinnedNumaArenas<B, Cache>;
    using Grant = PinnedCore::Grant;
    using Base::caching;
    using Base::streams;
    using typename Base::Block;
    using typename Base::Cached;
    using typename Base::CacheMap;
    using typename Base::Lock;
    using typename Base::Tally;
    using typename Base::Uses;

public:
    PinnedPoolCore(B& backend, Cache cache, NumaPlacement numa) : Base(backend, std::move(cache), std::move(numa)) {}
    PinnedPoolCore(const PinnedPoolCore&) = delete;
    PinnedPoolCore& operator=(const PinnedPoolCore&) = delete;
    using Base::forget;
    using Base::report;

    /// Runs when the pool and everything holding its memory are gone. Blocks given back after
    /// the pool's destruction whose recorded work was still pending are waited for (the host
    /// blocks) and freed; one whose wait fails is left allocated and reported. Then the events
    /// given back since the destruction are destroyed.
    ~PinnedPoolCore() override {
        if constexpr (streams) {
            CacheMap batch;
            take_all(batch);
            Tally tally;
            free_all(batch, true, "destroy", tally);
            if (Status status = tally.status("destroy", name_); !status) report(status);
            std::uint64_t leaked = 0, leaked_bytes = 0;
            for (const auto& [capacity, entry] : retiring_) {
                ++leaked;
                leaked_bytes += capacity;
            }
            if (leaked > 0) {
                report(Status(Errc::leaked,
                              message_or_empty("pinned pool destroyed: ", leaked, " block(s), ", leaked_bytes,
                                               " bytes, given back with recorded work that could not be waited for "
                                               "stay allocated on backend '",
                                               name_, "'")));
            }
            (void)destroy_idle_events();
        }
    }

    Result<Grant> allocate(std::size_t bytes, std::size_t alignment, PinnedHolder holder) noexcept override {
        return allocate_on(bytes, alignment, holder, -1);
    }

    /// allocate() from the arena of NUMA node `node` (-1: the backend's pinned_malloc memory).
    Result<Grant> allocate_on(std::size_t bytes, std::size_t alignment, PinnedHolder holder, int node) noexcept {
        if (bytes == 0) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool allocate: 0 bytes requested on backend '", name_, "'"));
        }
        const std::optional<std::size_t> padded = detail::add(bytes, alignment - 1);
        if (!std::has_single_bit(alignment) || !padded) {
            return Status(
                Errc::invalid_argument,
                message_or_empty("pinned pool allocate: ", bytes, " bytes aligned to ", alignment,
                                 " is not a power-of-two alignment of a representable size (backend '", name_, "')"));
        }
        Lock lock(mutex_);
        Result<Block> block = obtain(lock, bytes, bytes, node);
        if (!block) return block.status();
        void* pointer = block->base;
        if (!detail::is_aligned(pointer, alignment)) {
            // Pinned allocators align blocks to pages, so the exact size is tried first; a block
            // that misses the alignment is given back and one `alignment - 1` bytes larger
            // serves instead, whatever the backend aligns to.
            if (Status retired = retire(lock, *block, true); !retired) report(retired);
            lock.lock();
            block = obtain(lock, *padded, bytes, node);
            if (!block) return block.status();
            pointer = detail::align_pointer(block->base, alignment);
        }
        return enroll(lock, *block, pointer, bytes, holder);
    }

    Status release(void* pointer, std::uint64_t id, PinnedHolder holder) noexcept override {
        const bool by_container = holder == PinnedHolder::container;
        const char* what = by_container ? "deallocate" : "release";
        Lock lock(mutex_);
        const auto found = live_.find(pointer);
        if (found == live_.end() || (id != 0 && found->second.id != id)) {
            return Status(Errc::unknown_pointer,
                          message_or_empty("pinned pool ", what, ": ", static_cast<const void*>(pointer),
                                           " is not a live allocation of this pool (backend '", name_, "')"));
        }
        if (const bool of_container = found->second.holder == PinnedHolder::container; of_container != by_container) {
            if (of_container) {
                return Status(Errc::invalid_argument,
                              message_or_empty("pinned pool release: ", static_cast<const void*>(pointer),
                                               " belongs to a container (PinnedAllocator or PinnedMemoryResource), "
                                               "whose deallocation alone gives it back (backend '",
                                               name_, "')"));
            }
            return Status(
                Errc::unknown_pointer,
                message_or_empty("pinned pool deallocate: ", static_cast<const void*>(pointer),
                                 " is a buffer's or raw allocation of this pool, not a container's (backend '", name_,
                                 "')"));
        }
        const Block block = found->second.block;
        const bool cacheable = !found->second.detached;
        Uses uses = std::move(found->second.uses);
        unlist(found);
        if constexpr (streams) {
            const bool retiring = !retiring_.empty();
            Status released;
            if (uses.empty()) {
                released = retire(lock, block, cacheable);
            } else {
                lock.unlock();
                released = retire_recorded(Cached{block, std::move(uses), false}, cacheable, what);
            }
            if (retiring) collect();  // earlier blocks whose work may have completed since
            return released;
        } else {
            return retire(lock, block, cacheable);
        }
    }

    /// Frees the cache and the retiring blocks, waiting for pending ones; live allocations stay
    /// valid, become detached (freed, not cached, when given back) and are reported. Returns the
    /// first failure.
    Status finalize() noexcept { return sweep(false); }

    /// The pool's destruction: refuses every later allocation (one in flight included), frees
    /// the cache, the retiring blocks and the raw allocations, which nothing can give back any
    /// more (waiting for the recorded work of each), and detaches and reports what buffers and
    /// containers still hold. Destroys the pool's idle events. Returns the first failure.
    Status close() noexcept { return sweep(true); }

private:
    using Base::backend_;
    using Base::block_size;
    using Base::closed_;
    using Base::closed_error;
    using Base::collect;
    using Base::destroy_idle_events;
    using Base::enroll;
    using Base::free_all;
    using Base::free_block;
    using Base::live_;
    using Base::mutex_;
    using Base::name_;
    using Base::retire;
    using Base::retire_recorded;
    using Base::retiring_;
    using Base::stats_;
    using Base::take_all;
    using Base::take_cached;
    using Base::take_completed;
    using Base::take_raw;
    using Base::trim_some;
    using Base::unlist;

    /// Precondition: `lock` holds mutex_. A block for `bytes`: from the cache, else from the
    /// backend, called without the lock (it is slow on real devices). A cached block whose
    /// recorded work is pending is queried once, without the lock, and passed over unless the
    /// work completed: this never blocks. On success the lock is held again; a pool destroyed
    /// meanwhile gets nothing, and the block goes straight back to the backend.
    Result<Block> obtain(Lock& lock, std::size_t bytes, std::size_t asked, int node) noexcept {
        if (closed_) return closed_error();
        const std::size_t capacity = block_size(bytes);
        Status query_failure;
        if constexpr (caching) {
            if (const std::optional<Block> cached = take_cached(capacity, node)) {
                ++stats_.cache_hits;
                return *cached;
            }
            if constexpr (streams) {
                if (const std::optional<Block> completed = take_completed(lock, capacity, node, query_failure)) {
                    ++stats_.cache_hits;
                    if (!closed_) return *completed;
                    lock.unlock();
                    if (Status freed = free_block(*completed); !freed) report(freed);
                    return closed_error();
                }
            }
        }
        lock.unlock();
        if (!query_failure.ok()) report(query_failure);
        Result<void*> pointer = node >= 0 ? this->numa_block(capacity, node) : backend_->pinned_malloc(capacity);
        if (!pointer && pointer.status().code() == Errc::out_of_memory && trim_some()) {
            pointer = node >= 0 ? this->numa_block(capacity, node) : backend_->pinned_malloc(capacity);
        }
        if (!pointer && node >= 0 && pointer.status().code() == Errc::not_supported) {
            node = -1;  // the node cannot be bound to (numa_block reported it once): fall back
            pointer = backend_->pinned_malloc(capacity);
        }
        if (!pointer) {
            const Status& cause = pointer.status();
            return Status(cause.code(),
                          message_or_empty("pinned pool allocate: ", capacity, " bytes (", asked,
                                           " asked) from backend '", name_, "' failed: ", cause.message()));
        }
        const Block block{*pointer, capacity, node};
        lock.lock();
        ++stats_.backend_allocations;
        ++stats_.cache_misses;
        if (closed_) {
            lock.unlock();
            if (Status freed = free_block(block); !freed) report(freed);
            return closed_error();
        }
        return block;
    }

    /// finalize() (`closing` false) and close() (true).
    Status sweep(bool closing) noexcept {
        std::uint64_t held = 0, held_bytes = 0;
        {
            std::lock_guard lock(mutex_);
            closed_ = closed_ || closing;
            for (auto& [pointer, live] : live_) {
                if (!live.detached) {
                    live.detached = true;
                    ++stats_.detached_allocations;
                    stats_.detached_bytes += live.requested;
                    ++stats_.finalized_allocations;
                    stats_.finalized_bytes += live.requested;
                }
                if (closing && live.holder == PinnedHolder::raw) continue;
                ++held;
                held_bytes += live.requested;
            }
        }
        Tally tally;
        std::uint64_t raw = 0, raw_bytes = 0;
        if (closing) {
            // Recorded ones become retiring (the pool is closed) and are waited for below.
            while (std::optional<Cached> entry = take_raw(raw_bytes)) {
                ++raw;
                if constexpr (streams) {
                    if (!entry->uses.empty()) {
                        tally.add(retire_recorded(std::move(*entry), false, "destroy"));
                        continue;
                    }
                }
                tally.add(free_block(entry->block));
            }
        }
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            take_all(batch);
        }
        free_all(batch, true, closing ? "destroy" : "finalize", tally);
        if constexpr (streams) {
            if (closing) (void)destroy_idle_events();
        }
        if (!closing && held > 0) {
            report(
                Status(Errc::leaked, message_or_empty("pinned pool finalize: ", held, " allocation(s) still live, ",
                                                      held_bytes, " bytes, on backend '", name_,
                                                      "'; they stay valid and go back to the backend when released")));
        } else if (closing && held + raw > 0) {
            report(Status(Errc::leaked,
                          message_or_empty("pinned pool destroyed: ", held + raw, " allocation(s) still live, ",
                                           held_bytes + raw_bytes, " bytes, on backend '", name_, "': ", raw, " raw (",
                                           raw_bytes, " bytes) freed, since nothing can release them now; ", held,
                                           " held by buffers or containers (", held_bytes,
                                           " bytes) stay valid and go back to the backend when released")));
        }
        return tally.status(closing ? "destroy" : "finalize", name_);
    }
};

}  // namespace devstage::detail

#endif  // DEVSTAGE_CXX20
