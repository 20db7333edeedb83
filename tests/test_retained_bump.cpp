// SPDX-License-Identifier: Apache-2.0
// RetainedBump on its own: alignment from a backend that guarantees less, slack accounting,
// slice misses, growth-policy errors.
#include <catch2/catch.hpp>

#include <cstdint>

#include "devstage/backends/mock.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "support.hpp"

using namespace devstage;

namespace {
std::vector<TensorArg> args_of(std::vector<std::byte>& host, std::initializer_list<std::size_t> sizes) {
    std::vector<TensorArg> args;
    for (std::size_t size : sizes) args.push_back(TensorArg{host.data(), size, Direction::In});
    return args;
}
struct RefusingGrowth {
    Result<std::size_t> next_capacity(std::size_t, std::size_t required) const noexcept { return required / 2; }
};
}  // namespace

TEST_CASE("retained_bump: slices are Alignment-aligned over a 64-aligned backend", "[retained_bump]") {
    MockBackend mock(MockConfig::adversarial());
    StagerStats stats;
    RetainedBump<> strategy;
    std::vector<std::byte> host(5000);
    const std::size_t size =
        GENERATE(std::size_t{1}, std::size_t{1023}, std::size_t{1024}, std::size_t{1025}, std::size_t{5000});
    const auto args = args_of(host, {size, size, 7});
    auto plan = StagingPlan::build(args, RetainedBump<>::alignment);
    REQUIRE(plan.ok());
    REQUIRE(test::prepare_for(strategy, mock, *plan, stats).ok());
    // The adversarial mock's pointers are 64- but never 1024-aligned: the exact request comes
    // back misaligned, is freed, and is asked again with the slack to align the base.
    const auto journal = mock.journal();
    REQUIRE(journal.size() == 3);
    CHECK(journal[0].op == MockOp::device_malloc);
    CHECK(journal[0].bytes == plan->required_bytes());
    CHECK(journal[1].op == MockOp::device_free);
    CHECK(journal[2].bytes == plan->required_bytes() + 1024 - 64);
    CHECK(stats.alignment_retries == 1);
    CHECK(stats.retained_bytes == journal[2].bytes);
    CHECK(reinterpret_cast<std::uintptr_t>(strategy.base()) % 1024 == 0);
    for (const PlannedTensor& tensor : plan->tensors()) {
        TensorLease lease{};
        REQUIRE(slice(strategy, mock, tensor, args[tensor.arg_index], lease).ok());
        CHECK(reinterpret_cast<std::uintptr_t>(lease.device) % 1024 == 0);
        CHECK(mock.is_device(lease.device, lease.bytes));
        CHECK(lease.release_kind == ReleaseKind::BufferNoop);
    }
    REQUIRE(strategy.release_retained(mock, stats).ok());
    CHECK(stats.retained_bytes == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("retained_bump: a slice outside the buffer is an error, not undefined behaviour", "[retained_bump]") {
    MockBackend mock;
    StagerStats stats;
    RetainedBump<> strategy;
    std::vector<std::byte> host(64);
    const TensorArg arg{host.data(), 64, Direction::In};
    TensorLease lease{};
    const Status miss = slice(strategy, mock, PlannedTensor{0, 0, 64}, arg, lease);  // no prepare: empty slot
    REQUIRE_FALSE(miss.ok());
    CHECK_THAT(miss.message(), Catch::Contains("slice miss"));
    const TensorArg args[] = {arg};
    auto plan = StagingPlan::build(args, 1024);
    REQUIRE(test::prepare_for(strategy, mock, *plan, stats).ok());
    const Status beyond = slice(strategy, mock, PlannedTensor{0, 1024, 64}, arg, lease);
    CHECK(beyond.code() == Errc::invalid_argument);
    REQUIRE(strategy.release_retained(mock, stats).ok());
}

TEST_CASE("retained_bump: a growth policy below the requirement is refused before any allocation", "[retained_bump]") {
    MockBackend mock;
    StagerStats stats;
    RetainedBump<RefusingGrowth> strategy;
    std::vector<std::byte> host(64);
    const TensorArg args[] = {{host.data(), 64}};
    auto plan = StagingPlan::build(args, 1024);
    const Status status = test::prepare_for(strategy, mock, *plan, stats);
    CHECK(status.code() == Errc::invalid_argument);
    CHECK(stats.grow_failures == 1);
    CHECK(mock.total_calls() == 0);
}

TEST_CASE("retained_bump: a backend breaking its alignment promise is caught", "[retained_bump]") {
    MockBackend mock(MockConfig{.offset = 8});
    StagerStats stats;
    RetainedBump<> strategy;
    std::vector<std::byte> host(64);
    const TensorArg args[] = {{host.data(), 64}};
    auto plan = StagingPlan::build(args, 1024);
    const Status status = test::prepare_for(strategy, mock, *plan, stats);
    CHECK(status.code() == Errc::backend_failure);
    CHECK_THAT(status.message(), Catch::Contains("not aligned"));
    CHECK(mock.live_device_allocations() == 0);
    CHECK(stats.device_mallocs == stats.device_frees);
}

TEST_CASE("retained_bump: copies carry the policy, moves carry the buffer", "[retained_bump]") {
    MockBackend mock;
    StagerStats stats;
    RetainedBump<> original;
    std::vector<std::byte> host(64);
    const TensorArg args[] = {{host.data(), 64}};
    auto plan = StagingPlan::build(args, 1024);
    REQUIRE(test::prepare_for(original, mock, *plan, stats).ok());
    RetainedBump<> copy(original);
    CHECK(copy.capacity() == 0);
    RetainedBump<> moved(std::move(original));
    CHECK(moved.capacity() == 1024);
    CHECK(original.capacity() == 0);  // NOLINT(bugprone-use-after-move): the contract says so
    REQUIRE(moved.release_retained(mock, stats).ok());
    CHECK(mock.live_device_allocations() == 0);
}

TEST_CASE("retained_bump: the exact size is asked first; no slack when the pointer is aligned anyway",
          "[retained_bump]") {
    // MockBackend promises 64-byte alignment but returns page-aligned blocks by default, as
    // real devices do: a 2048-byte buffer must cost 2048 bytes, not 2048 + 960.
    MockBackend mock;
    StagerStats stats;
    RetainedBump<> strategy;
    std::vector<std::byte> host(2048);
    const TensorArg args[] = {{host.data(), 2048, Direction::In}};
    auto plan = StagingPlan::build(args, 1024);
    REQUIRE(test::prepare_for(strategy, mock, *plan, stats).ok());
    const auto journal = mock.journal();
    REQUIRE(journal.size() == 1);
    CHECK(journal[0].bytes == 2048);
    CHECK(stats.alignment_retries == 0);
    CHECK(stats.retained_bytes == 2048);
    CHECK(strategy.base() == journal[0].pointer);
    REQUIRE(strategy.release_retained(mock, stats).ok());
}
