// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// SimBackend: an accelerator simulated in host memory, the default backend of the examples
/// and benchmarks. Device memory is mmap'd per allocation (a fresh allocation costs page
/// faults, as on a device), capacity is configurable (out-of-memory is reproducible), pinned
/// memory is really page-locked, and copies from pageable memory go through a bounded bounce
/// buffer in chunks, as drivers do — so pinned vs pageable is measurable without a device.
/// Streams are real: each runs its work in order on a thread of its own. A link model adds
/// the modeled cost of every copy to a counter, so the number of copies shows without a device.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/address_map.hpp"
#include "devstage/detail/align.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// The modeled cost of one kind of copy: a fixed per-call latency plus bytes / bandwidth.
/// `bytes_per_second == 0` is an unlimited link (the latency alone).
/// `SimLinkCost{.latency_ns = 4111, .bytes_per_second = 55'300'000'000}`
struct SimLinkCost {
    std::uint64_t latency_ns = 0;
    std::uint64_t bytes_per_second = 0;

    /// latency_ns + bytes / bytes_per_second in nanoseconds, rounded to the nearest
    /// (saturating at the largest std::uint64_t).
    std::uint64_t nanoseconds(std::size_t bytes) const noexcept {
        constexpr auto most = std::numeric_limits<std::uint64_t>::max();
        if (bytes_per_second == 0) return latency_ns;
        const double transfer = static_cast<double>(bytes) * 1e9 / static_cast<double>(bytes_per_second) + 0.5;
        if (transfer >= static_cast<double>(most)) return most;
        const auto rounded = static_cast<std::uint64_t>(transfer);
        return rounded > most - latency_ns ? most : latency_ns + rounded;
    }
};

/// The link model of a SimBackend: one cost per kind of copy. The defaults come from the
/// H200 figures in docs/backends.md (pinned: 55.3 GB/s both ways; pageable: 6.85 GB/s, the
/// middle of the measured 6.5–7.2 GB/s host-to-device range, assumed for both ways; every
/// copy 4111 ns per call, derived from the per-tensor and packed decode-step rows).
/// `SimConfig{.link = SimLinkModel::uniform({.latency_ns = 1000})}`
struct SimLinkModel {
    SimLinkCost to_device_pinned{4111, 55'300'000'000};
    SimLinkCost from_device_pinned{4111, 55'300'000'000};
    SimLinkCost to_device_pageable{4111, 6'850'000'000};
    SimLinkCost from_device_pageable{4111, 6'850'000'000};

    /// The same cost for every kind of copy.
    static constexpr SimLinkModel uniform(SimLinkCost cost) noexcept { return {cost, cost, cost, cost}; }
};

/// Construction options of a SimBackend. `SimBackend sim(SimConfig{.device_capacity = 1 << 20});`
struct SimConfig {
    std::size_t device_capacity = std::size_t{64} << 30;     ///< bytes device_malloc may hand out
    std::size_t bounce_buffer_bytes = std::size_t{2} << 20;  ///< chunk size of pageable copies
    bool lock_pinned = true;  ///< mlock pinned allocations (refusal is tolerated and reported)
    SimLinkModel link{};      ///< the modeled cost of each copy, summed in SimStats::modeled_ns
};

/// Counters of a SimBackend since construction.
struct SimStats {
    std::uint64_t device_mallocs = 0, device_frees = 0;
    std::uint64_t pinned_mallocs = 0, pinned_frees = 0;
    std::uint64_t pinned_lock_failures = 0;  ///< pinned allocations left unlocked (mlock refused)
    /// Copies each way, synchronous and asynchronous; bytes each way.
    std::uint64_t copies_to_device = 0, copies_from_device = 0, memsets = 0, synchronizes = 0;
    std::uint64_t bytes_to_device = 0, bytes_from_device = 0;
    std::uint64_t bounced_bytes = 0;  ///< bytes that went through the bounce buffer (pageable)
    std::uint64_t direct_bytes = 0;   ///< bytes copied directly (from or to pinned memory)
    std::uint64_t failed_calls = 0;
    std::uint64_t live_device_bytes = 0, peak_device_bytes = 0, live_pinned_bytes = 0;
    std::uint64_t vmm_reservations = 0;  ///< live reserved address ranges
    std::uint64_t vmm_chunks = 0;        ///< live physical chunks
    std::uint64_t vmm_mapped_bytes = 0;  ///< bytes mapped into reservations now
    /// The link model's cost of every copy so far (SimConfig::link), in nanoseconds.
    std::uint64_t modeled_ns = 0;
    /// Copies enqueued on a stream, each way (also counted in copies_to/from_device).
    std::uint64_t async_copies_to_device = 0, async_copies_from_device = 0;
    std::uint64_t pageable_async_copies = 0;  ///< async copies of pageable memory: the host blocked
    std::uint64_t live_streams = 0, live_events = 0;
    std::uint64_t events_recorded = 0, stream_waits = 0, event_synchronizes = 0, host_functions = 0;
};

/// The simulated accelerator. Thread-safe. `SimBackend sim; Stager<SimBackend> stager(sim);`
///
/// Streams: `create_stream` starts a worker thread that runs the stream's work in order.
/// Copies between device memory and the sim's pinned memory are truly asynchronous; copies
/// of pageable memory block the caller until they ran, as cudaMemcpyAsync does. Frees wait
/// until every stream is idle, as cudaFree synchronizes the device. A host function runs on
/// its stream's worker; it may call the sim's allocation, copy and memset operations, but a
/// stream or event operation, synchronize() or a free from a host function is
/// invalid_argument (it could wait for itself).
class SimBackend {
public:
    static constexpr std::size_t device_alignment = 256;

    /// A stream: its work runs in order on a thread of its own.
    struct Stream {
        std::uint32_t id = 0;
        friend bool operator==(Stream, Stream) = default;
    };
    /// A point of a stream, for the host or another stream to wait on.
    struct Event {
        std::uint32_t id = 0;
        friend bool operator==(Event, Event) = default;
    };

    SimBackend() noexcept : SimBackend(SimConfig{}) {}
    explicit SimBackend(SimConfig config) noexcept : config_(config) {
        config_.bounce_buffer_bytes = std::max<std::size_t>(config_.bounce_buffer_bytes, 4096);
    }
    SimBackend(const SimBackend&) = delete;
    SimBackend& operator=(const SimBackend&) = delete;
    /// Drains and joins every live stream, then unmaps whatever is still allocated.
    ~SimBackend() {
        {
            std::lock_guard queue(queue_mutex_);
            for (auto& [id, worker] : streams_) {
                worker->stop = true;
                worker->work.notify_one();
            }
        }
        // No other thread may use a sim being destroyed, and a host function cannot create or
        // destroy streams, so the map does not change while the workers drain.
        for (auto& [id, worker] : streams_) worker->thread.join();
        streams_.clear();
        device_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.info); });
        reservations_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.bytes); });
        pinned_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.info.mapped); });
        if (bounce_ != nullptr) ::munmap(bounce_, config_.bounce_buffer_bytes);
    }

    std::string_view name() const noexcept { return "sim"; }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0) return fail(Errc::invalid_argument, detail::message("sim device_malloc: 0 bytes requested"));
        if (bytes > config_.device_capacity - stats_.live_device_bytes) {
            return fail(Errc::out_of_memory,
                        detail::message("sim device_malloc: ", bytes, " bytes requested, ", stats_.live_device_bytes,
                                        " of ", config_.device_capacity, " bytes in use"));
        }
        const auto mapped = round_to_page(bytes);
        if (!mapped) {
            return fail(Errc::out_of_memory,
                        detail::message("sim device_malloc: ", bytes, " bytes requested exceed the address space"));
        }
        void* base = ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory, detail::message("sim device_malloc: mmap of ", *mapped, " bytes failed"));
        }
        if (!detail::without_bad_alloc([&] { device_.insert(base, bytes, *mapped); })) {
            ::munmap(base, *mapped);
            return fail(Errc::out_of_memory, detail::message("sim device_malloc: host memory exhausted recording ",
                                                             bytes, " bytes of device memory"));
        }
        ++stats_.device_mallocs;
        stats_.live_device_bytes += bytes;
        stats_.peak_device_bytes = std::max(stats_.peak_device_bytes, stats_.live_device_bytes);
        return base;
    }

    /// Waits until every stream is idle, then frees.
    Status device_free(void* pointer) noexcept {
        if (on_worker()) return refuse("device_free");
        auto lock = lock_idle();
        const auto entry = device_.erase(pointer);
        if (!entry) {
            return fail(Errc::unknown_pointer, detail::message("sim device_free: ", static_cast<const void*>(pointer),
                                                               " is not a live device allocation"));
        }
        ::munmap(pointer, entry->info);
        ++stats_.device_frees;
        stats_.live_device_bytes -= entry->bytes;
        return {};
    }

    /// Synchronous: done when the call returns. Not ordered with any stream's work (as a copy on
    /// a stream of its own would be).
    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        return copy(device_dst, host_src, bytes, host_src, device_dst, "copy_to_device");
    }

    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        return copy(host_dst, device_src, bytes, host_dst, device_src, "copy_from_device");
    }

    Status device_memset(void* device_dst, int value, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes > 0 && !is_device(device_dst, bytes)) {
            return fail(Errc::invalid_argument,
                        detail::message("sim device_memset: ", bytes, " bytes at ",
                                        static_cast<const void*>(device_dst), " are not inside one device allocation"));
        }
        if (bytes > 0) std::memset(device_dst, value, bytes);
        ++stats_.memsets;
        return {};
    }

    /// Waits until every stream is idle.
    Status synchronize() noexcept {
        if (on_worker()) return refuse("synchronize");
        {
            std::lock_guard lock(mutex_);
            ++stats_.synchronizes;
        }
        std::unique_lock queue(queue_mutex_);
        idle_.wait(queue, [this] { return all_idle(); });
        return {};
    }

    // ---- streams and events ----------------------------------------------------------------

    /// Starts a stream and its worker thread.
    Result<Stream> create_stream() noexcept {
        if (on_worker()) return refuse("create_stream");
        std::lock_guard lock(mutex_);
        std::lock_guard queue(queue_mutex_);
        const Stream stream{next_stream_ + 1};
        Worker* worker = nullptr;
        if (!detail::without_bad_alloc(
                [&] { worker = streams_.emplace(stream.id, std::make_unique<Worker>()).first->second.get(); })) {
            return fail(Errc::out_of_memory, detail::message("sim create_stream: host memory exhausted"));
        }
        if (Status started = start(*worker); !started) {
            streams_.erase(stream.id);
            return fail(started.code(), started.message());
        }
        next_stream_ = stream.id;
        ++stats_.live_streams;
        return stream;
    }

    /// Runs the stream's remaining work, then ends its thread. An unknown stream is
    /// invalid_argument.
    Status destroy_stream(Stream stream) noexcept {
        if (on_worker()) return refuse("destroy_stream");
        Worker* worker = nullptr;
        {
            std::lock_guard lock(mutex_);
            std::lock_guard queue(queue_mutex_);
            worker = find_stream(stream);
            if (worker == nullptr) return unknown_stream("destroy_stream", stream);
            worker->stop = true;  // no more work is accepted; what is queued still runs
            worker->work.notify_one();
            --stats_.live_streams;
        }
        worker->thread.join();
        std::lock_guard queue(queue_mutex_);
        streams_.erase(stream.id);
        idle_.notify_all();  // synchronize() no longer waits for this stream
        return {};
    }

    /// Validated at the call; then enqueued on `stream`. From the sim's pinned memory the call
    /// returns at once; from pageable memory it returns once the copy ran.
    Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, Stream stream) noexcept {
        return copy_async(device_dst, host_src, bytes, host_src, device_dst, stream, "copy_to_device_async");
    }

    /// As copy_to_device_async, the other way.
    Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes, Stream stream) noexcept {
        return copy_async(host_dst, device_src, bytes, host_dst, device_src, stream, "copy_from_device_async");
    }

    Result<Event> create_event() noexcept {
        if (on_worker()) return refuse("create_event");
        std::lock_guard lock(mutex_);
        std::lock_guard queue(queue_mutex_);
        const Event event{next_event_ + 1};
        if (!detail::without_bad_alloc([&] { events_.emplace(event.id, nullptr); })) {
            return fail(Errc::out_of_memory, detail::message("sim create_event: host memory exhausted"));
        }
        next_event_ = event.id;
        ++stats_.live_events;
        return event;
    }

    /// Work already waiting for the event's recording still waits for it.
    Status destroy_event(Event event) noexcept {
        if (on_worker()) return refuse("destroy_event");
        std::lock_guard lock(mutex_);
        std::lock_guard queue(queue_mutex_);
        if (events_.erase(event.id) == 0) return unknown_event("destroy_event", event);
        --stats_.live_events;
        return {};
    }

    /// The event completes when the stream's worker reaches this point.
    Status record_event(Event event, Stream stream) noexcept {
        if (on_worker()) return refuse("record_event");
        std::lock_guard lock(mutex_);
        std::lock_guard queue(queue_mutex_);
        const auto found = events_.find(event.id);
        if (found == events_.end()) return unknown_event("record_event", event);
        Worker* worker = find_stream(stream);
        if (worker == nullptr) return unknown_stream("record_event", stream);
        std::shared_ptr<Marker> marker;
        if (!detail::without_bad_alloc([&] {
                marker = std::make_shared<Marker>();
                worker->queue.push_back(Task{.kind = Task::Kind::signal, .marker = marker});
            })) {
            return fail(Errc::out_of_memory, detail::message("sim record_event: host memory exhausted"));
        }
        found->second = std::move(marker);
        ++stats_.events_recorded;
        worker->work.notify_one();
        return {};
    }

    /// True when the event's latest recording completed (or it was never recorded). Never
    /// blocks.
    Result<bool> event_ready(Event event) noexcept {
        if (on_worker()) return refuse("event_ready");
        std::lock_guard lock(mutex_);
        std::lock_guard queue(queue_mutex_);
        const auto found = events_.find(event.id);
        if (found == events_.end()) return unknown_event("event_ready", event);
        return found->second == nullptr || found->second->done;
    }

    /// Blocks until the event's latest recording completed.
    Status synchronize_event(Event event) noexcept {
        if (on_worker()) return refuse("synchronize_event");
        std::unique_lock lock(mutex_);
        std::unique_lock queue(queue_mutex_);
        const auto found = events_.find(event.id);
        if (found == events_.end()) return unknown_event("synchronize_event", event);
        const std::shared_ptr<Marker> marker = found->second;
        ++stats_.event_synchronizes;
        lock.unlock();
        if (marker != nullptr) idle_.wait(queue, [&marker] { return marker->done; });
        return {};
    }

    /// Later work on `stream` waits for the event's recording as of this call (a later
    /// re-recording does not change it). The host does not block.
    Status stream_wait_event(Stream stream, Event event) noexcept {
        if (on_worker()) return refuse("stream_wait_event");
        std::lock_guard lock(mutex_);
        std::lock_guard queue(queue_mutex_);
        const auto found = events_.find(event.id);
        if (found == events_.end()) return unknown_event("stream_wait_event", event);
        Worker* worker = find_stream(stream);
        if (worker == nullptr) return unknown_stream("stream_wait_event", stream);
        ++stats_.stream_waits;
        if (found->second == nullptr || found->second->done) return {};
        if (!detail::without_bad_alloc(
                [&] { worker->queue.push_back(Task{.kind = Task::Kind::wait, .marker = found->second}); })) {
            return fail(Errc::out_of_memory, detail::message("sim stream_wait_event: host memory exhausted"));
        }
        worker->work.notify_one();
        return {};
    }

    /// Enqueues `function(user_data)` on `stream`; it runs on the stream's worker, in order.
    Status launch_host_func(Stream stream, HostFunction function, void* user_data) noexcept {
        if (on_worker()) return refuse("launch_host_func");
        std::lock_guard lock(mutex_);
        std::lock_guard queue(queue_mutex_);
        Worker* worker = find_stream(stream);
        if (worker == nullptr) return unknown_stream("launch_host_func", stream);
        if (function == nullptr) {
            return fail(Errc::invalid_argument, detail::message("sim launch_host_func: null function"));
        }
        if (!detail::without_bad_alloc([&] {
                worker->queue.push_back(Task{
                    .kind = Task::Kind::host_function, .function = function, .user_data = user_data, .marker = {}});
            })) {
            return fail(Errc::out_of_memory, detail::message("sim launch_host_func: host memory exhausted"));
        }
        ++stats_.host_functions;
        worker->work.notify_one();
        return {};
    }

    /// Page-locked host memory: mmap'd, pre-faulted and mlock'd. When mlock is refused
    /// (RLIMIT_MEMLOCK) the allocation still succeeds, unlocked; pinned_locked() tells.
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0) return fail(Errc::invalid_argument, detail::message("sim pinned_malloc: 0 bytes requested"));
        const auto mapped = round_to_page(bytes);
        if (!mapped) {
            return fail(Errc::out_of_memory,
                        detail::message("sim pinned_malloc: ", bytes, " bytes requested exceed the address space"));
        }
        void* base =
            ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory, detail::message("sim pinned_malloc: mmap of ", *mapped,
                                                             " bytes failed for ", bytes, " bytes requested"));
        }
        const bool locked = config_.lock_pinned && ::mlock(base, *mapped) == 0;
        if (!detail::without_bad_alloc([&] { pinned_.insert(base, bytes, PinnedInfo{*mapped, locked}); })) {
            ::munmap(base, *mapped);
            return fail(Errc::out_of_memory, detail::message("sim pinned_malloc: host memory exhausted recording ",
                                                             bytes, " bytes of pinned memory"));
        }
        if (!locked) ++stats_.pinned_lock_failures;
        ++stats_.pinned_mallocs;
        stats_.live_pinned_bytes += bytes;
        return base;
    }

    /// Waits until every stream is idle, then frees.
    Status pinned_free(void* pointer) noexcept {
        if (on_worker()) return refuse("pinned_free");
        auto lock = lock_idle();
        const auto entry = pinned_.erase(pointer);
        if (!entry) {
            return fail(Errc::unknown_pointer, detail::message("sim pinned_free: ", static_cast<const void*>(pointer),
                                                               " is not a live pinned allocation"));
        }
        ::munmap(pointer, entry->info.mapped);  // also unlocks
        ++stats_.pinned_frees;
        stats_.live_pinned_bytes -= entry->bytes;
        return {};
    }

    // ---- virtual memory: in-place growth -------------------------------------------------
    // A reservation is an mmap(PROT_NONE) range; a physical chunk is capacity accounting until
    // mapped, when its pages become an anonymous MAP_FIXED mapping inside the range. Chunks
    // map contiguously from the start of a reservation and unmap from its end.
    using PhysicalHandle = std::uint64_t;

    std::size_t vmm_granularity() const noexcept { return std::size_t{64} << 10; }

    Result<void*> vmm_reserve(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0 || bytes % vmm_granularity() != 0) {
            return fail(Errc::invalid_argument,
                        detail::message("sim vmm_reserve: ", bytes,
                                        " bytes is not a positive multiple of the granularity ", vmm_granularity()));
        }
        void* base = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory,
                        detail::message("sim vmm_reserve: ", bytes, " bytes of address space refused"));
        }
        if (!detail::without_bad_alloc([&] { reservations_.insert(base, bytes, 0); })) {
            ::munmap(base, bytes);
            return fail(Errc::out_of_memory,
                        detail::message("sim vmm_reserve: host memory exhausted recording ", bytes, " bytes"));
        }
        ++stats_.vmm_reservations;
        return base;
    }

    Status vmm_release(void* base) noexcept {
        std::lock_guard lock(mutex_);
        const auto* reservation = reservations_.at(base);
        if (reservation == nullptr || reservation->info != 0) {
            return fail(reservation == nullptr ? Errc::unknown_pointer : Errc::busy,
                        detail::message("sim vmm_release: ", static_cast<const void*>(base),
                                        reservation == nullptr ? " is not a reservation" : " still has mapped chunks"));
        }
        ::munmap(base, reservation->bytes);
        (void)reservations_.erase(base);
        --stats_.vmm_reservations;
        return {};
    }

    Result<PhysicalHandle> vmm_create(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0 || bytes % vmm_granularity() != 0) {
            return fail(
                Errc::invalid_argument,
                detail::message("sim vmm_create: ", bytes, " bytes is not a positive multiple of the granularity"));
        }
        if (bytes > config_.device_capacity - stats_.live_device_bytes) {
            return fail(Errc::out_of_memory,
                        detail::message("sim vmm_create: ", bytes, " bytes requested, ", stats_.live_device_bytes,
                                        " of ", config_.device_capacity, " bytes in use"));
        }
        const PhysicalHandle handle = next_handle_ + 1;
        if (!detail::without_bad_alloc([&] { chunks_.emplace(handle, Chunk{bytes, nullptr}); })) {
            return fail(Errc::out_of_memory,
                        detail::message("sim vmm_create: host memory exhausted recording ", bytes, " bytes"));
        }
        next_handle_ = handle;
        stats_.live_device_bytes += bytes;
        stats_.peak_device_bytes = std::max(stats_.peak_device_bytes, stats_.live_device_bytes);
        ++stats_.vmm_chunks;
        return handle;
    }

    /// Waits until every stream is idle, then frees.
    Status vmm_free(PhysicalHandle handle) noexcept {
        if (on_worker()) return refuse("vmm_free");
        auto lock = lock_idle();
        const auto found = chunks_.find(handle);
        if (found == chunks_.end() || found->second.mapped_at != nullptr) {
            return fail(found == chunks_.end() ? Errc::unknown_pointer : Errc::busy,
                        detail::message("sim vmm_free: chunk ", handle,
                                        found == chunks_.end() ? " is unknown" : " is still mapped"));
        }
        stats_.live_device_bytes -= found->second.bytes;
        chunks_.erase(found);
        --stats_.vmm_chunks;
        return {};
    }

    Status vmm_map(void* address, std::size_t bytes, PhysicalHandle handle) noexcept {
        std::lock_guard lock(mutex_);
        const auto chunk = chunks_.find(handle);
        void* base = reservations_.base_of(address, bytes);
        if (chunk == chunks_.end() || chunk->second.mapped_at != nullptr || chunk->second.bytes != bytes ||
            base == nullptr) {
            return fail(Errc::invalid_argument, detail::message("sim vmm_map: chunk ", handle, " of ", bytes,
                                                                " bytes cannot be mapped at ", address));
        }
        auto* reservation = reservations_.at(base);
        if (static_cast<std::byte*>(base) + reservation->info != address) {
            return fail(Errc::not_supported, detail::message("sim vmm_map: ", address,
                                                             " is not the end of the mapped part of its reservation"));
        }
        // The mapped prefix is recorded first: the one step that allocates host memory, so its
        // failure leaves everything as it was.
        const bool first = reservation->info == 0;
        if (first && !detail::without_bad_alloc([&] { vmm_mapped_.insert(base, 0, 0); })) {
            return fail(Errc::out_of_memory,
                        detail::message("sim vmm_map: host memory exhausted recording ", bytes, " bytes"));
        }
        if (::mmap(address, bytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
            MAP_FAILED) {
            if (first) (void)vmm_mapped_.erase(base);
            return fail(Errc::out_of_memory, detail::message("sim vmm_map: mapping ", bytes, " bytes failed"));
        }
        chunk->second.mapped_at = address;
        reservation->info += bytes;
        vmm_mapped_.at(base)->bytes = reservation->info;
        stats_.vmm_mapped_bytes += bytes;
        return {};
    }

    /// Waits until every stream is idle, then unmaps.
    Status vmm_unmap(void* address, std::size_t bytes) noexcept {
        if (on_worker()) return refuse("vmm_unmap");
        auto lock = lock_idle();
        void* base = reservations_.base_of(address, bytes);
        auto* reservation = base == nullptr ? nullptr : reservations_.at(base);
        if (reservation == nullptr ||
            static_cast<std::byte*>(address) + bytes != static_cast<std::byte*>(base) + reservation->info) {
            return fail(Errc::invalid_argument, detail::message("sim vmm_unmap: ", bytes, " bytes at ", address,
                                                                " are not the last mapped chunk of a reservation"));
        }
        if (::mmap(address, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) ==
            MAP_FAILED) {
            return fail(Errc::backend_failure, detail::message("sim vmm_unmap: remapping ", bytes, " bytes failed"));
        }
        for (auto& [handle, chunk] : chunks_) {
            if (chunk.mapped_at == address) chunk.mapped_at = nullptr;
        }
        reservation->info -= bytes;
        if (reservation->info == 0) {
            (void)vmm_mapped_.erase(base);
        } else {
            vmm_mapped_.at(base)->bytes = reservation->info;
        }
        stats_.vmm_mapped_bytes -= bytes;
        return {};
    }

    /// True when `pointer` lies in one of this backend's pinned allocations.
    bool is_pinned(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return pinned_.contains(pointer, 1);
    }
    /// True when `pointer` lies in a pinned allocation that is really page-locked.
    bool pinned_locked(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        const auto* entry = pinned_.containing(pointer, 1);
        return entry != nullptr && entry->info.locked;
    }

    SimStats stats() const noexcept {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    const SimConfig& config() const noexcept { return config_; }

private:
    struct PinnedInfo {
        std::size_t mapped;
        bool locked;
    };
    struct Chunk {
        std::size_t bytes;
        void* mapped_at;
    };
    // A recording of an event: done once its stream's worker reached it. Guarded by
    // queue_mutex_.
    struct Marker {
        bool done = false;
    };
    struct Task {
        enum class Kind : std::uint8_t { copy, bounced_copy, host_function, signal, wait };
        Kind kind = Kind::signal;
        void* dst = nullptr;
        const void* src = nullptr;
        std::size_t bytes = 0;
        HostFunction function = nullptr;
        void* user_data = nullptr;
        // signal and copy: marked done once the task ran; wait: the recording waited for.
        std::shared_ptr<Marker> marker;
    };
    // A stream: its queue, flags and condition are guarded by queue_mutex_.
    struct Worker {
        std::deque<Task> queue;
        std::condition_variable work;
        bool busy = false;
        bool stop = false;  // set by destroy_stream: drain, then end
        std::thread thread;
    };

    // The sim whose worker runs on this thread, if any.
    static const SimBackend*& running_on() noexcept {
        thread_local const SimBackend* owner = nullptr;
        return owner;
    }
    bool on_worker() const noexcept { return running_on() == this; }
    Status refuse(std::string_view what) noexcept {
        std::lock_guard lock(mutex_);
        return fail(Errc::invalid_argument,
                    detail::message("sim ", what, ": called from a host function, which must not wait for streams"));
    }

    // queue_mutex_ held. A stream being destroyed is no longer known.
    Worker* find_stream(Stream stream) noexcept {
        const auto found = streams_.find(stream.id);
        return found == streams_.end() || found->second->stop ? nullptr : found->second.get();
    }
    Status unknown_stream(std::string_view what, Stream stream) noexcept {
        return fail(Errc::invalid_argument, detail::message("sim ", what, ": unknown stream ", stream.id));
    }
    Status unknown_event(std::string_view what, Event event) noexcept {
        return fail(Errc::invalid_argument, detail::message("sim ", what, ": unknown event ", event.id));
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
        std::unique_lock queue(queue_mutex_);
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
                bounce_copy(task.dst, task.src, task.bytes);
                break;
            case Task::Kind::host_function:
                task.function(task.user_data);
                break;
            case Task::Kind::signal:
            case Task::Kind::wait:
                break;
        }
    }

    // queue_mutex_ held.
    bool all_idle() const noexcept {
        return std::all_of(streams_.begin(), streams_.end(),
                           [](const auto& entry) { return entry.second->queue.empty() && !entry.second->busy; });
    }

    // mutex_, held with no stream work pending: a free that follows cannot race work that
    // touches the memory, and later copies are validated against the freed state.
    std::unique_lock<std::mutex> lock_idle() noexcept {
        std::unique_lock lock(mutex_);
        for (;;) {
            std::unique_lock queue(queue_mutex_);
            if (all_idle()) return lock;
            lock.unlock();
            idle_.wait(queue, [this] { return all_idle(); });
            queue.unlock();
            lock.lock();
        }
    }

    bool is_device(const void* pointer, std::size_t bytes) const noexcept {
        return device_.contains(pointer, bytes) || vmm_mapped_.contains(pointer, bytes);
    }

    static std::optional<std::size_t> round_to_page(std::size_t bytes) noexcept {
        static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return detail::round_up(bytes, page);
    }

    Status fail(Errc code, std::string message) noexcept {
        ++stats_.failed_calls;
        return Status(code, std::move(message));
    }

    // mutex_ held. Checks a copy between `host` and `device` (the two sides of dst and src).
    Status check_copy(const void* host, const void* device, std::size_t bytes, std::string_view what) noexcept {
        if (!is_device(device, bytes)) {
            return fail(Errc::invalid_argument, detail::message("sim ", what, ": ", bytes, " bytes at device address ",
                                                                device, " are not inside one device allocation"));
        }
        if (host == nullptr) return fail(Errc::invalid_argument, detail::message("sim ", what, ": null host pointer"));
        return {};
    }

    // mutex_ held. Counts a copy that will happen, and its modeled cost.
    void account(bool to_device, bool pinned, std::size_t bytes) noexcept {
        ++(to_device ? stats_.copies_to_device : stats_.copies_from_device);
        (to_device ? stats_.bytes_to_device : stats_.bytes_from_device) += bytes;
        (pinned ? stats_.direct_bytes : stats_.bounced_bytes) += bytes;
        const SimLinkModel& link = config_.link;
        const SimLinkCost& cost = to_device ? (pinned ? link.to_device_pinned : link.to_device_pageable)
                                            : (pinned ? link.from_device_pinned : link.from_device_pageable);
        const std::uint64_t ns = cost.nanoseconds(bytes);
        stats_.modeled_ns = ns > std::numeric_limits<std::uint64_t>::max() - stats_.modeled_ns
                                ? std::numeric_limits<std::uint64_t>::max()
                                : stats_.modeled_ns + ns;
    }

    // mutex_ held. The driver cannot DMA from pageable memory, so it stages it through its own
    // page-locked bounce buffer one chunk at a time.
    Status ensure_bounce(std::string_view what) noexcept {
        if (bounce_ != nullptr) return {};
        void* bounce = ::mmap(nullptr, config_.bounce_buffer_bytes, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (bounce == MAP_FAILED) {
            return fail(Errc::out_of_memory, detail::message("sim ", what, ": bounce buffer of ",
                                                             config_.bounce_buffer_bytes, " bytes unavailable"));
        }
        (void)::mlock(bounce, config_.bounce_buffer_bytes);
        bounce_ = static_cast<std::byte*>(bounce);
        return {};
    }
    void bounce_copy(void* dst, const void* src, std::size_t bytes) noexcept {
        std::lock_guard bounce_lock(bounce_mutex_);
        auto* out = static_cast<std::byte*>(dst);
        const auto* in = static_cast<const std::byte*>(src);
        for (std::size_t done = 0; done < bytes;) {
            const std::size_t chunk = std::min(config_.bounce_buffer_bytes, bytes - done);
            std::memcpy(bounce_, in + done, chunk);
            std::memcpy(out + done, bounce_, chunk);
            done += chunk;
        }
    }

    // `host` is the host side of the copy, `device` the device side.
    Status copy(void* dst, const void* src, std::size_t bytes, const void* host, const void* device,
                std::string_view what) noexcept {
        std::unique_lock lock(mutex_);
        if (bytes == 0) return {};
        if (Status checked = check_copy(host, device, bytes, what); !checked) return checked;
        const bool pinned = pinned_.contains(host, bytes);
        if (!pinned) {
            if (Status bounce = ensure_bounce(what); !bounce) return bounce;
        }
        account(device == dst, pinned, bytes);
        lock.unlock();
        if (pinned) {
            std::memcpy(dst, src, bytes);
        } else {
            bounce_copy(dst, src, bytes);
        }
        return {};
    }

    Status copy_async(void* dst, const void* src, std::size_t bytes, const void* host, const void* device,
                      Stream stream, std::string_view what) noexcept {
        if (on_worker()) return refuse(what);
        std::unique_lock lock(mutex_);
        std::unique_lock queue(queue_mutex_);
        Worker* worker = find_stream(stream);
        if (worker == nullptr) return unknown_stream(what, stream);
        if (bytes == 0) return {};
        if (Status checked = check_copy(host, device, bytes, what); !checked) return checked;
        const bool pinned = pinned_.contains(host, bytes);
        if (!pinned) {
            if (Status bounce = ensure_bounce(what); !bounce) return bounce;
        }
        std::shared_ptr<Marker> ran;
        if (!detail::without_bad_alloc([&] {
                if (!pinned) ran = std::make_shared<Marker>();
                worker->queue.push_back(Task{.kind = pinned ? Task::Kind::copy : Task::Kind::bounced_copy,
                                             .dst = dst,
                                             .src = src,
                                             .bytes = bytes,
                                             .marker = ran});
            })) {
            return fail(Errc::out_of_memory,
                        detail::message("sim ", what, ": host memory exhausted enqueueing ", bytes, " bytes"));
        }
        const bool to_device = device == dst;
        account(to_device, pinned, bytes);
        ++(to_device ? stats_.async_copies_to_device : stats_.async_copies_from_device);
        if (!pinned) ++stats_.pageable_async_copies;
        worker->work.notify_one();
        if (pinned) return {};
        // Pageable memory: the call returns once the copy ran, as cudaMemcpyAsync does.
        lock.unlock();
        idle_.wait(queue, [&ran] { return ran->done; });
        return {};
    }

    SimConfig config_;
    mutable std::mutex mutex_;  // allocations, counters, the bounce buffer's address
    std::mutex bounce_mutex_;
    detail::AddressMap<std::size_t> device_;  // info: mapped bytes
    detail::AddressMap<PinnedInfo> pinned_;
    detail::AddressMap<std::size_t> reservations_;  // info: bytes mapped from the start
    detail::AddressMap<int> vmm_mapped_;            // the mapped prefix of each reservation
    std::map<PhysicalHandle, Chunk> chunks_;
    PhysicalHandle next_handle_ = 0;
    std::byte* bounce_ = nullptr;
    SimStats stats_;

    // Streams and events. Lock order: mutex_, then queue_mutex_; a worker takes only
    // queue_mutex_, and runs its tasks with no lock held.
    std::mutex queue_mutex_;
    std::condition_variable idle_;  // a task finished: a recording completed, a stream may be idle
    std::map<std::uint32_t, std::unique_ptr<Worker>> streams_;
    std::map<std::uint32_t, std::shared_ptr<Marker>> events_;  // the latest recording; null: never recorded
    std::uint32_t next_stream_ = 0;
    std::uint32_t next_event_ = 0;
};

static_assert(Backend<SimBackend>);
static_assert(PinnedHostBackend<SimBackend>);
static_assert(MemsetBackend<SimBackend>);
static_assert(SynchronizingBackend<SimBackend>);
static_assert(VirtualMemoryBackend<SimBackend>);
static_assert(AsyncBackend<SimBackend>);
static_assert(HostFunctionBackend<SimBackend>);

}  // namespace devstage
