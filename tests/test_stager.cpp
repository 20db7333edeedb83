// SPDX-License-Identifier: Apache-2.0
// Stager: the staging suite over every in-tree backend, plus what only the mock can show
// (exact backend call counts, fault injection at every call).
#include <catch2/catch.hpp>

#include <cstdint>
#include <tuple>

#include "devstage/strategy/packing.hpp"
#include "failing_new.hpp"
#include "support.hpp"

using StagingBackends = std::tuple<devstage::SimBackend, devstage::MockBackend, devstage::test::AdversarialMock>;
#include "staging_suite.hpp"

using namespace devstage;
using staging_suite::decode_like;
using staging_suite::run_once;

namespace {

// Allocations the mock still holds because an injected device_free refused to free them.
std::size_t refused_frees(const MockBackend& mock) {
    std::size_t n = 0;
    for (const MockCall& call : mock.journal()) n += call.op == MockOp::device_free && call.result != Errc::ok;
    return n;
}
}  // namespace

TEST_CASE("stager: 100 decode runs with stable shapes make no device allocation after the first", "[stager]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock);
    test::HostRun host = decode_like(21, 8);
    REQUIRE(run_once(stager, mock, host).ok());
    const std::uint64_t mallocs = mock.calls(MockOp::device_malloc);
    const std::uint64_t frees = mock.calls(MockOp::device_free);
    CHECK(mallocs == 1);
    for (int step = 0; step < 100; ++step) REQUIRE(run_once(stager, mock, host).ok());
    CHECK(mock.calls(MockOp::device_malloc) == mallocs);
    CHECK(mock.calls(MockOp::device_free) == frees);
    CHECK(stager.stats().runs == 101);
    REQUIRE(stager.release().ok());
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.misuses() == 0);
}

TEMPLATE_TEST_CASE("stager: failing the k-th backend call of a run leaks nothing and names the failure",
                   "[stager][faults]", RetainedBump<>, PerTensorMalloc<>) {
    test::HostRun host = decode_like(31);
    // Count the calls a clean run makes, then fail each of them in turn.
    std::uint64_t calls_per_run = 0;
    {
        MockBackend probe;
        Stager<MockBackend, TestType> stager(probe);
        REQUIRE(run_once(stager, probe, host).ok());
        REQUIRE(stager.release().ok());
        calls_per_run = probe.total_calls();
    }
    REQUIRE(calls_per_run > 4);
    for (std::uint64_t k = 1; k <= calls_per_run; ++k) {
        for (std::size_t op_index = 0; op_index < mock_op_count; ++op_index) {
            const auto op = static_cast<MockOp>(op_index);
            MockBackend mock(MockConfig{.sink = &test::quiet_sink});
            Stager<MockBackend, TestType> stager(mock);
            mock.fail_call(op, k);
            test::HostRun copy = host;
            copy.relink();
            const std::uint64_t before = mock.calls(op);
            Result<StagedRun> run = stager.bind(copy.args);
            Status outcome = run.ok() ? Status() : run.status();
            if (run.ok()) {
                Status kernel = test::fake_kernel(mock, run->device_args(), copy.args);
                Status finished = stager.finish(std::move(*run), kernel);
                outcome = !kernel.ok() ? kernel : finished;
            }
            const bool injected = mock.calls(op) >= k && before < k;
            CAPTURE(k, to_string(op));
            if (injected) {
                REQUIRE_FALSE(outcome.ok());
                CHECK_THAT(outcome.message(), Catch::Contains("injected"));
            } else {
                CHECK(outcome.ok());
            }
            CHECK(stager.live_runs() == 0);
            // Nothing but the retained buffer may remain (and what the backend refused to free).
            const std::size_t refused = refused_frees(mock);
            CHECK(mock.live_device_allocations() <= (stager.stats().retained_bytes > 0 ? 1u : 0u) + refused);
            mock.clear_faults();
            test::HostRun clean = host;
            clean.relink();
            REQUIRE(run_once(stager, mock, clean).ok());
            REQUIRE(stager.release().ok());
            CHECK(mock.live_device_allocations() == refused);
            CHECK(mock.misuses() == 0);
        }
    }
}

TEST_CASE("stager: pipeline slots let a second run bind while the first is live", "[stager][slots]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock, RetainedBump<>{}, 2);
    REQUIRE(stager.pipeline_slots() == 2);
    test::HostRun a = decode_like(41), b = decode_like(42);
    Result<StagedRun> first = stager.bind(a.args);
    Result<StagedRun> second = stager.bind(b.args);
    REQUIRE(first.ok());
    REQUIRE(second.ok());
    CHECK(stager.bind(a.args).status().code() == Errc::busy);
    // The two live runs never share bytes.
    const auto* base0 = static_cast<const std::byte*>(stager.strategy(0).base());
    const auto* base1 = static_cast<const std::byte*>(stager.strategy(1).base());
    const bool disjoint =
        base0 + stager.strategy(0).capacity() <= base1 || base1 + stager.strategy(1).capacity() <= base0;
    CHECK(disjoint);
    REQUIRE(stager.finish(std::move(*second)).ok());
    REQUIRE(stager.finish(std::move(*first)).ok());
    CHECK(stager.stats().regrows == 2);
    Stager<MockBackend> zero(mock, RetainedBump<>{}, 0);  // 0 slots means 1
    CHECK(zero.pipeline_slots() == 1);
}

TEMPLATE_TEST_CASE("stager: a placement or direction outside its enum is refused, nothing taken", "[stager][args]",
                   RetainedBump<>, PerTensorMalloc<>, (RetainedBump<ExactGrowth, 1024, PackSmall<>>)) {
    // A C caller can hand over any byte: the plan and the staging pass must agree on it (a
    // disagreement once read past host buffers).
    MockBackend mock;
    Stager<MockBackend, TestType> stager(mock);
    test::HostRun host = decode_like(51);
    test::HostRun bad = host;
    bad.relink();
    bad.args[1].placement = static_cast<Placement>(7);
    auto placement = stager.bind(bad.args);
    REQUIRE_FALSE(placement.ok());
    CHECK(placement.status().code() == Errc::invalid_argument);
    CHECK_THAT(placement.status().message(),
               Catch::Contains("arg 1") && Catch::Contains("placement 7") && Catch::Contains("mock"));
    bad.args[1].data = nullptr;  // a Device arg with bytes and no pointer
    bad.args[1].placement = Placement::Device;
    auto device = stager.bind(bad.args);
    REQUIRE_FALSE(device.ok());
    CHECK(device.status().code() == Errc::invalid_argument);
    CHECK_THAT(device.status().message(), Catch::Contains("arg 1") && Catch::Contains("null device pointer"));
    bad.args[1].placement = Placement::Host;
    bad.relink();
    bad.args[2].direction = static_cast<Direction>(9);  // a zero-byte arg: still refused
    auto direction = stager.bind(bad.args);
    REQUIRE_FALSE(direction.ok());
    CHECK_THAT(direction.status().message(), Catch::Contains("arg 2") && Catch::Contains("direction 9"));
    CHECK(mock.calls(MockOp::device_malloc) == 0);
    CHECK(mock.calls(MockOp::copy_to_device) == 0);
    CHECK(stager.live_runs() == 0);
    CHECK(run_once(stager, mock, host).ok());
}

TEST_CASE("stager: const inputs bind through TensorArg::in", "[stager][args]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock);
    const std::vector<std::int32_t> tokens{1, 2, 3, 4};
    std::vector<float> logits(8);
    const TensorArg args[] = {TensorArg::in(tokens.data(), tokens.size() * sizeof(std::int32_t)),
                              TensorArg::out(logits.data(), logits.size() * sizeof(float))};
    STATIC_REQUIRE(TensorArg::in(nullptr, 0).direction == Direction::In);
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    CHECK(test::read_device(mock, run->device_args()[0].data, 16) ==
          std::vector<std::byte>(reinterpret_cast<const std::byte*>(tokens.data()),
                                 reinterpret_cast<const std::byte*>(tokens.data()) + 16));
    REQUIRE(stager.finish(std::move(*run)).ok());
}

TEST_CASE("stager: release gives back the per-arg host bookkeeping too", "[stager]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock, RetainedBump<>{}, 2);
    test::HostRun host;
    for (std::uint32_t i = 0; i < 5000; ++i) host.add(8, Direction::In, i);
    CHECK(run_once(stager, mock, host).ok());
    CHECK(stager.bookkeeping_bytes() >= 5000 * (sizeof(TensorLease) + sizeof(TensorArg)));
    REQUIRE(stager.release().ok());
    CHECK(stager.bookkeeping_bytes() == 0);
    CHECK(run_once(stager, mock, host).ok());  // and grows again when needed
}

TEST_CASE("stager: bind_slot binds the slot the caller picks", "[stager][slots]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock, RetainedBump<>{}, 2);
    test::HostRun a = decode_like(61), b = decode_like(62);
    CHECK(stager.bind_slot(2, a.args).status().code() == Errc::invalid_argument);
    CHECK_THAT(stager.bind_slot(2, a.args).status().message(), Catch::Contains("slot 2 out of range"));
    for (const std::size_t slot : {1u, 0u, 1u, 0u}) {
        auto run = stager.bind_slot(slot, a.args);
        REQUIRE(run.ok());
        CHECK(run->slot() == slot);
        CHECK(run->device_args()[0].data == stager.strategy(slot).base());
        auto busy = stager.bind_slot(slot, b.args);
        CHECK(busy.status().code() == Errc::busy);
        CHECK_THAT(busy.status().message(), Catch::Contains("live run"));
        REQUIRE(test::fake_kernel(mock, run->device_args(), a.args).ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
    }
    CHECK(stager.stats().regrows == 2);  // one buffer per slot, each grown once
}

TEST_CASE("stager: reserve grows every slot ahead of time; address changes are counted", "[stager][addresses]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock, RetainedBump<>{}, 2);
    test::HostRun small = decode_like(71, 1), large = decode_like(72, 8);
    auto on_slot_0 = [&](test::HostRun& host) {
        auto run = stager.bind_slot(0, host.args);
        return run ? stager.finish(std::move(*run)) : run.status();
    };
    REQUIRE(on_slot_0(small).ok());
    CHECK(stager.stats().address_changes == 0);  // a first allocation is not a move
    REQUIRE(on_slot_0(large).ok());
    CHECK(stager.stats().address_changes == 1);  // the grow moved slot 0
    REQUIRE(stager.reserve(std::size_t{1} << 20).ok());
    CHECK(stager.strategy(0).capacity() >= std::size_t{1} << 20);
    CHECK(stager.strategy(1).capacity() >= std::size_t{1} << 20);
    CHECK(stager.stats().address_changes == 2);  // slot 0 moved again; slot 1's first allocation
    const void* base0 = stager.strategy(0).base();
    for (int i = 0; i < 5; ++i) REQUIRE(run_once(stager, mock, large).ok());  // on both slots in turn
    CHECK(stager.strategy(0).base() == base0);
    CHECK(stager.stats().address_changes == 2);  // reserved: runs up to 1 MiB never move
    auto live = stager.bind(small.args);
    REQUIRE(live.ok());
    CHECK(stager.reserve(std::size_t{2} << 20).code() == Errc::busy);
    REQUIRE(stager.finish(std::move(*live)).ok());
    REQUIRE(stager.release().ok());
    REQUIRE(run_once(stager, mock, small).ok());
    CHECK(stager.stats().address_changes == 3);  // a new base after release() counts
}

TEST_CASE("stager: a slot adopts a buffer another owner allocated, and detaches it without freeing",
          "[stager][ownership]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock, RetainedBump<>{}, 2);
    auto platform = mock.device_malloc(64 << 10);  // the platform's buffer for slot 1
    REQUIRE(platform.ok());
    REQUIRE(stager.adopt(1, *platform, 64 << 10).ok());
    CHECK(stager.strategy(1).base() == *platform);
    CHECK(stager.adopt(1, *platform, 64 << 10).code() == Errc::busy);  // the slot holds a buffer
    CHECK(stager.adopt(5, *platform, 64 << 10).code() == Errc::invalid_argument);
    test::HostRun host = decode_like(81);
    auto run = stager.bind_slot(1, host.args);
    REQUIRE(run.ok());
    CHECK(run->device_args()[0].data == *platform);
    CHECK(stager.detach(1).status().code() == Errc::busy);  // a live run uses it
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(mock.calls(MockOp::device_malloc) == 1);  // the platform's; the stager made none
    auto detached = stager.detach(1);
    REQUIRE(detached.ok());
    CHECK(detached->allocation == *platform);
    CHECK(detached->bytes == 64 << 10);
    CHECK(stager.strategy(1).capacity() == 0);
    REQUIRE(stager.release().ok());
    CHECK(mock.live_device_allocations() == 1);  // still the platform's
    REQUIRE(mock.device_free(*platform).ok());
}

TEST_CASE("stager: a bind reading state a live run will still copy back is refused, naming both args",
          "[stager][slots]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock, RetainedBump<>{}, 2);
    test::HostRun step = decode_like(91);  // arg 3 is the InOut KV cache
    auto first = stager.bind(step.args);
    REQUIRE(first.ok());
    auto second = stager.bind(step.args);
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == Errc::busy);
    CHECK_THAT(second.status().message(), Catch::Contains("arg 3") && Catch::Contains("2048 bytes") &&
                                              Catch::Contains("slot 0") && Catch::Contains("finish that run first"));
    // Disjoint host memory pipelines fine.
    test::HostRun other = decode_like(92);
    auto independent = stager.bind(other.args);
    REQUIRE(independent.ok());
    REQUIRE(stager.finish(std::move(*first)).ok());
    REQUIRE(stager.finish(std::move(*independent)).ok());
    auto after = stager.bind(step.args);  // finished: the state is current
    REQUIRE(after.ok());
    REQUIRE(stager.finish(std::move(*after)).ok());
}

TEMPLATE_TEST_CASE("stager: a host allocation failing anywhere in a run is out_of_memory, never a crash",
                   "[stager][faults]", RetainedBump<>, PerTensorMalloc<>,
                   (RetainedBump<ExactGrowth, 1024, PackSmall<>>)) {
    if (!devstage::test::failing_new_active()) {
        WARN("operator new is replaced by a tool (valgrind): no host allocation can be made to fail");
        return;
    }
    test::HostRun host = decode_like(101);
    int reached = 0;
    for (int n = 1; n < 200; ++n) {
        MockBackend mock(MockConfig{.sink = &test::quiet_sink});
        Stager<MockBackend, TestType> stager(mock, TestType{}, 2);
        stager.set_error_sink(&test::quiet_sink);
        test::HostRun copy = host;
        copy.relink();
        test::fail_nth_new(n);
        Result<StagedRun> run = stager.bind(copy.args);
        Status outcome = run.ok() ? stager.finish(std::move(*run)) : run.status();
        const bool failed_before_the_end = test::new_failure_countdown == 0;
        test::stop_failing_new();
        CAPTURE(n);
        if (!outcome.ok()) {
            CHECK(outcome.code() == Errc::out_of_memory);
            ++reached;
        }
        CHECK(stager.live_runs() == 0);
        test::HostRun clean = host;
        clean.relink();
        CHECK(run_once(stager, mock, clean).ok());  // usable afterwards
        REQUIRE(stager.release().ok());
        CHECK(mock.live_device_allocations() == 0);
        if (!failed_before_the_end) break;  // the run made fewer than n allocations: all covered
    }
    CHECK(reached > 0);
}
