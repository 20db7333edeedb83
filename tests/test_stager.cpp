// SPDX-License-Identifier: Apache-2.0
// Stager: the staging suite over every in-tree backend, plus what only the mock can show
// (exact backend call counts, fault injection at every call).
#include <catch2/catch.hpp>

#include <cstdint>
#include <tuple>

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
