// SPDX-License-Identifier: Apache-2.0
// SimBackend specifics: capacity, the pinned/pageable copy model, counters.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "devstage/backends/sim.hpp"
#include "support.hpp"

using devstage::Errc;
using devstage::SimBackend;
using devstage::SimConfig;

TEST_CASE("sim: capacity makes out_of_memory reproducible", "[sim]") {
    SimBackend sim(SimConfig{.device_capacity = 1 << 20});
    auto a = sim.device_malloc(600 << 10);
    REQUIRE(a.ok());
    auto b = sim.device_malloc(600 << 10);
    REQUIRE_FALSE(b.ok());
    CHECK(b.status().code() == Errc::out_of_memory);
    CHECK_THAT(b.status().message(), Catch::Contains("sim") && Catch::Contains("614400") && Catch::Contains("1048576"));
    REQUIRE(sim.device_free(*a).ok());
    auto c = sim.device_malloc(600 << 10);
    REQUIRE(c.ok());
    CHECK(sim.stats().peak_device_bytes == 600 << 10);
    REQUIRE(sim.device_free(*c).ok());
    CHECK(sim.stats().live_device_bytes == 0);
}

TEST_CASE("sim: pageable copies bounce in chunks, pinned copies are direct", "[sim]") {
    SimBackend sim(SimConfig{.bounce_buffer_bytes = 64 << 10});
    constexpr std::size_t bytes = (1 << 20) + 5;
    auto device = sim.device_malloc(bytes);
    REQUIRE(device.ok());
    const auto in = devstage::test::pattern(bytes, 3);

    REQUIRE(sim.copy_to_device(*device, in.data(), bytes).ok());
    CHECK(sim.stats().bounced_bytes == bytes);
    CHECK(sim.stats().direct_bytes == 0);

    auto pinned = sim.pinned_malloc(bytes);
    REQUIRE(pinned.ok());
    CHECK(sim.is_pinned(*pinned));
    CHECK_FALSE(sim.is_pinned(in.data()));
    REQUIRE(sim.copy_from_device(*pinned, *device, bytes).ok());
    CHECK(std::memcmp(*pinned, in.data(), bytes) == 0);
    CHECK(sim.stats().bounced_bytes == bytes);
    CHECK(sim.stats().direct_bytes == bytes);
    CHECK(sim.stats().bytes_to_device == bytes);
    CHECK(sim.stats().bytes_from_device == bytes);
    REQUIRE(sim.pinned_free(*pinned).ok());
    REQUIRE(sim.device_free(*device).ok());
}

TEST_CASE("sim: pinned memory is page-locked, or says it is not", "[sim]") {
    SimBackend locking;
    auto p = locking.pinned_malloc(8192);
    REQUIRE(p.ok());
    // As root mlock succeeds; under a small RLIMIT_MEMLOCK it may not, and the query says so.
    CHECK(locking.pinned_locked(*p) == (locking.stats().pinned_lock_failures == 0));
    REQUIRE(locking.pinned_free(*p).ok());

    SimBackend unlocked(SimConfig{.lock_pinned = false});
    auto q = unlocked.pinned_malloc(100);
    REQUIRE(q.ok());
    CHECK(unlocked.is_pinned(*q));
    CHECK_FALSE(unlocked.pinned_locked(*q));
    CHECK(unlocked.stats().pinned_lock_failures == 1);
    REQUIRE(unlocked.pinned_free(*q).ok());
}

TEST_CASE("sim: copies outside an allocation and unknown frees are errors", "[sim]") {
    SimBackend sim;
    auto device = sim.device_malloc(1000);
    REQUIRE(device.ok());
    std::vector<std::byte> host(2000);
    auto copy = sim.copy_to_device(*device, host.data(), 1001);
    CHECK(copy.code() == Errc::invalid_argument);
    CHECK_THAT(copy.message(), Catch::Contains("1001 bytes"));
    CHECK(sim.copy_from_device(host.data(), host.data(), 10).code() == Errc::invalid_argument);
    CHECK(sim.device_free(host.data()).code() == Errc::unknown_pointer);
    CHECK(sim.pinned_free(*device).code() == Errc::unknown_pointer);
    CHECK(sim.device_malloc(0).status().code() == Errc::invalid_argument);
    CHECK(sim.stats().failed_calls == 5);
    REQUIRE(sim.device_free(*device).ok());
}
