// SPDX-License-Identifier: Apache-2.0
// Growth policies, alone and driving RetainedBump through a prefill sweep.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/growth.hpp"
#include "support.hpp"

using namespace devstage;

namespace {
// A prefill sweep: one run per sequence length from 128 to 8192 tokens, each staging an
// activation of tokens × 5120 bf16 values. Returns the stager's regrows.
template <class Growth>
std::uint64_t prefill_regrows(Growth growth = {}) {
    MockBackend mock(MockConfig{.journal = false});
    Stager<MockBackend, RetainedBump<Growth>> stager(mock, RetainedBump<Growth>(growth));
    std::vector<std::byte> host(8192 * 5120 * 2);
    for (std::size_t tokens = 128; tokens <= 8192; tokens += 128) {
        const TensorArg args[] = {{host.data(), tokens * 5120 * 2, Direction::In}};
        auto run = stager.bind(args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
    }
    return stager.stats().regrows;
}
}  // namespace

TEST_CASE("growth: a prefill sweep regrows every step with ExactGrowth, O(log) with GeometricGrowth", "[growth]") {
    const std::uint64_t exact = prefill_regrows<ExactGrowth>();
    const std::uint64_t geometric = prefill_regrows<GeometricGrowth<3, 2>>();
    CHECK(exact == 64);  // 128 → 8192 in steps of 128: every run is larger
    const auto bound = static_cast<std::uint64_t>(std::ceil(std::log(8192.0 / 128.0) / std::log(1.5)));
    CHECK(geometric <= bound + 1);  // +1: the first allocation
    CHECK(geometric < exact);
}

TEST_CASE("growth: policies compute their next capacity", "[growth]") {
    CHECK(*ExactGrowth{}.next_capacity(100, 150) == 150);
    CHECK(*GeometricGrowth<3, 2>{}.next_capacity(1000, 1100) == 1500);
    CHECK(*GeometricGrowth<3, 2>{}.next_capacity(1000, 4000) == 4000);
    // A product past std::size_t is refused naming the sizes, not saturated to SIZE_MAX.
    const auto huge = GeometricGrowth<2, 1>{}.next_capacity(static_cast<std::size_t>(-1) / 2 + 7, 10);
    REQUIRE_FALSE(huge.ok());
    CHECK(huge.status().code() == Errc::out_of_memory);
    CHECK_THAT(huge.status().message(),
               Catch::Contains("9223372036854775814 bytes x 2/1") && Catch::Contains("plan requires 10 bytes"));
    // Exact where a naive current * Num / Den would wrap: 3/2 of 2^63 fits in 64 bits.
    constexpr std::size_t half = std::size_t{1} << 63;
    CHECK(*GeometricGrowth<3, 2>{}.next_capacity(half, 10) == half + half / 2);
    CHECK(*GeometricGrowth<3, 2>{}.next_capacity(1001, 10) == 1501);
    CHECK(*GranularGrowth<2 << 20>{}.next_capacity(0, 1) == 2 << 20);
    CHECK(*GranularGrowth<2 << 20>{}.next_capacity(0, (2 << 20) + 1) == 4 << 20);
    CHECK(GranularGrowth<4096>{}.next_capacity(0, static_cast<std::size_t>(-5)).status().code() ==
          Errc::invalid_argument);
}

TEST_CASE("growth: CappedGrowth fails fast naming required and cap, and clamps", "[growth]") {
    const CappedGrowth<GeometricGrowth<2, 1>> capped(1 << 20);
    CHECK(*capped.next_capacity(600 << 10, 700 << 10) == 1 << 20);  // 1.2 MiB clamped to the cap
    auto over = capped.next_capacity(0, (1 << 20) + 1);
    REQUIRE_FALSE(over.ok());
    CHECK(over.status().code() == Errc::out_of_memory);
    CHECK_THAT(over.status().message(), Catch::Contains("required 1048577 bytes, cap 1048576"));

    MockBackend mock;
    Stager<MockBackend, RetainedBump<CappedGrowth<>>> stager(mock, RetainedBump<CappedGrowth<>>(CappedGrowth<>(4096)));
    std::vector<std::byte> host(8192);
    const TensorArg big[] = {{host.data(), 8192, Direction::In}};
    auto run = stager.bind(big);
    REQUIRE_FALSE(run.ok());
    CHECK_THAT(run.status().message(), Catch::Contains("cap 4096"));
    CHECK(mock.calls(MockOp::device_malloc) == 0);  // failed before any allocation
    CHECK(mock.calls(MockOp::copy_to_device_async) == 0);
    const TensorArg small[] = {{host.data(), 100, Direction::In}};
    auto ok = stager.bind(small);
    REQUIRE(ok.ok());
    REQUIRE(stager.finish(std::move(*ok)).ok());
}

namespace {
Result<StagedRun> bind_bytes(Stager<MockBackend>& stager, std::vector<std::byte>& host, std::size_t bytes) {
    const TensorArg args[] = {{host.data(), bytes, Direction::In}};
    return stager.bind(args);
}

// One complete run of `bytes`, so the stager holds a retained buffer of that size.
void run_bytes(Stager<MockBackend>& stager, std::vector<std::byte>& host, std::size_t bytes) {
    auto run = bind_bytes(stager, host, bytes);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
}
}  // namespace

TEST_CASE("growth: a grow allocates the new buffer before freeing the old one when memory allows",
          "[growth][transactional]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock);
    std::vector<std::byte> host(8192);
    run_bytes(stager, host, 1024);
    mock.clear_journal();
    auto second = bind_bytes(stager, host, 8192);
    REQUIRE(second.ok());
    const auto journal = mock.journal();
    REQUIRE(journal.size() >= 2);
    CHECK(journal[0].op == MockOp::device_malloc);
    CHECK(journal[1].op == MockOp::device_free);
    CHECK(stager.stats().grows_allocate_first == 1);
    CHECK(stager.stats().grows_free_first == 0);
    REQUIRE(stager.finish(std::move(*second)).ok());
}

TEST_CASE("growth: when both buffers do not fit, the old one is freed first and the grow retried",
          "[growth][transactional]") {
    MockBackend mock(MockConfig{.device_capacity = 10000});
    Stager<MockBackend> stager(mock);
    std::vector<std::byte> host(8192);
    run_bytes(stager, host, 3000);                 // 3072 held
    auto second = bind_bytes(stager, host, 8192);  // 8192 does not fit beside it
    REQUIRE(second.ok());
    CHECK(stager.stats().grows_free_first == 1);
    CHECK(stager.stats().grows_allocate_first == 0);
    CHECK(stager.stats().regrows == 2);
    REQUIRE(stager.finish(std::move(*second)).ok());
    CHECK(mock.live_device_allocations() == 1);
}

TEST_CASE("growth: fault injection on either grow attempt", "[growth][transactional]") {
    MockBackend mock;
    Stager<MockBackend> stager(mock);
    std::vector<std::byte> host(8192);
    run_bytes(stager, host, 1024);

    SECTION("the first attempt fails: free first, retry succeeds") {
        mock.fail_call(MockOp::device_malloc, 2, Errc::out_of_memory);
        auto grown = bind_bytes(stager, host, 4096);
        REQUIRE(grown.ok());
        CHECK(stager.stats().grows_free_first == 1);
        REQUIRE(stager.finish(std::move(*grown)).ok());
        CHECK(mock.live_device_allocations() == 1);
    }
    SECTION("both attempts fail: the slot is empty, the run fails, the stager stays usable") {
        mock.fail_from(MockOp::device_malloc, 2, Errc::out_of_memory);
        auto failed = bind_bytes(stager, host, 4096);
        REQUIRE_FALSE(failed.ok());
        CHECK(failed.status().code() == Errc::out_of_memory);
        CHECK_THAT(failed.status().message(),
                   Catch::Contains("retained buffer grow failed") && Catch::Contains("the slot held 1024 bytes"));
        CHECK(stager.stats().grow_failures == 1);
        CHECK(stager.strategy().capacity() == 0);
        CHECK(mock.live_device_allocations() == 0);
        mock.clear_faults();
        auto again = bind_bytes(stager, host, 4096);
        REQUIRE(again.ok());
        REQUIRE(stager.finish(std::move(*again)).ok());
    }
    CHECK(mock.misuses() == 0);
}

TEST_CASE("growth: when the grown target cannot be had, the grow falls back to exactly the plan",
          "[growth][transactional]") {
    // 85 MiB device, 60 MiB held, an 80 MiB plan: GeometricGrowth asks 90 MiB, which can never
    // fit; 80 MiB does once the old buffer is gone. The run must succeed the first time.
    constexpr std::size_t MiB = std::size_t{1} << 20;
    MockBackend mock(MockConfig{.device_capacity = 85 * MiB});
    using Geometric = RetainedBump<GeometricGrowth<3, 2>>;
    Stager<MockBackend, Geometric> stager(mock);
    std::vector<std::byte> host(80 * MiB);
    const TensorArg first[] = {{host.data(), 60 * MiB, Direction::In}};
    auto run = stager.bind(first);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    const TensorArg second[] = {{host.data(), 80 * MiB, Direction::In}};
    auto grown = stager.bind(second);
    REQUIRE(grown.ok());
    CHECK(stager.strategy().capacity() == 80 * MiB);
    CHECK(stager.stats().grows_exact_fallback == 1);
    CHECK(stager.stats().grows_free_first == 1);
    CHECK(stager.stats().grow_failures == 0);
    REQUIRE(stager.finish(std::move(*grown)).ok());
    CHECK(mock.live_device_allocations() == 1);
}

namespace {
std::vector<std::string> sunk;
void remember(const Status& status) noexcept {
    sunk.push_back(status.message());
}
}  // namespace

TEST_CASE("growth: a free that fails while a grow replaces the old buffer is counted and reported",
          "[growth][transactional]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink});  // the refused free leaves a leak behind
    Stager<MockBackend> stager(mock);
    sunk.clear();
    stager.set_error_sink(&remember);
    std::vector<std::byte> host(8192);
    run_bytes(stager, host, 1024);
    mock.fail_call(MockOp::device_free, 1, Errc::backend_failure);
    auto grown = bind_bytes(stager, host, 4096);
    REQUIRE(grown.ok());  // the new buffer stands
    CHECK(stager.stats().free_failures == 1);
    REQUIRE(sunk.size() == 1);
    CHECK_THAT(sunk[0], Catch::Contains("device_free") && Catch::Contains("injected") && Catch::Contains("mock"));
    REQUIRE(stager.finish(std::move(*grown)).ok());
}

TEST_CASE("growth: a grow whose misaligned try cannot be freed fails with that failure; the slot keeps what it held",
          "[growth][alignment][transactional]") {
    // The adversarial mock misaligns every exact try; giving one back fails once. The grow policy
    // targets more than the plan, so a fallback to the plan's bytes could have hidden the failure.
    MockBackend mock(MockConfig{.offset = 64, .sink = &test::quiet_sink});  // the refused free leaks
    Stager<MockBackend, RetainedBump<GranularGrowth<8192>>> stager(mock);
    std::vector<std::byte> host(8192);
    const TensorArg args[] = {{host.data(), 1000, Direction::In}};
    mock.fail_call(MockOp::device_free, 1, Errc::backend_failure);
    auto refused = stager.bind(args);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == Errc::backend_failure);
    CHECK_THAT(refused.status().message(),
               Catch::Contains("freeing a misaligned allocation") && Catch::Contains("injected"));
    CHECK(stager.stats().free_failures == 1);
    CHECK(stager.stats().grow_failures == 1);
    CHECK(stager.stats().device_mallocs == 1);  // no fallback after the failed free
    CHECK(stager.strategy().capacity() == 0);
    auto run = stager.bind(args);  // the next bind asks with the slack at once
    REQUIRE(run.ok());
    CHECK(stager.stats().device_mallocs == 2);
    CHECK(reinterpret_cast<std::uintptr_t>(run->device_args()[0].data) % 1024 == 0);
    REQUIRE(stager.finish(std::move(*run)).ok());
    REQUIRE(stager.release().ok());
    CHECK(mock.misuses() == 0);
}

TEST_CASE("growth: GrowOrder::free_first frees the old buffer before allocating", "[growth][order]") {
    MockBackend mock;
    using FreeFirst = RetainedBump<ExactGrowth>;
    Stager<MockBackend, FreeFirst> stager(mock, FreeFirst(ExactGrowth{}, GrowOrder::free_first));
    std::vector<std::byte> host(8192);
    const TensorArg small[] = {{host.data(), 1024, Direction::In}};
    const TensorArg large[] = {{host.data(), 8192, Direction::In}};
    auto run = stager.bind(small);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    mock.clear_journal();
    run = stager.bind(large);
    REQUIRE(run.ok());
    const auto journal = mock.journal();
    REQUIRE(journal.size() >= 2);
    CHECK(journal[0].op == MockOp::device_free);
    CHECK(journal[1].op == MockOp::device_malloc);
    CHECK(stager.stats().grows_free_first == 1);
    CHECK(stager.stats().grows_allocate_first == 0);
    CHECK(stager.strategy().order() == GrowOrder::free_first);
    REQUIRE(stager.finish(std::move(*run)).ok());
}

TEST_CASE("growth: once the backend misaligned an allocation, every later grow asks with the slack at once",
          "[growth][alignment]") {
    // The adversarial mock's pointers are 64- but never 1024-aligned: only the first grow of the
    // stager pays the exact try (malloc, free); later grows, on any slot, cost one malloc each.
    MockBackend mock(MockConfig::adversarial());
    Stager<MockBackend, RetainedBump<>> stager(mock, RetainedBump<>{}, 2);
    std::vector<std::byte> host(4096);
    for (const std::size_t bytes : {std::size_t{1000}, std::size_t{2000}, std::size_t{4000}}) {
        const TensorArg args[] = {{host.data(), bytes, Direction::In}};
        auto run = stager.bind(args);
        REQUIRE(run.ok());
        CHECK(reinterpret_cast<std::uintptr_t>(run->device_args()[0].data) % 1024 == 0);
        REQUIRE(stager.finish(std::move(*run)).ok());
    }
    // Three grows: at most four allocations, one retry.
    CHECK(stager.stats().regrows == 3);
    CHECK(stager.stats().device_mallocs == 4);
    CHECK(stager.stats().alignment_retries == 1);
    std::size_t frees = 0;  // the one misaligned exact try, given back
    for (const auto& entry : mock.journal()) frees += entry.op == MockOp::device_free;
    CHECK(frees == 1 + 1);  // the misaligned try, and slot 0's 1000-byte buffer replaced by its grow
    REQUIRE(stager.release().ok());
    CHECK(mock.misuses() == 0);
}

TEST_CASE("growth: an aligning backend is never asked for the slack", "[growth][alignment]") {
    MockBackend mock;  // page-aligned pointers: the exact size always fits
    Stager<MockBackend, RetainedBump<>> stager(mock);
    std::vector<std::byte> host(4096);
    for (const std::size_t bytes : {std::size_t{1000}, std::size_t{2000}, std::size_t{4000}}) {
        const TensorArg args[] = {{host.data(), bytes, Direction::In}};
        auto run = stager.bind(args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
    }
    CHECK(stager.stats().device_mallocs == 3);
    CHECK(stager.stats().alignment_retries == 0);
    REQUIRE(stager.release().ok());
}

TEST_CASE("growth: the packed mirror retries alignment once per stager too", "[growth][alignment]") {
    using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<1024>>;
    MockBackend mock(MockConfig::adversarial());
    Stager<MockBackend, Packed> stager(mock);
    std::vector<std::byte> host(4096);
    for (const std::size_t count : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
        std::vector<TensorArg> args;
        for (std::size_t i = 0; i < count; ++i) args.push_back({host.data() + 1024 * i, 1000, Direction::In});
        auto run = stager.bind(args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
    }
    std::size_t pinned_mallocs = 0;
    for (const auto& entry : mock.journal()) pinned_mallocs += entry.op == MockOp::pinned_malloc;
    CHECK(stager.stats().mirror_alignment_retries == 1);
    CHECK(pinned_mallocs == 4);  // three mirror grows: one exact try, then the slack every time
    REQUIRE(stager.release().ok());
    CHECK(mock.misuses() == 0);
}

TEST_CASE("growth: a grow that falls back to the plan after a misaligned try asks with the slack at once",
          "[growth][alignment]") {
    // The 2 MiB target comes back misaligned and, with its slack, does not fit: the fallback to
    // the plan's 1000 bytes goes straight to the slack (one retry in all, two allocations).
    MockBackend mock(MockConfig{.offset = 64, .device_capacity = std::size_t{2} << 20});
    Stager<MockBackend, RetainedBump<GranularGrowth<(2 << 20)>>> stager(mock);
    std::vector<std::byte> host(1000);
    const TensorArg args[] = {{host.data(), 1000, Direction::In}};
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(stager.stats().grows_exact_fallback == 1);
    CHECK(stager.stats().alignment_retries == 1);
    CHECK(stager.stats().device_mallocs == 2);
    REQUIRE(stager.release().ok());
    CHECK(mock.misuses() == 0);
}

// GrowthRule is each policy with its parameters chosen at run time: over a grid of capacities
// and requirements, including those whose products overflow, it answers exactly what the
// compile-time policy does (value or error code and message).
TEST_CASE("growth: a GrowthRule answers as the compile-time policy with the same parameters", "[growth][rule]") {
    constexpr std::size_t max = static_cast<std::size_t>(-1);
    const std::vector<std::size_t> sizes = {0,       1,       1000,    4096, 4097, std::size_t{1} << 20,
                                            max / 3, max / 2, max - 5, max};
    const auto same = [](const Result<std::size_t>& a, const Result<std::size_t>& b) {
        if (a.ok() != b.ok()) return false;
        if (a.ok()) return *a == *b;
        return a.status().code() == b.status().code() && a.status().message() == b.status().message();
    };
    const Result<GrowthRule> geometric = GrowthRule::geometric(3, 2);
    const Result<GrowthRule> granular = GrowthRule::granular(4096);
    REQUIRE((geometric.ok() && granular.ok()));
    const GrowthRule capped = GrowthRule::exact().capped(1 << 20);
    const GrowthRule capped_geometric = geometric->capped(std::size_t{1} << 30);
    for (const std::size_t current : sizes) {
        for (const std::size_t required : sizes) {
            CAPTURE(current, required);
            CHECK(same(GrowthRule::exact().next_capacity(current, required),
                       ExactGrowth{}.next_capacity(current, required)));
            CHECK(same(geometric->next_capacity(current, required),
                       GeometricGrowth<3, 2>{}.next_capacity(current, required)));
            CHECK(same(granular->next_capacity(current, required),
                       GranularGrowth<4096>{}.next_capacity(current, required)));
            CHECK(same(capped.next_capacity(current, required),
                       CappedGrowth<ExactGrowth>(1 << 20).next_capacity(current, required)));
            CHECK(same(capped_geometric.next_capacity(current, required),
                       CappedGrowth<GeometricGrowth<3, 2>>(std::size_t{1} << 30).next_capacity(current, required)));
        }
    }
    CHECK(GrowthRule::geometric(2, 2).status().code() == Errc::invalid_argument);
    CHECK(GrowthRule::geometric(3, 0).status().code() == Errc::invalid_argument);
    CHECK_THAT(GrowthRule::granular(3000).status().message(), Catch::Contains("3000 is not a power of two"));
}

// The rule and the order of a grow given as options reach every slot of the stager.
TEST_CASE("growth: StagerOptions::growth and grow_order configure a RetainedBump<GrowthRule> stager",
          "[growth][rule]") {
    MockBackend mock;
    using Configurable = RetainedBump<GrowthRule>;
    Stager<MockBackend, Configurable> stager(
        mock, {},
        StagerOptions{
            .pipeline_slots = 2, .growth = *GrowthRule::granular(1 << 16), .grow_order = GrowOrder::free_first});
    REQUIRE(stager.status().ok());
    for (std::size_t slot = 0; slot < 2; ++slot) {
        CHECK(stager.strategy(slot).growth().kind() == GrowthRule::Kind::granular);
        CHECK(stager.strategy(slot).order() == GrowOrder::free_first);
    }
    std::vector<std::byte> host(3000);
    const TensorArg args[] = {{host.data(), host.size(), Direction::InOut}};
    auto run = stager.bind_slot(1, args);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(stager.strategy(1).capacity() == 1 << 16);  // rounded to the granule
    Stager<MockBackend> fixed(mock, {}, StagerOptions{.growth = GrowthRule::exact()});
    CHECK(fixed.status().code() == Errc::invalid_argument);  // RetainedBump<ExactGrowth> takes no rule
    CHECK_THAT(fixed.status().message(), Catch::Contains("growth rule") && Catch::Contains("mock"));
    CHECK(fixed.bind(args).status().code() == Errc::invalid_argument);
}
