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

namespace {
// A destination with guard bytes on both sides. After each copy the test checks it, then
// poisons it; it checks the poison is intact before the next copy into it, so a worker that
// wrote after copy() returned, or outside the range, is caught (and, under TSan, races).
class GuardedTarget {
public:
    static constexpr std::size_t guard = 64;
    static constexpr std::byte guard_byte{0xA5};
    static constexpr std::byte poison_byte{0xEE};

    explicit GuardedTarget(std::size_t capacity)
        : storage_(capacity + 2 * guard, guard_byte), poison_(capacity + 2 * guard, poison_byte) {
        std::fill(poison_.begin(), poison_.begin() + guard, guard_byte);
        std::fill(poison_.end() - guard, poison_.end(), guard_byte);
        poison();
    }
    std::byte* data() noexcept { return storage_.data() + guard; }
    // The copy of `bytes` from `src` is in place, and nothing around it changed.
    bool holds(const std::byte* src, std::size_t bytes) const noexcept {
        return std::memcmp(storage_.data() + guard, src, bytes) == 0 &&
               std::memcmp(storage_.data(), poison_.data(), guard) == 0 &&
               std::memcmp(storage_.data() + guard + bytes, poison_.data() + guard + bytes,
                           storage_.size() - guard - bytes) == 0;
    }
    void poison() noexcept { std::memcpy(storage_.data(), poison_.data(), storage_.size()); }
    // Poisons what holds() just checked: the first `bytes` after the front guard.
    void poison(std::size_t bytes) noexcept { std::memset(data(), static_cast<int>(poison_byte), bytes); }
    bool poisoned() const noexcept { return std::memcmp(storage_.data(), poison_.data(), storage_.size()) == 0; }

private:
    std::vector<std::byte> storage_, poison_;
};

struct CopyFailures {
    int wrong = 0;    // a destination did not hold its source right after copy() returned
    int touched = 0;  // a destination changed after its copy returned
};

// `copies` back-to-back copies of differing sizes, source offsets and destinations.
CopyFailures copy_many(HostCopyPool& pool, const std::vector<std::byte>& source, std::size_t copies,
                       std::uint32_t seed) {
    constexpr std::size_t piece = HostCopyPool::min_piece;
    const std::size_t sizes[] = {2 * piece, 1, 3 * piece + 1000, piece - 1, 2 * piece + 3, 9 * piece + 17, 5 * piece};
    constexpr std::size_t max_size = 9 * piece + 17;
    std::vector<GuardedTarget> targets;
    for (int i = 0; i < 3; ++i) targets.emplace_back(max_size);
    CopyFailures failures;
    for (std::size_t i = 0; i < copies; ++i) {
        const std::size_t bytes = sizes[(i + seed) % std::size(sizes)];
        const std::byte* src = source.data() + (i * 7 + seed) % 64;
        GuardedTarget& target = targets[i % targets.size()];
        failures.touched += !target.poisoned();
        pool.copy(target.data(), src, bytes);
        failures.wrong += !target.holds(src, bytes);
        target.poison(bytes);
    }
    for (const GuardedTarget& target : targets) failures.touched += !target.poisoned();
    return failures;
}
}  // namespace

TEST_CASE("host copy pool: back-to-back copies from one and several callers write exactly their destination",
          "[host_copy][threads]") {
    const auto source = test::pattern((std::size_t{9} * HostCopyPool::min_piece) + 17 + 64, 77);
    for (const std::size_t threads : {1u, 2u, 3u, 8u}) {
        for (const std::size_t callers : {1u, 3u}) {
            CAPTURE(threads, callers);
            HostCopyPool pool(threads);
            REQUIRE(pool.threads() == threads);
            std::vector<CopyFailures> failures(callers);
            std::vector<std::thread> runners;
            for (std::size_t c = 0; c < callers; ++c) {
                runners.emplace_back(
                    [&, c] { failures[c] = copy_many(pool, source, 28, static_cast<std::uint32_t>(c)); });
            }
            for (auto& runner : runners) runner.join();
            for (const CopyFailures& failure : failures) {
                CHECK(failure.wrong == 0);
                CHECK(failure.touched == 0);
            }
        }
    }
}

TEST_CASE("host copy pool: a worker that wakes late never touches a copy that returned", "[host_copy][threads]") {
    // Copy N and, at once, copy N+1 of other buffers, thousands of times: two pieces each, so
    // most of the 8 workers are woken for a copy that the caller and one worker already did.
    // Right after each copy returns, one byte in every 64 KiB of its destination is checked
    // and poisoned (cheap, so the next copy follows at once); after each round every
    // destination must still hold its poison marks, every other byte of its copy, and its
    // guard bytes untouched.
    constexpr std::size_t bytes = 2 * HostCopyPool::min_piece;
    constexpr std::size_t mark_every = std::size_t{64} << 10;
    constexpr std::size_t targets = 4;
    HostCopyPool pool(8);
    REQUIRE(pool.threads() == 8);
    std::vector<std::vector<std::byte>> sources;
    std::vector<GuardedTarget> destinations;
    for (std::size_t t = 0; t < targets; ++t) {
        sources.push_back(test::pattern(bytes, static_cast<std::uint32_t>(t + 1)));
        destinations.emplace_back(bytes);
    }
    std::vector<std::byte> expected(bytes);
    int wrong = 0, damaged = 0;
    for (int round = 0; round < 500; ++round) {
        for (GuardedTarget& target : destinations) target.poison();
        for (std::size_t t = 0; t < targets; ++t) {
            std::byte* dst = destinations[t].data();
            pool.copy(dst, sources[t].data(), bytes);
            for (std::size_t at = 0; at < bytes; at += mark_every) {
                wrong += dst[at] != sources[t][at];
                dst[at] = GuardedTarget::poison_byte;
            }
        }
        for (std::size_t t = 0; t < targets; ++t) {
            expected = sources[t];
            for (std::size_t at = 0; at < bytes; at += mark_every) expected[at] = GuardedTarget::poison_byte;
            // A missing piece still holds poison; a late write overwrote the marks.
            damaged += !destinations[t].holds(expected.data(), bytes);
        }
    }
    CHECK(wrong == 0);
    CHECK(damaged == 0);
}

TEST_CASE("host copy pool: concurrent callers share the workers", "[host_copy][threads]") {
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
