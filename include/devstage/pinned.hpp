// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// PinnedHostPool: page-locked host memory from a backend, thread-safe, cached, with RAII
/// buffers, a standard allocator and a std::pmr::memory_resource over it — so inputs are
/// generated directly in pinned memory and uploads need no pageable-to-pinned bounce.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <new>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/align.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// Cache policy: no caching; every release frees to the backend.
struct DirectPinned {};

/// Cache policy: released blocks are kept by size class and reused. Classes are powers of two
/// up to 1 MiB, then eight classes per doubling (at most 12.5% over the bytes asked for, not
/// the 2x of pure power-of-two classes). At most `max_cached_bytes` are kept; trim() frees them.
struct CachingPinned {
    std::size_t max_cached_bytes = std::size_t{1} << 30;

    static constexpr std::size_t size_class(std::size_t bytes) noexcept {
        constexpr std::size_t smallest = 256, fine_from = std::size_t{1} << 20;
        if (bytes <= smallest) return smallest;
        if (bytes <= fine_from) return std::bit_ceil(bytes);
        const std::size_t step = std::bit_floor(bytes) / 8;
        const auto rounded = detail::align_up(bytes, step);
        return rounded ? *rounded : bytes;
    }
};

/// Counters of a PinnedHostPool. Bytes are the bytes callers asked for unless named "cached".
struct PinnedStats {
    std::uint64_t live_allocations = 0;
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_live_bytes = 0;
    std::uint64_t cached_blocks = 0;
    std::uint64_t cached_bytes = 0;  ///< capacity of blocks held in the cache
    std::uint64_t cache_hits = 0;
    std::uint64_t cache_misses = 0;  ///< allocations that went to the backend
    std::uint64_t backend_allocations = 0;
    std::uint64_t backend_frees = 0;
    std::uint64_t finalized_allocations = 0;  ///< live allocations freed by finalize()
    std::uint64_t finalized_bytes = 0;
};

namespace detail {

[[noreturn]] inline void throw_bad_alloc() {
#if defined(__cpp_exceptions)
    throw std::bad_alloc();
#else
    std::abort();
#endif
}

/// The type-erased heart of a pool, shared by the pool, its buffers and its allocators, so
/// that a buffer outliving the pool finds a registry (empty by then) instead of freed memory.
class PinnedCore {
public:
    struct Grant {
        void* pointer;
        std::uint64_t id;
    };
    virtual ~PinnedCore() = default;
    virtual Result<Grant> allocate(std::size_t bytes) noexcept = 0;
    /// `id` 0 releases whatever allocation `pointer` is; otherwise only that grant.
    virtual Status release(void* pointer, std::uint64_t id) noexcept = 0;
    virtual void report(const Status& status) noexcept = 0;

    /// Releases from a destructor or deallocate(): a pointer already freed by finalize() is
    /// fine; any other failure goes to the error sink.
    void give_back(void* pointer, std::uint64_t id) noexcept {
        if (Status status = release(pointer, id); !status && status.code() != Errc::unknown_pointer) report(status);
    }

    /// For the Allocator and memory_resource interfaces: throws std::bad_alloc on failure.
    void* allocate_or_throw(std::size_t bytes, std::size_t alignment) {
        Result<Grant> grant = allocate(std::max<std::size_t>(bytes, 1));
        if (!grant) throw_bad_alloc();
        if (!is_aligned(grant->pointer, alignment)) {
            give_back(grant->pointer, grant->id);
            throw_bad_alloc();
        }
        return grant->pointer;
    }

protected:
    PinnedCore() = default;
    PinnedCore(const PinnedCore&) = default;
    PinnedCore& operator=(const PinnedCore&) = default;
};

}  // namespace detail

/// Pinned host memory held from a PinnedHostPool; given back when destroyed. Move-only.
/// `auto buf = pool.allocate(n * sizeof(float)); std::span<float> v = buf->as<float>();`
/// Destroying it after the pool finalized or died is harmless.
class PinnedBuffer {
public:
    PinnedBuffer() noexcept = default;
    PinnedBuffer(PinnedBuffer&& other) noexcept
        : core_(std::move(other.core_)),
          data_(std::exchange(other.data_, nullptr)),
          size_(std::exchange(other.size_, 0)),
          id_(std::exchange(other.id_, 0)) {}
    PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
        if (this != &other) {
            reset();
            core_ = std::move(other.core_);
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
            id_ = std::exchange(other.id_, 0);
        }
        return *this;
    }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    ~PinnedBuffer() { reset(); }

    void* data() const noexcept { return data_; }
    /// The bytes asked for (the block behind may be larger).
    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return data_ == nullptr; }

    /// The memory as T elements; empty when the size is not a multiple of sizeof(T) or the
    /// data is not aligned for T.
    template <class T>
    std::span<T> as() const noexcept {
        if (data_ == nullptr || size_ % sizeof(T) != 0 || !detail::is_aligned(data_, alignof(T))) return {};
        return {static_cast<T*>(data_), size_ / sizeof(T)};
    }

    /// Gives the memory back now; the buffer is empty afterwards. After the pool finalized
    /// this is a no-op.
    void reset() noexcept {
        if (core_ != nullptr && data_ != nullptr) core_->give_back(data_, id_);
        core_.reset();
        data_ = nullptr;
        size_ = 0;
        id_ = 0;
    }

private:
    template <PinnedHostBackend, class>
    friend class PinnedHostPool;
    PinnedBuffer(std::shared_ptr<detail::PinnedCore> core, void* data, std::size_t size, std::uint64_t id) noexcept
        : core_(std::move(core)), data_(data), size_(size), id_(id) {}

    std::shared_ptr<detail::PinnedCore> core_;
    void* data_ = nullptr;
    std::size_t size_ = 0;
    std::uint64_t id_ = 0;
};

/// A pool of page-locked host memory over one backend instance (and so that backend's
/// device, never the calling thread's current one). Thread-safe: allocate and release may be
/// called from any thread. The backend must outlive the pool and accept concurrent calls.
/// `PinnedHostPool<SimBackend> pool(sim); auto buf = pool.allocate(1 << 20);`
template <PinnedHostBackend B, class Cache = CachingPinned>
class PinnedHostPool {
    static constexpr bool caching = !std::is_same_v<Cache, DirectPinned>;

public:
    explicit PinnedHostPool(B& backend, Cache cache = {}) : core_(std::make_shared<Core>(backend, std::move(cache))) {}
    PinnedHostPool(const PinnedHostPool&) = delete;
    PinnedHostPool& operator=(const PinnedHostPool&) = delete;
    /// Finalizes: frees every allocation still live and every cached block.
    ~PinnedHostPool() {
        if (Status status = core_->finalize(); !status) core_->report(status);
        core_->close();
    }

    /// Pinned memory of at least `bytes` (> 0) bytes, released when the buffer dies.
    Result<PinnedBuffer> allocate(std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant = core_->allocate(bytes);
        if (!grant) return grant.status();
        return PinnedBuffer(core_, grant->pointer, bytes, grant->id);
    }

    /// Pinned memory for callers that hand raw pointers around; give it back with release().
    Result<void*> allocate_raw(std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant = core_->allocate(bytes);
        if (!grant) return grant.status();
        return grant->pointer;
    }

    /// Gives back memory from allocate_raw() (or a buffer's data()). A pointer the pool does
    /// not own, or one already released, is Errc::unknown_pointer.
    Status release(void* pointer) noexcept { return core_->release(pointer, 0); }

    /// True when `pointer` is the start of a live allocation of this pool.
    bool owns(const void* pointer) const noexcept { return core_->owns(pointer); }

    /// Frees every allocation still live and every cached block. Live ones are counted in
    /// stats().finalized_* and reported to the error sink; their buffers become inert. The
    /// pool stays usable. Returns the first backend failure, if any.
    Status finalize() noexcept { return core_->finalize(); }

    /// Frees every cached block (nothing live is touched).
    Status trim() noexcept { return core_->trim(); }

    PinnedStats stats() const noexcept { return core_->stats(); }
    void set_error_sink(ErrorSink sink) noexcept { core_->set_sink(sink); }
    B& backend() const noexcept { return core_->backend(); }

    /// The shared core, for PinnedAllocator and PinnedMemoryResource.
    std::shared_ptr<detail::PinnedCore> core() const noexcept { return core_; }

private:
    class Core final : public detail::PinnedCore {
    public:
        Core(B& backend, Cache cache) : backend_(&backend), cache_policy_(std::move(cache)) {}

        Result<Grant> allocate(std::size_t bytes) noexcept override {
            if (bytes == 0) {
                return Status(
                    Errc::invalid_argument,
                    detail::message("pinned pool allocate: 0 bytes requested on backend '", backend_->name(), "'"));
            }
            const std::size_t capacity = block_size(bytes);
            {
                std::lock_guard lock(mutex_);
                if (closed_) return closed_error("allocate");
                if constexpr (caching) {
                    const auto cached = cache_.find(capacity);
                    if (cached != cache_.end()) {
                        void* pointer = cached->second;
                        cache_.erase(cached);
                        stats_.cached_bytes -= capacity;
                        --stats_.cached_blocks;
                        ++stats_.cache_hits;
                        return grant(pointer, bytes, capacity);
                    }
                }
            }
            // The backend call is slow on real devices: made without holding the lock.
            Result<void*> pointer = backend_->pinned_malloc(capacity);
            if (!pointer && pointer.status().code() == Errc::out_of_memory && trim_some()) {
                pointer = backend_->pinned_malloc(capacity);
            }
            if (!pointer) {
                const Status& cause = pointer.status();
                return Status(cause.code(), detail::message("pinned pool allocate: ", capacity, " bytes (", bytes,
                                                            " asked) from backend '", backend_->name(),
                                                            "' failed: ", cause.message()));
            }
            std::lock_guard lock(mutex_);
            ++stats_.backend_allocations;
            ++stats_.cache_misses;
            return grant(*pointer, bytes, capacity);
        }

        Status release(void* pointer, std::uint64_t id) noexcept override {
            Block block;
            {
                std::lock_guard lock(mutex_);
                const auto found = live_.find(pointer);
                if (found == live_.end() || (id != 0 && found->second.id != id)) {
                    return Status(
                        Errc::unknown_pointer,
                        detail::message("pinned pool release: ", static_cast<const void*>(pointer),
                                        " is not a live allocation of this pool (backend '", backend_->name(), "')"));
                }
                block = found->second;
                live_.erase(found);
                --stats_.live_allocations;
                stats_.live_bytes -= block.requested;
                if constexpr (caching) {
                    if (stats_.cached_bytes + block.capacity <= cache_policy_.max_cached_bytes) {
                        cache_.emplace(block.capacity, pointer);
                        stats_.cached_bytes += block.capacity;
                        ++stats_.cached_blocks;
                        return {};
                    }
                }
            }
            return free_block(pointer, block.capacity);
        }

        bool owns(const void* pointer) const noexcept {
            std::lock_guard lock(mutex_);
            return live_.count(const_cast<void*>(pointer)) != 0;
        }

        Status finalize() noexcept {
            std::vector<std::pair<void*, std::size_t>> doomed;
            std::uint64_t live_count = 0, live_bytes = 0;
            {
                std::lock_guard lock(mutex_);
                doomed.reserve(live_.size() + cache_.size());
                for (const auto& [pointer, block] : live_) {
                    doomed.emplace_back(pointer, block.capacity);
                    ++live_count;
                    live_bytes += block.requested;
                }
                for (const auto& [capacity, pointer] : cache_) doomed.emplace_back(pointer, capacity);
                live_.clear();
                cache_.clear();
                stats_.live_allocations = stats_.live_bytes = 0;
                stats_.cached_blocks = stats_.cached_bytes = 0;
                stats_.finalized_allocations += live_count;
                stats_.finalized_bytes += live_bytes;
            }
            if (live_count > 0) {
                report(Status(Errc::leaked,
                              detail::message("pinned pool finalize: freed ", live_count, " allocation(s) still live, ",
                                              live_bytes, " bytes, on backend '", backend_->name(), "'")));
            }
            return free_all(doomed, "finalize");
        }

        Status trim() noexcept {
            std::vector<std::pair<void*, std::size_t>> doomed;
            {
                std::lock_guard lock(mutex_);
                for (const auto& [capacity, pointer] : cache_) doomed.emplace_back(pointer, capacity);
                cache_.clear();
                stats_.cached_blocks = stats_.cached_bytes = 0;
            }
            return free_all(doomed, "trim");
        }

        PinnedStats stats() const noexcept {
            std::lock_guard lock(mutex_);
            return stats_;
        }
        void report(const Status& status) noexcept override { sink_(status); }
        void set_sink(ErrorSink sink) noexcept { sink_ = sink; }
        void close() noexcept {
            std::lock_guard lock(mutex_);
            closed_ = true;
        }
        B& backend() const noexcept { return *backend_; }

    private:
        struct Block {
            std::size_t requested = 0;
            std::size_t capacity = 0;
            std::uint64_t id = 0;
        };

        std::size_t block_size(std::size_t bytes) const noexcept {
            if constexpr (caching) return Cache::size_class(bytes);
            return bytes;
        }

        // Precondition: mutex_ held.
        Result<Grant> grant(void* pointer, std::size_t bytes, std::size_t capacity) noexcept {
            const std::uint64_t id = ++next_id_;
            live_.emplace(pointer, Block{bytes, capacity, id});
            ++stats_.live_allocations;
            stats_.live_bytes += bytes;
            stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
            return Grant{pointer, id};
        }

        Status closed_error(const char* what) const noexcept {
            return Status(
                Errc::invalid_argument,
                detail::message("pinned pool ", what, ": the pool was destroyed (backend '", backend_->name(), "')"));
        }

        Status free_block(void* pointer, std::size_t capacity) noexcept {
            Status status = backend_->pinned_free(pointer);
            {
                std::lock_guard lock(mutex_);
                ++stats_.backend_frees;
            }
            if (!status) {
                return Status(status.code(),
                              detail::message("pinned pool: pinned_free of ", capacity, " bytes failed on backend '",
                                              backend_->name(), "': ", status.message()));
            }
            return status;
        }

        Status free_all(const std::vector<std::pair<void*, std::size_t>>& doomed, const char* what) noexcept {
            Status first;
            std::size_t failures = 0;
            for (const auto& [pointer, capacity] : doomed) {
                if (Status status = free_block(pointer, capacity); !status) {
                    ++failures;
                    if (first.ok()) first = std::move(status);
                }
            }
            if (failures > 1) {
                return Status(first.code(), detail::message("pinned pool ", what, ": ", failures, " of ", doomed.size(),
                                                            " frees failed; first: ", first.message()));
            }
            return first;
        }

        // Frees the cache after an out-of-memory; true when anything was freed.
        bool trim_some() noexcept {
            if constexpr (caching) {
                const bool had = stats().cached_blocks > 0;
                if (had) (void)trim();
                return had;
            }
            return false;
        }

        B* backend_;
        Cache cache_policy_;
        mutable std::mutex mutex_;
        std::unordered_map<void*, Block> live_;
        std::multimap<std::size_t, void*> cache_;
        PinnedStats stats_;
        std::uint64_t next_id_ = 0;
        bool closed_ = false;
        ErrorSink sink_;
    };

    std::shared_ptr<Core> core_;
};

/// A standard allocator over any PinnedHostPool, so containers fill pinned memory directly.
/// `std::vector<float, PinnedAllocator<float>> v(n, PinnedAllocator<float>(pool));`
/// Allocation failure throws std::bad_alloc, as the Allocator requirements demand (it aborts
/// when exceptions are disabled); deallocation never throws. Copies share the pool.
template <class T>
class PinnedAllocator {
public:
    using value_type = T;

    template <PinnedHostBackend B, class Cache>
    PinnedAllocator(const PinnedHostPool<B, Cache>& pool) noexcept  // NOLINT(google-explicit-constructor)
        : core_(pool.core()) {}
    template <class U>
    PinnedAllocator(const PinnedAllocator<U>& other) noexcept  // NOLINT(google-explicit-constructor)
        : core_(other.core()) {}

    T* allocate(std::size_t n) {
        if (n > std::size_t(-1) / sizeof(T)) detail::throw_bad_alloc();
        return static_cast<T*>(core_->allocate_or_throw(n * sizeof(T), alignof(T)));
    }
    void deallocate(T* pointer, std::size_t /*n*/) noexcept { core_->give_back(pointer, 0); }

    const std::shared_ptr<detail::PinnedCore>& core() const noexcept { return core_; }
    friend bool operator==(const PinnedAllocator& a, const PinnedAllocator& b) noexcept { return a.core_ == b.core_; }

private:
    std::shared_ptr<detail::PinnedCore> core_;
};

/// A std::pmr::memory_resource over any PinnedHostPool.
/// `PinnedMemoryResource mr(pool); std::pmr::vector<float> v(&mr);`
class PinnedMemoryResource final : public std::pmr::memory_resource {
public:
    template <PinnedHostBackend B, class Cache>
    explicit PinnedMemoryResource(const PinnedHostPool<B, Cache>& pool) noexcept : core_(pool.core()) {}

private:
    void* do_allocate(std::size_t bytes, std::size_t alignment) override {
        return core_->allocate_or_throw(bytes, alignment);
    }
    void do_deallocate(void* pointer, std::size_t /*bytes*/, std::size_t /*alignment*/) override {
        core_->give_back(pointer, 0);
    }
    bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
        const auto* same = dynamic_cast<const PinnedMemoryResource*>(&other);
        return same != nullptr && same->core_ == core_;
    }

    std::shared_ptr<detail::PinnedCore> core_;
};

}  // namespace devstage
