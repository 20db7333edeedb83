// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: letting go of one backend whose streams a pinned pool recorded (PinnedForget, the
/// fifth layer of its core): the pool waits for the work recorded on that backend's streams —
/// on live allocations and on pending blocks — and destroys that backend's events, so the
/// backend may be destroyed while the pool lives on.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// forget() of a pool's core.
template <PinnedHostBackend B, class Cache>
class PinnedForget : public PinnedBlockCache<B, Cache> {
    using Base = PinnedBlockCache<B, Cache>;

protected:
    using Base::count;
    using Base::mutex_;
    using Base::recycle;
    using Base::refile;
    using Base::streams;
    using Base::synchronize_device;
    using typename Base::Cached;
    using typename Base::CacheMap;
    using typename Base::Event;
    using typename Base::Stream;
    using typename Base::Tally;
    using typename Base::Use;
    using typename Base::Where;

public:
    using Base::Base;
    using Base::report;

    /// Waits (the host blocks) for the work recorded on `backend`'s streams: for each live
    /// allocation that recorded one, an event is recorded on it now and waited for; each pending
    /// block's events of `backend` are waited for. Then `backend`'s idle events are destroyed.
    /// On success the pool holds nothing of `backend` and makes no further call to it (unless
    /// a later record() names it again). A wait that fails (after synchronize() as a fallback)
    /// leaves that use in place, and the failure is returned: nothing is lost.
    Status forget(B& backend) noexcept requires streams {
        for (;;) {
            Tally tally;
            forget_live(backend, tally);
            forget_pending(backend, tally);
            tally.add(this->destroy_idle_events(&backend));
            if (!tally.first.ok()) return tally.status("forget", this->name_);
            {
                std::lock_guard lock(mutex_);
                if (!this->holds_events_of(&backend)) return {};
            }
            // Another thread's allocate() holds a pending block of it while querying it: the
            // block comes back (settled, or pending again) as soon as that query returned.
            std::this_thread::yield();
        }
    }

private:
    struct LiveUse {
        void* pointer;
        std::uint64_t id;
        Stream stream;
    };

    /// An event recorded on each stream of `backend` that a live allocation recorded, waited
    /// for; the use is then dropped.
    void forget_live(B& backend, Tally& tally) noexcept {
        std::vector<LiveUse> found;
        {
            std::lock_guard lock(mutex_);
            const bool listed = try_host_allocation([&] {
                for (const auto& [pointer, live] : this->live_) {
                    for (const Use& use : live.uses) {
                        if (use.backend == &backend) found.push_back(LiveUse{pointer, live.id, use.stream});
                    }
                }
            });
            if (!listed) {
                tally.add(Status(Errc::out_of_memory, message_or_empty("pinned pool forget: host memory exhausted "
                                                                       "listing the streams of backend '",
                                                                       backend.name(), "'")));
                return;
            }
        }
        for (const LiveUse& item : found) {
            const Status waited = wait_now(backend, item.stream);
            tally.add(waited);
            if (!waited) continue;
            std::lock_guard lock(mutex_);
            auto* live = this->find_live(item.pointer, item.id);
            if (live == nullptr) continue;  // given back meanwhile: its release recorded the work
            for (auto use = live->uses.begin(); use != live->uses.end(); ++use) {
                if (use->backend == &backend && use->stream == item.stream) {
                    recycle(*use);
                    live->uses.erase(use);
                    break;
                }
            }
        }
    }

    /// An event of `backend` recorded on `stream` and waited for; synchronize() when that fails.
    Status wait_now(B& backend, Stream stream) noexcept {
        this->count_wait();
        Result<Event> event = this->take_event(backend);
        Status waited = event ? backend.record_event(*event, stream) : event.status();
        if (waited) waited = backend.synchronize_event(*event);
        if (event) {
            std::lock_guard lock(mutex_);
            recycle(Use{&backend, stream, *event, true, true});
        }
        if (waited) return waited;
        if (Status synced = synchronize_device(backend); !synced) {
            return Status(waited.code(),
                          message_or_empty("pinned pool forget: waiting for a stream of backend '", backend.name(),
                                           "' failed: ", waited.message(), "; then ", synced.message()));
        }
        return {};
    }

    /// The pending blocks' events of `backend`, waited for (synchronize() when one fails or was
    /// never recorded) and given back; the blocks stay pending on other backends' streams.
    void forget_pending(B& backend, Tally& tally) noexcept {
        const auto uses_backend = [&](const Cached& entry) {
            for (const Use& use : entry.uses) {
                if (use.backend == &backend) return true;
            }
            return false;
        };
        CacheMap batch;
        {
            std::lock_guard lock(mutex_);
            for (CacheMap* map : {&this->cache_, &this->retiring_}) {
                const Where where = map == &this->cache_ ? Where::cache : Where::retiring;
                for (auto it = map->begin(); it != map->end();) {
                    const auto next = std::next(it);
                    if (uses_backend(it->second)) {
                        count(it->second, where, -1);
                        batch.insert(map->extract(it));
                    }
                    it = next;
                }
            }
        }
        while (!batch.empty()) {
            typename CacheMap::node_type node = batch.extract(batch.begin());
            Cached& entry = node.mapped();
            this->count_wait();
            Status waited;
            bool unrecorded = entry.unknown;
            for (const Use& use : entry.uses) {
                if (use.backend != &backend) continue;
                if (!use.recorded) {
                    unrecorded = true;
                } else if (waited) {
                    waited = backend.synchronize_event(use.event);
                }
            }
            if (!waited || unrecorded) {
                if (Status synced = synchronize_device(backend); !synced) {
                    tally.add(Status(
                        synced.code(),
                        message_or_empty("pinned pool forget: waiting for the work recorded on a ",
                                         entry.block.capacity, "-byte block failed on backend '", backend.name(), "': ",
                                         waited ? synced.message() : waited.message(), "; the block stays pending")));
                    std::lock_guard lock(mutex_);
                    refile(std::move(node));
                    continue;
                }
            }
            tally.add({});
            std::lock_guard lock(mutex_);
            bool others = false;
            for (auto use = entry.uses.begin(); use != entry.uses.end();) {
                if (use->backend == &backend) {
                    recycle(*use);
                    use = entry.uses.erase(use);
                } else {
                    others = true;
                    ++use;
                }
            }
            // An unknown entry settled by this backend's synchronize(): unknown no more, unless
            // other backends' work may still use it.
            if (!others) entry.unknown = false;
            refile(std::move(node));
        }
    }
};

}  // namespace devstage::detail
