// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// PinnedHostPool: page-locked host memory from a backend, thread-safe and cached, handed out
/// as PinnedBuffers or raw pointers; big requests pinned at their exact size in chunks, within
/// the limits that apply; regions for slices; every pinned byte listed and described as regions
/// for transfer engines; everything given back before the backend's device or context goes.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/buffer.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/detail/core.hpp"
#include "devstage/pinned/detail/stream_types.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/pinned/region_handle.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/pinned/stats.hpp"
#include "devstage/region.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// A pool of page-locked host memory over one backend instance (and so that backend's
/// device, never the calling thread's current one), whose memory streams of other backend
/// instances of type B may use too (record() with the stream's backend). Thread-safe: every
/// call may come from any thread. The backend must accept concurrent calls. A backend that
/// models TeardownBackend (every one devstage ships) tells the pool before its device or
/// context goes, and the pool gives everything back then (see docs/pinned.md, "Teardown
/// order"); any other backend must outlive the pool and every buffer, container and region
/// handle holding memory from it; so must every backend named in a record(), unless forget()
/// let go of it.
/// `PinnedHostPool<SimBackend> pool(sim); auto buf = pool.allocate(1 << 20);`
template <PinnedHostBackend B, class Cache = CachingPinned>
class PinnedHostPool {
    using Core = detail::PinnedPoolCore<B, Cache>;

public:
    explicit PinnedHostPool(B& backend, Cache cache = {})
        : core_(std::make_shared<Core>(backend, std::move(cache), PinnedPoolOptions{})) {}
    /// With options for big requests (ExactPinning), the limits checked first (PinLimits) and
    /// NUMA placement (taken only when B models HostRegisterBackend).
    /// `PinnedHostPool<SimBackend> pool(sim, {}, PinnedPoolOptions{.exact = {.threshold = 1 << 20}});`
    PinnedHostPool(B& backend, Cache cache, PinnedPoolOptions options)
        : core_(std::make_shared<Core>(backend, std::move(cache), std::move(options))) {}
    /// With NUMA placement (`numa.enabled`): one arena per NUMA node, allocate_near() serving
    /// each device from its nearest node (pinned/numa.hpp). `backend` pins the nodes' blocks in
    /// place (host_register); allocate() still takes its pinned_malloc memory.
    /// `PinnedHostPool<CudaBackend> pool(gpu0, {}, NumaPlacement{.enabled = true});`
    PinnedHostPool(B& backend, Cache cache, NumaPlacement numa) requires HostRegisterBackend<B>
        : core_(std::make_shared<Core>(backend, std::move(cache), PinnedPoolOptions{.numa = std::move(numa)})) {}
    PinnedHostPool(const PinnedHostPool&) = delete;
    PinnedHostPool& operator=(const PinnedHostPool&) = delete;
    /// Refuses every later allocation (through allocator copies, or one in flight), frees the
    /// cache and the raw allocations never released (nothing could release them later), and
    /// reports what buffers and containers still hold: that memory stays valid and goes back
    /// to the backend when they give it back. Blocks with recorded work are freed only after
    /// it completed: the destructor waits for it (the host blocks). Destroys the pool's events.
    ~PinnedHostPool() {
        if (Status status = core_->close(); !status) core_->report(status);
    }

    /// Pinned memory of at least `bytes` (> 0) bytes, given back when the buffer dies. Below
    /// the exact threshold (PinnedPoolOptions::exact) a block of the cache policy's size class;
    /// at and above it, exactly `bytes` rounded up to whole pages, pinned in place in chunks
    /// after the limits were checked (a request past them is out_of_memory naming the limit,
    /// and nothing is pinned).
    Result<PinnedBuffer> allocate(std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant = core_->allocate(bytes, 1, detail::PinnedHolder::buffer);
        if (!grant) return grant.status();
        return PinnedBuffer(core_, grant->pointer, bytes, grant->id);
    }

    /// Pinned memory for callers that hand raw pointers around; give it back with release().
    Result<void*> allocate_raw(std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant = core_->allocate(bytes, 1, detail::PinnedHolder::raw);
        if (!grant) return grant.status();
        return grant->pointer;
    }

    /// allocate() from the arena of the NUMA node nearest `device` (a backend of another
    /// device, or the pool's own): the pool asks nearest_numa_node() once per device (or takes
    /// what set_numa_node() said). The block is mapped, bound to that node with mbind, touched,
    /// then pinned with the pool's backend's host_register; cached, it serves only allocations
    /// for that node. Without NUMA placement, or for a device with no known node, or one whose
    /// node the kernel refused (reported once, stats().numa_fallbacks), it is allocate().
    Result<PinnedBuffer> allocate_near(const B& device, std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant =
            core_->allocate_on(bytes, 1, detail::PinnedHolder::buffer, core_->node_for(device));
        if (!grant) return grant.status();
        return PinnedBuffer(core_, grant->pointer, bytes, grant->id);
    }
    /// allocate_raw() from the arena nearest `device` (as allocate_near()).
    Result<void*> allocate_raw_near(const B& device, std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant =
            core_->allocate_on(bytes, 1, detail::PinnedHolder::raw, core_->node_for(device));
        if (!grant) return grant.status();
        return grant->pointer;
    }
    /// The NUMA node allocate_near(device, …) uses; -1: the backend's pinned_malloc memory.
    int numa_node(const B& device) noexcept { return core_->node_for(device); }
    /// Serves `device` from `node` from now on (-1: the backend's pinned_malloc memory): the
    /// explicit configuration, for a backend whose runtime does not say (AscendBackend). A pool
    /// without NUMA placement, or a node below -1 or past max_numa_nodes, is
    /// Errc::invalid_argument and changes nothing.
    Status set_numa_node(const B& device, int node) noexcept { return core_->set_node(device, node); }

    /// Gives back memory from allocate_raw() (or a buffer's data(): the buffer then gives back
    /// nothing). A pointer the pool does not own, or one already released, is
    /// Errc::unknown_pointer; a container's memory is Errc::invalid_argument (its allocator
    /// gives it back).
    Status release(void* pointer) noexcept { return core_->release(pointer, 0, detail::PinnedHolder::raw); }

    /// True when `pointer` is the start of a live allocation of this pool.
    bool owns(const void* pointer) const noexcept { return core_->owns(pointer); }

    /// `B::Stream` when B models AsyncBackend (a placeholder that no call accepts otherwise).
    using Stream = typename detail::PinnedStreamTypes<B>::Stream;

    /// Remembers that work enqueued on `stream`, a stream of the pool's backend, reads or
    /// writes the buffer's memory. Nothing is enqueued now: when the memory is given back, an
    /// event is recorded on every stream recorded for it, and the block is reused (or freed)
    /// only once those events completed. allocate() never waits for them: it takes another
    /// block. Call it after enqueuing the work, before giving the memory back; recording a
    /// stream twice records it once. `pool.record(*buffer, stream);` An empty buffer, or one of
    /// another pool, is Errc::invalid_argument; a buffer whose memory was given back through
    /// release() is Errc::unknown_pointer.
    Status record(const PinnedBuffer& buffer, Stream stream) noexcept requires AsyncBackend<B> {
        return core_->record_buffer(buffer.core_.get(), buffer.data_, buffer.size_, buffer.id_, stream, backend(),
                                    false);
    }

    /// record() for a stream of `stream_backend`, another backend instance of type B (another
    /// device's, say; the pool's own is fine too): the pool's events for that stream are made,
    /// recorded, queried and destroyed on `stream_backend`. One event is recorded on the stream
    /// now, which checks that the stream is `stream_backend`'s — a stream it does not know is
    /// refused with its error (Errc::invalid_argument from the backends devstage ships), naming
    /// the backend, and nothing is recorded — and recorded again at the release.
    /// `stream_backend` must stay alive until forget(stream_backend) returned or the pool's core
    /// is gone (the pool and every buffer and container of its memory).
    /// `pool.record(*buffer, stream3, gpu3);`
    Status record(const PinnedBuffer& buffer, Stream stream, B& stream_backend) noexcept requires AsyncBackend<B> {
        return core_->record_buffer(buffer.core_.get(), buffer.data_, buffer.size_, buffer.id_, stream, stream_backend,
                                    true);
    }

    /// record() for the live allocation starting at `pointer`: a raw allocation, a buffer's
    /// data(), or a container's memory (`vector.data()`: its block waits when the container
    /// frees it, on growth too). Anything else is Errc::unknown_pointer.
    Status record(const void* pointer, Stream stream) noexcept requires AsyncBackend<B> {
        return core_->record(pointer, 0, stream, backend(), false);
    }
    /// record(pointer, stream) for a stream of `stream_backend` (as record(buffer, stream,
    /// stream_backend)).
    Status record(const void* pointer, Stream stream, B& stream_backend) noexcept requires AsyncBackend<B> {
        return core_->record(pointer, 0, stream, stream_backend, true);
    }

    /// Lets go of `stream_backend` before it is destroyed: waits (the host blocks) for the work
    /// recorded on its streams — an event recorded now on each stream a live allocation
    /// recorded, and the events of pending blocks — and destroys the pool's events of it. On
    /// success the pool makes no further call to it (until a record() names it again). A wait
    /// that fails (synchronize() is tried next) keeps that use and is returned; nothing is
    /// lost, and the backend must then stay alive. No other call may use `stream_backend` with
    /// this pool meanwhile. `pool.forget(gpu3);`
    Status forget(B& stream_backend) noexcept requires AsyncBackend<B> { return core_->forget(stream_backend); }

    // ---- regions ----------------------------------------------------------------------------

    /// A region of `bytes` (rounded up to whole pages) pinned at its exact size in chunks, for
    /// slices (PinnedRegionHandle::allocate, RegionAllocator): the limits are checked first; with
    /// `options.threads` the chunks are registered in background threads after the call returns
    /// (progress(), ready(), wait(), cancel()), else before it returns. A chunk that fails rolls
    /// the whole region back (ready() and wait() then say why). A backend without host_register
    /// pins it with one pinned_malloc, in the calling thread.
    /// `auto region = pool.create_region(bytes, {.threads = 2}); if (region) region->wait();`
    Result<PinnedRegionHandle> create_region(std::size_t bytes, RegionOptions options = {}) noexcept {
        Result<std::uint64_t> id = core_->create_region(bytes, options);
        if (!id) return id.status();
        return PinnedRegionHandle(core_, *id, core_->region_base(*id), bytes);
    }

    /// Every region of the pool: each block it holds from the backend (live, cached or pending;
    /// size-class blocks and exact ones) and each region made with create_region once
    /// registered — base, bytes, NUMA node, kind pinned_host. Every pinned byte the pool hands
    /// out lies in one of them.
    std::vector<PinnedRegion> regions() const { return core_->regions(); }

    /// The hooks an engine registers regions with: `added` runs at once for every region listed
    /// now, then for each new region before any slice of it is handed out; `removing` before a
    /// region is unregistered and freed. Replacing hooks runs the old `removing` for every
    /// listed region first. An `added` that fails here undoes what the new hooks did (their
    /// `removing` for the regions they accepted), keeps the old hooks and returns the failure;
    /// one that fails for a new region fails what created it (an allocation, create_region),
    /// which frees the memory and returns the hook's error. Hooks run one at a time, in the
    /// thread that creates or frees the region (a registration thread for create_region with
    /// threads), and must not allocate from or give back to this pool.
    Status set_region_hooks(RegionHooks hooks) noexcept { return core_->set_region_hooks(std::move(hooks)); }

    /// The slice `pointer` lies in: its region's id, its offset there, and the bytes from it
    /// to the end of the live allocation holding it (to the end of the region when none does);
    /// nullopt when it is not the pool's pinned memory.
    std::optional<RegionSlice> describe(const void* pointer) const noexcept { return core_->describe(pointer); }

    /// Frees every cached block, first waiting for the recorded work of pending ones (the host
    /// blocks), and the retiring blocks likewise. Allocations still live stay valid: they are
    /// counted in stats().finalized_* and detached_*, reported to the error sink, and go back
    /// to the backend (not the cache) when given back — after their recorded work completed.
    /// The pool stays usable. Returns the first failure, if any: a block whose wait failed
    /// stays allocated and is never reused.
    Status finalize() noexcept { return core_->finalize(); }

    /// Frees every cached and retiring block (nothing live is touched), first waiting for the
    /// recorded work of pending ones: the host blocks here, never in allocate(). A block whose
    /// wait failed stays allocated, is never reused, and the failure is returned.
    Status trim() noexcept { return core_->trim(); }

    PinnedStats stats() const noexcept { return core_->stats(); }
    /// Where reports go (stderr by default), also after the pool died, while buffers and
    /// containers still hold its memory: the sink must outlive them too.
    void set_error_sink(ErrorSink sink) noexcept { core_->set_sink(sink); }
    B& backend() const noexcept { return core_->backend(); }

    /// The shared core, for PinnedAllocator and PinnedMemoryResource; its stats() stay
    /// readable after the pool died.
    std::shared_ptr<detail::PinnedCore> core() const noexcept { return core_; }

private:
    std::shared_ptr<Core> core_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
