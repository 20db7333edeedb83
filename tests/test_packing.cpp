// SPDX-License-Identifier: Apache-2.0
// Packed staging (strategy/packing.hpp): small args move with one copy each way through the
// pinned mirror, byte-identical to unpacked staging, never with more copies.
#include <catch2/catch.hpp>

#include <cstdint>
#include <tuple>
#include <vector>

#include "devstage/stager.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "fake_backends.hpp"
#include "support.hpp"

using namespace devstage;

namespace {
constexpr std::size_t limit = 4096;
using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<limit>>;

// Copies the backend made, by direction, while `step` ran.
struct Copies {
    std::uint64_t to_device = 0, from_device = 0;
};
template <class F>
Copies count_copies(MockBackend& mock, F&& step) {
    const auto up = [&] { return mock.calls(MockOp::copy_to_device) + mock.calls(MockOp::copy_to_device_async); };
    const auto down = [&] { return mock.calls(MockOp::copy_from_device) + mock.calls(MockOp::copy_from_device_async); };
    const std::uint64_t before_up = up(), before_down = down();
    step();
    return {up() - before_up, down() - before_down};
}

template <class S, class B>
Status run_once(S& stager, B& backend, test::HostRun& host) {
    Result<StagedRun> run = stager.bind(host.args);
    if (!run) return run.status();
    if (Status k = test::fake_kernel(backend, run->device_args(), host.args); !k) return k;
    return stager.finish(std::move(*run));
}

test::HostRun random_run(std::uint32_t seed) {
    std::uint32_t x = seed;
    const auto next = [&x] {
        x = x * 1664525u + 1013904223u;
        return x >> 8;
    };
    test::HostRun host;
    const std::size_t sizes[] = {0, 1, 63, 1023, 1024, limit - 1, limit, limit + 1, 9000, 70000};
    const std::size_t count = 1 + next() % 14;
    for (std::size_t i = 0; i < count; ++i) {
        host.add(sizes[next() % 10] + next() % 2, static_cast<Direction>(next() % 3), next());
    }
    return host;
}
}  // namespace

TEST_CASE("packing: small args move with one copy each way; large ones directly", "[packing]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    test::HostRun host;
    host.add(100, Direction::In, 1);
    host.add(200, Direction::In, 2);
    host.add(300, Direction::In, 3);
    host.add(50, Direction::InOut, 4);
    host.add(64, Direction::Out, 5);
    host.add(10, Direction::Out, 6);
    host.add(10000, Direction::In, 7);           // large: direct
    host.add(8000, Direction::Out, 8);           // large: direct
    REQUIRE(run_once(stager, mock, host).ok());  // first run grows

    Result<StagedRun> run = Status(Errc::busy, "unset");
    const Copies bound = count_copies(mock, [&] { run = stager.bind(host.args); });
    REQUIRE(run.ok());
    CHECK(bound.to_device == 2);  // one packed upload + the large In
    CHECK(bound.from_device == 0);
    REQUIRE(test::fake_kernel(mock, run->device_args(), host.args).ok());
    const Copies finished = count_copies(mock, [&] { REQUIRE(stager.finish(std::move(*run)).ok()); });
    CHECK(finished.to_device == 0);
    CHECK(finished.from_device == 2);  // one packed copy-back + the large Out
    CHECK(stager.stats().packed_args == 2 * 6);
    CHECK(stager.stats().uploads == 2 * 2);
    CHECK(stager.stats().copy_backs == 2 * 2);
    // In 3 x 1024, InOut 1024, Out 2 x 1024 packed; then 10240 + 8192 direct.
    CHECK(stager.strategy().mirror_capacity() == 6144);
    CHECK(stager.strategy().capacity() == 6144 + 10240 + 8192);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("packing: packed, unpacked and per-tensor runs are byte-identical", "[packing][equivalence]") {
    const std::uint32_t seed = GENERATE(range(1u, 25u));
    CAPTURE(seed);
    MockBackend mock;
    Stager<MockBackend, Packed> packed(mock);
    Stager<MockBackend> unpacked(mock);
    Stager<MockBackend, PerTensorMalloc<>> reference(mock);
    test::HostRun a = random_run(seed);
    test::HostRun b = a, c = a;
    b.relink();
    c.relink();
    REQUIRE(run_once(packed, mock, a).ok());
    REQUIRE(run_once(unpacked, mock, b).ok());
    REQUIRE(run_once(reference, mock, c).ok());
    CHECK(a.buffers == b.buffers);
    CHECK(a.buffers == c.buffers);
    // Packing never makes more copies than one per arg.
    CHECK(packed.stats().uploads <= unpacked.stats().uploads);
    CHECK(packed.stats().copy_backs <= unpacked.stats().copy_backs);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("packing: the limit is inclusive", "[packing]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    test::HostRun host;
    host.add(limit - 1, Direction::In, 1);
    host.add(limit, Direction::In, 2);
    host.add(limit + 1, Direction::In, 3);
    Result<StagedRun> run = Status(Errc::busy, "unset");
    const Copies bound = count_copies(mock, [&] { run = stager.bind(host.args); });
    REQUIRE(run.ok());
    CHECK(stager.stats().packed_args == 2);
    CHECK(bound.to_device == 2);  // the two packed ones together, Limit + 1 alone
    // The packed args lead the buffer, the direct one follows them.
    const auto* base = static_cast<const std::byte*>(stager.strategy().base());
    CHECK(run->device_args()[0].data == base);
    CHECK(run->device_args()[1].data == base + 4096);
    CHECK(run->device_args()[2].data == base + 8192);
    REQUIRE(stager.finish(std::move(*run)).ok());
}

TEST_CASE("packing: a direction with nothing to move makes no copy", "[packing]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    test::HostRun outputs_only;
    outputs_only.add(100, Direction::Out, 1);
    outputs_only.add(200, Direction::Out, 2);
    const Copies out_bind = count_copies(mock, [&] {
        auto run = stager.bind(outputs_only.args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
    });
    CHECK(out_bind.to_device == 0);
    CHECK(out_bind.from_device == 1);
    test::HostRun inputs_only;
    inputs_only.add(100, Direction::In, 3);
    const Copies in_bind = count_copies(mock, [&] {
        auto run = stager.bind(inputs_only.args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
    });
    CHECK(in_bind.to_device == 1);
    CHECK(in_bind.from_device == 0);
}

TEST_CASE("packing: a failed execution copies nothing back, packed or not", "[packing]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    test::HostRun host;
    host.add(100, Direction::InOut, 1);
    host.add(300, Direction::Out, 2);
    host.add(9000, Direction::Out, 3);
    const auto before = host.buffers;
    auto run = stager.bind(host.args);
    REQUIRE(run.ok());
    REQUIRE(test::fake_kernel(mock, run->device_args(), host.args).ok());
    const Copies finished = count_copies(
        mock, [&] { REQUIRE(stager.finish(std::move(*run), Status(Errc::backend_failure, "kernel failed")).ok()); });
    CHECK(finished.from_device == 0);
    CHECK(host.buffers == before);
    CHECK(stager.stats().copy_backs_skipped == 3);
}

TEST_CASE("packing: the mirror grows with the buffer, never shrinks, and is released with it", "[packing]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock, Packed{}, 2);
    test::HostRun small, larger;
    small.add(100, Direction::In, 1);
    for (std::uint32_t i = 0; i < 6; ++i) larger.add(3000, Direction::InOut, 10 + i);
    auto on_slot_0 = [&](test::HostRun& host) {
        auto run = stager.bind_slot(0, host.args);
        return run ? stager.finish(std::move(*run)) : run.status();
    };
    REQUIRE(on_slot_0(small).ok());
    const std::uint64_t first = stager.stats().mirror_bytes;
    CHECK(first == 1024);
    REQUIRE(on_slot_0(larger).ok());
    CHECK(stager.stats().mirror_bytes > first);
    const std::size_t grown = stager.strategy().mirror_capacity();
    CHECK(grown == 6 * 3072);
    REQUIRE(on_slot_0(small).ok());
    CHECK(stager.strategy().mirror_capacity() == grown);
    CHECK(mock.live_pinned_allocations() == 1);
    // Each pipeline slot has its own mirror (slot 1, used least recently, is taken first).
    auto b = stager.bind(larger.args);
    auto a = stager.bind(small.args);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(stager.strategy(0).mirror() != stager.strategy(1).mirror());
    CHECK(mock.live_pinned_allocations() == 2);
    REQUIRE(stager.finish(std::move(*a)).ok());
    REQUIRE(stager.finish(std::move(*b)).ok());
    REQUIRE(stager.release().ok());
    CHECK(stager.stats().mirror_bytes == 0);
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(mock.live_device_allocations() == 0);
}

TEST_CASE("packing: the packed mirror is really pinned on the simulator: nothing bounces", "[packing]") {
    SimBackend sim;
    Stager<SimBackend, Packed> stager(sim);
    test::HostRun host;  // pageable host memory, but small: packed through the pinned mirror
    host.add(1000, Direction::In, 1);
    host.add(2000, Direction::InOut, 2);
    host.add(500, Direction::Out, 3);
    REQUIRE(run_once(stager, sim, host).ok());
    const std::uint64_t bounced = sim.stats().bounced_bytes;  // the kernel's own copies bounce
    auto run = stager.bind(host.args);
    REQUIRE(run.ok());
    CHECK(sim.stats().bounced_bytes == bounced);
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(sim.stats().bounced_bytes == bounced);
}

// The pack limit is a run-time option: a stager of the default RetainedBump given one stages
// exactly as one whose PackSmall policy names it (the same copies, byte-identical results).
TEST_CASE("packing: a pack limit chosen at run time stages as PackSmall<limit>", "[packing][options]") {
    MockBackend mock;
    Stager<MockBackend, Packed> fixed(mock);
    Stager<MockBackend> chosen(mock, {}, StagerOptions{.pack_limit = limit});
    CHECK(chosen.pack_limit() == limit);
    CHECK(fixed.pack_limit() == limit);
    for (std::uint32_t seed = 1; seed <= 24; ++seed) {
        CAPTURE(seed);
        test::HostRun a = random_run(seed), b = random_run(seed);
        Status first, second;
        const Copies fixed_copies = count_copies(mock, [&] { first = run_once(fixed, mock, a); });
        const Copies chosen_copies = count_copies(mock, [&] { second = run_once(chosen, mock, b); });
        REQUIRE(first.ok());
        REQUIRE(second.ok());
        CHECK(fixed_copies.to_device == chosen_copies.to_device);
        CHECK(fixed_copies.from_device == chosen_copies.from_device);
        CHECK(test::same_bytes(a.buffers, b.buffers));
    }
    CHECK(fixed.stats().packed_args == chosen.stats().packed_args);
    CHECK(fixed.stats().mirror_copy_bytes == chosen.stats().mirror_copy_bytes);
    Stager<MockBackend, Packed> unpacked(mock, {}, StagerOptions{.pack_limit = 0});  // the policy's default, overridden
    test::HostRun host = random_run(3);
    REQUIRE(run_once(unpacked, mock, host).ok());
    CHECK(unpacked.stats().packed_args == 0);
    CHECK(unpacked.stats().mirror_bytes == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("packing: options a stager cannot honour leave it broken, saying why", "[packing][options]") {
    MockBackend mock;
    Stager<MockBackend, PerTensorMalloc<>> per_tensor(mock, {}, StagerOptions{.pack_limit = 4096});
    CHECK(per_tensor.status().code() == Errc::not_supported);
    CHECK_THAT(per_tensor.status().message(),
               Catch::Contains("pack limit 4096 needs a strategy with a pinned mirror") && Catch::Contains("mock"));
    test::HostRun host = random_run(5);
    CHECK(per_tensor.bind(host.args).status().code() == Errc::not_supported);
    Stager<MockBackend> map_only(mock, {}, StagerOptions{.map_small = true});
    CHECK(map_only.status().code() == Errc::invalid_argument);
    CHECK_THAT(map_only.status().message(), Catch::Contains("map_small needs a pack limit above 0"));
    Stager<MockBackend> too_many(mock, {}, StagerOptions{.pipeline_slots = 300});
    CHECK_THAT(too_many.status().message(), Catch::Contains("300 pipeline slots asked for; at most 256"));
    test::FakeBackend<test::Missing::pinned_malloc> fake;
    Stager<decltype(fake)> unpinned(fake, {}, StagerOptions{.pack_limit = 4096});
    CHECK(unpinned.status().code() == Errc::not_supported);
    CHECK_THAT(unpinned.status().message(), Catch::Contains("needs pinned host memory"));
    Stager<decltype(fake)> plain(fake);  // packing is not asked for: the stager is fine
    CHECK(plain.status().ok());
}
