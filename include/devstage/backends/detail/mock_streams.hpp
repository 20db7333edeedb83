// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the stream and event operations of a MockBackend over its deferred-execution engine
// (MockEngine): stream and event ids, their validation, the refusal of such an operation from a
// host function, and the journal entry of each call. Every operation is called with the
// MockBackend's mutex held; one that may run work takes its lock, which the engine releases
// while a host function runs.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/detail/mock_engine.hpp"
#include "devstage/backends/detail/mock_recorder.hpp"
#include "devstage/backends/mock_journal.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class MockStreams {
public:
    /// An asynchronous copy: from `src` to `dst`; `device` and `host` are its two sides.
    struct Copy {
        void* dst;
        const void* src;  // null: a memset of dst to `value`
        std::size_t bytes;
        const void* device;
        const void* host;
        int value = 0;
    };

    /// `not_ready_polls`: MockConfig::not_ready_polls.
    MockStreams(MockRecorder& recorder, MockEngine& engine, std::uint32_t not_ready_polls) noexcept
        : recorder_(recorder), engine_(engine), not_ready_polls_(not_ready_polls) {}
    MockStreams(const MockStreams&) = delete;
    MockStreams& operator=(const MockStreams&) = delete;
    ~MockStreams() = default;

    // ---- the stream and event operations of the MockBackend, each journaled ---------------

    /// Runs all pending work; reports the first failure of enqueued work that ran since the
    /// previous synchronize().
    Status synchronize(std::unique_lock<std::mutex>& lock) noexcept {
        constexpr MockOp op = MockOp::synchronize;
        if (Status refused = begin(op); !refused) return recorder_.finish(op, nullptr, 0, std::move(refused));
        if (Status drained = engine_.drain(lock, std::nullopt, true); !drained) {
            return recorder_.finish(op, nullptr, 0, drained);
        }
        return recorder_.finish(op, nullptr, 0, engine_.take_failure());
    }

    Result<std::uint32_t> create_stream() noexcept {
        constexpr MockOp op = MockOp::create_stream;
        if (Status refused = begin(op); !refused) return recorder_.finish(op, nullptr, 0, std::move(refused));
        const std::uint32_t id = next_stream_ + 1;
        if (!without_bad_alloc([&] { engine_.add_stream(id); })) {
            return recorder_.finish(op, nullptr, 0, host_exhausted(op));
        }
        next_stream_ = id;
        (void)recorder_.finish(op, nullptr, 0, {}, id);
        return id;
    }

    /// Runs the stream's pending work (and what it waits for), then forgets the stream.
    Status destroy_stream(std::unique_lock<std::mutex>& lock, std::uint32_t id) noexcept {
        constexpr MockOp op = MockOp::destroy_stream;
        if (Status refused = begin(op); !refused) return recorder_.finish(op, nullptr, 0, std::move(refused), id);
        if (engine_.find_stream(id) == nullptr) return recorder_.finish(op, nullptr, 0, unknown_stream(op, id), id);
        Status drained = engine_.drain(lock, Target{id, std::numeric_limits<std::uint64_t>::max()}, true);
        if (drained) engine_.remove_stream(id);
        return recorder_.finish(op, nullptr, 0, std::move(drained), id);
    }

    /// Checks the stream, then `check()` (zero bytes is a no-op before it), then enqueues.
    template <class Check>
    Status enqueue_copy(std::unique_lock<std::mutex>& lock, MockOp op, std::uint32_t stream, const Copy& copy,
                        Check&& check) noexcept {
        if (Status refused = begin(op); !refused) {
            return recorder_.finish(op, copy.device, copy.bytes, std::move(refused), stream);
        }
        const std::uint64_t call = recorder_.calls(op);
        MockEngine::StreamState* target = engine_.find_stream(stream);
        if (target == nullptr) {
            return recorder_.finish(op, copy.device, copy.bytes, unknown_stream(op, stream), stream);
        }
        if (copy.bytes == 0) return recorder_.finish(op, copy.device, 0, {}, stream);
        if (Status checked = check(); !checked) {
            return recorder_.finish(op, copy.device, copy.bytes, std::move(checked), stream);
        }
        std::uint64_t seq = 0;
        if (!push_copy(*target, op, copy, recorder_.failure_when_run(op, call, stream), seq)) {
            return recorder_.finish(op, copy.device, copy.bytes, host_exhausted(op), stream);
        }
        (void)recorder_.finish(op, copy.device, copy.bytes, {}, stream);
        return engine_.settle(lock, stream, seq);
    }

    /// A batch of `count` copies, journaled as one call of `op` (the first copy's device side,
    /// the bytes of all): each copy, `copy_at(i)`, is checked by `check(copy)` and enqueued in
    /// order as an asynchronous copy of `kind`. The first copy that fails its check stops the
    /// batch: the copies before it stay enqueued and the error names its index. An injected
    /// failure of the call (fail_call) lets the first half of the copies through first; one of
    /// fail_when_run makes every copy of the batch fail when it runs.
    template <class CopyAt, class Check>
    Status enqueue_batch(std::unique_lock<std::mutex>& lock, MockOp op, MockOp kind, std::uint32_t stream,
                         std::size_t count, CopyAt&& copy_at, Check&& check) noexcept {
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < count; ++i) bytes += copy_at(i).bytes;
        const void* first = count > 0 ? copy_at(0).device : nullptr;
        Status refused = begin(op);
        const std::uint64_t call = recorder_.calls(op);
        MockEngine::StreamState* target = engine_.find_stream(stream);
        if (target == nullptr) {
            return recorder_.finish(op, first, bytes, refused ? unknown_stream(op, stream) : refused, stream);
        }
        const std::size_t through = refused ? count : count / 2;
        std::uint64_t seq = 0;
        Status status;
        for (std::size_t i = 0; i < through; ++i) {
            const Copy copy = copy_at(i);
            if (copy.bytes == 0) continue;
            if (Status checked = check(copy); !checked) {
                status =
                    Status(checked.code(), message(checked.message(), " (copy ", i, " of a batch of ", count, ")"));
                break;
            }
            if (!push_copy(*target, kind, copy, recorder_.failure_when_run(op, call, stream), seq)) {
                status = host_exhausted(op);
                break;
            }
        }
        if (!refused)
            status = Status(refused.code(), message(refused.message(), " after copy ", through, " of ", count));
        (void)recorder_.finish(op, first, bytes, status, stream);
        if (seq != 0) (void)engine_.settle(lock, stream, seq);
        return status;
    }

    Result<std::uint32_t> create_event() noexcept {
        constexpr MockOp op = MockOp::create_event;
        if (Status refused = begin(op); !refused) return recorder_.finish(op, nullptr, 0, std::move(refused));
        const std::uint32_t id = next_event_ + 1;
        if (!without_bad_alloc([&] { events_.try_emplace(id); })) {
            return recorder_.finish(op, nullptr, 0, host_exhausted(op));
        }
        next_event_ = id;
        (void)recorder_.finish(op, nullptr, 0, {}, 0, id);
        return id;
    }

    Status destroy_event(std::uint32_t id) noexcept {
        constexpr MockOp op = MockOp::destroy_event;
        if (Status refused = begin(op); !refused) return recorder_.finish(op, nullptr, 0, std::move(refused), 0, id);
        if (events_.erase(id) == 0) return recorder_.finish(op, nullptr, 0, unknown_event(op, id), 0, id);
        return recorder_.finish(op, nullptr, 0, {}, 0, id);
    }

    /// The recording completes when `stream` reaches it; it then reports the first failure of
    /// work that ran on `stream` since the previous recording.
    Status record_event(std::unique_lock<std::mutex>& lock, std::uint32_t event, std::uint32_t stream) noexcept {
        constexpr MockOp op = MockOp::record_event;
        Events::iterator recorded;
        MockEngine::StreamState* target = nullptr;
        if (Status refused = find_event_and_stream(op, event, stream, recorded, target); !refused) {
            return recorder_.finish(op, nullptr, 0, std::move(refused), stream, event);
        }
        std::shared_ptr<Recording> recording;
        std::uint64_t seq = 0;
        if (!without_bad_alloc([&] {
                recording = std::make_shared<Recording>();
                recording->stream = stream;
                seq = engine_.push(*target, Pending{.op = op, .accesses = {}, .recording = recording, .failure = {}});
            })) {
            return recorder_.finish(op, nullptr, 0, host_exhausted(op), stream, event);
        }
        recorded->second = std::move(recording);
        (void)recorder_.finish(op, nullptr, 0, {}, stream, event);
        return engine_.settle(lock, stream, seq);
    }

    /// Never blocks on other threads. Deferred: "not ready" not_ready_polls times per
    /// recording, then runs what the recording depends on.
    Result<bool> event_ready(std::unique_lock<std::mutex>& lock, std::uint32_t event) noexcept {
        constexpr MockOp op = MockOp::event_ready;
        if (Status refused = begin(op); !refused) return recorder_.finish(op, nullptr, 0, std::move(refused), 0, event);
        const auto recorded = events_.find(event);
        if (recorded == events_.end()) return recorder_.finish(op, nullptr, 0, unknown_event(op, event), 0, event);
        const std::shared_ptr<Recording> recording = recorded->second;
        if (recording != nullptr && !recording->done) {
            if (recording->polls < not_ready_polls_) {
                ++recording->polls;
                (void)recorder_.finish(op, nullptr, 0, {}, 0, event);
                return false;
            }
            if (Status drained = engine_.drain(lock, Target{recording->stream, recording->seq}, false); !drained) {
                return recorder_.finish(op, nullptr, 0, std::move(drained), 0, event);
            }
        }
        const bool ready = recording == nullptr || recording->done;
        Status reported =
            recorder_.finish(op, nullptr, 0, ready && recording != nullptr ? recording->failure : Status(), 0, event);
        if (!reported) return reported;
        return ready;
    }

    /// Runs what the event's latest recording depends on; reports the failure it covers.
    Status synchronize_event(std::unique_lock<std::mutex>& lock, std::uint32_t event) noexcept {
        constexpr MockOp op = MockOp::synchronize_event;
        if (Status refused = begin(op); !refused) return recorder_.finish(op, nullptr, 0, std::move(refused), 0, event);
        const auto recorded = events_.find(event);
        if (recorded == events_.end()) return recorder_.finish(op, nullptr, 0, unknown_event(op, event), 0, event);
        const std::shared_ptr<Recording> recording = recorded->second;
        if (recording == nullptr) return recorder_.finish(op, nullptr, 0, {}, 0, event);
        if (Status drained = engine_.drain(lock, Target{recording->stream, recording->seq}, true); !drained) {
            return recorder_.finish(op, nullptr, 0, std::move(drained), 0, event);
        }
        return recorder_.finish(op, nullptr, 0, recording->failure, 0, event);
    }

    Status stream_wait_event(std::unique_lock<std::mutex>& lock, std::uint32_t stream, std::uint32_t event) noexcept {
        constexpr MockOp op = MockOp::stream_wait_event;
        Events::iterator recorded;
        MockEngine::StreamState* target = nullptr;
        if (Status refused = find_event_and_stream(op, event, stream, recorded, target); !refused) {
            return recorder_.finish(op, nullptr, 0, std::move(refused), stream, event);
        }
        // Nothing to wait for; a failed recording is still enqueued, to hand its failure on.
        if (recorded->second == nullptr || (recorded->second->done && recorded->second->failure.ok())) {
            return recorder_.finish(op, nullptr, 0, {}, stream, event);
        }
        std::uint64_t seq = 0;
        if (!without_bad_alloc([&] {
                seq = engine_.push(*target,
                                   Pending{.op = op, .accesses = {}, .recording = recorded->second, .failure = {}});
            })) {
            return recorder_.finish(op, nullptr, 0, host_exhausted(op), stream, event);
        }
        (void)recorder_.finish(op, nullptr, 0, {}, stream, event);
        return engine_.settle(lock, stream, seq);
    }

    Status launch_host_func(std::unique_lock<std::mutex>& lock, std::uint32_t stream, HostFunction function,
                            void* user_data) noexcept {
        return launch(lock, MockOp::launch_host_func, stream, function, user_data, {}, [] { return Status(); });
    }

    /// A host function standing in for a kernel that touches `accesses`, each first checked by
    /// `check(access)`: until it ran, they are in use (see MockEngine::used_by_pending).
    template <class Check>
    Status launch_kernel(std::unique_lock<std::mutex>& lock, std::uint32_t stream, HostFunction function,
                         void* user_data, std::span<const KernelAccess> accesses, Check&& check) noexcept {
        return launch(lock, MockOp::launch_kernel, stream, function, user_data, accesses, [&] {
            for (const KernelAccess& access : accesses) {
                if (Status checked = check(access); !checked) return checked;
            }
            return Status();
        });
    }

    // ---- observation ----------------------------------------------------------------------
    std::size_t live_events() const noexcept { return events_.size(); }
    /// Appends one line per event never destroyed to `report`.
    void report_leaks(std::string& report) const {
        for (const auto& [id, recording] : events_) report += message("mock: leaked event ", id, "\n");
    }

private:
    using Recording = MockEngine::Recording;
    using Pending = MockEngine::Pending;
    using Target = MockEngine::Target;
    using Events = std::map<std::uint32_t, std::shared_ptr<Recording>>;

    template <class Check>
    Status launch(std::unique_lock<std::mutex>& lock, MockOp op, std::uint32_t stream, HostFunction function,
                  void* user_data, std::span<const KernelAccess> accesses, Check&& check) noexcept {
        if (Status refused = begin(op); !refused) return recorder_.finish(op, user_data, 0, std::move(refused), stream);
        const std::uint64_t call = recorder_.calls(op);
        MockEngine::StreamState* target = engine_.find_stream(stream);
        if (target == nullptr) {
            return recorder_.finish(op, user_data, 0, unknown_stream(op, stream), stream);
        }
        if (function == nullptr) {
            return recorder_.finish(
                op, user_data, 0,
                recorder_.misuse(Errc::invalid_argument, message("mock ", to_string(op), ": null function")), stream);
        }
        if (Status checked = check(); !checked) return recorder_.finish(op, user_data, 0, std::move(checked), stream);
        std::uint64_t seq = 0;
        if (!without_bad_alloc([&] {
                seq = engine_.push(*target, Pending{.op = op,
                                                    .function = function,
                                                    .user_data = user_data,
                                                    .accesses = {accesses.begin(), accesses.end()},
                                                    .recording = {},
                                                    .failure = recorder_.failure_when_run(op, call, stream)});
            })) {
            return recorder_.finish(op, user_data, 0, host_exhausted(op), stream);
        }
        (void)recorder_.finish(op, user_data, 0, {}, stream);
        return engine_.settle(lock, stream, seq);
    }

    // The recorder's begin(), and the refusal of a stream or event operation from a host
    // function.
    Status begin(MockOp op) noexcept {
        if (Status injected = recorder_.begin(op); !injected) return injected;
        if (engine_.in_host_function()) {
            return recorder_.misuse(Errc::invalid_argument,
                                    message("mock ", to_string(op),
                                            ": called from a host function, where only allocation, copy and memset "
                                            "calls are allowed"));
        }
        return {};
    }
    static Status host_exhausted(MockOp op) noexcept {
        return Status(Errc::out_of_memory, message("mock ", to_string(op), ": host memory exhausted"));
    }
    // What record_event and stream_wait_event check first: the call's armed fault, then that
    // the event and the stream are known (found in `recorded` and `target`).
    Status find_event_and_stream(MockOp op, std::uint32_t event, std::uint32_t stream, Events::iterator& recorded,
                                 MockEngine::StreamState*& target) noexcept {
        if (Status refused = begin(op); !refused) return refused;
        recorded = events_.find(event);
        if (recorded == events_.end()) return unknown_event(op, event);
        target = engine_.find_stream(stream);
        if (target == nullptr) return unknown_stream(op, stream);
        return {};
    }
    // Enqueues `copy` as an operation `op` on `target`, failing with `failure` when it runs; false
    // when host memory ran out.
    bool push_copy(MockEngine::StreamState& target, MockOp op, const Copy& copy, Status failure,
                   std::uint64_t& seq) noexcept {
        return without_bad_alloc([&] {
            seq = engine_.push(target, Pending{.op = op,
                                               .dst = copy.dst,
                                               .src = copy.src,
                                               .bytes = copy.bytes,
                                               .device = copy.device,
                                               .host = copy.host,
                                               .value = copy.value,
                                               .accesses = {},
                                               .recording = {},
                                               .failure = std::move(failure)});
        });
    }
    Status unknown_stream(MockOp op, std::uint32_t id) noexcept {
        return recorder_.misuse(Errc::invalid_argument, message("mock ", to_string(op), ": unknown stream ", id));
    }
    Status unknown_event(MockOp op, std::uint32_t id) noexcept {
        return recorder_.misuse(Errc::invalid_argument, message("mock ", to_string(op), ": unknown event ", id));
    }

    MockRecorder& recorder_;
    MockEngine& engine_;
    const std::uint32_t not_ready_polls_;
    Events events_;  // the latest recording of each event; null: never recorded
    std::uint32_t next_stream_ = 0;
    std::uint32_t next_event_ = 0;
};

}  // namespace devstage::detail
