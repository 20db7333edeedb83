// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedEvents, the events of a pinned pool's core and the waits on recorded work.
/// The pool's events are kept per backend instance (created once on it, then recorded again
/// for later releases); this part records them after a released block's work, queries and
/// waits for them, and synchronizes the devices when an event fails. Thread-safe: its own
/// mutex guards the idle events only (a leaf lock), and every backend call is made without it.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/stream_types.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The events of a pool's core. With a backend that is not an AsyncBackend no stream is ever
/// recorded, and the calls that record, query or wait for events do not exist.
template <class B>
class PinnedEvents {
public:
    static constexpr bool streams = AsyncBackend<B>;
    using Event = typename PinnedStreamTypes<B>::Event;
    using Stream = typename PinnedStreamTypes<B>::Stream;
    using Use = PinnedUse<B>;
    using Entry = PinnedEntry<B>;

    explicit PinnedEvents(const PinnedSink& sink) noexcept : sink_(&sink) {}
    PinnedEvents(const PinnedEvents&) = delete;
    PinnedEvents& operator=(const PinnedEvents&) = delete;

    std::uint64_t events_created() const noexcept { return events_created_.load(std::memory_order_relaxed); }
    std::uint64_t host_waits() const noexcept { return host_waits_.load(std::memory_order_relaxed); }
    void count_wait() noexcept { host_waits_.fetch_add(1, std::memory_order_relaxed); }

    /// An event of `backend`: an idle one, else a new one. Room for it among the idle events is
    /// reserved first, so giving it back never allocates.
    Result<Event> take(B& backend) noexcept requires streams {
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
        events_created_.fetch_add(1, std::memory_order_relaxed);
        return created;
    }

    /// Destroys an event whose recording failed (its state is unknown).
    void drop(B& backend, Event event) noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            --stock_of(&backend)->owned;
        }
        if (Status destroyed = backend.destroy_event(event); !destroyed) sink_->report(destroyed);
    }

    /// Gives back the event `use` holds, if any (never allocates: take() reserved the room).
    void recycle(const Use& use) noexcept {
        if constexpr (streams) {
            if (!use.holds_event) return;
            std::lock_guard lock(mutex_);
            stock_of(use.backend)->idle.push_back(use.event);
        }
    }
    /// The entry's work completed: its events go back and it is no longer pending.
    void recycle(Entry& entry) noexcept {
        for (const Use& use : entry.uses) recycle(use);
        entry.uses.clear();
        entry.unknown = false;
    }

    /// Destroys the idle events of `only` (of every backend when null); a backend with no
    /// event left out is forgotten. Returns the first failure (each is reported too).
    Status destroy_idle(B* only = nullptr) noexcept requires streams {
        Status first;
        for (;;) {
            Event event{};
            B* backend = nullptr;
            {
                std::lock_guard lock(mutex_);
                for (auto stock = stocks_.begin(); stock != stocks_.end();) {
                    const bool chosen = only == nullptr || stock->backend == only;
                    if (chosen && stock->owned == 0) {
                        stock = stocks_.erase(stock);
                        continue;
                    }
                    if (chosen && !stock->idle.empty()) {
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
                sink_->report(failure);
                if (first.ok()) first = std::move(failure);
            }
        }
    }

    /// True when the pool owns events of `backend`.
    bool holds_events_of(const B* backend) const noexcept {
        std::lock_guard lock(mutex_);
        const Stock* stock = stock_of(backend);
        return stock != nullptr && stock->owned > 0;
    }
    /// The backends the pool owns events of (out of host memory: those it could list).
    std::vector<B*> backends() const noexcept {
        std::vector<B*> out;
        std::lock_guard lock(mutex_);
        (void)try_host_allocation([&] {
            for (const Stock& stock : stocks_) out.push_back(stock.backend);
        });
        return out;
    }

    /// Records an event on each stream of `entry`, on the stream's backend (an event held since
    /// record(), else one of that backend's idle ones, created when none is idle). When one
    /// cannot be had or recorded, the failure is reported and the devices of those streams
    /// synchronized (the host blocks): if that succeeds, the work is complete and the entry no
    /// longer pending; if not (or a backend cannot synchronize), the entry is `unknown` — never
    /// handed out, freed only after a later wait.
    void mark(Entry& entry, const char* what, const std::string& pool_backend) noexcept requires streams {
        bool failed = false;
        for (Use& use : entry.uses) {
            if (!use.holds_event) {
                Result<Event> event = take(*use.backend);
                if (!event) {
                    fail_mark(use, entry, what, event.status());
                    failed = true;
                    continue;
                }
                use.event = *event;
                use.holds_event = true;
            }
            if (const Status recorded = use.backend->record_event(use.event, use.stream); !recorded) {
                drop(*use.backend, use.event);
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
            sink_->report(
                Status(synced.code(),
                       message_or_empty("pinned pool ", what, ": ", synced.message(), "; the ", entry.block.capacity,
                                        "-byte block is kept, never reused, until trim(), finalize() or "
                                        "the pool's destruction can wait for its work (backend '",
                                        pool_backend, "')")));
            return;
        }
        recycle(entry);
    }

    /// True when every event of `entry` completed; never blocks.
    Result<bool> poll(const Entry& entry) noexcept requires streams {
        for (const Use& use : entry.uses) {
            if (!use.recorded) continue;
            Result<bool> ready = use.backend->event_ready(use.event);
            if (!ready || !*ready) return ready;
        }
        return true;
    }

    /// Blocks until the work of `entry` completed: each event is waited on, on its backend;
    /// when that fails or the entry is `unknown`, the devices of its streams are synchronized.
    /// On success the entry's events go back and it is no longer pending.
    Status wait_for(Entry& entry) noexcept requires streams {
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
        recycle(entry);
        return {};
    }

    /// Synchronizes each backend of `entry`'s streams once (only those of uses whose event was
    /// not recorded, when `unrecorded_only`); the first failure.
    Status synchronize_devices(const Entry& entry, bool unrecorded_only) noexcept requires streams {
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

    static Status synchronize_device(B& backend) noexcept requires streams {
        if constexpr (SynchronizingBackend<B>) {
            Status synced = backend.synchronize();
            if (!synced) return Status(synced.code(), message_or_empty("synchronize failed: ", synced.message()));
            return synced;
        } else {
            return Status(Errc::not_supported, message_or_empty("backend '", backend.name(), "' has no synchronize()"));
        }
    }

    /// An event of `backend` recorded on `stream` now and waited for (the host blocks);
    /// synchronize() when that fails. `what` names the operation.
    Status wait_stream(B& backend, Stream stream, const char* what) noexcept requires streams {
        count_wait();
        Result<Event> event = take(backend);
        Status waited = event ? backend.record_event(*event, stream) : event.status();
        if (waited) waited = backend.synchronize_event(*event);
        if (event) recycle(Use{&backend, stream, *event, true, true});
        if (waited) return waited;
        if (Status synced = synchronize_device(backend); !synced) {
            return Status(waited.code(),
                          message_or_empty("pinned pool ", what, ": waiting for a stream of backend '", backend.name(),
                                           "' failed: ", waited.message(), "; then ", synced.message()));
        }
        return {};
    }

private:
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
    const Stock* stock_of(const B* backend) const noexcept {
        for (const Stock& stock : stocks_) {
            if (stock.backend == backend) return &stock;
        }
        return nullptr;
    }

    void fail_mark(const Use& use, const Entry& entry, const char* what, const Status& failed) noexcept {
        sink_->report(
            Status(failed.code(),
                   message_or_empty("pinned pool ", what, ": recording an event after the work on a ",
                                    entry.block.capacity, "-byte block failed on backend '", use.backend->name(),
                                    "': ", failed.message(), "; synchronizing the device instead")));
    }

    const PinnedSink* sink_;
    mutable std::mutex mutex_;   ///< stocks_
    std::vector<Stock> stocks_;  ///< one per backend whose events the pool made
    std::atomic<std::uint64_t> events_created_{0};
    std::atomic<std::uint64_t> host_waits_{0};
};

}  // namespace devstage::detail
