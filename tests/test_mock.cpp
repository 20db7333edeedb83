// SPDX-License-Identifier: Apache-2.0
// MockBackend specifics: journal, counters, fault injection, alignment modes, misuse detection,
// streams eager and deferred, and host allocation failures (this executable replaces operator
// new).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "failing_new.hpp"
#include "support.hpp"

using devstage::Errc;
using devstage::MockBackend;
using devstage::MockConfig;
using devstage::MockOp;

namespace {
std::string last_sink_message;
void capture_sink(const devstage::Status& status) noexcept {
    last_sink_message = status.message();
}
}  // namespace

TEST_CASE("mock: journal and counters record every call", "[mock]") {
    MockBackend mock;
    auto p = mock.device_malloc(100);
    REQUIRE(p.ok());
    std::vector<std::byte> host(100);
    REQUIRE(mock.copy_to_device(*p, host.data(), 100).ok());
    REQUIRE(mock.device_free(*p).ok());
    const auto journal = mock.journal();
    REQUIRE(journal.size() == 3);
    CHECK(journal[0].op == MockOp::device_malloc);
    CHECK(journal[0].pointer == *p);
    CHECK(journal[1].op == MockOp::copy_to_device);
    CHECK(journal[1].bytes == 100);
    CHECK(journal[2].op == MockOp::device_free);
    CHECK(journal[2].result == Errc::ok);
    CHECK(mock.calls(MockOp::device_malloc) == 1);
    CHECK(mock.total_calls() == 3);
}

TEST_CASE("mock: the k-th call fails, or every call from k on", "[mock]") {
    MockBackend mock;
    mock.fail_call(MockOp::device_malloc, 2, Errc::out_of_memory);
    auto first = mock.device_malloc(8);
    auto second = mock.device_malloc(8);
    auto third = mock.device_malloc(8);
    CHECK(first.ok());
    CHECK(second.status().code() == Errc::out_of_memory);
    CHECK_THAT(second.status().message(), Catch::Contains("call 2"));
    CHECK(third.ok());
    mock.fail_from(MockOp::device_free, 2);
    CHECK(mock.device_free(*first).ok());
    CHECK_FALSE(mock.device_free(*third).ok());
    CHECK_FALSE(mock.device_free(*third).ok());
    mock.clear_faults();
    CHECK(mock.device_free(*third).ok());
    CHECK(mock.journal().back().result == Errc::ok);
}

TEST_CASE("mock: adversarial alignment is exactly device_alignment", "[mock]") {
    MockBackend mock(MockConfig::adversarial());
    for (std::size_t bytes : {1, 64, 1000, 5000}) {
        auto p = mock.device_malloc(bytes);
        REQUIRE(p.ok());
        const auto address = reinterpret_cast<std::uintptr_t>(*p);
        CHECK(address % 64 == 0);
        CHECK(address % 128 != 0);
        REQUIRE(mock.device_free(*p).ok());
    }
    MockBackend natural;
    auto q = natural.device_malloc(10);
    REQUIRE(q.ok());
    CHECK(reinterpret_cast<std::uintptr_t>(*q) % 4096 == 0);
    REQUIRE(natural.device_free(*q).ok());
}

TEST_CASE("mock: double free, unknown pointers and out-of-bounds copies are reported", "[mock]") {
    MockBackend mock;
    auto p = mock.device_malloc(256);
    REQUIRE(p.ok());
    std::vector<std::byte> host(512);
    CHECK(mock.copy_to_device(*p, host.data(), 257).code() == Errc::invalid_argument);
    CHECK(mock.copy_from_device(host.data(), static_cast<std::byte*>(*p) + 200, 100).code() == Errc::invalid_argument);
    CHECK(mock.copy_from_device(host.data(), static_cast<std::byte*>(*p) + 200, 56).ok());
    REQUIRE(mock.device_free(*p).ok());
    const auto twice = mock.device_free(*p);
    CHECK(twice.code() == Errc::unknown_pointer);
    CHECK_THAT(twice.message(), Catch::Contains("double free"));
    const auto unknown = mock.device_free(host.data());
    CHECK_THAT(unknown.message(), Catch::Contains("unknown pointer"));
    CHECK(mock.misuses() == 4);
}

TEST_CASE("mock: allocations never freed are reported on destruction", "[mock]") {
    last_sink_message.clear();
    {
        MockBackend mock(MockConfig{.sink = &capture_sink});
        REQUIRE(mock.device_malloc(123).ok());
        REQUIRE(mock.pinned_malloc(45).ok());
        CHECK(mock.live_device_allocations() == 1);
        CHECK(mock.live_device_bytes() == 123);
        CHECK(mock.live_pinned_allocations() == 1);
    }
    CHECK_THAT(last_sink_message, Catch::Contains("leaked device allocation of 123 bytes") &&
                                      Catch::Contains("leaked pinned allocation of 45 bytes"));
}

TEST_CASE("mock: a device capacity gives out_of_memory", "[mock]") {
    MockBackend mock(MockConfig{.device_capacity = 1000});
    auto a = mock.device_malloc(600);
    REQUIRE(a.ok());
    CHECK(mock.device_malloc(600).status().code() == Errc::out_of_memory);
    REQUIRE(mock.device_free(*a).ok());
}

// ---- streams and events ---------------------------------------------------------------------

namespace {

using Stream = MockBackend::Stream;
using Event = MockBackend::Event;

Stream stream_of(MockBackend& mock) {
    auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    return *stream;
}
Event event_of(MockBackend& mock) {
    auto event = mock.create_event();
    REQUIRE(event.ok());
    return *event;
}
std::byte* device_bytes(MockBackend& mock, std::size_t bytes) {
    auto device = mock.device_malloc(bytes);
    REQUIRE(device.ok());
    return static_cast<std::byte*>(*device);
}

// A host function that appends its name to a shared log, to observe the order work ran in.
struct Step {
    std::vector<std::string>* log;
    std::string name;
};
void log_step(void* step) {
    const auto& s = *static_cast<Step*>(step);
    s.log->push_back(s.name);
}

MockConfig deferred(std::uint32_t polls = 2) {
    return MockConfig{.deferred_async = true, .not_ready_polls = polls};
}

}  // namespace

TEST_CASE("mock: every stream operation is journaled, counted and named", "[mock][async]") {
    STATIC_REQUIRE(devstage::mock_op_count == 27);
    CHECK(devstage::to_string(MockOp::host_register) == "host_register");
    CHECK(devstage::to_string(MockOp::host_unregister) == "host_unregister");
    CHECK(devstage::to_string(MockOp::device_memset_async) == "device_memset_async");
    CHECK(devstage::to_string(MockOp::copy_to_device_batch) == "copy_to_device_batch");
    CHECK(devstage::to_string(MockOp::copy_from_device_batch) == "copy_from_device_batch");
    CHECK(devstage::to_string(MockOp::create_stream) == "create_stream");
    CHECK(devstage::to_string(MockOp::copy_from_device_async) == "copy_from_device_async");
    CHECK(devstage::to_string(MockOp::launch_host_func) == "launch_host_func");
    MockBackend mock;
    std::vector<std::byte> host(64);
    std::byte* device = device_bytes(mock, 64);
    std::vector<std::string> log;
    Step step{&log, "ran"};
    mock.clear_journal();
    const Stream stream = stream_of(mock);
    const Event event = event_of(mock);
    REQUIRE(mock.copy_to_device_async(device, host.data(), 64, stream).ok());
    REQUIRE(mock.copy_from_device_async(host.data(), device, 32, stream).ok());
    REQUIRE(mock.device_memset_async(device + 32, 0, 32, stream).ok());
    REQUIRE(mock.launch_host_func(stream, &log_step, &step).ok());
    REQUIRE(mock.record_event(event, stream).ok());
    REQUIRE(mock.stream_wait_event(stream, event).ok());
    REQUIRE(mock.event_ready(event).ok());
    REQUIRE(mock.synchronize_event(event).ok());
    REQUIRE(mock.destroy_event(event).ok());
    REQUIRE(mock.destroy_stream(stream).ok());
    CHECK(log == std::vector<std::string>{"ran"});
    const std::vector<MockOp> expected{
        MockOp::create_stream,          MockOp::create_event,        MockOp::copy_to_device_async,
        MockOp::copy_from_device_async, MockOp::device_memset_async, MockOp::launch_host_func,
        MockOp::record_event,           MockOp::stream_wait_event,   MockOp::event_ready,
        MockOp::synchronize_event,      MockOp::destroy_event,       MockOp::destroy_stream};
    const auto journal = mock.journal();
    REQUIRE(journal.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
        CAPTURE(i);
        CHECK(journal[i].op == expected[i]);
        CHECK(journal[i].result == Errc::ok);
        CHECK(mock.calls(expected[i]) == 1);
    }
    CHECK(journal[2].pointer == device);
    CHECK(journal[2].bytes == 64);
    CHECK(journal[2].stream == stream.id);
    CHECK(journal[4].pointer == device + 32);
    CHECK(journal[6].stream == stream.id);
    CHECK(journal[6].event == event.id);
    CHECK(journal[5].pointer == &step);
    CHECK(devstage::test::read_device(mock, device + 32, 32) == std::vector<std::byte>(32));
    REQUIRE(mock.device_free(device).ok());
}

TEST_CASE("mock: fail_call fails each stream operation at its call", "[mock][async]") {
    const MockOp ops[] = {MockOp::create_stream,          MockOp::create_event,     MockOp::copy_to_device_async,
                          MockOp::copy_from_device_async, MockOp::launch_host_func, MockOp::record_event,
                          MockOp::stream_wait_event,      MockOp::event_ready,      MockOp::synchronize_event,
                          MockOp::destroy_event,          MockOp::destroy_stream,   MockOp::device_memset_async};
    for (const MockOp op : ops) {
        CAPTURE(devstage::to_string(op));
        MockBackend mock(MockConfig{.sink = &devstage::test::quiet_sink});
        mock.fail_call(op, 1, Errc::busy);
        std::vector<std::byte> host(64);
        std::byte* device = device_bytes(mock, 64);
        std::vector<std::string> log;
        Step step{&log, "ran"};
        // Each operation once, in an order that works; stop at the first failure.
        auto stream = mock.create_stream();
        auto event = mock.create_event();
        std::vector<std::pair<MockOp, devstage::Status>> outcomes{{MockOp::create_stream, stream.status()},
                                                                  {MockOp::create_event, event.status()}};
        if (stream.ok() && event.ok()) {
            outcomes.emplace_back(MockOp::copy_to_device_async,
                                  mock.copy_to_device_async(device, host.data(), 64, *stream));
            outcomes.emplace_back(MockOp::copy_from_device_async,
                                  mock.copy_from_device_async(host.data(), device, 64, *stream));
            outcomes.emplace_back(MockOp::device_memset_async, mock.device_memset_async(device, 0, 64, *stream));
            outcomes.emplace_back(MockOp::launch_host_func, mock.launch_host_func(*stream, &log_step, &step));
            outcomes.emplace_back(MockOp::record_event, mock.record_event(*event, *stream));
            outcomes.emplace_back(MockOp::stream_wait_event, mock.stream_wait_event(*stream, *event));
            outcomes.emplace_back(MockOp::event_ready, mock.event_ready(*event).status());
            outcomes.emplace_back(MockOp::synchronize_event, mock.synchronize_event(*event));
            outcomes.emplace_back(MockOp::destroy_event, mock.destroy_event(*event));
            outcomes.emplace_back(MockOp::destroy_stream, mock.destroy_stream(*stream));
        }
        for (const auto& [which, status] : outcomes) {
            CAPTURE(devstage::to_string(which));
            if (which == op) {
                CHECK(status.code() == Errc::busy);
                CHECK_THAT(status.message(),
                           Catch::Contains(std::string("mock ") + std::string(devstage::to_string(op))) &&
                               Catch::Contains("injected failure of call 1"));
            } else {
                CHECK(status.ok());
            }
        }
        CHECK(mock.calls(op) == 1);
        CHECK(mock.journal().back().op == outcomes.back().first);
        REQUIRE(mock.device_free(device).ok());
    }
}

TEST_CASE("mock: deferred work waits for the host, then runs latest-enqueued stream first", "[mock][async]") {
    std::vector<std::string> log;
    Step a1{&log, "A1"}, b1{&log, "B1"}, a2{&log, "A2"}, b2{&log, "B2"};
    for (const bool is_deferred : {false, true}) {
        CAPTURE(is_deferred);
        log.clear();
        MockBackend mock(MockConfig{.deferred_async = is_deferred});
        const Stream a = stream_of(mock);
        const Stream b = stream_of(mock);
        for (auto [stream, step] : {std::pair{a, &a1}, std::pair{b, &b1}, std::pair{a, &a2}, std::pair{b, &b2}}) {
            REQUIRE(mock.launch_host_func(stream, &log_step, step).ok());
        }
        if (is_deferred) {
            CHECK(log.empty());
            CHECK(mock.pending_operations() == 4);
            REQUIRE(mock.synchronize().ok());
            // Never enqueue order: whenever both streams can run, the later-enqueued work goes first.
            CHECK(log == std::vector<std::string>{"B1", "B2", "A1", "A2"});
        } else {
            CHECK(log == std::vector<std::string>{"A1", "B1", "A2", "B2"});
        }
        CHECK(mock.pending_operations() == 0);
        REQUIRE(mock.destroy_stream(a).ok());
        REQUIRE(mock.destroy_stream(b).ok());
    }
}

TEST_CASE("mock: synchronize_event runs exactly what the recording depends on", "[mock][async]") {
    MockBackend mock(deferred());
    std::vector<std::string> log;
    Step a1{&log, "A1"}, b1{&log, "B1"}, b2{&log, "B2"}, c1{&log, "C1"};
    const Stream a = stream_of(mock);
    const Stream b = stream_of(mock);
    const Stream c = stream_of(mock);
    const Event produced = event_of(mock);
    const Event consumed = event_of(mock);
    REQUIRE(mock.launch_host_func(a, &log_step, &a1).ok());
    REQUIRE(mock.record_event(produced, a).ok());
    REQUIRE(mock.launch_host_func(b, &log_step, &b1).ok());
    REQUIRE(mock.stream_wait_event(b, produced).ok());
    REQUIRE(mock.record_event(consumed, b).ok());
    REQUIRE(mock.launch_host_func(b, &log_step, &b2).ok());  // after the recording
    REQUIRE(mock.launch_host_func(c, &log_step, &c1).ok());  // unrelated
    REQUIRE(mock.synchronize_event(consumed).ok());
    CHECK(log == std::vector<std::string>{"B1", "A1"});
    CHECK(mock.pending_operations() == 2);
    auto ready = mock.event_ready(produced);
    REQUIRE(ready.ok());
    CHECK(*ready);  // ran on the way
    REQUIRE(mock.synchronize().ok());
    CHECK(log == std::vector<std::string>{"B1", "A1", "C1", "B2"});
    for (const Event event : {produced, consumed}) REQUIRE(mock.destroy_event(event).ok());
    for (const Stream stream : {a, b, c}) REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("mock: deferred, a read before the wait sees stale data", "[mock][async]") {
    MockBackend mock(deferred());
    constexpr std::size_t bytes = 512;
    std::byte* device = device_bytes(mock, bytes);
    const auto old_bytes = devstage::test::pattern(bytes, 1);
    REQUIRE(mock.copy_to_device(device, old_bytes.data(), bytes).ok());
    const Stream stream = stream_of(mock);
    const Event event = event_of(mock);
    std::vector<std::byte> out(bytes);
    REQUIRE(mock.copy_from_device_async(out.data(), device, bytes, stream).ok());
    REQUIRE(mock.record_event(event, stream).ok());
    CHECK(out == std::vector<std::byte>(bytes));  // the host has not waited: nothing arrived
    REQUIRE(mock.synchronize_event(event).ok());
    CHECK(out == old_bytes);
    REQUIRE(mock.destroy_event(event).ok());
    REQUIRE(mock.destroy_stream(stream).ok());
    REQUIRE(mock.device_free(device).ok());
}

TEST_CASE("mock: deferred, a missing cross-stream wait fails every time", "[mock][async]") {
    constexpr std::size_t bytes = 256;
    const auto in = devstage::test::pattern(bytes, 2);
    for (const bool wait : {false, true}) {
        for (int attempt = 0; attempt < 5; ++attempt) {
            CAPTURE(wait, attempt);
            MockBackend mock(deferred());
            std::byte* device = device_bytes(mock, bytes);
            const Stream producer = stream_of(mock);
            const Stream consumer = stream_of(mock);
            const Event produced = event_of(mock);
            std::vector<std::byte> out(bytes);
            REQUIRE(mock.copy_to_device_async(device, in.data(), bytes, producer).ok());
            REQUIRE(mock.record_event(produced, producer).ok());
            if (wait) REQUIRE(mock.stream_wait_event(consumer, produced).ok());
            REQUIRE(mock.copy_from_device_async(out.data(), device, bytes, consumer).ok());
            REQUIRE(mock.synchronize().ok());
            CHECK((out == in) == wait);
            REQUIRE(mock.destroy_event(produced).ok());
            for (const Stream stream : {producer, consumer}) REQUIRE(mock.destroy_stream(stream).ok());
            REQUIRE(mock.device_free(device).ok());
        }
    }
}

TEST_CASE("mock: deferred, freeing or synchronously touching memory that pending work uses is busy", "[mock][async]") {
    MockBackend mock(deferred());
    constexpr std::size_t bytes = 1024;
    std::byte* device = device_bytes(mock, bytes);
    std::byte* other = device_bytes(mock, bytes);
    auto pinned = mock.pinned_malloc(bytes);
    REQUIRE(pinned.ok());
    const Stream stream = stream_of(mock);
    REQUIRE(mock.copy_to_device_async(device + 256, *pinned, 128, stream).ok());
    REQUIRE(mock.pending_operations() == 1);
    std::vector<std::byte> host(bytes);

    const auto freed = mock.device_free(device);
    CHECK(freed.code() == Errc::busy);
    CHECK_THAT(freed.message(), Catch::Contains("mock device_free: 1024 bytes at") &&
                                    Catch::Contains("used by pending copy_to_device_async of 128 bytes on stream " +
                                                    std::to_string(stream.id)));
    CHECK(mock.pinned_free(*pinned).code() == Errc::busy);
    const auto copied = mock.copy_to_device(device + 300, host.data(), 10);
    CHECK(copied.code() == Errc::busy);
    CHECK_THAT(copied.message(), Catch::Contains("mock copy_to_device: 10 bytes at"));
    CHECK(mock.copy_from_device(host.data(), device, 257).code() == Errc::busy);
    CHECK(mock.device_memset(device + 383, 0, 1).code() == Errc::busy);
    CHECK(mock.misuses() == 5);
    CHECK(mock.journal().back().result == Errc::busy);
    CHECK(mock.live_device_allocations() == 2);
    CHECK(mock.live_pinned_allocations() == 1);
    // Next to the pending range, or in another allocation, is fine.
    CHECK(mock.copy_from_device(host.data(), device, 256).ok());
    CHECK(mock.copy_to_device(device + 384, host.data(), 10).ok());
    CHECK(mock.copy_to_device(other, host.data(), bytes).ok());
    CHECK(mock.device_free(other).ok());
    REQUIRE(mock.synchronize().ok());
    CHECK(mock.device_free(device).ok());
    CHECK(mock.pinned_free(*pinned).ok());
    CHECK(mock.misuses() == 5);
    REQUIRE(mock.destroy_stream(stream).ok());
}

namespace {
// "[begin, end)" as the mock's messages print a host range.
std::string host_range(const std::byte* begin, std::size_t bytes) {
    return devstage::detail::message("[", static_cast<const void*>(begin), ", ",
                                     static_cast<const void*>(begin + bytes), ")");
}
// Two streams, two device buffers and host memory, deferred; everything released at the end.
struct HazardFixture {
    static constexpr std::size_t bytes = 1024;
    MockBackend mock{deferred()};
    std::byte* device = device_bytes(mock, bytes);
    std::byte* other_device = device_bytes(mock, bytes);
    Stream a = stream_of(mock);
    Stream b = stream_of(mock);
    std::vector<std::byte> host = std::vector<std::byte>(bytes);
    std::vector<std::byte> host2 = std::vector<std::byte>(bytes);

    ~HazardFixture() {
        CHECK(mock.synchronize().ok());
        for (const Stream stream : {a, b}) CHECK(mock.destroy_stream(stream).ok());
        for (std::byte* pointer : {device, other_device}) CHECK(mock.device_free(pointer).ok());
    }
    std::string stream_text(Stream stream) const { return " on stream " + std::to_string(stream.id); }
};
}  // namespace

TEST_CASE("mock: deferred, an enqueued copy in a host hazard with an unordered pending copy is a misuse",
          "[mock][async]") {
    HazardFixture f;
    std::byte* const host = f.host.data();
    SECTION("read after write: an upload of host memory a pending copy-back on another stream writes") {
        REQUIRE(f.mock.copy_from_device_async(host, f.device, 512, f.a).ok());
        const auto refused = f.mock.copy_to_device_async(f.other_device, host + 256, 512, f.b);
        CHECK(refused.code() == Errc::busy);
        CHECK_THAT(refused.message(),
                   Catch::StartsWith("mock copy_to_device_async" + f.stream_text(f.b) + ": read after write on host " +
                                     host_range(host + 256, 256)) &&
                       Catch::Contains("it reads host " + host_range(host + 256, 512) + " (512 bytes)") &&
                       Catch::Contains("pending copy_from_device_async of 512 bytes" + f.stream_text(f.a) + " (host " +
                                       host_range(host, 512) + ") will still write") &&
                       Catch::Contains("no stream wait orders it after that copy"));
        CHECK(f.mock.misuse_report() == refused.message());
        CHECK(f.mock.journal().back().result == Errc::busy);
        CHECK(f.mock.pending_operations() == 1);  // the refused copy did nothing
    }
    SECTION("write after read: a copy-back into host memory a pending upload on another stream reads") {
        REQUIRE(f.mock.copy_to_device_async(f.device, host, 512, f.a).ok());
        const auto refused = f.mock.copy_from_device_async(host + 100, f.other_device, 10, f.b);
        CHECK(refused.code() == Errc::busy);
        CHECK_THAT(refused.message(),
                   Catch::StartsWith("mock copy_from_device_async" + f.stream_text(f.b) +
                                     ": write after read on host " + host_range(host + 100, 10)) &&
                       Catch::Contains("pending copy_to_device_async of 512 bytes" + f.stream_text(f.a)) &&
                       Catch::Contains("will still read"));
    }
    SECTION("write after write: two copy-backs on two streams into overlapping host memory") {
        REQUIRE(f.mock.copy_from_device_async(host, f.device, 512, f.a).ok());
        const auto refused = f.mock.copy_from_device_async(host + 511, f.other_device, 2, f.b);
        CHECK(refused.code() == Errc::busy);
        CHECK_THAT(refused.message(), Catch::Contains(": write after write on host " + host_range(host + 511, 1)));
    }
    SECTION("work enqueued on the waited stream after the recording is not ordered by the wait") {
        const Event copied = event_of(f.mock);
        REQUIRE(f.mock.copy_to_device_async(f.device, f.host2.data(), 8, f.a).ok());
        REQUIRE(f.mock.record_event(copied, f.a).ok());
        REQUIRE(f.mock.stream_wait_event(f.b, copied).ok());
        REQUIRE(f.mock.copy_from_device_async(host + 600, f.device, 8, f.a).ok());
        CHECK(f.mock.copy_from_device_async(host + 600, f.other_device, 8, f.b).code() == Errc::busy);
        REQUIRE(f.mock.destroy_event(copied).ok());
    }
    SECTION("a wait for a recording made before the conflicting copy does not order after it") {
        const Event early = event_of(f.mock);
        REQUIRE(f.mock.copy_to_device_async(f.device, f.host2.data(), 8, f.a).ok());
        REQUIRE(f.mock.record_event(early, f.a).ok());
        REQUIRE(f.mock.copy_from_device_async(host, f.device, 512, f.a).ok());
        REQUIRE(f.mock.stream_wait_event(f.b, early).ok());
        CHECK(f.mock.copy_to_device_async(f.other_device, host, 1, f.b).code() == Errc::busy);
        REQUIRE(f.mock.destroy_event(early).ok());
    }
    CHECK(f.mock.misuses() == 1);
}

TEST_CASE("mock: deferred, a synchronous copy touching host memory pending work still uses is a misuse",
          "[mock][async]") {
    HazardFixture f;
    std::byte* const host = f.host.data();
    std::byte* const host2 = f.host2.data();
    REQUIRE(f.mock.copy_from_device_async(host, f.device, 512, f.a).ok());       // will write host[0, 512)
    REQUIRE(f.mock.copy_to_device_async(f.device + 512, host2, 512, f.b).ok());  // will read host2[0, 512)

    const auto read = f.mock.copy_to_device(f.other_device, host + 500, 20);
    CHECK(read.code() == Errc::busy);
    CHECK_THAT(read.message(),
               Catch::StartsWith("mock copy_to_device: read after write on host " + host_range(host + 500, 12)) &&
                   Catch::Contains("pending copy_from_device_async of 512 bytes" + f.stream_text(f.a)) &&
                   Catch::Contains("it runs before that copy"));
    const auto written = f.mock.copy_from_device(host + 10, f.other_device, 4);
    CHECK(written.code() == Errc::busy);
    CHECK_THAT(written.message(),
               Catch::StartsWith("mock copy_from_device: write after write on host " + host_range(host + 10, 4)));
    const auto overwritten = f.mock.copy_from_device(host2 + 511, f.other_device, 1);
    CHECK(overwritten.code() == Errc::busy);
    CHECK_THAT(overwritten.message(),
               Catch::StartsWith("mock copy_from_device: write after read on host " + host_range(host2 + 511, 1)) &&
                   Catch::Contains("pending copy_to_device_async of 512 bytes" + f.stream_text(f.b)));
    CHECK(f.mock.misuses() == 3);
    CHECK_THAT(f.mock.misuse_report(),
               Catch::Contains(read.message() + "\n" + written.message() + "\n" + overwritten.message()));

    // Not flagged: reading what a pending copy only reads, and memory next to the pending ranges.
    CHECK(f.mock.copy_to_device(f.other_device, host2, 512).ok());
    CHECK(f.mock.copy_to_device(f.other_device, host + 512, 512).ok());
    CHECK(f.mock.copy_from_device(host2 + 512, f.other_device, 512).ok());
    CHECK(f.mock.misuses() == 3);
    // Once the work ran nothing is pending: the same copies are fine.
    REQUIRE(f.mock.synchronize().ok());
    CHECK(f.mock.copy_to_device(f.other_device, host + 500, 20).ok());
    CHECK(f.mock.copy_from_device(host2 + 511, f.other_device, 1).ok());
    CHECK(f.mock.misuses() == 3);
}

TEST_CASE("mock: deferred, copies ordered after the pending copy they conflict with are not hazards", "[mock][async]") {
    HazardFixture f;
    std::byte* const host = f.host.data();
    const auto written = devstage::test::pattern(512, 7);
    REQUIRE(f.mock.copy_to_device(f.device, written.data(), 512).ok());
    std::vector<std::byte> seen(512);
    SECTION("on the same stream") {
        REQUIRE(f.mock.copy_from_device_async(host, f.device, 512, f.a).ok());
        REQUIRE(f.mock.copy_to_device_async(f.other_device, host, 512, f.a).ok());    // read after write
        REQUIRE(f.mock.copy_from_device_async(host, f.other_device, 256, f.a).ok());  // write after write
        REQUIRE(f.mock.copy_to_device_async(f.device + 512, host, 512, f.a).ok());
        REQUIRE(f.mock.copy_from_device_async(host + 100, f.device, 8, f.a).ok());  // write after read
    }
    SECTION("on another stream, after a stream wait for a recording made after the conflicting copy") {
        const Event copied = event_of(f.mock);
        REQUIRE(f.mock.copy_from_device_async(host, f.device, 512, f.a).ok());
        REQUIRE(f.mock.record_event(copied, f.a).ok());
        REQUIRE(f.mock.stream_wait_event(f.b, copied).ok());
        REQUIRE(f.mock.copy_to_device_async(f.other_device, host, 512, f.b).ok());
        REQUIRE(f.mock.synchronize().ok());
        REQUIRE(f.mock.destroy_event(copied).ok());
    }
    SECTION("through waits on two streams, transitively") {
        const Stream c = stream_of(f.mock);
        const Event first = event_of(f.mock);
        const Event second = event_of(f.mock);
        REQUIRE(f.mock.copy_from_device_async(host, f.device, 512, f.a).ok());
        REQUIRE(f.mock.record_event(first, f.a).ok());
        REQUIRE(f.mock.stream_wait_event(f.b, first).ok());
        REQUIRE(f.mock.record_event(second, f.b).ok());
        REQUIRE(f.mock.stream_wait_event(c, second).ok());
        REQUIRE(f.mock.copy_to_device_async(f.other_device, host, 512, c).ok());
        REQUIRE(f.mock.synchronize().ok());
        for (const Event event : {first, second}) REQUIRE(f.mock.destroy_event(event).ok());
        REQUIRE(f.mock.destroy_stream(c).ok());
    }
    CHECK(f.mock.misuses() == 0);
    CHECK(f.mock.misuse_report().empty());
    REQUIRE(f.mock.synchronize().ok());
    REQUIRE(f.mock.copy_from_device(seen.data(), f.other_device, 512).ok());
    CHECK(seen == written);
}

TEST_CASE("mock: eager streams never check host hazards (nothing is left pending)", "[mock][async]") {
    MockBackend mock;
    std::byte* device = device_bytes(mock, 512);
    const Stream a = stream_of(mock);
    const Stream b = stream_of(mock);
    std::vector<std::byte> host(512);
    REQUIRE(mock.copy_from_device_async(host.data(), device, 512, a).ok());
    REQUIRE(mock.copy_to_device_async(device, host.data(), 512, b).ok());
    REQUIRE(mock.copy_from_device_async(host.data(), device, 512, b).ok());
    REQUIRE(mock.copy_to_device(device, host.data(), 512).ok());
    CHECK(mock.misuses() == 0);
    for (const Stream stream : {a, b}) REQUIRE(mock.destroy_stream(stream).ok());
    REQUIRE(mock.device_free(device).ok());
}

namespace {
struct Kernel {
    MockBackend* mock;
    std::byte* device;
    std::vector<std::byte> seen;
    devstage::Status copied, synchronized;
};
// A stand-in kernel: reads the device bytes with a synchronous copy, and tries to wait.
void run_kernel(void* context) {
    auto& kernel = *static_cast<Kernel*>(context);
    kernel.copied = kernel.mock->copy_from_device(kernel.seen.data(), kernel.device, kernel.seen.size());
    kernel.synchronized = kernel.mock->synchronize();
}
}  // namespace

TEST_CASE("mock: a host function's synchronous copies are stream work, its waits are refused", "[mock][async]") {
    for (const bool is_deferred : {false, true}) {
        CAPTURE(is_deferred);
        MockBackend mock(MockConfig{.deferred_async = is_deferred});
        constexpr std::size_t bytes = 128;
        std::byte* device = device_bytes(mock, bytes);
        const auto in = devstage::test::pattern(bytes, 3);
        std::vector<std::byte> out(bytes);
        const Stream stream = stream_of(mock);
        Kernel kernel{&mock, device, std::vector<std::byte>(bytes), {}, {}};
        REQUIRE(mock.copy_to_device_async(device, in.data(), bytes, stream).ok());
        REQUIRE(mock.launch_host_func(stream, &run_kernel, &kernel).ok());
        REQUIRE(mock.copy_from_device_async(out.data(), device, bytes, stream).ok());  // pending after it
        REQUIRE(mock.synchronize().ok());
        CHECK(kernel.copied.ok());
        CHECK(kernel.seen == in);
        CHECK(kernel.synchronized.code() == Errc::invalid_argument);
        CHECK_THAT(kernel.synchronized.message(), Catch::Contains("mock synchronize: called from a host function"));
        CHECK(out == in);
        CHECK(mock.misuses() == 1);  // the refused wait only
        REQUIRE(mock.destroy_stream(stream).ok());
        REQUIRE(mock.device_free(device).ok());
    }
}

TEST_CASE("mock: deferred event_ready answers not ready, then runs the work", "[mock][async]") {
    MockBackend mock(deferred(3));
    constexpr std::size_t bytes = 64;
    std::byte* device = device_bytes(mock, bytes);
    const auto in = devstage::test::pattern(bytes, 4);
    const Stream stream = stream_of(mock);
    const Event event = event_of(mock);
    for (int recording = 0; recording < 2; ++recording) {
        CAPTURE(recording);
        std::vector<std::byte> out(bytes);
        REQUIRE(mock.copy_to_device_async(device, in.data(), bytes, stream).ok());
        REQUIRE(mock.copy_from_device_async(out.data(), device, bytes, stream).ok());
        REQUIRE(mock.record_event(event, stream).ok());
        for (int poll = 0; poll < 3; ++poll) {
            auto ready = mock.event_ready(event);
            REQUIRE(ready.ok());
            CHECK_FALSE(*ready);
        }
        CHECK(out == std::vector<std::byte>(bytes));
        auto ready = mock.event_ready(event);
        REQUIRE(ready.ok());
        CHECK(*ready);
        CHECK(out == in);
        CHECK(mock.pending_operations() == 0);
    }
    REQUIRE(mock.destroy_event(event).ok());
    REQUIRE(mock.destroy_stream(stream).ok());
    REQUIRE(mock.device_free(device).ok());
}

TEST_CASE(
    "mock: a failure when run is reported by every later recording of its stream and of streams waiting for it, until "
    "cleared, and once by synchronize",
    "[mock][async]") {
    for (const bool is_deferred : {false, true}) {
        CAPTURE(is_deferred);
        MockBackend mock(MockConfig{.deferred_async = is_deferred});
        constexpr std::size_t bytes = 64;
        std::byte* device = device_bytes(mock, bytes);
        const auto first = devstage::test::pattern(bytes, 5);
        const auto second = devstage::test::pattern(bytes, 6);
        const Stream stream = stream_of(mock);
        const Stream other = stream_of(mock);
        const Event failed = event_of(mock);
        const Event clean = event_of(mock);
        const Event elsewhere = event_of(mock);
        mock.fail_when_run(MockOp::copy_to_device_async, 2, Errc::backend_failure);
        REQUIRE(mock.copy_to_device_async(device, first.data(), bytes, stream).ok());
        REQUIRE(mock.copy_to_device_async(device, second.data(), bytes, stream).ok());  // accepted
        REQUIRE(mock.record_event(elsewhere, other).ok());
        REQUIRE(mock.record_event(failed, stream).ok());
        REQUIRE(mock.record_event(clean, stream).ok());
        const auto reported = mock.synchronize_event(failed);
        CHECK(reported.code() == Errc::backend_failure);
        CHECK_THAT(reported.message(), Catch::Contains("mock copy_to_device_async: injected failure of call 2") &&
                                           Catch::Contains("stream " + std::to_string(stream.id)));
        CHECK(mock.event_ready(failed).status().code() == Errc::backend_failure);
        CHECK(mock.synchronize_event(clean).code() == Errc::backend_failure);  // sticky on the stream
        CHECK(mock.synchronize_event(elsewhere).ok());
        CHECK(devstage::test::read_device(mock, device, bytes) == first);  // the failed copy moved nothing
        CHECK(mock.synchronize().code() == Errc::backend_failure);
        CHECK(mock.synchronize().ok());  // reported once

        // A stream that waits for a failed recording inherits the failure.
        const Event joined = event_of(mock);
        REQUIRE(mock.stream_wait_event(other, clean).ok());
        REQUIRE(mock.record_event(joined, other).ok());
        CHECK(mock.synchronize_event(joined).code() == Errc::backend_failure);

        // clear_faults() disarms what is armed; the failure that happened stays until
        // clear_failures().
        mock.clear_faults();
        REQUIRE(mock.record_event(clean, stream).ok());
        CHECK(mock.synchronize_event(clean).code() == Errc::backend_failure);
        mock.clear_failures();
        REQUIRE(mock.record_event(clean, stream).ok());
        REQUIRE(mock.record_event(joined, other).ok());
        CHECK(mock.synchronize_event(clean).ok());
        CHECK(mock.synchronize_event(joined).ok());
        REQUIRE(mock.destroy_event(joined).ok());

        // A host function that fails when run is not called.
        std::vector<std::string> log;
        Step step{&log, "ran"};
        mock.fail_when_run(MockOp::launch_host_func, 1);
        REQUIRE(mock.launch_host_func(stream, &log_step, &step).ok());
        REQUIRE(mock.record_event(failed, stream).ok());
        CHECK(mock.synchronize_event(failed).code() == Errc::backend_failure);
        CHECK(log.empty());
        mock.clear_faults();
        for (const Event event : {failed, clean, elsewhere}) REQUIRE(mock.destroy_event(event).ok());
        for (const Stream s : {stream, other}) REQUIRE(mock.destroy_stream(s).ok());
        REQUIRE(mock.device_free(device).ok());
    }
}

TEST_CASE("mock: unknown streams and events are misuses", "[mock][async]") {
    MockBackend mock;
    const Stream stream = stream_of(mock);
    const Event event = event_of(mock);
    const Stream unknown_stream{stream.id + 1};
    const Event unknown_event{event.id + 1};
    std::byte host[8]{};
    std::byte* device = device_bytes(mock, 8);
    const auto destroyed = mock.destroy_stream(unknown_stream);
    CHECK(destroyed.code() == Errc::invalid_argument);
    CHECK_THAT(destroyed.message(), Catch::Contains("mock destroy_stream: unknown stream"));
    CHECK(mock.copy_to_device_async(device, host, 8, unknown_stream).code() == Errc::invalid_argument);
    CHECK(mock.record_event(unknown_event, stream).code() == Errc::invalid_argument);
    CHECK(mock.stream_wait_event(unknown_stream, event).code() == Errc::invalid_argument);
    CHECK(mock.event_ready(unknown_event).status().code() == Errc::invalid_argument);
    CHECK(mock.synchronize_event(unknown_event).code() == Errc::invalid_argument);
    CHECK(mock.destroy_event(unknown_event).code() == Errc::invalid_argument);
    CHECK(mock.launch_host_func(stream, nullptr, nullptr).code() == Errc::invalid_argument);
    CHECK(mock.misuses() == 8);
    REQUIRE(mock.destroy_event(event).ok());
    REQUIRE(mock.destroy_stream(stream).ok());
    REQUIRE(mock.device_free(device).ok());
}

TEST_CASE("mock: streams and events never destroyed are reported with their pending work", "[mock][async]") {
    last_sink_message.clear();
    {
        MockBackend mock(MockConfig{.sink = &capture_sink, .deferred_async = true});
        const Stream stream = stream_of(mock);
        const Event event = event_of(mock);
        std::vector<std::string> log;
        Step step{&log, "never"};
        REQUIRE(mock.launch_host_func(stream, &log_step, &step).ok());
        REQUIRE(mock.record_event(event, stream).ok());
        CHECK(mock.pending_operations() == 2);
        CHECK(mock.live_streams() == 1);
        CHECK(mock.live_events() == 1);
    }
    CHECK_THAT(last_sink_message,
               Catch::Contains("leaked stream 1 with 2 operations pending") && Catch::Contains("leaked event 1"));
}

// ---- regressions ----------------------------------------------------------------------------

TEST_CASE("mock: sizes that wrap when padded are out_of_memory, as on a device", "[mock][regression]") {
    for (const std::size_t offset : {std::size_t{0}, std::size_t{64}}) {
        MockBackend mock(MockConfig{.offset = offset});
        for (const std::size_t bytes : {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - 4095 - offset}) {
            CAPTURE(offset, bytes);
            const auto device = mock.device_malloc(bytes);
            REQUIRE_FALSE(device.ok());
            CHECK(device.status().code() == Errc::out_of_memory);
            CHECK_THAT(device.status().message(), Catch::Contains(std::to_string(bytes) + " bytes requested"));
            const auto pinned = mock.pinned_malloc(bytes);
            REQUIRE_FALSE(pinned.ok());
            CHECK(pinned.status().code() == Errc::out_of_memory);
        }
        CHECK(mock.live_device_allocations() == 0);
        CHECK(mock.live_pinned_allocations() == 0);
    }
}

TEST_CASE("mock: a host allocation failure in bookkeeping is out_of_memory, and releases what was taken",
          "[mock][regression]") {
    if (!devstage::test::failing_new_active()) {
        WARN("operator new is replaced by a tool (valgrind): no host allocation can be made to fail");
        return;
    }
    MockBackend mock(MockConfig{.journal = false});
    devstage::test::fail_nth_new(1);
    const auto device = mock.device_malloc(100);
    devstage::test::stop_failing_new();
    REQUIRE_FALSE(device.ok());
    CHECK(device.status().code() == Errc::out_of_memory);
    CHECK_THAT(device.status().message(), Catch::Contains("mock device_malloc: host memory exhausted"));
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.live_device_bytes() == 0);

    devstage::test::fail_nth_new(1);
    const auto pinned = mock.pinned_malloc(100);
    devstage::test::stop_failing_new();
    CHECK(pinned.status().code() == Errc::out_of_memory);
    CHECK(mock.live_pinned_allocations() == 0);

    devstage::test::fail_nth_new(1);
    const auto stream = mock.create_stream();
    devstage::test::stop_failing_new();
    CHECK(stream.status().code() == Errc::out_of_memory);
    CHECK(mock.live_streams() == 0);

    // A failed journal entry drops the entry, not the call.
    MockBackend journaled;
    devstage::test::fail_nth_new(2);  // the first is the allocation's own bookkeeping
    const auto kept = journaled.device_malloc(100);
    devstage::test::stop_failing_new();
    REQUIRE(kept.ok());
    CHECK(journaled.journal().empty());
    REQUIRE(journaled.device_free(*kept).ok());
}

namespace {
void count_up(void* counter) {
    ++*static_cast<std::atomic<int>*>(counter);
}
}  // namespace

TEST_CASE("mock: streams driven from several threads at once", "[mock][async][threads]") {
    for (const bool is_deferred : {false, true}) {
        CAPTURE(is_deferred);
        MockBackend mock(MockConfig{.journal = false, .deferred_async = is_deferred});
        constexpr int threads = 4;
        constexpr int rounds = 40;
        constexpr std::size_t bytes = 2048;
        std::atomic<int> kernels{0};
        std::atomic<int> wrong{0};
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                auto stream = mock.create_stream();
                auto event = mock.create_event();
                auto device = mock.device_malloc(bytes);
                if (!stream || !event || !device) {
                    ++wrong;
                    return;
                }
                for (int round = 0; round < rounds; ++round) {
                    const auto in = devstage::test::pattern(bytes, static_cast<std::uint32_t>(t * 1000 + round));
                    std::vector<std::byte> out(bytes);
                    bool ok = mock.copy_to_device_async(*device, in.data(), bytes, *stream).ok() &&
                              mock.launch_host_func(*stream, &count_up, &kernels).ok() &&
                              mock.copy_from_device_async(out.data(), *device, bytes, *stream).ok() &&
                              mock.record_event(*event, *stream).ok();
                    if (round % 3 == 0) {
                        ok = ok && mock.synchronize().ok();
                    } else if (round % 3 == 1) {
                        for (auto ready = mock.event_ready(*event); ok && (!ready.ok() || !*ready);
                             ready = mock.event_ready(*event)) {
                            ok = ready.ok();
                        }
                    } else {
                        ok = ok && mock.synchronize_event(*event).ok();
                    }
                    if (!ok || out != in) ++wrong;
                }
                if (!mock.destroy_event(*event).ok() || !mock.destroy_stream(*stream).ok() ||
                    !mock.device_free(*device).ok()) {
                    ++wrong;
                }
            });
        }
        for (auto& worker : workers) worker.join();
        CHECK(wrong.load() == 0);
        CHECK(kernels.load() == threads * rounds);
        CHECK(mock.misuses() == 0);
        CHECK(mock.leak_report().empty());
    }
}

TEST_CASE("mock: a deferred device_memset_async runs in stream order, holds its range, fails when run",
          "[mock][async][memset]") {
    MockBackend mock(deferred());
    std::byte* device = device_bytes(mock, 256);
    const std::vector<std::byte> ones(256, std::byte{1});
    REQUIRE(mock.copy_to_device(device, ones.data(), ones.size()).ok());
    const Stream stream = stream_of(mock);
    REQUIRE(mock.device_memset_async(device + 64, 0, 128, stream).ok());
    CHECK(mock.device_free(device).code() == Errc::busy);  // pending work holds the range
    CHECK(mock.misuses() == 1);
    REQUIRE(mock.synchronize().ok());
    std::vector<std::byte> expected = ones;
    std::fill(expected.begin() + 64, expected.begin() + 192, std::byte{0});
    CHECK(devstage::test::read_device(mock, device, 256) == expected);
    // Outside every allocation: a misuse, refused at the call.
    std::byte outside[8]{};
    CHECK(mock.device_memset_async(outside, 0, 8, stream).code() == Errc::invalid_argument);
    // fail_when_run: accepted at the call, failed when it runs, no byte set.
    mock.fail_when_run(MockOp::device_memset_async, mock.calls(MockOp::device_memset_async) + 1);
    REQUIRE(mock.device_memset_async(device, 0, 64, stream).ok());
    CHECK(mock.synchronize().code() == Errc::backend_failure);
    CHECK(devstage::test::read_device(mock, device, 64) == std::vector<std::byte>(ones.begin(), ones.begin() + 64));
    mock.clear_failures();
    REQUIRE(mock.destroy_stream(stream).ok());
    REQUIRE(mock.device_free(device).ok());
}

// ---- mapped host memory and kernels that say what they touch ----------------------------------

TEST_CASE("mock: map_host maps page-aligned pinned memory at its own address, journaled", "[mock][mapped]") {
    MockBackend mock;
    auto pinned = mock.pinned_malloc(3 * 4096);
    REQUIRE(pinned.ok());
    auto* const host = static_cast<std::byte*>(*pinned);  // the mock's blocks are page-aligned (offset 0)
    auto mapped = mock.map_host(host, 8192);
    REQUIRE(mapped.ok());
    CHECK(*mapped == host);
    CHECK(mock.live_mappings() == 1);
    CHECK(mock.calls(MockOp::map_host) == 1);
    CHECK(mock.journal().back().op == MockOp::map_host);
    CHECK(mock.journal().back().bytes == 8192);
    // Refused: misaligned, outside pinned memory, overlapping a mapping, nothing.
    std::vector<std::byte> pageable(8192);
    const auto refused = [&](void* at, std::size_t bytes, const char* why) {
        auto result = mock.map_host(at, bytes);
        CHECK(result.status().code() == Errc::invalid_argument);
        CHECK_THAT(result.status().message(), Catch::Contains(why));
    };
    refused(host + 64, 64, "not aligned to 4096");
    refused(host + 8192, 8192, "do not lie in one pinned allocation");
    refused(pageable.data(), 64, "");
    refused(host + 4096, 64, "overlap memory already mapped");
    refused(host, 0, "no bytes");
    CHECK(mock.misuses() == 5);
    CHECK(mock.map_host(host + 8192, 4096).ok());  // the page after the mapping
    // A mapped address is no copy's device side; pinned memory still mapped is not freed.
    auto device = mock.device_malloc(64);
    REQUIRE(device.ok());
    const auto copied = mock.copy_to_device(host, *device, 16);
    CHECK(copied.code() == Errc::invalid_argument);
    CHECK_THAT(copied.message(), Catch::Contains("mapped host memory"));
    const auto freed = mock.pinned_free(host);
    CHECK(freed.code() == Errc::invalid_argument);
    CHECK_THAT(freed.message(), Catch::Contains("still mapped"));
    CHECK_THAT(mock.leak_report(), Catch::Contains("never unmapped"));
    CHECK(mock.unmap_host(host).ok());
    CHECK(mock.unmap_host(host + 8192).ok());
    CHECK(mock.unmap_host(host).code() == Errc::unknown_pointer);
    CHECK(mock.live_mappings() == 0);
    CHECK(mock.pinned_free(host).ok());
    CHECK(mock.device_free(*device).ok());
    CHECK(mock.misuses() == 5 + 3);
    mock.fail_call(MockOp::map_host, mock.calls(MockOp::map_host) + 1);
    auto again = mock.pinned_malloc(4096);
    REQUIRE(again.ok());
    CHECK_THAT(mock.map_host(*again, 4096).status().message(), Catch::Contains("injected"));
    CHECK(mock.pinned_free(*again).ok());
}

TEST_CASE(
    "mock: deferred, a kernel's accesses are in use until it ran: frees, unmaps and host accesses that race "
    "it are misuses",
    "[mock][mapped][async]") {
    MockBackend mock(deferred());
    auto pinned = mock.pinned_malloc(4096);
    auto device = mock.device_malloc(1024);
    REQUIRE((pinned.ok() && device.ok()));
    auto* const host = static_cast<std::byte*>(*pinned);
    REQUIRE(mock.map_host(host, 4096).ok());
    const Stream stream = stream_of(mock);
    bool ran = false;
    const devstage::KernelAccess accesses[] = {{host, 256, true, false},         // reads [0, 256)
                                               {host + 1024, 512, false, true},  // writes [1024, 1536)
                                               {*device, 1024, true, true}};     // device memory
    REQUIRE(mock.launch_kernel(
                    stream, [](void* flag) noexcept { *static_cast<bool*>(flag) = true; }, &ran, accesses)
                .ok());
    CHECK_FALSE(ran);
    CHECK(mock.calls(MockOp::launch_kernel) == 1);
    // The host: a read of what the kernel reads is fine; a write of it is not; neither touches
    // what it writes.
    CHECK(mock.check_host_access(host, 256, false).ok());
    CHECK(mock.check_host_access(host + 2048, 512, true).ok());
    const auto war = mock.check_host_access(host + 100, 8, true);
    CHECK(war.code() == Errc::busy);
    CHECK_THAT(war.message(), Catch::Contains("write after read") && Catch::Contains("pending kernel"));
    const auto raw = mock.check_host_access(host + 1500, 100, false);
    CHECK(raw.code() == Errc::busy);
    CHECK_THAT(raw.message(), Catch::Contains("read after write") && Catch::Contains("will still write"));
    CHECK(mock.check_host_access(host + 1024, 1, true).code() == Errc::busy);  // write after write
    CHECK(mock.unmap_host(host).code() == Errc::busy);
    CHECK(mock.device_free(*device).code() == Errc::busy);
    std::vector<std::byte> copy(64);
    CHECK(mock.copy_from_device(copy.data(), *device, 64).code() == Errc::busy);
    CHECK(mock.misuses() == 6);
    // A pending copy's host side counts too: a host read of what a copy back will write.
    REQUIRE(mock.copy_from_device_async(host + 3000, *device, 64, stream).ok());
    CHECK_THAT(mock.check_host_access(host + 3010, 1, false).message(),
               Catch::Contains("copy_from_device_async") && Catch::Contains("will still write"));
    REQUIRE(mock.synchronize().ok());
    CHECK(ran);
    CHECK(mock.check_host_access(host, 4096, true).ok());  // nothing pending now
    CHECK(mock.misuses() == 7);
    CHECK(mock.unmap_host(host).ok());
    CHECK(mock.pinned_free(host).ok());
    CHECK(mock.device_free(*device).ok());
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("mock: a kernel's access outside device memory and mappings is refused; eager kernels run at once",
          "[mock][mapped][async]") {
    MockBackend mock;
    const Stream stream = stream_of(mock);
    std::vector<std::byte> pageable(64);
    bool ran = false;
    const devstage::KernelAccess stray[] = {{pageable.data(), 64, true, false}};
    const auto refused = mock.launch_kernel(
        stream, [](void* flag) noexcept { *static_cast<bool*>(flag) = true; }, &ran, stray);
    CHECK(refused.code() == Errc::invalid_argument);
    CHECK_THAT(refused.message(), Catch::Contains("neither inside one device allocation nor inside one mapping"));
    CHECK_FALSE(ran);
    const devstage::KernelAccess none[] = {{nullptr, 0, true, false}};
    REQUIRE(mock.launch_kernel(
                    stream, [](void* flag) noexcept { *static_cast<bool*>(flag) = true; }, &ran, none)
                .ok());
    CHECK(ran);                                                     // eager: at the call
    CHECK(mock.check_host_access(pageable.data(), 64, true).ok());  // eager: nothing is pending to race
    mock.fail_when_run(MockOp::launch_kernel, mock.calls(MockOp::launch_kernel) + 1);
    ran = false;
    REQUIRE(mock.launch_kernel(
                    stream, [](void* flag) noexcept { *static_cast<bool*>(flag) = true; }, &ran, none)
                .ok());
    CHECK_FALSE(ran);  // failed when it ran: not called
    CHECK(mock.synchronize().code() == Errc::backend_failure);
    mock.clear_failures();
    REQUIRE(mock.destroy_stream(stream).ok());
}
