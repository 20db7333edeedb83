// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the deferred-execution engine of a MockBackend. It keeps each stream's queue of
// pending operations (copies, event recordings, waits for a recording, host functions), all
// ordered by one sequence of enqueue times, and runs them: at once in eager mode, or — deferred
// — only when the host synchronizes, and then only what the synchronization depends on (its
// stream up to it, and through waits the recordings on other streams, transitively), in an
// adversarial order: of the streams that can run, the one whose next operation was enqueued
// last goes first. Pending copies make the memory they touch busy for synchronous use. Called
// with the MockBackend's mutex held; a host function runs with it released, on the thread that
// synchronizes.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/detail/mock_recorder.hpp"
#include "devstage/backends/mock_journal.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class MockEngine {
public:
    // One recording of an event: done once its stream ran up to it.
    struct Recording {
        std::uint64_t seq = 0;  // of its record operation
        std::uint32_t stream = 0;
        std::uint32_t polls = 0;  // "not ready" answers given
        bool done = false;
        Status failure;  // the failure of work on its stream before it (sticky until clear_failures)
    };
    // An enqueued operation. `seq` orders every operation of the mock by enqueue time.
    struct Pending {
        MockOp op = MockOp::launch_host_func;
        std::uint64_t seq = 0;
        void* dst = nullptr;
        const void* src = nullptr;
        std::size_t bytes = 0;
        const void* device = nullptr;  // copies: the device side
        const void* host = nullptr;    // copies: the host side
        int value = 0;                 // device_memset_async
        HostFunction function = nullptr;
        void* user_data = nullptr;
        std::vector<KernelAccess> accesses;    // launch_kernel: what the kernel reads and writes
        std::shared_ptr<Recording> recording;  // record_event: completes it; stream_wait_event: waits for it
        Status failure;                        // fail_when_run: reported instead of running
    };
    struct StreamState {
        std::deque<Pending> queue;
        bool running = false;  // its first operation, a host function, runs with the lock released
        Status failure;        // the first failure of work on it (sticky until clear_failures)
    };
    // What a drain must reach: every operation of `stream` up to `seq` has run.
    struct Target {
        std::uint32_t stream;
        std::uint64_t seq;
    };
    /// Which side of pending copies a synchronous use of memory is checked against.
    enum class Side : std::uint8_t { device, host };

    /// `recorder` counts the misuses found; `deferred`: MockConfig::deferred_async.
    MockEngine(MockRecorder& recorder, bool deferred) noexcept : recorder_(recorder), deferred_(deferred) {}
    MockEngine(const MockEngine&) = delete;
    MockEngine& operator=(const MockEngine&) = delete;
    ~MockEngine() = default;

    /// True while a host function of this engine runs on the calling thread.
    bool in_host_function() const noexcept { return host_function_owner() == this; }

    // ---- streams and their queues -----------------------------------------------------------

    /// Throws only std::bad_alloc, before anything changed.
    void add_stream(std::uint32_t id) { streams_.try_emplace(id); }
    /// Forgets the stream and what is still queued on it.
    void remove_stream(std::uint32_t id) noexcept { streams_.erase(id); }
    /// The stream's state, or null when it is unknown.
    StreamState* find_stream(std::uint32_t id) noexcept {
        const auto found = streams_.find(id);
        return found == streams_.end() ? nullptr : &found->second;
    }

    // Enqueues `pending`; returns its sequence number. Throws only std::bad_alloc, before
    // anything changed.
    std::uint64_t push(StreamState& stream, Pending pending) {
        pending.seq = next_seq_ + 1;
        if (pending.op == MockOp::record_event) pending.recording->seq = pending.seq;
        stream.queue.push_back(std::move(pending));
        return ++next_seq_;
    }

    // After an enqueue, which succeeded: eager mode runs the stream up to the new operation
    // now. When host memory runs out ordering that work, it stays pending, as in deferred
    // mode, and runs at the next drain — the enqueue is not reported as refused.
    Status settle(std::unique_lock<std::mutex>& lock, std::uint32_t stream, std::uint64_t seq) noexcept {
        if (!deferred_) (void)drain(lock, Target{stream, seq}, true);
        return {};
    }

    // Runs pending work until `target` is reached (nullopt: until none is left). Whenever
    // several streams can run, the one whose next operation was enqueued last goes first.
    // Waits for host functions that other threads run, unless `may_wait` is false: then it
    // returns early and the caller checks what was reached.
    Status drain(std::unique_lock<std::mutex>& lock, std::optional<Target> target, bool may_wait) noexcept {
        std::map<std::uint32_t, std::uint64_t> bounds;
        if (target && !without_bad_alloc([&] { bounds_for(*target, bounds); })) {
            return Status(Errc::out_of_memory, "mock: host memory exhausted ordering pending work");
        }
        for (;;) {
            if (target ? reached(*target) : all_ran()) return {};
            StreamState* next = nullptr;
            std::uint64_t latest = 0;
            bool running = false;
            for (auto& [id, stream] : streams_) {
                running = running || stream.running;
                if (stream.running || stream.queue.empty()) continue;
                const Pending& head = stream.queue.front();
                if (target) {
                    const auto bound = bounds.find(id);
                    if (bound == bounds.end() || head.seq > bound->second) continue;
                }
                if (head.op == MockOp::stream_wait_event && !head.recording->done) continue;
                if (head.seq > latest) {
                    latest = head.seq;
                    next = &stream;
                }
            }
            if (next != nullptr) {
                run_head(lock, *next);
            } else if (!running) {
                // Unreachable: a wait names a recording enqueued before it, so some stream can run.
                return Status(Errc::backend_failure, "mock: pending work cannot make progress");
            } else if (may_wait) {
                progress_.wait(lock);
            } else {
                return {};
            }
        }
    }

    /// The first failure of enqueued work since the previous call, and forgets it.
    Status take_failure() noexcept { return std::exchange(async_failure_, Status()); }
    /// Disarms the failures armed on enqueued work that has not run yet.
    void disarm() noexcept {
        for (auto& [id, stream] : streams_) {
            for (Pending& pending : stream.queue) pending.failure = {};
        }
    }
    /// Forgets the failures of work that already ran: later recordings are clean again
    /// (recordings already completed keep what they report).
    void clear_failures() noexcept {
        for (auto& [id, stream] : streams_) stream.failure = {};
        async_failure_ = {};
    }

    // ---- synchronous use of memory ----------------------------------------------------------

    /// A synchronous touch of memory: busy when pending work uses it, unless a host function
    /// (itself stream work) makes it.
    Status not_pending(MockOp op, const void* pointer, std::size_t bytes, Side side) noexcept {
        if (in_host_function()) return {};
        return used_by_pending(op, pointer, bytes, side);
    }

    /// Busy when a pending copy's `side` (or a pending memset, on the device side) overlaps
    /// [pointer, pointer + bytes).
    Status used_by_pending(MockOp op, const void* pointer, std::size_t bytes, Side side) noexcept {
        const auto begin = reinterpret_cast<std::uintptr_t>(pointer);
        for (const auto& [id, stream] : streams_) {
            for (const Pending& pending : stream.queue) {
                if (const KernelAccess* access = touched_by(pending, pointer, bytes); access != nullptr) {
                    return recorder_.misuse(
                        Errc::busy, message("mock ", to_string(op), ": ", bytes, " bytes at ", pointer,
                                            " are used by a pending kernel (it ", access->writes ? "writes " : "reads ",
                                            access->bytes, " bytes at ", access->device, ") on stream ", id));
                }
                const bool memset = pending.op == MockOp::device_memset_async;
                if (pending.op != MockOp::copy_to_device_async && pending.op != MockOp::copy_from_device_async &&
                    !(memset && side == Side::device)) {
                    continue;
                }
                const auto other =
                    reinterpret_cast<std::uintptr_t>(side == Side::device ? pending.device : pending.host);
                if (begin < other + pending.bytes && other < begin + bytes) {
                    return recorder_.misuse(Errc::busy, message("mock ", to_string(op), ": ", bytes, " bytes at ",
                                                                pointer, " are used by pending ", to_string(pending.op),
                                                                " of ", pending.bytes, " bytes on stream ", id));
                }
            }
        }
        return {};
    }

    /// Deferred mode only (eager: ok at once, nothing is looked at): the host side of a copy
    /// `op` of `bytes` at `host` — an enqueue on `stream`, or a synchronous copy (no stream) —
    /// against the pending copies it is not ordered after. Busy (a misuse) when it reads host
    /// memory such a copy will still write (read after write), or writes host memory such a
    /// copy will still read (write after read) or write (write after write). An enqueue is
    /// ordered after its stream's earlier work and, through the stream_wait_event calls
    /// pending on it, after the recordings they wait for (transitively); a synchronous copy is
    /// ordered after nothing pending. Unless two ranges overlap, this costs one pass over the
    /// pending operations of the other streams, and allocates nothing.
    Status host_hazard(MockOp op, std::optional<std::uint32_t> stream, const void* host, std::size_t bytes) noexcept {
        if (!deferred_ || bytes == 0 || (!stream && in_host_function())) return {};
        const bool writes = op == MockOp::copy_from_device || op == MockOp::copy_from_device_async;
        const auto begin = reinterpret_cast<std::uintptr_t>(host);
        const std::uintptr_t end = begin + bytes;
        std::map<std::uint32_t, std::uint64_t> ordered;  // made at the first overlap only
        bool ordering_known = false;
        for (const auto& [id, queue] : streams_) {
            if (stream && id == *stream) continue;  // its own stream's earlier work runs first
            for (const Pending& pending : queue.queue) {
                const bool pending_writes = pending.op == MockOp::copy_from_device_async;
                if (!pending_writes && pending.op != MockOp::copy_to_device_async) continue;
                if (!writes && !pending_writes) continue;  // two reads never conflict
                const auto other = reinterpret_cast<std::uintptr_t>(pending.host);
                if (other >= end || begin >= other + pending.bytes) continue;
                if (stream) {
                    if (!ordering_known) {
                        const Target all{*stream, std::numeric_limits<std::uint64_t>::max()};
                        if (!without_bad_alloc([&] { bounds_for(all, ordered); })) {
                            return Status(
                                Errc::out_of_memory,
                                message("mock ", to_string(op), ": host memory exhausted ordering pending work"));
                        }
                        ordering_known = true;
                    }
                    const auto bound = ordered.find(id);
                    if (bound != ordered.end() && pending.seq <= bound->second) continue;
                }
                return recorder_.misuse(Errc::busy, hazard_message(op, stream, host, bytes, writes, id, pending));
            }
        }
        return {};
    }

    /// Deferred mode only: the host is about to read (`writes` false) or write `bytes` at `host`
    /// with its own code (MockBackend::check_host_access). Busy (a misuse) when a pending
    /// kernel writes that memory, or reads it and the host writes; or when a pending copy's host
    /// side conflicts the same way (a copy from the device writes host memory, one to it reads).
    /// A host function's own accesses are stream work, never hazards.
    Status host_access_hazard(const void* host, std::size_t bytes, bool writes) noexcept {
        if (!deferred_ || bytes == 0 || in_host_function()) return {};
        for (const auto& [id, queue] : streams_) {
            for (const Pending& pending : queue.queue) {
                const KernelAccess* access = touched_by(pending, host, bytes);
                const bool copy_writes = pending.op == MockOp::copy_from_device_async;
                const bool copy = copy_writes || pending.op == MockOp::copy_to_device_async;
                if (access == nullptr && !(copy && overlap_of(pending.host, pending.bytes, host, bytes))) continue;
                const bool pending_writes = access != nullptr ? access->writes : copy_writes;
                if (!writes && !pending_writes) continue;  // two reads never conflict
                const char* kind = !writes          ? "read after write"
                                   : pending_writes ? "write after write"
                                                    : "write after read";
                return recorder_.misuse(
                    Errc::busy,
                    message("mock check_host_access: ", kind, ": the host ", writes ? "writes " : "reads ", bytes,
                            " bytes at ", host, ", which ",
                            access != nullptr ? message("a pending kernel on stream ", id, " will still ",
                                                        access->writes ? "write" : "read", " (", access->bytes,
                                                        " bytes at ", access->device, ")")
                                              : message("pending ", to_string(pending.op), " of ", pending.bytes,
                                                        " bytes on stream ", id, " (host ", pending.host,
                                                        ") will still ", copy_writes ? "write" : "read")));
            }
        }
        return {};
    }

    // ---- observation ------------------------------------------------------------------------
    std::size_t live_streams() const noexcept { return streams_.size(); }
    /// Enqueued operations that have not run yet.
    std::size_t pending_operations() const noexcept {
        std::size_t pending = 0;
        for (const auto& [id, stream] : streams_) pending += stream.queue.size();
        return pending;
    }
    /// Appends one line per stream never destroyed to `report`.
    void report_leaks(std::string& report) const {
        for (const auto& [id, stream] : streams_) {
            report += message("mock: leaked stream ", id, " with ", stream.queue.size(), " operations pending\n");
        }
    }

private:
    static bool overlap_of(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
        const auto x = reinterpret_cast<std::uintptr_t>(a);
        const auto y = reinterpret_cast<std::uintptr_t>(b);
        return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
    }
    // The first access of a pending kernel that overlaps [pointer, pointer + bytes), or null.
    static const KernelAccess* touched_by(const Pending& pending, const void* pointer, std::size_t bytes) noexcept {
        for (const KernelAccess& access : pending.accesses) {
            if ((access.reads || access.writes) && overlap_of(access.device, access.bytes, pointer, bytes))
                return &access;
        }
        return nullptr;
    }

    // The engine whose host function runs on this thread, if any.
    static const MockEngine*& host_function_owner() noexcept {
        thread_local const MockEngine* owner = nullptr;
        return owner;
    }

    static std::string hazard_message(MockOp op, std::optional<std::uint32_t> stream, const void* host,
                                      std::size_t bytes, bool writes, std::uint32_t other_stream,
                                      const Pending& pending) noexcept {
        const bool pending_writes = pending.op == MockOp::copy_from_device_async;
        const auto* first = static_cast<const std::byte*>(host);
        const auto* other = static_cast<const std::byte*>(pending.host);
        const void* overlap_begin = std::max(first, other);
        const void* overlap_end = std::min(first + bytes, other + pending.bytes);
        const char* kind = !writes ? "read after write" : pending_writes ? "write after write" : "write after read";
        return message("mock ", to_string(op), stream ? message(" on stream ", *stream) : std::string(), ": ", kind,
                       " on host [", overlap_begin, ", ", overlap_end, "): it ", writes ? "writes" : "reads", " host [",
                       host, ", ", static_cast<const void*>(first + bytes), ") (", bytes, " bytes), which pending ",
                       to_string(pending.op), " of ", pending.bytes, " bytes on stream ", other_stream, " (host [",
                       pending.host, ", ", static_cast<const void*>(other + pending.bytes), ")) will still ",
                       pending_writes ? "write" : "read",
                       stream ? ", and no stream wait orders it after that copy" : ", and it runs before that copy");
    }

    bool reached(const Target& target) const noexcept {
        const auto found = streams_.find(target.stream);
        return found == streams_.end() || found->second.queue.empty() || found->second.queue.front().seq > target.seq;
    }
    bool all_ran() const noexcept {
        return std::all_of(streams_.begin(), streams_.end(),
                           [](const auto& entry) { return entry.second.queue.empty(); });
    }

    // How far each stream must run for `target`: its stream up to it, and through the waits
    // on the way, the recordings they wait for, transitively.
    void bounds_for(const Target& target, std::map<std::uint32_t, std::uint64_t>& bounds) const {
        bounds[target.stream] = target.seq;
        for (bool grew = true; grew;) {
            grew = false;
            for (const auto& [id, stream] : streams_) {
                const auto bound = bounds.find(id);
                if (bound == bounds.end()) continue;
                const std::uint64_t limit = bound->second;
                for (const Pending& pending : stream.queue) {
                    if (pending.seq > limit) break;
                    if (pending.op != MockOp::stream_wait_event || pending.recording->done) continue;
                    const auto [needed, added] = bounds.try_emplace(pending.recording->stream, pending.recording->seq);
                    if (added || needed->second < pending.recording->seq) {
                        needed->second = std::max(needed->second, pending.recording->seq);
                        grew = true;
                    }
                }
            }
        }
    }

    void run_head(std::unique_lock<std::mutex>& lock, StreamState& stream) noexcept {
        Pending& head = stream.queue.front();
        if (!head.failure.ok()) {
            if (stream.failure.ok()) stream.failure = head.failure;
            if (async_failure_.ok()) async_failure_ = head.failure;
        } else if (head.op == MockOp::copy_to_device_async || head.op == MockOp::copy_from_device_async) {
            std::memcpy(head.dst, head.src, head.bytes);
        } else if (head.op == MockOp::device_memset_async) {
            std::memset(head.dst, head.value, head.bytes);
        } else if (head.op == MockOp::record_event) {
            head.recording->failure = stream.failure;  // sticky: every later recording reports it
            head.recording->done = true;
        } else if (head.op == MockOp::stream_wait_event) {
            // Work after the wait depends on the failed work: the stream inherits its failure.
            if (stream.failure.ok()) stream.failure = head.recording->failure;
        } else if (head.op == MockOp::launch_host_func || head.op == MockOp::launch_kernel) {
            const HostFunction function = head.function;
            void* user_data = head.user_data;
            stream.running = true;
            lock.unlock();
            const MockEngine* outer = std::exchange(host_function_owner(), this);
            function(user_data);
            host_function_owner() = outer;
            lock.lock();
            stream.running = false;
        }
        stream.queue.pop_front();
        progress_.notify_all();
    }

    MockRecorder& recorder_;
    const bool deferred_;
    std::condition_variable progress_;  // a host function run with the lock released returned
    std::map<std::uint32_t, StreamState> streams_;
    std::uint64_t next_seq_ = 0;
    Status async_failure_;  // the first failure of enqueued work since the last synchronize()
};

}  // namespace devstage::detail
