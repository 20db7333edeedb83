// SPDX-License-Identifier: Apache-2.0
// PinnedHostPool, PinnedBuffer, PinnedAllocator and PinnedMemoryResource: the pinned suite
// over the simulator and the mock (page-aligned and adversarially aligned), plus facts that
// need a backend of their own: host memory exhaustion inside the pool, and a pool destroyed
// while an allocation is in flight.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory_resource>
#include <mutex>
#include <new>
#include <optional>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "support.hpp"

using PinnedBackends = std::tuple<devstage::SimBackend, devstage::MockBackend, devstage::test::AdversarialMock,
                                  devstage::test::DeferredMock>;
#include "pinned_suite.hpp"

using namespace devstage;

// Host allocation failure on demand: while `allocations_until_failure` is k > 0, the k-th
// operator new from now throws std::bad_alloc (once). The whole unaligned family is replaced,
// so every new meets its own delete (aligned ones keep the library's pair).
namespace {
std::atomic<long> allocations_until_failure{0};
}  // namespace

void* operator new(std::size_t bytes) {
    if (allocations_until_failure.load(std::memory_order_relaxed) > 0 && allocations_until_failure.fetch_sub(1) == 1) {
        throw std::bad_alloc();
    }
    if (void* pointer = std::malloc(bytes == 0 ? 1 : bytes)) return pointer;
    throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) {
    return ::operator new(bytes);
}
void* operator new(std::size_t bytes, const std::nothrow_t& /*tag*/) noexcept {
    try {
        return ::operator new(bytes);
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept {
    return ::operator new(bytes, tag);
}
// Out of line, so the compiler does not see free() meet a pointer from operator new.
[[gnu::noinline]] void operator delete(void* pointer) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete[](void* pointer) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete(void* pointer, std::size_t /*bytes*/) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete[](void* pointer, std::size_t /*bytes*/) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete(void* pointer, const std::nothrow_t& /*tag*/) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete[](void* pointer, const std::nothrow_t& /*tag*/) noexcept {
    std::free(pointer);
}

namespace {

namespace {
// True when operator new is the one above: false where a tool replaces it (valgrind does).
bool operator_new_replaced() {
    allocations_until_failure = 1;
    try {
        ::operator delete(::operator new(1));
    } catch (const std::bad_alloc&) {
        return true;
    }
    allocations_until_failure = 0;
    return false;
}
}  // namespace

// A PinnedHostBackend over malloc, which never calls operator new: injected host allocation
// failures reach the pool only.
class MallocBackend {
public:
    static constexpr std::size_t device_alignment = 64;
    std::string_view name() const noexcept { return "malloc"; }
    Result<void*> device_malloc(std::size_t /*bytes*/) noexcept {
        return Status(Errc::not_supported, "malloc device_malloc: no device");
    }
    Status device_free(void* /*pointer*/) noexcept { return {}; }
    Status copy_to_device(void* /*dst*/, const void* /*src*/, std::size_t /*bytes*/) noexcept { return {}; }
    Status copy_from_device(void* /*dst*/, const void* /*src*/, std::size_t /*bytes*/) noexcept { return {}; }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        void* pointer = std::malloc(bytes);
        if (pointer == nullptr) return Status(Errc::out_of_memory, "malloc pinned_malloc failed");
        ++live;
        return pointer;
    }
    Status pinned_free(void* pointer) noexcept {
        std::free(pointer);
        --live;
        return {};
    }
    std::atomic<int> live{0};
};
static_assert(PinnedHostBackend<MallocBackend>);

std::atomic<int> oom_reports{0};
void count_oom(const Status& status) noexcept {
    if (status.code() == Errc::out_of_memory) ++oom_reports;
}

// True when `result` succeeded, or failed for want of host memory and says so.
template <class T>
bool ok_or_host_oom(const Result<T>& result) {
    if (result.ok()) return true;
    const Status status = result.status();
    return status.code() == Errc::out_of_memory &&
           (status.message().empty() || status.message().find("host memory exhausted") != std::string::npos);
}

// A mock whose pinned_malloc waits at a gate, so a test can act while the call is in flight.
class GatedMock : public MockBackend {
public:
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        {
            std::unique_lock lock(mutex_);
            entered_ = true;
            changed_.notify_all();
            changed_.wait(lock, [this] { return open_; });
        }
        return MockBackend::pinned_malloc(bytes);
    }
    void wait_until_entered() {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [this] { return entered_; });
    }
    void open() {
        std::lock_guard lock(mutex_);
        open_ = true;
        changed_.notify_all();
    }

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    bool entered_ = false;
    bool open_ = false;
};
static_assert(PinnedHostBackend<GatedMock>);

}  // namespace

TEST_CASE("pinned: size classes bound the waste on large blocks", "[pinned]") {
    STATIC_REQUIRE(CachingPinned::size_class(1) == 256);
    STATIC_REQUIRE(CachingPinned::size_class(3000) == 4096);
    STATIC_REQUIRE(CachingPinned::size_class(std::size_t{1} << 20) == std::size_t{1} << 20);
    for (std::size_t bytes : {(std::size_t{1} << 20) + 1, std::size_t{3} << 25, (std::size_t{1} << 30) + 12345}) {
        const std::size_t size_class = CachingPinned::size_class(bytes);
        CHECK(size_class >= bytes);
        CHECK(size_class - bytes <= bytes / 8);  // at most 12.5%, not 2x
    }
}

TEST_CASE("pinned: the cache is bounded and DirectPinned does not cache", "[pinned]") {
    MockBackend mock;
    PinnedHostPool<MockBackend> bounded(mock, CachingPinned{.max_cached_bytes = 8192});
    {
        auto a = bounded.allocate(4096);
        auto b = bounded.allocate(4096);
        auto c = bounded.allocate(4096);
    }
    CHECK(bounded.stats().cached_bytes == 8192);
    CHECK(bounded.stats().backend_frees == 1);
    PinnedHostPool<MockBackend, DirectPinned> direct(mock);
    { auto a = direct.allocate(1000); }
    CHECK(direct.stats().cached_bytes == 0);
    CHECK(direct.stats().backend_frees == 1);
    CHECK(mock.journal().back().bytes == 1000);
}

TEST_CASE("pinned: an over-aligned request pads only a block that misses the alignment", "[pinned]") {
    MockBackend mock(MockConfig{.offset = 64});  // every block 64 past a page boundary
    PinnedHostPool<MockBackend, DirectPinned> pool(mock);
    PinnedMemoryResource resource(pool);
    void* pointer = resource.allocate(1000, 4096);
    CHECK(detail::is_aligned(pointer, 4096));
    // The exact block missed the alignment and went back; the padded one serves.
    CHECK(mock.calls(MockOp::pinned_malloc) == 2);
    CHECK(mock.calls(MockOp::pinned_free) == 1);
    CHECK(mock.journal()[2].bytes == 1000 + 4095);
    resource.deallocate(pointer, 1000, 4096);  // the block's base goes back, not the aligned pointer
    CHECK(mock.misuses() == 0);
    CHECK(mock.live_pinned_allocations() == 0);
    void* small = resource.allocate(1000, 64);  // met by the exact block: no padding
    CHECK(mock.journal().back().bytes == 1000);
    resource.deallocate(small, 1000, 64);
    volatile std::size_t not_a_power_of_two = 3;  // volatile: hidden from the compiler's own check
    CHECK_THROWS_AS(resource.allocate(16, not_a_power_of_two), std::bad_alloc);
    volatile std::size_t overflowing = std::size_t(-1) - 10;  // + 4095 wraps around
    CHECK_THROWS_AS(resource.allocate(overflowing, 4096), std::bad_alloc);
    CHECK(mock.calls(MockOp::pinned_malloc) == 3);  // refused before any backend call
    CHECK(mock.live_pinned_allocations() == 0);
}

TEST_CASE("pinned: host memory exhausted inside the pool is reported, never fatal, and leaks no block", "[pinned]") {
    if (!operator_new_replaced()) {
        WARN("operator new is replaced by a tool (valgrind): no host allocation can be made to fail");
        return;
    }
    bool injected = true;
    long k = 0;
    while (injected) {
        ++k;
        MallocBackend backend;
        oom_reports = 0;
        {
            PinnedHostPool<MallocBackend> pool(backend);
            pool.set_error_sink(&count_oom);
            PinnedMemoryResource resource(pool);
            bool resource_refused = false;
            std::optional<Result<PinnedBuffer>> a, b, c;
            std::optional<Result<void*>> raw;
            allocations_until_failure = k;
            a.emplace(pool.allocate(1000));  // a miss: the registry records it
            b.emplace(pool.allocate(3000));
            if (a->ok()) (*a)->reset();      // into the cache
            c.emplace(pool.allocate(1000));  // a hit
            raw.emplace(pool.allocate_raw(500));
            try {
                void* aligned = resource.allocate(100, 8192);  // padded: a block goes back, another comes
                resource.deallocate(aligned, 100, 8192);
            } catch (const std::bad_alloc&) {
                resource_refused = true;
            }
            (void)pool.finalize();  // reports the live ones
            if (c->ok()) (*c)->reset();
            (void)pool.trim();
            injected = allocations_until_failure.exchange(0) == 0;
            INFO("host allocation " << k << " failed");
            CHECK(ok_or_host_oom(*a));
            CHECK(ok_or_host_oom(*b));
            CHECK(ok_or_host_oom(*c));
            CHECK(ok_or_host_oom(*raw));
            if (!injected) CHECK_FALSE(resource_refused);
            if (raw->ok()) CHECK(pool.release(**raw).ok());
            CHECK(pool.stats().backend_allocations - pool.stats().backend_frees ==
                  pool.stats().live_allocations + pool.stats().cached_blocks);
        }
        CHECK(backend.live == 0);
    }
    CHECK(k > 10);  // the sweep went through every host allocation of the scenario
}

TEST_CASE("pinned: a caching release that finds no host memory frees the block instead", "[pinned]") {
    if (!operator_new_replaced()) {
        WARN("operator new is replaced by a tool (valgrind): no host allocation can be made to fail");
        return;
    }
    MallocBackend backend;
    PinnedHostPool<MallocBackend> pool(backend);
    auto buffer = pool.allocate(1000);
    REQUIRE(buffer.ok());
    allocations_until_failure = 1;  // the cache entry's node
    buffer->reset();
    allocations_until_failure = 0;
    CHECK(pool.stats().cached_blocks == 0);
    CHECK(pool.stats().backend_frees == 1);
    CHECK(backend.live == 0);
}

TEST_CASE("pinned: an allocation in flight while the pool is destroyed is refused and freed", "[pinned][threads]") {
    GatedMock mock;
    std::optional<PinnedHostPool<GatedMock>> pool(std::in_place, mock);
    pool->set_error_sink(&test::quiet_sink);
    PinnedAllocator<char> allocator(*pool);
    std::atomic<bool> granted{false};
    std::thread thread([&] {
        try {
            char* pointer = allocator.allocate(1000);
            granted = true;
            allocator.deallocate(pointer, 1000);
        } catch (const std::bad_alloc&) {
        }
    });
    mock.wait_until_entered();
    pool.reset();  // destroyed while pinned_malloc runs
    mock.open();
    thread.join();
    CHECK_FALSE(granted);
    CHECK(mock.live_pinned_allocations() == 0);  // the late block went back, not into a dead cache
    CHECK(allocator.core()->stats().cached_blocks == 0);
    CHECK(mock.misuses() == 0);
}

// ---- pinned memory and streams over the deferred mock: failures of event calls --------------

namespace {

// A deferred mock that checks its streams (StreamCheckBackend), as the simulator, CUDA and ACL
// do: the pool's record(buffer, stream) then checks the stream with check_stream and makes no
// event call until the release, whose failures these cases inject.
class CheckingMock : public test::DeferredMock {
public:
    using DeferredMock::DeferredMock;
    Result<Stream> create_stream() noexcept {
        Result<Stream> stream = DeferredMock::create_stream();
        if (stream) streams_.push_back(stream->id);
        return stream;
    }
    Status check_stream(Stream stream) noexcept {
        for (const std::uint32_t id : streams_) {
            if (id == stream.id) return {};
        }
        return Status(Errc::invalid_argument, "checking mock: stream " + std::to_string(stream.id) + " is not mine");
    }

private:
    std::vector<std::uint32_t> streams_;
};
static_assert(StreamCheckBackend<CheckingMock>);

// A deferred mock with a stream, device memory, and a pool over them whose reports are counted.
struct StreamedPool {
    static constexpr std::size_t bytes = 4096;

    explicit StreamedPool(std::size_t device_bytes = 8 * bytes) : device(*mock.device_malloc(device_bytes)) {
        stream = *mock.create_stream();
        pool.emplace(mock);
        pool->set_error_sink(&pinned_suite::counting_sink);
        pinned_suite::sink_calls = 0;
    }
    StreamedPool(const StreamedPool&) = delete;
    StreamedPool& operator=(const StreamedPool&) = delete;
    ~StreamedPool() {
        pool.reset();
        CHECK(mock.synchronize().ok());
        CHECK(mock.device_free(device).ok());
        CHECK(mock.destroy_stream(stream).ok());
    }

    // A block filled with `fill`, uploaded to device region `k` on the stream, recorded there
    // and given back: pending. Returns its address.
    void* pending_upload(int fill, std::size_t k = 0) {
        auto buffer = pool->allocate(bytes);
        REQUIRE(buffer.ok());
        std::memset(buffer->data(), fill, bytes);
        REQUIRE(mock.copy_to_device_async(region(k), buffer->data(), bytes, stream).ok());
        REQUIRE(pool->record(*buffer, stream).ok());
        void* const block = buffer->data();
        buffer->reset();
        return block;
    }
    std::byte* region(std::size_t k) const { return static_cast<std::byte*>(device) + k * bytes; }
    bool region_holds(std::size_t k, int fill) {
        return test::read_device(mock, region(k), bytes) == std::vector<std::byte>(bytes, static_cast<std::byte>(fill));
    }

    CheckingMock mock;
    void* device;
    MockBackend::Stream stream;
    std::optional<PinnedHostPool<CheckingMock>> pool;
};

}  // namespace

TEST_CASE("pinned streams: allocate queries a pending block and never waits for it", "[pinned][streams]") {
    StreamedPool setup;
    void* const block = setup.pending_upload(0x31);
    std::vector<PinnedBuffer> taken;
    for (int i = 0; i < 4; ++i) {
        auto buffer = setup.pool->allocate(StreamedPool::bytes);
        REQUIRE(buffer.ok());
        // Never a host wait: the block serves only once a query found its copy completed.
        CHECK(setup.mock.calls(MockOp::synchronize_event) == 0);
        CHECK(setup.mock.calls(MockOp::synchronize) == 0);
        if (buffer->data() == block) CHECK(setup.mock.pending_operations() == 0);
        std::memset(buffer->data(), 0xEE, StreamedPool::bytes);
        taken.push_back(std::move(*buffer));
    }
    // The mock answers "not ready" twice, then runs the work and answers ready.
    CHECK(setup.pool->stats().pending_skips == 2);
    CHECK(setup.mock.calls(MockOp::event_ready) == 3);
    CHECK(taken[2].data() == block);
    CHECK(setup.region_holds(0, 0x31));
    CHECK(setup.mock.misuses() == 0);
}

TEST_CASE("pinned streams: an event that cannot be had or recorded makes the release synchronize the device",
          "[pinned][streams][errors]") {
    for (const MockOp op : {MockOp::create_event, MockOp::record_event}) {
        INFO(to_string(op));
        StreamedPool setup;
        auto buffer = setup.pool->allocate(StreamedPool::bytes);
        REQUIRE(buffer.ok());
        std::memset(buffer->data(), 0x11, StreamedPool::bytes);
        REQUIRE(
            setup.mock.copy_to_device_async(setup.region(0), buffer->data(), StreamedPool::bytes, setup.stream).ok());
        REQUIRE(setup.pool->record(*buffer, setup.stream).ok());
        void* const block = buffer->data();
        setup.mock.fail_call(op, setup.mock.calls(op) + 1);
        buffer->reset();
        CHECK(pinned_suite::sink_calls == 1);
        CHECK_THAT(pinned_suite::sink_last, Catch::Contains("pinned pool release: recording an event") &&
                                                Catch::Contains("4096-byte block") && Catch::Contains("'mock'") &&
                                                Catch::Contains("synchronizing the device instead"));
        CHECK(setup.mock.calls(MockOp::synchronize) == 1);  // the copy ran: the block is settled
        CHECK(setup.pool->stats().pending_blocks == 0);
        CHECK(setup.pool->stats().host_waits == 1);
        auto next = setup.pool->allocate(StreamedPool::bytes);
        REQUIRE(next.ok());
        CHECK(next->data() == block);
        CHECK(setup.region_holds(0, 0x11));
        CHECK(setup.mock.live_events() == 0);  // a failed recording's event is destroyed, not reused
        CHECK(setup.mock.misuses() == 0);
    }
}

TEST_CASE("pinned streams: a block whose event and synchronize failed is never handed out until a wait settles it",
          "[pinned][streams][errors]") {
    StreamedPool setup;
    setup.mock.fail_call(MockOp::record_event, setup.mock.calls(MockOp::record_event) + 1);
    setup.mock.fail_call(MockOp::synchronize, 1);
    void* const block = setup.pending_upload(0x22);
    CHECK(pinned_suite::sink_calls == 2);
    CHECK_THAT(pinned_suite::sink_last,
               Catch::Contains("synchronize failed") && Catch::Contains("never reused") && Catch::Contains("'mock'"));
    CHECK(setup.pool->stats().pending_blocks == 1);
    const std::uint64_t queries = setup.mock.calls(MockOp::event_ready);
    std::vector<PinnedBuffer> taken;
    for (int i = 0; i < 4; ++i) {
        auto buffer = setup.pool->allocate(StreamedPool::bytes);
        REQUIRE(buffer.ok());
        CHECK(buffer->data() != block);
        std::memset(buffer->data(), 0xEE, StreamedPool::bytes);
        taken.push_back(std::move(*buffer));
    }
    CHECK(setup.mock.calls(MockOp::event_ready) == queries);  // no event can tell: nothing is queried
    REQUIRE(setup.pool->trim().ok());                         // synchronizes (now it works), then frees
    CHECK(setup.pool->stats().pending_blocks == 0);
    CHECK(setup.pool->stats().host_waits == 2);
    CHECK(setup.region_holds(0, 0x22));
    CHECK(setup.mock.misuses() == 0);
}

TEST_CASE("pinned streams: a failed query leaves the block pending, queried no more, until a wait",
          "[pinned][streams][errors]") {
    StreamedPool setup;
    void* const block = setup.pending_upload(0x33);
    setup.mock.fail_call(MockOp::event_ready, setup.mock.calls(MockOp::event_ready) + 1);
    std::vector<PinnedBuffer> taken;
    for (int i = 0; i < 4; ++i) {
        auto buffer = setup.pool->allocate(StreamedPool::bytes);
        REQUIRE(buffer.ok());
        CHECK(buffer->data() != block);
        std::memset(buffer->data(), 0xEE, StreamedPool::bytes);
        taken.push_back(std::move(*buffer));
    }
    CHECK(setup.mock.calls(MockOp::event_ready) == 1);
    CHECK(pinned_suite::sink_calls == 1);
    CHECK_THAT(pinned_suite::sink_last, Catch::Contains("pinned pool allocate: querying the work recorded") &&
                                            Catch::Contains("4096-byte block") && Catch::Contains("'mock'"));
    CHECK(setup.pool->stats().pending_blocks == 1);
    REQUIRE(setup.pool->trim().ok());
    CHECK(setup.pool->stats().pending_blocks == 0);
    CHECK(setup.region_holds(0, 0x33));
    CHECK(setup.mock.misuses() == 0);
}

TEST_CASE("pinned streams: a failed wait falls back to synchronize; when both fail the block stays allocated",
          "[pinned][streams][errors]") {
    StreamedPool setup;
    setup.pending_upload(0x44, 0);
    setup.mock.fail_call(MockOp::synchronize_event, setup.mock.calls(MockOp::synchronize_event) + 1);
    REQUIRE(setup.pool->trim().ok());  // synchronize_event failed; synchronize() settled it
    CHECK(setup.mock.calls(MockOp::synchronize) == 1);
    CHECK(setup.pool->stats().pending_blocks == 0);

    setup.pending_upload(0x55, 1);
    setup.mock.fail_call(MockOp::synchronize_event, setup.mock.calls(MockOp::synchronize_event) + 1);
    setup.mock.fail_call(MockOp::synchronize, setup.mock.calls(MockOp::synchronize) + 1);
    const Status failed = setup.pool->trim();
    CHECK_FALSE(failed.ok());
    CHECK_THAT(failed.message(), Catch::Contains("pinned pool trim: waiting for the work recorded on a 4096-byte") &&
                                     Catch::Contains("'mock'") && Catch::Contains("stays allocated"));
    CHECK(setup.pool->stats().pending_blocks == 1);  // kept, retiring: never reused
    CHECK(setup.pool->stats().retiring_blocks == 1);
    CHECK(setup.mock.misuses() == 0);  // nothing was freed under the pending copy
    auto other = setup.pool->allocate(StreamedPool::bytes);
    REQUIRE(other.ok());
    other->reset();
    REQUIRE(setup.pool->trim().ok());  // the next wait succeeds
    CHECK(setup.pool->stats().pending_blocks == 0);
    CHECK(setup.pool->stats().backend_frees == setup.pool->stats().backend_allocations);
    CHECK(setup.region_holds(0, 0x44));
    CHECK(setup.region_holds(1, 0x55));
    CHECK(setup.mock.misuses() == 0);
}

TEST_CASE("pinned streams: the destruction leaves allocated a block whose work can never be waited for",
          "[pinned][streams][errors]") {
    StreamedPool setup;
    setup.mock.set_error_sink(&test::quiet_sink);  // the mock reports the block it still has
    setup.pending_upload(0x66);
    setup.mock.fail_from(MockOp::synchronize_event, setup.mock.calls(MockOp::synchronize_event) + 1);
    setup.mock.fail_from(MockOp::synchronize, setup.mock.calls(MockOp::synchronize) + 1);
    setup.pool.reset();
    CHECK(pinned_suite::sink_calls >= 2);
    CHECK_THAT(pinned_suite::sink_last, Catch::Contains("could not be waited for stay allocated") &&
                                            Catch::Contains("4096 bytes") && Catch::Contains("'mock'"));
    CHECK(setup.mock.live_pinned_allocations() == 1);
    CHECK(setup.mock.misuses() == 0);
    setup.mock.clear_faults();
}

// Over a mock that checks its streams (no event call before the release) and one that does
// not (the pool records an event at record() to check the stream): a record refused by an
// injected failure leaves the caller to wait for its work before giving the buffer back.
TEMPLATE_TEST_CASE("pinned streams: a sweep over failures of every event call never reuses or frees a block early",
                   "[pinned][streams][errors]", CheckingMock, test::DeferredMock) {
    constexpr std::size_t region = 8192;
    constexpr int rounds = 6, per_round = 3;
    for (const MockOp op : {MockOp::create_event, MockOp::record_event, MockOp::event_ready, MockOp::synchronize_event,
                            MockOp::synchronize, MockOp::destroy_event}) {
        for (std::uint64_t k = 1;; ++k) {
            INFO(to_string(op) << " call " << k << " fails");
            TestType mock(MockConfig{.sink = &test::quiet_sink});  // a failed destroy_event leaks it
            pinned_suite::sink_calls = 0;
            const MockBackend::Stream streams[] = {*mock.create_stream(), *mock.create_stream()};
            auto* const device = static_cast<std::byte*>(*mock.device_malloc(rounds * per_round * region));
            mock.fail_call(op, k);
            {
                PinnedHostPool<TestType> pool(mock, CachingPinned{.max_cached_bytes = 64 << 10});
                pool.set_error_sink(&pinned_suite::counting_sink);
                for (int round = 0; round < rounds; ++round) {
                    std::vector<PinnedBuffer> probes;
                    for (int j = 0; j < per_round; ++j) {
                        const int n = round * per_round + j;
                        const std::size_t bytes = 1000 + static_cast<std::size_t>(j) * 2500;
                        auto buffer = pool.allocate(bytes);
                        REQUIRE(buffer.ok());
                        std::memset(buffer->data(), n + 1, bytes);
                        const auto stream = streams[j % 2];
                        REQUIRE(mock.copy_to_device_async(device + static_cast<std::size_t>(n) * region, buffer->data(),
                                                          bytes, stream)
                                    .ok());
                        bool refused = !pool.record(*buffer, stream).ok();
                        if (j == 1) refused = !pool.record(*buffer, streams[0]).ok() || refused;
                        if (refused) {
                            // Nothing (or not everything) was recorded: the caller waits itself.
                            REQUIRE_FALSE(devstage::StreamCheckBackend<TestType>);
                            mock.clear_faults();
                            REQUIRE(mock.synchronize().ok());
                        }
                        buffer->reset();
                        auto probe = pool.allocate(bytes);  // a block handed out early would hold these bytes
                        REQUIRE(probe.ok());
                        std::memset(probe->data(), 0xEE, bytes);
                        probes.push_back(std::move(*probe));
                    }
                    if (round == 2) (void)pool.trim();
                    if (round == 4) (void)pool.finalize();
                }
            }
            mock.clear_faults();
            CHECK(mock.synchronize().ok());
            for (int n = 0; n < rounds * per_round; ++n) {
                const std::size_t bytes = 1000 + static_cast<std::size_t>(n % per_round) * 2500;
                CHECK(test::read_device(mock, device + static_cast<std::size_t>(n) * region, bytes) ==
                      std::vector<std::byte>(bytes, static_cast<std::byte>(n + 1)));
            }
            CHECK(mock.misuses() == 0);
            CHECK(mock.live_pinned_allocations() == 0);
            CHECK(mock.live_events() == (op == MockOp::destroy_event ? 1u : 0u));
            CHECK(pinned_suite::sink_calls > 0);  // every failure is reported, naming the backend
            CHECK(pinned_suite::sink_last.find("'mock'") != std::string::npos);
            CHECK(mock.device_free(device).ok());
            for (const auto stream : streams) CHECK(mock.destroy_stream(stream).ok());
            if (mock.calls(op) <= k) break;  // the scenario made no call k + 1
        }
    }
}
