// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include "devstage/backends/mock.hpp"
#include "devstage/lease.hpp"

using devstage::MockBackend;
using devstage::MockOp;
using devstage::ReleaseKind;
using devstage::TensorLease;

TEST_CASE("lease: Free releases the allocation, not the aligned pointer", "[lease]") {
    MockBackend mock;
    auto allocation = mock.device_malloc(2048);
    REQUIRE(allocation.ok());
    void* aligned = static_cast<std::byte*>(*allocation) + 960;
    TensorLease lease{nullptr, aligned, 16, false, ReleaseKind::Free, *allocation};
    CHECK(devstage::release(mock, lease).ok());
    CHECK(mock.calls(MockOp::device_free) == 1);
    CHECK(mock.live_device_allocations() == 0);
    CHECK(mock.misuses() == 0);
    // Released leases are cleared: a second release does nothing.
    CHECK(devstage::release(mock, lease).ok());
    CHECK(mock.calls(MockOp::device_free) == 1);
}

TEST_CASE("lease: BufferNoop and ExternalNoop never call the backend", "[lease]") {
    MockBackend mock;
    int memory = 0;
    for (ReleaseKind kind : {ReleaseKind::BufferNoop, ReleaseKind::ExternalNoop}) {
        TensorLease lease{&memory, &memory, 4, true, kind, &memory};
        CHECK(devstage::release(mock, lease).ok());
    }
    CHECK(mock.total_calls() == 0);
}

TEST_CASE("lease: a failing free is reported", "[lease]") {
    MockBackend mock;
    auto allocation = mock.device_malloc(64);
    REQUIRE(allocation.ok());
    mock.fail_call(MockOp::device_free, 1);
    TensorLease lease{nullptr, *allocation, 64, false, ReleaseKind::Free, *allocation};
    const devstage::Status status = devstage::release(mock, lease);
    CHECK(status.code() == devstage::Errc::backend_failure);
    CHECK(lease.allocation == nullptr);
    REQUIRE(mock.device_free(*allocation).ok());  // the mock kept it: tidy up
}
