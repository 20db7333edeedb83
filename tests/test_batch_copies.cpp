// SPDX-License-Identifier: Apache-2.0
// Batched copies (BatchCopyBackend): the concept, how the Stager uses it — one batch call per
// direction per run for the copies packing leaves, results equal to the per-copy path byte for
// byte, the counters — and batches that fail at the call or when they run, on the mock and the
// simulator.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "async_support.hpp"
#include "devstage/devstage.hpp"
#include "support.hpp"

using namespace devstage;

namespace {

// A backend whose copy-back batch is deleted: not a BatchCopyBackend.
struct NoBatchBack : MockBackend {
    Status copy_from_device_batch(void* const*, const void* const*, const std::size_t*, std::size_t,
                                  Stream) noexcept = delete;
};
// One whose limit is not noexcept.
struct ThrowingLimit : MockBackend {
    std::size_t batch_copy_limit(Stream /*stream*/) const { return 8; }
};

static_assert(BatchCopyBackend<MockBackend>);
static_assert(BatchCopyBackend<SimBackend>);
static_assert(!BatchCopyBackend<SynchronousAdapter<MockBackend>>);
static_assert(AsyncBackend<NoBatchBack> && !BatchCopyBackend<NoBatchBack>);
static_assert(backend_requires::copy_to_device_batch<NoBatchBack>);
static_assert(!backend_requires::copy_from_device_batch<NoBatchBack>);
static_assert(!backend_requires::batch_copy_limit<ThrowingLimit> && !BatchCopyBackend<ThrowingLimit>);

// Binds, runs the stand-in kernel and finishes, synchronously; the host buffers after it.
template <class B, class Strategy = RetainedBump<>>
std::vector<std::vector<std::byte>> staged(B& backend, Stager<B, Strategy>& stager, test::HostRun host) {
    host.relink();
    Result<StagedRun> run = stager.bind(host.args);
    REQUIRE(run.ok());
    REQUIRE(test::fake_kernel(backend, run->device_args(), host.args).ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    return host.buffers;
}

// The reference: the same run on a mock without batches.
template <class Strategy = RetainedBump<>>
std::vector<std::vector<std::byte>> per_copy(const test::HostRun& host) {
    MockBackend mock;
    Stager<MockBackend, Strategy> stager(mock);
    auto result = staged(mock, stager, host);
    CHECK(stager.stats().batched_copies == 0);
    return result;
}

}  // namespace

TEST_CASE("batches: a run's direct copies go in one call each way, with the per-copy results", "[batch][stager]") {
    const test::HostRun host = test::decode_like_run();
    test::BatchingMock<64> mock;
    Stager<test::BatchingMock<64>> stager(mock);
    for (int round = 0; round < 3; ++round) {
        mock.clear_journal();
        CHECK(test::same_bytes(staged(mock, stager, host), per_copy(host)));
        CHECK(mock.calls(MockOp::copy_to_device_async) == 0);
        CHECK(mock.calls(MockOp::copy_from_device_async) == 0);
    }
    CHECK(mock.calls(MockOp::copy_to_device_batch) == 3);
    CHECK(mock.calls(MockOp::copy_from_device_batch) == 3);
    const StagerStats& stats = stager.stats();
    CHECK(stats.uploads == 3);  // a batch counts once
    CHECK(stats.copy_backs == 3);
    CHECK(stats.batched_uploads == 3);
    CHECK(stats.batched_copy_backs == 3);
    CHECK(stats.batched_copies == 3 * (5 + 2));
    CHECK(stats.uploads_skipped == 3);      // the Out arg
    CHECK(stats.copy_backs_skipped == 12);  // the four In args
    CHECK(stats.bytes_to_device == 3 * (40000 + 2048 + 128 + 64 + 3000));
    CHECK(stats.bytes_from_device == 3 * (3000 + 40000));
    // The journal names each batch once, with the bytes of all its copies.
    const std::vector<MockCall>& journal = mock.journal();
    std::size_t batches = 0;
    for (const MockCall& call : journal) {
        if (call.op == MockOp::copy_to_device_batch) {
            ++batches;
            CHECK(call.bytes == 40000 + 2048 + 128 + 64 + 3000);
            CHECK(call.result == Errc::ok);
            CHECK(call.stream != 0);
        }
    }
    CHECK(batches == 1);
    REQUIRE(stager.release().ok());
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("batches: every strategy, stream-ordered too, equals the per-copy path", "[batch][stager][async]") {
    const test::HostRun host = test::decode_like_run();
    using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<4096>>;
    SECTION("per-tensor allocations") {
        test::BatchingMock<64> mock;
        Stager<test::BatchingMock<64>, PerTensorMalloc<>> stager(mock);
        CHECK(test::same_bytes(staged(mock, stager, host), per_copy<PerTensorMalloc<>>(host)));
        CHECK(stager.stats().batched_uploads == 1);
        CHECK(stager.stats().batched_copy_backs == 1);
        CHECK(mock.live_device_allocations() == 0);
    }
    SECTION("packing: the packed copy stays one call, the args above the limit go in a batch") {
        test::HostRun two_large = host;
        two_large.add(50000, Direction::InOut, 7);
        test::BatchingMock<64> mock;
        Stager<test::BatchingMock<64>, Packed> stager(mock);
        CHECK(test::same_bytes(staged(mock, stager, two_large), per_copy<Packed>(two_large)));
        const StagerStats& stats = stager.stats();
        CHECK(stats.batched_uploads == 1);  // the 40000- and 50000-byte In/InOut args
        CHECK(stats.batched_copies == 2 + 2);
        CHECK(stats.uploads == 2);     // the packed copy, the batch
        CHECK(stats.copy_backs == 2);  // the packed copy, the batch of the Out and the large InOut
        CHECK(stats.packed_args == 4);
    }
    SECTION("a lone direct copy is a plain one") {
        test::BatchingMock<64> mock;
        Stager<test::BatchingMock<64>, Packed> stager(mock);
        CHECK(test::same_bytes(staged(mock, stager, host), per_copy<Packed>(host)));
        CHECK(stager.stats().batched_uploads == 0);  // only the 40000-byte In is direct
        CHECK(stager.stats().batched_copy_backs == 0);
        CHECK(mock.calls(MockOp::copy_to_device_batch) == 0);
    }
    SECTION("a limit splits the copies into several batches") {
        test::BatchingMock<2> mock;
        Stager<test::BatchingMock<2>> stager(mock);
        CHECK(test::same_bytes(staged(mock, stager, host), per_copy(host)));
        CHECK(stager.stats().batched_uploads == 3);  // 5 copies: 2 + 2 + 1, the last a batch of one
        CHECK(stager.stats().uploads == 3);
        CHECK(stager.stats().batched_copy_backs == 1);
        CHECK(stager.stats().batched_copies == 5 + 2);
    }
    SECTION("stream-ordered, on the caller's stream") {
        test::BatchingMock<64, true> mock;
        const auto stream = test::make_stream(mock);
        Stager<test::BatchingMock<64, true>> stager(mock);
        test::HostRun run = host;
        run.relink();
        Result<StagedRun> bound = stager.bind(run.args, stream);
        REQUIRE(bound.ok());
        REQUIRE(mock.synchronize().ok());
        REQUIRE(test::fake_kernel(mock, bound->device_args(), run.args).ok());
        Result<Completion> done = stager.finish(std::move(*bound), stream);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        CHECK(test::same_bytes(run.buffers, per_copy(host)));
        CHECK(stager.stats().async_uploads == 1);
        CHECK(stager.stats().async_copy_backs == 1);
        CHECK(mock.destroy_stream(stream).ok());
    }
    SECTION("without batches (limit 0) the copies are made one by one") {
        MockBackend mock;
        Stager<MockBackend> stager(mock);
        (void)staged(mock, stager, host);
        CHECK(mock.calls(MockOp::copy_to_device_async) == 5);
        CHECK(mock.calls(MockOp::copy_to_device_batch) == 0);
        CHECK(stager.stats().uploads == 5);
    }
}

TEST_CASE("batches: a batch that fails at the call fails the run; nothing leaks, the stager goes on",
          "[batch][stager][failure]") {
    const test::HostRun host = test::decode_like_run();
    const auto expected = per_copy(host);
    test::BatchingMock<64> mock;
    Stager<test::BatchingMock<64>> stager(mock);
    SECTION("the upload batch, after half of its copies were enqueued") {
        mock.fail_call(MockOp::copy_to_device_batch, 1);
        test::HostRun run = host;
        run.relink();
        Result<StagedRun> bound = stager.bind(run.args);
        REQUIRE_FALSE(bound.ok());
        CHECK(bound.status().code() == Errc::backend_failure);
        const std::string message = bound.status().message();
        CHECK(message.find("a batch of 5 copies") != std::string::npos);
        CHECK(message.find("mock") != std::string::npos);
        CHECK(stager.live_runs() == 0);
        CHECK(stager.stats().batched_uploads == 0);
    }
    SECTION("the copy-back batch") {
        mock.fail_call(MockOp::copy_from_device_batch, 1);
        test::HostRun run = host;
        run.relink();
        Result<StagedRun> bound = stager.bind(run.args);
        REQUIRE(bound.ok());
        const Status finished = stager.finish(std::move(*bound));
        CHECK(finished.code() == Errc::backend_failure);
        CHECK(finished.message().find("finish: copy back: a batch of 2 copies") != std::string::npos);
        CHECK(stager.stats().copy_backs == 0);
        CHECK(stager.stats().copy_backs_skipped == 4);  // the In args; the two failed ones are not skipped
    }
    SECTION("a copy of the batch the backend refuses (outside every allocation)") {
        test::HostRun run = host;
        run.relink();
        Result<StagedRun> bound = stager.bind(run.args);
        REQUIRE(bound.ok());
        std::vector<std::byte> back(16);
        void* const dsts[] = {back.data(), back.data()};
        const void* const srcs[] = {bound->device_args()[0].data, &back};
        const std::size_t sizes[] = {16, 16};
        const Stream stream = test::make_stream(mock);
        const Status refused = mock.copy_from_device_batch(dsts, srcs, sizes, 2, stream);
        CHECK(refused.code() == Errc::invalid_argument);
        CHECK(refused.message().find("copy 1 of a batch of 2") != std::string::npos);
        CHECK(mock.misuses() == 1);
        CHECK(mock.destroy_stream(stream).ok());
        REQUIRE(test::fake_kernel(mock, bound->device_args(), run.args).ok());
        REQUIRE(stager.finish(std::move(*bound)).ok());
        CHECK(test::same_bytes(run.buffers, expected));
        return;
    }
    mock.clear_faults();
    CHECK(test::same_bytes(staged(mock, stager, host), expected));
    REQUIRE(stager.release().ok());
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("batches: a batch that fails when it runs fails the run; the stager goes on",
          "[batch][stager][failure][async]") {
    const test::HostRun host = test::decode_like_run();
    const auto expected = per_copy(host);
    const bool uploads = GENERATE(true, false);
    CAPTURE(uploads);
    test::BatchingMock<64, true> mock;
    const auto stream = test::make_stream(mock);
    {
        Stager<test::BatchingMock<64, true>> stager(mock);
        mock.fail_when_run(uploads ? MockOp::copy_to_device_batch : MockOp::copy_from_device_batch, 1);
        test::HostRun run = host;
        run.relink();
        Result<StagedRun> bound = stager.bind(run.args, stream);
        REQUIRE(bound.ok());
        Result<Completion> done = stager.finish(std::move(*bound), stream);
        REQUIRE(done.ok());
        const Status waited = done->wait();
        CHECK(waited.code() == Errc::backend_failure);
        CHECK(waited.message().find(uploads ? "copy_to_device_batch" : "copy_from_device_batch") != std::string::npos);
        mock.clear_failures();
        CHECK(test::same_bytes(staged(mock, stager, host), expected));
        REQUIRE(stager.release().ok());
    }
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.misuses() == 0);
    CHECK(mock.destroy_stream(stream).ok());
}

TEST_CASE("batches: the simulator charges one per-call latency per batch", "[batch][sim]") {
    const test::HostRun host = test::decode_like_run();
    const auto modeled = [&](std::size_t limit) {
        SimBackend sim(SimConfig{.batch_copy_limit = limit});
        Stager<SimBackend> stager(sim);
        stager.set_output_policy(OutputPolicy::kernel_writes_all);
        test::HostRun run = host;
        run.relink();
        const std::uint64_t before = sim.stats().modeled_ns;
        Result<StagedRun> bound = stager.bind(run.args);
        REQUIRE(bound.ok());
        REQUIRE(stager.finish(std::move(*bound)).ok());
        return std::pair{sim.stats().modeled_ns - before, sim.stats().batches};
    };
    const auto [one_by_one, no_batches] = modeled(0);
    const auto [batched, batches] = modeled(64);
    CHECK(no_batches == 0);
    CHECK(batches == 2);
    // 5 uploads and 2 copy-backs became one call each way: 4 + 1 latencies fewer (pageable
    // memory: the pageable cost's latency).
    const std::uint64_t latency = SimLinkModel::h200().to_device_pageable.latency_ns;
    CHECK(one_by_one - batched == 5 * latency);
}
