// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedStreams, the streams whose work uses a pinned pool's memory. record() checks
/// a stream and remembers it on the live allocation, so the block goes back only after that
/// work completed; forget() lets go of a backend of recorded streams (PinnedForget), whose
/// teardown the core listens to from its first recorded stream on. The registry, the cache and
/// the phase are guarded by the core's mutex, passed in; every backend call is made without it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/forget.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/detail/messages.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/pinned/detail/teardown_hooks.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage::detail {

template <class B>
class PinnedStreams {
public:
    static constexpr bool streams = AsyncBackend<B>;
    using Use = PinnedUse<B>;
    using Stream = typename Use::Stream;
    using Event = typename Use::Event;

    /// `mutex` guards `phase`, `registry` and `cache`; `own` is the pool's backend, `hooks`
    /// listen to the teardown of the others.
    PinnedStreams(std::mutex& mutex, const PinnedPhase& phase, PinnedRegistry<B>& registry, PinnedBlockCache<B>& cache,
                  PinnedEvents<B>& events, PinnedTeardownHooks<B>& hooks, B& own, const std::string& name,
                  const PinnedSink& sink) noexcept
        : mutex_(&mutex),
          phase_(&phase),
          registry_(&registry),
          cache_(&cache),
          events_(&events),
          hooks_(&hooks),
          own_(&own),
          name_(&name),
          sink_(&sink) {}
    PinnedStreams(const PinnedStreams&) = delete;
    PinnedStreams& operator=(const PinnedStreams&) = delete;

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
            std::lock_guard lock(*mutex_);
            if (phase_->torn_down()) {
                return Status(Errc::invalid_argument,
                              message_or_empty("pinned pool record: backend '", *name_,
                                               "' was torn down: no work may use the pool's memory any more"));
            }
            auto* live = registry_->find(pointer, id);
            if (live == nullptr) return pinned_messages::not_live(pointer, *name_);
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
            Result<Event> event = events_->take(backend);
            if (!event) return refused(backend, pointer, event.status());
            if (Status recorded = backend.record_event(*event, stream); !recorded) {
                events_->drop(backend, *event);
                return refused(backend, pointer, recorded);
            }
            use.event = *event;
            use.holds_event = true;
        }
        if constexpr (TeardownBackend<B>) {
            if (&backend != own_) hooks_->hook(backend);
        }
        Status status;
        {
            std::lock_guard lock(*mutex_);
            auto* live = registry_->find(pointer, id);
            if (live == nullptr) {
                status = pinned_messages::not_live(pointer, *name_);  // given back meanwhile, by another thread
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
        events_->recycle(use);
        return status;
    }

    /// record() of a PinnedBuffer: its memory (`data`, `bytes`, grant `id`), held from `owner`
    /// (`self` is the pool's core).
    Status record_buffer(const PinnedCore* owner, const PinnedCore* self, const void* data, std::size_t bytes,
                         std::uint64_t id, Stream stream, B& backend, bool check) noexcept requires streams {
        if (data == nullptr) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the buffer is empty (0 bytes): it holds no memory "
                                           "(backend '",
                                           *name_, "')"));
        }
        if (owner != self) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the ", bytes, "-byte buffer at ", data,
                                           " belongs to another pool, not this one (backend '", *name_, "')"));
        }
        return record(data, id, stream, backend, check);
    }

    /// Lets go of `backend` (PinnedForget): on success the pool makes no further call to it.
    /// `force` (the backend is being torn down): work that cannot be waited for is dropped.
    Status forget(B& backend, bool force) noexcept requires streams {
        Status forgotten = forgetter().run(backend, force);
        if (!force && forgotten && &backend != own_) hooks_->unhook(backend);
        return forgotten;
    }

    /// Every backend the pool holds events of or whose streams live or pending blocks recorded.
    std::vector<B*> recorded_backends() noexcept {
        std::vector<B*> out = events_->backends();
        const auto add = [&](B* backend) {
            if (std::find(out.begin(), out.end(), backend) == out.end()) out.push_back(backend);
        };
        std::lock_guard lock(*mutex_);
        (void)try_host_allocation([&] {
            registry_->for_each([&](void*, auto& live) {
                for (const Use& use : live.uses) add(use.backend);
            });
            cache_->for_each([&](const PinnedEntry<B>& entry) {
                for (const Use& use : entry.uses) add(use.backend);
            });
        });
        return out;
    }

private:
    PinnedForget<B> forgetter() noexcept {
        return PinnedForget<B>(*mutex_, *registry_, *cache_, *events_, *sink_, *phase_);
    }

    static Status refused(const B& backend, const void* pointer, const Status& cause) noexcept {
        return pinned_messages::refused(backend.name(), static_cast<const void*>(&backend), pointer, cause);
    }

    std::mutex* mutex_;
    const PinnedPhase* phase_;
    PinnedRegistry<B>* registry_;
    PinnedBlockCache<B>* cache_;
    PinnedEvents<B>* events_;
    PinnedTeardownHooks<B>* hooks_;
    B* own_;
    const std::string* name_;
    const PinnedSink* sink_;
};

}  // namespace devstage::detail
