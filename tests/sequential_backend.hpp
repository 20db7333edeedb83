// SPDX-License-Identifier: Apache-2.0
#pragma once
// The backends the random-program checker runs on besides MockBackend and SimBackend:
//
// - SlowBackend, written the way an engine's own port would be: device and pinned memory are
//   plain host memory, each stream is a queue of work that runs only when the host waits for it
//   (synchronize_event, or event_ready after one "not ready"), stream_wait_event is honoured, and
//   nothing else orders anything. It has no synchronize() and no is_pinned() query: the stager
//   must get by with events alone, and treats all host memory as pageable. It maps pinned memory
//   for its kernels (the device address is the host address), and takes batches of copies when
//   constructed with a batch limit (a whole batch is checked before any copy of it is enqueued).
//   Its synchronize_event fails on request (fail_next_waits), running nothing. It counts misuses:
//   a free or an unmap of memory that pending work (a copy, or a kernel that said which memory it
//   touches) still uses, a free of memory still mapped, a copy of mapped memory, a synchronous
//   copy of device memory that pending work uses, and a batch larger than its limit.
// - NoMemsetMock: the deferred mock without device memsets (Out args are zeroed by uploads).
// - StreamlessMock: the mock without streams or events, as a runtime without them: a Stager sees
//   it through SynchronousAdapter, so its copies and memsets are the synchronous calls.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/status.hpp"

namespace sequential {

class SlowBackend {
public:
    static constexpr std::size_t device_alignment = 64;

    struct Stream {
        std::uint32_t id = 0;
        friend bool operator==(Stream, Stream) = default;
    };
    struct Event {
        std::uint32_t id = 0;
        friend bool operator==(Event, Event) = default;
    };

    SlowBackend() = default;
    /// A backend whose copy_*_batch calls take up to `batch_limit` copies (0: batch_copy_limit()
    /// answers 0, and a Stager copies one by one).
    explicit SlowBackend(std::size_t batch_limit) noexcept : batch_limit_(batch_limit) {}
    SlowBackend(const SlowBackend&) = delete;
    SlowBackend& operator=(const SlowBackend&) = delete;
    ~SlowBackend() {
        for (auto& [pointer, bytes] : device_) std::free(pointer);
        for (auto& [pointer, bytes] : pinned_) std::free(pointer);
        for (void* pointer : quarantine_) std::free(pointer);
    }

    std::string_view name() const noexcept { return "slow"; }

    devstage::Result<void*> device_malloc(std::size_t bytes) noexcept { return allocate(device_, bytes); }
    devstage::Status device_free(void* pointer) noexcept { return deallocate(device_, pointer, "device_free"); }
    devstage::Result<void*> pinned_malloc(std::size_t bytes) noexcept { return allocate(pinned_, bytes); }
    devstage::Status pinned_free(void* pointer) noexcept {
        {
            std::lock_guard lock(mutex_);
            const auto found = pinned_.find(pointer);
            if (found != pinned_.end() && mapped_overlaps(pointer, found->second)) {
                return misuse("slow pinned_free: memory still mapped");
            }
        }
        return deallocate(pinned_, pointer, "pinned_free");
    }

    /// Any pinned address maps; the device address is the host address.
    static constexpr std::size_t host_map_alignment = 1;
    devstage::Result<void*> map_host(void* host, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0 || !inside(pinned_, host, bytes)) return misuse("slow map_host: not inside pinned memory");
        if (mapped_overlaps(host, bytes)) return misuse("slow map_host: already mapped");
        mapped_[host] = bytes;
        return host;
    }
    devstage::Status unmap_host(void* host) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = mapped_.find(host);
        if (found == mapped_.end()) return misuse("slow unmap_host: not a mapping");
        if (pending_use(host, found->second)) return misuse("slow unmap_host: pending work still uses it");
        mapped_.erase(found);
        return {};
    }

    devstage::Status copy_to_device(void* dst, const void* src, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0) return {};
        if (!inside(device_, dst, bytes)) return misuse("slow copy_to_device: outside every device allocation");
        if (pending_use(dst, bytes)) return misuse("slow copy_to_device: device memory pending work uses");
        std::memcpy(dst, src, bytes);
        return {};
    }
    devstage::Status copy_from_device(void* dst, const void* src, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0) return {};
        if (!inside(device_, src, bytes)) return misuse("slow copy_from_device: outside every device allocation");
        if (pending_use(src, bytes)) return misuse("slow copy_from_device: device memory pending work uses");
        std::memcpy(dst, src, bytes);
        return {};
    }

    devstage::Result<Stream> create_stream() noexcept {
        std::lock_guard lock(mutex_);
        const std::uint32_t id = ++next_id_;
        streams_[id];
        return Stream{id};
    }
    devstage::Status destroy_stream(Stream stream) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = streams_.find(stream.id);
        if (found == streams_.end()) return misuse("slow destroy_stream: unknown stream");
        run_until(stream.id, next_seq_);
        streams_.erase(stream.id);
        return {};
    }
    devstage::Status copy_to_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept {
        return enqueue_copy(dst, src, bytes, dst, stream);
    }
    devstage::Status copy_from_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept {
        return enqueue_copy(dst, src, bytes, src, stream);
    }

    /// The batch limit given at construction, on every stream.
    std::size_t batch_copy_limit(Stream /*stream*/) const noexcept { return batch_limit_; }
    /// Checks every copy of the batch (inside one device allocation, host side not mapped, not
    /// null), then enqueues them in order; a batch with a bad copy enqueues nothing.
    devstage::Status copy_to_device_batch(void* const* device_dsts, const void* const* host_srcs,
                                          const std::size_t* sizes, std::size_t count, Stream stream) noexcept {
        return enqueue_batch(device_dsts, host_srcs, sizes, count, stream, true);
    }
    devstage::Status copy_from_device_batch(void* const* host_dsts, const void* const* device_srcs,
                                            const std::size_t* sizes, std::size_t count, Stream stream) noexcept {
        return enqueue_batch(host_dsts, device_srcs, sizes, count, stream, false);
    }

    devstage::Result<Event> create_event() noexcept {
        std::lock_guard lock(mutex_);
        const std::uint32_t id = ++next_id_;
        events_[id];
        return Event{id};
    }
    devstage::Status destroy_event(Event event) noexcept {
        std::lock_guard lock(mutex_);
        if (events_.erase(event.id) == 0) return misuse("slow destroy_event: unknown event");
        return {};
    }
    devstage::Status record_event(Event event, Stream stream) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = events_.find(event.id);
        Queue* queue = find(stream);
        if (found == events_.end() || queue == nullptr) return misuse("slow record_event: unknown event or stream");
        auto recording = std::make_shared<Recording>();
        recording->stream = stream.id;
        Op op;
        op.kind = Op::record;
        op.recording = recording;
        recording->seq = push(*queue, op);
        found->second = recording;
        return {};
    }
    devstage::Result<bool> event_ready(Event event) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = events_.find(event.id);
        if (found == events_.end()) return misuse("slow event_ready: unknown event");
        const std::shared_ptr<Recording>& recording = found->second;
        if (!recording || recording->done) return true;
        if (recording->polls++ == 0) return false;  // slow: the first answer is always "not yet"
        run_until(recording->stream, recording->seq);
        return true;
    }
    devstage::Status synchronize_event(Event event) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = events_.find(event.id);
        if (found == events_.end()) return misuse("slow synchronize_event: unknown event");
        if (failing_waits_ > 0) {
            --failing_waits_;
            return devstage::Status(devstage::Errc::backend_failure, "slow synchronize_event: failed (injected)");
        }
        if (found->second && !found->second->done) run_until(found->second->stream, found->second->seq);
        return {};
    }
    devstage::Status stream_wait_event(Stream stream, Event event) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = events_.find(event.id);
        Queue* queue = find(stream);
        if (found == events_.end() || queue == nullptr) return misuse("slow stream_wait_event: unknown handle");
        if (!found->second || found->second->done) return {};
        Op op;
        op.kind = Op::wait;
        op.recording = found->second;
        push(*queue, op);
        return {};
    }
    devstage::Status launch_host_func(Stream stream, devstage::HostFunction function, void* data) noexcept {
        return launch_kernel(stream, function, data, {});
    }
    /// A host function that touches `ranges` (device or mapped memory) until it ran.
    devstage::Status launch_kernel(Stream stream, devstage::HostFunction function, void* data,
                                   std::span<const devstage::KernelAccess> ranges) noexcept {
        std::lock_guard lock(mutex_);
        Queue* queue = find(stream);
        if (queue == nullptr || function == nullptr) return misuse("slow launch_host_func: unknown stream");
        Op op;
        op.kind = Op::host;
        op.function = function;
        op.data = data;
        op.ranges.assign(ranges.begin(), ranges.end());
        push(*queue, op);
        return {};
    }

    /// The next `n` synchronize_event calls fail and run nothing (0: none).
    void fail_next_waits(unsigned n) noexcept {
        std::lock_guard lock(mutex_);
        failing_waits_ = n;
    }

    std::uint64_t misuses() const noexcept {
        std::lock_guard lock(mutex_);
        return misuses_;
    }
    std::string first_misuse() const {
        std::lock_guard lock(mutex_);
        return first_misuse_;
    }
    std::size_t pending_operations() const noexcept {
        std::lock_guard lock(mutex_);
        std::size_t pending = 0;
        for (const auto& [id, queue] : streams_) pending += queue.ops.size();
        return pending;
    }

private:
    struct Recording {
        std::uint32_t stream = 0;
        std::uint64_t seq = 0;
        std::uint32_t polls = 0;
        bool done = false;
    };
    struct Op {
        enum Kind : std::uint8_t { copy, record, wait, host } kind = copy;
        std::uint64_t seq = 0;
        void* dst = nullptr;
        const void* src = nullptr;
        std::size_t bytes = 0;
        const void* device = nullptr;  // a copy's device side
        std::shared_ptr<Recording> recording;
        devstage::HostFunction function = nullptr;
        void* data = nullptr;
        std::vector<devstage::KernelAccess> ranges;
    };
    struct Queue {
        std::deque<Op> ops;
    };

    devstage::Result<void*> allocate(std::map<void*, std::size_t>& blocks, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0) return misuse("slow malloc: 0 bytes");
        void* pointer = std::aligned_alloc(device_alignment, (bytes + device_alignment - 1) & ~(device_alignment - 1));
        if (pointer == nullptr) return devstage::Status(devstage::Errc::out_of_memory, "slow malloc");
        std::memset(pointer, 0x5A, bytes);
        blocks[pointer] = bytes;
        return pointer;
    }
    devstage::Status deallocate(std::map<void*, std::size_t>& blocks, void* pointer, const char* what) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = blocks.find(pointer);
        if (found == blocks.end()) return misuse(std::string("slow ") + what + ": unknown pointer");
        if (pending_use(pointer, found->second)) {
            // Freed under pending work: counted, and kept until the backend dies so the work
            // does not touch freed memory.
            quarantine_.push_back(pointer);
            blocks.erase(found);
            (void)misuse(std::string("slow ") + what + ": memory pending work still uses");
            return {};
        }
        std::free(pointer);
        blocks.erase(found);
        return {};
    }
    static bool inside(const std::map<void*, std::size_t>& blocks, const void* pointer, std::size_t bytes) noexcept {
        auto found = blocks.upper_bound(const_cast<void*>(pointer));
        if (found == blocks.begin()) return false;
        --found;
        const auto* begin = static_cast<const std::byte*>(found->first);
        const auto* at = static_cast<const std::byte*>(pointer);
        return at >= begin && at + bytes <= begin + found->second;
    }
    static bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) noexcept {
        const auto x = reinterpret_cast<std::uintptr_t>(a);
        const auto y = reinterpret_cast<std::uintptr_t>(b);
        return an > 0 && bn > 0 && x < y + bn && y < x + an;
    }
    bool mapped_overlaps(const void* pointer, std::size_t bytes) const noexcept {
        for (const auto& [base, length] : mapped_) {
            if (overlaps(base, length, pointer, bytes)) return true;
        }
        return false;
    }
    bool pending_use(const void* pointer, std::size_t bytes) const noexcept {
        for (const auto& [id, queue] : streams_) {
            for (const Op& op : queue.ops) {
                if (op.kind == Op::copy &&
                    (overlaps(op.device, op.bytes, pointer, bytes) || overlaps(op.dst, op.bytes, pointer, bytes) ||
                     overlaps(op.src, op.bytes, pointer, bytes))) {
                    return true;
                }
                if (op.kind == Op::host) {
                    for (const devstage::KernelAccess& range : op.ranges) {
                        if (overlaps(range.device, range.bytes, pointer, bytes)) return true;
                    }
                }
            }
        }
        return false;
    }
    devstage::Status misuse(std::string what) noexcept {
        if (misuses_++ == 0) first_misuse_ = what;
        return devstage::Status(devstage::Errc::invalid_argument, std::move(what));
    }
    Queue* find(Stream stream) noexcept {
        const auto found = streams_.find(stream.id);
        return found == streams_.end() ? nullptr : &found->second;
    }
    std::uint64_t push(Queue& queue, Op& op) {
        op.seq = ++next_seq_;
        queue.ops.push_back(std::move(op));
        return next_seq_;
    }
    devstage::Status enqueue_copy(void* dst, const void* src, std::size_t bytes, const void* device,
                                  Stream stream) noexcept {
        std::lock_guard lock(mutex_);
        Queue* queue = find(stream);
        if (queue == nullptr) return misuse("slow copy_async: unknown stream");
        if (bytes == 0) return {};
        if (devstage::Status bad = check_copy(dst, src, bytes, device); !bad) return bad;
        push_copy(*queue, dst, src, bytes, device);
        return {};
    }
    devstage::Status check_copy(const void* dst, const void* src, std::size_t bytes, const void* device) noexcept {
        if (mapped_overlaps(device, bytes)) return misuse("slow copy_async: a mapped address as a copy's device side");
        if (!inside(device_, device, bytes)) return misuse("slow copy_async: outside every device allocation");
        if (dst == nullptr || src == nullptr) return misuse("slow copy_async: null pointer");
        return {};
    }
    void push_copy(Queue& queue, void* dst, const void* src, std::size_t bytes, const void* device) {
        Op op;
        op.kind = Op::copy;
        op.dst = dst;
        op.src = src;
        op.bytes = bytes;
        op.device = device;
        push(queue, op);
    }
    devstage::Status enqueue_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                   std::size_t count, Stream stream, bool to_device) noexcept {
        std::lock_guard lock(mutex_);
        Queue* queue = find(stream);
        if (queue == nullptr) return misuse("slow copy batch: unknown stream");
        if (count == 0 || count > batch_limit_) return misuse("slow copy batch: 0 copies, or more than its limit");
        for (std::size_t i = 0; i < count; ++i) {
            if (sizes[i] == 0) return misuse("slow copy batch: a copy of 0 bytes");
            if (devstage::Status bad = check_copy(dsts[i], srcs[i], sizes[i], to_device ? dsts[i] : srcs[i]); !bad) {
                return bad;
            }
        }
        for (std::size_t i = 0; i < count; ++i)
            push_copy(*queue, dsts[i], srcs[i], sizes[i], to_device ? dsts[i] : srcs[i]);
        return {};
    }
    // Runs stream `id` up to and including the operation numbered `seq`, and first, for each
    // wait on the way, what it waits for.
    void run_until(std::uint32_t id, std::uint64_t seq) noexcept {
        for (;;) {
            const auto found = streams_.find(id);
            if (found == streams_.end() || found->second.ops.empty()) return;
            Op& head = found->second.ops.front();
            if (head.seq > seq) return;
            if (head.kind == Op::wait && !head.recording->done) {
                run_until(head.recording->stream, head.recording->seq);
                if (!head.recording->done) head.recording->done = true;  // its stream is gone
            }
            Op op = std::move(found->second.ops.front());
            found->second.ops.pop_front();
            if (op.kind == Op::copy) {
                std::memcpy(op.dst, op.src, op.bytes);
            } else if (op.kind == Op::record) {
                op.recording->done = true;
            } else if (op.kind == Op::host) {
                op.function(op.data);
            }
        }
    }

    mutable std::mutex mutex_;
    std::map<void*, std::size_t> device_, pinned_;
    std::map<const void*, std::size_t> mapped_;
    std::vector<void*> quarantine_;
    std::map<std::uint32_t, Queue> streams_;
    std::map<std::uint32_t, std::shared_ptr<Recording>> events_;
    std::uint32_t next_id_ = 0;
    std::uint64_t next_seq_ = 0;
    std::uint64_t misuses_ = 0;
    std::string first_misuse_;
    unsigned failing_waits_ = 0;
    std::size_t batch_limit_ = 0;
};

static_assert(devstage::AsyncBackend<SlowBackend>);
static_assert(devstage::PinnedHostBackend<SlowBackend>);
static_assert(devstage::HostFunctionBackend<SlowBackend>);
static_assert(devstage::MappedHostBackend<SlowBackend>);
static_assert(devstage::KernelAccessBackend<SlowBackend>);
static_assert(!devstage::SynchronizingBackend<SlowBackend>);
static_assert(devstage::BatchCopyBackend<SlowBackend>);

/// The deferred mock without device_memset_async (nor device_memset): the stager zeroes Out
/// args by uploading zeros from its static block, which the mock's host-hazard checks see.
class NoMemsetMock : public devstage::MockBackend {
public:
    using MockBackend::MockBackend;
    std::string_view name() const noexcept { return "mock without memset"; }
    devstage::Status device_memset_async(void*, int, std::size_t, Stream) noexcept = delete;
    devstage::Status device_memset(void*, int, std::size_t) noexcept = delete;
};
static_assert(devstage::AsyncBackend<NoMemsetMock> && devstage::PinnedHostBackend<NoMemsetMock>);
static_assert(!devstage::AsyncMemsetBackend<NoMemsetMock> && !devstage::MemsetBackend<NoMemsetMock>);

/// The mock as a runtime without streams or events: a Stager sees it through
/// SynchronousAdapter (its stream immediate), so every copy and memset is the synchronous call.
/// It keeps pinned memory and maps it for kernels.
class StreamlessMock {
public:
    static constexpr std::size_t device_alignment = devstage::MockBackend::device_alignment;
    static constexpr std::size_t host_map_alignment = devstage::MockBackend::host_map_alignment;

    explicit StreamlessMock(devstage::MockConfig config = {}) noexcept : mock_(config) {}

    std::string_view name() const noexcept { return "mock without streams"; }
    devstage::Result<void*> device_malloc(std::size_t bytes) noexcept { return mock_.device_malloc(bytes); }
    devstage::Status device_free(void* pointer) noexcept { return mock_.device_free(pointer); }
    devstage::Status copy_to_device(void* dst, const void* src, std::size_t bytes) noexcept {
        return mock_.copy_to_device(dst, src, bytes);
    }
    devstage::Status copy_from_device(void* dst, const void* src, std::size_t bytes) noexcept {
        return mock_.copy_from_device(dst, src, bytes);
    }
    devstage::Status device_memset(void* dst, int value, std::size_t bytes) noexcept {
        return mock_.device_memset(dst, value, bytes);
    }
    devstage::Result<void*> pinned_malloc(std::size_t bytes) noexcept { return mock_.pinned_malloc(bytes); }
    devstage::Status pinned_free(void* pointer) noexcept { return mock_.pinned_free(pointer); }
    devstage::Result<void*> map_host(void* host, std::size_t bytes) noexcept { return mock_.map_host(host, bytes); }
    devstage::Status unmap_host(void* host) noexcept { return mock_.unmap_host(host); }

    std::uint64_t misuses() const noexcept { return mock_.misuses(); }
    std::string misuse_report() const { return mock_.misuse_report(); }

private:
    devstage::MockBackend mock_;
};
static_assert(!devstage::AsyncBackend<StreamlessMock> && devstage::MemsetBackend<StreamlessMock>);
static_assert(devstage::MappedHostBackend<StreamlessMock> && devstage::PinnedHostBackend<StreamlessMock>);

}  // namespace sequential
