// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the recorded stream work of a pinned pool's core (PinnedEvents, its second layer):
/// the streams whose work uses a block (Use), a released block with the events recorded after
/// that work (Cached), the pool's events (created once, then recorded again for later
/// releases) and the calls that record, query and wait for them, or synchronize the device
/// when an event fails.

#include <cstddef>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/state.hpp"
#include "devstage/pinned/detail/stream_types.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The events of a pool's core and the work recorded on its blocks. With a backend that is not
/// an AsyncBackend no stream is ever recorded, and the calls that record, query or wait for
/// events do not exist.
template <PinnedHostBackend B>
class PinnedEvents : public PinnedCoreState<B> {
    using Base = PinnedCoreState<B>;

protected:
    using Base::backend_;
    using Base::count_wait;
    using Base::mutex_;
    using Base::name_;
    using Base::stats_;
    using Base::streams;
    using typename Base::Block;

public:
    using Stream = typename PinnedStreamTypes<B>::Stream;
    using Event = typename PinnedStreamTypes<B>::Event;

    using Base::Base;
    using Base::report;

protected:
    /// A stream whose enqueued work uses a block, and once the block is given back, the event
    /// recorded there.
    struct Use {
        Stream stream;
        Event event;
        bool recorded = false;  ///< `event` was recorded on `stream` at the release
    };
    using Uses = std::vector<Use>;
    /// A released block the pool keeps: for reuse (cache_) or until it may be freed (retiring_).
    struct Cached {
        Block block;
        Uses uses;  ///< events of recorded work not known to have completed; empty: none
        /// An event could not be recorded or queried: no event tells when the work ends, so only
        /// a wait (trim, finalize, the destruction) settles the block.
        bool unknown = false;

        bool pending() const noexcept { return !uses.empty() || unknown; }
    };

    /// Records an event on each stream of `entry` (events from the pool's idle ones, created
    /// when none is idle). When one cannot be had or recorded, the failure is reported and the
    /// device synchronized (the host blocks): if that succeeds, the work is complete and the
    /// entry no longer pending; if not (or the backend cannot synchronize), the entry is
    /// `unknown` — never handed out, freed only after a later wait.
    void mark(Cached& entry, const char* what) noexcept requires streams {
        bool failed = false;
        for (Use& use : entry.uses) {
            Result<Event> event = take_event();
            const Status recorded = event ? backend_->record_event(*event, use.stream) : event.status();
            if (recorded) {
                use.event = *event;
                use.recorded = true;
                continue;
            }
            if (event) drop_event(*event);
            failed = true;
            report(Status(recorded.code(),
                          message_or_empty("pinned pool ", what, ": recording an event after the work on a ",
                                           entry.block.capacity, "-byte block failed on backend '", name_,
                                           "': ", recorded.message(), "; synchronizing the device instead")));
        }
        if (!failed) return;
        count_wait();
        if (const Status synced = synchronize_device(); !synced) {
            entry.unknown = true;
            report(Status(synced.code(),
                          message_or_empty("pinned pool ", what, ": ", synced.message(), "; the ", entry.block.capacity,
                                           "-byte block is kept, never reused, until trim(), finalize() or the "
                                           "pool's destruction can wait for its work (backend '",
                                           name_, "')")));
            return;
        }
        std::lock_guard lock(mutex_);
        recycle(entry);
    }

    /// True when every event of `entry` completed; never blocks.
    Result<bool> poll(const Cached& entry) noexcept requires streams {
        for (const Use& use : entry.uses) {
            if (!use.recorded) continue;
            Result<bool> ready = backend_->event_ready(use.event);
            if (!ready || !*ready) return ready;
        }
        return true;
    }

    /// Blocks until the work of `entry` completed: each event is waited on; when that fails or
    /// the entry is `unknown`, the device is synchronized. On success the entry's events go
    /// back to the pool and it is no longer pending.
    Status wait_for(Cached& entry) noexcept requires streams {
        count_wait();
        Status waited;
        if (!entry.unknown) {
            for (const Use& use : entry.uses) {
                if (!use.recorded) continue;
                waited = backend_->synchronize_event(use.event);
                if (!waited) break;
            }
        }
        if (entry.unknown || !waited) {
            if (Status synced = synchronize_device(); !synced) {
                if (waited) return synced;
                return Status(waited.code(), message_or_empty(waited.message(), "; then ", synced.message()));
            }
        }
        std::lock_guard lock(mutex_);
        recycle(entry);
        return {};
    }

    Status synchronize_device() noexcept requires streams {
        if constexpr (SynchronizingBackend<B>) {
            Status synced = backend_->synchronize();
            if (!synced) return Status(synced.code(), message_or_empty("synchronize failed: ", synced.message()));
            return synced;
        } else {
            return Status(Errc::not_supported, message_or_empty("backend '", name_, "' has no synchronize()"));
        }
    }

    /// An event of the pool: an idle one, else a new one. Room for it among the idle events is
    /// reserved first, so giving it back never allocates.
    Result<Event> take_event() noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            if (!idle_events_.empty()) {
                const Event event = idle_events_.back();
                idle_events_.pop_back();
                return event;
            }
            if (!try_host_allocation([&] { idle_events_.reserve(events_owned_ + 1); })) {
                return Status(Errc::out_of_memory,
                              message_or_empty("pinned pool: host memory exhausted making room for an event (backend '",
                                               name_, "')"));
            }
            ++events_owned_;
        }
        Result<Event> created = backend_->create_event();
        std::lock_guard lock(mutex_);
        if (!created) {
            --events_owned_;
            return created.status();
        }
        ++stats_.events_created;
        return created;
    }

    /// Destroys an event whose recording failed (its state is unknown).
    void drop_event(Event event) noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            --events_owned_;
        }
        if (Status destroyed = backend_->destroy_event(event); !destroyed) report(destroyed);
    }

    void destroy_idle_events() noexcept requires streams {
        for (;;) {
            Event event{};
            {
                std::lock_guard lock(mutex_);
                if (idle_events_.empty()) return;
                event = idle_events_.back();
                idle_events_.pop_back();
                --events_owned_;
            }
            if (Status destroyed = backend_->destroy_event(event); !destroyed) {
                report(
                    Status(destroyed.code(), message_or_empty("pinned pool destroy: destroy_event failed on backend '",
                                                              name_, "': ", destroyed.message())));
            }
        }
    }

    /// Precondition: mutex_ held. The entry's work completed: its events go back to the idle
    /// ones (never allocates: take_event() reserved the room) and it is no longer pending.
    void recycle(Cached& entry) noexcept {
        if constexpr (streams) {
            for (const Use& use : entry.uses) {
                if (use.recorded) idle_events_.push_back(use.event);
            }
        }
        entry.uses.clear();
        entry.unknown = false;
    }

    /// Events not in use; their capacity covers every event the pool owns.
    std::vector<Event> idle_events_;
    std::size_t events_owned_ = 0;  ///< idle or recorded on a pending block
};

}  // namespace devstage::detail
