// SPDX-License-Identifier: Apache-2.0
// Big pinned memory and regions of a PinnedHostPool (pinned/regions.hpp, pinned/region_handle.hpp,
// region.hpp): exact-size requests pinned in chunks with their over-lock bounded, a chunk that
// fails rolling the whole request back; regions made with create_region — registered in the
// calling thread or in background threads, with progress, ready, wait and cancel, nothing handed
// out before they are registered — carved into buffers and raw slices; every pinned byte listed
// as a region and described as (region, offset, bytes); the region hooks called once per region
// and at its free, and a hook's refusal failing what created the region. And a region of 3 GiB
// on the simulator (DEVSTAGE_TEST_REGION_BYTES lowers it, as CI's valgrind run does).
#include <catch2/catch.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/pinned.hpp"

using namespace devstage;

namespace {

constexpr std::size_t page = 4096;
constexpr std::size_t mib = std::size_t{1} << 20;

// Every region hook call, by region id.
struct HookLog {
    RegionHooks hooks() {
        RegionHooks out;
        out.added = [this](const PinnedRegion& region) {
            std::lock_guard lock(mutex);
            added.push_back(region);
            if (refuse_next) {
                refuse_next = false;
                return Status(Errc::busy, "the engine refuses this region");
            }
            return Status();
        };
        out.removing = [this](const PinnedRegion& region) {
            std::lock_guard lock(mutex);
            removing.push_back(region);
        };
        return out;
    }
    std::size_t times_added(std::uint64_t id) const {
        std::size_t n = 0;
        for (const PinnedRegion& region : added) n += region.id == id;
        return n;
    }
    std::size_t times_removed(std::uint64_t id) const {
        std::size_t n = 0;
        for (const PinnedRegion& region : removing) n += region.id == id;
        return n;
    }
    std::mutex mutex;
    std::vector<PinnedRegion> added, removing;
    bool refuse_next = false;
};

// A mock whose host_register waits for a permit (the test steps a registration chunk by chunk)
// once gated.
class SteppedMock : public MockBackend {
public:
    Status host_register(void* host, std::size_t bytes) noexcept {
        {
            std::unique_lock lock(mutex_);
            ++entered_;
            changed_.notify_all();
            changed_.wait(lock, [this] { return !gated_ || permits_ > 0; });
            if (gated_) --permits_;
        }
        return MockBackend::host_register(host, bytes);
    }
    void gate() {
        std::lock_guard lock(mutex_);
        gated_ = true;
    }
    void permit(int n) {
        std::lock_guard lock(mutex_);
        permits_ += n;
        changed_.notify_all();
    }
    void open() {
        std::lock_guard lock(mutex_);
        gated_ = false;
        changed_.notify_all();
    }
    void wait_for_entries(int n) {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return entered_ >= n; });
    }
    int entries() {
        std::lock_guard lock(mutex_);
        return entered_;
    }

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    bool gated_ = false;
    int permits_ = 0;
    int entered_ = 0;
};

// A PinnedHostBackend without host_register, as ACL is for copies: regions are one pinned_malloc.
class MallocOnly {
public:
    static constexpr std::size_t device_alignment = 64;
    static constexpr std::size_t pinned_malloc_limit = 64 * mib;
    std::string_view name() const noexcept { return "malloc-only"; }
    Result<void*> device_malloc(std::size_t) noexcept { return Status(Errc::not_supported, "no device"); }
    Status device_free(void*) noexcept { return {}; }
    Status copy_to_device(void*, const void*, std::size_t) noexcept { return {}; }
    Status copy_from_device(void*, const void*, std::size_t) noexcept { return {}; }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        void* pointer = std::aligned_alloc(page, (bytes + page - 1) / page * page);
        if (pointer == nullptr) return Status(Errc::out_of_memory, "malloc-only: no memory");
        ++live;
        last_size = bytes;
        return pointer;
    }
    Status pinned_free(void* pointer) noexcept {
        std::free(pointer);
        --live;
        return {};
    }
    int live = 0;
    std::size_t last_size = 0;
};
static_assert(PinnedHostBackend<MallocOnly> && !HostRegisterBackend<MallocOnly>);

std::size_t region_test_bytes() {
    const char* knob = std::getenv("DEVSTAGE_TEST_REGION_BYTES");
    return knob != nullptr ? static_cast<std::size_t>(std::strtoull(knob, nullptr, 10)) : std::size_t{3} << 30;
}

}  // namespace

TEST_CASE("pinned regions: every block the pool holds is a region, told to the hooks once and at its free",
          "[pinned_regions]") {
    MockBackend mock;
    HookLog log;  // outlives the pool, whose destruction may call it
    PinnedHostPool<MockBackend> pool(mock);
    auto early = pool.allocate(1000);  // listed before the hooks are set
    REQUIRE(early.ok());
    REQUIRE(pool.set_region_hooks(log.hooks()).ok());
    REQUIRE(log.added.size() == 1);  // at once, for the live region
    CHECK(log.added[0].base == early->data());
    CHECK(log.added[0].bytes == 1024);  // the block's size class
    CHECK(log.added[0].kind == RegionKind::pinned_host);
    CHECK(log.added[0].numa_node == -1);
    const std::uint64_t first = log.added[0].id;
    for (int round = 0; round < 5; ++round) {
        auto buffer = pool.allocate(3000);  // one block, cached and reused
        REQUIRE(buffer.ok());
    }
    REQUIRE(log.added.size() == 2);  // once per region, not per buffer
    const std::uint64_t reused = log.added[1].id;
    CHECK(log.times_added(reused) == 1);
    CHECK(pool.regions().size() == 2);
    CHECK(pool.stats().regions == 2);
    early->reset();  // cached: still a region
    CHECK(log.removing.empty());
    REQUIRE(pool.trim().ok());  // freed: removing, once each, before pinned_free
    CHECK(log.times_removed(first) == 1);
    CHECK(log.times_removed(reused) == 1);
    CHECK(pool.regions().empty());
}

TEST_CASE("pinned regions: describe names the region, offset and bytes of any pinned pointer of the pool",
          "[pinned_regions]") {
    MockBackend mock;
    PinnedHostPool<MockBackend> pool(mock);
    auto buffer = pool.allocate(3000);
    REQUIRE(buffer.ok());
    const std::vector<PinnedRegion> regions = pool.regions();
    REQUIRE(regions.size() == 1);
    const auto* data = static_cast<const std::byte*>(buffer->data());
    const std::optional<RegionSlice> whole = pool.describe(data);
    REQUIRE(whole);
    CHECK(whole->region == regions[0].id);
    CHECK(whole->offset == static_cast<std::size_t>(data - static_cast<const std::byte*>(regions[0].base)));
    CHECK(whole->bytes == 3000);
    const std::optional<RegionSlice> inside = pool.describe(data + 1000);
    REQUIRE(inside);
    CHECK(inside->offset == whole->offset + 1000);
    CHECK(inside->bytes == 2000);
    // Past the 3000 bytes asked for, inside the block: the rest of the region.
    const std::optional<RegionSlice> slack = pool.describe(data + 3500);
    REQUIRE(slack);
    CHECK(slack->bytes == 4096 - 3500 - whole->offset);
    int local = 0;
    CHECK_FALSE(pool.describe(&local));
    // Container memory, over-aligned inside its block, is described too.
    std::vector<double, PinnedAllocator<double>> values(100, 1.0, PinnedAllocator<double>(pool));
    const std::optional<RegionSlice> container = pool.describe(values.data());
    REQUIRE(container);
    CHECK(container->bytes == 800);
    const void* gone = buffer->data();
    buffer->reset();
    REQUIRE(pool.trim().ok());
    CHECK_FALSE(pool.describe(gone));
}

TEST_CASE("pinned regions: a hook that refuses a new region fails the allocation that made it, nothing kept",
          "[pinned_regions]") {
    MockBackend mock;
    HookLog log;  // outlives the pool, whose destruction may call it
    PinnedHostPool<MockBackend> pool(mock);
    REQUIRE(pool.set_region_hooks(log.hooks()).ok());
    log.refuse_next = true;
    const Result<PinnedBuffer> refused = pool.allocate(5000);
    CHECK(refused.status().code() == Errc::busy);
    CHECK_THAT(std::string(refused.status().message()), Catch::Contains("the engine refuses this region"));
    CHECK(mock.live_pinned_allocations() == 0);  // the block went back
    CHECK(log.removing.empty());                 // never accepted: never removed
    CHECK(pool.regions().empty());
    CHECK(pool.stats().locked_bytes == 0);
    CHECK(pool.stats().backend_allocations == pool.stats().backend_frees);
    auto next = pool.allocate(5000);  // the engine accepts it now
    REQUIRE(next.ok());
    CHECK(pool.regions().size() == 1);
    // set_region_hooks whose `added` refuses a live region: undone, the old hooks stay.
    HookLog picky;
    picky.refuse_next = true;
    const Status replaced = pool.set_region_hooks(picky.hooks());
    CHECK(replaced.code() == Errc::busy);
    CHECK(log.removing.size() == 1);  // the old hooks' removing ran first...
    CHECK(log.added.size() == 3);     // ...and their added again after the refusal
}

TEST_CASE("pinned regions: above the threshold a request is pinned at its exact size, in chunks", "[pinned_regions]") {
    MockBackend mock;
    PinnedHostPool<MockBackend> pool(mock, {},
                                     PinnedPoolOptions{.exact = {.threshold = 4 * mib, .chunk_bytes = 2 * mib}});
    const std::size_t asked = 9 * mib + 123;
    auto big = pool.allocate(asked);
    REQUIRE(big.ok());
    CHECK(mock.live_pinned_allocations() == 0);  // mapped by the pool, not pinned_malloc
    CHECK(mock.live_registrations() == 5);       // 2 + 2 + 2 + 2 + 1 MiB and a page
    const PinnedStats stats = pool.stats();
    CHECK(stats.locked_bytes == 9 * mib + page);  // whole pages, no size class
    CHECK(static_cast<double>(stats.locked_bytes) <= 1.01 * static_cast<double>(stats.live_bytes));
    CHECK(stats.registered_chunks == 5);
    std::memset(big->data(), 0x5A, asked);
    void* const block = big->data();
    big->reset();                            // cached by its exact size
    auto again = pool.allocate(asked - 50);  // the same whole pages
    REQUIRE(again.ok());
    CHECK(again->data() == block);
    CHECK(mock.calls(MockOp::host_register) == 5);
    // Just below the threshold: a size class (at most 12.5% over).
    auto classed = pool.allocate(4 * mib - 1);
    REQUIRE(classed.ok());
    CHECK(mock.live_pinned_allocations() == 1);
    again->reset();
    classed->reset();
    REQUIRE(pool.trim().ok());
    CHECK(mock.live_registrations() == 0);
    CHECK(pool.stats().locked_bytes == 0);
}

TEST_CASE("pinned regions: a chunk that fails rolls the exact request back whole", "[pinned_regions]") {
    for (std::uint64_t failing = 1; failing <= 3; ++failing) {
        INFO("chunk " << failing << " fails");
        MockBackend mock;
        PinnedHostPool<MockBackend> pool(mock, {}, PinnedPoolOptions{.exact = {.threshold = mib, .chunk_bytes = mib}});
        mock.fail_call(MockOp::host_register, failing);
        const Result<PinnedBuffer> failed = pool.allocate(3 * mib);
        CHECK(failed.status().code() == Errc::backend_failure);
        CHECK_THAT(std::string(failed.status().message()),
                   Catch::Contains("chunk " + std::to_string(failing) + " of 3") && Catch::Contains("'mock'"));
        CHECK(mock.live_registrations() == 0);
        CHECK(mock.calls(MockOp::host_unregister) == failing - 1);
        CHECK(pool.stats().locked_bytes == 0);
        CHECK(pool.regions().empty());
        CHECK(pool.allocate(3 * mib).ok());  // nothing was lost
    }
}

TEST_CASE("pinned regions: create_region registers in the calling thread, then hands out slices", "[pinned_regions]") {
    MockBackend mock;
    HookLog log;  // outlives the pool, whose destruction may call it
    PinnedHostPool<MockBackend> pool(mock, {}, PinnedPoolOptions{.exact = {.chunk_bytes = mib}});
    REQUIRE(pool.set_region_hooks(log.hooks()).ok());
    Result<PinnedRegionHandle> region = pool.create_region(4 * mib - 10);
    REQUIRE(region.ok());
    CHECK(region->ready().value());
    CHECK(region->wait().ok());
    CHECK(region->size() == 4 * mib - 10);
    const RegionProgress progress = region->progress();
    CHECK(progress.state == RegionState::ready);
    CHECK(progress.chunks_total == 4);
    CHECK(progress.chunks_registered == 4);
    CHECK(progress.bytes_registered == 4 * mib);
    REQUIRE(log.added.size() == 1);
    CHECK(log.added[0].id == region->id());
    CHECK(log.added[0].bytes == 4 * mib);
    CHECK(region->cancel().code() == Errc::invalid_argument);  // registered already

    auto kv = region->allocate(mib, page);
    auto step = region->allocate(1000, 64);
    REQUIRE(kv.ok());
    REQUIRE(step.ok());
    CHECK(pool.owns(kv->data()));
    const std::optional<RegionSlice> where = pool.describe(step->data());
    REQUIRE(where);
    CHECK(where->region == region->id());
    CHECK(where->offset == mib);
    CHECK(where->bytes == 1000);
    CHECK(region->allocate(4 * mib).status().code() == Errc::out_of_memory);
    CHECK(pool.release(kv->data()).ok());  // a buffer of the pool like any other
    RegionAllocator slices = region->allocator();
    Result<void*> mirror = slices.allocate(2 * mib, 1024);
    REQUIRE(mirror.ok());
    CHECK(pool.release(*mirror).code() == Errc::invalid_argument);  // only its allocator gives it back
    CHECK(pool.describe(*mirror)->region == region->id());
    CHECK(mock.live_pinned_allocations() == 0);  // slices pin nothing more
    CHECK(mock.calls(MockOp::host_register) == 4);
    // The handle goes first: the region stays until its last slice is given back.
    region->reset();
    CHECK(log.removing.empty());
    CHECK(mock.live_registrations() == 4);
    step->reset();
    CHECK(log.removing.empty());
    CHECK(slices.deallocate(*mirror).ok());
    REQUIRE(log.removing.size() == 1);
    CHECK(log.times_removed(log.added[0].id) == 1);
    CHECK(mock.live_registrations() == 0);
    CHECK(pool.stats().locked_bytes == 0);
    CHECK(pool.regions().empty());
}

TEST_CASE("pinned regions: a region registered in the background shows its progress and hands out nothing before",
          "[pinned_regions][threads]") {
    SteppedMock mock;
    HookLog log;  // outlives the pool, whose destruction may call it
    PinnedHostPool<SteppedMock> pool(mock, {}, PinnedPoolOptions{.exact = {.chunk_bytes = mib}});
    REQUIRE(pool.set_region_hooks(log.hooks()).ok());
    mock.gate();
    Result<PinnedRegionHandle> region = pool.create_region(3 * mib, RegionOptions{.threads = 1});
    REQUIRE(region.ok());
    for (std::size_t chunk = 1; chunk <= 3; ++chunk) {
        mock.wait_for_entries(static_cast<int>(chunk));
        const RegionProgress progress = region->progress();
        CHECK(progress.state == RegionState::registering);
        CHECK(progress.chunks_registered == chunk - 1);
        CHECK(progress.bytes_registered == (chunk - 1) * mib);
        CHECK(progress.chunks_total == 3);
        CHECK_FALSE(region->ready().value());
        const Result<PinnedBuffer> early = region->allocate(64);
        CHECK(early.status().code() == Errc::busy);
        CHECK_THAT(std::string(early.status().message()), Catch::Contains(std::to_string(chunk - 1) + " of 3 chunks"));
        CHECK(log.added.empty());  // not a region before it is registered
        mock.permit(1);
    }
    REQUIRE(region->wait().ok());
    CHECK(region->ready().value());
    CHECK(region->progress().chunks_registered == 3);
    CHECK(log.added.size() == 1);
    CHECK(region->allocate(64).ok());
    mock.open();
}

TEST_CASE("pinned regions: cancel, a failing chunk or a refusing hook roll a background region back whole",
          "[pinned_regions][threads]") {
    SECTION("cancel") {
        SteppedMock mock;
        PinnedHostPool<SteppedMock> pool(mock, {}, PinnedPoolOptions{.exact = {.chunk_bytes = mib}});
        mock.gate();
        Result<PinnedRegionHandle> region = pool.create_region(4 * mib, RegionOptions{.threads = 2});
        REQUIRE(region.ok());
        mock.wait_for_entries(2);
        mock.permit(1);  // one chunk registers; the other threads' chunks wait
        mock.wait_for_entries(3);
        Status cancelled = Status(Errc::busy, "not yet");
        std::thread canceller([&] { cancelled = region->cancel(); });
        while (!region->progress().cancel_requested) std::this_thread::yield();
        mock.open();  // the chunks in flight finish, then everything is rolled back
        canceller.join();
        CHECK(cancelled.ok());
        const RegionProgress progress = region->progress();
        CHECK(progress.state == RegionState::cancelled);
        CHECK(progress.chunks_registered == 0);
        CHECK(mock.live_registrations() == 0);
        const Result<bool> ready = region->ready();
        CHECK_FALSE(ready.ok());
        CHECK_THAT(std::string(ready.status().message()), Catch::Contains("cancelled"));
        CHECK(region->allocate(64).status().code() == Errc::invalid_argument);
        CHECK(pool.stats().locked_bytes == 0);
        CHECK(pool.regions().empty());
    }
    SECTION("a failing chunk") {
        MockBackend mock;
        PinnedHostPool<MockBackend> pool(mock, {}, PinnedPoolOptions{.exact = {.chunk_bytes = mib}});
        mock.fail_call(MockOp::host_register, 3);
        Result<PinnedRegionHandle> region = pool.create_region(8 * mib, RegionOptions{.threads = 3});
        REQUIRE(region.ok());
        const Status waited = region->wait();
        CHECK(waited.code() == Errc::backend_failure);
        CHECK_THAT(std::string(waited.message()), Catch::Contains("create_region") && Catch::Contains("of 8"));
        CHECK(region->progress().state == RegionState::failed);
        CHECK(mock.live_registrations() == 0);
        CHECK(pool.stats().locked_bytes == 0);
    }
    SECTION("a refusing hook") {
        MockBackend mock;
        HookLog log;  // outlives the pool, whose destruction may call it
        PinnedHostPool<MockBackend> pool(mock, {}, PinnedPoolOptions{.exact = {.chunk_bytes = mib}});
        REQUIRE(pool.set_region_hooks(log.hooks()).ok());
        log.refuse_next = true;
        Result<PinnedRegionHandle> region = pool.create_region(2 * mib, RegionOptions{.threads = 1});
        REQUIRE(region.ok());
        CHECK(region->wait().code() == Errc::busy);
        CHECK(mock.live_registrations() == 0);
        CHECK(log.removing.empty());
    }
    SECTION("a handle dropped while registering") {
        SteppedMock mock;
        PinnedHostPool<SteppedMock> pool(mock, {}, PinnedPoolOptions{.exact = {.chunk_bytes = mib}});
        mock.gate();
        {
            Result<PinnedRegionHandle> region = pool.create_region(4 * mib, RegionOptions{.threads = 1});
            REQUIRE(region.ok());
            mock.wait_for_entries(1);
            mock.open();
        }  // cancelled and rolled back before the handle's destruction returned
        CHECK(mock.live_registrations() == 0);
        CHECK(pool.stats().locked_bytes == 0);
    }
}

TEST_CASE("pinned regions: a backend without host_register pins a region with one pinned_malloc", "[pinned_regions]") {
    MallocOnly backend;
    PinnedHostPool<MallocOnly> pool(backend, {}, PinnedPoolOptions{.exact = {.threshold = mib}});
    Result<PinnedRegionHandle> region = pool.create_region(3 * mib + 1, RegionOptions{.threads = 2});
    REQUIRE(region.ok());
    CHECK(region->ready().value());
    CHECK(backend.live == 1);
    CHECK(backend.last_size == 3 * mib + page);
    CHECK(region->progress().chunks_total == 1);
    auto slice = region->allocate(mib);
    REQUIRE(slice.ok());
    auto exact = pool.allocate(2 * mib + 1);  // exact: one pinned_malloc of whole pages
    REQUIRE(exact.ok());
    CHECK(backend.last_size == 2 * mib + page);
    const Result<PinnedRegionHandle> too_big = pool.create_region(65 * mib);
    CHECK(too_big.status().code() == Errc::out_of_memory);
    CHECK_THAT(std::string(too_big.status().message()), Catch::Contains("67108864"));
    CHECK(pool.create_region(mib, RegionOptions{.numa_node = 0}).status().code() == Errc::not_supported);
    slice->reset();
    region->reset();
    exact->reset();
    REQUIRE(pool.trim().ok());
    CHECK(backend.live == 0);
}

TEST_CASE(
    "pinned regions: a 3 GiB region on the simulator is pinned in chunks, progress observed, at most 1.01x "
    "locked",
    "[pinned_regions][threads]") {
    const std::size_t bytes = region_test_bytes();
    const std::size_t chunk = bytes / 3 / page * page;  // three chunks and a remainder at most
    INFO(bytes << " bytes (DEVSTAGE_TEST_REGION_BYTES)");
    SimBackend sim;
    std::mutex mutex;
    std::set<std::size_t> seen;
    PinnedHostPool<SimBackend> pool(sim, {}, PinnedPoolOptions{.exact = {.chunk_bytes = chunk}});
    RegionHooks hooks;
    hooks.added = [&](const PinnedRegion& region) {
        std::lock_guard lock(mutex);
        seen.insert(region.bytes);
        return Status();
    };
    REQUIRE(pool.set_region_hooks(std::move(hooks)).ok());
    Result<PinnedRegionHandle> region = pool.create_region(bytes, RegionOptions{.threads = 1});
    REQUIRE(region.ok());
    std::vector<std::size_t> observed;
    for (;;) {
        const RegionProgress progress = region->progress();
        if (observed.empty() || observed.back() != progress.chunks_registered) {
            observed.push_back(progress.chunks_registered);
        }
        if (progress.state != RegionState::registering) break;
        std::this_thread::yield();
    }
    REQUIRE(region->wait().ok());
    const RegionProgress done = region->progress();
    CHECK(done.chunks_total >= 3);
    CHECK(done.chunks_registered == done.chunks_total);
    CHECK(done.bytes_registered == done.bytes_total);
    CHECK(std::is_sorted(observed.begin(), observed.end()));  // it only moves forward
    CHECK(observed.back() == done.chunks_total);
    const PinnedStats stats = pool.stats();
    CHECK(stats.locked_bytes >= bytes);
    CHECK(static_cast<double>(stats.locked_bytes) <= 1.01 * static_cast<double>(bytes));
    CHECK(stats.registered_chunks == done.chunks_total);
    CHECK(sim.is_pinned(region->data()));
    CHECK(sim.is_pinned(static_cast<std::byte*>(region->data()) + bytes - 1));
    CHECK(seen.size() == 1);
    // A buffer carved from it copies directly (no bounce): its memory is pinned.
    auto buffer = region->allocate(mib);
    REQUIRE(buffer.ok());
    std::memset(buffer->data(), 0x3C, mib);
    void* device = *sim.device_malloc(mib);
    const std::uint64_t bounced = sim.stats().bounced_bytes;
    REQUIRE(sim.copy_to_device(device, buffer->data(), mib).ok());
    CHECK(sim.stats().bounced_bytes == bounced);
    REQUIRE(sim.device_free(device).ok());
    buffer->reset();
    void* const base = region->data();
    region->reset();
    CHECK(pool.stats().locked_bytes == 0);
    CHECK(pool.regions().empty());
    CHECK_FALSE(sim.is_pinned(base));
}
