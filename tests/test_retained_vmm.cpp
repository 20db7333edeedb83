// SPDX-License-Identifier: Apache-2.0
// RetainedVmm and the simulator's virtual-memory capability.
#include <catch2/catch.hpp>

#include <tuple>

#include "support.hpp"

using VmmBackends = std::tuple<devstage::SimBackend>;
#include "vmm_suite.hpp"

using namespace devstage;

TEST_CASE("vmm: the simulator enforces the virtual-memory rules", "[vmm][sim]") {
    SimBackend sim(SimConfig{.device_capacity = 1 << 20});
    const std::size_t g = sim.vmm_granularity();
    CHECK(sim.vmm_reserve(g + 1).status().code() == Errc::invalid_argument);
    auto base = sim.vmm_reserve(4 * g);
    REQUIRE(base.ok());
    auto chunk = sim.vmm_create(g);
    REQUIRE(chunk.ok());
    CHECK(sim.stats().live_device_bytes == g);
    auto* start = static_cast<std::byte*>(*base);
    CHECK(sim.vmm_map(start + g, g, *chunk).code() == Errc::not_supported);  // not contiguous
    REQUIRE(sim.vmm_map(start, g, *chunk).ok());
    CHECK(sim.vmm_free(*chunk).code() == Errc::busy);                                    // still mapped
    CHECK(sim.vmm_release(*base).code() == Errc::busy);                                  // still has mapped chunks
    CHECK(sim.vmm_create(std::size_t{2} << 20).status().code() == Errc::out_of_memory);  // over capacity
    std::vector<std::byte> host(g);
    CHECK(sim.copy_to_device(start, host.data(), g).ok());
    CHECK(sim.copy_to_device(start, host.data(), g + 1).code() == Errc::invalid_argument);  // past the mapping
    REQUIRE(sim.vmm_unmap(start, g).ok());
    CHECK(sim.copy_to_device(start, host.data(), 1).code() == Errc::invalid_argument);
    REQUIRE(sim.vmm_free(*chunk).ok());
    REQUIRE(sim.vmm_release(*base).ok());
    CHECK(sim.stats().vmm_reservations == 0);
    CHECK(sim.stats().vmm_chunks == 0);
    CHECK(sim.stats().live_device_bytes == 0);
}
