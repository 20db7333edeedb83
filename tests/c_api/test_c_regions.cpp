// SPDX-License-Identifier: Apache-2.0
// Regions through the C interface: a stager's and a pinned pool's regions listed, described and
// registered once through C hooks (a function and a context each) — through grows, a release,
// hooks set again and the destroy — and regions made with create_region in background threads
// (progress, ready, wait, cancel, slices).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "c_support.hpp"
#include "devstage/c/devstage.h"

using namespace devstage::c_test;  // NOLINT(google-build-using-namespace): the shared helpers

namespace {

// What an engine registered: the live regions by id, and the calls.
struct Engine {
    std::map<std::uint64_t, devstage_region> live;
    std::size_t added = 0, removed = 0, errors = 0;

    static devstage_status on_added(void* context, const devstage_region* region) {
        auto* engine = static_cast<Engine*>(context);
        ++engine->added;
        if (!engine->live.emplace(region->id, *region).second) ++engine->errors;
        return DEVSTAGE_OK;
    }
    static void on_removing(void* context, const devstage_region* region) {
        auto* engine = static_cast<Engine*>(context);
        ++engine->removed;
        if (engine->live.erase(region->id) != 1) ++engine->errors;
    }
    devstage_region_hooks hooks() { return devstage_region_hooks{&on_added, this, &on_removing, this}; }
};

std::vector<devstage_region> stager_regions(devstage_stager* stager) {
    std::size_t count = 0;
    C_OK(devstage_stager_regions(stager, nullptr, 0, &count));
    std::vector<devstage_region> regions(count);
    std::size_t again = 0;
    C_OK(devstage_stager_regions(stager, regions.data(), regions.size(), &again));
    CHECK(again == count);
    return regions;
}

}  // namespace

TEST_CASE("c regions: a stager's hooks are called once per region, at grows, release and destroy", "[c_regions]") {
    Backend backend = sim();
    devstage_stager_config config{};
    config.pack_limit = DEVSTAGE_PACK_LIMIT_4K;
    Stager stager = stager_of(backend.get(), &config);
    Engine engine;
    const devstage_region_hooks hooks = engine.hooks();
    C_OK(devstage_stager_set_region_hooks(stager.get(), &hooks));
    CHECK(engine.added == 0);

    const devstage_tensor_shape shapes[] = {{16384, DEVSTAGE_IN, nullptr}, {512, DEVSTAGE_OUT, nullptr}};
    devstage_frame* frame = nullptr;
    C_OK(devstage_frame_create(stager.get(), shapes, 2, &frame));
    const std::vector<devstage_region> regions = stager_regions(stager.get());
    REQUIRE(regions.size() == 2);  // the slot's buffer and its mirror
    CHECK(engine.added == 2);
    std::uint64_t mirror = 0;
    for (const devstage_region& region : regions) {
        if (region.kind == DEVSTAGE_REGION_PINNED_HOST) mirror = region.id;
        if (region.kind == DEVSTAGE_REGION_DEVICE) CHECK(region.device == 0);
    }
    REQUIRE(mirror != 0);
    // The frame's tensors are named (region, offset, bytes) in the mirror.
    for (std::size_t i = 0; i < 2; ++i) {
        void* data = nullptr;
        std::size_t bytes = 0;
        C_OK(devstage_frame_host(frame, i, &data, &bytes));
        devstage_region_slice slice{};
        C_OK(devstage_stager_describe(stager.get(), data, &slice));
        CHECK(slice.region == mirror);
        CHECK(static_cast<unsigned char*>(engine.live.at(mirror).base) + slice.offset == data);
        CHECK(slice.bytes >= bytes);
    }
    devstage_run* run = nullptr;
    C_OK(devstage_bind_frame(stager.get(), frame, &run));
    void* device_args[2] = {};
    C_OK(devstage_run_device_args(run, device_args, 2));
    devstage_region_slice on_device{};
    C_OK(devstage_stager_describe(stager.get(), device_args[0], &on_device));
    CHECK(engine.live.at(on_device.region).kind == DEVSTAGE_REGION_DEVICE);
    C_OK(devstage_finish(stager.get(), run, DEVSTAGE_OK));
    C_OK(devstage_frame_destroy(frame));

    // reserve grows the buffer and the mirror: each old region removed, each new one added.
    C_OK(devstage_stager_reserve(stager.get(), std::size_t{1} << 20));
    CHECK(engine.added == 4);
    CHECK(engine.removed == 2);
    CHECK(engine.live.size() == 2);

    // Hooks set again: the new ones get every region, the old ones let go of each.
    Engine next;
    const devstage_region_hooks next_hooks = next.hooks();
    C_OK(devstage_stager_set_region_hooks(stager.get(), &next_hooks));
    CHECK(engine.live.empty());
    CHECK(next.live.size() == 2);

    C_OK(devstage_stager_release(stager.get()));
    CHECK(next.live.empty());
    CHECK(stager_regions(stager.get()).empty());

    C_OK(devstage_stager_reserve(stager.get(), 4096));
    CHECK(next.live.size() == 2);
    stager.reset();  // the destroy removes what is left
    CHECK(next.live.empty());
    CHECK(engine.errors + next.errors == 0);
}

TEST_CASE("c regions: a refused region fails the bind; the stager goes on", "[c_regions]") {
    Backend backend = sim();
    Stager stager = stager_of(backend.get());
    struct Refuser {
        int refusals = 1;
        static devstage_status added(void* context, const devstage_region*) {
            auto* self = static_cast<Refuser*>(context);
            if (self->refusals == 0) return DEVSTAGE_OK;
            --self->refusals;
            return DEVSTAGE_OUT_OF_MEMORY;
        }
    } refuser;
    const devstage_region_hooks hooks{&Refuser::added, &refuser, nullptr, nullptr};
    C_OK(devstage_stager_set_region_hooks(stager.get(), &hooks));
    Tensors t(100);
    devstage_run* run = nullptr;
    const std::vector<devstage_tensor_arg> args = t.args();
    CHECK(devstage_bind(stager.get(), args.data(), args.size(), &run) == DEVSTAGE_OUT_OF_MEMORY);
    CHECK(last().find("the added hook returned 1") != std::string::npos);
    CHECK(run == nullptr);
    CHECK(stager_regions(stager.get()).empty());
    C_OK(run_once(backend.get(), stager.get(), t));
    CHECK(t.expected());
    CHECK(stager_regions(stager.get()).size() == 1);
}

TEST_CASE("c regions: a pool's region made in background threads, described, hooked and freed", "[c_regions]") {
    Backend backend = sim();
    devstage_pinned_pool* raw = nullptr;
    C_OK(devstage_pinned_pool_create(backend.get(), 0, &raw));
    Pool pool(raw);
    Engine engine;
    const devstage_region_hooks hooks = engine.hooks();
    C_OK(devstage_pinned_pool_set_region_hooks(pool.get(), &hooks));

    devstage_pinned_region* region = nullptr;
    C_OK(devstage_pinned_region_create(pool.get(), std::size_t{8} << 20, 2, &region));
    devstage_region_progress progress{};
    C_OK(devstage_pinned_region_progress(region, &progress));
    CHECK(progress.bytes_total >= (std::size_t{8} << 20));
    CHECK(progress.bytes_registered <= progress.bytes_total);
    C_OK(devstage_pinned_region_wait(region));
    int ready = 0;
    C_OK(devstage_pinned_region_ready(region, &ready));
    CHECK(ready == 1);
    C_OK(devstage_pinned_region_progress(region, &progress));
    CHECK(progress.state == DEVSTAGE_REGION_READY);
    CHECK(progress.bytes_registered == progress.bytes_total);

    std::uint64_t id = 0;
    void* base = nullptr;
    std::size_t bytes = 0;
    C_OK(devstage_pinned_region_info(region, &id, &base, &bytes));
    CHECK(bytes == (std::size_t{8} << 20));
    CHECK(engine.live.count(id) == 1);  // added once registered, before any slice
    std::size_t count = 0;
    C_OK(devstage_pinned_pool_regions(pool.get(), nullptr, 0, &count));
    CHECK(count == 1);

    void* slice = nullptr;
    C_OK(devstage_pinned_region_allocate(region, 4096, 4096, &slice));
    devstage_region_slice described{};
    C_OK(devstage_pinned_pool_describe(pool.get(), slice, &described));
    CHECK(described.region == id);
    CHECK(static_cast<unsigned char*>(base) + described.offset == slice);
    CHECK(devstage_pinned_region_cancel(region) == DEVSTAGE_INVALID_ARGUMENT);  // ready already

    C_OK(devstage_pinned_region_free(region, slice));
    CHECK(devstage_pinned_region_free(region, slice) == DEVSTAGE_UNKNOWN_POINTER);  // once only
    C_OK(devstage_pinned_region_destroy(region));  // no slice left: the region goes, removing first
    CHECK(engine.live.empty());
    CHECK(engine.removed == 1);

    C_OK(devstage_pinned_region_create(pool.get(), std::size_t{1} << 20, 0, &region));
    CHECK(engine.live.size() == 1);
    C_OK(devstage_pinned_region_destroy(region));
    pool.reset();
    CHECK(engine.live.empty());
    CHECK(engine.added == engine.removed);
    CHECK(engine.errors == 0);
}

TEST_CASE("c regions: a registration cancelled, and one refused by the hook, leave nothing", "[c_regions]") {
    Backend backend = sim();
    devstage_pinned_pool* raw = nullptr;
    C_OK(devstage_pinned_pool_create(backend.get(), 0, &raw));
    Pool pool(raw);
    devstage_pinned_region* region = nullptr;
    C_OK(devstage_pinned_region_create(pool.get(), std::size_t{64} << 20, 1, &region));
    const devstage_status cancelled = devstage_pinned_region_cancel(region);
    int ready = 0;
    const devstage_status state = devstage_pinned_region_ready(region, &ready);
    if (cancelled == DEVSTAGE_OK) {
        CHECK(state != DEVSTAGE_OK);  // rolled back: ready() says why
        devstage_region_progress progress{};
        C_OK(devstage_pinned_region_progress(region, &progress));
        CHECK(progress.state == DEVSTAGE_REGION_CANCELLED);
        CHECK(progress.bytes_registered == 0);
    } else {
        CHECK(cancelled == DEVSTAGE_INVALID_ARGUMENT);  // it was ready before the cancel came
        CHECK(ready == 1);
    }
    C_OK(devstage_pinned_region_destroy(region));

    struct Refuser {
        static devstage_status added(void*, const devstage_region*) { return DEVSTAGE_NOT_SUPPORTED; }
    };
    const devstage_region_hooks hooks{&Refuser::added, nullptr, nullptr, nullptr};
    C_OK(devstage_pinned_pool_set_region_hooks(pool.get(), &hooks));  // no region yet: nothing to refuse
    C_OK(devstage_pinned_region_create(pool.get(), std::size_t{1} << 20, 0, &region));
    CHECK(devstage_pinned_region_wait(region) == DEVSTAGE_NOT_SUPPORTED);
    C_OK(devstage_pinned_region_destroy(region));
    std::size_t count = 1;
    C_OK(devstage_pinned_pool_regions(pool.get(), nullptr, 0, &count));
    CHECK(count == 0);
    devstage_pinned_stats stats{};
    C_OK(devstage_pinned_pool_stats(pool.get(), &stats));
    CHECK(stats.live_bytes == 0);
}
