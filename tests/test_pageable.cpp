// SPDX-License-Identifier: Apache-2.0
// The pageable ring (pageable.hpp) and its host threads (host_copy.hpp): large pageable args
// through pinned chunks give the same bytes as the direct path, at every chunk boundary, both
// ways, synchronously and on a stream; faults at every chunk leak nothing; the ring is reused
// from many threads' copies under TSan.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "async_support.hpp"
#include "devstage/host_copy.hpp"
#include "devstage/pageable.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "support.hpp"

using namespace devstage;

namespace {
constexpr std::size_t chunk = std::size_t{64} << 10;
const PageableRing small_ring{.threshold = 1, .chunk_bytes = chunk, .chunks = 3, .threads = 2};

test::HostRun boundary_run(std::uint32_t seed) {
    test::HostRun host;
    const std::size_t sizes[] = {0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 7};
    std::uint32_t i = 0;
    for (const std::size_t bytes : sizes) {
        for (const Direction direction : {Direction::In, Direction::InOut, Direction::Out}) {
            host.add(bytes, direction, seed + i++);
        }
    }
    return host;
}

template <class B>
std::vector<std::vector<std::byte>> direct_result(B& backend, const test::HostRun& host) {
    test::HostRun copy = host;
    copy.relink();
    Stager<B, PerTensorMalloc<>> stager(backend);
    auto run = stager.bind(copy.args);
    REQUIRE(run.ok());
    REQUIRE(test::fake_kernel(backend, run->device_args(), copy.args).ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    return copy.buffers;
}

template <class B>
Status wait_stream(B& backend, typename B::Stream stream) {
    auto event = backend.create_event();
    if (!event) return event.status();
    Status status = backend.record_event(*event, stream);
    if (status) status = backend.synchronize_event(*event);
    (void)backend.destroy_event(*event);
    return status;
}
}  // namespace

TEMPLATE_TEST_CASE("pageable ring: the same bytes as the direct path at every chunk boundary, both ways",
                   "[pageable][threads]", SimBackend, MockBackend, test::DeferredMock) {
    auto backend = test::make_backend<TestType>();
    const test::HostRun original = boundary_run(1);
    const auto expected = direct_result(*backend, original);
    SECTION("synchronous") {
        Stager<TestType> stager(*backend);
        REQUIRE(stager.set_pageable_ring(small_ring).ok());
        for (int step = 0; step < 3; ++step) {  // the ring is reused across runs
            test::HostRun host = original;
            host.relink();
            auto run = stager.bind(host.args);
            REQUIRE(run.ok());
            REQUIRE(test::fake_kernel(*backend, run->device_args(), host.args).ok());
            REQUIRE(stager.finish(std::move(*run)).ok());
            CHECK(host.buffers == expected);
        }
        CHECK(stager.stats().ring_uploads == 3 * 10);     // every non-empty In and InOut arg
        CHECK(stager.stats().ring_copy_backs == 3 * 10);  // every non-empty InOut and Out arg
        CHECK(stager.stats().ring_chunks > 3 * 20);
        CHECK(stager.stats().ring_bytes == 3 * chunk);
        REQUIRE(stager.release().ok());
        CHECK(stager.stats().ring_bytes == 0);
    }
    SECTION("on a stream") {
        Stager<TestType> stager(*backend);
        REQUIRE(stager.set_pageable_ring(small_ring).ok());
        const auto stream = test::make_stream(*backend);
        test::HostRun host = original;
        host.relink();
        auto run = stager.bind(host.args, stream);
        REQUIRE(run.ok());
        REQUIRE(wait_stream(*backend, stream).ok());
        REQUIRE(test::fake_kernel(*backend, run->device_args(), host.args).ok());
        auto done = stager.finish(std::move(*run), stream);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        CHECK(host.buffers == expected);
        REQUIRE(stager.release().ok());
        REQUIRE(backend->destroy_stream(stream).ok());
    }
    if constexpr (std::is_base_of_v<MockBackend, TestType>) CHECK(backend->misuses() == 0);
}

TEST_CASE("pageable ring: pinned memory and small args do not take it", "[pageable]") {
    SimBackend sim;
    Stager<SimBackend> stager(sim);
    REQUIRE(stager.set_pageable_ring(PageableRing{.threshold = 1024, .chunk_bytes = chunk, .chunks = 2, .threads = 0})
                .ok());
    auto pinned = sim.pinned_malloc(4 * chunk);
    REQUIRE(pinned.ok());
    std::vector<std::byte> pageable(4 * chunk), small(100);
    const TensorArg args[] = {
        {*pinned, 4 * chunk, Direction::In},                                           // the sim says pinned
        {small.data(), small.size(), Direction::In},                                   // below the threshold
        {pageable.data(), chunk, Direction::In, Placement::Host, HostMemory::pinned},  // the caller says so
        {pageable.data() + chunk, 2 * chunk, Direction::InOut},                        // pageable: the ring
    };
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    CHECK(stager.stats().ring_uploads == 1);
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(stager.stats().ring_copy_backs == 1);
    REQUIRE(stager.clear_pageable_ring().ok());
    auto plain = stager.bind(args);
    REQUIRE(plain.ok());
    CHECK(stager.stats().ring_uploads == 1);  // no ring any more
    REQUIRE(stager.finish(std::move(*plain)).ok());
    REQUIRE(sim.pinned_free(*pinned).ok());
}

TEST_CASE("pageable ring: a chunk that fails, at any chunk, fails the run and leaks nothing", "[pageable][faults]") {
    const bool deferred = GENERATE(false, true);
    CAPTURE(deferred);
    const test::HostRun original = boundary_run(7);
    for (const MockOp op : {MockOp::copy_to_device_async, MockOp::copy_from_device_async, MockOp::record_event,
                            MockOp::synchronize_event, MockOp::pinned_malloc}) {
        for (std::uint64_t k = 1; k <= 40; ++k) {
            MockBackend mock(MockConfig{.sink = &test::quiet_sink, .deferred_async = deferred});
            {
                Stager<MockBackend> stager(mock);
                stager.set_error_sink(&test::quiet_sink);
                REQUIRE(stager.set_pageable_ring(small_ring).ok());
                mock.fail_call(op, mock.calls(op) + k);
                test::HostRun host = original;
                host.relink();
                Status outcome;
                auto run = stager.bind(host.args);
                if (run.ok()) {
                    outcome = test::fake_kernel(mock, run->device_args(), host.args);
                    Status finished = stager.finish(std::move(*run), outcome);
                    if (outcome.ok()) outcome = finished;
                } else {
                    outcome = run.status();
                }
                CAPTURE(to_string(op), k);
                CHECK(stager.live_runs() == 0);
                mock.clear_faults();
                test::HostRun clean = original;
                clean.relink();
                auto again = stager.bind(clean.args);  // the ring still works
                REQUIRE(again.ok());
                REQUIRE(stager.finish(std::move(*again)).ok());
                (void)stager.release();
            }
            std::size_t refused = 0;
            for (const MockCall& call : mock.journal()) {
                refused +=
                    (call.op == MockOp::device_free || call.op == MockOp::pinned_free) && call.result != Errc::ok;
            }
            CAPTURE(to_string(op), k);
            CHECK(mock.live_device_allocations() + mock.live_pinned_allocations() <= refused);
            CHECK(mock.misuses() == 0);
        }
    }
}

TEST_CASE("pageable ring: an engine's thread pool serves several stagers", "[pageable][threads]") {
    SimBackend sim;
    HostCopyPool pool(3);
    REQUIRE(pool.threads() == 3);
    const test::HostRun original = boundary_run(11);
    const auto expected = direct_result(sim, original);
    std::vector<std::thread> runners;
    std::vector<int> failures(2, 0);
    for (int t = 0; t < 2; ++t) {
        runners.emplace_back([&, t] {
            Stager<SimBackend> stager(sim);
            if (!stager.set_pageable_ring(small_ring, &pool).ok()) ++failures[t];
            for (int step = 0; step < 4; ++step) {
                test::HostRun host = original;
                host.relink();
                auto run = stager.bind(host.args);
                if (!run || !test::fake_kernel(sim, run->device_args(), host.args) || !stager.finish(std::move(*run)) ||
                    host.buffers != expected) {
                    ++failures[t];
                }
            }
        });
    }
    for (auto& runner : runners) runner.join();
    CHECK(failures == std::vector<int>{0, 0});
}

TEST_CASE("host copy pool: copies every byte, whatever the size and the thread count", "[host_copy][threads]") {
    for (const std::size_t threads : {0u, 1u, 3u, 8u}) {
        HostCopyPool pool(threads);
        for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, HostCopyPool::min_piece - 1,
                                        HostCopyPool::min_piece * 3 + 5, std::size_t{5} << 20}) {
            CAPTURE(threads, bytes);
            const auto in = test::pattern(bytes, static_cast<std::uint32_t>(bytes + threads));
            std::vector<std::byte> out(bytes);
            pool.copy(out.data(), in.data(), bytes);
            CHECK(out == in);
        }
    }
}

TEST_CASE("host copy pool: concurrent callers take turns", "[host_copy][threads]") {
    HostCopyPool pool(2);
    std::vector<std::thread> callers;
    std::vector<int> wrong(4, 0);
    for (int t = 0; t < 4; ++t) {
        callers.emplace_back([&, t] {
            for (int i = 0; i < 20; ++i) {
                const auto in = test::pattern(std::size_t{1} << 20, static_cast<std::uint32_t>(t * 100 + i));
                std::vector<std::byte> out(in.size());
                pool.copy(out.data(), in.data(), in.size());
                wrong[t] += out != in;
            }
        });
    }
    for (auto& caller : callers) caller.join();
    CHECK(wrong == std::vector<int>{0, 0, 0, 0});
}
