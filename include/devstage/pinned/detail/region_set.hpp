// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedRegionSet, the regions a pinned pool's core made with create_region, by id —
/// each made (limits checked, mapped, registered in chunks, maybe in background threads),
/// asked about, cut into slices, given its slices back, dropped by its handle, and settled: a
/// region whose handle is gone and whose last slice came back leaves the pool (the hooks'
/// `removing`, then unregistered and unmapped). The set and each region's slices are guarded
/// by the core's mutex, passed in; no backend call is made while holding it.

#include <sys/mman.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_source.hpp"
#include "devstage/pinned/detail/chunked_registration.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/messages.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/region_state.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/region.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class PinnedRegionSet {
public:
    using Lock = std::unique_lock<std::mutex>;
    using Region = PinnedRegionState<B>;

    /// `mutex` guards the set, `phase` and each region's slices; `source` pins and lists.
    PinnedRegionSet(std::mutex& mutex, const PinnedPhase& phase, PinnedBlockSource<B>& source,
                    const PinnedSink& sink) noexcept
        : mutex_(&mutex), phase_(&phase), source_(&source), sink_(&sink) {}
    PinnedRegionSet(const PinnedRegionSet&) = delete;
    PinnedRegionSet& operator=(const PinnedRegionSet&) = delete;

    /// A region of `bytes` (rounded up to whole pages) made for slices (see RegionOptions);
    /// its id. With threads, registration goes on after the call returns.
    Result<std::uint64_t> create(std::size_t bytes, const RegionOptions& options) noexcept {
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
            std::lock_guard lock(*mutex_);
            if (Status open = phase_->refusal(name()); !open) return open;
        }
        if (Status fits = source_->check_limits(*capacity, options.rdma); !fits) return fits;
        Result<std::shared_ptr<Region>> region = pin(next_region_id(), bytes, *capacity, options);
        if (!region) return region.status();
        source_->count_pinned((*region)->block());
        bool listed = false;
        {
            std::lock_guard lock(*mutex_);
            listed = try_host_allocation([&] { regions_.emplace((*region)->id(), *region); });
        }
        if (!listed) {
            unpin_failed(**region);
            return failure(bytes, Status(Errc::out_of_memory, "host memory exhausted"));
        }
        Region& made = **region;
        ChunkedRegistration<B>* registration = made.registration();
        if (registration == nullptr) {
            registered(made, Status());
        } else if (options.threads == 0) {
            registered(made, registration->run());
        } else if (Status started = registration->start(
                       options.threads, [this, raw = &made](const Status& status) { registered(*raw, status); });
                   !started) {
            registered(made, started);
        }
        return made.id();
    }

    /// The region `id`, or null when it is not (or no longer) the pool's.
    std::shared_ptr<Region> find(std::uint64_t id) const noexcept {
        std::lock_guard lock(*mutex_);
        return find_locked(id);
    }

    /// Where region `id` starts; null when it is not the pool's.
    void* base(std::uint64_t id) const noexcept {
        const std::shared_ptr<Region> region = find(id);
        return region ? region->block().base : nullptr;
    }

    RegionProgress progress(std::uint64_t id) const noexcept {
        const std::shared_ptr<Region> region = find(id);
        if (!region) return RegionProgress{0, 0, 0, 0, RegionState::failed, false};
        return region->progress();
    }

    Result<bool> ready(std::uint64_t id) const noexcept {
        const std::shared_ptr<Region> region = find(id);
        if (!region) return pinned_messages::unknown_region(id);
        switch (region->state()) {
            case RegionState::registering:
                return false;
            case RegionState::ready:
                return true;
            default:
                return region->failure();
        }
    }

    Status wait(std::uint64_t id) noexcept {
        const std::shared_ptr<Region> region = find(id);
        if (!region) return pinned_messages::unknown_region(id);
        return region->wait();
    }

    Status cancel(std::uint64_t id) noexcept {
        const std::shared_ptr<Region> region = find(id);
        if (!region) return pinned_messages::unknown_region(id);
        region->stop();
        if (region->state() == RegionState::ready) {
            return Status(Errc::invalid_argument, message_or_empty("pinned region ", id,
                                                                   ": registered already, nothing to cancel; drop its "
                                                                   "handle to free it"));
        }
        return {};
    }

    /// Precondition: `lock` holds the core's mutex (held on return). A slice of `bytes` aligned
    /// to `alignment` cut from region `id`, for the core to enroll; nothing while the pool
    /// hands out nothing or the region is not registered.
    Result<PinnedBlock> cut([[maybe_unused]] const Lock& lock, std::uint64_t id, std::size_t bytes,
                            std::size_t alignment) noexcept {
        if (bytes == 0 || !std::has_single_bit(alignment)) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned region ", id, " allocate: ", bytes, " bytes aligned to ", alignment,
                                           ": the size must be > 0 and the alignment a power of two"));
        }
        const std::shared_ptr<Region> region = find_locked(id);
        if (!region) return pinned_messages::unknown_region(id);
        if (Status open = phase_->refusal(name()); !open) return open;
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
        return slice;
    }

    /// A slice back to its region (no lock held); the region leaves once nothing holds it.
    void give_back(const PinnedBlock& slice) noexcept {
        Lock lock(*mutex_);
        std::shared_ptr<Region> region = find_locked(slice.region);
        if (!region) return;
        if (region->slices) {
            const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(slice.base) -
                                                         static_cast<std::byte*>(region->block().base));
            if (!region->slices->deallocate(offset, slice.capacity)) {
                sink_->report(
                    Status(Errc::out_of_memory,
                           message_or_empty("pinned region ", slice.region, ": host memory exhausted giving back a ",
                                            slice.capacity, "-byte slice; those bytes are not handed out again")));
            }
        }
        settle(lock, region);
    }

    /// The region's handle lets go: a registration in progress is cancelled; the region leaves
    /// once its last slice came back.
    void drop(std::uint64_t id) noexcept {
        std::shared_ptr<Region> region = find(id);
        if (!region) return;
        region->stop();
        Lock lock(*mutex_);
        region->held = false;
        settle(lock, region);
    }

    /// Stops every registration in progress (the core's destruction: nothing else runs).
    void stop_all() noexcept {
        for (const auto& [id, region] : regions_) region->stop();
    }

    /// The listed regions, each with its registration stopped (a teardown's first step).
    std::vector<std::shared_ptr<Region>> stop_listed() noexcept {
        std::vector<std::shared_ptr<Region>> out;
        {
            std::lock_guard lock(*mutex_);
            (void)try_host_allocation([&] {
                for (const auto& [id, region] : regions_) out.push_back(region);
            });
        }
        for (const std::shared_ptr<Region>& region : out) region->stop();
        return out;
    }

    /// The backend is being torn down: each registered region of `regions` goes before it —
    /// the hooks' `removing`, then its chunks unregistered (the memory stays mapped, pageable,
    /// until its slices come back) or its pinned_malloc memory freed; then, under the core's
    /// mutex, `revoke(id)` for a region whose memory went (its slices must not be touched) and
    /// the region settles. Adds each backend call to `tally`.
    template <class Revoke>
    void tear_down(const std::vector<std::shared_ptr<Region>>& regions, Tally& tally, Revoke&& revoke) noexcept {
        for (const std::shared_ptr<Region>& region : regions) {
            if (region->state() != RegionState::ready) continue;
            PinnedBlock block = region->block();
            source_->regions().remove(block.base);
            Status status;
            if (block.source == BlockSource::mapped) {
                status = region->registration() != nullptr ? region->registration()->unregister_all() : Status();
                if (status) source_->count_unpinned(block);
                block.source = BlockSource::unpinned;
            } else {
                status = source_->backend().pinned_free(block.base);
                if (status) source_->count_unpinned(block);
            }
            tally.add(status);
            Lock lock(*mutex_);
            if (block.source == BlockSource::malloc) revoke(region->id());
            region->torn_down = true;
            region->block().source = block.source;
            settle(lock, region);
        }
    }

private:
    const std::string& name() const noexcept { return source_->name(); }

    /// Precondition: the core's mutex held.
    std::shared_ptr<Region> find_locked(std::uint64_t id) const noexcept {
        const auto found = regions_.find(id);
        return found == regions_.end() ? nullptr : found->second;
    }

    Status failure(std::size_t bytes, const Status& cause) const noexcept {
        return pinned_messages::region_failure(bytes, name(), cause);
    }

    /// The region's memory (PinnedBlockSource::region_memory) and, where it is mapped, its
    /// registration in chunks; not yet counted or listed.
    Result<std::shared_ptr<Region>> pin(std::uint64_t id, std::size_t bytes, std::size_t capacity,
                                        const RegionOptions& options) noexcept {
        Result<PinnedBlock> memory = source_->region_memory(capacity, options.numa_node, options.chunk_bytes);
        if (!memory) return failure(bytes, memory.status());
        std::shared_ptr<Region> region;
        if (!try_host_allocation([&] {
                region = std::make_shared<Region>(id, *memory, bytes);
                if (memory->source != BlockSource::mapped) return;
                region->set_registration(std::make_unique<ChunkedRegistration<B>>(source_->backend(), memory->base,
                                                                                  memory->capacity, memory->chunk));
            })) {
            region.reset();
            source_->drop_region_memory(*memory);
            return failure(bytes, Status(Errc::out_of_memory, "host memory exhausted"));
        }
        return region;
    }

    /// The end of a region's registration (any thread): listed (the hooks' `added`) and ready
    /// for slices, or rolled back and unmapped.
    void registered(Region& region, Status outcome) noexcept {
        PinnedBlock& block = region.block();
        if (outcome) {
            if (ChunkedRegistration<B>* registration = region.registration()) {
                source_->count_chunks(registration->chunks());
            }
            PinnedRegion listed{region.id(), block.base, block.capacity, block.node, RegionKind::pinned_host, -1};
            outcome = source_->regions().add(listed, "pinned pool create_region");
            if (outcome) {
                std::lock_guard lock(*mutex_);
                if (try_host_allocation(
                        [&] { region.slices.emplace(block.capacity, reinterpret_cast<std::uintptr_t>(block.base)); })) {
                    region.settle(RegionState::ready, {});
                    return;
                }
                outcome = Status(Errc::out_of_memory, "host memory exhausted making the region's slice table");
                source_->regions().remove(block.base);
            }
            if (ChunkedRegistration<B>* registration = region.registration()) {
                if (Status undone = registration->unregister_all(); !undone) sink_->report(undone);
            }
        }
        const bool cancelled = region.registration() != nullptr && region.registration()->cancelled();
        unpin_failed(region);
        region.settle(cancelled ? RegionState::cancelled : RegionState::failed, failure(region.asked(), outcome));
    }

    /// The memory of a region that is not registered (rolled back): unmapped, or freed.
    void unpin_failed(Region& region) noexcept {
        const PinnedBlock& block = region.block();
        if (block.source == BlockSource::mapped) {
            ::munmap(block.base, block.capacity);
        } else if (Status freed = source_->backend().pinned_free(block.base); !freed) {
            sink_->report(freed);
        }
        source_->count_unpinned(block);
    }

    /// Precondition: `lock` holds the core's mutex (released on return). A region whose handle
    /// is gone and whose last slice came back (or that never registered) leaves the pool: the
    /// hooks' `removing` runs, then it is unregistered and unmapped (or freed).
    void settle(Lock& lock, const std::shared_ptr<Region>& region) noexcept {
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
        source_->regions().remove(region->block().base);
        Status status;
        if (ChunkedRegistration<B>* registration = region->registration()) {
            status = registration->unregister_all();
            if (status) ::munmap(region->block().base, region->block().capacity);
        } else {
            status = source_->backend().pinned_free(region->block().base);
        }
        if (status) {
            source_->count_unpinned(region->block());
        } else {
            sink_->report(
                Status(status.code(), message_or_empty("pinned region ", region->id(), ": freeing its ",
                                                       region->block().capacity, " bytes failed on backend '", name(),
                                                       "': ", status.message(), "; they stay allocated")));
        }
    }

    std::mutex* mutex_;
    const PinnedPhase* phase_;
    PinnedBlockSource<B>* source_;
    const PinnedSink* sink_;
    std::map<std::uint64_t, std::shared_ptr<Region>> regions_;  ///< under *mutex_
};

}  // namespace devstage::detail
