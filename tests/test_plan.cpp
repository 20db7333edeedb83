// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <limits>
#include <vector>

#include "devstage/plan.hpp"

using devstage::Direction;
using devstage::Errc;
using devstage::Placement;
using devstage::StagingPlan;
using devstage::TensorArg;

TEST_CASE("plan: sizes are packed at the alignment", "[plan]") {
    std::array<std::byte, 4096> host{};
    const std::size_t size =
        GENERATE(std::size_t{1}, std::size_t{1023}, std::size_t{1024}, std::size_t{1025}, std::size_t{4096});
    CAPTURE(size);
    const std::size_t aligned = (size + 1023) / 1024 * 1024;
    const TensorArg args[] = {{host.data(), size}, {host.data(), size, Direction::In}};
    auto plan = StagingPlan::build(args, 1024);
    REQUIRE(plan.ok());
    REQUIRE(plan->tensors().size() == 2);
    CHECK(plan->tensors()[0].offset == 0);
    CHECK(plan->tensors()[1].offset == aligned);
    CHECK(plan->tensors()[1].offset % 1024 == 0);
    CHECK(plan->tensors()[1].bytes == size);
    CHECK(plan->required_bytes() == 2 * aligned);
}

TEST_CASE("plan: device and zero-byte args are not staged", "[plan]") {
    std::array<std::byte, 64> host{};
    int device_memory = 0;
    const TensorArg args[] = {
        {host.data(), 0},                                          // zero bytes
        {nullptr, 0, Direction::Out},                              // zero bytes, null: fine
        {&device_memory, 4, Direction::InOut, Placement::Device},  // passes through
        {host.data(), 10, Direction::Out},                         // staged
    };
    auto plan = StagingPlan::build(args, 512);
    REQUIRE(plan.ok());
    REQUIRE(plan->tensors().size() == 1);
    CHECK(plan->tensors()[0].arg_index == 3);
    CHECK(plan->required_bytes() == 512);
}

TEST_CASE("plan: null host pointer with bytes is invalid_argument", "[plan]") {
    std::array<std::byte, 8> host{};
    const TensorArg args[] = {{host.data(), 8}, {nullptr, 16}};
    auto plan = StagingPlan::build(args, 1024);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == Errc::invalid_argument);
    CHECK_THAT(plan.status().message(), Catch::Contains("arg 1") && Catch::Contains("16 bytes"));
}

TEST_CASE("plan: a total that would wrap is invalid_argument, never a small buffer", "[plan]") {
    std::array<std::byte, 8> host{};
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    SECTION("one arg too large to align") {
        const TensorArg args[] = {{host.data(), max - 10}};
        auto plan = StagingPlan::build(args, 1024);
        REQUIRE_FALSE(plan.ok());
        CHECK(plan.status().code() == Errc::invalid_argument);
        CHECK_THAT(plan.status().message(), Catch::Contains("overflow"));
    }
    SECTION("a sum that wraps") {
        const TensorArg args[] = {{host.data(), max / 2}, {host.data(), max / 2}, {host.data(), 4096}};
        auto plan = StagingPlan::build(args, 1024);
        REQUIRE_FALSE(plan.ok());
        CHECK(plan.status().code() == Errc::invalid_argument);
        CHECK_THAT(plan.status().message(), Catch::Contains("arg 1") || Catch::Contains("arg 2"));
    }
}

TEST_CASE("plan: assign reuses the plan and resets it on error", "[plan]") {
    std::array<std::byte, 8> host{};
    StagingPlan plan;
    const TensorArg good[] = {{host.data(), 8}};
    REQUIRE(plan.assign(good, 64).ok());
    CHECK(plan.required_bytes() == 64);
    const TensorArg bad[] = {{nullptr, 8}};
    CHECK_FALSE(plan.assign(bad, 64).ok());
    CHECK(plan.tensors().empty());
    CHECK(plan.required_bytes() == 0);
    const TensorArg none[] = {{host.data(), 0}};
    REQUIRE(plan.assign(none, 64).ok());
    CHECK(plan.required_bytes() == 0);
}

TEST_CASE("plan: an alignment that is not a power of two is invalid_argument", "[plan]") {
    std::array<std::byte, 8> host{};
    const TensorArg args[] = {{host.data(), 8}};
    for (const std::size_t alignment : {std::size_t{0}, std::size_t{3}, std::size_t{1000}}) {
        CAPTURE(alignment);
        auto plan = StagingPlan::build(args, alignment);
        REQUIRE_FALSE(plan.ok());
        CHECK(plan.status().code() == Errc::invalid_argument);
        CHECK_THAT(plan.status().message(), Catch::Contains("not a power of two"));
    }
}

TEST_CASE("plan: with a packing limit, small args lead grouped In, InOut, Out", "[plan][packing]") {
    std::array<std::byte, 8192> host{};
    const TensorArg args[] = {
        {host.data(), 100, Direction::Out},   {host.data(), 5000, Direction::In}, {host.data(), 200, Direction::In},
        {host.data(), 300, Direction::InOut}, {host.data(), 50, Direction::In},
    };
    auto plan = StagingPlan::build(args, 1024, 4096);
    REQUIRE(plan.ok());
    const auto t = plan->tensors();
    REQUIRE(t.size() == 5);
    CHECK(t[2].offset == 0);     // In
    CHECK(t[4].offset == 1024);  // In
    CHECK(t[3].offset == 2048);  // InOut
    CHECK(t[0].offset == 3072);  // Out
    CHECK(t[1].offset == 4096);  // direct
    CHECK(t[1].group == devstage::PackGroup::direct);
    const auto& layout = plan->layout();
    CHECK(layout.packed_bytes == 4096);
    CHECK(layout.upload_end == 2048 + 300);  // In + InOut, no Out byte
    CHECK(layout.copy_back_begin == 2048);   // InOut + Out, no In byte
    CHECK(layout.copy_back_end == 3072 + 100);
    CHECK(plan->required_bytes() == 4096 + 5120);
}

TEST_CASE("plan: a Device arg with bytes and a null pointer is invalid_argument", "[plan]") {
    std::array<std::byte, 8> host{};
    const TensorArg args[] = {{host.data(), 8},
                              {nullptr, 0, Direction::In, Placement::Device},
                              {nullptr, 32, Direction::In, Placement::Device}};
    auto plan = StagingPlan::build(args, 1024);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == Errc::invalid_argument);
    CHECK_THAT(plan.status().message(),
               Catch::Contains("arg 2") && Catch::Contains("null device pointer") && Catch::Contains("32 bytes"));
}
