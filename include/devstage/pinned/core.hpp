// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The shared core of a PinnedHostPool: the registry of live allocations, the cache of released
/// blocks and the counters (PinnedStats). The pool, its buffers and its allocator adaptors all
/// hold the core, so whichever of them goes last, the others find a registry, never freed
/// memory; a block goes back to the backend only when nothing holds it any more.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/align.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// Counters of a PinnedHostPool. Bytes are the bytes callers asked for unless named "cached".
/// `PinnedStats s = pool.stats(); if (s.live_allocations != 0) ...`
struct PinnedStats {
    std::uint64_t live_allocations = 0;  ///< granted and not yet given back (detached ones too)
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_live_bytes = 0;
    std::uint64_t cached_blocks = 0;
    std::uint64_t cached_bytes = 0;  ///< capacity of blocks held in the cache
    std::uint64_t cache_hits = 0;
    std::uint64_t cache_misses = 0;  ///< block requests that went to the backend
    std::uint64_t backend_allocations = 0;
    std::uint64_t backend_frees = 0;
    /// Allocations that finalize() (or the pool's destruction) found live, each counted once.
    std::uint64_t finalized_allocations = 0;
    std::uint64_t finalized_bytes = 0;
    /// Live allocations that outlived a finalize(): still valid, freed (not cached) when released.
    std::uint64_t detached_allocations = 0;
    std::uint64_t detached_bytes = 0;
};

namespace detail {

[[noreturn]] inline void throw_bad_alloc() {
#if defined(__cpp_exceptions)
    throw std::bad_alloc();
#else
    std::abort();
#endif
}

/// Runs `insert`, a registry insertion that allocates host memory; false when the host is out
/// of memory (std::bad_alloc), so noexcept paths can recover instead of terminating. Without
/// exceptions a failed host allocation aborts, as everywhere.
template <class F>
bool try_host_allocation(F&& insert) noexcept {
#if defined(__cpp_exceptions)
    try {
        std::forward<F>(insert)();
    } catch (const std::bad_alloc&) {
        return false;
    }
#else
    std::forward<F>(insert)();
#endif
    return true;
}

/// detail::message for noexcept paths that may run with host memory exhausted: an empty
/// message instead of std::bad_alloc (the Errc still says what happened).
template <class... Pieces>
std::string message_or_empty(const Pieces&... pieces) noexcept {
    std::string out;
    (void)try_host_allocation([&] { out = detail::message(pieces...); });
    return out;
}

/// Who holds a live allocation; it decides which call may give the allocation back.
enum class PinnedHolder : std::uint8_t {
    raw,        ///< from allocate_raw(): PinnedHostPool::release()
    buffer,     ///< a PinnedBuffer: its reset() (by id) or PinnedHostPool::release()
    container,  ///< PinnedAllocator or PinnedMemoryResource: their deallocation only
};

/// The type-erased interface of a pool's core, through which buffers and allocator adaptors
/// reach the pool whatever its backend and cache policy.
class PinnedCore {
public:
    struct Grant {
        void* pointer;
        std::uint64_t id;  ///< unique per grant: identifies it even when its address is reused
    };
    virtual ~PinnedCore() = default;

    /// At least `bytes` (> 0) bytes aligned to `alignment` (a power of two), held by `holder`.
    virtual Result<Grant> allocate(std::size_t bytes, std::size_t alignment, PinnedHolder holder) noexcept = 0;
    /// Gives back the live allocation starting at `pointer`: any grant there when `id` is 0,
    /// otherwise only that grant. A container's allocation is given back only by a container
    /// (`holder` container), and a container gives back nothing else.
    virtual Status release(void* pointer, std::uint64_t id, PinnedHolder holder) noexcept = 0;
    virtual PinnedStats stats() const noexcept = 0;
    /// Sends `status` to the pool's error sink.
    virtual void report(const Status& status) noexcept = 0;

    /// A buffer's release. A grant already given back through PinnedHostPool::release() is
    /// fine; any other failure goes to the error sink.
    void give_back(void* pointer, std::uint64_t id) noexcept {
        if (Status status = release(pointer, id, PinnedHolder::buffer);
            !status && status.code() != Errc::unknown_pointer) {
            report(status);
        }
    }

    /// For the Allocator and memory_resource interfaces: throws std::bad_alloc on failure
    /// (aborts without exceptions). Zero bytes get a one-byte allocation.
    void* allocate_or_throw(std::size_t bytes, std::size_t alignment) {
        Result<Grant> grant = allocate(std::max<std::size_t>(bytes, 1), alignment, PinnedHolder::container);
        if (!grant) throw_bad_alloc();
        return grant->pointer;
    }

    /// A container's deallocation: every failure goes to the error sink.
    void deallocate(void* pointer) noexcept {
        if (Status status = release(pointer, 0, PinnedHolder::container); !status) report(status);
    }

protected:
    PinnedCore() = default;
    PinnedCore(const PinnedCore&) = default;
    PinnedCore& operator=(const PinnedCore&) = default;
};

/// The core of a PinnedHostPool<B, Cache>. Thread-safe; backend calls are made without the
/// lock. A block's life: obtained (from the cache or the backend) → live (in the registry,
/// keyed by the pointer handed out) → given back → cached (when the policy keeps it and the
/// pool is neither finalized since the grant nor destroyed) or freed to the backend.
/// State that a block must carry past its release (say, a point of a stream that still reads
/// it) belongs in Cached: take_cached() decides what may be reused and trim() what may be
/// freed.
template <PinnedHostBackend B, class Cache>
class PinnedPoolCore final : public PinnedCore {
    static constexpr bool caching = !std::is_same_v<Cache, DirectPinned>;
    using Lock = std::unique_lock<std::mutex>;

public:
    PinnedPoolCore(B& backend, Cache cache)
        : backend_(&backend), name_(backend.name()), cache_policy_(std::move(cache)) {}

    Result<Grant> allocate(std::size_t bytes, std::size_t alignment, PinnedHolder holder) noexcept override {
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
        Result<Block> block = obtain(lock, bytes, bytes);
        if (!block) return block.status();
        void* pointer = block->base;
        if (!detail::is_aligned(pointer, alignment)) {
            // Pinned allocators align blocks to pages, so the exact size is tried first; a block
            // that misses the alignment is given back and one `alignment - 1` bytes larger
            // serves instead, whatever the backend aligns to.
            if (Status retired = retire(lock, *block, true); !retired) report(retired);
            lock.lock();
            block = obtain(lock, *padded, bytes);
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
        forget(found);
        return retire(lock, block, cacheable);
    }

    PinnedStats stats() const noexcept override {
        std::lock_guard lock(mutex_);
        return stats_;
    }

    void report(const Status& status) noexcept override {
        ErrorSink sink;
        {
            std::lock_guard lock(mutex_);
            sink = sink_;
        }
        sink(status);
    }

    /// True when `pointer` is the start of a live allocation (detached ones included).
    bool owns(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return live_.find(const_cast<void*>(pointer)) != live_.end();
    }

    /// Frees the cache; live allocations stay valid, become detached (freed, not cached, when
    /// given back) and are reported. Returns the first backend failure.
    Status finalize() noexcept { return sweep(false); }

    /// The pool's destruction: refuses every later allocation (one in flight included), frees
    /// the cache and the raw allocations, which nothing can give back any more, and detaches and
    /// reports what buffers and containers still hold. Returns the first backend failure.
    Status close() noexcept { return sweep(true); }

    /// Frees every cached block; nothing live is touched.
    Status trim() noexcept {
        CacheMap doomed;
        {
            std::lock_guard lock(mutex_);
            doomed.swap(cache_);  // no host allocation: nothing here can fail for want of memory
            stats_.cached_blocks = stats_.cached_bytes = 0;
        }
        Tally tally;
        for (const auto& [capacity, cached] : doomed) tally.add(free_block(cached.block));
        return tally.status("trim", name_);
    }

    void set_sink(ErrorSink sink) noexcept {
        std::lock_guard lock(mutex_);
        sink_ = sink;
    }
    B& backend() const noexcept { return *backend_; }

private:
    /// A block as the backend gave it.
    struct Block {
        void* base = nullptr;      ///< what pinned_malloc returned and pinned_free gets
        std::size_t capacity = 0;  ///< its bytes
    };
    /// A granted allocation; the registry's key is the pointer handed out (base, or aligned up).
    struct Live {
        Block block;
        std::size_t requested = 0;
        std::uint64_t id = 0;
        PinnedHolder holder = PinnedHolder::raw;
        bool detached = false;  ///< outlived a finalize(): freed, not cached, when given back
    };
    /// A released block kept for reuse.
    struct Cached {
        Block block;
    };
    using CacheMap = std::multimap<std::size_t, Cached>;

    /// The first backend failure of a run of frees, and how many failed.
    struct Tally {
        Status first;
        std::size_t failures = 0, total = 0;
        void add(Status status) noexcept {
            ++total;
            if (status.ok()) return;
            ++failures;
            if (first.ok()) first = std::move(status);
        }
        Status status(const char* what, const std::string& backend) const noexcept {
            if (failures > 1) {
                return Status(first.code(),
                              message_or_empty("pinned pool ", what, ": ", failures, " of ", total,
                                               " frees failed on backend '", backend, "'; first: ", first.message()));
            }
            return first;
        }
    };

    std::size_t block_size(std::size_t bytes) const noexcept {
        if constexpr (caching) return Cache::size_class(bytes);
        return bytes;
    }

    /// Precondition: `lock` holds mutex_. A block for `bytes`: from the cache, else from the
    /// backend, called without the lock (it is slow on real devices). On success the lock is
    /// held again; a pool destroyed meanwhile gets nothing, and the new block goes straight
    /// back to the backend.
    Result<Block> obtain(Lock& lock, std::size_t bytes, std::size_t asked) noexcept {
        if (closed_) return closed_error();
        const std::size_t capacity = block_size(bytes);
        if constexpr (caching) {
            if (const std::optional<Block> cached = take_cached(capacity)) {
                ++stats_.cache_hits;
                return *cached;
            }
        }
        lock.unlock();
        Result<void*> pointer = backend_->pinned_malloc(capacity);
        if (!pointer && pointer.status().code() == Errc::out_of_memory && trim_some()) {
            pointer = backend_->pinned_malloc(capacity);
        }
        if (!pointer) {
            const Status& cause = pointer.status();
            return Status(cause.code(),
                          message_or_empty("pinned pool allocate: ", capacity, " bytes (", asked,
                                           " asked) from backend '", name_, "' failed: ", cause.message()));
        }
        const Block block{*pointer, capacity};
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

    /// Precondition: mutex_ held. A cached block of exactly `capacity`, out of the cache.
    std::optional<Block> take_cached(std::size_t capacity) noexcept {
        const auto found = cache_.find(capacity);
        if (found == cache_.end()) return std::nullopt;
        const Block block = found->second.block;
        cache_.erase(found);
        stats_.cached_bytes -= capacity;
        --stats_.cached_blocks;
        return block;
    }

    /// Precondition: `lock` holds mutex_. Records the grant of `block` as `pointer`; when the
    /// host has no memory for the record, the block goes back to the backend.
    Result<Grant> enroll(Lock& lock, const Block& block, void* pointer, std::size_t bytes,
                         PinnedHolder holder) noexcept {
        const std::uint64_t id = next_id_ + 1;
        if (!try_host_allocation([&] { live_.emplace(pointer, Live{block, bytes, id, holder, false}); })) {
            lock.unlock();
            if (Status freed = free_block(block); !freed) report(freed);
            return Status(Errc::out_of_memory,
                          message_or_empty("pinned pool allocate: host memory exhausted recording a ", block.capacity,
                                           "-byte pinned block (", bytes, " asked) from backend '", name_,
                                           "'; the block went back to the backend"));
        }
        next_id_ = id;
        ++stats_.live_allocations;
        stats_.live_bytes += bytes;
        stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
        return Grant{pointer, id};
    }

    /// Precondition: mutex_ held. Drops a live allocation from the registry and the counters.
    void forget(typename std::unordered_map<void*, Live>::iterator found) noexcept {
        const Live& live = found->second;
        --stats_.live_allocations;
        stats_.live_bytes -= live.requested;
        if (live.detached) {
            --stats_.detached_allocations;
            stats_.detached_bytes -= live.requested;
        }
        live_.erase(found);
    }

    /// Precondition: `lock` holds mutex_; returns with it released. A block no longer held:
    /// into the cache when `cacheable`, the pool is open and the policy has room (and the host
    /// has memory for the entry), else back to the backend.
    Status retire(Lock& lock, const Block& block, bool cacheable) noexcept {
        if constexpr (caching) {
            if (cacheable && !closed_ && stats_.cached_bytes + block.capacity <= cache_policy_.max_cached_bytes &&
                try_host_allocation([&] { cache_.emplace(block.capacity, Cached{block}); })) {
                stats_.cached_bytes += block.capacity;
                ++stats_.cached_blocks;
                lock.unlock();
                return {};
            }
        }
        lock.unlock();
        return free_block(block);
    }

    Status free_block(const Block& block) noexcept {
        Status status = backend_->pinned_free(block.base);
        {
            std::lock_guard lock(mutex_);
            ++stats_.backend_frees;
        }
        if (!status) {
            return Status(status.code(),
                          message_or_empty("pinned pool: pinned_free of ", block.capacity, " bytes failed on backend '",
                                           name_, "': ", status.message()));
        }
        return status;
    }

    /// finalize() (`closing` false) and close() (true).
    Status sweep(bool closing) noexcept {
        CacheMap doomed;
        std::uint64_t held = 0, held_bytes = 0;
        {
            std::lock_guard lock(mutex_);
            closed_ = closed_ || closing;
            doomed.swap(cache_);
            stats_.cached_blocks = stats_.cached_bytes = 0;
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
        for (const auto& [capacity, cached] : doomed) tally.add(free_block(cached.block));
        std::uint64_t raw = 0, raw_bytes = 0;
        if (closing) {
            while (const std::optional<Block> block = take_raw(raw_bytes)) {
                ++raw;
                tally.add(free_block(*block));
            }
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

    /// A raw allocation, out of the registry; nullopt when none is left. Adds its bytes to
    /// `bytes`. One at a time, so no host memory is needed to collect them.
    std::optional<Block> take_raw(std::uint64_t& bytes) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = std::find_if(live_.begin(), live_.end(),
                                        [](const auto& entry) { return entry.second.holder == PinnedHolder::raw; });
        if (found == live_.end()) return std::nullopt;
        const Block block = found->second.block;
        bytes += found->second.requested;
        forget(found);
        return block;
    }

    /// Frees the cache after an out-of-memory; true when anything was cached.
    bool trim_some() noexcept {
        if constexpr (caching) {
            const bool had = stats().cached_blocks > 0;
            if (had) {
                if (Status trimmed = trim(); !trimmed) report(trimmed);
            }
            return had;
        }
        return false;
    }

    Status closed_error() const noexcept {
        return Status(Errc::invalid_argument,
                      message_or_empty("pinned pool allocate: the pool was destroyed (backend '", name_, "')"));
    }

    B* backend_;
    std::string name_;  ///< the backend's name, for messages that may come after the backend is gone
    Cache cache_policy_;
    mutable std::mutex mutex_;
    std::unordered_map<void*, Live> live_;
    CacheMap cache_;
    PinnedStats stats_;
    std::uint64_t next_id_ = 0;
    bool closed_ = false;
    ErrorSink sink_;
};

}  // namespace detail
}  // namespace devstage
