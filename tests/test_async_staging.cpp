// SPDX-License-Identifier: Apache-2.0
// The stream-ordered Stager: the async staging suite over the simulator (real streams), the
// mock (work at the call) and the deferred mock (work only when the host waits, in an
// adversarial order); then what only they can show: stale data before the wait, no premature
// free, every async operation failing in turn, and a real pipeline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <tuple>
#include <vector>

#include "async_support.hpp"
#include "support.hpp"

// The batching ones stage their direct copies in batches (BatchCopyBackend): of up to 3 copies
// (several calls a direction), and up to 64 (one) with work deferred.
using AsyncStagingBackends =
    std::tuple<devstage::SimBackend, devstage::MockBackend, devstage::test::DeferredMock,
               devstage::test::BatchingSim<3>, devstage::test::BatchingMock<3>, devstage::test::BatchingMock<64, true>>;
#include "async_staging_suite.hpp"

using namespace devstage;
using namespace async_staging;

TEST_CASE("async stager: outputs are stale until the wait, and right after it", "[async][stager][deferred]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    Stager<MockBackend> stager(mock);
    test::HostRun host;
    host.add(3000, Direction::In, 1);
    host.add(2000, Direction::InOut, 2);
    host.add(1000, Direction::Out, 3);
    const auto before = host.buffers;
    const auto expected = reference(mock, host);
    Kernel<MockBackend> kernel;
    Result<Completion> done = stream_run(stager, mock, host, kernel, stream, stream);
    REQUIRE(done.ok());
    CHECK(host.buffers == before);  // nothing ran yet: a read before the wait sees stale data
    auto ready = done->ready();     // polled: "not ready" a few times, then the work runs
    while (ready.ok() && !*ready) ready = done->ready();
    REQUIRE(ready.ok());
    CHECK(host.buffers == expected);
    CHECK(done->wait().ok());
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("async stager: reusing a packed slot with a pending run waits on the host; two slots do not",
          "[async][stager][deferred][packing]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    test::HostRun a = random_run(81), b = random_run(82), c = random_run(83);
    for (test::HostRun* run : {&a, &b, &c}) {
        run->add(100, Direction::InOut, 800);
        run->relink();
    }
    {
        Stager<MockBackend, Packed> one_slot(mock);
        Kernel<MockBackend> ka, kb;
        Result<Completion> first = stream_run(one_slot, mock, a, ka, stream, stream);
        REQUIRE(first.ok());
        CHECK(one_slot.stats().host_waits == 0);
        Result<Completion> second = stream_run(one_slot, mock, b, kb, stream, stream);
        REQUIRE(second.ok());
        CHECK(one_slot.stats().host_waits == 1);  // deferred work never completes unasked
        REQUIRE(second->wait().ok());
    }
    {
        Stager<MockBackend, Packed> two_slots(mock, Packed{}, 2);
        Kernel<MockBackend> ka, kb;
        Result<Completion> first = stream_run(two_slots, mock, a, ka, stream, stream);
        Result<Completion> second = stream_run(two_slots, mock, b, kb, stream, stream);
        REQUIRE(first.ok());
        REQUIRE(second.ok());
        CHECK(two_slots.stats().host_waits == 0);
        REQUIRE(second->wait().ok());
        REQUIRE(first->wait().ok());
    }
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("async stager: a grow under pending work frees the old buffer only after it", "[async][stager][deferred]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    Stager<MockBackend> stager(mock);
    test::HostRun small = random_run(41), large = random_run(42);
    large.add(200000, Direction::InOut, 420);
    large.relink();
    Kernel<MockBackend> k1, k2;
    Result<Completion> first = stream_run(stager, mock, small, k1, stream, stream);
    REQUIRE(first.ok());
    Result<Completion> second = stream_run(stager, mock, large, k2, stream, stream);  // grows the slot
    REQUIRE(second.ok());
    CHECK(stager.stats().deferred_frees == 1);  // the old buffer waits for the first run
    REQUIRE(second->wait().ok());
    REQUIRE(first->wait().ok());
    CHECK(mock.misuses() == 0);  // no free or copy touched memory pending work used
    CHECK(stager.stats().free_failures == 0);
    REQUIRE(stager.release().ok());
    CHECK(mock.live_device_allocations() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("async stager: a copy that fails while it runs is reported by wait(), and the stager goes on",
          "[async][stager][faults]") {
    for (const MockOp op : {MockOp::copy_to_device_async, MockOp::copy_from_device_async}) {
        CAPTURE(to_string(op));
        MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = true});
        const auto stream = test::make_stream(mock);
        Stager<MockBackend> stager(mock);
        stager.set_error_sink(&test::quiet_sink);
        test::HostRun host = random_run(51);
        host.add(100, Direction::InOut, 510);
        host.relink();
        mock.fail_when_run(op, mock.calls(op) + 1, Errc::backend_failure);
        Kernel<MockBackend> kernel;
        Result<Completion> done = stream_run(stager, mock, host, kernel, stream, stream);
        REQUIRE(done.ok());  // accepted at the call
        const Status failed = done->wait();
        CHECK_FALSE(failed.ok());
        CHECK_THAT(failed.message(), Catch::Contains("injected"));
        mock.clear_failures();  // the failure is sticky on the stream until cleared
        test::HostRun again = random_run(52);
        const auto expected = reference(mock, again);
        Kernel<MockBackend> next;
        Result<Completion> clean = stream_run(stager, mock, again, next, stream, stream);
        REQUIRE(clean.ok());
        REQUIRE(clean->wait().ok());
        CHECK(again.buffers == expected);
        REQUIRE(stager.release().ok());
        CHECK(mock.live_device_allocations() == 0);
        REQUIRE(mock.destroy_stream(stream).ok());
    }
}

// wait() reports the run's own enqueued work (docs/async.md); a kernel's failure that the stream
// never sees is the caller's to check (docs/staging.md). The copy-backs still deliver exactly
// what the device holds: an InOut arg the kernel did not write comes back as uploaded, an Out
// arg as zeroed.
TEST_CASE("async stager: a kernel that fails unseen by the stream leaves wait() ok with the device's bytes delivered",
          "[async][stager][faults]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = true});
    const auto stream = test::make_stream(mock);
    Stager<MockBackend> stager(mock);
    test::HostRun host;
    host.add(3000, Direction::In, 71);
    host.add(100, Direction::InOut, 72);
    host.add(200, Direction::Out, 73);
    const auto before = host.buffers;
    // The kernel's first device write (the InOut arg's) fails: it returns before writing the Out arg.
    mock.fail_call(MockOp::copy_to_device, mock.calls(MockOp::copy_to_device) + 1);
    Kernel<MockBackend> kernel;
    Result<Completion> done = stream_run(stager, mock, host, kernel, stream, stream);
    REQUIRE(done.ok());
    CHECK(done->wait().ok());
    CHECK(kernel.status.code() == Errc::backend_failure);
    CHECK(host.buffers[0] == before[0]);
    CHECK(host.buffers[1] == before[1]);
    CHECK(host.buffers[2] == std::vector<std::byte>(200, std::byte{0}));
    CHECK(mock.misuses() == 0);
    REQUIRE(stager.release().ok());
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEMPLATE_TEST_CASE("async stager: failing the k-th call of any operation of a stream-ordered run leaks nothing",
                   "[async][stager][faults]", RetainedBump<>, PerTensorMalloc<>, Packed) {
    const bool deferred = GENERATE(false, true);
    CAPTURE(deferred);
    test::HostRun host = random_run(61);
    host.add(100, Direction::InOut, 610);
    host.add(9000, Direction::Out, 611);
    host.relink();
    // Count the calls of every operation a clean run makes, then fail each in turn.
    std::uint64_t calls = 0;
    {
        MockBackend probe(MockConfig{.deferred_async = deferred});
        const auto stream = test::make_stream(probe);
        const std::uint64_t before = probe.total_calls();
        {
            Stager<MockBackend, TestType> stager(probe);
            Kernel<MockBackend> kernel;
            test::HostRun copy = host;
            copy.relink();
            Result<Completion> done = stream_run(stager, probe, copy, kernel, stream, stream);
            REQUIRE(done.ok());
            REQUIRE(done->wait().ok());
        }
        calls = probe.total_calls() - before;
        REQUIRE(probe.destroy_stream(stream).ok());
    }
    // Finished on the bind's stream, or on another one (which then waits for the bind's).
    const bool across = GENERATE(false, true);
    CAPTURE(across);
    for (std::uint64_t k = 1; k <= calls; ++k) {
        for (std::size_t index = 0; index < mock_op_count; ++index) {
            const auto op = static_cast<MockOp>(index);
            MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = deferred});
            const auto stream = test::make_stream(mock);
            const auto other = test::make_stream(mock);
            const auto finish_on = across ? other : stream;
            Status outcome;
            {
                Stager<MockBackend, TestType> stager(mock);
                stager.set_error_sink(&test::quiet_sink);
                const std::uint64_t base = mock.calls(op);
                mock.fail_call(op, base + k);
                test::HostRun copy = host;
                copy.relink();
                Kernel<MockBackend> kernel;
                Result<Completion> done = stream_run(stager, mock, copy, kernel, stream, finish_on);
                outcome = done.ok() ? done->wait() : done.status();
                if (outcome.ok() && !kernel.status.ok()) outcome = kernel.status;
                const bool injected = mock.calls(op) >= base + k;
                CAPTURE(k, to_string(op));
                if (injected) {
                    CHECK_FALSE(outcome.ok());
                } else {
                    CHECK(outcome.ok());
                }
                CHECK(stager.live_runs() == 0);
                // Nothing was freed, rewritten or reused while enqueued work still used it.
                CHECK(mock.misuses() == 0);
                mock.clear_faults();
                test::HostRun clean = host;
                clean.relink();
                Kernel<MockBackend> next;
                Result<Completion> again = stream_run(stager, mock, clean, next, stream, finish_on);
                REQUIRE(again.ok());
                REQUIRE(again->wait().ok());
                (void)stager.release();
                CHECK(mock.misuses() == 0);
            }
            CAPTURE(k, to_string(op));
            // Nothing left but what the backend itself refused to free.
            std::size_t refused = 0;
            for (const MockCall& call : mock.journal()) {
                refused +=
                    (call.op == MockOp::device_free || call.op == MockOp::pinned_free) && call.result != Errc::ok;
            }
            CHECK(mock.live_device_allocations() + mock.live_pinned_allocations() <= refused);
            (void)mock.destroy_stream(stream);
            (void)mock.destroy_stream(other);
        }
    }
}

namespace {
// A run's host tensors moved into the backend's pinned memory: copies from and to it are truly
// asynchronous (from pageable memory the host waits for each copy, as CUDA documents).
struct PinnedRun {
    SimBackend& sim;
    test::HostRun& host;
    std::vector<void*> blocks;
    PinnedRun(SimBackend& s, test::HostRun& h) : sim(s), host(h) {
        for (std::size_t i = 0; i < host.args.size(); ++i) {
            if (host.args[i].bytes == 0) continue;
            auto block = sim.pinned_malloc(host.args[i].bytes);
            REQUIRE(block.ok());
            std::memcpy(*block, host.buffers[i].data(), host.args[i].bytes);
            host.args[i].data = *block;
            blocks.push_back(*block);
        }
    }
    // The pinned bytes, back in the run's buffers for comparison.
    std::vector<std::vector<std::byte>> result() const {
        auto out = host.buffers;
        for (std::size_t i = 0; i < host.args.size(); ++i) {
            if (host.args[i].bytes == 0) continue;
            const auto* at = static_cast<const std::byte*>(host.args[i].data);
            out[i].assign(at, at + host.args[i].bytes);
        }
        return out;
    }
    PinnedRun(const PinnedRun&) = delete;
    PinnedRun& operator=(const PinnedRun&) = delete;
    ~PinnedRun() {
        for (void* block : blocks) CHECK(sim.pinned_free(block).ok());
    }
};
}  // namespace

TEST_CASE("async stager: with two slots, run k+1 binds and uploads while run k still executes",
          "[async][stager][slots][threads]") {
    SimBackend sim;
    const auto stream = test::make_stream(sim);
    Stager<SimBackend> stager(sim, RetainedBump<>{}, 2);
    test::HostRun step0 = random_run(71), step1 = random_run(72);
    step0.add(4096, Direction::In, 710);
    step1.add(4096, Direction::In, 720);
    step0.relink();
    step1.relink();
    const auto expected0 = reference(sim, step0), expected1 = reference(sim, step1);
    PinnedRun pinned0(sim, step0), pinned1(sim, step1);
    const std::uint64_t pageable = sim.stats().pageable_async_copies;

    auto run0 = stager.bind(step0.args, stream);
    REQUIRE(run0.ok());
    test::StreamGate gate;  // run 0's "kernel" holds the stream until the test opens it
    REQUIRE(sim.launch_host_func(stream, &test::StreamGate::hold, &gate).ok());
    Kernel<SimBackend> kernel0;
    REQUIRE(kernel0.launch(sim, stream, run0->device_args(), step0.args).ok());
    auto done0 = stager.finish(std::move(*run0), stream);
    REQUIRE(done0.ok());
    gate.wait_entered();

    const std::uint64_t uploads = sim.stats().async_copies_to_device;
    auto run1 = stager.bind(step1.args, stream);  // would deadlock if it waited for run 0
    REQUIRE(run1.ok());
    CHECK(run1->slot() != 0);
    CHECK(sim.stats().async_copies_to_device > uploads);  // run 1's uploads are enqueued
    auto ready0 = done0->ready();
    REQUIRE(ready0.ok());
    CHECK_FALSE(*ready0);  // while run 0's copy-backs have not completed
    CHECK(stager.stats().host_waits == 0);
    Kernel<SimBackend> kernel1;
    REQUIRE(kernel1.launch(sim, stream, run1->device_args(), step1.args).ok());
    auto done1 = stager.finish(std::move(*run1), stream);
    REQUIRE(done1.ok());

    gate.open();
    REQUIRE(done0->wait().ok());
    REQUIRE(done1->wait().ok());
    CHECK(pinned0.result() == expected0);
    CHECK(pinned1.result() == expected1);
    CHECK(sim.stats().pageable_async_copies == pageable);  // every copy of the pipeline overlapped
    REQUIRE(stager.release().ok());
    REQUIRE(sim.destroy_stream(stream).ok());
}

TEST_CASE("async stager: a failed readiness query is ready()'s error; wait() then settles the run",
          "[async][stager][faults]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = true});
    const auto stream = test::make_stream(mock);
    Stager<MockBackend> stager(mock);
    stager.set_error_sink(&test::quiet_sink);
    test::HostRun host = random_run(71);
    host.add(700, Direction::InOut, 710);
    host.relink();
    const auto expected = reference(mock, host);
    Kernel<MockBackend> kernel;
    Result<Completion> done = stream_run(stager, mock, host, kernel, stream, stream);
    REQUIRE(done.ok());
    mock.fail_call(MockOp::event_ready, mock.calls(MockOp::event_ready) + 1);
    const Result<bool> asked = done->ready();
    REQUIRE_FALSE(asked.ok());
    CHECK_THAT(asked.status().message(), Catch::Contains("event_ready"));
    CHECK(done->pending());  // nothing settled: the work may still run
    CHECK(mock.misuses() == 0);
    REQUIRE(done->wait().ok());
    CHECK(host.buffers == expected);
    REQUIRE(stager.release().ok());
    CHECK(mock.misuses() == 0);
    CHECK(mock.live_device_allocations() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("async stager: a synchronous finish whose stream cannot be created ends the run", "[async][stager][faults]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = true});
    const auto stream = test::make_stream(mock);
    Stager<MockBackend, PerTensorMalloc<>> stager(mock);
    stager.set_error_sink(&test::quiet_sink);
    test::HostRun host = random_run(72);
    host.add(300, Direction::Out, 720);
    host.relink();
    const auto before = host.buffers;
    Result<StagedRun> run = stager.bind(host.args, stream);  // the stager's own stream is not made yet
    REQUIRE(run.ok());
    mock.fail_call(MockOp::create_stream, mock.calls(MockOp::create_stream) + 1);
    const Status finished = stager.finish(std::move(*run));
    CHECK(finished.code() == Errc::backend_failure);
    CHECK_THAT(finished.message(), Catch::Contains("creating its stream"));
    CHECK_FALSE(run->live());
    CHECK(stager.live_runs() == 0);
    CHECK(mock.live_device_allocations() == 0);  // the Free leases went back once the uploads completed
    CHECK(host.buffers == before);               // nothing copied back
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

namespace {
// The deferred mock without synchronize(): a wait on a slot's event that fails has no
// device-wide wait to fall back on.
class NoSyncMock : private MockBackend {
public:
    NoSyncMock() noexcept : MockBackend(MockConfig{.sink = &test::quiet_sink, .deferred_async = true}) {}
    using MockBackend::calls;
    using MockBackend::clear_faults;
    using MockBackend::copy_from_device;
    using MockBackend::copy_from_device_async;
    using MockBackend::copy_to_device;
    using MockBackend::copy_to_device_async;
    using MockBackend::create_event;
    using MockBackend::create_stream;
    using MockBackend::destroy_event;
    using MockBackend::destroy_stream;
    using MockBackend::device_alignment;
    using MockBackend::device_free;
    using MockBackend::device_malloc;
    using MockBackend::Event;
    using MockBackend::event_ready;
    using MockBackend::fail_from;
    using MockBackend::live_device_allocations;
    using MockBackend::misuses;
    using MockBackend::name;
    using MockBackend::pending_operations;
    using MockBackend::record_event;
    using MockBackend::Stream;
    using MockBackend::stream_wait_event;
    using MockBackend::synchronize_event;
};
static_assert(AsyncBackend<NoSyncMock> && !SynchronizingBackend<NoSyncMock>);
}  // namespace

TEMPLATE_TEST_CASE(
    "async stager: without synchronize(), memory whose work cannot be waited for is kept until a wait "
    "succeeds",
    "[async][stager][faults]", RetainedBump<>, PerTensorMalloc<>) {
    NoSyncMock mock;
    Result<NoSyncMock::Stream> stream = mock.create_stream();
    REQUIRE(stream.ok());
    {
        Stager<NoSyncMock, TestType> stager(mock);
        stager.set_error_sink(&test::quiet_sink);
        test::HostRun host = random_run(73);
        host.relink();
        Result<StagedRun> run = stager.bind(host.args, *stream);
        REQUIRE(run.ok());
        Result<Completion> done = stager.finish(std::move(*run), *stream);
        REQUIRE(done.ok());
        mock.fail_from(MockOp::synchronize_event, mock.calls(MockOp::synchronize_event) + 1);
        CHECK_FALSE(done->wait().ok());
        CHECK(mock.pending_operations() > 0);  // deferred: nothing of the run ran
        const Status kept = stager.release();
        CHECK_FALSE(kept.ok());
        CHECK_THAT(kept.message(), Catch::Contains("could not be waited for"));
        CHECK(mock.live_device_allocations() > 0);  // still used by the pending copies
        CHECK(mock.misuses() == 0);
        mock.clear_faults();
        REQUIRE(stager.release().ok());  // now the wait succeeds: everything goes back
        CHECK(mock.live_device_allocations() == 0);
        CHECK(mock.misuses() == 0);
    }
    // Destroyed while the wait fails, the stager keeps that memory and tells its error sink.
    std::vector<Status> reported;
    auto report = [&reported](const Status& status) noexcept { reported.push_back(status); };
    test::HostRun host = random_run(74);  // outlives the pending copies back
    host.relink();
    {
        Stager<NoSyncMock, TestType> stager(mock);
        stager.set_error_sink(ErrorSink::to(report));
        Result<StagedRun> run = stager.bind(host.args, *stream);
        REQUIRE(run.ok());
        Result<Completion> done = stager.finish(std::move(*run), *stream);
        REQUIRE(done.ok());
        mock.fail_from(MockOp::synchronize_event, mock.calls(MockOp::synchronize_event) + 1);
    }  // the Completion's wait fails, then the stager's
    CHECK(std::any_of(reported.begin(), reported.end(), [](const Status& status) {
        return status.message().find("could not be waited for") != std::string_view::npos;
    }));
    CHECK(mock.live_device_allocations() > 0);  // the pending copies still write into it
    CHECK(mock.misuses() == 0);
    mock.clear_faults();
    REQUIRE(mock.destroy_stream(*stream).ok());  // runs the pending copies: into live memory
    CHECK(mock.misuses() == 0);
}

TEST_CASE("async stager: order_after_uploads also orders after the bind's waits for the slot's earlier work",
          "[async][stager][deferred][streams]") {
    // Run b has nothing to upload, but its bind waited for run a's copy-back from the same
    // memory: a kernel on a third stream must come after that too, or a's output reads b's.
    MockBackend mock(MockConfig{.deferred_async = true});
    const auto first = test::make_stream(mock), second = test::make_stream(mock), compute = test::make_stream(mock);
    Stager<MockBackend> stager(mock);
    test::HostRun a, b;
    a.add(64, Direction::In, 1);
    a.add(4096, Direction::Out, 2);
    b.add(4096, Direction::Out, 3);
    const auto expected_a = reference(mock, a), expected_b = reference(mock, b);
    Kernel<MockBackend> ka, kb;
    Result<StagedRun> run_a = stager.bind(a.args, first);
    REQUIRE(run_a.ok());
    REQUIRE(ka.launch(mock, first, run_a->device_args(), a.args).ok());
    REQUIRE(wait_stream(mock, first).ok());  // a's kernel ran; its copy-back is still to come
    Result<Completion> done_a = stager.finish(std::move(*run_a), first);
    REQUIRE(done_a.ok());
    Result<StagedRun> run = stager.bind(b.args, second);
    REQUIRE(run.ok());
    REQUIRE(stager.order_after_uploads(*run, compute).ok());
    REQUIRE(kb.launch(mock, compute, run->device_args(), b.args).ok());
    Result<Completion> done_b = stager.finish(std::move(*run), compute);
    REQUIRE(done_b.ok());
    REQUIRE(done_b->wait().ok());
    REQUIRE(done_a->wait().ok());
    CHECK(devstage::test::same_bytes(a.buffers, expected_a));
    CHECK(devstage::test::same_bytes(b.buffers, expected_b));
    CHECK(mock.misuses() == 0);
    for (const auto stream : {first, second, compute}) REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("async stager: order_after_uploads with a stream the backend does not know fails and keeps the run",
          "[async][stager][streams][misuse]") {
    MockBackend mock(MockConfig{.deferred_async = true}), other;
    const auto stream = test::make_stream(mock);
    std::vector<MockBackend::Stream> foreign;
    for (int i = 0; i < 4; ++i) foreign.push_back(test::make_stream(other));  // ids the first mock never made
    Stager<MockBackend> stager(mock);
    test::HostRun host;
    host.add(3000, Direction::In, 1);
    host.add(2000, Direction::Out, 2);
    const auto expected = reference(mock, host);
    Result<StagedRun> run = stager.bind(host.args, stream);
    REQUIRE(run.ok());
    const Status refused = stager.order_after_uploads(*run, foreign.back());
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.message(),
               Catch::Contains("order_after_uploads") && Catch::Contains("slot 0") && Catch::Contains("mock"));
    CHECK(run->live());
    Kernel<MockBackend> kernel;
    REQUIRE(kernel.launch(mock, stream, run->device_args(), host.args).ok());
    Result<Completion> done = stager.finish(std::move(*run), stream);
    REQUIRE(done.ok());
    REQUIRE(done->wait().ok());
    CHECK(devstage::test::same_bytes(host.buffers, expected));
    REQUIRE(mock.destroy_stream(stream).ok());
    for (const auto s : foreign) REQUIRE(other.destroy_stream(s).ok());
}

TEST_CASE("async stager: a finish on the bind's stream waits for a kernel ordered onto another stream; 4 at most",
          "[async][stager][deferred][streams]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    std::vector<MockBackend::Stream> streams;
    for (int i = 0; i < 6; ++i) streams.push_back(test::make_stream(mock));
    Stager<MockBackend> stager(mock);
    test::HostRun host;
    host.add(3000, Direction::In, 1);
    host.add(2000, Direction::Out, 2);
    const auto expected = reference(mock, host);
    Result<StagedRun> run = stager.bind(host.args, streams[0]);
    REQUIRE(run.ok());
    for (int i = 1; i <= 4; ++i) REQUIRE(stager.order_after_uploads(*run, streams[static_cast<std::size_t>(i)]).ok());
    REQUIRE(stager.order_after_uploads(*run, streams[1]).ok());  // again: not a new one
    const Status fifth = stager.order_after_uploads(*run, streams[5]);
    CHECK(fifth.code() == Errc::invalid_argument);
    CHECK_THAT(fifth.message(), Catch::Contains("4 other streams"));
    Kernel<MockBackend> kernel;  // on stream 3; the finish is on the bind's stream
    REQUIRE(kernel.launch(mock, streams[3], run->device_args(), host.args).ok());
    Result<Completion> done = stager.finish(std::move(*run), streams[0]);
    REQUIRE(done.ok());
    REQUIRE(done->wait().ok());
    CHECK(devstage::test::same_bytes(host.buffers, expected));  // the copy-backs came after the kernel
    CHECK(mock.misuses() == 0);
    for (const auto stream : streams) REQUIRE(mock.destroy_stream(stream).ok());
}
