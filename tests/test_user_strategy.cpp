// SPDX-License-Identifier: Apache-2.0
// A user-written retained strategy (tests/user_strategy.hpp: FreeFirstArena, written from the
// StagingStrategy concept alone, with a mirror) through the staging suites in every mode it
// claims: synchronous, on streams (the simulator's real ones, the mock's, the deferred mock's),
// packed, and frames; mapping it does not claim (its mirror has no device address), so a stager
// asked to map copies.
#include <catch2/catch.hpp>

#include <cstring>
#include <tuple>
#include <vector>

#include "async_support.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "suite_strategies.hpp"
#include "support.hpp"
#include "user_strategy.hpp"

namespace {
using Arena = devstage::test::FreeFirstArena<1024>;
using PackedArena = devstage::test::FreeFirstArena<1024, devstage::PackSmall<4096>>;
template <class B>
using User = devstage::test::WithStrategies<B, Arena, PackedArena>;
}  // namespace

using StagingBackends = std::tuple<User<devstage::SimBackend>, User<devstage::MockBackend>>;
using AsyncStagingBackends =
    std::tuple<User<devstage::SimBackend>, User<devstage::MockBackend>, User<devstage::test::DeferredMock>>;
#include "async_staging_suite.hpp"
#include "staging_suite.hpp"

using namespace devstage;

TEST_CASE("user strategy: frames and packed runs through its mirror; asked to map, it copies", "[user_strategy]") {
    MockBackend mock;
    Stager<MockBackend, PackedArena> stager(mock, {}, StagerOptions{.pipeline_slots = 2, .map_small = true});
    CHECK(stager.status().ok());
    CHECK(stager.pack_limit() == 4096);
    const TensorShape shapes[] = {{300, Direction::In}, {5000, Direction::InOut}, {200, Direction::Out}};
    Result<HostFrame> frame = stager.frame(shapes);
    REQUIRE(frame.ok());
    std::memset(frame->host(0).data(), 3, 300);
    std::memset(frame->host(1).data(), 4, 5000);
    std::memset(frame->host(2).data(), 0xEE, 200);
    const std::uint64_t uploads = mock.calls(MockOp::copy_to_device_async);
    auto run = stager.bind(*frame);
    REQUIRE(run.ok());
    CHECK(mock.calls(MockOp::copy_to_device_async) - uploads == 1);  // the whole frame in one copy
    REQUIRE(test::fake_kernel(mock, run->device_args(), frame->args()).ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(stager.stats().mapped_runs == 0);  // no device address for its mirror: copied

    test::HostRun host;
    host.add(100, Direction::In, 1);
    host.add(8000, Direction::InOut, 2);
    host.add(64, Direction::Out, 3);
    test::HostRun reference = host;
    reference.relink();
    auto packed = stager.bind(host.args);
    REQUIRE(packed.ok());
    REQUIRE(test::fake_kernel(mock, packed->device_args(), host.args).ok());
    REQUIRE(stager.finish(std::move(*packed)).ok());
    CHECK(stager.stats().packed_args == 3 + 2);
    Stager<MockBackend, PerTensorMalloc<>> per_tensor(mock);
    auto expected = per_tensor.bind(reference.args);
    REQUIRE(expected.ok());
    REQUIRE(test::fake_kernel(mock, expected->device_args(), reference.args).ok());
    REQUIRE(per_tensor.finish(std::move(*expected)).ok());
    CHECK(test::same_bytes(host.buffers, reference.buffers));
    frame = Status(Errc::invalid_argument, "done with it");
    REQUIRE(stager.release().ok());
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(mock.misuses() == 0);
}
