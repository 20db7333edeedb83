// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedTeardown, what a pinned pool's core does when its backend is being torn down,
/// before the device or context goes: it refuses everything later; waits for the work recorded
/// on its blocks, on every backend (dropped where the device no longer answers: the reset ends
/// it); frees the cache, the retiring blocks and the raw allocations; unpins in place what
/// buffers, containers and region handles hold of memory the pool mapped (valid, pageable until
/// given back), or frees and revokes pinned_malloc memory (its holders must not touch it); takes
/// its regions down; destroys its events. It counts what it revoked. The registry, the cache,
/// the phase and those counters are guarded by the core's mutex, passed in; every backend call
/// is made without it.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_source.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/detail/messages.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/region_set.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/pinned/detail/retire.hpp"
#include "devstage/pinned/detail/streams.hpp"
#include "devstage/pinned/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class PinnedTeardown {
public:
    static constexpr bool streams = AsyncBackend<B>;
    using Lock = std::unique_lock<std::mutex>;
    using Live = typename PinnedRegistry<B>::Live;

    /// `mutex` guards `phase`, `registry` and the counters here.
    PinnedTeardown(std::mutex& mutex, PinnedPhase& phase, PinnedRegistry<B>& registry, PinnedEvents<B>& events,
                   PinnedBlockSource<B>& source, PinnedRegionSet<B>& regions, PinnedRetire<B>& retire,
                   PinnedStreams<B>& recorded, const PinnedSink& sink) noexcept
        : mutex_(&mutex),
          phase_(&phase),
          registry_(&registry),
          events_(&events),
          source_(&source),
          regions_(&regions),
          retire_(&retire),
          recorded_(&recorded),
          sink_(&sink) {}
    PinnedTeardown(const PinnedTeardown&) = delete;
    PinnedTeardown& operator=(const PinnedTeardown&) = delete;

    /// The pool's backend is being torn down; afterwards the pool hands out nothing more and
    /// giving back what was held makes no backend call.
    void run() noexcept {
        {
            std::lock_guard lock(*mutex_);
            phase_->tear_down();
        }
        const auto regions = regions_->stop_listed();
        if constexpr (streams) {
            for (B* named : recorded_->recorded_backends()) {
                if (Status forgotten = recorded_->forget(*named, true); !forgotten) sink_->report(forgotten);
            }
        }
        Tally tally;
        free_cache(tally);
        Held held;
        let_go_of_held(held, tally);
        regions_->tear_down(regions, tally, [&](std::uint64_t region) { revoke_slices(region, held); });
        if constexpr (streams) (void)events_->destroy_idle();
        if (Status status = tally.status("teardown", name()); !status) sink_->report(status);
        if (held.revoked + held.unpinned > 0) {
            sink_->report(pinned_messages::torn_down_held(held.unpinned, held.revoked, held.revoked_bytes, name()));
        }
    }

    /// Precondition: the core's mutex held. Adds the counters to `stats`.
    void add_to(PinnedStats& stats) const noexcept {
        stats.revoked_allocations = revoked_allocations_;
        stats.revoked_bytes = revoked_bytes_;
    }

private:
    /// What this teardown did to allocations still held.
    struct Held {
        std::uint64_t revoked = 0, revoked_bytes = 0, unpinned = 0;
    };

    const std::string& name() const noexcept { return source_->name(); }

    /// The cached and retiring blocks, freed without a wait: their work was waited for (or
    /// dropped) when their backends were forgotten.
    void free_cache(Tally& tally) noexcept {
        typename PinnedBlockCache<B>::Map batch;
        retire_->take_cached(batch);
        while (!batch.empty()) {
            auto node = batch.extract(batch.begin());
            events_->recycle(node.mapped());
            tally.add(retire_->free_block(node.mapped().block));
        }
    }

    /// Every live allocation of a block from the backend: a raw one freed; one a buffer or
    /// container holds unpinned in place (mapped memory) or freed and revoked.
    void let_go_of_held(Held& held, Tally& tally) noexcept {
        std::vector<std::pair<void*, std::uint64_t>> listed;
        {
            std::lock_guard lock(*mutex_);
            (void)try_host_allocation([&] {
                registry_->for_each([&](void* pointer, Live& live) {
                    if (live.block.source != BlockSource::slice) listed.emplace_back(pointer, live.id);
                });
            });
        }
        for (const auto& [pointer, id] : listed) {
            Lock lock(*mutex_);
            Live* live = registry_->find(pointer, id);
            if (live == nullptr || live->revoked) continue;
            PinnedBlock block = live->block;
            if (live->holder == PinnedHolder::raw) {
                Live taken = registry_->unlist(registry_->lookup(pointer));
                lock.unlock();
                tally.add(retire_->free_block(taken.block));
                continue;
            }
            const std::size_t requested = live->requested;
            lock.unlock();
            if (block.source == BlockSource::mapped) {
                const Status undone = source_->unpin(block);
                tally.add(undone);
                if (!undone) continue;
                ++held.unpinned;
            } else {
                tally.add(retire_->free_block(block));
                ++held.revoked;
                held.revoked_bytes += requested;
            }
            lock.lock();
            if (Live* still = registry_->find(pointer, id)) {
                still->block = block;
                still->revoked = block.source != BlockSource::unpinned;
                if (still->revoked) {
                    ++revoked_allocations_;
                    revoked_bytes_ += still->requested;
                }
            }
        }
    }

    /// Precondition: the core's mutex held. The live slices of `region`, whose memory went.
    void revoke_slices(std::uint64_t region, Held& held) noexcept {
        registry_->for_each([&](void*, Live& live) {
            if (live.block.source != BlockSource::slice || live.block.region != region || live.revoked) return;
            live.revoked = true;
            ++revoked_allocations_;
            revoked_bytes_ += live.requested;
            ++held.revoked;
            held.revoked_bytes += live.requested;
        });
    }

    std::mutex* mutex_;
    PinnedPhase* phase_;
    PinnedRegistry<B>* registry_;
    PinnedEvents<B>* events_;
    PinnedBlockSource<B>* source_;
    PinnedRegionSet<B>* regions_;
    PinnedRetire<B>* retire_;
    PinnedStreams<B>* recorded_;
    const PinnedSink* sink_;
    std::uint64_t revoked_allocations_ = 0, revoked_bytes_ = 0;  ///< under *mutex_
};

}  // namespace devstage::detail
