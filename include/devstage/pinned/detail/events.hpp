// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the recorded stream work of a pinned pool's core (PinnedEvents, its second layer):
/// the streams whose work uses a block, each with the backend it belongs to (Use), a released
/// block with the events recorded after that work (Cached), the pool's events, kept per
/// backend instance (created once on it, then recorded again for later releases), and the
/// calls that record, query and wait for them, or synchronize the devices when an event fails.

#include <algorithm>
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
    /// A stream whose enqueued work uses a block, the backend the stream belongs to (events are
    /// made, recorded, queried and destroyed on it), and the event the pool holds for it: taken
    /// when record() checked the stream, or when the block was given back.
    struct Use {
        B* backend = nullptr;
        Stream stream;
        Event event{};
        bool holds_event = false;  ///< `event` is the pool's, taken for this use
        bool recorded = false;     ///< `event` was recorded on `stream` at the release
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

    /// Records an event on each stream of `entry`, on the stream's backend (an event held
    /// since record(), else one of that backend's idle ones, created when none is idle). When
    /// one cannot be had or recorded, the failure is reported and the devices of those streams
    /// synchronized (the host blocks): if that succeeds, the work is complete and the entry no
    /// longer pending; if not (or a backend cannot synchronize), the entry is `unknown` — never
    /// handed out, freed only after a later wait.
    void mark(Cached& entry, const char* what) noexcept requires streams {
        bool failed = false;
        for (Use& use : entry.uses) {
            if (!use.holds_event) {
                Result<Event> event = take_event(*use.backend);
                if (!event) {
                    fail_mark(use, entry, what, event.status());
                    failed = true;
                    continue;
                }
                use.event = *event;
                use.holds_event = true;
            }
            if (const Status recorded = use.backend->record_event(use.event, use.stream); !recorded) {
                drop_event(*use.backend, use.event);
                use.holds_event = false;
                fail_mark(use, entry, what, recorded);
                failed = true;
                continue;
            }
            use.recorded = true;
        }
        if (!failed) return;
        count_wait();
        if (const Status synced = synchronize_devices(entry, true); !synced) {
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
            Result<bool> ready = use.backend->event_ready(use.event);
            if (!ready || !*ready) return ready;
        }
        return true;
    }

    /// Blocks until the work of `entry` completed: each event is waited on, on its backend;
    /// when that fails or the entry is `unknown`, the devices of its streams are synchronized.
    /// On success the entry's events go back to their backends' idle ones and it is no longer
    /// pending.
    Status wait_for(Cached& entry) noexcept requires streams {
        count_wait();
        Status waited;
        if (!entry.unknown) {
            for (const Use& use : entry.uses) {
                if (!use.recorded) continue;
                waited = use.backend->synchronize_event(use.event);
                if (!waited) break;
            }
        }
        if (entry.unknown || !waited) {
            if (Status synced = synchronize_devices(entry, false); !synced) {
                if (waited) return synced;
                return Status(waited.code(), message_or_empty(waited.message(), "; then ", synced.message()));
            }
        }
        std::lock_guard lock(mutex_);
        recycle(entry);
        return {};
    }

    /// Synchronizes each backend of `entry`'s streams once (only those of uses whose event was
    /// not recorded, when `unrecorded_only`); the first failure.
    Status synchronize_devices(const Cached& entry, bool unrecorded_only) noexcept requires streams {
        Status first;
        for (auto use = entry.uses.begin(); use != entry.uses.end(); ++use) {
            if (unrecorded_only && use->recorded) continue;
            const auto same = [&](const Use& earlier) {
                return earlier.backend == use->backend && !(unrecorded_only && earlier.recorded);
            };
            if (std::any_of(entry.uses.begin(), use, same)) continue;
            if (Status synced = synchronize_device(*use->backend); !synced && first.ok()) first = std::move(synced);
        }
        return first;
    }

    Status synchronize_device(B& backend) noexcept requires streams {
        if constexpr (SynchronizingBackend<B>) {
            Status synced = backend.synchronize();
            if (!synced) return Status(synced.code(), message_or_empty("synchronize failed: ", synced.message()));
            return synced;
        } else {
            return Status(Errc::not_supported, message_or_empty("backend '", backend.name(), "' has no synchronize()"));
        }
    }

    /// An event of `backend`: an idle one, else a new one. Room for it among the idle events is
    /// reserved first, so giving it back never allocates.
    Result<Event> take_event(B& backend) noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            Stock* stock = stock_of(&backend);
            if (stock == nullptr && try_host_allocation([&] { stocks_.push_back(Stock{&backend, {}, 0}); })) {
                stock = &stocks_.back();
            }
            if (stock != nullptr && !stock->idle.empty()) {
                const Event event = stock->idle.back();
                stock->idle.pop_back();
                return event;
            }
            if (stock == nullptr || !try_host_allocation([&] { stock->idle.reserve(stock->owned + 1); })) {
                return Status(Errc::out_of_memory,
                              message_or_empty("pinned pool: host memory exhausted making room for an event (backend '",
                                               backend.name(), "')"));
            }
            ++stock->owned;
        }
        Result<Event> created = backend.create_event();
        std::lock_guard lock(mutex_);
        if (!created) {
            --stock_of(&backend)->owned;
            return created.status();
        }
        ++stats_.events_created;
        return created;
    }

    /// Destroys an event whose recording failed (its state is unknown).
    void drop_event(B& backend, Event event) noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            --stock_of(&backend)->owned;
        }
        if (Status destroyed = backend.destroy_event(event); !destroyed) report(destroyed);
    }

    /// Destroys the idle events of `only` (of every backend when null); a backend with no
    /// event left out is forgotten. Returns the first failure (each is reported too).
    Status destroy_idle_events(B* only = nullptr) noexcept requires streams {
        Status first;
        for (;;) {
            Event event{};
            B* backend = nullptr;
            {
                std::lock_guard lock(mutex_);
                for (auto stock = stocks_.begin(); stock != stocks_.end();) {
                    if ((only == nullptr || stock->backend == only) && stock->owned == 0) {
                        stock = stocks_.erase(stock);
                        continue;
                    }
                    if ((only == nullptr || stock->backend == only) && !stock->idle.empty()) {
                        backend = stock->backend;
                        event = stock->idle.back();
                        stock->idle.pop_back();
                        --stock->owned;
                        break;
                    }
                    ++stock;
                }
                if (backend == nullptr) return first;
            }
            if (Status destroyed = backend->destroy_event(event); !destroyed) {
                Status failure(destroyed.code(), message_or_empty("pinned pool: destroy_event failed on backend '",
                                                                  backend->name(), "': ", destroyed.message()));
                report(failure);
                if (first.ok()) first = std::move(failure);
            }
        }
    }

    /// Precondition: mutex_ held. The entry's work completed: its events go back to their
    /// backends' idle ones (never allocates: take_event() reserved the room) and it is no
    /// longer pending.
    void recycle(Cached& entry) noexcept {
        if constexpr (streams) {
            for (const Use& use : entry.uses) recycle(use);
        }
        entry.uses.clear();
        entry.unknown = false;
    }
    /// Precondition: mutex_ held. Gives back the event `use` holds, if any.
    void recycle(const Use& use) noexcept {
        if (use.holds_event) stock_of(use.backend)->idle.push_back(use.event);
    }

    /// The events of one backend: those not in use, and how many the pool owns (idle, held by
    /// a recorded stream or recorded on a pending block); the idle ones' capacity covers them.
    struct Stock {
        B* backend;
        std::vector<Event> idle;
        std::size_t owned = 0;
    };
    /// Precondition: mutex_ held.
    Stock* stock_of(const B* backend) noexcept {
        for (Stock& stock : stocks_) {
            if (stock.backend == backend) return &stock;
        }
        return nullptr;
    }
    /// True when the pool owns events of `backend` (mutex_ held).
    bool holds_events_of(const B* backend) noexcept {
        const Stock* stock = stock_of(backend);
        return stock != nullptr && stock->owned > 0;
    }

    std::vector<Stock> stocks_;  ///< one per backend whose events the pool made

private:
    void fail_mark(const Use& use, const Cached& entry, const char* what, const Status& failed) noexcept {
        report(Status(failed.code(),
                      message_or_empty("pinned pool ", what, ": recording an event after the work on a ",
                                       entry.block.capacity, "-byte block failed on backend '", use.backend->name(),
                                       "': ", failed.message(), "; synchronizing the device instead")));
    }
};

}  // namespace devstage::detail
