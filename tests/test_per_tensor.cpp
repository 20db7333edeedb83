// SPDX-License-Identifier: Apache-2.0
// PerTensorMalloc on its own: one allocation per staged arg, aligned up, freed by allocation.
#include <catch2/catch.hpp>

#include <cstdint>

#include "devstage/backends/mock.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "support.hpp"

using namespace devstage;

TEST_CASE("per_tensor: leases are Free, aligned up, and freed through their allocation", "[per_tensor]") {
    MockBackend mock(MockConfig::adversarial());
    StagerStats stats;
    PerTensorMalloc<> strategy;
    std::vector<std::byte> host(3000);
    const TensorArg args[] = {{host.data(), 1, Direction::In}, {host.data(), 3000, Direction::Out}};
    auto plan = StagingPlan::build(args, 1024);
    REQUIRE(plan.ok());
    REQUIRE(test::prepare_for(strategy, mock, *plan, stats).ok());
    CHECK(mock.total_calls() == 0);
    std::vector<TensorLease> leases;
    for (const PlannedTensor& tensor : plan->tensors()) {
        TensorLease lease{};
        REQUIRE(strategy.acquire(mock, tensor, args[tensor.arg_index], lease, stats).ok());
        CHECK(lease.release_kind == ReleaseKind::Free);
        CHECK(reinterpret_cast<std::uintptr_t>(lease.device) % 1024 == 0);
        CHECK(lease.allocation != lease.device);  // 64-aligned allocation, aligned up
        CHECK(mock.is_device(lease.device, lease.bytes));
        leases.push_back(lease);
    }
    CHECK(leases[1].copy_back);
    CHECK_FALSE(leases[0].copy_back);
    CHECK(stats.device_mallocs == 2);
    for (TensorLease& lease : leases) CHECK(release(mock, lease).ok());
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("per_tensor: a failed allocation names the bytes and the backend", "[per_tensor]") {
    MockBackend mock(MockConfig{.device_capacity = 2048});
    Stager<MockBackend, PerTensorMalloc<>> stager(mock);
    std::vector<std::byte> host(4096);
    const TensorArg args[] = {{host.data(), 1024}, {host.data(), 4096}};
    auto run = stager.bind(args);
    REQUIRE_FALSE(run.ok());
    CHECK(run.status().code() == Errc::out_of_memory);
    CHECK_THAT(run.status().message(), Catch::Contains("4096") && Catch::Contains("'mock'"));
    CHECK(mock.live_device_allocations() == 0);  // the first arg's allocation was released
    CHECK(stager.stats().device_frees == 1);
}
