// SPDX-License-Identifier: Apache-2.0
// Completion (completion.hpp): the end of a stream-ordered run — wait, ready, detach, moves,
// and a stager that dies first.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "devstage/completion.hpp"
#include "devstage/stager.hpp"
#include "support.hpp"

using namespace devstage;

TEST_CASE("completion: a default Completion is complete and ok", "[completion]") {
    Completion done;
    CHECK_FALSE(done.pending());
    CHECK(done.wait().ok());
    auto ready = done.ready();
    REQUIRE(ready.ok());
    CHECK(*ready);
    done.detach();
    CHECK(done.wait().ok());
}

TEST_CASE("completion: on an immediate stream the outputs are in place when wait returns", "[completion]") {
    // A backend without streams is staged through SynchronousAdapter: its stream is immediate.
    test::SyncOnly<MockBackend> mock;
    using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<>>;
    Stager<test::SyncOnly<MockBackend>, Packed> stager(mock);
    STATIC_REQUIRE(std::is_same_v<decltype(stager)::Stream, ImmediateStream>);
    test::HostRun host;
    host.add(300, Direction::In, 1);
    host.add(200, Direction::Out, 2);
    auto run = stager.bind(host.args, ImmediateStream{});
    REQUIRE(run.ok());
    REQUIRE(test::fake_kernel(mock, run->device_args(), host.args).ok());
    const auto device_out = test::read_device(mock, run->device_args()[1].data, 200);
    auto done = stager.finish(std::move(*run), ImmediateStream{});
    REQUIRE(done.ok());
    Completion moved = std::move(*done);
    CHECK_FALSE(done->pending());
    auto ready = moved.ready();
    REQUIRE(ready.ok());
    CHECK(*ready);
    CHECK(host.buffers[1] == device_out);  // packed outputs unpacked when the run was settled
    CHECK(moved.wait().ok());
}
