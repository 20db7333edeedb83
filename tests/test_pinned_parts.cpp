// SPDX-License-Identifier: Apache-2.0
// The parts of the pinned pool's core that hold logic of their own, each through its own
// interface (pinned/detail/): RangeAllocator (a region's slices), RegionTable (regions and
// their hooks, each called once per region), ChunkedRegistration (pinning in chunks, in the
// calling thread or background threads, with progress, cancellation and a whole rollback when a
// chunk fails), and PinnedBlockCache (the cache's bound, pending and retiring blocks).
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/chunked_registration.hpp"
#include "devstage/pinned/detail/range_allocator.hpp"
#include "devstage/pinned/detail/region_table.hpp"

using namespace devstage;
using devstage::detail::ChunkedRegistration;
using devstage::detail::RangeAllocator;
using devstage::detail::RegionTable;

namespace {

constexpr std::size_t page = 4096;

// Memory of the test's own, page-aligned, never touched by the mock's registrations.
struct Mapping {
    explicit Mapping(std::size_t n) : bytes(n) {
        base = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(base != MAP_FAILED);
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping() { ::munmap(base, bytes); }
    std::byte* at(std::size_t offset) const { return static_cast<std::byte*>(base) + offset; }
    std::size_t bytes;
    void* base;
};

// A mock whose host_register waits for a permit: the test steps a registration chunk by chunk.
class GatedRegisterMock : public MockBackend {
public:
    Status host_register(void* host, std::size_t bytes) noexcept {
        {
            std::unique_lock lock(mutex_);
            ++entered_;
            changed_.notify_all();
            changed_.wait(lock, [this] { return permits_ > 0; });
            --permits_;
        }
        return MockBackend::host_register(host, bytes);
    }
    void permit(int n) {
        std::lock_guard lock(mutex_);
        permits_ += n;
        changed_.notify_all();
    }
    /// Blocks until `n` registrations in all asked for a permit.
    void wait_for_entries(int n) {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return entered_ >= n; });
    }

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    int permits_ = 0;
    int entered_ = 0;
};

}  // namespace

TEST_CASE("pinned parts: RangeAllocator hands out aligned first-fit ranges and merges what comes back",
          "[pinned_parts]") {
    RangeAllocator ranges(10 * page, 0x100000);
    const auto a = ranges.allocate(100, 1);
    const auto b = ranges.allocate(page, page);
    const auto c = ranges.allocate(3 * page, 1);
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(c);
    CHECK(*a == 0);
    CHECK(*b == page);  // aligned up past a
    CHECK(*c == 2 * page);
    CHECK(ranges.used() == 100 + 4 * page);
    CHECK(ranges.live() == 3);
    CHECK_FALSE(ranges.allocate(0, 1));
    CHECK_FALSE(ranges.allocate(6 * page, 1));  // 5 pages left at the end, and 100 + 3996 in front
    CHECK(ranges.largest_free() == 5 * page);
    CHECK(ranges.deallocate(*b, page));
    CHECK(ranges.deallocate(*a, 100));  // merges with b's range: one free range in front
    CHECK(ranges.largest_free() == 5 * page);
    const auto front = ranges.allocate(2 * page, 1);
    REQUIRE(front);
    CHECK(*front == 0);  // first fit
    CHECK(ranges.deallocate(*front, 2 * page));
    CHECK(ranges.deallocate(*c, 3 * page));  // everything merged back
    CHECK(ranges.largest_free() == 10 * page);
    CHECK(ranges.used() == 0);
    CHECK(ranges.live() == 0);
    // Alignment is of addresses: a base that is not aligned moves the first aligned offset.
    RangeAllocator odd(4 * page, 0x100000 + 64);
    const auto aligned = odd.allocate(64, page);
    REQUIRE(aligned);
    CHECK((0x100000 + 64 + *aligned) % page == 0);
    CHECK(*aligned == page - 64);
    const auto whole = odd.allocate(page - 64, 1);  // the skipped front is still free
    REQUIRE(whole);
    CHECK(*whole == 0);
}

TEST_CASE("pinned parts: RegionTable calls each region's hooks once, and a refusal lists nothing", "[pinned_parts]") {
    RegionTable table;
    std::vector<std::uint64_t> added, removing;
    RegionHooks hooks;
    hooks.added = [&](const PinnedRegion& region) {
        added.push_back(region.id);
        return region.bytes == 13 ? Status(Errc::busy, "no room in the NIC") : Status();
    };
    hooks.removing = [&](const PinnedRegion& region) { removing.push_back(region.id); };
    REQUIRE(table.set_hooks(hooks).ok());
    alignas(64) static std::byte memory[3][256];
    PinnedRegion first{0, memory[0], 256, -1, RegionKind::pinned_host, -1};
    PinnedRegion second{0, memory[1], 256, 0, RegionKind::pinned_host, -1};
    PinnedRegion refused{0, memory[2], 13, -1, RegionKind::pinned_host, -1};
    REQUIRE(table.add(first, "test").ok());
    REQUIRE(table.add(second, "test").ok());
    CHECK(first.id != 0);
    CHECK(second.id != first.id);
    const Status refusal = table.add(refused, "test add");
    CHECK(refusal.code() == Errc::busy);
    CHECK_THAT(std::string(refusal.message()), Catch::Contains("test add") && Catch::Contains("no room in the NIC"));
    CHECK(table.size() == 2);
    CHECK(added == std::vector<std::uint64_t>{first.id, second.id, refused.id});
    CHECK(table.containing(memory[1] + 255)->id == second.id);
    const std::optional<PinnedRegion> next_one = table.containing(memory[1] + 256);
    CHECK((!next_one || next_one->id != second.id));
    CHECK_FALSE(table.containing(memory[2]));
    // New hooks: the old ones' removing for every region, then the new added for every region.
    std::vector<std::uint64_t> added_again;
    RegionHooks next;
    next.added = [&](const PinnedRegion& region) {
        added_again.push_back(region.id);
        return Status();
    };
    REQUIRE(table.set_hooks(next).ok());
    CHECK(removing == std::vector<std::uint64_t>{first.id, second.id});
    CHECK(added_again == std::vector<std::uint64_t>{first.id, second.id});
    // New hooks that refuse a region: what they did is undone, the old hooks stay and are told
    // about every region again.
    std::vector<std::uint64_t> undone;
    RegionHooks picky;
    picky.added = [&](const PinnedRegion& region) {
        return region.id == second.id ? Status(Errc::out_of_memory, "full") : Status();
    };
    picky.removing = [&](const PinnedRegion& region) { undone.push_back(region.id); };
    const Status refused_hooks = table.set_hooks(picky);
    CHECK(refused_hooks.code() == Errc::out_of_memory);
    CHECK_THAT(std::string(refused_hooks.message()), Catch::Contains("the previous hooks stay"));
    CHECK(undone == std::vector<std::uint64_t>{first.id});
    CHECK(added_again == std::vector<std::uint64_t>{first.id, second.id, first.id, second.id});
    removing.clear();
    table.remove(memory[0]);
    table.remove(memory[0]);  // once
    CHECK(table.size() == 1);
    CHECK(removing.empty());  // the current hooks have no removing
    REQUIRE(table.set_hooks(RegionHooks{}).ok());
}

TEST_CASE("pinned parts: ChunkedRegistration pins in chunks and rolls every chunk back when one fails",
          "[pinned_parts]") {
    Mapping memory(10 * page);
    for (std::uint64_t failing = 1; failing <= 4; ++failing) {
        INFO("host_register call " << failing << " fails");
        MockBackend mock;
        mock.fail_call(MockOp::host_register, failing);
        ChunkedRegistration<MockBackend> registration(mock, memory.base, 10 * page, 3 * page);
        CHECK(registration.chunks() == 4);  // 3 + 3 + 3 + 1 pages
        const Status failed = registration.run();
        CHECK(failed.code() == Errc::backend_failure);
        CHECK_THAT(std::string(failed.message()),
                   Catch::Contains("chunk " + std::to_string(failing) + " of 4") && Catch::Contains("offset"));
        CHECK(mock.live_registrations() == 0);
        CHECK(mock.calls(MockOp::host_unregister) == failing - 1);
        CHECK(registration.progress().chunks_registered == 0);
        CHECK(registration.progress().bytes_registered == 0);
    }
    MockBackend mock;
    ChunkedRegistration<MockBackend> registration(mock, memory.base, 10 * page, 3 * page);
    REQUIRE(registration.run().ok());
    CHECK(mock.live_registrations() == 4);
    const RegionProgress done = registration.progress();
    CHECK(done.chunks_registered == 4);
    CHECK(done.bytes_registered == 10 * page);
    CHECK(done.bytes_total == 10 * page);
    const std::vector<MockCall> journal = mock.journal();
    REQUIRE(journal.size() == 4);
    CHECK(journal.back().pointer == memory.at(9 * page));
    CHECK(journal.back().bytes == page);
    // Unregistering: a failure keeps that chunk, and a retry takes only what is left.
    mock.fail_call(MockOp::host_unregister, mock.calls(MockOp::host_unregister) + 2);
    CHECK_FALSE(registration.unregister_all().ok());
    CHECK(mock.live_registrations() == 1);
    CHECK(registration.unregister_all().ok());
    CHECK(mock.live_registrations() == 0);
    CHECK(registration.progress().chunks_registered == 0);
}

TEST_CASE("pinned parts: ChunkedRegistration in background threads shows progress, and cancel rolls back",
          "[pinned_parts][threads]") {
    Mapping memory(8 * page);
    GatedRegisterMock mock;
    std::mutex mutex;
    std::condition_variable finished;
    bool done = false;
    Status outcome;
    ChunkedRegistration<GatedRegisterMock> registration(mock, memory.base, 8 * page, 2 * page);
    REQUIRE(registration
                .start(1,
                       [&](const Status& status) {
                           std::lock_guard lock(mutex);
                           outcome = status;
                           done = true;
                           finished.notify_all();
                       })
                .ok());
    for (std::size_t step = 1; step <= 2; ++step) {
        mock.wait_for_entries(static_cast<int>(step));
        CHECK(registration.progress().chunks_registered == step - 1);
        mock.permit(1);
        mock.wait_for_entries(static_cast<int>(step) + 1);  // the next chunk asks: this one is counted
        CHECK(registration.progress().chunks_registered == step);
        CHECK(registration.progress().bytes_registered == step * 2 * page);
    }
    registration.cancel();
    mock.permit(1);  // the chunk in flight completes, then the thread stops and rolls back
    {
        std::unique_lock lock(mutex);
        finished.wait(lock, [&] { return done; });
    }
    registration.join();
    CHECK(outcome.code() == Errc::invalid_argument);
    CHECK_THAT(std::string(outcome.message()), Catch::Contains("cancelled after 3 of 4 chunks"));
    CHECK(mock.live_registrations() == 0);
    CHECK(registration.progress().chunks_registered == 0);
    CHECK(registration.cancelled());

    // Four threads share the chunks; the completion comes once, from the last.
    MockBackend free_running;
    Mapping more(64 * page);
    std::atomic<int> completions{0}, failures{0};  // counted there, checked here (Catch is one thread's)
    ChunkedRegistration<MockBackend> parallel(free_running, more.base, 64 * page, page);
    REQUIRE(parallel
                .start(4,
                       [&](const Status& status) {
                           if (!status) ++failures;
                           ++completions;
                       })
                .ok());
    parallel.join();
    CHECK(completions == 1);
    CHECK(failures == 0);
    CHECK(free_running.live_registrations() == 64);
    CHECK(parallel.progress().chunks_registered == 64);
    CHECK(parallel.unregister_all().ok());
}

TEST_CASE("pinned parts: PinnedBlockCache keeps idle blocks within its bound and pending ones aside",
          "[pinned_parts]") {
    using Cache = detail::PinnedBlockCache<MockBackend>;
    using Entry = detail::PinnedEntry<MockBackend>;
    Cache cache(3 * page);
    const auto block = [](std::uintptr_t at, std::size_t capacity, int node = -1) {
        detail::PinnedBlock b;
        b.base = reinterpret_cast<void*>(at);  // NOLINT(performance-no-int-to-ptr): never touched
        b.capacity = capacity;
        b.node = node;
        return b;
    };
    Entry a{block(0x10000, page), {}, false};
    Entry b{block(0x20000, 2 * page), {}, false};
    Entry c{block(0x30000, page), {}, false};
    CHECK(cache.keep(a, true) == Cache::Where::cache);
    CHECK(cache.keep(b, true) == Cache::Where::cache);
    CHECK_FALSE(cache.keep(c, true));  // past the bound, idle: the caller frees it
    Entry pending{block(0x40000, page), {}, true};
    CHECK(cache.keep(pending, true) == Cache::Where::retiring);  // no room in the cache: it waits aside
    PinnedStats stats;
    cache.add_to(stats);
    CHECK(stats.cached_blocks == 2);
    CHECK(stats.cached_bytes == 3 * page);
    CHECK(stats.retiring_blocks == 1);
    CHECK(stats.pending_blocks == 1);
    CHECK_FALSE(cache.take_idle(page, 0));  // another node's arena
    const auto taken = cache.take_idle(page, -1);
    REQUIRE(taken);
    CHECK(taken->base == a.block.base);
    CHECK_FALSE(cache.take_pending(page, -1));  // an unknown entry is never queried
    Cache::Map batch;
    cache.take_all(batch, true);
    CHECK(batch.size() == 2);
    PinnedStats empty;
    cache.add_to(empty);
    CHECK(empty.cached_bytes == 0);
    CHECK(empty.pending_blocks == 0);
}
