// SPDX-License-Identifier: Apache-2.0
// PinnedHostPool over several backend instances (pinned/pool.hpp, record with the stream's
// backend, forget): one pool whose memory streams of 2 to 8 mocks use, eager and deferred, with
// failures of every event call of every backend, streams named with the wrong backend (checked
// when recorded, on the mock and on simulated devices of one host), forget, and 8 threads each
// with its own backend and stream.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "async_support.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/pinned/pool.hpp"
#include "support.hpp"

using namespace devstage;

namespace {

std::vector<std::string> device_reports;
void device_sink(const Status& status) noexcept {
    device_reports.emplace_back(status.message());
}
// The mocks' own reports (an event whose destruction failed on purpose is left to them).
void quiet_sink(const Status&) noexcept {}

constexpr std::size_t block_bytes = 4096;

/// One device: a mock (deferred unless told), a stream and device memory for `regions` blocks.
struct Device {
    explicit Device(bool deferred = true, std::size_t regions = 4)
        : mock(MockConfig{.sink = &quiet_sink, .deferred_async = deferred}),
          memory(*mock.device_malloc(regions * block_bytes)) {
        stream = *mock.create_stream();
    }
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;
    ~Device() {
        CHECK(mock.synchronize().ok());
        CHECK(mock.device_free(memory).ok());
        CHECK(mock.destroy_stream(stream).ok());
    }
    std::byte* region(std::size_t k) const { return static_cast<std::byte*>(memory) + k * block_bytes; }
    bool holds(std::size_t k, int fill) {
        return test::read_device(mock, region(k), block_bytes) ==
               std::vector<std::byte>(block_bytes, static_cast<std::byte>(fill));
    }

    MockBackend mock;
    void* memory;
    MockBackend::Stream stream;
};

/// A block of `pool` filled with `fill`, copied to `device`'s region `k` on its stream, recorded
/// with the device's backend and given back: pending on that device. Returns its address.
void* upload(PinnedHostPool<MockBackend>& pool, Device& device, int fill, std::size_t k = 0) {
    auto buffer = pool.allocate(block_bytes);
    REQUIRE(buffer.ok());
    std::memset(buffer->data(), fill, block_bytes);
    REQUIRE(device.mock.copy_to_device_async(device.region(k), buffer->data(), block_bytes, device.stream).ok());
    REQUIRE(pool.record(*buffer, device.stream, device.mock).ok());
    void* const block = buffer->data();
    buffer->reset();
    return block;
}

}  // namespace

TEST_CASE("pinned devices: each stream's events are made, recorded and queried on its own backend",
          "[pinned_devices]") {
    for (const std::size_t n : {2, 5, 8}) {
        INFO(n << " devices");
        MockBackend host;
        std::vector<std::unique_ptr<Device>> devices;
        for (std::size_t i = 0; i < n; ++i) devices.push_back(std::make_unique<Device>(i % 2 == 0));
        {
            PinnedHostPool<MockBackend> pool(host);
            std::vector<void*> blocks;
            for (std::size_t i = 0; i < n; ++i) blocks.push_back(upload(pool, *devices[i], 0x10 + int(i)));
            for (std::size_t i = 0; i < n; ++i) {
                CHECK(devices[i]->mock.calls(MockOp::create_event) == 1);
                CHECK(devices[i]->mock.calls(MockOp::record_event) == 2);  // checked at record(), then at release
            }
            CHECK(host.calls(MockOp::create_event) == 0);
            CHECK(host.calls(MockOp::record_event) == 0);
            CHECK(pool.stats().events_created == n);

            // Every allocation polls a pending block on its backend and never waits; the bytes
            // each device received are the ones written before the release.
            std::vector<PinnedBuffer> taken;
            for (std::size_t i = 0; i < 3 * n; ++i) {
                auto buffer = pool.allocate(block_bytes);
                REQUIRE(buffer.ok());
                std::memset(buffer->data(), 0xEE, block_bytes);
                taken.push_back(std::move(*buffer));
            }
            for (std::size_t i = 0; i < n; ++i) {
                CHECK(devices[i]->mock.calls(MockOp::synchronize_event) == 0);
                CHECK(devices[i]->mock.calls(MockOp::synchronize) == 0);
                CHECK(devices[i]->holds(0, 0x10 + int(i)));
                CHECK(devices[i]->mock.misuses() == 0);
            }
            CHECK(host.calls(MockOp::event_ready) == 0);
        }
        // The pool's destruction destroyed each backend's events on that backend.
        for (std::size_t i = 0; i < n; ++i) {
            CHECK(devices[i]->mock.calls(MockOp::destroy_event) == 1);
            CHECK(devices[i]->mock.live_events() == 0);
        }
        CHECK(host.live_pinned_allocations() == 0);
    }
}

TEST_CASE("pinned devices: a block is pending until every backend's work ran; trim waits on each", "[pinned_devices]") {
    MockBackend host;
    Device a, b, c;
    PinnedHostPool<MockBackend> pool(host);
    auto buffer = pool.allocate(block_bytes);
    REQUIRE(buffer.ok());
    std::memset(buffer->data(), 0x5A, block_bytes);
    for (Device* device : {&a, &b, &c}) {
        REQUIRE(device->mock.copy_to_device_async(device->region(1), buffer->data(), block_bytes, device->stream).ok());
        REQUIRE(pool.record(*buffer, device->stream, device->mock).ok());
        REQUIRE(pool.record(*buffer, device->stream, device->mock).ok());  // once per backend
    }
    CHECK(a.mock.calls(MockOp::record_event) == 1);
    void* const block = buffer->data();
    buffer->reset();
    CHECK(pool.stats().pending_blocks == 1);
    // a and b ran their copies; c has not: the block is not handed out.
    REQUIRE(a.mock.synchronize().ok());
    REQUIRE(b.mock.synchronize().ok());
    for (int i = 0; i < 2; ++i) {
        auto next = pool.allocate(block_bytes);
        REQUIRE(next.ok());
        CHECK(next->data() != block);
    }
    CHECK(pool.stats().pending_skips >= 1);
    REQUIRE(pool.trim().ok());  // waits on c's event, on c
    CHECK(c.mock.calls(MockOp::synchronize_event) == 1);
    CHECK(host.calls(MockOp::synchronize_event) == 0);
    CHECK(pool.stats().pending_blocks == 0);
    for (Device* device : {&a, &b, &c}) CHECK(device->holds(1, 0x5A));
}

TEST_CASE("pinned devices: a stream named with the wrong backend is invalid_argument naming it; nothing is lost",
          "[pinned_devices][errors]") {
    MockBackend host;
    Device a;
    MockBackend other;  // knows no stream
    PinnedHostPool<MockBackend> pool(host);
    auto buffer = pool.allocate(block_bytes);
    REQUIRE(buffer.ok());
    REQUIRE(pool.record(*buffer, a.stream, a.mock).ok());
    const Status wrong = pool.record(*buffer, a.stream, other);
    CHECK(wrong.code() == Errc::invalid_argument);
    CHECK_THAT(std::string(wrong.message()), Catch::Contains("backend 'mock'") && Catch::Contains("unknown stream") &&
                                                 Catch::Contains("nothing was recorded"));
    CHECK(other.live_events() == 0);  // its event was destroyed, not kept
    CHECK(other.misuses() == 1);
    const Status raw_wrong = pool.record(buffer->data(), a.stream, other);
    CHECK(raw_wrong.code() == Errc::invalid_argument);
    // The allocation is intact, still recorded on a's stream.
    CHECK(pool.owns(buffer->data()));
    CHECK(pool.stats().live_allocations == 1);
    std::memset(buffer->data(), 0x21, block_bytes);
    REQUIRE(a.mock.copy_to_device_async(a.region(0), buffer->data(), block_bytes, a.stream).ok());
    buffer->reset();
    CHECK(pool.stats().pending_blocks == 1);
    REQUIRE(pool.trim().ok());
    CHECK(a.holds(0, 0x21));
    CHECK(other.calls(MockOp::synchronize_event) == 0);
    CHECK(other.calls(MockOp::event_ready) == 0);
    // An empty buffer and a pointer the pool does not own are refused before any backend call.
    CHECK(pool.record(PinnedBuffer{}, a.stream, a.mock).code() == Errc::invalid_argument);
    int local = 0;
    CHECK(pool.record(&local, a.stream, a.mock).code() == Errc::unknown_pointer);
}

TEST_CASE("pinned devices: each event call of each backend failing in turn never reuses or frees a block early",
          "[pinned_devices][errors]") {
    constexpr std::size_t n = 3;
    for (const MockOp op : {MockOp::create_event, MockOp::record_event, MockOp::event_ready, MockOp::synchronize_event,
                            MockOp::destroy_event}) {
        for (std::size_t failing = 0; failing < n; ++failing) {
            for (std::uint64_t k = 1; k <= 3; ++k) {
                INFO(to_string(op) << " fails at call " << k << " of backend " << failing);
                device_reports.clear();
                MockBackend host;
                std::vector<std::unique_ptr<Device>> devices;
                for (std::size_t i = 0; i < n; ++i) devices.push_back(std::make_unique<Device>());
                devices[failing]->mock.fail_call(op, k);
                {
                    PinnedHostPool<MockBackend> pool(host);
                    pool.set_error_sink(&device_sink);
                    for (int round = 0; round < 2; ++round) {
                        for (std::size_t i = 0; i < n; ++i) {
                            Device& device = *devices[i];
                            auto buffer = pool.allocate(block_bytes);
                            REQUIRE(buffer.ok());
                            const int fill = 0x30 + round * 8 + int(i);
                            std::memset(buffer->data(), fill, block_bytes);
                            REQUIRE(device.mock
                                        .copy_to_device_async(device.region(round), buffer->data(), block_bytes,
                                                              device.stream)
                                        .ok());
                            if (const Status recorded = pool.record(*buffer, device.stream, device.mock); !recorded) {
                                CHECK(i == failing);
                                CHECK_THAT(
                                    std::string(recorded.message()),
                                    Catch::Contains("backend 'mock'") && Catch::Contains("nothing was recorded"));
                                REQUIRE(device.mock.synchronize().ok());  // the caller waits itself
                            }
                        }
                        for (int i = 0; i < 2; ++i) {  // allocations that poll pending blocks
                            auto next = pool.allocate(block_bytes);
                            REQUIRE(next.ok());
                            std::memset(next->data(), 0xEE, block_bytes);
                        }
                    }
                    (void)pool.trim();
                    (void)pool.trim();  // a failed wait is retried
                }
                for (std::size_t i = 0; i < n; ++i) {
                    REQUIRE(devices[i]->mock.synchronize().ok());
                    for (int round = 0; round < 2; ++round) CHECK(devices[i]->holds(round, 0x30 + round * 8 + int(i)));
                    CHECK(devices[i]->mock.misuses() == 0);
                    if (op != MockOp::destroy_event || i != failing) CHECK(devices[i]->mock.live_events() == 0);
                }
                CHECK(host.live_pinned_allocations() == 0);
                CHECK(host.misuses() == 0);
            }
        }
    }
}

TEST_CASE("pinned devices: forget waits for a backend's live and pending work and lets it go", "[pinned_devices]") {
    MockBackend host;
    auto a = std::make_unique<Device>();
    Device b;
    PinnedHostPool<MockBackend> pool(host);
    pool.set_error_sink(&device_sink);
    device_reports.clear();
    auto live = pool.allocate(block_bytes);
    REQUIRE(live.ok());
    std::memset(live->data(), 0x41, block_bytes);
    for (Device* device : {a.get(), &b}) {
        REQUIRE(device->mock.copy_to_device_async(device->region(0), live->data(), block_bytes, device->stream).ok());
        REQUIRE(pool.record(*live, device->stream, device->mock).ok());
    }
    void* const pending = upload(pool, *a, 0x42, 1);
    CHECK(pool.stats().pending_blocks == 1);

    // A wait that fails, then synchronize() too: forget keeps everything and says so.
    a->mock.fail_call(MockOp::synchronize_event, a->mock.calls(MockOp::synchronize_event) + 1);
    a->mock.fail_call(MockOp::synchronize, a->mock.calls(MockOp::synchronize) + 1);
    const Status failed = pool.forget(a->mock);
    CHECK_FALSE(failed.ok());
    CHECK_THAT(std::string(failed.message()), Catch::Contains("forget"));
    CHECK(a->mock.live_events() > 0);

    REQUIRE(pool.forget(a->mock).ok());
    CHECK(a->mock.live_events() == 0);
    CHECK(a->mock.pending_operations() == 0);  // its work ran: the host waited for it
    CHECK(a->holds(0, 0x41));
    CHECK(a->holds(1, 0x42));
    CHECK(pool.stats().pending_blocks == 0);  // the block was pending on a only
    a.reset();                                // the pool makes no further call to it

    auto reused = pool.allocate(block_bytes);  // the settled block serves at once
    REQUIRE(reused.ok());
    CHECK(reused->data() == pending);
    live->reset();  // pending on b only
    CHECK(pool.stats().pending_blocks == 1);
    REQUIRE(pool.trim().ok());
    CHECK(b.holds(0, 0x41));
    REQUIRE(pool.forget(b.mock).ok());
    REQUIRE(pool.forget(b.mock).ok());  // nothing left: fine
    CHECK(b.mock.live_events() == 0);
    CHECK(device_reports.empty());
}

TEST_CASE("pinned devices: 8 threads, each with its own backend and stream, over one pool",
          "[pinned_devices][threads]") {
    constexpr int threads = 8;
    constexpr int iterations = 120;
    MockBackend host;
    std::vector<std::unique_ptr<Device>> devices;
    for (int t = 0; t < threads; ++t) devices.push_back(std::make_unique<Device>(t % 2 == 0, 1));
    {
        PinnedHostPool<MockBackend> pool(host, CachingPinned{.max_cached_bytes = 8 * block_bytes});
        std::vector<std::thread> workers;
        std::vector<int> wrong(threads, 0);
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                Device& device = *devices[t];
                for (int i = 0; i < iterations; ++i) {
                    const int fill = (t * 31 + i) & 0xFF;
                    const std::size_t bytes = block_bytes * (1 + (i % 2));
                    auto buffer = pool.allocate(bytes);
                    if (!buffer) {
                        ++wrong[t];
                        continue;
                    }
                    std::memset(buffer->data(), fill, bytes);
                    if (!device.mock.copy_to_device_async(device.region(0), buffer->data(), block_bytes, device.stream)
                             .ok() ||
                        !pool.record(*buffer, device.stream, device.mock).ok()) {
                        ++wrong[t];
                    }
                    buffer->reset();
                    if (i % 8 == 7) {
                        if (!device.mock.synchronize().ok() || !device.holds(0, fill)) ++wrong[t];
                    }
                }
                if (!pool.forget(device.mock).ok() || device.mock.live_events() != 0) ++wrong[t];
            });
        }
        for (std::thread& worker : workers) worker.join();
        for (int t = 0; t < threads; ++t) CHECK(wrong[t] == 0);
        CHECK(pool.stats().pending_blocks == 0);
        CHECK(pool.trim().ok());
    }
    for (int t = 0; t < threads; ++t) CHECK(devices[t]->mock.misuses() == 0);
    CHECK(host.live_pinned_allocations() == 0);
}

TEST_CASE("pinned devices: another device's stream is refused when recorded, and its block is never handed out early",
          "[pinned_devices]") {
    SimHost host;
    SimBackend gpu0(SimConfig{.device = 0}, host);
    SimBackend gpu1(SimConfig{.device = 1}, host);
    PinnedHostPool<SimBackend> pool(gpu0);
    auto stream1 = gpu1.create_stream();
    REQUIRE(stream1.ok());
    test::DeviceBytes<SimBackend> device1(gpu1, block_bytes);
    test::StreamGate gate;  // holds device 1's stream: its copy stays queued
    REQUIRE(gpu1.launch_host_func(*stream1, &test::StreamGate::hold, &gate).ok());
    gate.wait_entered();

    auto buffer = pool.allocate(block_bytes);
    REQUIRE(buffer.ok());
    std::memset(buffer->data(), 0x11, block_bytes);
    REQUIRE(gpu1.copy_to_device_async(device1.get(), buffer->data(), block_bytes, *stream1).ok());
    // Named with the pool's backend (device 0), device 1's stream is refused now, not at the
    // release: nothing is recorded, and the caller knows to name the stream's backend.
    const Status wrong = pool.record(*buffer, *stream1);
    CHECK(wrong.code() == Errc::invalid_argument);
    CHECK_THAT(wrong.message(), Catch::Contains("sim device 1") && Catch::Contains("nothing was recorded"));
    REQUIRE(pool.record(*buffer, *stream1, gpu1).ok());
    void* const block = buffer->data();
    buffer->reset();

    std::vector<PinnedBuffer> later;
    for (int i = 0; i < 3; ++i) {
        auto next = pool.allocate(block_bytes);
        REQUIRE(next.ok());
        CHECK(next->data() != block);  // device 1's copy still reads it
        std::memset(next->data(), 0xEE, block_bytes);
        later.push_back(std::move(*next));
    }
    gate.open();
    REQUIRE(gpu1.synchronize().ok());
    CHECK(test::read_device(gpu1, device1.get(), block_bytes) == std::vector<std::byte>(block_bytes, std::byte{0x11}));
    later.clear();
    REQUIRE(pool.forget(gpu1).ok());
    CHECK(gpu1.destroy_stream(*stream1).ok());
}

TEST_CASE("pinned devices: a backend that cannot check a stream has it checked by an event at record()",
          "[pinned_devices]") {
    MockBackend zero;  // its stream ids: none yet; device one's stream is unknown to it
    Device one(false);
    PinnedHostPool<MockBackend> pool(zero);
    auto buffer = pool.allocate(block_bytes);
    REQUIRE(buffer.ok());
    const Status wrong = pool.record(*buffer, one.stream);  // named with the pool's backend
    CHECK(wrong.code() == Errc::invalid_argument);
    CHECK_THAT(wrong.message(), Catch::Contains("unknown stream") && Catch::Contains("nothing was recorded"));
    CHECK(zero.calls(MockOp::record_event) == 1);  // the check
    CHECK(zero.live_events() == 0);                // the failed check's event was destroyed
    auto own = zero.create_stream();
    REQUIRE(own.ok());
    CHECK(pool.record(*buffer, *own).ok());
    CHECK(zero.calls(MockOp::record_event) == 2);
    buffer->reset();
    CHECK(zero.calls(MockOp::record_event) == 3);  // and again at the release
    CHECK(zero.misuses() == 1);                    // the unknown stream, nothing else
    REQUIRE(pool.trim().ok());
    CHECK(zero.destroy_stream(*own).ok());
}
