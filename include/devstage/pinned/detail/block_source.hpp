// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedBlockSource, where a pinned pool's blocks come from and go back to: the
/// backend's pinned_malloc, or memory the pool maps itself (bound to a NUMA node, or pinned at
/// the exact size asked for) and pins in place with host_register in chunks; the limits a big
/// request is checked against first; and the region table, whose hooks hear of every block
/// before it is handed out and before it goes back. Thread-safe: its counters are atomic, the
/// region table and the NUMA arenas lock for themselves, and it holds no lock during a backend
/// call.

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/chunked_registration.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/numa_arenas.hpp"
#include "devstage/pinned/detail/region_table.hpp"
#include "devstage/pinned/limits.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/region.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

inline std::size_t page_bytes() noexcept {
    static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return page;
}

/// `bytes` of anonymous memory, whole pages, not yet touched; `what` names the caller.
inline Result<void*> map_anonymous(std::size_t bytes, const char* what) noexcept {
    void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        const int error = errno;
        return Status(Errc::out_of_memory,
                      message_or_empty(what, ": mmap of ", bytes, " bytes failed: ", errno_text(error)));
    }
    return memory;
}

template <class B>
class PinnedBlockSource {
public:
    PinnedBlockSource(B& backend, const PinnedSink& sink, PinnedPoolOptions options)
        : backend_(&backend),
          name_(backend.name()),
          sink_(&sink),
          numa_(std::move(options.numa), sink),
          exact_(options.exact),
          limits_(std::move(options.limits)) {}
    PinnedBlockSource(const PinnedBlockSource&) = delete;
    PinnedBlockSource& operator=(const PinnedBlockSource&) = delete;

    B& backend() const noexcept { return *backend_; }
    const std::string& name() const noexcept { return name_; }
    RegionTable& regions() noexcept { return regions_; }
    const RegionTable& regions() const noexcept { return regions_; }
    PinnedNumaArenas<B>& numa() noexcept { return numa_; }
    const PinnedNumaArenas<B>& numa() const noexcept { return numa_; }

    /// The whole pages an exact request of `bytes` takes, when `bytes` is at least the exact
    /// threshold; nullopt when it takes a size class.
    std::optional<std::size_t> exact_size(std::size_t bytes) const noexcept {
        if (exact_.threshold == 0 || bytes < exact_.threshold) return std::nullopt;
        const std::optional<std::size_t> pages = round_up(bytes, page_bytes());
        return pages ? pages : std::optional<std::size_t>(bytes);
    }

    /// The chunk size of a registration: `chunk` when not 0, else the pool's, else the backend's.
    std::size_t chunk_size(std::size_t chunk) const noexcept {
        if (chunk != 0) return chunk;
        if (exact_.chunk_bytes != 0) return exact_.chunk_bytes;
        return host_register_chunk_bytes<B>();
    }

    /// Ok when pinning `bytes` more fits the limits that apply (the cgroup's memory limit;
    /// RLIMIT_MEMLOCK where the backend pins with mlock, or for RDMA). Counted when refused.
    Status check_limits(std::size_t bytes, bool rdma) noexcept {
        PinLimits limits = limits_;
        limits.rdma = limits.rdma || rdma;
        Status checked = check_pin_request(bytes, locked_bytes(), limits, pins_with_mlock<B>());
        if (!checked) limit_refusals_.fetch_add(1, std::memory_order_relaxed);
        return checked;
    }

    /// A block of `capacity` bytes (`asked` by the caller) from the backend: on NUMA node
    /// `node` when >= 0 (mapped, bound, touched, pinned in place; pinned_malloc memory when the
    /// node is refused), pinned at its exact size in chunks when `exact` (after the limits are
    /// checked), else pinned_malloc. Listed as a region once the hooks accepted it; a refusal
    /// frees it and is returned. No lock is held.
    Result<PinnedBlock> obtain(std::size_t capacity, std::size_t asked, int node, bool exact) noexcept {
        if (exact) {
            if (Status fits = check_limits(capacity, false); !fits) return fits;
        }
        Result<PinnedBlock> block = pin(capacity, node, exact);
        if (!block) {
            const Status& cause = block.status();
            return Status(cause.code(),
                          message_or_empty("pinned pool allocate: ", capacity, " bytes (", asked,
                                           " asked) from backend '", name_, "' failed: ", cause.message()));
        }
        if (Status listed = list(*block, "pinned pool allocate"); !listed) return listed;
        return block;
    }

    /// Pins `capacity` bytes (whole pages: see exact_size) mapped here, on `node` when >= 0, in
    /// chunks of `chunk` bytes; not listed. For regions, which register in the background.
    Result<PinnedBlock> map(std::size_t capacity, int node, std::size_t chunk) noexcept {
        Result<void*> memory = node >= 0 ? numa_.map(capacity, node, name_) : map_anonymous(capacity, "pinned region");
        if (!memory) return memory.status();
        PinnedBlock block;
        block.base = *memory;
        block.capacity = capacity;
        block.node = node;
        block.source = BlockSource::mapped;
        block.chunk = chunk_size(chunk);
        block.exact = true;
        return block;
    }

    /// Lists `block` as a region (the hooks' `added` runs); a refusal frees it and is returned.
    Status list(PinnedBlock& block, const char* what) noexcept {
        PinnedRegion region{0, block.base, block.capacity, block.node, RegionKind::pinned_host, -1};
        if (Status accepted = regions_.add(region, what); !accepted) {
            if (Status freed = give_back(block); !freed) {
                sink_->report(freed);
            } else {
                count_unpinned(block);
            }
            return accepted;
        }
        block.region = region.id;
        return {};
    }

    /// Counts a block pinned from the backend (a region's, once registered).
    void count_pinned(const PinnedBlock& block) noexcept {
        allocations_.fetch_add(1, std::memory_order_relaxed);
        locked_bytes_.fetch_add(block.capacity, std::memory_order_relaxed);
        if (block.node >= 0) numa_.count_block();
    }
    /// Counts a block counted pinned that went back (a region's, freed or never registered).
    void count_unpinned(const PinnedBlock& block) noexcept {
        frees_.fetch_add(1, std::memory_order_relaxed);
        locked_bytes_.fetch_sub(block.capacity, std::memory_order_relaxed);
    }
    void count_chunks(std::size_t chunks) noexcept { chunks_.fetch_add(chunks, std::memory_order_relaxed); }

    /// Gives a block back: the region hooks' `removing` runs, then the backend frees it
    /// (pinned_free; or every chunk unregistered, then the mapping unmapped). A failure is
    /// returned and the block stays allocated.
    Status free(const PinnedBlock& block) noexcept {
        regions_.remove(block.base);
        Status status = give_back(block);
        frees_.fetch_add(1, std::memory_order_relaxed);
        // An unpinned block stopped counting as locked when it was unpinned.
        if (status && block.source != BlockSource::unpinned) {
            locked_bytes_.fetch_sub(block.capacity, std::memory_order_relaxed);
        }
        if (!status) {
            return Status(status.code(),
                          message_or_empty("pinned pool: freeing a ", block.capacity, "-byte block failed on backend '",
                                           name_, "': ", status.message()));
        }
        return status;
    }

    /// Unpins a mapped block in place (every chunk unregistered; the mapping stays, as pageable
    /// memory) after the region hooks' `removing`; the block is then `unpinned`, and free()
    /// only unmaps it. For blocks still held when the backend is torn down.
    Status unpin(PinnedBlock& block) noexcept {
        regions_.remove(block.base);
        Status status = unregister(block);
        if (status) {
            locked_bytes_.fetch_sub(block.capacity, std::memory_order_relaxed);
            block.source = BlockSource::unpinned;
            block.region = 0;
        }
        return status;
    }

    std::uint64_t locked_bytes() const noexcept { return locked_bytes_.load(std::memory_order_relaxed); }
    std::uint64_t allocations() const noexcept { return allocations_.load(std::memory_order_relaxed); }
    std::uint64_t frees() const noexcept { return frees_.load(std::memory_order_relaxed); }
    std::uint64_t chunks() const noexcept { return chunks_.load(std::memory_order_relaxed); }
    std::uint64_t limit_refusals() const noexcept { return limit_refusals_.load(std::memory_order_relaxed); }

private:
    /// The backend calls of obtain(), without the region.
    Result<PinnedBlock> pin(std::size_t capacity, int node, bool exact) noexcept {
        if constexpr (HostRegisterBackend<B>) {
            if (node >= 0 || exact) {
                Result<PinnedBlock> mapped = map(capacity, node, 0);
                if (mapped) {
                    ChunkedRegistration<B> registration(*backend_, mapped->base, mapped->capacity, mapped->chunk);
                    const Status registered = exact_.threads > 0 ? run_threads(registration) : registration.run();
                    if (registered) {
                        count_chunks(registration.chunks());
                        count_pinned(*mapped);
                        return mapped;
                    }
                    ::munmap(mapped->base, mapped->capacity);
                    // A backend that cannot pin in place (not_supported: a C backend without
                    // the capability) serves the request with pinned_malloc.
                    if (registered.code() != Errc::not_supported) {
                        if (node >= 0) {
                            return Status(registered.code(),
                                          message_or_empty("the block bound to NUMA node ", node,
                                                           " could not be pinned: ", registered.message()));
                        }
                        return registered;
                    }
                } else if (mapped.status().code() != Errc::not_supported) {
                    return mapped.status();  // not_supported: the node was refused
                }
                node = -1;
            }
        }
        if (exact && capacity > pinned_malloc_limit<B>()) {
            return Status(Errc::out_of_memory,
                          message_or_empty("one pinned_malloc of backend '", name_, "' may ask for at most ",
                                           pinned_malloc_limit<B>(),
                                           " bytes (its runtime refuses more in one call); create smaller regions"));
        }
        Result<void*> pointer = backend_->pinned_malloc(capacity);
        if (!pointer) return pointer.status();
        PinnedBlock block;
        block.base = *pointer;
        block.capacity = capacity;
        block.exact = exact;
        count_pinned(block);
        return block;
    }

    Status run_threads(ChunkedRegistration<B>& registration) noexcept {
        std::mutex mutex;
        std::condition_variable finished;
        bool done = false;
        Status outcome;
        const Status started = registration.start(exact_.threads, [&](const Status& status) {
            std::lock_guard lock(mutex);
            outcome = status;
            done = true;
            finished.notify_all();
        });
        if (!started) return registration.run();
        {
            std::unique_lock lock(mutex);
            finished.wait(lock, [&] { return done; });
        }
        registration.join();
        return outcome;
    }

    /// Unregisters every chunk of a mapped block.
    Status unregister(const PinnedBlock& block) noexcept {
        if constexpr (HostRegisterBackend<B>) {
            if (block.source != BlockSource::mapped) return {};
            Status first;
            const std::size_t chunk = block.chunk == 0 ? block.capacity : block.chunk;
            for (std::size_t at = 0; at < block.capacity; at += chunk) {
                if (Status undone = backend_->host_unregister(static_cast<std::byte*>(block.base) + at);
                    !undone && first.ok()) {
                    first = std::move(undone);
                }
            }
            return first;
        } else {
            return {};
        }
    }

    /// The backend's part of free(): pinned_free, or unregister and unmap.
    Status give_back(const PinnedBlock& block) noexcept {
        switch (block.source) {
            case BlockSource::malloc:
                return backend_->pinned_free(block.base);
            case BlockSource::mapped:
                if (Status undone = unregister(block); !undone) return undone;
                ::munmap(block.base, block.capacity);
                return {};
            case BlockSource::unpinned:
                ::munmap(block.base, block.capacity);
                return {};
            case BlockSource::slice:
                return Status(Errc::invalid_argument, "pinned pool: a slice goes back to its region, not the backend");
        }
        return {};
    }

    B* backend_;
    std::string name_;
    const PinnedSink* sink_;
    RegionTable regions_;
    PinnedNumaArenas<B> numa_;
    ExactPinning exact_;
    PinLimits limits_;
    std::atomic<std::uint64_t> allocations_{0}, frees_{0}, locked_bytes_{0}, chunks_{0}, limit_refusals_{0};
};

}  // namespace devstage::detail
