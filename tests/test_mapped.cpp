// SPDX-License-Identifier: Apache-2.0
// Mapped staging (MapSmall in strategy/packing.hpp over a MappedHostBackend): the small args of
// a run lie in its slot's mirror, mapped for the device, where the kernel reads and writes them
// with no copy; everything else stages as PackSmall does. Without the capability, or where
// map_host refuses, it is PackSmall. (The random programs of test_sequential check mapped runs
// against their sequential run; this file checks the calls, the fallbacks and the errors.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "support.hpp"

using namespace devstage;

namespace {

using MapBump = RetainedBump<ExactGrowth, 1024, MapSmall<16384>>;
using PackBump = RetainedBump<ExactGrowth, 1024, PackSmall<16384>>;

// A mock that copies and pins but neither maps nor sets device memory: PackSmall's ground.
class CopyOnlyMock {
public:
    using Stream = MockBackend::Stream;
    using Event = MockBackend::Event;
    static constexpr std::size_t device_alignment = MockBackend::device_alignment;
    explicit CopyOnlyMock(MockConfig config = {}) noexcept : mock_(config) {}
    MockBackend& mock() noexcept { return mock_; }
    std::string_view name() const noexcept { return "copy-only mock"; }
    Result<void*> device_malloc(std::size_t n) noexcept { return mock_.device_malloc(n); }
    Status device_free(void* p) noexcept { return mock_.device_free(p); }
    Status copy_to_device(void* d, const void* h, std::size_t n) noexcept { return mock_.copy_to_device(d, h, n); }
    Status copy_from_device(void* h, const void* d, std::size_t n) noexcept { return mock_.copy_from_device(h, d, n); }
    Result<void*> pinned_malloc(std::size_t n) noexcept { return mock_.pinned_malloc(n); }
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
static_assert(AsyncBackend<CopyOnlyMock> && PinnedHostBackend<CopyOnlyMock>);
static_assert(!MappedHostBackend<CopyOnlyMock> && !AsyncMemsetBackend<CopyOnlyMock> && !MemsetBackend<CopyOnlyMock>);

// A mock whose device addresses of mapped memory are 64 bytes off: not aligned as the slices.
class SkewedMapMock : public MockBackend {
public:
    using MockBackend::MockBackend;
    Result<void*> map_host(void* host, std::size_t bytes) noexcept {
        Result<void*> mapped = MockBackend::map_host(host, bytes);
        if (!mapped) return mapped;
        return static_cast<void*>(static_cast<std::byte*>(*mapped) + 64);
    }
};

// A synchronous backend (no streams) that maps: the mock's memory and copies, nothing else.
class SyncMapMock {
public:
    static constexpr std::size_t device_alignment = MockBackend::device_alignment;
    static constexpr std::size_t host_map_alignment = MockBackend::host_map_alignment;
    MockBackend& mock() noexcept { return mock_; }
    std::string_view name() const noexcept { return "synchronous mapping mock"; }
    Result<void*> device_malloc(std::size_t n) noexcept { return mock_.device_malloc(n); }
    Status device_free(void* p) noexcept { return mock_.device_free(p); }
    Status copy_to_device(void* d, const void* h, std::size_t n) noexcept { return mock_.copy_to_device(d, h, n); }
    Status copy_from_device(void* h, const void* d, std::size_t n) noexcept { return mock_.copy_from_device(h, d, n); }
    Result<void*> pinned_malloc(std::size_t n) noexcept { return mock_.pinned_malloc(n); }
    Status pinned_free(void* p) noexcept { return mock_.pinned_free(p); }
    Result<void*> map_host(void* h, std::size_t n) noexcept { return mock_.map_host(h, n); }
    Status unmap_host(void* h) noexcept { return mock_.unmap_host(h); }

private:
    MockBackend mock_;
};
static_assert(MappedHostBackend<SyncMapMock> && !AsyncBackend<SyncMapMock>);

// The decode-like frame of the acceptance check: 4 small In tensors and 1 small Out.
constexpr TensorShape small_step[] = {
    {4096, Direction::In}, {2048, Direction::In}, {128, Direction::In}, {64, Direction::In}, {4000, Direction::Out}};

// The stand-in kernel of a frame or run: each Out byte i = the sum of byte i of every input
// (mod 256), written from the device args (host-addressable on these backends); with `partial`
// the last quarter of each output is left unwritten.
void kernel(std::span<const TensorArg> device_args, bool partial = false) {
    std::size_t inputs = 0;
    for (const TensorArg& arg : device_args) inputs += uploads(arg.direction) ? 1 : 0;
    for (const TensorArg& out : device_args) {
        if (out.direction == Direction::In) continue;
        auto* bytes = static_cast<std::uint8_t*>(out.data);
        const std::size_t written = partial ? out.bytes - out.bytes / 4 : out.bytes;
        for (std::size_t i = 0; i < written; ++i) {
            unsigned sum = out.direction == Direction::InOut ? bytes[i] : 0;
            for (const TensorArg& in : device_args) {
                if (in.direction == Direction::In && i < in.bytes) sum += static_cast<const std::uint8_t*>(in.data)[i];
            }
            bytes[i] = static_cast<std::uint8_t>(sum + inputs);
        }
    }
}

// What kernel() leaves in output `out` of `args` (host copies).
std::vector<std::uint8_t> expected(std::span<const TensorArg> args, const TensorArg& out,
                                   const std::vector<std::uint8_t>& before, bool partial = false) {
    std::size_t inputs = 0;
    for (const TensorArg& arg : args) inputs += uploads(arg.direction) ? 1 : 0;
    std::vector<std::uint8_t> bytes = before;
    const std::size_t written = partial ? out.bytes - out.bytes / 4 : out.bytes;
    for (std::size_t i = 0; i < written; ++i) {
        unsigned sum = out.direction == Direction::InOut ? before[i] : 0;
        for (const TensorArg& in : args) {
            if (in.direction == Direction::In && i < in.bytes) sum += static_cast<const std::uint8_t*>(in.data)[i];
        }
        bytes[i] = static_cast<std::uint8_t>(sum + inputs);
    }
    return bytes;
}

template <class B, class S>
void frame_step(B& backend, Stager<B, S>& stager, bool partial) {
    auto frame = stager.frame(small_step);
    REQUIRE(frame.ok());
    for (std::size_t i = 0; i < 4; ++i) {
        std::span<std::byte> in = frame->host(i);
        for (std::size_t b = 0; b < in.size(); ++b) in[b] = static_cast<std::byte>(b * (i + 3));
    }
    std::vector<TensorArg> inputs(frame->args().begin(), frame->args().end());
    const std::vector<std::uint8_t> zeros(4000, 0);
    const std::vector<std::uint8_t> want = expected(inputs, inputs[4], zeros, partial);
    auto run = stager.bind(*frame);
    REQUIRE(run.ok());
    kernel(run->device_args(), partial);
    (void)backend;
    REQUIRE(stager.finish(std::move(*run)).ok());
    const std::span<std::byte> out = frame->host(4);
    CHECK(std::equal(out.begin(), out.end(), reinterpret_cast<const std::byte*>(want.data())));
}

}  // namespace

TEMPLATE_TEST_CASE(
    "mapped: a frame of 4 small In and 1 small Out makes no upload and no copy back on a backend "
    "that maps",
    "[mapped][frame]", MockBackend, SimBackend, test::AdversarialMock) {
    TestType backend;
    Stager<TestType, MapBump> stager(backend);
    for (const bool partial : {false, true}) {  // a kernel that leaves bytes unwritten: zeros there
        frame_step(backend, stager, true);
        frame_step(backend, stager, partial);
    }
    const StagerStats& stats = stager.stats();
    CHECK(stats.runs == 4);
    CHECK(stats.mapped_runs == 4);
    CHECK(stats.uploads == 0);
    CHECK(stats.copy_backs == 0);
    CHECK(stats.zeroing_calls == 0);
    CHECK(stats.bytes_to_device == 0);
    CHECK(stats.bytes_from_device == 0);
    CHECK(stats.host_zeroed_bytes == 4 * 4000);  // the Out, zeroed by the host in the mapped mirror
    CHECK(stats.device_mallocs == 0);            // everything lies in the mirror
    CHECK(stats.host_maps == 1);
    CHECK(stats.mapped_bytes >= 4096 + 2048 + 1024 + 1024 + 4096);
    CHECK(stats.mirror_copy_bytes == 0);
    REQUIRE(stager.release().ok());
    CHECK(stager.stats().mapped_bytes == 0);
    if constexpr (std::is_base_of_v<MockBackend, TestType>) {
        CHECK(backend.live_mappings() == 0);
        CHECK(backend.live_pinned_allocations() == 0);
        CHECK(backend.misuses() == 0);
    }
}

TEMPLATE_TEST_CASE(
    "mapped: the same frame makes 1 upload and 1 copy back, zeroing included, where the backend "
    "neither maps nor sets device memory",
    "[mapped][frame][zeroing]", MapBump, PackBump) {
    CopyOnlyMock backend;
    Stager<CopyOnlyMock, TestType> stager(backend);
    for (const bool partial : {false, true}) frame_step(backend, stager, partial);
    const StagerStats& stats = stager.stats();
    CHECK(stats.mapped_runs == 0);
    CHECK(stats.uploads == 2);     // one a step: the inputs and the zeroed Out together
    CHECK(stats.copy_backs == 2);  // one a step
    CHECK(stats.zeroing_calls == 0);
    CHECK(stats.zero_uploads == 0);
    CHECK(stats.host_zeroed_bytes == 2 * 4000);
    CHECK(backend.mock().calls(MockOp::copy_to_device) + backend.mock().calls(MockOp::copy_to_device_async) == 2);
    CHECK(backend.mock().calls(MockOp::copy_from_device) + backend.mock().calls(MockOp::copy_from_device_async) == 2);
    REQUIRE(stager.release().ok());
    CHECK(backend.mock().misuses() == 0);
}

TEST_CASE(
    "mapped: plain args — the small ones in the mapped mirror, the large ones copied; the device buffer holds "
    "only the large ones",
    "[mapped]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    {
        Stager<MockBackend, MapBump> stager(mock);
        std::vector<std::uint8_t> a(300, 1), b(20000, 2), state(100, 5), out(5000, 0xEE), big_out(30000, 0xEE);
        std::vector<TensorArg> args = {{a.data(), a.size(), Direction::In},
                                       {b.data(), b.size(), Direction::In},
                                       {state.data(), state.size(), Direction::InOut},
                                       {out.data(), out.size(), Direction::Out},
                                       {big_out.data(), big_out.size(), Direction::Out}};
        const std::vector<std::uint8_t> want_state = expected(args, args[2], state);
        const std::vector<std::uint8_t> want_out = expected(args, args[3], std::vector<std::uint8_t>(5000, 0));
        const std::vector<std::uint8_t> want_big = expected(args, args[4], std::vector<std::uint8_t>(30000, 0));
        auto run = stager.bind(args, stream);
        REQUIRE(run.ok());
        const std::byte* mirror = stager.strategy().mirror();
        CHECK(run->device_args()[0].data == mirror);  // mapped at its host address on the mock
        CHECK(run->device_args()[2].data == mirror + 1024);
        CHECK(run->device_args()[3].data == mirror + 2048);
        CHECK(run->device_args()[1].data == stager.strategy().base());  // the direct args start the buffer
        CHECK(stager.strategy().capacity() == 20480 + 30720);
        CHECK(stager.stats().uploads == 1);        // the large In
        CHECK(stager.stats().zeroing_calls == 1);  // the large Out, on the device
        // The kernel, on the stream; its Completion delivers the small outputs from the mirror.
        struct Job {
            std::vector<TensorArg> args;
            static void run(void* self) noexcept { kernel(static_cast<Job*>(self)->args); }
        } job{{run->device_args().begin(), run->device_args().end()}};
        std::vector<KernelAccess> accesses;
        for (const TensorArg& arg : job.args) {
            accesses.push_back({arg.data, arg.bytes, uploads(arg.direction), copies_back(arg.direction)});
        }
        REQUIRE(mock.launch_kernel(stream, &Job::run, &job, accesses).ok());
        auto done = stager.finish(std::move(*run), stream);
        REQUIRE(done.ok());
        CHECK(stager.stats().copy_backs == 1);              // the large Out
        CHECK(state == std::vector<std::uint8_t>(100, 5));  // not before the wait
        REQUIRE(done->wait().ok());
        CHECK(state == want_state);
        CHECK(out == want_out);
        CHECK(big_out == want_big);
        CHECK(stager.stats().mapped_runs == 1);
        CHECK(stager.stats().packed_args == 3);
        CHECK(stager.stats().mirror_copy_bytes == 300 + 100 + 100 + 5000);  // gathered, then unpacked
    }
    CHECK(mock.misuses() == 0);
    CHECK(mock.live_mappings() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("mapped: without the capability, MapSmall stages exactly as PackSmall", "[mapped]") {
    CopyOnlyMock mapless, packless;
    Stager<CopyOnlyMock, MapBump> mapped(mapless);
    Stager<CopyOnlyMock, PackBump> packed(packless);
    std::vector<std::uint8_t> host(40000, 3);
    const TensorArg args[] = {{host.data(), 100, Direction::In},
                              {host.data() + 1000, 20000, Direction::InOut},
                              {host.data() + 30000, 200, Direction::Out}};
    for (int step = 0; step < 3; ++step) {
        auto a = mapped.bind(args);
        auto b = packed.bind(args);
        REQUIRE((a.ok() && b.ok()));
        REQUIRE(mapped.finish(std::move(*a)).ok());
        REQUIRE(packed.finish(std::move(*b)).ok());
    }
    const auto ops = [](CopyOnlyMock& backend) {
        std::vector<MockOp> list;
        for (const MockCall& call : backend.mock().journal()) list.push_back(call.op);
        return list;
    };
    CHECK(ops(mapless) == ops(packless));
    CHECK(mapped.stats().uploads == packed.stats().uploads);
    CHECK(mapped.stats().copy_backs == packed.stats().copy_backs);
    CHECK(mapped.stats().mapped_runs == 0);
    CHECK(mapped.stats().host_maps == 0);
}

TEST_CASE("mapped: a mirror map_host refuses, or maps misaligned, is copied instead; a later mirror maps again",
          "[mapped][fallback]") {
    std::vector<std::uint8_t> host(30000, 7);
    const TensorArg small[] = {{host.data(), 100, Direction::In}, {host.data() + 100, 100, Direction::Out}};
    const TensorArg larger[] = {{host.data(), 3000, Direction::In}, {host.data() + 3000, 9000, Direction::Out}};
    SECTION("refused") {
        MockBackend mock;
        Stager<MockBackend, MapBump> stager(mock);
        mock.fail_call(MockOp::map_host, 1, Errc::not_supported);
        auto run = stager.bind(small);
        REQUIRE(run.ok());
        CHECK(stager.stats().map_failures == 1);
        CHECK(stager.stats().mapped_runs == 0);
        CHECK(stager.stats().uploads == 1);  // PackSmall's copy: the In and the zeroed Out
        kernel(run->device_args());
        REQUIRE(stager.finish(std::move(*run)).ok());
        CHECK(host[100] == 7 + 1);
        CHECK(stager.stats().copy_backs == 1);
        run = stager.bind(larger);  // the mirror grows, and maps
        REQUIRE(run.ok());
        CHECK(stager.stats().host_maps == 1);
        CHECK(stager.stats().mapped_runs == 1);
        REQUIRE(stager.finish(std::move(*run)).ok());
        CHECK(stager.stats().uploads == 1);
        CHECK(mock.misuses() == 0);
    }
    SECTION("misaligned") {
        SkewedMapMock mock;
        Stager<SkewedMapMock, MapBump> stager(mock);
        auto run = stager.bind(small);
        REQUIRE(run.ok());
        CHECK(stager.stats().map_failures == 1);
        CHECK(stager.stats().host_maps == 0);
        CHECK(mock.live_mappings() == 0);  // unmapped again
        CHECK(reinterpret_cast<std::uintptr_t>(run->device_args()[0].data) % 1024 == 0);
        kernel(run->device_args());
        REQUIRE(stager.finish(std::move(*run)).ok());
        CHECK(host[100] == 7 + 1);
        CHECK(stager.stats().copy_backs == 1);
        CHECK(mock.misuses() == 0);
    }
}

TEST_CASE(
    "mapped: a growing mirror is unmapped before it is freed, the new one mapped; its move is an address "
    "change",
    "[mapped][growth]") {
    MockBackend mock;
    Stager<MockBackend, MapBump> stager(mock);
    std::vector<std::uint8_t> host(40000, 1);
    const TensorArg small[] = {{host.data(), 100, Direction::In}};
    const TensorArg larger[] = {{host.data(), 10000, Direction::In}};
    std::vector<const void*> addresses;
    for (const auto* args : {small, larger}) {
        auto run = stager.bind(std::span<const TensorArg>(args, 1));
        REQUIRE(run.ok());
        addresses.push_back(run->device_args()[0].data);
        REQUIRE(stager.finish(std::move(*run)).ok());
    }
    CHECK(stager.stats().host_maps == 2);
    // The mock maps a mirror at its host address: the new mirror may land where the old one was
    // freed, and then the device address did not move.
    CHECK(stager.stats().address_changes == (addresses[0] != addresses[1] ? 1U : 0U));
    CHECK(stager.stats().device_mallocs == 0);
    REQUIRE(stager.release().ok());
    // Each mirror: map, then unmap before its free.
    std::vector<MockOp> order;
    for (const MockCall& call : mock.journal()) {
        if (call.op == MockOp::map_host || call.op == MockOp::unmap_host || call.op == MockOp::pinned_free) {
            order.push_back(call.op);
        }
    }
    CHECK(order == std::vector<MockOp>{MockOp::map_host, MockOp::unmap_host, MockOp::pinned_free, MockOp::map_host,
                                       MockOp::unmap_host, MockOp::pinned_free});
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("mapped: an unmap refused at release is returned; the mirror stays allocated, mapped and counted",
          "[mapped][release]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink});
    {
        Stager<MockBackend, MapBump> stager(mock);
        std::vector<std::uint8_t> host(100, 1);
        const TensorArg args[] = {{host.data(), 100, Direction::In}};
        auto run = stager.bind(args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
        const std::uint64_t mapped = stager.stats().mapped_bytes;
        const std::uint64_t mirrored = stager.stats().mirror_bytes;
        REQUIRE(mapped > 0);
        mock.fail_call(MockOp::unmap_host, 1);
        const Status released = stager.release();
        CHECK_FALSE(released.ok());
        CHECK_THAT(released.message(), Catch::Contains("unmap failed") && Catch::Contains("stays allocated"));
        CHECK(stager.stats().mapped_bytes == mapped);  // accounted for, not forgotten
        CHECK(stager.stats().mirror_bytes == mirrored);
        CHECK(mock.live_mappings() == 1);
        CHECK(mock.live_pinned_allocations() == 1);  // never freed while mapped
        REQUIRE(stager.release().ok());              // a later release tries again
        CHECK(stager.stats().mapped_bytes == 0);
        CHECK(stager.stats().mirror_bytes == 0);
    }
    CHECK(mock.live_mappings() == 0);
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("mapped: a bind that writes an input a live mapped frame's kernel reads in place is refused",
          "[mapped][frame][ordering]") {
    MockBackend mock;
    const auto stream = test::make_stream(mock);
    {
        Stager<MockBackend, MapBump> stager(mock, {}, 2);
        const TensorShape shapes[] = {{256, Direction::In}, {256, Direction::Out}};
        auto frame = stager.frame(shapes);
        REQUIRE(frame.ok());
        auto live = stager.bind(*frame, stream);  // bound, its kernel not yet run: live
        REQUIRE(live.ok());
        std::vector<std::uint8_t> in(64, 1);
        const TensorArg writes_its_input[] = {{in.data(), 64, Direction::In},
                                              {frame->host(0).data(), 64, Direction::Out}};
        auto refused = stager.bind(writes_its_input, stream);
        CHECK(refused.status().code() == Errc::busy);
        CHECK_THAT(refused.status().message(), Catch::Contains("reads in place"));
        const TensorArg reads_its_input[] = {{frame->host(0).data(), 64, Direction::In}};
        auto reading = stager.bind(reads_its_input, stream);  // two reads: no conflict
        REQUIRE(reading.ok());
        REQUIRE(stager.finish(std::move(*reading), stream).ok());
        auto done = stager.finish(std::move(*live), stream);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
    }
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE(
    "mapped: on one slot the host waits for the kernel before it rewrites the mapped mirror; on two it need "
    "not",
    "[mapped][pipeline]") {
    for (const std::size_t slots : {1u, 2u}) {
        CAPTURE(slots);
        MockBackend mock(MockConfig{.deferred_async = true});
        const auto stream = test::make_stream(mock);
        {
            Stager<MockBackend, MapBump> stager(mock, {}, slots);
            std::vector<std::vector<std::uint8_t>> ins, outs;
            for (int i = 0; i < 4; ++i) {
                ins.emplace_back(200, static_cast<std::uint8_t>(i));
                outs.emplace_back(200, 0xEE);
            }
            struct Job {
                std::vector<TensorArg> args;
                static void run(void* self) noexcept { kernel(static_cast<Job*>(self)->args); }
            };
            std::vector<Job> jobs(4);
            std::vector<Completion> pending;
            for (int step = 0; step < 4; ++step) {
                const TensorArg args[] = {{ins[step].data(), 200, Direction::In},
                                          {outs[step].data(), 200, Direction::Out}};
                auto run = stager.bind(args, stream);
                REQUIRE(run.ok());
                jobs[step].args.assign(run->device_args().begin(), run->device_args().end());
                std::vector<KernelAccess> accesses;
                for (const TensorArg& arg : jobs[step].args) {
                    accesses.push_back({arg.data, arg.bytes, uploads(arg.direction), copies_back(arg.direction)});
                }
                REQUIRE(mock.launch_kernel(stream, &Job::run, &jobs[step], accesses).ok());
                auto done = stager.finish(std::move(*run), stream);
                REQUIRE(done.ok());
                pending.push_back(std::move(*done));
                if (pending.size() > slots) pending.erase(pending.begin());  // dropped: waited for
            }
            for (Completion& done : pending) REQUIRE(done.wait().ok());
            for (int step = 0; step < 4; ++step) {
                CHECK(outs[step] == std::vector<std::uint8_t>(200, static_cast<std::uint8_t>(step + 1)));
            }
            CHECK(stager.stats().mapped_runs == 4);
            if (slots == 1) CHECK(stager.stats().host_waits >= 3);  // each rebind waited for its kernel
        }
        CHECK(mock.misuses() == 0);  // nothing rewritten while a kernel could read it
        REQUIRE(mock.destroy_stream(stream).ok());
    }
}

TEST_CASE("mapped: a synchronous backend that maps, through the synchronous adapter", "[mapped][sync]") {
    SyncMapMock backend;
    Stager<SyncMapMock, MapBump> stager(backend);
    std::vector<std::uint8_t> in(500, 9), out(500, 0xEE);
    const TensorArg args[] = {{in.data(), 500, Direction::In}, {out.data(), 500, Direction::Out}};
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    kernel(run->device_args());
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(out == std::vector<std::uint8_t>(500, 9 + 1));
    CHECK(stager.stats().mapped_runs == 1);
    CHECK(stager.stats().uploads == 0);
    CHECK(stager.stats().copy_backs == 0);
    REQUIRE(stager.release().ok());
    CHECK(backend.mock().live_mappings() == 0);
    CHECK(backend.mock().misuses() == 0);
}

TEST_CASE("mapped: reserve grows the device buffer to the whole size and maps the mirror", "[mapped][reserve]") {
    MockBackend mock;
    Stager<MockBackend, MapBump> stager(mock, {}, 2);
    REQUIRE(stager.reserve(1 << 16).ok());
    CHECK(stager.stats().host_maps == 2);
    CHECK(stager.strategy(0).capacity() >= 1 << 16);
    CHECK(stager.strategy(0).mirror_capacity() >= 1 << 16);
    const std::uint64_t mallocs = stager.stats().device_mallocs;
    std::vector<std::uint8_t> host(60000, 1);
    const TensorArg args[] = {{host.data(), 16000, Direction::In}, {host.data() + 16000, 40000, Direction::InOut}};
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(stager.stats().device_mallocs == mallocs);
    CHECK(stager.stats().address_changes == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("mapped: failing the k-th call of each operation of mapped runs leaks nothing; a refused map only copies",
          "[mapped][faults]") {
    // The kernels' state outlives each program: a failed call may leave one pending.
    struct Job {
        std::vector<TensorArg> args;
        static void run(void* self) noexcept { kernel(static_cast<Job*>(self)->args); }
    };
    std::vector<std::unique_ptr<Job>> jobs;
    const auto program = [&jobs](MockBackend& mock, Stager<MockBackend, MapBump>& stager, MockBackend::Stream stream,
                                 std::vector<std::uint8_t>& host) {
        Status first;
        for (int step = 0; step < 3 && first.ok(); ++step) {
            const TensorArg args[] = {{host.data(), 100, Direction::In},
                                      {host.data() + 100, 20000, Direction::In},
                                      {host.data() + 40000, 300, Direction::InOut},
                                      {host.data() + 41000, 64, Direction::Out}};
            auto run = stager.bind(args, stream);
            if (!run) return run.status();
            std::vector<KernelAccess> accesses;
            for (const TensorArg& arg : run->device_args()) {
                accesses.push_back({arg.data, arg.bytes, uploads(arg.direction), copies_back(arg.direction)});
            }
            jobs.push_back(std::make_unique<Job>(Job{{run->device_args().begin(), run->device_args().end()}}));
            Status launched = mock.launch_kernel(stream, &Job::run, jobs.back().get(), accesses);
            auto done = stager.finish(std::move(*run), stream, launched);
            if (!done) return done.status();
            first = done->wait();
            if (first.ok()) first = launched;
        }
        return first;
    };
    std::uint64_t calls = 0;
    {
        MockBackend probe(MockConfig{.deferred_async = true});
        const auto stream = test::make_stream(probe);
        std::vector<std::uint8_t> host(50000, 3);
        {
            Stager<MockBackend, MapBump> stager(probe);
            REQUIRE(program(probe, stager, stream, host).ok());
            REQUIRE(stager.release().ok());
        }
        calls = probe.total_calls();
        REQUIRE(probe.destroy_stream(stream).ok());
    }
    for (const bool deferred : {false, true}) {
        for (std::uint64_t k = 1; k <= calls; ++k) {
            for (std::size_t index = 0; index < mock_op_count; ++index) {
                const auto op = static_cast<MockOp>(index);
                MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = deferred});
                const auto stream = test::make_stream(mock);
                std::vector<std::uint8_t> host(50000, 3);
                {
                    Stager<MockBackend, MapBump> stager(mock);
                    stager.set_error_sink(&test::quiet_sink);
                    const std::uint64_t base = mock.calls(op);
                    mock.fail_call(op, base + k);
                    const Status outcome = program(mock, stager, stream, host);
                    const bool injected = mock.calls(op) >= base + k;
                    CAPTURE(deferred, k, to_string(op), outcome.message());
                    if (injected && op != MockOp::map_host) {
                        CHECK_FALSE(outcome.ok());
                        CHECK_THAT(outcome.message(), Catch::Contains("injected"));
                    } else {
                        CHECK(outcome.ok());  // a refused map: that mirror is copied
                    }
                    CHECK(stager.live_runs() == 0);
                    mock.clear_faults();
                    CHECK(program(mock, stager, stream, host).ok());  // a clean program next
                    CHECK(stager.release().ok());
                }
                (void)mock.synchronize();  // nothing left pending on the jobs
                jobs.clear();
                CHECK(mock.misuses() == 0);
                CHECK(mock.live_mappings() == 0);
                CHECK(mock.live_pinned_allocations() == 0);
                CHECK(mock.live_device_allocations() == 0);
                REQUIRE(mock.destroy_stream(stream).ok());
            }
        }
    }
}

// reserve() grows a mapped mirror keeping the old one until the new one exists; an unmap of the
// old one that fails is returned, the slot keeps the mirror it had (still mapped, still counted)
// and the new one is given back, so nothing the backend may still map is freed or forgotten.
TEST_CASE("mapped: an unmap refused while reserve grows the mirror is returned; the old mirror stays counted",
          "[mapped][reserve][release]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink});
    Stager<MockBackend, MapBump> stager(mock);
    stager.set_error_sink(&test::quiet_sink);
    std::vector<std::uint8_t> host(100, 1);
    const TensorArg args[] = {{host.data(), 100, Direction::In}};
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    const std::uint64_t mirror_bytes = stager.stats().mirror_bytes;
    const std::uint64_t mapped_bytes = stager.stats().mapped_bytes;
    std::byte* const mirror = stager.strategy().mirror();
    REQUIRE(mapped_bytes > 0);
    REQUIRE(mock.live_mappings() == 1);
    mock.fail_call(MockOp::unmap_host, mock.calls(MockOp::unmap_host) + 1);
    const Status reserved = stager.reserve(std::size_t{1} << 20);
    CHECK_FALSE(reserved.ok());
    CHECK_THAT(reserved.message(), Catch::Contains("unmap failed") && Catch::Contains("stays allocated"));
    CHECK(stager.strategy().mirror() == mirror);  // the slot keeps the mirror it had
    CHECK(stager.stats().mirror_bytes == mirror_bytes);
    CHECK(stager.stats().mapped_bytes == mapped_bytes);
    CHECK(mock.live_mappings() == 1);
    CHECK(mock.live_pinned_allocations() == 1);  // the new mirror went back; the old one is held
    mock.clear_faults();
    REQUIRE(stager.release().ok());
    CHECK(stager.stats().mirror_bytes == 0);
    CHECK(stager.stats().mapped_bytes == 0);
    CHECK(mock.live_mappings() == 0);
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(mock.misuses() == 0);
}
