// SPDX-License-Identifier: Apache-2.0
// RetainedVmm and the simulator's virtual-memory capability.
#include <catch2/catch.hpp>

#include <tuple>
#include <vector>

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

namespace {
// The simulator with a vmm_unmap that can be made to fail.
class FlakyUnmap : public SimBackend {
public:
    int fail_unmap_call = 0;  // 1-based; 0: never
    Status vmm_unmap(void* address, std::size_t bytes) noexcept {
        if (++unmaps == fail_unmap_call) return Status(Errc::backend_failure, "flaky: injected unmap failure");
        return SimBackend::vmm_unmap(address, bytes);
    }

private:
    int unmaps = 0;
};
}  // namespace

TEST_CASE("vmm: a failed unmap stops release, keeps what is mapped, and a later release retries", "[vmm][faults]") {
    FlakyUnmap sim;
    const std::size_t g = sim.vmm_granularity();
    {
        Stager<FlakyUnmap, RetainedVmm<>> stager(sim, RetainedVmm<>(16 * g));
        std::vector<std::byte> host(3 * g);
        for (std::size_t bytes : {g, 2 * g, 3 * g}) {  // three chunks
            const TensorArg args[] = {{host.data(), bytes, Direction::In}};
            auto run = stager.bind(args);
            REQUIRE(run.ok());
            REQUIRE(stager.finish(std::move(*run)).ok());
        }
        REQUIRE(sim.stats().vmm_chunks == 3);
        sim.fail_unmap_call = 2;  // the last chunk unmaps, the middle one refuses
        const Status stopped = stager.release();
        REQUIRE_FALSE(stopped.ok());
        CHECK_THAT(stopped.message(), Catch::Contains("vmm release stopped unmapping") &&
                                          Catch::Contains("2 chunk(s)") && Catch::Contains("injected"));
        CHECK(stager.strategy().capacity() == 2 * g);  // what is still mapped stays recorded
        CHECK(sim.stats().vmm_chunks == 2);
        CHECK(stager.stats().free_failures == 1);
        REQUIRE(stager.release().ok());  // retried: everything goes
        CHECK(stager.strategy().base() == nullptr);
    }
    CHECK(sim.stats().vmm_chunks == 0);
    CHECK(sim.stats().vmm_reservations == 0);
    CHECK(sim.stats().live_device_bytes == 0);
}
