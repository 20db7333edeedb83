// SPDX-License-Identifier: Apache-2.0
// The strategy interface (strategy/concept.hpp): everything the Stager asks of a strategy is a
// named requirement, and a strategy missing any one of them is not a strategy of that kind
// (negative tests, one requirement at a time); the library's strategies and a user-written one
// model what they claim; the slice a retained strategy's buffer gives a planned tensor.
#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/strategy/retained_vmm.hpp"
#include "user_strategy.hpp"

using namespace devstage;

namespace {

// Each requirement of the concepts, and a strategy that lacks exactly that one.
enum class Lacks {
    nothing,
    alignment,
    lease_kind,
    prepare,
    release_retained,
    abandon,
    capacity,
    base,
    acquire,
    mirror,
    mirror_capacity,
    mirror_device,
    device_need,
    packing
};

template <Lacks L, ReleaseKind Kind = ReleaseKind::BufferNoop>
struct Partial {
    static constexpr std::size_t alignment = L == Lacks::alignment ? 3 : 256;  // 3: not a power of two
    static constexpr ReleaseKind lease_kind = L == Lacks::lease_kind ? ReleaseKind::ExternalNoop : Kind;
    using packing = std::conditional_t<L == Lacks::packing, void, PackSmall<512>>;

    template <class B>
    Status prepare(B&, const Requirement&, StagerStats&, FreeQueue<B>&) noexcept requires(L != Lacks::prepare) {
        return {};
    }
    template <class B>
    Status release_retained(B&, StagerStats&) noexcept requires(L != Lacks::release_retained) {
        return {};
    }
    void abandon(StagerStats&) noexcept requires(L != Lacks::abandon) {}
    template <class B>
    Status acquire(B&, const PlannedTensor&, const TensorArg&, TensorLease&, StagerStats&) noexcept
        requires(L != Lacks::acquire) {
        return {};
    }
    std::size_t capacity() const noexcept requires(L != Lacks::capacity) { return 0; }
    void* base() const noexcept requires(L != Lacks::base) { return nullptr; }
    std::byte* mirror() const noexcept requires(L != Lacks::mirror) { return nullptr; }
    std::size_t mirror_capacity() const noexcept requires(L != Lacks::mirror_capacity) { return 0; }
    void* mirror_device() const noexcept requires(L != Lacks::mirror_device) { return nullptr; }
    std::size_t device_need(const Requirement& r) const noexcept requires(L != Lacks::device_need) {
        return r.device_bytes;
    }
};

using B = MockBackend;

}  // namespace

TEST_CASE("strategy concept: a strategy missing one requirement is refused", "[strategy_concept]") {
    STATIC_REQUIRE(StagingStrategy<Partial<Lacks::nothing>, B>);
    STATIC_REQUIRE(RetainedStrategy<Partial<Lacks::nothing>, B>);
    STATIC_REQUIRE(MirroredStrategy<Partial<Lacks::nothing>, B>);
    STATIC_REQUIRE_FALSE(StagingStrategy<Partial<Lacks::alignment>, B>);
    STATIC_REQUIRE_FALSE(StagingStrategy<Partial<Lacks::lease_kind>, B>);
    STATIC_REQUIRE_FALSE(StagingStrategy<Partial<Lacks::prepare>, B>);
    STATIC_REQUIRE_FALSE(StagingStrategy<Partial<Lacks::release_retained>, B>);
    STATIC_REQUIRE_FALSE(StagingStrategy<Partial<Lacks::abandon>, B>);
    STATIC_REQUIRE_FALSE(StagingStrategy<Partial<Lacks::capacity>, B>);
    STATIC_REQUIRE_FALSE(StagingStrategy<Partial<Lacks::base>, B>);
    // A retained strategy needs no acquire (the Stager cuts its slices by the layout rule)...
    STATIC_REQUIRE(RetainedStrategy<Partial<Lacks::acquire>, B>);
    // ... one that allocates per tensor does.
    STATIC_REQUIRE(AllocatingStrategy<Partial<Lacks::nothing, ReleaseKind::Free>, B>);
    STATIC_REQUIRE_FALSE(AllocatingStrategy<Partial<Lacks::acquire, ReleaseKind::Free>, B>);
    STATIC_REQUIRE_FALSE(RetainedStrategy<Partial<Lacks::nothing, ReleaseKind::Free>, B>);
    // A mirror, its device address, the device need and the packing defaults: each is needed to pack.
    STATIC_REQUIRE(RetainedStrategy<Partial<Lacks::mirror>, B>);
    STATIC_REQUIRE_FALSE(MirroredStrategy<Partial<Lacks::mirror>, B>);
    STATIC_REQUIRE_FALSE(MirroredStrategy<Partial<Lacks::mirror_capacity>, B>);
    STATIC_REQUIRE_FALSE(MirroredStrategy<Partial<Lacks::mirror_device>, B>);
    STATIC_REQUIRE_FALSE(MirroredStrategy<Partial<Lacks::device_need>, B>);
    STATIC_REQUIRE_FALSE(MirroredStrategy<Partial<Lacks::packing>, B>);
    // The defaults a stager takes from a strategy are what its concept members say.
    STATIC_REQUIRE(detail::pack_limit_of<Partial<Lacks::nothing>>() == 512);
    STATIC_REQUIRE(detail::pack_limit_of<Partial<Lacks::mirror>>() == 0);
    STATIC_REQUIRE_FALSE(detail::maps_of<Partial<Lacks::nothing>>());
}

TEST_CASE("strategy concept: the library's strategies and a user-written one model what they claim",
          "[strategy_concept]") {
    STATIC_REQUIRE(MirroredStrategy<RetainedBump<>, MockBackend>);
    STATIC_REQUIRE(MirroredStrategy<RetainedBump<GrowthRule, 256, MapSmall<1024>>, SimBackend>);
    STATIC_REQUIRE(RetainedStrategy<RetainedVmm<>, SimBackend>);
    STATIC_REQUIRE_FALSE(MirroredStrategy<RetainedVmm<>, SimBackend>);
    STATIC_REQUIRE(AllocatingStrategy<PerTensorMalloc<>, MockBackend>);
    STATIC_REQUIRE_FALSE(RetainedStrategy<PerTensorMalloc<>, MockBackend>);
    STATIC_REQUIRE(MirroredStrategy<test::FreeFirstArena<>, MockBackend>);
    STATIC_REQUIRE(strategy_requires::growth_rule<RetainedBump<GrowthRule>>);
    STATIC_REQUIRE_FALSE(strategy_requires::growth_rule<RetainedBump<>>);
    STATIC_REQUIRE(strategy_requires::grow_order<RetainedBump<>>);
    STATIC_REQUIRE(detail::pack_limit_of<RetainedBump<ExactGrowth, 1024, PackSmall<16384>>>() == 16384);
    STATIC_REQUIRE(detail::maps_of<RetainedBump<ExactGrowth, 1024, MapSmall<8192>>>());
    STATIC_REQUIRE(detail::pack_limit_of<RetainedVmm<>>() == 0);
}

TEST_CASE("strategy concept: slice() gives a retained buffer's slice, and refuses one outside it",
          "[strategy_concept]") {
    MockBackend mock;
    SimBackend sim;
    StagerStats stats;
    RetainedVmm<> empty;  // nothing reserved yet
    std::vector<std::byte> host(64);
    const TensorArg arg{host.data(), 64, Direction::In};
    TensorLease lease{};
    const Status miss = slice(empty, sim, PlannedTensor{0, 0, 64}, arg, lease);
    CHECK(miss.code() == Errc::invalid_argument);
    CHECK_THAT(miss.message(), Catch::Contains("slice miss") && Catch::Contains("capacity 0"));
    RetainedBump<> bump;
    FreeQueue<MockBackend> queue(mock, stats);
    REQUIRE(bump.prepare(mock, Requirement{4096}, stats, queue).ok());
    REQUIRE(slice(bump, mock, PlannedTensor{0, 1024, 64}, arg, lease).ok());
    CHECK(lease.device == static_cast<std::byte*>(bump.base()) + 1024);
    CHECK(lease.release_kind == ReleaseKind::BufferNoop);
    CHECK(lease.upload);
    CHECK_FALSE(lease.copy_back);
    CHECK(slice(bump, mock, PlannedTensor{0, 4096 - 63, 64}, arg, lease).code() == Errc::invalid_argument);
    REQUIRE(bump.release_retained(mock, stats).ok());
    CHECK(mock.misuses() == 0);
}
