// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the stream-order state of one pipeline slot — the event that marks the end of the
// slot's last enqueued work, the stream it was recorded on, and the event a bind records when
// its run is finished on another stream. Events are created once per slot and re-recorded:
// every use of a slot is ordered after the previous one (same stream, or a stream wait), so
// the latest recording completing implies every earlier one did.
//
// Work is pending from the moment it is enqueued until a wait or a query proves it complete;
// on a backend whose streams are immediate at run time (ImmediateStreamsQuery) it never is, and
// the fence makes no backend call.
// A failed record leaves it pending, unmarked: the next wait, query or stream wait records
// again first. A failed wait leaves it pending too, unless the backend can wait for the whole
// device (SynchronizingBackend) and synchronize() succeeds: then nothing of the slot still runs.

#include "devstage/backend.hpp"
#include "devstage/detail/schedule/immediate.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/stream.hpp"

namespace devstage::detail {

template <class A>
class SlotFence {
public:
    using Stream = typename A::Stream;
    using Event = typename A::Event;
    static constexpr bool immediate = is_immediate_v<A>;

    /// True when work of the slot may still be running.
    bool pending() const noexcept { return pending_; }
    /// The stream the pending work was last recorded on.
    Stream stream() const noexcept { return stream_; }

    /// Creates the slot's two events if it has none yet (before any work is enqueued, so a
    /// later record never needs to allocate).
    Status prepare(A& async) noexcept {
        if constexpr (!immediate) {
            if (!created_ && !streams_immediate(async)) {
                Result<Event> done = async.create_event();
                if (!done) return done.status();
                Result<Event> bound = async.create_event();
                if (!bound) {
                    (void)async.destroy_event(*done);
                    return bound.status();
                }
                done_ = *done;
                bound_ = *bound;
                created_ = true;
            }
        }
        return {};
    }

    /// Marks everything enqueued on `stream` so far as the slot's pending work. When the
    /// record fails the work is pending all the same, and marked again before it is waited for.
    Status record(A& async, Stream stream) noexcept {
        if constexpr (!immediate) {
            if (streams_immediate(async)) return {};  // complete already
            pending_ = true;
            stream_ = stream;
            Status recorded = async.record_event(done_, stream);
            unmarked_ = !recorded.ok();
            return recorded;
        }
        return {};
    }

    /// Makes work enqueued on `stream` from now on wait for the slot's pending work; no-op on
    /// the stream that work was recorded on (stream order already holds) or when none pends.
    Status order_before(A& async, Stream stream) noexcept {
        if (!pending_ || stream == stream_) return {};
        if (Status marked = mark(async); !marked) return marked;
        return async.stream_wait_event(stream, done_);
    }

    /// Makes `later` wait for everything enqueued on `earlier` so far (a run bound on one
    /// stream and finished on another).
    Status join(A& async, Stream earlier, Stream later) noexcept {
        if constexpr (!immediate) {
            if (earlier == later || streams_immediate(async)) return {};
            if (Status recorded = async.record_event(bound_, earlier); !recorded) return recorded;
            return async.stream_wait_event(later, bound_);
        }
        return {};
    }

    /// Blocks the host until everything enqueued on `stream` so far completed (a synchronous
    /// call on a backend with real streams).
    Status drain(A& async, Stream stream, StagerStats& stats) noexcept {
        if constexpr (!immediate) {
            if (streams_immediate(async)) return {};
            if (Status recorded = async.record_event(bound_, stream); !recorded) return recorded;
            ++stats.host_waits;
            return async.synchronize_event(bound_);
        }
        return {};
    }

    /// Asks, without blocking, whether the pending work completed; clears pending if so. A
    /// failed query leaves it pending.
    Result<bool> poll(A& async) noexcept {
        if (!pending_) return true;
        if (Status marked = mark(async); !marked) return marked;
        Result<bool> ready = async.event_ready(done_);
        if (ready && *ready) pending_ = false;
        return ready;
    }

    /// Blocks until the pending work completed. Its failure (the backend's asynchronous error,
    /// if it reports one) is returned. When the slot's event cannot be waited for, the whole
    /// device is (synchronize(), where the backend has it): the work is complete once that
    /// succeeded; otherwise it stays pending, and pending() says so.
    Status wait(A& async, StagerStats& stats) noexcept {
        if (!pending_) return {};
        ++stats.host_waits;
        Status waited = mark(async);
        if (waited.ok()) waited = async.synchronize_event(done_);
        if (waited.ok()) {
            pending_ = false;
            return waited;
        }
        if constexpr (SynchronizingBackend<A>) {
            if (async.synchronize().ok()) pending_ = unmarked_ = false;  // the device is idle
        }
        return waited;
    }

    /// Destroys the events. Precondition: nothing pending.
    Status destroy(A& async) noexcept {
        Status first;
        if constexpr (!immediate) {
            if (created_) {
                first = async.destroy_event(done_);
                Status other = async.destroy_event(bound_);
                if (first.ok()) first = std::move(other);
                created_ = false;
            }
        }
        return first;
    }

    /// Forgets the events and pending work without calling the backend (after a device reset).
    void forget() noexcept {
        created_ = false;
        pending_ = false;
        unmarked_ = false;
    }

private:
    // Records the event again on the pending work's stream after a record failed there.
    Status mark(A& async) noexcept {
        if constexpr (!immediate) {
            if (unmarked_) {
                if (Status recorded = async.record_event(done_, stream_); !recorded) return recorded;
                unmarked_ = false;
            }
        }
        return {};
    }

    Event done_{};
    Event bound_{};
    Stream stream_{};
    bool created_ = false;
    bool pending_ = false;
    bool unmarked_ = false;  // pending work that a failed record left without the event
};

}  // namespace devstage::detail
