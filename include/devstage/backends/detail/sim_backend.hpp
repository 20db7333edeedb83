// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the SimBackend class, declared with its inline members; the members defined out of line
// are its parts in backends/detail/sim_*.hpp, each of which includes this header. Include
// devstage/backends/sim.hpp, which assembles them.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/detail/sim_bounce.hpp"
#include "devstage/backends/detail/sim_memory.hpp"
#include "devstage/backends/detail/sim_streams.hpp"
#include "devstage/backends/detail/sim_vmm.hpp"
#include "devstage/backends/detail/teardown_list.hpp"
#include "devstage/backends/sim_config.hpp"
#include "devstage/backends/sim_host.hpp"
#include "devstage/backends/sim_link.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage {

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
    /// Pinning is mlock, bounded by RLIMIT_MEMLOCK: a pinned pool checks big requests against it.
    static constexpr bool pins_with_mlock = true;

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

    SimBackend() : SimBackend(SimConfig{}) {}
    /// A device with a host of its own.
    explicit SimBackend(SimConfig config) : SimBackend(config, SimHost{}) {}
    /// Device `config.device` of `host`, sharing its pinned memory with the host's other devices.
    SimBackend(SimConfig config, SimHost host) noexcept
        : config_(config), host_(std::move(host)), bounce_(std::max<std::size_t>(config.bounce_buffer_bytes, 4096)) {
        config_.bounce_buffer_bytes = bounce_.size();
    }
    SimBackend(const SimBackend&) = delete;
    SimBackend& operator=(const SimBackend&) = delete;
    /// Runs the teardown hooks (pinned pools give back their memory), then drains and joins
    /// every live stream, then unmaps whatever is still allocated.
    ~SimBackend() {
        teardown_.run_all();
        streams_.shutdown();
    }

    /// TeardownBackend: `hook` runs before the backend goes.
    Result<std::uint64_t> add_teardown_hook(TeardownHook hook) noexcept { return teardown_.add(hook, name()); }
    void remove_teardown_hook(std::uint64_t id) noexcept { teardown_.remove(id); }

    std::string_view name() const noexcept { return "sim"; }
    /// SimConfig::device.
    int device_id() const noexcept { return config_.device; }
    /// The simulated host this device shares (sim_host.hpp).
    const SimHost& host() const noexcept { return host_; }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        return memory_.device_malloc(bytes);
    }

    /// Waits until every stream is idle, then frees.
    Status device_free(void* pointer) noexcept {
        if (on_worker()) return refuse("device_free");
        auto lock = lock_idle();
        return memory_.device_free(pointer);
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
        streams_.synchronize();
        return {};
    }

    // ---- streams and events ----------------------------------------------------------------

    /// Starts a stream and its worker thread.
    Result<Stream> create_stream() noexcept {
        if (on_worker()) return refuse("create_stream");
        std::lock_guard lock(mutex_);
        Result<std::uint32_t> id = streams_.create_stream();
        if (!id) return id.status();
        return Stream{*id};
    }

    /// Runs the stream's remaining work, then ends its thread. An unknown stream is
    /// invalid_argument.
    Status destroy_stream(Stream stream) noexcept {
        if (on_worker()) return refuse("destroy_stream");
        std::unique_lock lock(mutex_);
        return streams_.destroy_stream(stream.id, lock);
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

    /// SimConfig::batch_copy_limit (0: no batches), on every stream.
    std::size_t batch_copy_limit(Stream /*stream*/) const noexcept { return config_.batch_copy_limit; }
    /// Enqueues `count` host-to-device copies on `stream` in one call: each is checked and run
    /// as copy_to_device_async's are, and the link model charges one per-call latency for the
    /// batch (the first copy's). A copy that fails its check stops the batch: the ones before it
    /// stay enqueued. The call returns once its pageable copies ran.
    Status copy_to_device_batch(void* const* device_dsts, const void* const* host_srcs, const std::size_t* sizes,
                                std::size_t count, Stream stream) noexcept {
        return copy_batch(device_dsts, host_srcs, sizes, count, true, stream, "copy_to_device_batch");
    }
    /// As copy_to_device_batch, the other way.
    Status copy_from_device_batch(void* const* host_dsts, const void* const* device_srcs, const std::size_t* sizes,
                                  std::size_t count, Stream stream) noexcept {
        return copy_batch(host_dsts, device_srcs, sizes, count, false, stream, "copy_from_device_batch");
    }

    /// Enqueues setting `bytes` of device memory to `value` on `stream`. Counted in
    /// SimStats::memsets; the link model adds one call's latency (to_device_pinned), no bytes.
    Status device_memset_async(void* device_dst, int value, std::size_t bytes, Stream stream) noexcept {
        constexpr std::string_view what = "device_memset_async";
        if (on_worker()) return refuse(what);
        std::lock_guard lock(mutex_);
        std::unique_lock queue = streams_.lock();
        detail::SimStreams::Worker* worker = streams_.find_stream(stream.id);
        if (worker == nullptr) return streams_.unknown_stream(what, stream.id);
        if (bytes == 0) return {};
        if (!is_device(device_dst, bytes)) {
            return fail(Errc::invalid_argument,
                        detail::message("sim ", what, ": ", bytes, " bytes at ", static_cast<const void*>(device_dst),
                                        " are not inside one device allocation"));
        }
        if (!streams_.enqueue_memset(*worker, device_dst, value, bytes)) {
            return fail(Errc::out_of_memory,
                        detail::message("sim ", what, ": host memory exhausted enqueueing ", bytes, " bytes"));
        }
        ++stats_.memsets;
        add_modeled(config_.link.to_device_pinned.latency_ns);
        return {};
    }

    Result<Event> create_event() noexcept {
        if (on_worker()) return refuse("create_event");
        std::lock_guard lock(mutex_);
        Result<std::uint32_t> id = streams_.create_event();
        if (!id) return id.status();
        return Event{*id};
    }

    /// Work already waiting for the event's recording still waits for it.
    Status destroy_event(Event event) noexcept {
        if (on_worker()) return refuse("destroy_event");
        std::lock_guard lock(mutex_);
        return streams_.destroy_event(event.id);
    }

    /// The event completes when the stream's worker reaches this point.
    Status record_event(Event event, Stream stream) noexcept {
        if (on_worker()) return refuse("record_event");
        std::lock_guard lock(mutex_);
        return streams_.record_event(event.id, stream.id);
    }

    /// True when the event's latest recording completed (or it was never recorded). Never
    /// blocks.
    Result<bool> event_ready(Event event) noexcept {
        if (on_worker()) return refuse("event_ready");
        std::lock_guard lock(mutex_);
        return streams_.event_ready(event.id);
    }

    /// Blocks until the event's latest recording completed.
    Status synchronize_event(Event event) noexcept {
        if (on_worker()) return refuse("synchronize_event");
        std::unique_lock lock(mutex_);
        return streams_.synchronize_event(event.id, lock);
    }

    /// Later work on `stream` waits for the event's recording as of this call (a later
    /// re-recording does not change it). The host does not block.
    Status stream_wait_event(Stream stream, Event event) noexcept {
        if (on_worker()) return refuse("stream_wait_event");
        std::lock_guard lock(mutex_);
        return streams_.stream_wait_event(stream.id, event.id);
    }

    /// Enqueues `function(user_data)` on `stream`; it runs on the stream's worker, in order.
    Status launch_host_func(Stream stream, HostFunction function, void* user_data) noexcept {
        if (on_worker()) return refuse("launch_host_func");
        std::lock_guard lock(mutex_);
        return streams_.launch_host_func(stream.id, function, user_data);
    }

    // ---- mapped host memory and kernels (backends/detail/sim_mapped.hpp) -----------------
    /// Any address maps: the device address of mapped memory is the host address.
    static constexpr std::size_t host_map_alignment = 1;
    /// Maps `bytes` of the sim's pinned memory at `host` (inside one pinned allocation, no
    /// mapping overlapped); returns `host`. A copy or memset of it is invalid_argument.
    Result<void*> map_host(void* host, std::size_t bytes) noexcept;
    /// Waits until every stream is idle, then undoes map_host(host, …).
    Status unmap_host(void* host) noexcept;
    /// As launch_host_func, for a kernel that touches `accesses` (device memory or mapped host
    /// memory): the link model adds what its mapped accesses move, bytes at the pinned rate
    /// with no per-call latency (SimStats::mapped_read_bytes, mapped_write_bytes).
    Status launch_kernel(Stream stream, HostFunction function, void* user_data,
                         std::span<const KernelAccess> accesses) noexcept;

    /// Page-locked host memory: mmap'd, pre-faulted and mlock'd. When mlock is refused
    /// (RLIMIT_MEMLOCK) the allocation still succeeds, unlocked; pinned_locked() tells.
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        return host_.state_->pinned_malloc(bytes, config_.lock_pinned, stats_);
    }

    /// Waits until every stream is idle, then frees (memory still mapped: invalid_argument).
    Status pinned_free(void* pointer) noexcept {
        if (on_worker()) return refuse("pinned_free");
        auto lock = lock_idle();
        if (Status mapped = still_mapped(pointer); !mapped) return mapped;
        return host_.state_->pinned_free(pointer, stats_);
    }

    // ---- virtual memory: in-place growth -------------------------------------------------
    // A reservation is an mmap(PROT_NONE) range; a physical chunk is capacity accounting until
    // mapped, when its pages become an anonymous MAP_FIXED mapping inside the range. Chunks
    // map contiguously from the start of a reservation and unmap from its end.
    using PhysicalHandle = detail::SimVirtualMemory::Handle;

    std::size_t vmm_granularity() const noexcept { return detail::SimVirtualMemory::granularity; }

    Result<void*> vmm_reserve(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        return vmm_.reserve(bytes);
    }

    Status vmm_release(void* base) noexcept {
        std::lock_guard lock(mutex_);
        return vmm_.release(base);
    }

    Result<PhysicalHandle> vmm_create(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        return vmm_.create(bytes);
    }

    /// Waits until every stream is idle, then frees.
    Status vmm_free(PhysicalHandle handle) noexcept {
        if (on_worker()) return refuse("vmm_free");
        auto lock = lock_idle();
        return vmm_.free(handle);
    }

    Status vmm_map(void* address, std::size_t bytes, PhysicalHandle handle) noexcept {
        std::lock_guard lock(mutex_);
        return vmm_.map(address, bytes, handle);
    }

    /// Waits until every stream is idle, then unmaps.
    Status vmm_unmap(void* address, std::size_t bytes) noexcept {
        if (on_worker()) return refuse("vmm_unmap");
        auto lock = lock_idle();
        return vmm_.unmap(address, bytes);
    }

    /// Pins existing host memory in place (HostRegisterBackend), mlock'd where allowed: copies
    /// from and to it are direct, and is_pinned says so. host_unregister waits until every
    /// stream is idle, then unpins (backends/detail/sim_host_memory.hpp).
    Status host_register(void* host, std::size_t bytes) noexcept;
    Status host_unregister(void* host) noexcept;
    /// True when `stream` is a live stream of this backend.
    bool has_stream(Stream stream) noexcept;
    /// Ok for a live stream of this backend; invalid_argument otherwise, naming the device a
    /// stream of another device of the same SimHost belongs to.
    Status check_stream(Stream stream) noexcept;

    /// True when `pointer` lies in one of this backend's pinned allocations or registered ranges.
    bool is_pinned(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return host_.state_->pinned_contains(pointer, 1);
    }
    /// True when `pointer` lies in a pinned allocation that is really page-locked.
    bool pinned_locked(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return host_.state_->pinned_locked(pointer);
    }

    SimStats stats() const noexcept {
        std::lock_guard lock(mutex_);
        SimStats stats = stats_;
        stats.live_pinned_bytes = host_.state_->live_pinned_bytes();
        return stats;
    }
    const SimConfig& config() const noexcept { return config_; }

private:
    bool on_worker() const noexcept { return streams_.on_worker(); }
    Status refuse(std::string_view what) noexcept {
        std::lock_guard lock(mutex_);
        return fail(Errc::invalid_argument,
                    detail::message("sim ", what, ": called from a host function, which must not wait for streams"));
    }

    // mutex_, held with no stream work pending (see SimStreams::lock_idle).
    std::unique_lock<std::mutex> lock_idle() noexcept { return streams_.lock_idle(mutex_); }

    // mutex_ held. Device memory: a device allocation, or the mapped part of a reservation.
    bool is_device(const void* pointer, std::size_t bytes) const noexcept {
        return memory_.device_contains(pointer, bytes) || vmm_.mapped_contains(pointer, bytes);
    }

    Status fail(Errc code, std::string message) noexcept {
        ++stats_.failed_calls;
        return Status(code, std::move(message));
    }

    // The synchronous copies, their checks and their accounting in the link model
    // (backends/detail/sim_copies.hpp). mutex_ held for check_copy, account and add_modeled.
    Status check_copy(const void* host, const void* device, std::size_t bytes, std::string_view what) noexcept;
    void account(bool to_device, bool pinned, std::size_t bytes, bool call = true) noexcept;
    void add_modeled(std::uint64_t ns) noexcept;
    Status ensure_bounce(std::string_view what) noexcept;
    // `host` is the host side of the copy, `device` the device side.
    Status copy(void* dst, const void* src, std::size_t bytes, const void* host, const void* device,
                std::string_view what) noexcept;

    // The asynchronous copies and batches, checked, counted and enqueued on the stream's worker
    // (backends/detail/sim_async_copies.hpp).
    Status copy_async(void* dst, const void* src, std::size_t bytes, const void* host, const void* device,
                      Stream stream, std::string_view what) noexcept;
    Status copy_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                      bool to_device, Stream stream, std::string_view what) noexcept;
    // mutex_ held: invalid_argument when the pinned allocation at `pointer` is still mapped.
    Status still_mapped(void* pointer) noexcept;

    // Lock order: mutex_, then the streams' queue lock; a worker takes only the queue lock, and
    // runs its tasks with no lock held.
    SimConfig config_;
    SimHost host_;              // its pinned memory, and where streams and events are registered
    mutable std::mutex mutex_;  // allocations, counters, the bounce buffer's address
    SimStats stats_;
    detail::SimBounceBuffer bounce_;
    detail::SimMemory memory_{config_, stats_};
    detail::SimVirtualMemory vmm_{config_, stats_};
    detail::AddressMap<char> mapped_;  // map_host's mappings
    detail::SimStreams streams_{bounce_, stats_, *host_.state_, config_.device};
    detail::TeardownList teardown_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
