// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedForget, letting go of one backend whose streams a pinned pool recorded: the
/// pool waits for the work recorded on that backend's streams — on live allocations and on
/// pending blocks — and destroys that backend's events, so the backend may go while the pool
/// lives on. Forced (the backend is being torn down), a wait that fails drops the work anyway:
/// nothing of that backend runs after its teardown. It works on the core's registry, cache and
/// events, under the core's mutex, and calls the backend without it.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class PinnedForget {
public:
    using Use = PinnedUse<B>;
    using Entry = PinnedEntry<B>;
    using Stream = typename Use::Stream;

    /// The core's parts; `cacheable` says, under `mutex`, whether a block may wait in the cache.
    PinnedForget(std::mutex& mutex, PinnedRegistry<B>& registry, PinnedBlockCache<B>& cache, PinnedEvents<B>& events,
                 const PinnedSink& sink, const bool& cacheable) noexcept
        : mutex_(&mutex),
          registry_(&registry),
          cache_(&cache),
          events_(&events),
          sink_(&sink),
          cacheable_(&cacheable) {}

    /// Waits (the host blocks) for the work recorded on `backend`'s streams: for each live
    /// allocation that recorded one, an event is recorded on it now and waited for; each
    /// pending block's events of `backend` are waited for. Then `backend`'s idle events are
    /// destroyed. Unless `force`, a wait that fails (after synchronize() as a fallback) leaves
    /// that use in place and the failure is returned: nothing is lost. With `force`, failures
    /// are reported and the uses dropped; the first is returned.
    Status run(B& backend, bool force) noexcept requires AsyncBackend<B> {
        for (;;) {
            Tally tally;
            live(backend, force, tally);
            pending(backend, force, tally);
            tally.add(events_->destroy_idle(&backend));
            if (!tally.first.ok() && !force) return tally.status("forget", std::string(backend.name()));
            if (!events_->holds_events_of(&backend)) return tally.status("forget", std::string(backend.name()));
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
    void live(B& backend, bool force, Tally& tally) noexcept {
        std::vector<LiveUse> found;
        {
            std::lock_guard lock(*mutex_);
            const bool listed = try_host_allocation([&] {
                registry_->for_each([&](void* pointer, auto& entry) {
                    for (const Use& use : entry.uses) {
                        if (use.backend == &backend) found.push_back(LiveUse{pointer, entry.id, use.stream});
                    }
                });
            });
            if (!listed) {
                tally.add(Status(Errc::out_of_memory, message_or_empty("pinned pool forget: host memory exhausted "
                                                                       "listing the streams of backend '",
                                                                       backend.name(), "'")));
                return;
            }
        }
        for (const LiveUse& item : found) {
            const Status waited = events_->wait_stream(backend, item.stream, "forget");
            if (!waited) {
                if (force) sink_->report(waited);
                tally.add(waited);
                if (!force) continue;
            } else {
                tally.add({});
            }
            Use dropped{};
            {
                std::lock_guard lock(*mutex_);
                auto* entry = registry_->find(item.pointer, item.id);
                if (entry == nullptr) continue;  // given back meanwhile: its release recorded the work
                for (auto use = entry->uses.begin(); use != entry->uses.end(); ++use) {
                    if (use->backend == &backend && use->stream == item.stream) {
                        dropped = *use;
                        entry->uses.erase(use);
                        break;
                    }
                }
            }
            events_->recycle(dropped);
        }
    }

    /// The pending blocks' events of `backend`, waited for (synchronize() when one fails or
    /// was never recorded) and given back; the blocks stay pending on other backends' streams.
    void pending(B& backend, bool force, Tally& tally) noexcept {
        const auto uses_backend = [&](const Entry& entry) {
            for (const Use& use : entry.uses) {
                if (use.backend == &backend) return true;
            }
            return false;
        };
        typename PinnedBlockCache<B>::Map batch;
        {
            std::lock_guard lock(*mutex_);
            cache_->take_if(batch, uses_backend);
        }
        while (!batch.empty()) {
            auto node = batch.extract(batch.begin());
            Entry& entry = node.mapped();
            events_->count_wait();
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
                if (Status synced = PinnedEvents<B>::synchronize_device(backend); !synced) {
                    Status failure(synced.code(),
                                   message_or_empty("pinned pool forget: waiting for the work recorded on a ",
                                                    entry.block.capacity, "-byte block failed on backend '",
                                                    backend.name(), "': ", waited ? synced.message() : waited.message(),
                                                    force ? "; the backend is being torn down: its work is dropped"
                                                          : "; the block stays pending"));
                    if (force) sink_->report(failure);
                    tally.add(std::move(failure));
                    if (!force) {
                        std::lock_guard lock(*mutex_);
                        cache_->put_back(std::move(node), *cacheable_);
                        continue;
                    }
                }
            }
            tally.add({});
            bool others = false;
            for (auto use = entry.uses.begin(); use != entry.uses.end();) {
                if (use->backend == &backend) {
                    events_->recycle(*use);
                    use = entry.uses.erase(use);
                } else {
                    others = true;
                    ++use;
                }
            }
            // An unknown entry settled by this backend's synchronize(): unknown no more, unless
            // other backends' work may still use it.
            if (!others) entry.unknown = false;
            std::lock_guard lock(*mutex_);
            cache_->put_back(std::move(node), *cacheable_);
        }
    }

    std::mutex* mutex_;
    PinnedRegistry<B>* registry_;
    PinnedBlockCache<B>* cache_;
    PinnedEvents<B>* events_;
    const PinnedSink* sink_;
    const bool* cacheable_;
};

}  // namespace devstage::detail
