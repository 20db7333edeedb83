// SPDX-License-Identifier: Apache-2.0
// OutputPolicy::zero: Out args zeroed on the device before the kernel — the ranges and calls
// (packed Out group in one call, adjacent slices merged), a failing memset, and the zeros
// uploaded for a backend without a device memset.
#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "async_support.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/packing.hpp"
#include "support.hpp"

using namespace devstage;

namespace {
using PackedZeroing = RetainedBump<ExactGrowth, 1024, PackSmall<4096>>;

// The mock without its device memsets: the stager uploads zeros instead.
class NoMemsetMock {
public:
    using Stream = MockBackend::Stream;
    using Event = MockBackend::Event;
    static constexpr std::size_t device_alignment = MockBackend::device_alignment;
    explicit NoMemsetMock(MockConfig config = {}) : mock_(config) {}

    MockBackend& mock() noexcept { return mock_; }
    std::string_view name() const noexcept { return "no-memset"; }
    Result<void*> device_malloc(std::size_t bytes) noexcept { return mock_.device_malloc(bytes); }
    Status device_free(void* p) noexcept { return mock_.device_free(p); }
    Status copy_to_device(void* d, const void* h, std::size_t n) noexcept { return mock_.copy_to_device(d, h, n); }
    Status copy_from_device(void* h, const void* d, std::size_t n) noexcept { return mock_.copy_from_device(h, d, n); }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept { return mock_.pinned_malloc(bytes); }
    Status pinned_free(void* p) noexcept { return mock_.pinned_free(p); }
    Result<Stream> create_stream() noexcept { return mock_.create_stream(); }
    Status destroy_stream(Stream s) noexcept { return mock_.destroy_stream(s); }
    Status copy_to_device_async(void* d, const void* h, std::size_t n, Stream s) noexcept {
        return mock_.copy_to_device_async(d, h, n, s);
    }
    Status copy_from_device_async(void* h, const void* d, std::size_t n, Stream s) noexcept {
        return mock_.copy_from_device_async(h, d, n, s);
    }
    Result<Event> create_event() noexcept { return mock_.create_event(); }
    Status destroy_event(Event e) noexcept { return mock_.destroy_event(e); }
    Status record_event(Event e, Stream s) noexcept { return mock_.record_event(e, s); }
    Result<bool> event_ready(Event e) noexcept { return mock_.event_ready(e); }
    Status synchronize_event(Event e) noexcept { return mock_.synchronize_event(e); }
    Status stream_wait_event(Stream s, Event e) noexcept { return mock_.stream_wait_event(s, e); }

private:
    MockBackend mock_;
};
static_assert(AsyncBackend<NoMemsetMock> && PinnedHostBackend<NoMemsetMock>);
static_assert(!MemsetBackend<NoMemsetMock> && !AsyncMemsetBackend<NoMemsetMock>);

std::size_t memsets(const MockBackend& mock) {
    return mock.calls(MockOp::device_memset_async);
}
}  // namespace

TEST_CASE("zeroing: adjacent Out slices are one call; an arg between them splits it", "[zeroing]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock);
    std::vector<std::byte> host(20000, std::byte{7});
    const TensorArg adjacent[] = {{host.data(), 5000, Direction::Out}, {host.data() + 5000, 3000, Direction::Out}};
    auto run = stager.bind(adjacent);
    REQUIRE(run.ok());
    CHECK(memsets(mock) == 1);
    CHECK(stager.stats().zeroing_calls == 1);
    CHECK(stager.stats().zeroed_bytes == 5120 + 3000);  // the padding between the slices too
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(devstage::test::same_bytes(std::span(host).first(8000), std::vector<std::byte>(8000)));
    const TensorArg split[] = {{host.data(), 5000, Direction::Out},
                               {host.data() + 5000, 100, Direction::In},
                               {host.data() + 6000, 3000, Direction::Out},
                               {host.data() + 9000, 0, Direction::Out},
                               {host.data() + 9000, 700, Direction::InOut}};
    run = stager.bind(split);
    REQUIRE(run.ok());
    CHECK(memsets(mock) == 1 + 2);  // InOut args are uploaded, not zeroed
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(mock.misuses() == 0);
}

TEST_CASE(
    "zeroing: the packed Out group is zeroed in the mirror and uploaded with the inputs, direct Out args "
    "have their own call",
    "[zeroing][packing]") {
    MockBackend mock;
    Stager<MockBackend, PackedZeroing> stager(mock);
    std::vector<std::byte> host(40000, std::byte{7});
    const TensorArg args[] = {{host.data(), 100, Direction::Out},
                              {host.data() + 100, 200, Direction::In},
                              {host.data() + 300, 300, Direction::Out},
                              {host.data() + 1000, 20000, Direction::Out},  // direct: above the pack limit
                              {host.data() + 21000, 64, Direction::Out}};
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    CHECK(memsets(mock) == 1);  // the direct Out only
    CHECK(stager.stats().zeroing_calls == 1);
    CHECK(stager.stats().uploads == 1);  // the In and the zeroed Out group: one packed copy
    // The Out group: 100 and 300 bytes at 1024 each, and 64 bytes (In first, then the Outs).
    CHECK(stager.stats().host_zeroed_bytes == 1024 + 1024 + 64);
    CHECK(stager.stats().bytes_to_device == 1024 + 1024 + 1024 + 64);
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(devstage::test::same_bytes(std::span(host).subspan(1000, 20064), std::vector<std::byte>(20064)));
    CHECK(devstage::test::same_bytes(std::span(host).first(100), std::vector<std::byte>(100)));
    CHECK(devstage::test::same_bytes(std::span(host).subspan(300, 300), std::vector<std::byte>(300)));
    CHECK(host[150] == std::byte{7});  // an In arg: untouched
}

TEST_CASE("zeroing: PerTensorMalloc's fresh allocations, which hold stale bytes, read back as zeros",
          "[zeroing][per_tensor]") {
    MockBackend mock;  // fresh device memory is filled with 0xA5, never zeros
    Stager<MockBackend, PerTensorMalloc<>> stager(mock);
    std::vector<std::byte> out(3000, std::byte{7});
    const TensorArg args[] = {{out.data(), 1000, Direction::Out}, {out.data() + 1000, 2000, Direction::Out}};
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    CHECK(memsets(mock) == 2);  // separate allocations are never merged
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(devstage::test::same_bytes(out, std::vector<std::byte>(3000)));
    stager.set_output_policy(OutputPolicy::kernel_writes_all);
    CHECK(stager.output_policy() == OutputPolicy::kernel_writes_all);
    run = stager.bind(args);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(out[0] == std::byte{0xA5});  // opted out: what the allocation held
    CHECK(memsets(mock) == 2);
}

TEST_CASE("zeroing: a memset refused at the call fails the bind; nothing is kept; the stager goes on",
          "[zeroing][transactional]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink});
    const auto stream = test::make_stream(mock);
    Stager<MockBackend, PackedZeroing> stager(mock);
    std::vector<std::byte> host(30000, std::byte{7});
    // Two direct Out args apart (an In between), and a packed one zeroed in the mirror.
    std::vector<std::byte> far(22000, std::byte{9});
    const TensorArg args[] = {{host.data(), 2000, Direction::In},
                              {host.data() + 2000, 100, Direction::Out},
                              {host.data() + 3000, 20000, Direction::Out},
                              {far.data(), 17000, Direction::In},
                              {far.data() + 17000, 5000, Direction::Out}};
    for (std::uint64_t k = 1; k <= 2; ++k) {
        CAPTURE(k);
        mock.fail_call(MockOp::device_memset_async, memsets(mock) + k, Errc::out_of_memory);
        auto run = stager.bind(args, stream);
        REQUIRE_FALSE(run.ok());
        CHECK(run.status().code() == Errc::out_of_memory);
        CHECK_THAT(run.status().message(),
                   Catch::Contains("zeroing Out args") && Catch::Contains("mock") && Catch::Contains("bytes"));
        CHECK(stager.live_runs() == 0);
        CHECK(host[2000] == std::byte{7});  // nothing copied back into the caller's memory
        mock.clear_faults();
        auto again = stager.bind(args, stream);
        REQUIRE(again.ok());
        auto done = stager.finish(std::move(*again), stream);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        CHECK(devstage::test::same_bytes(std::span(host).subspan(3000, 20000), std::vector<std::byte>(20000)));
        std::fill(host.begin(), host.end(), std::byte{7});
    }
    REQUIRE(stager.release().ok());
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("zeroing: a memset that fails when it runs is the Completion's error", "[zeroing][deferred]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = true});
    const auto stream = test::make_stream(mock);
    Stager<MockBackend> stager(mock);
    stager.set_error_sink(&test::quiet_sink);  // the settled failure is reported there too
    std::vector<std::byte> host(4096, std::byte{7});
    const TensorArg args[] = {{host.data(), 4096, Direction::Out}};
    mock.fail_when_run(MockOp::device_memset_async, 1);
    auto run = stager.bind(args, stream);
    REQUIRE(run.ok());
    auto done = stager.finish(std::move(*run), stream);
    REQUIRE(done.ok());
    const Status waited = done->wait();
    CHECK(waited.code() == Errc::backend_failure);
    CHECK_THAT(waited.message(), Catch::Contains("device_memset_async"));
    mock.clear_failures();
    mock.clear_faults();
    auto next = stager.bind(args, stream);  // the stager goes on
    REQUIRE(next.ok());
    auto ok = stager.finish(std::move(*next), stream);
    REQUIRE(ok.ok());
    CHECK(ok->wait().ok());
    CHECK(devstage::test::same_bytes(host, std::vector<std::byte>(4096)));
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("zeroing: without a device memset, zeros are uploaded from a static block, in chunks",
          "[zeroing][fallback]") {
    NoMemsetMock backend(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(backend);
    {
        Stager<NoMemsetMock> stager(backend);
        const std::size_t big = (std::size_t{5} << 20) / 2;  // 2.5 MiB: three uploads of zeros
        std::vector<std::byte> warm(big, std::byte{0xAB}), out(big, std::byte{7});
        const TensorArg in[] = {{warm.data(), big, Direction::In}};
        auto first = stager.bind(in, stream);
        REQUIRE(first.ok());
        auto first_done = stager.finish(std::move(*first), stream);
        REQUIRE(first_done.ok());
        REQUIRE(first_done->wait().ok());
        const std::uint64_t pinned = backend.mock().calls(MockOp::pinned_malloc);
        for (int step = 0; step < 2; ++step) {
            const TensorArg args[] = {{out.data(), big, Direction::Out}};
            auto run = stager.bind(args, stream);
            REQUIRE(run.ok());
            auto done = stager.finish(std::move(*run), stream);
            REQUIRE(done.ok());
            REQUIRE(done->wait().ok());
            CHECK(devstage::test::same_bytes(out, std::vector<std::byte>(big)));
            std::fill(out.begin(), out.end(), std::byte{7});
        }
        CHECK(stager.stats().zero_uploads == 2 * 3);
        CHECK(stager.stats().zeroing_calls == 2 * 3);
        CHECK(stager.stats().zeroed_bytes == 2 * big);
        CHECK(backend.mock().calls(MockOp::pinned_malloc) == pinned);  // the zeros are in static storage
        REQUIRE(stager.release().ok());
    }
    CHECK(backend.mock().misuses() == 0);
    REQUIRE(backend.destroy_stream(stream).ok());
}
