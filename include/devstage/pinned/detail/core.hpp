// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedPoolCore, the shared core of a PinnedHostPool. The pool, its buffers, region
/// handles and allocator adaptors all hold the core, so whichever of them goes last, the others
/// find a registry, never freed memory; a block goes back to the backend only when nothing holds
/// it any more and no recorded work may still use it — or when the backend is torn down, before
/// its device or context goes.
///
/// A block's life: obtained (from the cache or the source) → live (in the registry, keyed by
/// the pointer handed out; record() adds the streams whose work uses it) → given back → cached
/// (when the policy keeps it and the pool is neither finalized since the grant nor destroyed)
/// or freed. A block given back with recorded streams gets an event recorded on each and is
/// *pending* until they all completed: cached but handed out only once a query finds them
/// complete, or *retiring* (kept out of the cache, freed once they completed).
///
/// The core is the pool's lifecycle, top to bottom; each step is a member with its own
/// interface, given the parts it works on:
///   what it holds   PinnedSink (the error sink), PinnedBlockSource (where blocks come from
///                   and go back to; the limits; the region table and its hooks; the NUMA
///                   arenas), PinnedEvents, PinnedPhase (open, closed, torn down),
///                   PinnedRegistry (live allocations), PinnedBlockCache (cached and retiring
///                   blocks), PinnedRegionSet (regions made with create_region);
///   what it does    PinnedObtain (blocks out), PinnedRetire (blocks back), PinnedStreams
///                   (record, forget), PinnedSweep (trim, finalize, close, the last sweep),
///                   PinnedTeardown (the backend goes), PinnedTeardownHooks (hearing of it).
/// One mutex, the core's, guards the phase, the registry, the cache, the region set and the
/// counters of the steps; each step takes it for itself and makes every backend call without it.
/// The source, the events and the hooks lock for themselves.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/block_source.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/detail/messages.hpp"
#include "devstage/pinned/detail/obtain.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/region_set.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/pinned/detail/retire.hpp"
#include "devstage/pinned/detail/stream_types.hpp"
#include "devstage/pinned/detail/streams.hpp"
#include "devstage/pinned/detail/sweep.hpp"
#include "devstage/pinned/detail/teardown.hpp"
#include "devstage/pinned/detail/teardown_hooks.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/pinned/stats.hpp"
#include "devstage/region.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage::detail {

template <PinnedHostBackend B, class Cache>
class PinnedPoolCore final : public PinnedCore {
    static constexpr bool streams = AsyncBackend<B>;
    static constexpr bool caching = !std::is_same_v<Cache, DirectPinned>;
    using Lock = std::unique_lock<std::mutex>;
    using Entry = PinnedEntry<B>;
    using Live = typename PinnedRegistry<B>::Live;

public:
    using Stream = typename PinnedStreamTypes<B>::Stream;
    using Event = typename PinnedStreamTypes<B>::Event;

    // ---- made, hooked to the backend's teardown ---------------------------------------------

    PinnedPoolCore(B& backend, Cache cache, PinnedPoolOptions options)
        : source_(backend, sink_, std::move(options)), events_(sink_), cache_(max_cached(cache)) {
        if constexpr (TeardownBackend<B>) hooks_.hook(backend);
    }
    PinnedPoolCore(const PinnedPoolCore&) = delete;
    PinnedPoolCore& operator=(const PinnedPoolCore&) = delete;

    /// Runs when the pool and everything holding its memory are gone (PinnedSweep::destroy).
    ~PinnedPoolCore() override {
        hooks_.unhook_all();
        region_set_.stop_all();
        sweep_.destroy();
    }

    // ---- blocks out -------------------------------------------------------------------------

    Result<Grant> allocate(std::size_t bytes, std::size_t alignment, PinnedHolder holder) noexcept override {
        return allocate_on(bytes, alignment, holder, -1);
    }

    /// allocate() from the arena of NUMA node `node` (-1: the backend's pinned_malloc memory).
    Result<Grant> allocate_on(std::size_t bytes, std::size_t alignment, PinnedHolder holder, int node) noexcept {
        if (bytes == 0) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool allocate: 0 bytes requested on backend '", name(), "'"));
        }
        const std::optional<std::size_t> padded = detail::add(bytes, alignment - 1);
        if (!std::has_single_bit(alignment) || !padded) {
            return Status(
                Errc::invalid_argument,
                message_or_empty("pinned pool allocate: ", bytes, " bytes aligned to ", alignment,
                                 " is not a power-of-two alignment of a representable size (backend '", name(), "')"));
        }
        Lock lock(mutex_);
        Result<PinnedBlock> block = obtain_.obtain(lock, bytes, bytes, node);
        if (!block) return block.status();
        void* pointer = block->base;
        if (!detail::is_aligned(pointer, alignment)) {
            // Pinned allocators align blocks to pages, so the exact size is tried first; a block
            // that misses the alignment is given back and one `alignment - 1` bytes larger
            // serves instead, whatever the backend aligns to.
            if (Status retired = retire_.retire(lock, *block, phase_.cacheable()); !retired) report(retired);
            lock.lock();
            block = obtain_.obtain(lock, *padded, bytes, node);
            if (!block) return block.status();
            pointer = detail::align_pointer(block->base, alignment);
        }
        return obtain_.enroll(lock, *block, pointer, bytes, holder);
    }

    // ---- live: the streams whose work uses it -----------------------------------------------

    /// See PinnedStreams::record.
    Status record(const void* pointer, std::uint64_t id, Stream stream, B& backend,
                  bool check) noexcept requires streams {
        return streams_.record(pointer, id, stream, backend, check);
    }
    /// record() of a PinnedBuffer: its memory (`data`, `bytes`, grant `id`), held from `owner`.
    Status record_buffer(const PinnedCore* owner, const void* data, std::size_t bytes, std::uint64_t id, Stream stream,
                         B& backend, bool check) noexcept requires streams {
        return streams_.record_buffer(owner, this, data, bytes, id, stream, backend, check);
    }
    /// Lets go of `backend` (PinnedForget): on success the pool makes no further call to it.
    Status forget(B& backend) noexcept requires streams { return streams_.forget(backend, false); }

    // ---- given back -------------------------------------------------------------------------

    Status release(void* pointer, std::uint64_t id, PinnedHolder holder) noexcept override {
        const bool by_container = holder == PinnedHolder::container;
        const char* what = by_container ? "deallocate" : "release";
        Lock lock(mutex_);
        const auto found = registry_.lookup(pointer);
        if (found == registry_.end() || (id != 0 && found->second.id != id)) {
            return pinned_messages::unknown_pointer(what, pointer, name());
        }
        if (const bool of_container = found->second.holder == PinnedHolder::container; of_container != by_container) {
            return pinned_messages::wrong_holder(of_container, pointer, name());
        }
        Live live = registry_.unlist(found);
        if (live.revoked) return {};  // its block went back when the backend was torn down
        const bool keep = !live.detached && phase_.cacheable() && PinnedRetire<B>::keeps(live.block);
        if constexpr (streams) {
            const bool retiring = cache_.has_retiring();
            Status released;
            if (live.uses.empty()) {
                released = retire_.retire(lock, live.block, keep);
            } else {
                lock.unlock();
                released = retire_.retire_recorded(Entry{live.block, std::move(live.uses), false}, keep, what);
            }
            if (retiring) retire_.collect();  // earlier blocks whose work may have completed since
            return released;
        } else {
            return retire_.retire(lock, live.block, keep);
        }
    }

    // ---- regions made with create_region (PinnedRegionSet) ----------------------------------

    Result<std::uint64_t> create_region(std::size_t bytes, const RegionOptions& options) noexcept {
        return region_set_.create(bytes, options);
    }
    void* region_base(std::uint64_t id) const noexcept { return region_set_.base(id); }
    RegionProgress region_progress(std::uint64_t id) const noexcept override { return region_set_.progress(id); }
    Result<bool> region_ready(std::uint64_t id) const noexcept override { return region_set_.ready(id); }
    Status region_wait(std::uint64_t id) noexcept override { return region_set_.wait(id); }
    Status region_cancel(std::uint64_t id) noexcept override { return region_set_.cancel(id); }

    Result<Grant> region_allocate(std::uint64_t id, std::size_t bytes, std::size_t alignment,
                                  PinnedHolder holder) noexcept override {
        Lock lock(mutex_);
        Result<PinnedBlock> slice = region_set_.cut(lock, id, bytes, alignment);
        if (!slice) return slice.status();
        return obtain_.enroll(lock, *slice, slice->base, bytes, holder);
    }

    void region_drop(std::uint64_t id) noexcept override { region_set_.drop(id); }

    // ---- regions for transfer engines (the source's region table) ---------------------------

    std::vector<PinnedRegion> regions() const { return source_.regions().list(); }
    Status set_region_hooks(RegionHooks hooks) noexcept { return source_.regions().set_hooks(std::move(hooks)); }

    /// The region holding `pointer`, its offset there, and the bytes from it to the end of the
    /// live allocation holding it (of the region, when no live allocation does).
    std::optional<RegionSlice> describe(const void* pointer) const noexcept {
        const std::optional<PinnedRegion> region = source_.regions().containing(pointer);
        if (!region) return std::nullopt;
        const auto offset = static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(pointer) -
                                                     reinterpret_cast<std::uintptr_t>(region->base));
        std::size_t bytes = region->bytes - offset;
        {
            std::lock_guard lock(mutex_);
            if (const auto live = registry_.containing(pointer)) {
                const auto start = reinterpret_cast<std::uintptr_t>(live->first);
                bytes = live->second->requested -
                        static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(pointer) - start);
            }
        }
        return RegionSlice{region->id, offset, bytes};
    }

    // ---- in bulk: trim, finalize, close (PinnedSweep) ---------------------------------------

    Status trim() noexcept { return sweep_.trim(); }
    Status finalize() noexcept { return sweep_.finalize(); }
    Status close() noexcept { return sweep_.close(); }

    // ---- what it tells ----------------------------------------------------------------------

    PinnedStats stats() const noexcept override {
        PinnedStats out;
        {
            std::lock_guard lock(mutex_);
            registry_.add_to(out);
            cache_.add_to(out);
            obtain_.add_to(out);
            teardown_.add_to(out);
        }
        out.backend_allocations = source_.allocations();
        out.backend_frees = source_.frees();
        out.locked_bytes = source_.locked_bytes();
        out.regions = source_.regions().size();
        out.registered_chunks = source_.chunks();
        out.limit_refusals = source_.limit_refusals();
        out.events_created = events_.events_created();
        out.host_waits = events_.host_waits();
        out.numa_blocks = source_.numa().blocks();
        out.numa_fallbacks = source_.numa().fallbacks();
        return out;
    }

    /// True when `pointer` is the start of a live allocation (detached ones included).
    bool owns(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return registry_.contains(pointer);
    }

    void report(const Status& status) noexcept override { sink_.report(status); }
    void set_sink(ErrorSink sink) noexcept { sink_.set(sink); }
    B& backend() const noexcept { return source_.backend(); }
    const std::string& name() const noexcept { return source_.name(); }

    int node_for(const B& device) noexcept { return source_.numa().node_for(device); }
    Status set_node(const B& device, int node) noexcept { return source_.numa().set_node(device, node); }

private:
    // ---- the backend goes (PinnedTeardownHooks calls this) ----------------------------------

    /// The pool's own backend: everything goes back (PinnedTeardown). A backend of recorded
    /// streams: forgotten, its work dropped where it cannot be waited for.
    static void torn_down(void* owner, B& backend) noexcept {
        PinnedPoolCore& core = *static_cast<PinnedPoolCore*>(owner);
        if (&backend == &core.backend()) {
            core.teardown_.run();
        } else if constexpr (streams) {
            if (Status forgotten = core.streams_.forget(backend, true); !forgotten) core.report(forgotten);
        }
    }

    static std::size_t max_cached(const Cache& cache) noexcept {
        if constexpr (caching) {
            return cache.max_cached_bytes;
        } else {
            return 0;
        }
    }

    // What it holds.
    PinnedSink sink_;
    PinnedBlockSource<B> source_;
    PinnedEvents<B> events_;
    mutable std::mutex mutex_;  ///< phase_, registry_, cache_, region_set_ and the steps' counters
    PinnedPhase phase_{caching};
    PinnedRegistry<B> registry_;
    PinnedBlockCache<B> cache_;
    PinnedRegionSet<B> region_set_{mutex_, phase_, source_, sink_};
    // What it does.
    PinnedRetire<B> retire_{mutex_, phase_, cache_, events_, source_, region_set_, sink_};
    PinnedObtain<B, Cache> obtain_{mutex_, phase_, registry_, cache_, events_, source_, retire_, sink_};
    PinnedTeardownHooks<B> hooks_{&PinnedPoolCore::torn_down, this, sink_};
    PinnedStreams<B> streams_{mutex_,         phase_, registry_, cache_, events_, hooks_, source_.backend(),
                              source_.name(), sink_};
    PinnedSweep<B> sweep_{mutex_, phase_, registry_, cache_, events_, retire_, source_.name(), sink_};
    PinnedTeardown<B> teardown_{mutex_, phase_, registry_, events_, source_, region_set_, retire_, streams_, sink_};
};

}  // namespace devstage::detail
