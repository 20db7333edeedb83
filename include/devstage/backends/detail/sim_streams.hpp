// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the streams and events of a SimBackend. Each stream is a worker thread that runs its
// queue of tasks in order with no lock held: copies (direct, or through the bounce buffer), host
// functions, the recording of an event (a marker the worker completes when it reaches it) and
// waits for another stream's recording. The host waits on markers, or until every stream is
// idle. The stream and event operations are called with the SimBackend's mutex held (it guards
// the SimStats counted here) and take the queue lock after it; a worker takes only the queue
// lock.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/detail/sim_bounce.hpp"
#include "devstage/backends/detail/sim_host_state.hpp"
#include "devstage/backends/sim_config.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class SimStreams {
public:
    // A recording of an event: done once its stream's worker reached it. Guarded by the queue
    // lock.
    struct Marker {
        bool done = false;
    };
    struct Task {
        enum class Kind : std::uint8_t { copy, bounced_copy, memset, host_function, signal, wait };
        Kind kind = Kind::signal;
        void* dst = nullptr;
        const void* src = nullptr;
        std::size_t bytes = 0;
        int value = 0;  // memset
        HostFunction function = nullptr;
        void* user_data = nullptr;
        // signal and copy: marked done once the task ran; wait: the recording waited for.
        std::shared_ptr<Marker> marker;
    };
    // A stream: its queue, flags and condition are guarded by the queue lock.
    struct Worker {
        std::deque<Task> queue;
        std::condition_variable work;
        bool busy = false;
        bool stop = false;  // set by destroy_stream: drain, then end
        std::thread thread;
    };

    SimStreams(SimBounceBuffer& bounce, SimStats& stats, SimHostState& host, int device) noexcept
        : bounce_(bounce), stats_(stats), host_(host), device_(device) {}
    SimStreams(const SimStreams&) = delete;
    SimStreams& operator=(const SimStreams&) = delete;
    ~SimStreams() { shutdown(); }

    /// Stops every stream: each runs what is queued, then its thread ends and is joined. No
    /// other thread may use the streams meanwhile.
    void shutdown() noexcept {
        {
            std::lock_guard queue(mutex_);
            for (auto& [id, worker] : streams_) {
                worker->stop = true;
                worker->work.notify_one();
            }
        }
        // A host function cannot create or destroy streams, so the map does not change while
        // the workers drain.
        for (auto& [id, worker] : streams_) worker->thread.join();
        streams_.clear();
    }

    /// True on a worker thread of these streams: where host functions run.
    bool on_worker() const noexcept { return running_on() == this; }

    // ---- the stream and event operations of the SimBackend, its mutex held ----------------

    /// Starts a stream and its worker thread; returns its id.
    Result<std::uint32_t> create_stream() noexcept {
        std::lock_guard queue(mutex_);
        const std::uint32_t id = SimHostState::next_id();
        Worker* worker = nullptr;
        if (!without_bad_alloc(
                [&] { worker = streams_.emplace(id, std::make_unique<Worker>()).first->second.get(); }) ||
            !host_.enroll(SimHostState::Kind::stream, id, device_)) {
            streams_.erase(id);
            return fail(Errc::out_of_memory, message("sim create_stream: host memory exhausted"));
        }
        if (Status started = start(*worker); !started) {
            streams_.erase(id);
            host_.withdraw(SimHostState::Kind::stream, id);
            return fail(started.code(), started.message());
        }
        ++stats_.live_streams;
        return id;
    }

    /// Stops the stream, releases `held` (the backend's lock), then waits until the stream ran
    /// its remaining work and its thread ended.
    Status destroy_stream(std::uint32_t id, std::unique_lock<std::mutex>& held) noexcept {
        Worker* worker = nullptr;
        {
            std::lock_guard queue(mutex_);
            worker = find_stream(id);
            if (worker == nullptr) return unknown_stream("destroy_stream", id);
            worker->stop = true;  // no more work is accepted; what is queued still runs
            worker->work.notify_one();
            --stats_.live_streams;
        }
        held.unlock();
        worker->thread.join();
        std::lock_guard queue(mutex_);
        streams_.erase(id);
        host_.withdraw(SimHostState::Kind::stream, id);
        idle_.notify_all();  // synchronize() no longer waits for this stream
        return {};
    }

    Result<std::uint32_t> create_event() noexcept {
        std::lock_guard queue(mutex_);
        const std::uint32_t id = SimHostState::next_id();
        if (!without_bad_alloc([&] { events_.emplace(id, nullptr); }) ||
            !host_.enroll(SimHostState::Kind::event, id, device_)) {
            events_.erase(id);
            return fail(Errc::out_of_memory, message("sim create_event: host memory exhausted"));
        }
        ++stats_.live_events;
        return id;
    }

    Status destroy_event(std::uint32_t id) noexcept {
        std::lock_guard queue(mutex_);
        if (events_.erase(id) == 0) return unknown_event("destroy_event", id);
        host_.withdraw(SimHostState::Kind::event, id);
        --stats_.live_events;
        return {};
    }

    Status record_event(std::uint32_t event, std::uint32_t stream) noexcept {
        std::lock_guard queue(mutex_);
        const auto found = events_.find(event);
        if (found == events_.end()) return unknown_event("record_event", event);
        Worker* worker = find_stream(stream);
        if (worker == nullptr) return unknown_stream("record_event", stream);
        std::shared_ptr<Marker> marker;
        if (!without_bad_alloc([&] {
                marker = std::make_shared<Marker>();
                worker->queue.push_back(Task{.kind = Task::Kind::signal, .marker = marker});
            })) {
            return fail(Errc::out_of_memory, message("sim record_event: host memory exhausted"));
        }
        found->second = std::move(marker);
        ++stats_.events_recorded;
        worker->work.notify_one();
        return {};
    }

    Result<bool> event_ready(std::uint32_t event) noexcept {
        std::lock_guard queue(mutex_);
        const auto found = events_.find(event);
        if (found == events_.end()) return unknown_event("event_ready", event);
        return found->second == nullptr || found->second->done;
    }

    /// Releases `held` (the backend's lock), then waits for the event's latest recording.
    Status synchronize_event(std::uint32_t event, std::unique_lock<std::mutex>& held) noexcept {
        std::unique_lock queue(mutex_);
        const auto found = events_.find(event);
        if (found == events_.end()) return unknown_event("synchronize_event", event);
        const std::shared_ptr<Marker> marker = found->second;
        ++stats_.event_synchronizes;
        held.unlock();
        if (marker != nullptr) wait(queue, *marker);
        return {};
    }

    Status stream_wait_event(std::uint32_t stream, std::uint32_t event) noexcept {
        std::lock_guard queue(mutex_);
        const auto found = events_.find(event);
        if (found == events_.end()) return unknown_event("stream_wait_event", event);
        Worker* worker = find_stream(stream);
        if (worker == nullptr) return unknown_stream("stream_wait_event", stream);
        ++stats_.stream_waits;
        if (found->second == nullptr || found->second->done) return {};
        if (!without_bad_alloc(
                [&] { worker->queue.push_back(Task{.kind = Task::Kind::wait, .marker = found->second}); })) {
            return fail(Errc::out_of_memory, message("sim stream_wait_event: host memory exhausted"));
        }
        worker->work.notify_one();
        return {};
    }

    Status launch_host_func(std::uint32_t stream, HostFunction function, void* user_data) noexcept {
        std::lock_guard queue(mutex_);
        Worker* worker = find_stream(stream);
        if (worker == nullptr) return unknown_stream("launch_host_func", stream);
        if (function == nullptr) return fail(Errc::invalid_argument, message("sim launch_host_func: null function"));
        if (!without_bad_alloc([&] {
                worker->queue.push_back(Task{
                    .kind = Task::Kind::host_function, .function = function, .user_data = user_data, .marker = {}});
            })) {
            return fail(Errc::out_of_memory, message("sim launch_host_func: host memory exhausted"));
        }
        ++stats_.host_functions;
        worker->work.notify_one();
        return {};
    }

    /// Waits until every stream is idle. Needs no lock held.
    void synchronize() noexcept {
        std::unique_lock queue(mutex_);
        idle_.wait(queue, [this] { return all_idle(); });
    }

    /// `outer` (the backend's mutex), locked with no stream work pending: a free that follows
    /// cannot race work that touches the memory, and later copies are validated against the
    /// freed state.
    std::unique_lock<std::mutex> lock_idle(std::mutex& outer) noexcept {
        std::unique_lock lock(outer);
        for (;;) {
            std::unique_lock queue(mutex_);
            if (all_idle()) return lock;
            lock.unlock();
            idle_.wait(queue, [this] { return all_idle(); });
            queue.unlock();
            lock.lock();
        }
    }

    // ---- what an asynchronous copy needs: the stream looked up and the copy enqueued under
    // one hold of the queue lock, with the backend's checks in between ------------------------

    /// The queue lock.
    std::unique_lock<std::mutex> lock() noexcept { return std::unique_lock(mutex_); }

    /// The queue lock held. A stream being destroyed is no longer known.
    Worker* find_stream(std::uint32_t id) noexcept {
        const auto found = streams_.find(id);
        return found == streams_.end() || found->second->stop ? nullptr : found->second.get();
    }

    /// The queue lock held. Enqueues a copy on `worker`, through the bounce buffer when
    /// `bounced` (it is mapped): then `ran` is a marker done once the copy ran. False when host
    /// memory ran out; nothing is enqueued then.
    bool enqueue_copy(Worker& worker, void* dst, const void* src, std::size_t bytes, bool bounced,
                      std::shared_ptr<Marker>& ran) noexcept {
        if (!without_bad_alloc([&] {
                if (bounced) ran = std::make_shared<Marker>();
                worker.queue.push_back(Task{.kind = bounced ? Task::Kind::bounced_copy : Task::Kind::copy,
                                            .dst = dst,
                                            .src = src,
                                            .bytes = bytes,
                                            .marker = ran});
            })) {
            return false;
        }
        worker.work.notify_one();
        return true;
    }

    /// The queue lock held. Enqueues setting `bytes` at `dst` to `value` on `worker`. False
    /// when host memory ran out; nothing is enqueued then.
    bool enqueue_memset(Worker& worker, void* dst, int value, std::size_t bytes) noexcept {
        if (!without_bad_alloc([&] {
                worker.queue.push_back(
                    Task{.kind = Task::Kind::memset, .dst = dst, .bytes = bytes, .value = value, .marker = nullptr});
            })) {
            return false;
        }
        worker.work.notify_one();
        return true;
    }

    /// Waits, `queue` held, until `marker` is done.
    void wait(std::unique_lock<std::mutex>& queue, const Marker& marker) noexcept {
        idle_.wait(queue, [&marker] { return marker.done; });
    }

    Status unknown_stream(std::string_view what, std::uint32_t id) noexcept {
        return unknown(what, SimHostState::Kind::stream, id);
    }

private:
    // The streams whose worker runs on this thread, if any.
    static const SimStreams*& running_on() noexcept {
        thread_local const SimStreams* owner = nullptr;
        return owner;
    }

    Status start(Worker& worker) noexcept {
#if defined(__cpp_exceptions)
        try {
            worker.thread = std::thread([this, &worker] { run(worker); });
        } catch (const std::exception&) {  // std::system_error, std::bad_alloc
            return Status(Errc::backend_failure, "sim create_stream: no thread could be started");
        }
#else
        worker.thread = std::thread([this, &worker] { run(worker); });
#endif
        return {};
    }

    // A stream's worker: runs its tasks in order until stopped and drained.
    void run(Worker& worker) noexcept {
        running_on() = this;
        std::unique_lock queue(mutex_);
        for (;;) {
            worker.work.wait(queue, [&worker] { return worker.stop || !worker.queue.empty(); });
            if (worker.queue.empty()) return;
            Task task = std::move(worker.queue.front());
            worker.queue.pop_front();
            worker.busy = true;
            if (task.kind == Task::Kind::wait) {
                idle_.wait(queue, [&task] { return task.marker->done; });
            } else if (task.kind != Task::Kind::signal) {
                queue.unlock();
                execute(task);
                queue.lock();
            }
            if (task.kind != Task::Kind::wait && task.marker != nullptr) task.marker->done = true;
            worker.busy = false;
            idle_.notify_all();
        }
    }

    void execute(const Task& task) noexcept {
        switch (task.kind) {
            case Task::Kind::copy:
                std::memcpy(task.dst, task.src, task.bytes);
                break;
            case Task::Kind::bounced_copy:
                bounce_.copy(task.dst, task.src, task.bytes);
                break;
            case Task::Kind::memset:
                std::memset(task.dst, task.value, task.bytes);
                break;
            case Task::Kind::host_function:
                task.function(task.user_data);
                break;
            case Task::Kind::signal:
            case Task::Kind::wait:
                break;
        }
    }

    // The queue lock held.
    bool all_idle() const noexcept {
        return std::all_of(streams_.begin(), streams_.end(),
                           [](const auto& entry) { return entry.second->queue.empty() && !entry.second->busy; });
    }

    Status unknown_event(std::string_view what, std::uint32_t id) noexcept {
        return unknown(what, SimHostState::Kind::event, id);
    }

    // Another device's stream or event is named as such.
    Status unknown(std::string_view what, SimHostState::Kind kind, std::uint32_t id) noexcept {
        const char* noun = kind == SimHostState::Kind::stream ? "stream " : "event ";
        if (const std::optional<int> owner = host_.owner(kind, id); owner && *owner != device_) {
            return fail(Errc::invalid_argument, message("sim device ", device_, " ", what, ": ", noun, id,
                                                        " belongs to sim device ", *owner, " of the same host"));
        }
        return fail(Errc::invalid_argument, message("sim ", what, ": unknown ", noun, id));
    }

    Status fail(Errc code, std::string text) noexcept {
        ++stats_.failed_calls;
        return Status(code, std::move(text));
    }

    SimBounceBuffer& bounce_;
    SimStats& stats_;               // guarded by the backend's mutex
    std::mutex mutex_;              // the queue lock
    std::condition_variable idle_;  // a task finished: a recording completed, a stream may be idle
    std::map<std::uint32_t, std::unique_ptr<Worker>> streams_;
    std::map<std::uint32_t, std::shared_ptr<Marker>> events_;  // the latest recording; null: never recorded
    SimHostState& host_;                                       // where ids are registered with their device
    int device_;
};

}  // namespace devstage::detail
