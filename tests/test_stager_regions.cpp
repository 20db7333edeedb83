// SPDX-License-Identifier: Apache-2.0
// A Stager's regions (stager.hpp, detail/stager/regions.hpp): its retained device buffers and
// pinned mirrors listed, described and registered once through the hooks — added before anything
// lands in them, removing before they are freed, moved, released, detached, abandoned or left
// by the destructor — and an added hook that fails fails the grow and leaks nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "async_support.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/pinned.hpp"
#include "devstage/pinned/mirror_source.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_vmm.hpp"
#include "support.hpp"

using namespace devstage;

namespace {
using PackedBump = RetainedBump<ExactGrowth, 1024, PackSmall<4096>>;

/// Counts every hook call and keeps the registered set; a second add of one id, a removal of an
/// unknown id, or a removal of device memory that is no longer allocated is recorded as an error.
struct Registry {
    MockBackend* mock = nullptr;
    std::map<std::uint64_t, PinnedRegion> live;
    std::size_t added = 0, removed = 0, errors = 0;
    std::optional<Errc> refuse;  // the next added fails with it

    RegionHooks hooks() {
        return RegionHooks{
            .added = [this](const PinnedRegion& region) -> Status {
                if (refuse) {
                    const Errc code = *refuse;
                    refuse.reset();
                    return Status(code, "the engine refused it");
                }
                ++added;
                if (!live.emplace(region.id, region).second) ++errors;
                if (mock != nullptr && region.kind == RegionKind::device &&
                    !mock->is_device(region.base, region.bytes)) {
                    ++errors;
                }
                return {};
            },
            .removing =
                [this](const PinnedRegion& region) {
                    ++removed;
                    if (live.erase(region.id) != 1) ++errors;
                    // Before the free: the memory is still the device's, deferred or not.
                    if (mock != nullptr && region.kind == RegionKind::device &&
                        !mock->is_device(region.base, region.bytes)) {
                        ++errors;
                    }
                },
        };
    }
};

std::size_t count(const std::vector<PinnedRegion>& regions, RegionKind kind) {
    std::size_t n = 0;
    for (const PinnedRegion& region : regions) n += region.kind == kind ? 1 : 0;
    return n;
}

test::HostRun run_of(std::size_t large, std::size_t small) {
    test::HostRun host;
    host.add(large, Direction::In, 1);
    host.add(small, Direction::InOut, 2);
    return host;
}
}  // namespace

TEST_CASE("stager regions: every buffer and mirror is listed and hooked once, through grows and release",
          "[stager][regions]") {
    MockBackend mock;
    Registry registry;
    registry.mock = &mock;
    {
        Stager<MockBackend, PackedBump> stager(mock, {}, StagerOptions{.pipeline_slots = 2});
        CHECK(stager.regions().empty());
        REQUIRE(stager.set_region_hooks(registry.hooks()).ok());
        CHECK(registry.added == 0);

        test::HostRun host = run_of(20000, 1000);
        auto run = stager.bind(host.args);
        REQUIRE(run.ok());
        std::vector<PinnedRegion> regions = stager.regions();
        REQUIRE(regions.size() == 2);  // one slot used: its buffer and its mirror
        CHECK(count(regions, RegionKind::device) == 1);
        CHECK(count(regions, RegionKind::pinned_host) == 1);
        CHECK(registry.added == 2);
        CHECK(registry.live.size() == 2);
        // Every device arg lies in the listed device buffer, at the offset it has there.
        for (const TensorArg& arg : run->device_args()) {
            const std::optional<RegionSlice> slice = stager.describe(arg.data);
            REQUIRE(slice.has_value());
            const PinnedRegion& region = registry.live.at(slice->region);
            CHECK(static_cast<std::byte*>(region.base) + slice->offset == arg.data);
            CHECK(slice->offset + slice->bytes == region.bytes);
        }
        REQUIRE(stager.finish(std::move(*run)).ok());

        // The same run again: no hook call.
        auto again = stager.bind_slot(0, host.args);
        REQUIRE(again.ok());
        REQUIRE(stager.finish(std::move(*again)).ok());
        CHECK(registry.added == 2);
        CHECK(registry.removed == 0);

        // A bigger run grows the device buffer: the old one removed before it is freed, the new
        // one added; the mirror stays.
        test::HostRun bigger = run_of(90000, 1000);
        auto grown = stager.bind_slot(0, bigger.args);
        REQUIRE(grown.ok());
        REQUIRE(stager.finish(std::move(*grown)).ok());
        CHECK(registry.added == 3);
        CHECK(registry.removed == 1);
        CHECK(registry.live.size() == 2);

        // reserve grows every slot and mirror: each old region removed, each new one added.
        REQUIRE(stager.reserve(200000).ok());
        CHECK(stager.regions().size() == 4);
        CHECK(registry.live.size() == 4);
        for (const PinnedRegion& region : stager.regions()) CHECK(registry.live.count(region.id) == 1);

        REQUIRE(stager.release().ok());
        CHECK(stager.regions().empty());
        CHECK(registry.live.empty());
        CHECK(registry.added == registry.removed);

        auto after = stager.bind(host.args);  // listed anew after a release
        REQUIRE(after.ok());
        REQUIRE(stager.finish(std::move(*after)).ok());
        CHECK(registry.live.size() == 2);
    }
    CHECK(registry.live.empty());  // the destructor removed what was left
    CHECK(registry.added == registry.removed);
    CHECK(registry.errors == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("stager regions: a frame's tensors are described in its mirror region", "[stager][regions][frame]") {
    MockBackend mock;
    Stager<MockBackend, PackedBump> stager(mock);
    const TensorShape shapes[] = {{8192, Direction::In}, {128, Direction::In}, {256, Direction::Out}};
    auto frame = stager.frame(shapes);
    REQUIRE(frame.ok());
    const std::vector<PinnedRegion> regions = stager.regions();
    std::optional<PinnedRegion> mirror;
    for (const PinnedRegion& region : regions) {
        if (region.kind == RegionKind::pinned_host) mirror = region;
    }
    REQUIRE(mirror.has_value());
    for (std::size_t i = 0; i < frame->size(); ++i) {
        const std::optional<RegionSlice> slice = stager.describe(frame->host(i).data());
        REQUIRE(slice.has_value());
        CHECK(slice->region == mirror->id);
        CHECK(static_cast<std::byte*>(mirror->base) + slice->offset == frame->host(i).data());
    }
    int other = 0;
    CHECK_FALSE(stager.describe(&other).has_value());
    CHECK_FALSE(stager.describe(nullptr).has_value());
}

TEST_CASE("stager regions: a device buffer carries the backend's device id", "[stager][regions]") {
    SimBackend sim(SimConfig{.device = 3});
    Stager<SimBackend> stager(sim);
    test::HostRun host = run_of(5000, 100);
    auto run = stager.bind(host.args);
    REQUIRE(run.ok());
    const std::vector<PinnedRegion> regions = stager.regions();
    REQUIRE(regions.size() == 1);
    CHECK(regions[0].kind == RegionKind::device);
    CHECK(regions[0].device == 3);
    CHECK(regions[0].bytes == stager.strategy().capacity());
    REQUIRE(stager.finish(std::move(*run)).ok());
}

TEST_CASE("stager regions: a per-tensor stager has none", "[stager][regions]") {
    MockBackend mock;
    Stager<MockBackend, PerTensorMalloc<>> stager(mock);
    test::HostRun host = run_of(5000, 100);
    auto run = stager.bind(host.args);
    REQUIRE(run.ok());
    CHECK(stager.regions().empty());
    CHECK_FALSE(stager.describe(run->device_args()[0].data).has_value());
    REQUIRE(stager.finish(std::move(*run)).ok());
}

TEST_CASE("stager regions: a grow under pending work removes the old buffer before its deferred free",
          "[stager][regions][deferred]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    Registry registry;
    registry.mock = &mock;
    {
        Stager<MockBackend> stager(mock);
        REQUIRE(stager.set_region_hooks(registry.hooks()).ok());
        test::HostRun small = run_of(3000, 100), large = run_of(300000, 100);
        auto first = stager.bind(small.args, stream);
        REQUIRE(first.ok());
        Result<Completion> one = stager.finish(std::move(*first), stream);
        REQUIRE(one.ok());
        CHECK(registry.added == 1);
        auto second = stager.bind(large.args, stream);  // grows under the first run's pending work
        REQUIRE(second.ok());
        CHECK(stager.stats().deferred_frees == 1);
        CHECK(registry.removed == 1);  // removed while its memory still stands (checked in the hook)
        CHECK(registry.added == 2);
        Result<Completion> two = stager.finish(std::move(*second), stream);
        REQUIRE(two.ok());
        REQUIRE(two->wait().ok());
        REQUIRE(one->wait().ok());
    }
    CHECK(registry.live.empty());
    CHECK(registry.errors == 0);
    CHECK(mock.misuses() == 0);
    CHECK(mock.live_device_allocations() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("stager regions: an added hook that fails fails the grow; the stager stays usable and leaks nothing",
          "[stager][regions][faults]") {
    MockBackend mock;
    Registry registry;
    registry.mock = &mock;
    {
        Stager<MockBackend> stager(mock);
        REQUIRE(stager.set_region_hooks(registry.hooks()).ok());
        registry.refuse = Errc::backend_failure;
        test::HostRun host = run_of(5000, 100);
        auto refused = stager.bind(host.args);
        REQUIRE_FALSE(refused.ok());
        CHECK(refused.status().code() == Errc::backend_failure);
        CHECK_THAT(refused.status().message(), Catch::Contains("the engine refused it") &&
                                                   Catch::Contains("retained device buffer") &&
                                                   Catch::Contains("mock"));
        CHECK(stager.regions().empty());  // the slot keeps the buffer, listed by no region
        CHECK(stager.live_runs() == 0);

        auto retried = stager.bind(host.args);  // the next grow lists it again
        REQUIRE(retried.ok());
        CHECK(stager.regions().size() == 1);
        CHECK(registry.added == 1);
        REQUIRE(stager.finish(std::move(*retried)).ok());
    }
    CHECK(registry.live.empty());
    CHECK(registry.errors == 0);
    CHECK(mock.live_device_allocations() == 0);
}

TEST_CASE("stager regions: hooks set again move every region; a refusal keeps the old hooks",
          "[stager][regions][hooks]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink});  // abandon leaves the memory to it
    Registry first, second, third;
    first.mock = second.mock = third.mock = &mock;
    Stager<MockBackend, PackedBump> stager(mock, {}, StagerOptions{.pipeline_slots = 2});
    REQUIRE(stager.reserve(10000).ok());
    REQUIRE(stager.regions().size() == 4);
    REQUIRE(stager.set_region_hooks(first.hooks()).ok());  // added at once for every live region
    CHECK(first.added == 4);

    RegionHooks hooks = third.hooks();
    std::size_t calls = 0;
    hooks.added = [&calls, inner = hooks.added](const PinnedRegion& region) -> Status {
        // Accepts two, then refuses.
        if (++calls == 3) return Status(Errc::invalid_argument, "no more");
        return inner(region);
    };
    const Status failed = stager.set_region_hooks(hooks);
    CHECK(failed.code() == Errc::invalid_argument);
    CHECK_THAT(failed.message(), Catch::Contains("no more") && Catch::Contains("old hooks stay"));
    CHECK(third.added == 2);
    CHECK(third.removed == 2);  // what it accepted was undone
    CHECK(first.live.size() == 4);
    CHECK(first.removed == 0);

    REQUIRE(stager.set_region_hooks(second.hooks()).ok());
    CHECK(first.live.empty());
    CHECK(second.live.size() == 4);

    stager.abandon();  // forgotten: removing for each (the memory is not freed by the stager)
    CHECK(second.live.empty());
    CHECK(stager.regions().empty());
    CHECK(first.errors + second.errors + third.errors == 0);
}

TEST_CASE("stager regions: adopt lists the buffer, detach removes it before handing it over", "[stager][regions]") {
    MockBackend mock;
    Registry registry;
    registry.mock = &mock;
    Stager<MockBackend> stager(mock);
    REQUIRE(stager.set_region_hooks(registry.hooks()).ok());
    Result<void*> memory = mock.device_malloc(8192);
    REQUIRE(memory.ok());
    REQUIRE(stager.adopt(0, *memory, 8192).ok());
    CHECK(registry.added == 1);
    REQUIRE(stager.describe(*memory).has_value());
    Result<RetainedBuffer> detached = stager.detach(0);
    REQUIRE(detached.ok());
    CHECK(registry.removed == 1);
    CHECK(stager.regions().empty());
    CHECK_FALSE(stager.describe(*memory).has_value());
    REQUIRE(mock.device_free(detached->allocation).ok());
    CHECK(registry.errors == 0);
}

TEST_CASE("stager regions: mirrors and frames carved out of a pool's region are described by the pool",
          "[stager][regions][mirror_source]") {
    MockBackend mock;
    Registry pool_engine;
    Registry stager_engine;
    stager_engine.mock = &mock;
    {
        PinnedHostPool<MockBackend> pool(mock);
        REQUIRE(pool.set_region_hooks(pool_engine.hooks()).ok());
        Result<PinnedRegionHandle> region = pool.create_region(std::size_t{4} << 20);
        REQUIRE(region.ok());
        REQUIRE(region->wait().ok());
        REQUIRE(pool_engine.live.size() == 1);  // registered once, before the stager takes anything
        const std::uint64_t pinned_calls = mock.calls(MockOp::pinned_malloc);
        {
            Stager<MockBackend, PackedBump> stager(
                mock, {}, StagerOptions{.pipeline_slots = 2, .mirror_source = mirror_source(region->allocator())});
            REQUIRE(stager.status().ok());
            REQUIRE(stager.set_region_hooks(stager_engine.hooks()).ok());
            const TensorShape shapes[] = {{65536, Direction::In}, {128, Direction::In}, {4096, Direction::Out}};
            auto frame = stager.frame(shapes);
            REQUIRE(frame.ok());
            CHECK(mock.calls(MockOp::pinned_malloc) == pinned_calls);  // no pinned memory of the backend's own
            for (std::size_t i = 0; i < frame->size(); ++i) {
                const std::optional<RegionSlice> slice = pool.describe(frame->host(i).data());
                REQUIRE(slice.has_value());
                CHECK(slice->region == region->id());
                CHECK(static_cast<std::byte*>(region->data()) + slice->offset == frame->host(i).data());
                CHECK_FALSE(stager.describe(frame->host(i).data()).has_value());  // the pool's, not the stager's
            }
            // The stager lists its device buffer only: the mirror lies in the pool's region.
            const std::vector<PinnedRegion> regions = stager.regions();
            REQUIRE(regions.size() == 1);
            CHECK(regions[0].kind == RegionKind::device);
            CHECK(pool_engine.live.size() == 1);  // nothing new to register for the mirror

            test::HostRun host;
            for (std::size_t i = 0; i < frame->size(); ++i) {
                host.add(frame->args()[i].bytes, frame->args()[i].direction, static_cast<std::uint32_t>(7 + i));
                if (frame->args()[i].direction != Direction::Out) {
                    std::copy(host.buffers[i].begin(), host.buffers[i].end(), frame->host(i).begin());
                }
            }
            std::fill(frame->host(2).begin(), frame->host(2).end(), std::byte{0xFF});
            auto run = stager.bind(*frame);
            REQUIRE(run.ok());
            REQUIRE(stager.finish(std::move(*run)).ok());
            // The Out tensor came back into the region (zeroed on the device: no kernel wrote it).
            CHECK(std::all_of(frame->host(2).begin(), frame->host(2).end(),
                              [](std::byte b) { return b == std::byte{0}; }));
            frame = Status(Errc::invalid_argument, "dropped");

            REQUIRE(stager.reserve(std::size_t{1} << 20).ok());  // both mirrors now in the region
            CHECK(stager.stats().mirror_bytes >= (std::size_t{2} << 20));
            Result<void*> too_big = region->allocator().allocate(std::size_t{3} << 20, 4096);
            CHECK(too_big.status().code() == Errc::out_of_memory);  // the mirrors hold 2 MiB of it
            REQUIRE(stager.release().ok());                         // the mirrors go back to the region
            CHECK(stager.stats().mirror_bytes == 0);
            Result<void*> whole = region->allocator().allocate(std::size_t{3} << 20, 4096);
            REQUIRE(whole.ok());
            REQUIRE(region->allocator().deallocate(*whole).ok());
        }
        CHECK(stager_engine.live.empty());
        region->reset();
    }
    CHECK(pool_engine.live.empty());
    CHECK(pool_engine.errors + stager_engine.errors == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("stager regions: mirrors from the pool itself; a source without packing is refused",
          "[stager][regions][mirror_source]") {
    MockBackend mock;
    PinnedHostPool<MockBackend> pool(mock);
    {
        Stager<MockBackend, PackedBump> stager(mock, {}, StagerOptions{.mirror_source = mirror_source(pool)});
        test::HostRun host = run_of(20000, 1000);
        auto run = stager.bind(host.args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
        REQUIRE(stager.strategy().mirror() != nullptr);
        CHECK(pool.describe(stager.strategy().mirror()).has_value());
        CHECK(pool.stats().live_allocations == 1);
        REQUIRE(stager.release().ok());
        CHECK(pool.stats().live_allocations == 0);
    }
    {
        // Mapped small args: the mirror from the pool is mapped as the backend's own would be.
        Stager<MockBackend, PackedBump> mapped(mock, {},
                                               StagerOptions{.map_small = true, .mirror_source = mirror_source(pool)});
        test::HostRun host = run_of(20000, 1000);
        auto run = mapped.bind(host.args);
        REQUIRE(run.ok());
        REQUIRE(mapped.finish(std::move(*run)).ok());
        CHECK(mapped.stats().host_maps + mapped.stats().map_failures == 1);
        INFO("host_maps " << mapped.stats().host_maps);
        CHECK(mapped.stats().host_maps == 1);  // the mock maps pool memory as any pinned memory
        CHECK(pool.describe(mapped.strategy().mirror()).has_value());
        REQUIRE(mapped.release().ok());
        CHECK(mock.live_mappings() == 0);
    }
    Stager<MockBackend> unpacked(mock, {}, StagerOptions{.mirror_source = mirror_source(pool)});
    CHECK(unpacked.status().code() == Errc::invalid_argument);
    CHECK_THAT(unpacked.status().message(), Catch::Contains("pack limit above 0"));
    Stager<MockBackend, PackedBump> empty(mock, {}, StagerOptions{.mirror_source = MirrorSource{}});
    CHECK(empty.status().code() == Errc::invalid_argument);
    CHECK_THAT(empty.status().message(), Catch::Contains("allocate and deallocate"));
}

TEST_CASE("stager regions: a RetainedVmm reservation is listed as far as it is mapped", "[stager][regions][vmm]") {
    SimBackend sim;
    Registry registry;
    Stager<SimBackend, RetainedVmm<>> stager(sim, RetainedVmm<>(std::size_t{64} << 20));
    REQUIRE(stager.set_region_hooks(registry.hooks()).ok());
    test::HostRun small = run_of(5000, 100);
    auto run = stager.bind(small.args);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    REQUIRE(stager.regions().size() == 1);
    const PinnedRegion first = stager.regions()[0];
    CHECK(first.bytes == stager.strategy().capacity());
    test::HostRun large = run_of(std::size_t{8} << 20, 100);
    auto grown = stager.bind(large.args);
    REQUIRE(grown.ok());
    REQUIRE(stager.finish(std::move(*grown)).ok());
    const PinnedRegion second = stager.regions()[0];
    CHECK(second.base == first.base);   // mapped further in place: the base stays,
    CHECK(second.bytes > first.bytes);  // the region grows as a new one
    CHECK(second.id != first.id);
    CHECK(registry.added == 2);
    CHECK(registry.removed == 1);
    REQUIRE(stager.release().ok());
    CHECK(registry.live.empty());
    CHECK(registry.errors == 0);
}
