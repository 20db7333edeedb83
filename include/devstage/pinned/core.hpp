// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The shared core of a PinnedHostPool: the registry of live allocations, the cache of released
/// blocks, the blocks whose recorded stream work is still pending, the pool's events and the
/// counters (PinnedStats). The pool, its buffers and its allocator adaptors all hold the core,
/// so whichever of them goes last, the others find a registry, never freed memory; a block goes
/// back to the backend only when nothing holds it any more and no recorded work may still use it.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

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
    /// Released blocks whose recorded stream work is not known to have completed (capacity
    /// bytes): cached ones (also counted in cached_blocks) and retiring ones.
    std::uint64_t pending_blocks = 0;
    std::uint64_t pending_bytes = 0;
    /// Released blocks with pending work that go back to the backend, not into the cache, once
    /// it completed (capacity bytes): the pool does not cache them (DirectPinned, a full cache,
    /// detached, the pool destroyed).
    std::uint64_t retiring_blocks = 0;
    std::uint64_t retiring_bytes = 0;
    /// Allocations that found a cached block of their class still pending and took another.
    std::uint64_t pending_skips = 0;
    /// Times the host blocked for recorded work: trim(), finalize() and the destruction waiting
    /// for a pending block, and a release whose event could not be recorded.
    std::uint64_t host_waits = 0;
    /// Events the pool created; each is re-recorded for later releases.
    std::uint64_t events_created = 0;
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

/// The stream and event types of a backend, for the pool's signatures: the backend's own when
/// it models AsyncBackend, else placeholders that no call accepts.
template <class B, bool = AsyncBackend<B>>
struct PinnedStreamTypes {
    struct Stream {
        friend bool operator==(Stream, Stream) = default;
    };
    struct Event {};
};
template <class B>
struct PinnedStreamTypes<B, true> {
    using Stream = typename B::Stream;
    using Event = typename B::Event;
};

/// The core of a PinnedHostPool<B, Cache>. Thread-safe; backend calls (allocations, frees,
/// event records and queries) are made without the lock. A block's life: obtained (from the
/// cache or the backend) → live (in the registry, keyed by the pointer handed out; record()
/// adds the streams whose work uses it) → given back → cached (when the policy keeps it and the
/// pool is neither finalized since the grant nor destroyed) or freed to the backend. A block
/// given back with recorded streams gets an event recorded on each and is *pending* until they
/// all completed: cached but handed out only once a query finds them complete, or *retiring*
/// (kept out of the cache, freed once they completed) when the policy would free it.
template <PinnedHostBackend B, class Cache>
class PinnedPoolCore final : public PinnedCore {
    static constexpr bool caching = !std::is_same_v<Cache, DirectPinned>;
    static constexpr bool streams = AsyncBackend<B>;
    using Lock = std::unique_lock<std::mutex>;

public:
    using Stream = typename PinnedStreamTypes<B>::Stream;
    using Event = typename PinnedStreamTypes<B>::Event;

    PinnedPoolCore(B& backend, Cache cache)
        : backend_(&backend), name_(backend.name()), cache_policy_(std::move(cache)) {}
    PinnedPoolCore(const PinnedPoolCore&) = delete;
    PinnedPoolCore& operator=(const PinnedPoolCore&) = delete;

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
            destroy_idle_events();
        }
    }

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
        Uses uses = std::move(found->second.uses);
        forget(found);
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

    /// Remembers that work enqueued on `stream` uses the live allocation at `pointer` (grant
    /// `id`, or whichever is there when `id` is 0), so that once given back the block is reused
    /// or freed only after that work completed. A stream already recorded is not added twice.
    Status record(const void* pointer, std::uint64_t id, Stream stream) noexcept requires streams {
        std::lock_guard lock(mutex_);
        const auto found = live_.find(const_cast<void*>(pointer));
        if (found == live_.end() || (id != 0 && found->second.id != id)) {
            return Status(Errc::unknown_pointer,
                          message_or_empty("pinned pool record: ", pointer,
                                           " is not a live allocation of this pool (backend '", name_, "')"));
        }
        Uses& uses = found->second.uses;
        if (std::any_of(uses.begin(), uses.end(), [&stream](const Use& use) { return use.stream == stream; })) {
            return {};
        }
        if (!try_host_allocation([&] { uses.push_back(Use{stream, Event{}, false}); })) {
            return Status(Errc::out_of_memory,
                          message_or_empty("pinned pool record: host memory exhausted remembering a stream of the ",
                                           found->second.requested, "-byte allocation at ", pointer, " (backend '",
                                           name_, "'); nothing was recorded"));
        }
        return {};
    }

    /// record() of a PinnedBuffer: its memory (`data`, `bytes`, grant `id`), held from `owner`.
    Status record_buffer(const PinnedCore* owner, const void* data, std::size_t bytes, std::uint64_t id,
                         Stream stream) noexcept requires streams {
        if (data == nullptr) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the buffer is empty (0 bytes): it holds no memory "
                                           "(backend '",
                                           name_, "')"));
        }
        if (owner != this) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the ", bytes, "-byte buffer at ", data,
                                           " belongs to another pool, not this one (backend '", name_, "')"));
        }
        return record(data, id, stream);
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

    /// Frees the cache and the retiring blocks, waiting for pending ones; live allocations stay
    /// valid, become detached (freed, not cached, when given back) and are reported. Returns the
    /// first failure.
    Status finalize() noexcept { return sweep(false); }

    /// The pool's destruction: refuses every later allocation (one in flight included), frees
    /// the cache, the retiring blocks and the raw allocations, which nothing can give back any
    /// more (waiting for the recorded work of each), and detaches and reports what buffers and
    /// containers still hold. Destroys the pool's idle events. Returns the first failure.
    Status close() noexcept { return sweep(true); }

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
    /// A stream whose enqueued work uses a block, and once the block is given back, the event
    /// recorded there.
    struct Use {
        Stream stream;
        Event event;
        bool recorded = false;  ///< `event` was recorded on `stream` at the release
    };
    using Uses = std::vector<Use>;
    /// A granted allocation; the registry's key is the pointer handed out (base, or aligned up).
    struct Live {
        Block block;
        std::size_t requested = 0;
        std::uint64_t id = 0;
        PinnedHolder holder = PinnedHolder::raw;
        bool detached = false;  ///< outlived a finalize(): freed, not cached, when given back
        Uses uses;              ///< the streams record() named
    };
    /// A released block the pool keeps: for reuse (cache_) or until it may be freed (retiring_).
    struct Cached {
        Block block;
        Uses uses;  ///< events of recorded work not known to have completed; empty: none
        /// An event could not be recorded or queried: no event tells when the work ends, so only
        /// a wait (trim, finalize, the destruction) settles the block.
        bool unknown = false;

        bool pending() const noexcept { return !uses.empty() || unknown; }
    };
    using CacheMap = std::multimap<std::size_t, Cached>;
    enum class Where : std::uint8_t { cache, retiring };

    /// The first failure of a run of frees and waits, and how many failed.
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
                return Status(first.code(), message_or_empty("pinned pool ", what, ": ", failures, " of ", total,
                                                             " frees and waits failed on backend '", backend,
                                                             "'; first: ", first.message()));
            }
            return first;
        }
    };

    std::size_t block_size(std::size_t bytes) const noexcept {
        if constexpr (caching) return Cache::size_class(bytes);
        return bytes;
    }

    /// Precondition: `lock` holds mutex_. A block for `bytes`: from the cache, else from the
    /// backend, called without the lock (it is slow on real devices). A cached block whose
    /// recorded work is pending is queried once, without the lock, and passed over unless the
    /// work completed: this never blocks. On success the lock is held again; a pool destroyed
    /// meanwhile gets nothing, and the block goes straight back to the backend.
    Result<Block> obtain(Lock& lock, std::size_t bytes, std::size_t asked) noexcept {
        if (closed_) return closed_error();
        const std::size_t capacity = block_size(bytes);
        Status query_failure;
        if constexpr (caching) {
            if (const std::optional<Block> cached = take_cached(capacity)) {
                ++stats_.cache_hits;
                return *cached;
            }
            if constexpr (streams) {
                if (const std::optional<Block> completed = take_completed(lock, capacity, query_failure)) {
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

    /// Precondition: mutex_ held. A cached block of exactly `capacity` with no pending work,
    /// out of the cache.
    std::optional<Block> take_cached(std::size_t capacity) noexcept {
        const auto [first, last] = cache_.equal_range(capacity);
        const auto found = std::find_if(first, last, [](const auto& entry) { return !entry.second.pending(); });
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
    std::optional<Block> take_completed(Lock& lock, std::size_t capacity, Status& failure) noexcept requires streams {
        const auto [first, last] = cache_.equal_range(capacity);
        const auto found = std::find_if(first, last, [](const auto& entry) { return !entry.second.unknown; });
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

    /// Precondition: `lock` holds mutex_. Records the grant of `block` as `pointer`; when the
    /// host has no memory for the record, the block goes back to the backend.
    Result<Grant> enroll(Lock& lock, const Block& block, void* pointer, std::size_t bytes,
                         PinnedHolder holder) noexcept {
        const std::uint64_t id = next_id_ + 1;
        if (!try_host_allocation([&] { live_.emplace(pointer, Live{block, bytes, id, holder, false, {}}); })) {
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

    /// Records an event on each stream of `entry` (events from the pool's idle ones, created
    /// when none is idle). When one cannot be had or recorded, the failure is reported and the
    /// device synchronized (the host blocks): if that succeeds, the work is complete and the
    /// entry no longer pending; if not (or the backend cannot synchronize), the entry is
    /// `unknown` — never handed out, freed only after a later wait.
    void mark(Cached& entry, const char* what) noexcept requires streams {
        bool failed = false;
        for (Use& use : entry.uses) {
            Result<Event> event = take_event();
            const Status recorded = event ? backend_->record_event(*event, use.stream) : event.status();
            if (recorded) {
                use.event = *event;
                use.recorded = true;
                continue;
            }
            if (event) drop_event(*event);
            failed = true;
            report(Status(recorded.code(),
                          message_or_empty("pinned pool ", what, ": recording an event after the work on a ",
                                           entry.block.capacity, "-byte block failed on backend '", name_,
                                           "': ", recorded.message(), "; synchronizing the device instead")));
        }
        if (!failed) return;
        count_wait();
        if (const Status synced = synchronize_device(); !synced) {
            entry.unknown = true;
            report(Status(synced.code(),
                          message_or_empty("pinned pool ", what, ": ", synced.message(), "; the ", entry.block.capacity,
                                           "-byte block is kept, never reused, until trim(), finalize() or the "
                                           "pool's destruction can wait for its work (backend '",
                                           name_, "')")));
            return;
        }
        std::lock_guard lock(mutex_);
        recycle(entry);
    }

    /// True when every event of `entry` completed; never blocks.
    Result<bool> poll(const Cached& entry) noexcept requires streams {
        for (const Use& use : entry.uses) {
            if (!use.recorded) continue;
            Result<bool> ready = backend_->event_ready(use.event);
            if (!ready || !*ready) return ready;
        }
        return true;
    }

    /// Blocks until the work of `entry` completed: each event is waited on; when that fails or
    /// the entry is `unknown`, the device is synchronized. On success the entry's events go
    /// back to the pool and it is no longer pending.
    Status wait_for(Cached& entry) noexcept requires streams {
        count_wait();
        Status waited;
        if (!entry.unknown) {
            for (const Use& use : entry.uses) {
                if (!use.recorded) continue;
                waited = backend_->synchronize_event(use.event);
                if (!waited) break;
            }
        }
        if (entry.unknown || !waited) {
            if (Status synced = synchronize_device(); !synced) {
                if (waited) return synced;
                return Status(waited.code(), message_or_empty(waited.message(), "; then ", synced.message()));
            }
        }
        std::lock_guard lock(mutex_);
        recycle(entry);
        return {};
    }

    Status synchronize_device() noexcept requires streams {
        if constexpr (SynchronizingBackend<B>) {
            Status synced = backend_->synchronize();
            if (!synced) return Status(synced.code(), message_or_empty("synchronize failed: ", synced.message()));
            return synced;
        } else {
            return Status(Errc::not_supported, message_or_empty("backend '", name_, "' has no synchronize()"));
        }
    }

    /// An event of the pool: an idle one, else a new one. Room for it among the idle events is
    /// reserved first, so giving it back never allocates.
    Result<Event> take_event() noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            if (!idle_events_.empty()) {
                const Event event = idle_events_.back();
                idle_events_.pop_back();
                return event;
            }
            if (!try_host_allocation([&] { idle_events_.reserve(events_owned_ + 1); })) {
                return Status(Errc::out_of_memory,
                              message_or_empty("pinned pool: host memory exhausted making room for an event (backend '",
                                               name_, "')"));
            }
            ++events_owned_;
        }
        Result<Event> created = backend_->create_event();
        std::lock_guard lock(mutex_);
        if (!created) {
            --events_owned_;
            return created.status();
        }
        ++stats_.events_created;
        return created;
    }

    /// Destroys an event whose recording failed (its state is unknown).
    void drop_event(Event event) noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            --events_owned_;
        }
        if (Status destroyed = backend_->destroy_event(event); !destroyed) report(destroyed);
    }

    void destroy_idle_events() noexcept requires streams {
        for (;;) {
            Event event{};
            {
                std::lock_guard lock(mutex_);
                if (idle_events_.empty()) return;
                event = idle_events_.back();
                idle_events_.pop_back();
                --events_owned_;
            }
            if (Status destroyed = backend_->destroy_event(event); !destroyed) {
                report(
                    Status(destroyed.code(), message_or_empty("pinned pool destroy: destroy_event failed on backend '",
                                                              name_, "': ", destroyed.message())));
            }
        }
    }

    /// Precondition: mutex_ held. The entry's work completed: its events go back to the idle
    /// ones (never allocates: take_event() reserved the room) and it is no longer pending.
    void recycle(Cached& entry) noexcept {
        if constexpr (streams) {
            for (const Use& use : entry.uses) {
                if (use.recorded) idle_events_.push_back(use.event);
            }
        }
        entry.uses.clear();
        entry.unknown = false;
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

    void count_wait() noexcept {
        std::lock_guard lock(mutex_);
        ++stats_.host_waits;
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
            if (closing) destroy_idle_events();
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

    /// A raw allocation (its block and recorded streams), out of the registry; nullopt when
    /// none is left. Adds its bytes to `bytes`. One at a time, so no host memory is needed to
    /// collect them.
    std::optional<Cached> take_raw(std::uint64_t& bytes) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = std::find_if(live_.begin(), live_.end(),
                                        [](const auto& entry) { return entry.second.holder == PinnedHolder::raw; });
        if (found == live_.end()) return std::nullopt;
        std::optional<Cached> entry(std::in_place, Cached{found->second.block, std::move(found->second.uses), false});
        bytes += found->second.requested;
        forget(found);
        return entry;
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

    B* backend_;
    std::string name_;  ///< the backend's name, for messages that may come after the backend is gone
    Cache cache_policy_;
    mutable std::mutex mutex_;
    std::unordered_map<void*, Live> live_;
    CacheMap cache_;
    CacheMap retiring_;  ///< released blocks with pending work, freed (not cached) once it completed
    /// Events not in use; their capacity covers every event the pool owns.
    std::vector<Event> idle_events_;
    std::size_t events_owned_ = 0;  ///< idle or recorded on a pending block
    PinnedStats stats_;
    std::uint64_t next_id_ = 0;
    bool closed_ = false;
    ErrorSink sink_;
};

}  // namespace detail
}  // namespace devstage
