// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedPoolCore, the shared core of a PinnedHostPool. The pool, its buffers, region
/// handles and allocator adaptors all hold the core, so whichever of them goes last, the others
/// find a registry, never freed memory; a block goes back to the backend only when nothing holds
/// it any more and no recorded work may still use it — or when the backend is torn down, before
/// its device or context goes.
///
/// The core is composed of members, each a part with its own interface:
///   PinnedSink          the error sink;
///   PinnedBlockSource   where blocks come from and go back to (pinned_malloc, or memory mapped
///                       and pinned in place in chunks: NUMA-bound or exact-size blocks and
///                       regions), the limits checked first, the region table and its hooks;
///   PinnedEvents        the pool's events per backend, and the waits on recorded work;
///   PinnedRegistry      the live allocations (under the core's mutex);
///   PinnedBlockCache    the cached and retiring blocks (under the core's mutex);
///   PinnedRegionState   each region made with create_region;
///   PinnedForget        letting go of a backend whose streams were recorded.
/// The core puts them in order: it takes its mutex for the registry and the cache and makes
/// every backend call without it.
///
/// A block's life: obtained (from the cache or the source) → live (in the registry, keyed by
/// the pointer handed out; record() adds the streams whose work uses it) → given back → cached
/// (when the policy keeps it and the pool is neither finalized since the grant nor destroyed)
/// or freed. A block given back with recorded streams gets an event recorded on each and is
/// *pending* until they all completed: cached but handed out only once a query finds them
/// complete, or *retiring* (kept out of the cache, freed once they completed).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/block_source.hpp"
#include "devstage/pinned/detail/chunked_registration.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/forget.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/detail/region_state.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/pinned/detail/stream_types.hpp"
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
    using Use = PinnedUse<B>;
    using CacheMap = typename PinnedBlockCache<B>::Map;
    using Live = typename PinnedRegistry<B>::Live;
    using Region = PinnedRegionState<B>;

public:
    using Stream = typename PinnedStreamTypes<B>::Stream;
    using Event = typename PinnedStreamTypes<B>::Event;

    PinnedPoolCore(B& backend, Cache cache, PinnedPoolOptions options)
        : source_(backend, sink_, std::move(options)), events_(sink_), cache_(max_cached(cache)) {
        if constexpr (TeardownBackend<B>) hook(backend);
    }
    PinnedPoolCore(const PinnedPoolCore&) = delete;
    PinnedPoolCore& operator=(const PinnedPoolCore&) = delete;

    /// Runs when the pool and everything holding its memory are gone. Blocks given back after
    /// the pool's destruction whose recorded work was still pending are waited for (the host
    /// blocks) and freed; one whose wait fails is left allocated and reported. Then the events
    /// given back since the destruction are destroyed.
    ~PinnedPoolCore() override {
        unhook_all();
        for (const auto& [id, region] : regions_) region->stop();
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            cache_.take_all(batch, true);
        }
        Tally tally;
        free_all(batch, true, "destroy", tally);
        if (Status status = tally.status("destroy", name()); !status) report(status);
        if (const auto [leaked, bytes] = cache_.retiring(); leaked > 0) {
            report(Status(Errc::leaked,
                          message_or_empty("pinned pool destroyed: ", leaked, " block(s), ", bytes,
                                           " bytes, given back with recorded work that could not be waited for "
                                           "stay allocated on backend '",
                                           name(), "'")));
        }
        if constexpr (streams) (void)events_.destroy_idle();
    }

    // ---- PinnedCore -------------------------------------------------------------------------

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
        Result<PinnedBlock> block = obtain(lock, bytes, bytes, node);
        if (!block) return block.status();
        void* pointer = block->base;
        if (!detail::is_aligned(pointer, alignment)) {
            // Pinned allocators align blocks to pages, so the exact size is tried first; a block
            // that misses the alignment is given back and one `alignment - 1` bytes larger
            // serves instead, whatever the backend aligns to.
            if (Status retired = retire(lock, *block, cacheable()); !retired) report(retired);
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
        const auto found = registry_.lookup(pointer);
        if (found == registry_.end() || (id != 0 && found->second.id != id)) {
            return Status(Errc::unknown_pointer,
                          message_or_empty("pinned pool ", what, ": ", static_cast<const void*>(pointer),
                                           " is not a live allocation of this pool (backend '", name(), "')"));
        }
        if (const bool of_container = found->second.holder == PinnedHolder::container; of_container != by_container) {
            if (of_container) {
                return Status(Errc::invalid_argument,
                              message_or_empty("pinned pool release: ", static_cast<const void*>(pointer),
                                               " belongs to a container (PinnedAllocator, PinnedMemoryResource or "
                                               "RegionAllocator), whose deallocation alone gives it back (backend '",
                                               name(), "')"));
            }
            return Status(
                Errc::unknown_pointer,
                message_or_empty("pinned pool deallocate: ", static_cast<const void*>(pointer),
                                 " is a buffer's or raw allocation of this pool, not a container's (backend '", name(),
                                 "')"));
        }
        Live live = registry_.unlist(found);
        if (live.revoked) return {};  // its block went back when the backend was torn down
        const bool keep = !live.detached && cacheable() && keeps(live.block);
        if constexpr (streams) {
            const bool retiring = cache_.has_retiring();
            Status released;
            if (live.uses.empty()) {
                released = retire(lock, live.block, keep);
            } else {
                lock.unlock();
                released = retire_recorded(Entry{live.block, std::move(live.uses), false}, keep, what);
            }
            if (retiring) collect();  // earlier blocks whose work may have completed since
            return released;
        } else {
            return retire(lock, live.block, keep);
        }
    }

    PinnedStats stats() const noexcept override {
        PinnedStats out;
        {
            std::lock_guard lock(mutex_);
            registry_.add_to(out);
            cache_.add_to(out);
            out.cache_hits = cache_hits_;
            out.cache_misses = cache_misses_;
            out.pending_skips = pending_skips_;
            out.revoked_allocations = revoked_allocations_;
            out.revoked_bytes = revoked_bytes_;
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

    void report(const Status& status) noexcept override { sink_.report(status); }
    void set_sink(ErrorSink sink) noexcept { sink_.set(sink); }
    B& backend() const noexcept { return source_.backend(); }
    const std::string& name() const noexcept { return source_.name(); }

    /// True when `pointer` is the start of a live allocation (detached ones included).
    bool owns(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return registry_.contains(pointer);
    }

    // ---- NUMA placement ---------------------------------------------------------------------
    int node_for(const B& device) noexcept { return source_.numa().node_for(device); }
    Status set_node(const B& device, int node) noexcept { return source_.numa().set_node(device, node); }

    // ---- regions ----------------------------------------------------------------------------
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

    /// A region of `bytes` (rounded up to whole pages) made for slices (see RegionOptions);
    /// its id. With threads, registration goes on after the call returns.
    Result<std::uint64_t> create_region(std::size_t bytes, const RegionOptions& options) noexcept {
        if (bytes == 0) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool create_region: 0 bytes requested on backend '", name(), "'"));
        }
        if (options.numa_node < -1 || options.numa_node >= max_numa_nodes) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool create_region: NUMA node ", options.numa_node,
                                           " is not -1 or a node below ", max_numa_nodes));
        }
        const std::optional<std::size_t> capacity = round_up(bytes, page_bytes());
        if (!capacity) {
            return Status(Errc::invalid_argument, message_or_empty("pinned pool create_region: ", bytes,
                                                                   " bytes do not round up to whole pages"));
        }
        {
            std::lock_guard lock(mutex_);
            if (Status open = closed_error(); !open) return open;
        }
        if (Status fits = source_.check_limits(*capacity, options.rdma); !fits) return fits;
        const std::uint64_t id = next_region_id();
        std::shared_ptr<Region> region;
        if constexpr (HostRegisterBackend<B>) {
            Result<PinnedBlock> mapped = source_.map(*capacity, options.numa_node, options.chunk_bytes);
            if (!mapped) return region_failure(bytes, mapped.status());
            if (!try_host_allocation([&] { region = std::make_shared<Region>(id, *mapped, bytes); }) ||
                !try_host_allocation([&] {
                    region->set_registration(std::make_unique<ChunkedRegistration<B>>(backend(), mapped->base,
                                                                                      mapped->capacity, mapped->chunk));
                })) {
                ::munmap(mapped->base, mapped->capacity);
                return region_failure(bytes, Status(Errc::out_of_memory, "host memory exhausted"));
            }
        } else {
            if (options.numa_node >= 0) {
                return region_failure(bytes, Status(Errc::not_supported,
                                                    "the backend cannot pin memory in place, "
                                                    "so it cannot be bound to a NUMA node"));
            }
            if (*capacity > pinned_malloc_limit<B>()) {
                return region_failure(
                    bytes,
                    Status(Errc::out_of_memory, message_or_empty("one pinned_malloc may ask for at most ",
                                                                 pinned_malloc_limit<B>(), " bytes on this backend")));
            }
            Result<void*> memory = backend().pinned_malloc(*capacity);
            if (!memory) return region_failure(bytes, memory.status());
            PinnedBlock block;
            block.base = *memory;
            block.capacity = *capacity;
            block.exact = true;
            if (!try_host_allocation([&] { region = std::make_shared<Region>(id, block, bytes); })) {
                (void)backend().pinned_free(*memory);
                return region_failure(bytes, Status(Errc::out_of_memory, "host memory exhausted"));
            }
        }
        source_.count_pinned(region->block());
        bool listed = false;
        {
            std::lock_guard lock(mutex_);
            listed = try_host_allocation([&] { regions_.emplace(id, region); });
        }
        if (!listed) {
            unpin_failed(*region);
            return region_failure(bytes, Status(Errc::out_of_memory, "host memory exhausted"));
        }
        ChunkedRegistration<B>* registration = region->registration();
        if (registration == nullptr) {
            registered(*region, Status());
        } else if (options.threads == 0) {
            registered(*region, registration->run());
        } else if (Status started = registration->start(
                       options.threads, [this, raw = region.get()](const Status& status) { registered(*raw, status); });
                   !started) {
            registered(*region, started);
        }
        return id;
    }

    /// Where region `id` starts; null when it is not the pool's.
    void* region_base(std::uint64_t id) const noexcept {
        const std::shared_ptr<Region> region = find_region(id);
        return region ? region->block().base : nullptr;
    }

    RegionProgress region_progress(std::uint64_t id) const noexcept override {
        const std::shared_ptr<Region> region = find_region(id);
        if (!region) return RegionProgress{0, 0, 0, 0, RegionState::failed, false};
        return region->progress();
    }

    Result<bool> region_ready(std::uint64_t id) const noexcept override {
        const std::shared_ptr<Region> region = find_region(id);
        if (!region) return unknown_region(id);
        switch (region->state()) {
            case RegionState::registering:
                return false;
            case RegionState::ready:
                return true;
            default:
                return region->failure();
        }
    }

    Status region_wait(std::uint64_t id) noexcept override {
        const std::shared_ptr<Region> region = find_region(id);
        if (!region) return unknown_region(id);
        return region->wait();
    }

    Status region_cancel(std::uint64_t id) noexcept override {
        const std::shared_ptr<Region> region = find_region(id);
        if (!region) return unknown_region(id);
        region->stop();
        if (region->state() == RegionState::ready) {
            return Status(Errc::invalid_argument, message_or_empty("pinned region ", id,
                                                                   ": registered already, nothing to cancel; drop its "
                                                                   "handle to free it"));
        }
        return {};
    }

    Result<Grant> region_allocate(std::uint64_t id, std::size_t bytes, std::size_t alignment,
                                  PinnedHolder holder) noexcept override {
        if (bytes == 0 || !std::has_single_bit(alignment)) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned region ", id, " allocate: ", bytes, " bytes aligned to ", alignment,
                                           ": the size must be > 0 and the alignment a power of two"));
        }
        const std::shared_ptr<Region> region = find_region(id);
        if (!region) return unknown_region(id);
        Lock lock(mutex_);
        if (Status open = closed_error(); !open) return open;
        if (!region->slices) {
            const RegionProgress progress = region->progress();
            if (progress.state == RegionState::registering) {
                return Status(Errc::busy, message_or_empty("pinned region ", id,
                                                           " allocate: the region is still "
                                                           "registering (",
                                                           progress.chunks_registered, " of ", progress.chunks_total,
                                                           " chunks); nothing of it is handed out before"));
            }
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned region ", id,
                                           " allocate: the region is not registered: ", region->failure().message()));
        }
        const std::optional<std::size_t> offset = region->slices->allocate(bytes, alignment);
        if (!offset) {
            return Status(Errc::out_of_memory,
                          message_or_empty("pinned region ", id, " allocate: ", bytes, " bytes aligned to ", alignment,
                                           " do not fit: ", region->slices->used(), " of ", region->slices->size(),
                                           " bytes in use, the largest free range ", region->slices->largest_free(),
                                           " bytes (backend '", name(), "')"));
        }
        PinnedBlock slice;
        slice.base = static_cast<std::byte*>(region->block().base) + *offset;
        slice.capacity = bytes;
        slice.node = region->block().node;
        slice.source = BlockSource::slice;
        slice.region = id;
        return enroll(lock, slice, slice.base, bytes, holder);
    }

    void region_drop(std::uint64_t id) noexcept override {
        std::shared_ptr<Region> region = find_region(id);
        if (!region) return;
        region->stop();
        Lock lock(mutex_);
        region->held = false;
        settle_region(lock, region);
    }

    // ---- streams ------------------------------------------------------------------------------

    /// Remembers that work enqueued on `stream`, a stream of `backend`, uses the live
    /// allocation at `pointer` (grant `id`, or whichever is there when `id` is 0), so that once
    /// given back the block is reused or freed only after that work completed. A stream already
    /// recorded (on the same backend) is not added twice. The stream is checked now: with
    /// `check` (or where the backend cannot check a stream otherwise) by an event of `backend`
    /// recorded on it now (and again at the release), else by the backend's check_stream; a
    /// stream the backend does not own is refused with its error, and nothing is recorded.
    Status record(const void* pointer, std::uint64_t id, Stream stream, B& backend,
                  bool check) noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            if (torn_down_) {
                return Status(Errc::invalid_argument,
                              message_or_empty("pinned pool record: backend '", name(),
                                               "' was torn down: no work may use the pool's memory any more"));
            }
            Live* live = registry_.find(pointer, id);
            if (live == nullptr) return not_live(pointer);
            if (PinnedRegistry<B>::find_use(*live, backend, stream) != nullptr) return {};
        }
        if constexpr (StreamCheckBackend<B>) {
            if (!check) {
                if (Status owned = backend.check_stream(stream); !owned) return refused(backend, pointer, owned);
            }
        } else {
            check = true;
        }
        Use use{&backend, stream, Event{}, false, false};
        if (check) {
            Result<Event> event = events_.take(backend);
            if (!event) return refused(backend, pointer, event.status());
            if (Status recorded = backend.record_event(*event, stream); !recorded) {
                events_.drop(backend, *event);
                return refused(backend, pointer, recorded);
            }
            use.event = *event;
            use.holds_event = true;
        }
        if constexpr (TeardownBackend<B>) {
            if (&backend != &this->backend()) hook(backend);
        }
        Status status;
        {
            std::lock_guard lock(mutex_);
            Live* live = registry_.find(pointer, id);
            if (live == nullptr) {
                status = not_live(pointer);  // given back meanwhile, by another thread
            } else if (PinnedRegistry<B>::find_use(*live, backend, stream) != nullptr) {
                // recorded meanwhile, by another thread
            } else if (try_host_allocation([&] { live->uses.push_back(use); })) {
                return {};
            } else {
                status = Status(Errc::out_of_memory,
                                message_or_empty("pinned pool record: host memory exhausted remembering a stream of "
                                                 "the ",
                                                 live->requested, "-byte allocation at ", pointer, " (backend '",
                                                 backend.name(), "'); nothing was recorded"));
            }
        }
        events_.recycle(use);
        return status;
    }

    /// record() of a PinnedBuffer: its memory (`data`, `bytes`, grant `id`), held from `owner`.
    Status record_buffer(const PinnedCore* owner, const void* data, std::size_t bytes, std::uint64_t id, Stream stream,
                         B& backend, bool check) noexcept requires streams {
        if (data == nullptr) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the buffer is empty (0 bytes): it holds no memory "
                                           "(backend '",
                                           name(), "')"));
        }
        if (owner != this) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the ", bytes, "-byte buffer at ", data,
                                           " belongs to another pool, not this one (backend '", name(), "')"));
        }
        return record(data, id, stream, backend, check);
    }

    /// Lets go of `backend` (PinnedForget): on success the pool makes no further call to it.
    Status forget(B& backend) noexcept requires streams {
        Status forgotten = forgetter().run(backend, false);
        if (forgotten && &backend != &this->backend()) unhook(backend);
        return forgotten;
    }

    // ---- cache and lifetime -----------------------------------------------------------------

    /// Frees every cached and retiring block, waiting first for the recorded work of pending
    /// ones (the host blocks); nothing live is touched. A block whose wait fails stays
    /// allocated (retiring, never reused) and the failure is returned.
    Status trim() noexcept {
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            cache_.take_all(batch, true);
        }
        Tally tally;
        free_all(batch, true, "trim", tally);
        return tally.status("trim", name());
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
    // ---- blocks in and out ------------------------------------------------------------------

    /// The bytes of the block that serves `bytes`: whole pages at the exact threshold and above,
    /// else the cache policy's size class.
    std::size_t block_size(std::size_t bytes) const noexcept {
        if (const std::optional<std::size_t> exact = source_.exact_size(bytes)) return *exact;
        if constexpr (caching) return Cache::size_class(bytes);
        return bytes;
    }

    /// Precondition: `lock` holds mutex_. A block for `bytes`: from the cache, else from the
    /// source, called without the lock (it is slow on real devices). A cached block whose
    /// recorded work is pending is queried once, without the lock, and passed over unless the
    /// work completed: this never blocks. On success the lock is held again; a pool destroyed
    /// meanwhile gets nothing, and the block goes straight back to the backend.
    Result<PinnedBlock> obtain(Lock& lock, std::size_t bytes, std::size_t asked, int node) noexcept {
        if (Status open = closed_error(); !open) return open;
        const std::optional<std::size_t> exact = source_.exact_size(bytes);
        const std::size_t capacity = block_size(bytes);
        Status query_failure;
        if constexpr (caching) {
            if (const std::optional<PinnedBlock> cached = cache_.take_idle(capacity, node)) {
                ++cache_hits_;
                return *cached;
            }
            if constexpr (streams) {
                if (std::optional<typename CacheMap::node_type> pending = cache_.take_pending(capacity, node)) {
                    Entry& entry = pending->mapped();
                    lock.unlock();
                    const Result<bool> done = events_.poll(entry);
                    if (done && *done) events_.recycle(entry);
                    lock.lock();
                    if (done && *done) {
                        ++cache_hits_;
                        if (closed_) {
                            lock.unlock();
                            if (Status freed = free_block(entry.block); !freed) report(freed);
                            return closed_error();
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
                    cache_.put_back(std::move(*pending), cacheable());
                }
            }
        }
        lock.unlock();
        if (!query_failure.ok()) report(query_failure);
        Result<PinnedBlock> block = source_.obtain(capacity, asked, node, exact.has_value());
        if (!block && block.status().code() == Errc::out_of_memory && trim_some()) {
            block = source_.obtain(capacity, asked, node, exact.has_value());
        }
        if (!block) return block.status();
        lock.lock();
        ++cache_misses_;
        if (Status open = closed_error(); !open) {
            lock.unlock();
            if (Status freed = free_block(*block); !freed) report(freed);
            return open;
        }
        return block;
    }

    /// Precondition: `lock` holds mutex_. Records the grant of `block` as `pointer`; when the
    /// host has no memory for the record, the block goes back.
    Result<Grant> enroll(Lock& lock, const PinnedBlock& block, void* pointer, std::size_t bytes,
                         PinnedHolder holder) noexcept {
        if (const std::optional<Grant> grant = registry_.enroll(block, pointer, bytes, holder)) return *grant;
        lock.unlock();
        if (Status freed = free_block(block); !freed) report(freed);
        return Status(Errc::out_of_memory,
                      message_or_empty("pinned pool allocate: host memory exhausted recording a ", block.capacity,
                                       "-byte pinned block (", bytes, " asked) from backend '", name(),
                                       "'; the block went back"));
    }

    /// Precondition: mutex_ held. Whether released blocks may wait in the cache now.
    bool cacheable() const noexcept { return caching && !closed_; }
    /// Whether `block` may be cached at all: blocks of the backend only, not slices.
    static bool keeps(const PinnedBlock& block) noexcept {
        return block.source == BlockSource::malloc || block.source == BlockSource::mapped;
    }

    /// Precondition: `lock` holds mutex_; returns with it released. A block no longer held and
    /// with no pending work: into the cache when `keep` and the bound has room (and the host
    /// has memory for the entry), else back to the backend.
    Status retire(Lock& lock, const PinnedBlock& block, bool keep) noexcept {
        if (keep && keeps(block)) {
            Entry idle{block, {}, false};
            if (cache_.keep(idle, true)) {
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
    /// for the work and frees the block.
    Status retire_recorded(Entry entry, bool keep, const char* what) noexcept requires streams {
        events_.mark(entry, what, name());
        Lock lock(mutex_);
        const bool cache = keep && !closed_ && keeps(entry.block);
        if (!entry.pending()) return retire(lock, entry.block, cache);
        const PinnedBlock block = entry.block;
        if (cache_.keep(entry, cache)) return {};
        lock.unlock();
        if (Status waited = events_.wait_for(entry); !waited) {
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
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            cache_.take_queryable_retiring(batch);
        }
        Tally tally;
        while (!batch.empty()) {
            typename CacheMap::node_type node = batch.extract(batch.begin());
            Entry& entry = node.mapped();
            const Result<bool> done = events_.poll(entry);
            if (done && *done) {
                events_.recycle(entry);
                tally.add(free_block(entry.block));
                continue;
            }
            if (!done) {
                entry.unknown = true;
                report(Status(done.status().code(),
                              message_or_empty("pinned pool release: querying the work recorded on a retiring ",
                                               entry.block.capacity, "-byte block failed on backend '", name(),
                                               "': ", done.status().message(),
                                               "; it is freed after trim(), finalize() or the pool's destruction "
                                               "waits for it")));
            }
            std::lock_guard lock(mutex_);
            cache_.retire(std::move(node));
        }
        if (Status freed = tally.status("release", name()); !freed) report(freed);
    }

    /// Frees `batch` (no lock held). A pending block is first waited for when `wait` (the host
    /// blocks), else it goes back; one whose wait fails stays allocated, retiring and `unknown`.
    /// Adds every free and wait to `tally`.
    void free_all(CacheMap& batch, bool wait, const char* what, Tally& tally) noexcept {
        while (!batch.empty()) {
            typename CacheMap::node_type node = batch.extract(batch.begin());
            Entry& entry = node.mapped();
            if constexpr (streams) {
                if (entry.pending()) {
                    if (!wait) {
                        std::lock_guard lock(mutex_);
                        cache_.put_back(std::move(node), cacheable());
                        continue;
                    }
                    if (const Status waited = events_.wait_for(entry); !waited) {
                        tally.add(
                            Status(waited.code(),
                                   message_or_empty("pinned pool ", what, ": waiting for the work recorded on a ",
                                                    entry.block.capacity, "-byte block failed on backend '", name(),
                                                    "': ", waited.message(), "; the block stays allocated")));
                        entry.unknown = true;
                        std::lock_guard lock(mutex_);
                        cache_.retire(std::move(node));
                        continue;
                    }
                    tally.add({});
                }
            }
            tally.add(free_block(entry.block));
        }
    }

    /// Frees the cached blocks with no pending work after an out-of-memory (pending ones stay:
    /// allocation never waits); true when anything was freed.
    bool trim_some() noexcept {
        if constexpr (caching) {
            CacheMap batch;
            {
                std::lock_guard lock(mutex_);
                if (!cache_.has_cached()) return false;
                cache_.take_all(batch, false);
            }
            Tally tally;
            free_all(batch, false, "trim", tally);
            if (Status trimmed = tally.status("trim", name()); !trimmed) report(trimmed);
            return tally.total > 0;
        }
        return false;
    }

    /// A block back where it came from (no lock held): a slice to its region, else the source.
    Status free_block(const PinnedBlock& block) noexcept {
        if (block.source != BlockSource::slice) return source_.free(block);
        Lock lock(mutex_);
        const auto found = regions_.find(block.region);
        if (found == regions_.end()) return {};
        std::shared_ptr<Region> region = found->second;
        if (region->slices) {
            const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(block.base) -
                                                         static_cast<std::byte*>(region->block().base));
            if (!region->slices->deallocate(offset, block.capacity)) {
                report(Status(Errc::out_of_memory,
                              message_or_empty("pinned region ", block.region, ": host memory exhausted giving back a ",
                                               block.capacity, "-byte slice; those bytes are not handed out again")));
            }
        }
        settle_region(lock, region);
        return {};
    }

    // ---- finalize and close -----------------------------------------------------------------

    /// finalize() (`closing` false) and close() (true).
    Status sweep(bool closing) noexcept {
        std::uint64_t held = 0, held_bytes = 0;
        {
            std::lock_guard lock(mutex_);
            closed_ = closed_ || closing;
            open_for_cache_ = cacheable();
            std::tie(held, held_bytes) = registry_.detach_all(closing);
        }
        Tally tally;
        std::uint64_t raw = 0, raw_bytes = 0;
        if (closing) {
            // Recorded ones become retiring (the pool is closed) and are waited for below.
            for (;;) {
                std::optional<Live> live;
                {
                    std::lock_guard lock(mutex_);
                    live = registry_.take_raw();
                }
                if (!live) break;
                ++raw;
                raw_bytes += live->requested;
                if (live->revoked) continue;
                if constexpr (streams) {
                    if (!live->uses.empty()) {
                        tally.add(retire_recorded(Entry{live->block, std::move(live->uses), false}, false, "destroy"));
                        continue;
                    }
                }
                tally.add(free_block(live->block));
            }
        }
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            cache_.take_all(batch, true);
        }
        free_all(batch, true, closing ? "destroy" : "finalize", tally);
        if constexpr (streams) {
            if (closing) (void)events_.destroy_idle();
        }
        if (!closing && held > 0) {
            report(
                Status(Errc::leaked, message_or_empty("pinned pool finalize: ", held, " allocation(s) still live, ",
                                                      held_bytes, " bytes, on backend '", name(),
                                                      "'; they stay valid and go back to the backend when released")));
        } else if (closing && held + raw > 0) {
            report(Status(Errc::leaked,
                          message_or_empty("pinned pool destroyed: ", held + raw, " allocation(s) still live, ",
                                           held_bytes + raw_bytes, " bytes, on backend '", name(), "': ", raw, " raw (",
                                           raw_bytes, " bytes) freed, since nothing can release them now; ", held,
                                           " held by buffers or containers (", held_bytes,
                                           " bytes) stay valid and go back to the backend when released")));
        }
        return tally.status(closing ? "destroy" : "finalize", name());
    }

    /// Precondition: mutex_ held. Ok while the pool takes allocations.
    Status closed_error() const noexcept {
        if (torn_down_) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool allocate: backend '", name(),
                                           "' was torn down (its device or context is gone): the pool hands out "
                                           "nothing more"));
        }
        if (closed_) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool allocate: the pool was destroyed (backend '", name(), "')"));
        }
        return {};
    }

    // ---- regions ----------------------------------------------------------------------------

    std::shared_ptr<Region> find_region(std::uint64_t id) const noexcept {
        std::lock_guard lock(mutex_);
        const auto found = regions_.find(id);
        return found == regions_.end() ? nullptr : found->second;
    }
    static Status unknown_region(std::uint64_t id) noexcept {
        return Status(Errc::unknown_pointer,
                      message_or_empty("pinned region ", id, " is not a region of this pool (its handle was dropped)"));
    }
    Status region_failure(std::size_t bytes, const Status& cause) const noexcept {
        return Status(cause.code(), message_or_empty("pinned pool create_region: ", bytes, " bytes on backend '",
                                                     name(), "' failed: ", cause.message()));
    }

    /// The end of a region's registration (any thread): listed (the hooks' `added`) and ready
    /// for slices, or rolled back and unmapped.
    void registered(Region& region, Status outcome) noexcept {
        PinnedBlock& block = region.block();
        if (outcome) {
            if (ChunkedRegistration<B>* registration = region.registration()) {
                source_.count_chunks(registration->chunks());
            }
            PinnedRegion listed{region.id(), block.base, block.capacity, block.node, RegionKind::pinned_host, -1};
            outcome = source_.regions().add(listed, "pinned pool create_region");
            if (outcome) {
                std::lock_guard lock(mutex_);
                if (try_host_allocation(
                        [&] { region.slices.emplace(block.capacity, reinterpret_cast<std::uintptr_t>(block.base)); })) {
                    region.settle(RegionState::ready, {});
                    return;
                }
                outcome = Status(Errc::out_of_memory, "host memory exhausted making the region's slice table");
                source_.regions().remove(block.base);
            }
            if (ChunkedRegistration<B>* registration = region.registration()) {
                if (Status undone = registration->unregister_all(); !undone) report(undone);
            }
        }
        const bool cancelled = region.registration() != nullptr && region.registration()->cancelled();
        unpin_failed(region);
        region.settle(cancelled ? RegionState::cancelled : RegionState::failed,
                      region_failure(region.asked(), outcome));
    }

    /// The memory of a region that is not registered (rolled back): unmapped, or freed.
    void unpin_failed(Region& region) noexcept {
        const PinnedBlock& block = region.block();
        if (block.source == BlockSource::mapped) {
            ::munmap(block.base, block.capacity);
        } else if (Status freed = backend().pinned_free(block.base); !freed) {
            report(freed);
        }
        source_.count_unpinned(block);
    }

    /// Precondition: `lock` holds mutex_ (released on return). A region whose handle is gone
    /// and whose last slice came back (or that never registered) leaves the pool: the hooks'
    /// `removing` runs, then it is unregistered and unmapped (or freed).
    void settle_region(Lock& lock, const std::shared_ptr<Region>& region) noexcept {
        const RegionState state = region->state();
        const bool unused = !region->slices || region->slices->live() == 0;
        if (region->held || !unused || state == RegionState::registering) {
            lock.unlock();
            return;
        }
        regions_.erase(region->id());
        lock.unlock();
        if (state != RegionState::ready || region->torn_down) {
            if (region->torn_down && region->block().source == BlockSource::unpinned) {
                ::munmap(region->block().base, region->block().capacity);
            }
            return;
        }
        source_.regions().remove(region->block().base);
        Status status;
        if (ChunkedRegistration<B>* registration = region->registration()) {
            status = registration->unregister_all();
            if (status) ::munmap(region->block().base, region->block().capacity);
        } else {
            status = backend().pinned_free(region->block().base);
        }
        if (status) {
            source_.count_unpinned(region->block());
        } else {
            report(Status(status.code(), message_or_empty("pinned region ", region->id(), ": freeing its ",
                                                          region->block().capacity, " bytes failed on backend '",
                                                          name(), "': ", status.message(), "; they stay allocated")));
        }
    }

    // ---- teardown ---------------------------------------------------------------------------

    struct Hooked {
        PinnedPoolCore* core;
        B* backend;
        std::uint64_t id;
    };

    /// Hooks the core to `backend`'s teardown (once per backend).
    void hook(B& backend) noexcept requires TeardownBackend<B> {
        Hooked* entry = nullptr;
        {
            std::lock_guard lock(hooks_mutex_);
            for (const Hooked& hooked : hooked_) {
                if (hooked.backend == &backend) return;
            }
            if (!try_host_allocation([&] { entry = &hooked_.emplace_back(Hooked{this, &backend, 0}); })) {
                report(
                    Status(Errc::out_of_memory,
                           message_or_empty("pinned pool: host memory exhausted hooking to the teardown of backend '",
                                            backend.name(), "'")));
                return;
            }
        }
        Result<std::uint64_t> id = backend.add_teardown_hook(TeardownHook{&PinnedPoolCore::torn_down, entry});
        std::lock_guard lock(hooks_mutex_);
        if (id) {
            entry->id = *id;
            return;
        }
        report(Status(id.status().code(), message_or_empty("pinned pool: hooking to the teardown of backend '",
                                                           backend.name(), "' failed: ", id.status().message())));
        hooked_.remove_if([&](const Hooked& hooked) { return &hooked == entry; });
    }

    /// The hook is removed from the backend first (which waits for it if it is running), and
    /// its entry erased after: a running hook never finds its entry gone.
    void unhook(B& backend) noexcept {
        if constexpr (TeardownBackend<B>) {
            const Hooked* entry = nullptr;
            std::uint64_t id = 0;
            {
                std::lock_guard lock(hooks_mutex_);
                for (const Hooked& hooked : hooked_) {
                    if (hooked.backend != &backend) continue;
                    entry = &hooked;
                    id = hooked.id;
                    break;
                }
            }
            if (entry == nullptr) return;
            if (id != 0) backend.remove_teardown_hook(id);
            std::lock_guard lock(hooks_mutex_);
            hooked_.remove_if([&](const Hooked& hooked) { return &hooked == entry; });
        }
    }

    void unhook_all() noexcept {
        if constexpr (TeardownBackend<B>) {
            for (;;) {
                B* backend = nullptr;
                {
                    std::lock_guard lock(hooks_mutex_);
                    if (hooked_.empty()) return;
                    backend = hooked_.front().backend;
                }
                unhook(*backend);
            }
        }
    }

    /// A backend's teardown hook: the pool's own backend (teardown()), or a backend of recorded
    /// streams (forgotten, forced). Its entry stays until unhook() or the core's destruction
    /// (marked run, so nothing removes it from the backend again).
    static void torn_down(void* user) noexcept {
        auto* hooked = static_cast<Hooked*>(user);
        PinnedPoolCore& core = *hooked->core;
        B& backend = *hooked->backend;
        {
            std::lock_guard lock(core.hooks_mutex_);
            hooked->id = 0;
        }
        if (&backend == &core.backend()) {
            core.teardown();
        } else if constexpr (streams) {
            if (Status forgotten = core.forgetter().run(backend, true); !forgotten) core.report(forgotten);
        }
    }

    /// The pool's backend is being torn down: before its device or context goes, every block
    /// goes back — pending work waited for where the device still answers (dropped where it
    /// cannot be: the reset ends it), the cache, the retiring blocks and the raw allocations
    /// freed, and what buffers, containers and region handles still hold either unpinned in place
    /// (memory the pool mapped: it stays valid, pageable, until given back) or freed (pinned_malloc
    /// memory: revoked, its holders must not touch it) — and the events are destroyed, on every
    /// backend. The pool then hands out nothing more.
    void teardown() noexcept {
        {
            std::lock_guard lock(mutex_);
            torn_down_ = true;
            closed_ = true;
            open_for_cache_ = false;
        }
        std::vector<std::shared_ptr<Region>> regions;
        {
            std::lock_guard lock(mutex_);
            (void)try_host_allocation([&] {
                for (const auto& [id, region] : regions_) regions.push_back(region);
            });
        }
        for (const std::shared_ptr<Region>& region : regions) region->stop();
        if constexpr (streams) {
            for (B* named : recorded_backends()) {
                if (Status forgotten = forgetter().run(*named, true); !forgotten) report(forgotten);
            }
        }
        Tally tally;
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            cache_.take_all(batch, true);
        }
        while (!batch.empty()) {
            typename CacheMap::node_type node = batch.extract(batch.begin());
            events_.recycle(node.mapped());
            tally.add(free_block(node.mapped().block));
        }
        std::uint64_t revoked = 0, revoked_bytes = 0, unpinned = 0;
        std::vector<std::pair<void*, std::uint64_t>> held;
        {
            std::lock_guard lock(mutex_);
            (void)try_host_allocation([&] {
                registry_.for_each([&](void* pointer, Live& live) {
                    if (live.block.source != BlockSource::slice) held.emplace_back(pointer, live.id);
                });
            });
        }
        for (const auto& [pointer, id] : held) {
            Lock lock(mutex_);
            Live* live = registry_.find(pointer, id);
            if (live == nullptr || live->revoked) continue;
            PinnedBlock block = live->block;
            if (live->holder == PinnedHolder::raw) {
                Live taken = registry_.unlist(registry_.lookup(pointer));
                lock.unlock();
                tally.add(free_block(taken.block));
                continue;
            }
            const std::size_t requested = live->requested;
            lock.unlock();
            if (block.source == BlockSource::mapped) {
                const Status undone = source_.unpin(block);
                tally.add(undone);
                if (!undone) continue;
                ++unpinned;
            } else {
                tally.add(free_block(block));
                ++revoked;
                revoked_bytes += requested;
            }
            lock.lock();
            if (Live* still = registry_.find(pointer, id)) {
                still->block = block;
                still->revoked = block.source != BlockSource::unpinned;
                if (still->revoked) {
                    ++revoked_allocations_;
                    revoked_bytes_ += still->requested;
                }
            }
        }
        for (const std::shared_ptr<Region>& region : regions) {
            if (region->state() != RegionState::ready) continue;
            PinnedBlock block = region->block();
            Status status;
            if (block.source == BlockSource::mapped) {
                source_.regions().remove(block.base);
                status = region->registration() != nullptr ? region->registration()->unregister_all() : Status();
                if (status) source_.count_unpinned(block);
                block.source = BlockSource::unpinned;
            } else {
                source_.regions().remove(block.base);
                status = backend().pinned_free(block.base);
                if (status) source_.count_unpinned(block);
            }
            tally.add(status);
            Lock lock(mutex_);
            if (block.source == BlockSource::malloc) {
                registry_.for_each([&](void*, Live& live) {
                    if (live.block.source != BlockSource::slice || live.block.region != region->id() || live.revoked) {
                        return;
                    }
                    live.revoked = true;
                    ++revoked_allocations_;
                    revoked_bytes_ += live.requested;
                    ++revoked;
                    revoked_bytes += live.requested;
                });
            }
            region->torn_down = true;
            region->block().source = block.source;
            settle_region(lock, region);
        }
        if constexpr (streams) (void)events_.destroy_idle();
        if (Status status = tally.status("teardown", name()); !status) report(status);
        if (revoked + unpinned > 0) {
            report(Status(Errc::leaked,
                          message_or_empty("pinned pool: backend '", name(), "' was torn down while ",
                                           revoked + unpinned, " allocation(s) were still held: ", unpinned,
                                           " unpinned in place (valid, pageable memory until given back), ", revoked,
                                           " (", revoked_bytes,
                                           " bytes) freed before the device went: their holders must not use them")));
        }
    }

    /// Every backend the pool holds events of or whose streams live or pending blocks recorded.
    std::vector<B*> recorded_backends() noexcept {
        std::vector<B*> out = events_.backends();
        const auto add = [&](B* backend) {
            if (std::find(out.begin(), out.end(), backend) == out.end()) out.push_back(backend);
        };
        std::lock_guard lock(mutex_);
        (void)try_host_allocation([&] {
            registry_.for_each([&](void*, Live& live) {
                for (const Use& use : live.uses) add(use.backend);
            });
            cache_.for_each([&](const Entry& entry) {
                for (const Use& use : entry.uses) add(use.backend);
            });
        });
        return out;
    }

    PinnedForget<B> forgetter() noexcept {
        return PinnedForget<B>(mutex_, registry_, cache_, events_, sink_, open_for_cache_);
    }

    // ---- messages ---------------------------------------------------------------------------

    Status not_live(const void* pointer) const noexcept {
        return Status(Errc::unknown_pointer,
                      message_or_empty("pinned pool record: ", pointer,
                                       " is not a live allocation of this pool (backend '", name(), "')"));
    }
    static Status refused(const B& backend, const void* pointer, const Status& cause) noexcept {
        return Status(cause.code(), message_or_empty("pinned pool record: the stream was refused by backend '",
                                                     backend.name(), "' (", static_cast<const void*>(&backend),
                                                     "), the backend named for the stream: ", cause.message(),
                                                     "; nothing was recorded for ", pointer));
    }

    static std::size_t max_cached(const Cache& cache) noexcept {
        if constexpr (caching) {
            return cache.max_cached_bytes;
        } else {
            return 0;
        }
    }

    PinnedSink sink_;
    PinnedBlockSource<B> source_;
    PinnedEvents<B> events_;
    mutable std::mutex mutex_;  ///< registry_, cache_, regions_, the flags and counters below
    PinnedRegistry<B> registry_;
    PinnedBlockCache<B> cache_;
    std::map<std::uint64_t, std::shared_ptr<Region>> regions_;  ///< made with create_region
    bool closed_ = false;
    bool torn_down_ = false;
    bool open_for_cache_ = caching;  ///< cacheable(), for PinnedForget
    std::uint64_t cache_hits_ = 0, cache_misses_ = 0, pending_skips_ = 0;
    std::uint64_t revoked_allocations_ = 0, revoked_bytes_ = 0;
    std::mutex hooks_mutex_;    ///< hooked_
    std::list<Hooked> hooked_;  ///< the teardowns the core is hooked to (stable addresses)
};

}  // namespace devstage::detail
