// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the MockBackend class, declared with its inline members; the members defined out of line
// are its parts in backends/detail/mock_*.hpp, each of which includes this header. Include
// devstage/backends/mock.hpp, which assembles them.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/detail/host_registry.hpp"
#include "devstage/backends/detail/mock_engine.hpp"
#include "devstage/backends/detail/mock_recorder.hpp"
#include "devstage/backends/detail/mock_streams.hpp"
#include "devstage/backends/detail/teardown_list.hpp"
#include "devstage/backends/mock_config.hpp"
#include "devstage/backends/mock_journal.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage {

/// The test backend. Thread-safe. `MockBackend mock; mock.fail_call(MockOp::device_malloc, 2);`
///
/// Streams and events: by default enqueued work runs at the call and an event is ready once
/// recorded. With `MockConfig::deferred_async` work runs only when the host synchronizes:
/// synchronize_event runs exactly what the event's recording depends on (its stream up to
/// it, and through stream_wait_event the recordings on other streams it waits for),
/// synchronize() runs everything, and event_ready does the same after answering "not ready"
/// `not_ready_polls` times. Whenever several streams have runnable work, the one whose next
/// operation was enqueued last runs first. Freeing, or synchronously copying or setting,
/// memory that pending work touches is Errc::busy. So is a host hazard: a copy whose host side
/// conflicts with a pending copy it is not ordered after — reading host memory that a pending
/// copy_from_device_async will still write, or writing host memory that a pending copy will
/// still read or write. An enqueued copy is ordered after earlier work on its own stream and,
/// through stream_wait_event, after what the recordings it waits for cover; a synchronous
/// copy_to_device (reads the host) or copy_from_device (writes it) after nothing pending.
/// Each of these is a misuse (misuses(), misuse_report()) naming both operations and the
/// overlapping range; the call does nothing. Host functions run on the thread that
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
    /// Runs the teardown hooks (pinned pools give back their memory), then reports
    /// allocations, streams and events never freed to the sink, and frees them. Work still
    /// pending never runs.
    ~MockBackend() {
        teardown_.run_all();
        const std::string leaks = leak_report();
        if (!leaks.empty()) config_.sink(Status(Errc::leaked, leaks));
        const auto free_block = [](void*, const auto& entry) { std::free(entry.info); };
        device_.for_each(free_block);
        pinned_.for_each(free_block);
    }

    std::string_view name() const noexcept { return "mock"; }

    /// TeardownBackend: `hook` runs before the backend goes (not journaled).
    Result<std::uint64_t> add_teardown_hook(TeardownHook hook) noexcept { return teardown_.add(hook, name()); }
    void remove_teardown_hook(std::uint64_t id) noexcept { teardown_.remove(id); }

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
        if (Status injected = recorder_.begin(op); !injected) {
            return recorder_.finish(op, device_dst, bytes, std::move(injected));
        }
        if (bytes > 0 && !device_.contains(device_dst, bytes)) {
            return recorder_.finish(
                op, device_dst, bytes,
                recorder_.misuse(Errc::invalid_argument, detail::message("mock device_memset: ", bytes, " bytes at ",
                                                                         static_cast<const void*>(device_dst),
                                                                         " run outside every device allocation")));
        }
        if (bytes > 0) {
            if (Status clear = engine_.not_pending(op, device_dst, bytes, Side::device); !clear) {
                return recorder_.finish(op, device_dst, bytes, std::move(clear));
            }
            std::memset(device_dst, value, bytes);
        }
        return recorder_.finish(op, device_dst, bytes, {});
    }
    /// Runs all pending work; reports the first failure of enqueued work that ran since the
    /// previous synchronize() (see fail_when_run).
    Status synchronize() noexcept {
        std::unique_lock lock(mutex_);
        return streams_.synchronize(lock);
    }

    // ---- streams and events -----------------------------------------------------------
    Result<Stream> create_stream() noexcept {
        std::lock_guard lock(mutex_);
        Result<std::uint32_t> id = streams_.create_stream();
        if (!id) return id.status();
        return Stream{*id};
    }

    /// Runs the stream's pending work (and what it waits for), then forgets the stream.
    Status destroy_stream(Stream stream) noexcept {
        std::unique_lock lock(mutex_);
        return streams_.destroy_stream(lock, stream.id);
    }

    /// Checked at the call (device range inside one allocation, host pointer non-null; zero
    /// bytes is a no-op), then enqueued on `stream`.
    Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, Stream stream) noexcept {
        return enqueue_copy(MockOp::copy_to_device_async, {device_dst, host_src, bytes, device_dst, host_src}, stream);
    }
    /// As copy_to_device_async, the other way.
    Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes, Stream stream) noexcept {
        return enqueue_copy(MockOp::copy_from_device_async, {host_dst, device_src, bytes, device_src, host_dst},
                            stream);
    }
    /// Enqueues setting `bytes` of device memory to `value`; checked, journaled and failed as
    /// the copies are (fail_when_run included).
    Status device_memset_async(void* device_dst, int value, std::size_t bytes, Stream stream) noexcept {
        return enqueue_copy(MockOp::device_memset_async, {device_dst, nullptr, bytes, device_dst, nullptr, value},
                            stream);
    }

    // ---- batches of copies (BatchCopyBackend) -------------------------------------------
    /// MockConfig::batch_copy_limit (0: no batches), on every stream.
    std::size_t batch_copy_limit(Stream /*stream*/) const noexcept { return config_.batch_copy_limit; }
    /// Enqueues `count` host-to-device copies on `stream`, journaled as one call; each copy is
    /// checked and run as copy_to_device_async's are. More copies than batch_copy_limit(stream) is
    /// invalid_argument. See detail::MockStreams::enqueue_batch for how a batch fails.
    Status copy_to_device_batch(void* const* device_dsts, const void* const* host_srcs, const std::size_t* sizes,
                                std::size_t count, Stream stream) noexcept {
        return enqueue_batch(MockOp::copy_to_device_batch, MockOp::copy_to_device_async, device_dsts, host_srcs, sizes,
                             count, stream);
    }
    /// As copy_to_device_batch, the other way.
    Status copy_from_device_batch(void* const* host_dsts, const void* const* device_srcs, const std::size_t* sizes,
                                  std::size_t count, Stream stream) noexcept {
        return enqueue_batch(MockOp::copy_from_device_batch, MockOp::copy_from_device_async, host_dsts, device_srcs,
                             sizes, count, stream);
    }

    Result<Event> create_event() noexcept {
        std::lock_guard lock(mutex_);
        Result<std::uint32_t> id = streams_.create_event();
        if (!id) return id.status();
        return Event{*id};
    }

    /// Work already waiting for the event's recording still waits for it.
    Status destroy_event(Event event) noexcept {
        std::lock_guard lock(mutex_);
        return streams_.destroy_event(event.id);
    }

    /// The event completes when `stream` reaches this point; it then reports the first
    /// failure of work that ran on `stream` since its previous recording.
    Status record_event(Event event, Stream stream) noexcept {
        std::unique_lock lock(mutex_);
        return streams_.record_event(lock, event.id, stream.id);
    }

    /// Never blocks on other threads. Deferred: "not ready" not_ready_polls times per
    /// recording, then runs what the recording depends on. A failure of the work the
    /// recording covers is returned as the error.
    Result<bool> event_ready(Event event) noexcept {
        std::unique_lock lock(mutex_);
        return streams_.event_ready(lock, event.id);
    }

    /// Runs what the event's latest recording depends on; reports the failure it covers.
    Status synchronize_event(Event event) noexcept {
        std::unique_lock lock(mutex_);
        return streams_.synchronize_event(lock, event.id);
    }

    /// Later work on `stream` waits for the event's recording as of this call.
    Status stream_wait_event(Stream stream, Event event) noexcept {
        std::unique_lock lock(mutex_);
        return streams_.stream_wait_event(lock, stream.id, event.id);
    }

    /// Enqueues `function(user_data)` on `stream`.
    Status launch_host_func(Stream stream, HostFunction function, void* user_data) noexcept {
        std::unique_lock lock(mutex_);
        return streams_.launch_host_func(lock, stream.id, function, user_data);
    }

    /// Host memory pinned in place, checked and journaled; unpinning what pending work uses: busy.
    Status host_register(void* host, std::size_t bytes) noexcept;
    Status host_unregister(void* host) noexcept;
    // ---- mapped host memory (backends/detail/mock_mapped.hpp) -----------------------------
    /// map_host takes pointers aligned to a page, as CANN's aclrtHostRegister does.
    static constexpr std::size_t host_map_alignment = 4096;
    /// Maps `bytes` of this mock's pinned memory at `host` (page-aligned, inside one pinned
    /// allocation, overlapping no mapping); the device address is `host` itself. Journaled.
    Result<void*> map_host(void* host, std::size_t bytes) noexcept;
    /// Undoes map_host(host, …); busy while a pending kernel touches the mapping.
    Status unmap_host(void* host) noexcept;
    /// As launch_host_func, for a kernel that touches `accesses`: each must lie in one device
    /// allocation or one mapping. Until it ran (deferred), they are in use: freeing them,
    /// touching them synchronously or check_host_access of them is busy, as for a pending copy.
    Status launch_kernel(Stream stream, HostFunction function, void* user_data,
                         std::span<const KernelAccess> accesses) noexcept;
    /// Deferred: busy (a misuse) when the host's read (or write) of [host, host + bytes) with its
    /// own code races pending work: a kernel's access, or a copy's host side. Not journaled.
    Status check_host_access(const void* host, std::size_t bytes, bool writes) noexcept;
    /// Mappings made by map_host and not undone.
    std::size_t live_mappings() const noexcept {
        std::lock_guard lock(mutex_);
        return mapped_.size();
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
        recorder_.fail_calls(op, k, k, code);
    }
    /// Makes the k-th call of `op` and every later one fail with `code`.
    void fail_from(MockOp op, std::uint64_t k, Errc code = Errc::backend_failure) noexcept {
        std::lock_guard lock(mutex_);
        recorder_.fail_calls(op, k, std::numeric_limits<std::uint64_t>::max(), code);
    }
    /// Makes the k-th call of `op` — copy_to_device_async, copy_from_device_async,
    /// device_memset_async, launch_host_func, launch_kernel or a batch (every copy of it); other operations
    /// ignore it — succeed, then fail with `code` when it runs: no byte moves, no function is
    /// called. The failure is sticky, as a device's
    /// asynchronous errors are: every later recording on that stream — and on streams that wait
    /// for one of them — reports it (synchronize_event, event_ready) until clear_failures();
    /// the next synchronize() reports it once.
    void fail_when_run(MockOp op, std::uint64_t k, Errc code = Errc::backend_failure) noexcept {
        std::lock_guard lock(mutex_);
        recorder_.fail_when_run(op, k, code);
    }
    /// Clears the faults armed by fail_call, fail_from and fail_when_run — on enqueued work
    /// not run yet, too. Failures that already happened stay sticky (see clear_failures).
    void clear_faults() noexcept {
        std::lock_guard lock(mutex_);
        recorder_.clear_faults();
        engine_.disarm();
    }
    /// Forgets the failures of work that already ran, as a device reset would: recordings made
    /// from now on are clean (one made before keeps its failure, and hands it on to a stream
    /// that waits for it). Call it once the runs those failures belong to were waited for.
    void clear_failures() noexcept {
        std::lock_guard lock(mutex_);
        engine_.clear_failures();
    }

    // ---- observation ------------------------------------------------------------------
    /// Calls of `op` so far, failed ones included.
    std::uint64_t calls(MockOp op) const noexcept {
        std::lock_guard lock(mutex_);
        return recorder_.calls(op);
    }
    /// Calls of every operation so far.
    std::uint64_t total_calls() const noexcept {
        std::lock_guard lock(mutex_);
        return recorder_.total_calls();
    }
    std::vector<MockCall> journal() const {
        std::lock_guard lock(mutex_);
        return recorder_.journal();
    }
    void clear_journal() noexcept {
        std::lock_guard lock(mutex_);
        recorder_.clear_journal();
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
    /// Bytes of the pinned allocations live now.
    std::size_t live_pinned_bytes() const noexcept {
        std::lock_guard lock(mutex_);
        std::size_t bytes = 0;
        pinned_.for_each([&](void*, const auto& entry) { bytes += entry.bytes; });
        return bytes;
    }
    /// Ranges pinned in place with host_register and not unregistered yet, and their bytes.
    std::size_t live_registrations() const noexcept {
        std::lock_guard lock(mutex_);
        return registered_.size();
    }
    std::size_t live_registered_bytes() const noexcept {
        std::lock_guard lock(mutex_);
        std::size_t bytes = 0;
        registered_.for_each([&](void*, const detail::HostRegistry::Range& range) { bytes += range.bytes; });
        return bytes;
    }
    std::size_t live_streams() const noexcept {
        std::lock_guard lock(mutex_);
        return engine_.live_streams();
    }
    std::size_t live_events() const noexcept {
        std::lock_guard lock(mutex_);
        return streams_.live_events();
    }
    /// Enqueued operations that have not run yet (copies, recordings, waits, host functions).
    std::size_t pending_operations() const noexcept {
        std::lock_guard lock(mutex_);
        return engine_.pending_operations();
    }
    /// True when [pointer, pointer + bytes) lies in one live device allocation.
    bool is_device(const void* pointer, std::size_t bytes = 1) const noexcept {
        std::lock_guard lock(mutex_);
        return device_.contains(pointer, bytes);
    }
    /// Misuses detected so far: double frees, unknown pointers, handles and streams,
    /// out-of-bounds copies, memory used by pending work, host hazards (deferred mode).
    std::uint64_t misuses() const noexcept {
        std::lock_guard lock(mutex_);
        return recorder_.misuses();
    }
    /// The messages of the misuses detected so far, one line each (the first 64; misuses()
    /// counts them all); empty when there is none.
    std::string misuse_report() const {
        std::lock_guard lock(mutex_);
        std::string report;
        for (const std::string& line : recorder_.misuse_log()) report += line + "\n";
        if (!report.empty()) report.pop_back();
        return report;
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
        registered_.report_leaks(report, "mock");
        mapped_.for_each([&](void* base, const auto& entry) {
            report += detail::message("mock: mapping of ", entry.bytes, " bytes at ", base, " never unmapped\n");
        });
        engine_.report_leaks(report);
        streams_.report_leaks(report);
        if (!report.empty()) report.pop_back();
        return report;
    }

private:
    using Blocks = detail::AddressMap<void*>;  // info: the block to std::free
    using Side = detail::MockEngine::Side;

    // Allocation, free and synchronous copy, checked and journaled (backends/detail/mock_memory.hpp).
    Result<void*> allocate(MockOp op, Blocks& blocks, std::size_t bytes) noexcept;
    Status deallocate(MockOp op, Blocks& blocks, void* pointer) noexcept;
    Status transfer(MockOp op, const void* device, void* dst, const void* src, std::size_t bytes) noexcept;

    Status check_copy(MockOp op, const void* device, const void* dst, const void* src, std::size_t bytes) noexcept;
    Status enqueue_copy(MockOp op, const detail::MockStreams::Copy& copy, Stream stream) noexcept {
        std::unique_lock lock(mutex_);
        return streams_.enqueue_copy(lock, op, stream.id, copy, [&] {
            Status checked = check_copy(op, copy.device, copy.dst, copy.src, copy.bytes);
            if (!checked || copy.host == nullptr) return checked;  // a memset touches no host memory
            return engine_.host_hazard(op, stream.id, copy.host, copy.bytes);
        });
    }

    Status enqueue_batch(MockOp op, MockOp kind, void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                         std::size_t count, Stream stream) noexcept;

    MockConfig config_;
    mutable std::mutex mutex_;
    Blocks device_;
    Blocks pinned_;
    detail::HostRegistry registered_;
    detail::AddressMap<char> mapped_;  // map_host's mappings (device address = host address)
    std::set<const void*> freed_;
    std::size_t device_bytes_ = 0;
    detail::MockRecorder recorder_{config_.journal};
    detail::MockEngine engine_{recorder_, config_.deferred_async};
    detail::MockStreams streams_{recorder_, engine_, config_.not_ready_polls};
    detail::TeardownList teardown_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
