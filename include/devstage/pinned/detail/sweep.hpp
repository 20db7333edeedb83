// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedSweep, the calls that give a pinned pool's released blocks back in bulk:
/// trim() (the cache), finalize() (the cache; what is live becomes detached), close() (the
/// pool's destruction: also the raw allocations nothing can give back any more) and the last
/// sweep of the core's own destruction. Pending work is waited for first (the host blocks).
/// The registry, the cache and the phase are guarded by the core's mutex, passed in; every
/// backend call is made without it.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/messages.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/registry.hpp"
#include "devstage/pinned/detail/retire.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class PinnedSweep {
public:
    static constexpr bool streams = AsyncBackend<B>;
    using Entry = PinnedEntry<B>;

    /// `mutex` guards `phase`, `registry` and `cache`.
    PinnedSweep(std::mutex& mutex, PinnedPhase& phase, PinnedRegistry<B>& registry, PinnedBlockCache<B>& cache,
                PinnedEvents<B>& events, PinnedRetire<B>& retire, const std::string& name,
                const PinnedSink& sink) noexcept
        : mutex_(&mutex),
          phase_(&phase),
          registry_(&registry),
          cache_(&cache),
          events_(&events),
          retire_(&retire),
          name_(&name),
          sink_(&sink) {}
    PinnedSweep(const PinnedSweep&) = delete;
    PinnedSweep& operator=(const PinnedSweep&) = delete;

    /// Frees every cached and retiring block, waiting first for the recorded work of pending
    /// ones (the host blocks); nothing live is touched. A block whose wait fails stays
    /// allocated (retiring, never reused) and the failure is returned.
    Status trim() noexcept {
        Tally tally;
        retire_->free_cached("trim", tally);
        return tally.status("trim", *name_);
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

    /// The core's destruction, when nothing holds its memory any more: blocks given back since
    /// the pool's destruction whose recorded work was still pending are waited for (the host
    /// blocks) and freed; one whose wait fails is left allocated and reported. Then the events
    /// given back since are destroyed.
    void destroy() noexcept {
        Tally tally;
        retire_->free_cached("destroy", tally);
        if (Status status = tally.status("destroy", *name_); !status) sink_->report(status);
        if (const auto [leaked, bytes] = cache_->retiring(); leaked > 0) {
            sink_->report(pinned_messages::destroyed_retiring(leaked, bytes, *name_));
        }
        if constexpr (streams) (void)events_->destroy_idle();
    }

private:
    /// finalize() (`closing` false) and close() (true).
    Status sweep(bool closing) noexcept {
        std::uint64_t held = 0, held_bytes = 0;
        {
            std::lock_guard lock(*mutex_);
            if (closing) phase_->close();
            std::tie(held, held_bytes) = registry_->detach_all(closing);
        }
        Tally tally;
        std::uint64_t raw = 0, raw_bytes = 0;
        if (closing) {
            // Recorded ones become retiring (the pool is closed) and are waited for below.
            for (;;) {
                std::optional<typename PinnedRegistry<B>::Live> live;
                {
                    std::lock_guard lock(*mutex_);
                    live = registry_->take_raw();
                }
                if (!live) break;
                ++raw;
                raw_bytes += live->requested;
                if (live->revoked) continue;
                if constexpr (streams) {
                    if (!live->uses.empty()) {
                        tally.add(retire_->retire_recorded(Entry{live->block, std::move(live->uses), false}, false,
                                                           "destroy"));
                        continue;
                    }
                }
                tally.add(retire_->free_block(live->block));
            }
        }
        retire_->free_cached(closing ? "destroy" : "finalize", tally);
        if constexpr (streams) {
            if (closing) (void)events_->destroy_idle();
        }
        if (!closing && held > 0) {
            sink_->report(pinned_messages::finalized_live(held, held_bytes, *name_));
        } else if (closing && held + raw > 0) {
            sink_->report(pinned_messages::destroyed_live(raw, raw_bytes, held, held_bytes, *name_));
        }
        return tally.status(closing ? "destroy" : "finalize", *name_);
    }

    std::mutex* mutex_;
    PinnedPhase* phase_;
    PinnedRegistry<B>* registry_;
    PinnedBlockCache<B>* cache_;
    PinnedEvents<B>* events_;
    PinnedRetire<B>* retire_;
    const std::string* name_;
    const PinnedSink* sink_;
};

}  // namespace devstage::detail
