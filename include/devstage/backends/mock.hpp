// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// MockBackend: a backend for tests — ours and our users'. Plain host memory behind device
/// pointers (data round-trips can be checked), a journal of every call, per-operation
/// counters, fault injection, configurable returned alignment (including adversarial
/// offsets), and detection of double free, unknown pointers, out-of-bounds copies and leaks.
/// Its streams run work at the call, or — `MockConfig::deferred_async` — only when the host
/// synchronizes, in an adversarial order: a race detector for stream-ordered code.

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/address_map.hpp"
#include "devstage/detail/align.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// The operations a MockBackend journals and counts.
enum class MockOp : std::uint8_t {
    device_malloc,
    device_free,
    copy_to_device,
    copy_from_device,
    pinned_malloc,
    pinned_free,
    device_memset,
    synchronize,
    create_stream,
    destroy_stream,
    copy_to_device_async,
    copy_from_device_async,
    create_event,
    destroy_event,
    record_event,
    event_ready,
    synchronize_event,
    stream_wait_event,
    launch_host_func,
};
inline constexpr std::size_t mock_op_count = 19;

constexpr std::string_view to_string(MockOp op) noexcept {
    constexpr std::array<std::string_view, mock_op_count> names{
        "device_malloc",     "device_free",       "copy_to_device",       "copy_from_device",
        "pinned_malloc",     "pinned_free",       "device_memset",        "synchronize",
        "create_stream",     "destroy_stream",    "copy_to_device_async", "copy_from_device_async",
        "create_event",      "destroy_event",     "record_event",         "event_ready",
        "synchronize_event", "stream_wait_event", "launch_host_func"};
    return names[static_cast<std::size_t>(op)];
}

/// One journaled call: what, on which pointer (the result, for allocations; the device side,
/// for copies; the user data, for host functions), how many bytes, how it ended, and the
/// stream and event it named (0: none).
struct MockCall {
    MockOp op;
    const void* pointer;
    std::size_t bytes;
    Errc result;
    std::uint32_t stream = 0;
    std::uint32_t event = 0;
};

/// Construction options of a MockBackend. `MockBackend mock(MockConfig::adversarial());`
struct MockConfig {
    /// Returned pointers are a 4096-aligned block plus this offset. The default 0 gives
    /// page alignment; `device_alignment` (64) gives pointers aligned to exactly 64 and not
    /// 128; an offset that is not a multiple of 64 breaks the backend's own promise, to test
    /// that callers check it.
    std::size_t offset = 0;
    std::size_t device_capacity = std::numeric_limits<std::size_t>::max();
    bool journal = true;
    ErrorSink sink{};  ///< where the leak report goes on destruction
    /// Enqueued work runs only when the host synchronizes, in an adversarial order across
    /// streams (see MockBackend). False: it runs at the enqueuing call.
    bool deferred_async = false;
    /// With deferred_async: event_ready answers "not ready" this many times per recording,
    /// then runs what the recording depends on and answers ready.
    std::uint32_t not_ready_polls = 2;

    static MockConfig adversarial() noexcept { return MockConfig{.offset = 64}; }
};

/// The test backend. Thread-safe. `MockBackend mock; mock.fail_call(MockOp::device_malloc, 2);`
///
/// Streams and events: by default enqueued work runs at the call and an event is ready once
/// recorded. With `MockConfig::deferred_async` work runs only when the host synchronizes:
/// synchronize_event runs exactly what the event's recording depends on (its stream up to
/// it, and through stream_wait_event the recordings on other streams it waits for),
/// synchronize() runs everything, and event_ready does the same after answering "not ready"
/// `not_ready_polls` times. Whenever several streams have runnable work, the one whose next
/// operation was enqueued last runs first. Freeing, or synchronously copying or setting,
/// memory that pending work touches is Errc::busy. Host functions run on the thread that
/// synchronizes, with no lock held: they may call the mock's allocation, copy and memset
/// operations (their copies are stream work, never busy); a stream or event operation, or
/// synchronize(), from a host function is invalid_argument.
class MockBackend {
public:
    static constexpr std::size_t device_alignment = 64;

    /// A stream of the mock. Ids are never reused.
    struct Stream {
        std::uint32_t id = 0;
        friend bool operator==(Stream, Stream) = default;
    };
    /// An event of the mock. Ids are never reused.
    struct Event {
        std::uint32_t id = 0;
        friend bool operator==(Event, Event) = default;
    };

    MockBackend() noexcept : MockBackend(MockConfig{}) {}
    explicit MockBackend(MockConfig config) noexcept : config_(config) {}
    MockBackend(const MockBackend&) = delete;
    MockBackend& operator=(const MockBackend&) = delete;
    /// Reports allocations, streams and events never freed to the sink, then frees them.
    /// Work still pending never runs.
    ~MockBackend() {
        const std::string leaks = leak_report();
        if (!leaks.empty()) config_.sink(Status(Errc::leaked, leaks));
        const auto free_block = [](void*, const auto& entry) { std::free(entry.info); };
        device_.for_each(free_block);
        pinned_.for_each(free_block);
    }

    std::string_view name() const noexcept { return "mock"; }

    Result<void*> device_malloc(std::size_t bytes) noexcept { return allocate(MockOp::device_malloc, device_, bytes); }
    /// Busy while pending work touches the allocation.
    Status device_free(void* pointer) noexcept { return deallocate(MockOp::device_free, device_, pointer); }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept { return allocate(MockOp::pinned_malloc, pinned_, bytes); }
    /// Busy while pending work touches the allocation.
    Status pinned_free(void* pointer) noexcept { return deallocate(MockOp::pinned_free, pinned_, pointer); }

    /// Busy when the device range overlaps pending work (except from a host function).
    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        return transfer(MockOp::copy_to_device, device_dst, device_dst, host_src, bytes);
    }
    /// Busy when the device range overlaps pending work (except from a host function).
    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        return transfer(MockOp::copy_from_device, device_src, host_dst, device_src, bytes);
    }
    /// Busy when the device range overlaps pending work (except from a host function).
    Status device_memset(void* device_dst, int value, std::size_t bytes) noexcept {
        constexpr MockOp op = MockOp::device_memset;
        std::lock_guard lock(mutex_);
        if (Status injected = begin(op); !injected) return finish(op, device_dst, bytes, std::move(injected));
        if (bytes > 0 && !device_.contains(device_dst, bytes)) {
            return finish(op, device_dst, bytes,
                          misuse(Errc::invalid_argument, detail::message("mock device_memset: ", bytes, " bytes at ",
                                                                         static_cast<const void*>(device_dst),
                                                                         " run outside every device allocation")));
        }
        if (bytes > 0) {
            if (Status clear = not_pending(op, device_dst, bytes, Side::device); !clear) {
                return finish(op, device_dst, bytes, std::move(clear));
            }
            std::memset(device_dst, value, bytes);
        }
        return finish(op, device_dst, bytes, {});
    }
    /// Runs all pending work; reports the first failure of enqueued work that ran since the
    /// previous synchronize() (see fail_when_run).
    Status synchronize() noexcept {
        constexpr MockOp op = MockOp::synchronize;
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused) return finish(op, nullptr, 0, std::move(refused));
        if (Status drained = drain(lock, std::nullopt, true); !drained) return finish(op, nullptr, 0, drained);
        return finish(op, nullptr, 0, std::exchange(async_failure_, Status()));
    }

    // ---- streams and events -----------------------------------------------------------
    Result<Stream> create_stream() noexcept {
        constexpr MockOp op = MockOp::create_stream;
        std::lock_guard lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused) return finish(op, nullptr, 0, std::move(refused));
        const Stream stream{next_stream_ + 1};
        if (!detail::without_bad_alloc([&] { streams_.try_emplace(stream.id); })) {
            return finish(op, nullptr, 0, host_exhausted(op));
        }
        next_stream_ = stream.id;
        (void)finish(op, nullptr, 0, {}, stream.id);
        return stream;
    }

    /// Runs the stream's pending work (and what it waits for), then forgets the stream.
    Status destroy_stream(Stream stream) noexcept {
        constexpr MockOp op = MockOp::destroy_stream;
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused)
            return finish(op, nullptr, 0, std::move(refused), stream.id);
        if (streams_.count(stream.id) == 0) return finish(op, nullptr, 0, unknown_stream(op, stream), stream.id);
        Status drained = drain(lock, Target{stream.id, std::numeric_limits<std::uint64_t>::max()}, true);
        if (drained) streams_.erase(stream.id);
        return finish(op, nullptr, 0, std::move(drained), stream.id);
    }

    /// Checked at the call (device range inside one allocation, host pointer non-null; zero
    /// bytes is a no-op), then enqueued on `stream`.
    Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, Stream stream) noexcept {
        return enqueue_copy(MockOp::copy_to_device_async, device_dst, device_dst, host_src, host_src, bytes, stream);
    }
    /// As copy_to_device_async, the other way.
    Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes, Stream stream) noexcept {
        return enqueue_copy(MockOp::copy_from_device_async, device_src, host_dst, device_src, host_dst, bytes, stream);
    }

    Result<Event> create_event() noexcept {
        constexpr MockOp op = MockOp::create_event;
        std::lock_guard lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused) return finish(op, nullptr, 0, std::move(refused));
        const Event event{next_event_ + 1};
        if (!detail::without_bad_alloc([&] { events_.try_emplace(event.id); })) {
            return finish(op, nullptr, 0, host_exhausted(op));
        }
        next_event_ = event.id;
        (void)finish(op, nullptr, 0, {}, 0, event.id);
        return event;
    }

    /// Work already waiting for the event's recording still waits for it.
    Status destroy_event(Event event) noexcept {
        constexpr MockOp op = MockOp::destroy_event;
        std::lock_guard lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused)
            return finish(op, nullptr, 0, std::move(refused), 0, event.id);
        if (events_.erase(event.id) == 0) return finish(op, nullptr, 0, unknown_event(op, event), 0, event.id);
        return finish(op, nullptr, 0, {}, 0, event.id);
    }

    /// The event completes when `stream` reaches this point; it then reports the first
    /// failure of work that ran on `stream` since its previous recording.
    Status record_event(Event event, Stream stream) noexcept {
        constexpr MockOp op = MockOp::record_event;
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused) {
            return finish(op, nullptr, 0, std::move(refused), stream.id, event.id);
        }
        const auto recorded = events_.find(event.id);
        if (recorded == events_.end()) return finish(op, nullptr, 0, unknown_event(op, event), stream.id, event.id);
        const auto target = streams_.find(stream.id);
        if (target == streams_.end()) return finish(op, nullptr, 0, unknown_stream(op, stream), stream.id, event.id);
        std::shared_ptr<Recording> recording;
        std::uint64_t seq = 0;
        if (!detail::without_bad_alloc([&] {
                recording = std::make_shared<Recording>();
                recording->stream = stream.id;
                seq = push(target->second, Pending{.op = op, .recording = recording, .failure = {}});
            })) {
            return finish(op, nullptr, 0, host_exhausted(op), stream.id, event.id);
        }
        recorded->second = std::move(recording);
        (void)finish(op, nullptr, 0, {}, stream.id, event.id);
        return settle(lock, stream, seq);
    }

    /// Never blocks on other threads. Deferred: "not ready" not_ready_polls times per
    /// recording, then runs what the recording depends on. A failure of the work the
    /// recording covers is returned as the error.
    Result<bool> event_ready(Event event) noexcept {
        constexpr MockOp op = MockOp::event_ready;
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused)
            return finish(op, nullptr, 0, std::move(refused), 0, event.id);
        const auto recorded = events_.find(event.id);
        if (recorded == events_.end()) return finish(op, nullptr, 0, unknown_event(op, event), 0, event.id);
        const std::shared_ptr<Recording> recording = recorded->second;
        if (recording != nullptr && !recording->done) {
            if (recording->polls < config_.not_ready_polls) {
                ++recording->polls;
                (void)finish(op, nullptr, 0, {}, 0, event.id);
                return false;
            }
            if (Status drained = drain(lock, Target{recording->stream, recording->seq}, false); !drained) {
                return finish(op, nullptr, 0, std::move(drained), 0, event.id);
            }
        }
        const bool ready = recording == nullptr || recording->done;
        Status reported =
            finish(op, nullptr, 0, ready && recording != nullptr ? recording->failure : Status(), 0, event.id);
        if (!reported) return reported;
        return ready;
    }

    /// Runs what the event's latest recording depends on; reports the failure it covers.
    Status synchronize_event(Event event) noexcept {
        constexpr MockOp op = MockOp::synchronize_event;
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused)
            return finish(op, nullptr, 0, std::move(refused), 0, event.id);
        const auto recorded = events_.find(event.id);
        if (recorded == events_.end()) return finish(op, nullptr, 0, unknown_event(op, event), 0, event.id);
        const std::shared_ptr<Recording> recording = recorded->second;
        if (recording == nullptr) return finish(op, nullptr, 0, {}, 0, event.id);
        if (Status drained = drain(lock, Target{recording->stream, recording->seq}, true); !drained) {
            return finish(op, nullptr, 0, std::move(drained), 0, event.id);
        }
        return finish(op, nullptr, 0, recording->failure, 0, event.id);
    }

    /// Later work on `stream` waits for the event's recording as of this call.
    Status stream_wait_event(Stream stream, Event event) noexcept {
        constexpr MockOp op = MockOp::stream_wait_event;
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused) {
            return finish(op, nullptr, 0, std::move(refused), stream.id, event.id);
        }
        const auto recorded = events_.find(event.id);
        if (recorded == events_.end()) return finish(op, nullptr, 0, unknown_event(op, event), stream.id, event.id);
        const auto target = streams_.find(stream.id);
        if (target == streams_.end()) return finish(op, nullptr, 0, unknown_stream(op, stream), stream.id, event.id);
        if (recorded->second == nullptr || recorded->second->done)
            return finish(op, nullptr, 0, {}, stream.id, event.id);
        std::uint64_t seq = 0;
        if (!detail::without_bad_alloc(
                [&] { seq = push(target->second, Pending{.op = op, .recording = recorded->second, .failure = {}}); })) {
            return finish(op, nullptr, 0, host_exhausted(op), stream.id, event.id);
        }
        (void)finish(op, nullptr, 0, {}, stream.id, event.id);
        return settle(lock, stream, seq);
    }

    /// Enqueues `function(user_data)` on `stream`.
    Status launch_host_func(Stream stream, HostFunction function, void* user_data) noexcept {
        constexpr MockOp op = MockOp::launch_host_func;
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused)
            return finish(op, user_data, 0, std::move(refused), stream.id);
        const std::uint64_t call = calls_[index(op)];
        const auto target = streams_.find(stream.id);
        if (target == streams_.end()) return finish(op, user_data, 0, unknown_stream(op, stream), stream.id);
        if (function == nullptr) {
            return finish(op, user_data, 0,
                          misuse(Errc::invalid_argument, detail::message("mock launch_host_func: null function")),
                          stream.id);
        }
        std::uint64_t seq = 0;
        if (!detail::without_bad_alloc([&] {
                seq = push(target->second, Pending{.op = op,
                                                   .function = function,
                                                   .user_data = user_data,
                                                   .recording = {},
                                                   .failure = failure_when_run(op, call, stream)});
            })) {
            return finish(op, user_data, 0, host_exhausted(op), stream.id);
        }
        (void)finish(op, user_data, 0, {}, stream.id);
        return settle(lock, stream, seq);
    }

    /// Where the leak report goes on destruction.
    void set_error_sink(ErrorSink sink) noexcept {
        std::lock_guard lock(mutex_);
        config_.sink = sink;
    }

    // ---- fault injection --------------------------------------------------------------
    /// Makes the k-th call (1-based, counted from construction) of `op` fail with `code`.
    void fail_call(MockOp op, std::uint64_t k, Errc code = Errc::backend_failure) noexcept {
        std::lock_guard lock(mutex_);
        faults_[index(op)] = Fault{k, k, code};
    }
    /// Makes the k-th call of `op` and every later one fail with `code`.
    void fail_from(MockOp op, std::uint64_t k, Errc code = Errc::backend_failure) noexcept {
        std::lock_guard lock(mutex_);
        faults_[index(op)] = Fault{k, std::numeric_limits<std::uint64_t>::max(), code};
    }
    /// Makes the k-th call of `op` — copy_to_device_async, copy_from_device_async or
    /// launch_host_func; other operations ignore it — succeed, then fail with `code` when it
    /// runs: no byte moves, no function is called. The failure is reported by the next
    /// recording on that stream (synchronize_event, event_ready) and by synchronize().
    void fail_when_run(MockOp op, std::uint64_t k, Errc code = Errc::backend_failure) noexcept {
        std::lock_guard lock(mutex_);
        run_faults_[index(op)] = Fault{k, k, code};
    }
    void clear_faults() noexcept {
        std::lock_guard lock(mutex_);
        faults_ = {};
        run_faults_ = {};
    }

    // ---- observation ------------------------------------------------------------------
    /// Calls of `op` so far, failed ones included.
    std::uint64_t calls(MockOp op) const noexcept {
        std::lock_guard lock(mutex_);
        return calls_[index(op)];
    }
    /// Calls of every operation so far.
    std::uint64_t total_calls() const noexcept {
        std::lock_guard lock(mutex_);
        std::uint64_t total = 0;
        for (std::uint64_t n : calls_) total += n;
        return total;
    }
    std::vector<MockCall> journal() const {
        std::lock_guard lock(mutex_);
        return journal_;
    }
    void clear_journal() noexcept {
        std::lock_guard lock(mutex_);
        journal_.clear();
    }
    std::size_t live_device_allocations() const noexcept {
        std::lock_guard lock(mutex_);
        return device_.size();
    }
    std::size_t live_device_bytes() const noexcept {
        std::lock_guard lock(mutex_);
        return device_bytes_;
    }
    std::size_t live_pinned_allocations() const noexcept {
        std::lock_guard lock(mutex_);
        return pinned_.size();
    }
    std::size_t live_streams() const noexcept {
        std::lock_guard lock(mutex_);
        return streams_.size();
    }
    std::size_t live_events() const noexcept {
        std::lock_guard lock(mutex_);
        return events_.size();
    }
    /// Enqueued operations that have not run yet (copies, recordings, waits, host functions).
    std::size_t pending_operations() const noexcept {
        std::lock_guard lock(mutex_);
        std::size_t pending = 0;
        for (const auto& [id, stream] : streams_) pending += stream.queue.size();
        return pending;
    }
    /// True when [pointer, pointer + bytes) lies in one live device allocation.
    bool is_device(const void* pointer, std::size_t bytes = 1) const noexcept {
        std::lock_guard lock(mutex_);
        return device_.contains(pointer, bytes);
    }
    /// Misuses detected so far: double frees, unknown pointers, handles and streams,
    /// out-of-bounds copies, memory used by pending work.
    std::uint64_t misuses() const noexcept {
        std::lock_guard lock(mutex_);
        return misuses_;
    }
    /// One line per allocation, stream or event never freed; empty when there is none.
    std::string leak_report() const {
        std::lock_guard lock(mutex_);
        std::string report;
        const auto describe = [&report](std::string_view kind, const auto& map) {
            map.for_each([&](void* base, const auto& entry) {
                (void)base;
                report += detail::message("mock: leaked ", kind, " allocation of ", entry.bytes, " bytes\n");
            });
        };
        describe("device", device_);
        describe("pinned", pinned_);
        for (const auto& [id, stream] : streams_) {
            report +=
                detail::message("mock: leaked stream ", id, " with ", stream.queue.size(), " operations pending\n");
        }
        for (const auto& [id, recording] : events_) report += detail::message("mock: leaked event ", id, "\n");
        if (!report.empty()) report.pop_back();
        return report;
    }

private:
    struct Fault {
        std::uint64_t first = 0, last = 0;  // 0: none
        Errc code = Errc::backend_failure;
    };
    using Blocks = detail::AddressMap<void*>;  // info: the block to std::free

    // One recording of an event: done once its stream ran up to it.
    struct Recording {
        std::uint64_t seq = 0;  // of its record operation
        std::uint32_t stream = 0;
        std::uint32_t polls = 0;  // "not ready" answers given
        bool done = false;
        Status failure;  // the first failure of work on its stream since the previous recording
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
        HostFunction function = nullptr;
        void* user_data = nullptr;
        std::shared_ptr<Recording> recording;  // record_event: completes it; stream_wait_event: waits for it
        Status failure;                        // fail_when_run: reported instead of running
    };
    struct StreamState {
        std::deque<Pending> queue;
        bool running = false;  // its first operation, a host function, runs with the lock released
        Status failure;        // the first failure since its last recording
    };
    // What a drain must reach: every operation of `stream` up to `seq` has run.
    struct Target {
        std::uint32_t stream;
        std::uint64_t seq;
    };
    enum class Side : std::uint8_t { device, host };

    static constexpr std::size_t index(MockOp op) noexcept { return static_cast<std::size_t>(op); }

    // The mock whose host function runs on this thread, if any.
    static const MockBackend*& host_function_owner() noexcept {
        thread_local const MockBackend* owner = nullptr;
        return owner;
    }
    bool in_host_function() const noexcept { return host_function_owner() == this; }

    // Counts the call; returns the injected failure if this call is one.
    Status begin(MockOp op) noexcept {
        const std::uint64_t n = ++calls_[index(op)];
        const Fault& fault = faults_[index(op)];
        if (fault.first != 0 && n >= fault.first && n <= fault.last) {
            return Status(fault.code, detail::message("mock ", to_string(op), ": injected failure of call ", n));
        }
        return {};
    }
    // begin(), and the refusal of a stream or event operation from a host function.
    Status begin_stream_op(MockOp op) noexcept {
        if (Status injected = begin(op); !injected) return injected;
        if (in_host_function()) {
            return misuse(Errc::invalid_argument,
                          detail::message("mock ", to_string(op),
                                          ": called from a host function, where only allocation, copy and memset "
                                          "calls are allowed"));
        }
        return {};
    }
    Status finish(MockOp op, const void* pointer, std::size_t bytes, Status status, std::uint32_t stream = 0,
                  std::uint32_t event = 0) noexcept {
        if (config_.journal) {
            // A journal entry the host cannot store is dropped; the call's outcome stands.
            (void)detail::without_bad_alloc([&] {
                journal_.push_back(MockCall{op, pointer, bytes, status.code(), stream, event});
            });
        }
        return status;
    }
    Status misuse(Errc code, std::string message) noexcept {
        ++misuses_;
        return Status(code, std::move(message));
    }
    static Status host_exhausted(MockOp op) noexcept {
        return Status(Errc::out_of_memory, detail::message("mock ", to_string(op), ": host memory exhausted"));
    }
    Status unknown_stream(MockOp op, Stream stream) noexcept {
        return misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": unknown stream ", stream.id));
    }
    Status unknown_event(MockOp op, Event event) noexcept {
        return misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": unknown event ", event.id));
    }
    Status failure_when_run(MockOp op, std::uint64_t call, Stream stream) const noexcept {
        const Fault& fault = run_faults_[index(op)];
        if (fault.first != 0 && call >= fault.first && call <= fault.last) {
            return Status(fault.code, detail::message("mock ", to_string(op), ": injected failure of call ", call,
                                                      " when it ran on stream ", stream.id));
        }
        return {};
    }

    Result<void*> allocate(MockOp op, Blocks& blocks, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (Status injected = begin(op); !injected) return finish(op, nullptr, bytes, std::move(injected));
        if (bytes == 0) {
            return finish(
                op, nullptr, 0,
                misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": 0 bytes requested")));
        }
        if (op == MockOp::device_malloc && bytes > config_.device_capacity - device_bytes_) {
            return finish(op, nullptr, bytes,
                          Status(Errc::out_of_memory,
                                 detail::message("mock device_malloc: ", bytes, " bytes requested, ", device_bytes_,
                                                 " of ", config_.device_capacity, " bytes in use")));
        }
        constexpr std::size_t block_alignment = 4096;
        const auto with_offset = detail::add(bytes, config_.offset);
        const auto over = with_offset ? detail::add(*with_offset, block_alignment) : std::nullopt;
        if (!over) {
            return finish(op, nullptr, bytes,
                          Status(Errc::out_of_memory, detail::message("mock ", to_string(op), ": ", bytes,
                                                                      " bytes requested exceed the address space")));
        }
        const std::size_t padded = *over / block_alignment * block_alignment;
        void* block = std::aligned_alloc(block_alignment, padded);
        if (block == nullptr) {
            return finish(op, nullptr, bytes,
                          Status(Errc::out_of_memory, detail::message("mock ", to_string(op), ": host allocation of ",
                                                                      padded, " bytes failed")));
        }
        std::memset(block, 0xA5, padded);  // stale-looking bytes, never zeros
        void* pointer = static_cast<std::byte*>(block) + config_.offset;
        if (!detail::without_bad_alloc([&] { blocks.insert(pointer, bytes, block); })) {
            std::free(block);
            return finish(
                op, nullptr, bytes,
                Status(Errc::out_of_memory,
                       detail::message("mock ", to_string(op), ": host memory exhausted recording ", bytes, " bytes")));
        }
        freed_.erase(pointer);
        if (op == MockOp::device_malloc) device_bytes_ += bytes;
        (void)finish(op, pointer, bytes, {});
        return pointer;
    }

    Status deallocate(MockOp op, Blocks& blocks, void* pointer) noexcept {
        std::lock_guard lock(mutex_);
        if (Status injected = begin(op); !injected) return finish(op, pointer, 0, std::move(injected));
        if (const auto* live = blocks.at(pointer); live != nullptr) {
            const Side side = op == MockOp::device_free ? Side::device : Side::host;
            if (Status clear = used_by_pending(op, pointer, live->bytes, side); !clear) {
                return finish(op, pointer, live->bytes, std::move(clear));
            }
        }
        const auto entry = blocks.erase(pointer);
        if (!entry) {
            const bool twice = freed_.count(pointer) != 0;
            return finish(op, pointer, 0,
                          misuse(Errc::unknown_pointer, detail::message("mock ", to_string(op), ": ",
                                                                        twice ? "double free of " : "unknown pointer ",
                                                                        static_cast<const void*>(pointer))));
        }
        std::free(entry->info);
        // Without room to remember the pointer, a later double free reads as an unknown pointer.
        (void)detail::without_bad_alloc([&] { freed_.insert(pointer); });
        if (op == MockOp::device_free) device_bytes_ -= entry->bytes;
        return finish(op, pointer, entry->bytes, {});
    }

    Status transfer(MockOp op, const void* device, void* dst, const void* src, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (Status injected = begin(op); !injected) return finish(op, device, bytes, std::move(injected));
        if (bytes == 0) return finish(op, device, 0, {});
        if (Status checked = check_copy(op, device, dst, src, bytes); !checked) {
            return finish(op, device, bytes, std::move(checked));
        }
        if (Status clear = not_pending(op, device, bytes, Side::device); !clear) {
            return finish(op, device, bytes, std::move(clear));
        }
        std::memcpy(dst, src, bytes);
        return finish(op, device, bytes, {});
    }

    Status check_copy(MockOp op, const void* device, const void* dst, const void* src, std::size_t bytes) noexcept {
        if (!device_.contains(device, bytes)) {
            return misuse(Errc::invalid_argument,
                          detail::message("mock ", to_string(op), ": ", bytes, " bytes at device address ", device,
                                          " run outside every device allocation"));
        }
        if (dst == nullptr || src == nullptr) {
            return misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": null host pointer"));
        }
        return {};
    }

    // A synchronous touch of device memory: busy when pending work uses it, unless a host
    // function (itself stream work) makes it.
    Status not_pending(MockOp op, const void* pointer, std::size_t bytes, Side side) noexcept {
        if (in_host_function()) return {};
        return used_by_pending(op, pointer, bytes, side);
    }

    // Busy when a pending copy's `side` overlaps [pointer, pointer + bytes).
    Status used_by_pending(MockOp op, const void* pointer, std::size_t bytes, Side side) noexcept {
        const auto begin = reinterpret_cast<std::uintptr_t>(pointer);
        for (const auto& [id, stream] : streams_) {
            for (const Pending& pending : stream.queue) {
                if (pending.op != MockOp::copy_to_device_async && pending.op != MockOp::copy_from_device_async) {
                    continue;
                }
                const auto other =
                    reinterpret_cast<std::uintptr_t>(side == Side::device ? pending.device : pending.host);
                if (begin < other + pending.bytes && other < begin + bytes) {
                    return misuse(Errc::busy, detail::message("mock ", to_string(op), ": ", bytes, " bytes at ",
                                                              pointer, " are used by pending ", to_string(pending.op),
                                                              " of ", pending.bytes, " bytes on stream ", id));
                }
            }
        }
        return {};
    }

    Status enqueue_copy(MockOp op, const void* device, void* dst, const void* src, const void* host, std::size_t bytes,
                        Stream stream) noexcept {
        std::unique_lock lock(mutex_);
        if (Status refused = begin_stream_op(op); !refused) {
            return finish(op, device, bytes, std::move(refused), stream.id);
        }
        const std::uint64_t call = calls_[index(op)];
        const auto target = streams_.find(stream.id);
        if (target == streams_.end()) return finish(op, device, bytes, unknown_stream(op, stream), stream.id);
        if (bytes == 0) return finish(op, device, 0, {}, stream.id);
        if (Status checked = check_copy(op, device, dst, src, bytes); !checked) {
            return finish(op, device, bytes, std::move(checked), stream.id);
        }
        std::uint64_t seq = 0;
        if (!detail::without_bad_alloc([&] {
                seq = push(target->second, Pending{.op = op,
                                                   .dst = dst,
                                                   .src = src,
                                                   .bytes = bytes,
                                                   .device = device,
                                                   .host = host,
                                                   .recording = {},
                                                   .failure = failure_when_run(op, call, stream)});
            })) {
            return finish(op, device, bytes, host_exhausted(op), stream.id);
        }
        (void)finish(op, device, bytes, {}, stream.id);
        return settle(lock, stream, seq);
    }

    // Enqueues `pending`; returns its sequence number. Throws only std::bad_alloc, before
    // anything changed.
    std::uint64_t push(StreamState& stream, Pending pending) {
        pending.seq = next_seq_ + 1;
        if (pending.op == MockOp::record_event) pending.recording->seq = pending.seq;
        stream.queue.push_back(std::move(pending));
        return ++next_seq_;
    }

    // After an enqueue: eager mode runs the stream up to the new operation now.
    Status settle(std::unique_lock<std::mutex>& lock, Stream stream, std::uint64_t seq) noexcept {
        if (config_.deferred_async) return {};
        return drain(lock, Target{stream.id, seq}, true);
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

    // Runs pending work until `target` is reached (nullopt: until none is left). Whenever
    // several streams can run, the one whose next operation was enqueued last goes first.
    // Waits for host functions that other threads run, unless `may_wait` is false: then it
    // returns early and the caller checks what was reached.
    Status drain(std::unique_lock<std::mutex>& lock, std::optional<Target> target, bool may_wait) noexcept {
        std::map<std::uint32_t, std::uint64_t> bounds;
        if (target && !detail::without_bad_alloc([&] { bounds_for(*target, bounds); })) {
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

    void run_head(std::unique_lock<std::mutex>& lock, StreamState& stream) noexcept {
        Pending& head = stream.queue.front();
        if (!head.failure.ok()) {
            if (stream.failure.ok()) stream.failure = head.failure;
            if (async_failure_.ok()) async_failure_ = head.failure;
        } else if (head.op == MockOp::copy_to_device_async || head.op == MockOp::copy_from_device_async) {
            std::memcpy(head.dst, head.src, head.bytes);
        } else if (head.op == MockOp::record_event) {
            head.recording->failure = std::exchange(stream.failure, Status());
            head.recording->done = true;
        } else if (head.op == MockOp::launch_host_func) {
            const HostFunction function = head.function;
            void* user_data = head.user_data;
            stream.running = true;
            lock.unlock();
            const MockBackend* outer = std::exchange(host_function_owner(), this);
            function(user_data);
            host_function_owner() = outer;
            lock.lock();
            stream.running = false;
        }
        // A stream_wait_event runs once its recording is done: nothing left to do.
        stream.queue.pop_front();
        progress_.notify_all();
    }

    MockConfig config_;
    mutable std::mutex mutex_;
    std::condition_variable progress_;  // a host function run with the lock released returned
    Blocks device_;
    Blocks pinned_;
    std::set<const void*> freed_;
    std::size_t device_bytes_ = 0;
    std::array<std::uint64_t, mock_op_count> calls_{};
    std::array<Fault, mock_op_count> faults_{};
    std::array<Fault, mock_op_count> run_faults_{};
    std::vector<MockCall> journal_;
    std::uint64_t misuses_ = 0;
    std::map<std::uint32_t, StreamState> streams_;
    std::map<std::uint32_t, std::shared_ptr<Recording>> events_;  // the latest recording; null: never recorded
    std::uint32_t next_stream_ = 0;
    std::uint32_t next_event_ = 0;
    std::uint64_t next_seq_ = 0;
    Status async_failure_;  // the first failure of enqueued work since the last synchronize()
};

static_assert(Backend<MockBackend>);
static_assert(PinnedHostBackend<MockBackend>);
static_assert(MemsetBackend<MockBackend>);
static_assert(SynchronizingBackend<MockBackend>);
static_assert(AsyncBackend<MockBackend>);
static_assert(HostFunctionBackend<MockBackend>);

}  // namespace devstage
