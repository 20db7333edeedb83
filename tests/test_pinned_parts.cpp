// SPDX-License-Identifier: Apache-2.0
// The parts of the pinned pool's core that hold logic of their own, each through its own
// interface (pinned/detail/): RangeAllocator (a region's slices), RegionTable (regions and
// their hooks, each called once per region), ChunkedRegistration (pinning in chunks, in the
// calling thread or background threads, with progress, cancellation and a whole rollback when a
// chunk fails), PinnedBlockCache (the cache's bound, pending and retiring blocks); and the
// core's steps, each over the parts it is given, wired as the core wires them: PinnedPhase (open,
// closed, torn down), PinnedTeardownHooks (a backend's teardown heard once), PinnedObtain
// (blocks out: cache hits, pending skips, a trim on out-of-memory), PinnedRetire (blocks back:
// cached, freed, retiring until done), PinnedSweep (finalize, close), PinnedStreams (record,
// forget) and PinnedRegionSet (regions made with create_region, their slices and teardown).
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/pinned/detail/block_cache.hpp"
#include "devstage/pinned/detail/chunked_registration.hpp"
#include "devstage/pinned/detail/obtain.hpp"
#include "devstage/pinned/detail/phase.hpp"
#include "devstage/pinned/detail/range_allocator.hpp"
#include "devstage/pinned/detail/region_set.hpp"
#include "devstage/pinned/detail/region_table.hpp"
#include "devstage/pinned/detail/retire.hpp"
#include "devstage/pinned/detail/streams.hpp"
#include "devstage/pinned/detail/sweep.hpp"
#include "devstage/pinned/detail/teardown_hooks.hpp"

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

// ---- the core's steps, each over the parts it is given ---------------------------------------

namespace {

using detail::PinnedPhase;
using Lock = std::unique_lock<std::mutex>;

// The reports a part sends to its sink.
struct Reports {
    void operator()(const Status& status) noexcept {
        std::lock_guard lock(mutex);
        messages.emplace_back(status.message());
    }
    bool any(const std::string& text) {
        std::lock_guard lock(mutex);
        for (const std::string& message : messages) {
            if (message.find(text) != std::string::npos) return true;
        }
        return false;
    }
    std::mutex mutex;
    std::vector<std::string> messages;
};

// The parts of a core over a mock, wired as PinnedPoolCore wires them (caching, a 1 MiB bound).
template <class Mock = MockBackend>
struct CoreParts {
    explicit CoreParts(Mock& mock) : backend(mock), source(mock, sink, PinnedPoolOptions{}) {
        sink.set(ErrorSink::to(reports));
    }
    CoreParts(const CoreParts&) = delete;
    CoreParts& operator=(const CoreParts&) = delete;
    ~CoreParts() {
        region_set.stop_all();
        sweep.destroy();
    }

    static void heard(void*, Mock&) noexcept {}

    Mock& backend;
    Reports reports;
    detail::PinnedSink sink;
    detail::PinnedBlockSource<Mock> source;
    detail::PinnedEvents<Mock> events{sink};
    std::mutex mutex;
    PinnedPhase phase{true};
    detail::PinnedRegistry<Mock> registry;
    detail::PinnedBlockCache<Mock> cache{std::size_t{1} << 20};
    detail::PinnedRegionSet<Mock> region_set{mutex, phase, source, sink};
    detail::PinnedRetire<Mock> retire{mutex, phase, cache, events, source, region_set, sink};
    detail::PinnedObtain<Mock, CachingPinned> obtain{mutex, phase, registry, cache, events, source, retire, sink};
    detail::PinnedTeardownHooks<Mock> hooks{&CoreParts::heard, this, sink};
    detail::PinnedStreams<Mock> streams{mutex, phase, registry, cache, events, hooks, backend, source.name(), sink};
    detail::PinnedSweep<Mock> sweep{mutex, phase, registry, cache, events, retire, source.name(), sink};

    // A grant of `bytes` for `holder`, as allocate() makes it.
    detail::PinnedCore::Grant grant(std::size_t bytes, detail::PinnedHolder holder) {
        Lock lock(mutex);
        Result<detail::PinnedBlock> block = obtain.obtain(lock, bytes, bytes, -1);
        REQUIRE(block);
        Result<detail::PinnedCore::Grant> granted = obtain.enroll(lock, *block, block->base, bytes, holder);
        REQUIRE(granted);
        return *granted;
    }
    // Gives back the grant at `pointer` as release() does, without streams.
    void give_back(void* pointer) {
        Lock lock(mutex);
        auto live = registry.unlist(registry.lookup(pointer));
        const bool keep = !live.detached && phase.cacheable();
        CHECK(retire.retire(lock, live.block, keep).ok());
    }
    PinnedStats stats() {
        PinnedStats out;
        std::lock_guard lock(mutex);
        registry.add_to(out);
        cache.add_to(out);
        obtain.add_to(out);
        return out;
    }
};

}  // namespace

TEST_CASE("pinned parts: PinnedPhase only moves forward, and says why nothing is handed out", "[pinned_parts]") {
    PinnedPhase phase(true);
    CHECK(phase.stage() == PinnedPhase::Stage::open);
    CHECK(phase.cacheable());
    CHECK(phase.refusal("sim").ok());
    phase.close();
    CHECK(phase.closed());
    CHECK_FALSE(phase.torn_down());
    CHECK_FALSE(phase.cacheable());
    CHECK(phase.refusal("sim").code() == Errc::invalid_argument);
    CHECK_THAT(std::string(phase.refusal("sim").message()), Catch::Contains("was destroyed (backend 'sim')"));
    phase.tear_down();
    phase.close();  // a torn-down pool stays torn down
    CHECK(phase.torn_down());
    CHECK_THAT(std::string(phase.refusal("sim").message()), Catch::Contains("backend 'sim' was torn down"));
    PinnedPhase direct(false);
    CHECK_FALSE(direct.cacheable());  // a policy that keeps nothing never caches
    CHECK(direct.refusal("sim").ok());
    PinnedPhase torn(true);
    torn.tear_down();
    CHECK(torn.closed());
}

namespace {
struct Heard {
    static void on(void* owner, MockBackend& backend) noexcept {
        static_cast<Heard*>(owner)->backends.push_back(&backend);
    }
    std::vector<const MockBackend*> backends;
};
// A mock whose teardown takes no hook.
class RefusingHooksMock : public MockBackend {
public:
    Result<std::uint64_t> add_teardown_hook(TeardownHook) noexcept {
        return Status(Errc::out_of_memory, "no room for a hook");
    }
    static void heard(void*, RefusingHooksMock&) noexcept {}
};
}  // namespace

TEST_CASE("pinned parts: PinnedTeardownHooks hears each backend's teardown once, until it is unhooked",
          "[pinned_parts]") {
    Heard heard;
    Reports reports;
    detail::PinnedSink sink;
    sink.set(ErrorSink::to(reports));
    detail::PinnedTeardownHooks<MockBackend> hooks(&Heard::on, &heard, sink);
    std::optional<MockBackend> first(std::in_place), second(std::in_place), third(std::in_place);
    const MockBackend* first_address = &*first;
    hooks.hook(*first);
    hooks.hook(*first);  // once per backend
    hooks.hook(*second);
    hooks.hook(*third);
    CHECK(hooks.hooked(*first));
    hooks.unhook(*second);
    CHECK_FALSE(hooks.hooked(*second));
    CHECK(hooks.hooked(*third));
    first.reset();
    REQUIRE(heard.backends.size() == 1);
    CHECK(heard.backends[0] == first_address);
    second.reset();  // unhooked: not heard
    CHECK(heard.backends.size() == 1);
    hooks.unhook_all();  // the first's hook ran: nothing is asked of the dead backend
    CHECK_FALSE(hooks.hooked(*third));
    third.reset();
    CHECK(heard.backends.size() == 1);
    CHECK(reports.messages.empty());
    // A backend that refuses the hook: reported, not listed.
    RefusingHooksMock refusing;
    detail::PinnedTeardownHooks<RefusingHooksMock> refused(&RefusingHooksMock::heard, nullptr, sink);
    refused.hook(refusing);
    CHECK_FALSE(refused.hooked(refusing));
    CHECK(reports.any("hooking to the teardown of backend 'mock' failed: no room for a hook"));
}

TEST_CASE("pinned parts: PinnedObtain takes idle cached blocks, skips pending ones until a query finds them done",
          "[pinned_parts]") {
    MockBackend mock(MockConfig{.deferred_async = true, .not_ready_polls = 2});
    CoreParts parts(mock);
    const detail::PinnedCore::Grant first = parts.grant(1000, detail::PinnedHolder::raw);
    CHECK(parts.obtain.block_size(1000) == CachingPinned::size_class(1000));
    parts.give_back(first.pointer);
    CHECK(parts.stats().cached_blocks == 1);
    const detail::PinnedCore::Grant again = parts.grant(900, detail::PinnedHolder::raw);  // the same size class
    CHECK(again.pointer == first.pointer);
    CHECK(again.id != first.id);
    CHECK(parts.stats().cache_hits == 1);
    CHECK(parts.stats().cache_misses == 1);

    // Given back with work recorded on a stream: pending, passed over while its event is not ready.
    const Result<MockBackend::Stream> stream = mock.create_stream();
    REQUIRE(stream);
    REQUIRE(parts.streams.record(again.pointer, again.id, *stream, mock, false).ok());
    {
        Lock lock(parts.mutex);
        auto live = parts.registry.unlist(parts.registry.lookup(again.pointer));
        REQUIRE(live.uses.size() == 1);
        lock.unlock();
        CHECK(parts.retire
                  .retire_recorded(detail::PinnedEntry<MockBackend>{live.block, std::move(live.uses), false}, true,
                                   "release")
                  .ok());
    }
    CHECK(parts.stats().pending_blocks == 1);
    std::vector<void*> fresh;
    for (int poll = 0; poll < 2; ++poll) {
        const detail::PinnedCore::Grant other = parts.grant(1000, detail::PinnedHolder::raw);
        CHECK(other.pointer != again.pointer);
        fresh.push_back(other.pointer);
    }
    CHECK(parts.stats().pending_skips == 2);
    const detail::PinnedCore::Grant settled = parts.grant(1000, detail::PinnedHolder::raw);  // the third query: done
    CHECK(settled.pointer == again.pointer);
    CHECK(parts.stats().pending_skips == 2);
    CHECK(parts.stats().cache_hits == 2);
    parts.give_back(settled.pointer);
    for (void* pointer : fresh) parts.give_back(pointer);
    // A closed pool hands out nothing, from the cache either.
    {
        std::lock_guard lock(parts.mutex);
        parts.phase.close();
    }
    Lock lock(parts.mutex);
    const Result<detail::PinnedBlock> refused = parts.obtain.obtain(lock, 1000, 1000, -1);
    CHECK(refused.status().code() == Errc::invalid_argument);
    lock.unlock();
    CHECK(mock.destroy_stream(*stream).ok());
}

TEST_CASE("pinned parts: PinnedObtain trims idle cached blocks once when the backend is out of memory",
          "[pinned_parts]") {
    MockBackend mock;
    CoreParts parts(mock);
    const detail::PinnedCore::Grant small = parts.grant(100, detail::PinnedHolder::raw);
    parts.give_back(small.pointer);
    REQUIRE(parts.stats().cached_blocks == 1);
    mock.fail_call(MockOp::pinned_malloc, mock.calls(MockOp::pinned_malloc) + 1, Errc::out_of_memory);
    const detail::PinnedCore::Grant big = parts.grant(100000, detail::PinnedHolder::raw);  // the retry succeeds
    CHECK(parts.stats().cached_blocks == 0);
    CHECK(mock.live_pinned_allocations() == 1);
    parts.give_back(big.pointer);
}

TEST_CASE("pinned parts: PinnedRetire caches what the pool keeps, frees the rest, and frees retiring blocks once done",
          "[pinned_parts]") {
    MockBackend mock(MockConfig{.deferred_async = true, .not_ready_polls = 1});
    CoreParts parts(mock);
    const detail::PinnedCore::Grant kept = parts.grant(4096, detail::PinnedHolder::raw);
    const detail::PinnedCore::Grant freed = parts.grant(4096, detail::PinnedHolder::raw);
    {
        Lock lock(parts.mutex);
        auto live = parts.registry.unlist(parts.registry.lookup(freed.pointer));
        CHECK(parts.retire.retire(lock, live.block, false).ok());  // not kept: back to the backend
    }
    CHECK(mock.live_pinned_allocations() == 1);
    const Result<MockBackend::Stream> stream = mock.create_stream();
    REQUIRE(stream);
    REQUIRE(parts.streams.record(kept.pointer, kept.id, *stream, mock, false).ok());
    {
        Lock lock(parts.mutex);
        auto live = parts.registry.unlist(parts.registry.lookup(kept.pointer));
        lock.unlock();
        // Not to be kept, with work pending: retiring until a query finds the work done.
        CHECK(parts.retire
                  .retire_recorded(detail::PinnedEntry<MockBackend>{live.block, std::move(live.uses), false}, false,
                                   "release")
                  .ok());
    }
    CHECK(parts.stats().retiring_blocks == 1);
    CHECK(mock.live_pinned_allocations() == 1);
    parts.retire.collect();  // the first query: not ready
    CHECK(parts.stats().retiring_blocks == 1);
    parts.retire.collect();
    CHECK(parts.stats().retiring_blocks == 0);
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(mock.destroy_stream(*stream).ok());
}

TEST_CASE("pinned parts: PinnedSweep finalize detaches what is live, close frees what nothing can give back",
          "[pinned_parts]") {
    MockBackend mock;
    CoreParts parts(mock);
    const detail::PinnedCore::Grant raw = parts.grant(100, detail::PinnedHolder::raw);
    const detail::PinnedCore::Grant held = parts.grant(300, detail::PinnedHolder::buffer);
    const detail::PinnedCore::Grant cached = parts.grant(5000, detail::PinnedHolder::raw);
    parts.give_back(cached.pointer);
    CHECK(parts.sweep.finalize().ok());
    CHECK(parts.stats().cached_blocks == 0);
    CHECK(parts.stats().detached_allocations == 2);
    CHECK(parts.reports.any("finalize: 2 allocation(s) still live, 400 bytes"));
    CHECK(mock.live_pinned_allocations() == 2);
    CHECK(parts.sweep.close().ok());
    CHECK(parts.phase.closed());
    CHECK(parts.reports.any("destroyed: 2 allocation(s) still live, 400 bytes, on backend 'mock': 1 raw (100 bytes)"));
    CHECK(mock.live_pinned_allocations() == 1);  // the buffer's memory stays valid
    CHECK_FALSE(parts.registry.contains(raw.pointer));
    parts.give_back(held.pointer);  // detached: freed, not cached
    CHECK(parts.stats().cached_blocks == 0);
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(parts.sweep.trim().ok());
}

TEST_CASE("pinned parts: PinnedStreams records a stream once, and nothing once the backend was torn down",
          "[pinned_parts]") {
    MockBackend mock;
    CoreParts parts(mock);
    const detail::PinnedCore::Grant grant = parts.grant(100, detail::PinnedHolder::raw);
    const Result<MockBackend::Stream> stream = mock.create_stream();
    REQUIRE(stream);
    CHECK(parts.streams.record(grant.pointer, grant.id, *stream, mock, false).ok());
    CHECK(parts.streams.record(grant.pointer, 0, *stream, mock, true).ok());  // recorded already
    {
        std::lock_guard lock(parts.mutex);
        CHECK(parts.registry.find(grant.pointer, grant.id)->uses.size() == 1);
    }
    const Status unknown = parts.streams.record(static_cast<char*>(grant.pointer) + 1, 0, *stream, mock, false);
    CHECK(unknown.code() == Errc::unknown_pointer);
    const Status other_grant = parts.streams.record(grant.pointer, grant.id + 1, *stream, mock, false);
    CHECK(other_grant.code() == Errc::unknown_pointer);
    CHECK(parts.streams.recorded_backends() == std::vector<MockBackend*>{&mock});
    CHECK(parts.streams.forget(mock, false).ok());
    {
        std::lock_guard lock(parts.mutex);
        CHECK(parts.registry.find(grant.pointer, grant.id)->uses.empty());
        parts.phase.tear_down();
    }
    const Status torn = parts.streams.record(grant.pointer, grant.id, *stream, mock, false);
    CHECK(torn.code() == Errc::invalid_argument);
    CHECK_THAT(std::string(torn.message()), Catch::Contains("was torn down"));
    parts.give_back(grant.pointer);
    CHECK(mock.destroy_stream(*stream).ok());
}

TEST_CASE("pinned parts: PinnedRegionSet cuts slices of a registered region and lets it go with its last slice",
          "[pinned_parts]") {
    MockBackend mock;
    CoreParts parts(mock);
    const Result<std::uint64_t> id = parts.region_set.create(3 * page + 1, RegionOptions{});
    REQUIRE(id);
    CHECK(parts.region_set.ready(*id).value());
    CHECK(parts.region_set.progress(*id).state == RegionState::ready);
    CHECK(parts.source.regions().size() == 1);
    CHECK(mock.live_registered_bytes() == 4 * page);
    void* base = parts.region_set.base(*id);
    REQUIRE(base != nullptr);
    Result<detail::PinnedBlock> slice = Status(Errc::invalid_argument, "");
    {
        Lock lock(parts.mutex);
        slice = parts.region_set.cut(lock, *id, page, page);
        REQUIRE(slice);
        CHECK(slice->base == base);
        CHECK(slice->source == detail::BlockSource::slice);
        CHECK(slice->region == *id);
        const Result<detail::PinnedBlock> too_big = parts.region_set.cut(lock, *id, 4 * page, 1);
        CHECK(too_big.status().code() == Errc::out_of_memory);
        CHECK_THAT(std::string(too_big.status().message()),
                   Catch::Contains("4096 of 16384 bytes in use, the largest free range 12288 bytes"));
        CHECK(parts.region_set.cut(lock, *id, page, 3).status().code() == Errc::invalid_argument);
        CHECK(parts.region_set.cut(lock, *id + 1000, page, 1).status().code() == Errc::unknown_pointer);
    }
    CHECK(parts.region_set.cancel(*id).code() == Errc::invalid_argument);  // registered already
    parts.region_set.drop(*id);                                            // a slice is still out: the region stays
    CHECK(parts.region_set.find(*id) != nullptr);
    CHECK(mock.live_registered_bytes() == 4 * page);
    CHECK(parts.region_set.ready(*id).value());
    CHECK(parts.retire.free_block(*slice).ok());  // the last slice: the region goes
    CHECK(parts.region_set.find(*id) == nullptr);
    CHECK(parts.region_set.ready(*id).status().code() == Errc::unknown_pointer);
    CHECK(parts.source.regions().size() == 0);
    CHECK(mock.live_registered_bytes() == 0);
    CHECK(parts.source.locked_bytes() == 0);
    {
        std::lock_guard lock(parts.mutex);
        parts.phase.close();
    }
    const Result<std::uint64_t> refused = parts.region_set.create(page, RegionOptions{});
    CHECK_THAT(std::string(refused.status().message()), Catch::Contains("the pool was destroyed"));
}

TEST_CASE("pinned parts: PinnedRegionSet hands out nothing while registering, and a teardown unpins in place",
          "[pinned_parts][threads]") {
    GatedRegisterMock mock;
    CoreParts<GatedRegisterMock> parts(mock);
    const Result<std::uint64_t> id =
        parts.region_set.create(2 * page, RegionOptions{.chunk_bytes = page, .threads = 1});
    REQUIRE(id);
    mock.wait_for_entries(1);
    {
        Lock lock(parts.mutex);
        const Result<detail::PinnedBlock> early = parts.region_set.cut(lock, *id, page, 1);
        CHECK(early.status().code() == Errc::busy);
        CHECK_THAT(std::string(early.status().message()), Catch::Contains("still registering (0 of 2 chunks)"));
    }
    mock.permit(2);
    REQUIRE(parts.region_set.wait(*id).ok());
    Result<detail::PinnedBlock> slice = Status(Errc::invalid_argument, "");
    {
        Lock lock(parts.mutex);
        slice = parts.region_set.cut(lock, *id, page, 1);
        REQUIRE(slice);
    }
    std::vector<std::uint64_t> revoked;
    detail::Tally tally;
    parts.region_set.tear_down(parts.region_set.stop_listed(), tally,
                               [&](std::uint64_t region) { revoked.push_back(region); });
    CHECK(tally.first.ok());
    CHECK(revoked.empty());  // mapped memory stays valid, pageable: nothing is revoked
    CHECK(mock.live_registered_bytes() == 0);
    CHECK(parts.source.regions().size() == 0);
    static_cast<std::byte*>(slice->base)[0] = std::byte{1};  // still mapped
    parts.region_set.drop(*id);
    CHECK(parts.region_set.find(*id) != nullptr);  // the slice is out
    CHECK(parts.retire.free_block(*slice).ok());
    CHECK(parts.region_set.find(*id) == nullptr);
}
