// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pinned-pool contract, written once and instantiated for every PinnedHostBackend. The
// including TU defines `PinnedBackends` (a std::tuple of backend types with a BackendFactory);
// the stream cases ("pinned streams:") run for those of them that model AsyncBackend.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <memory_resource>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "async_support.hpp"
#include "devstage/pinned.hpp"
#include "support.hpp"

namespace pinned_suite {
inline std::atomic<int> sink_calls{0};
inline std::string sink_last;
inline void counting_sink(const devstage::Status& status) noexcept {
    ++sink_calls;
    sink_last = status.message();
}

// The backends of a std::tuple that model AsyncBackend.
template <class List>
struct AsyncOnly;
template <>
struct AsyncOnly<std::tuple<>> {
    using type = std::tuple<>;
};
template <class B, class... Rest>
struct AsyncOnly<std::tuple<B, Rest...>> {
    using rest = typename AsyncOnly<std::tuple<Rest...>>::type;
    using type =
        std::conditional_t<devstage::AsyncBackend<B>,
                           decltype(std::tuple_cat(std::declval<std::tuple<B>>(), std::declval<rest>())), rest>;
};

// What a backend can tell about misuse and what it still holds; 0 where it cannot tell.
template <class B>
std::uint64_t misuses(const B& backend) {
    if constexpr (std::is_base_of_v<devstage::MockBackend, B>) return backend.misuses();
    return 0;
}
template <class B>
std::uint64_t live_pinned_blocks(B& backend) {
    if constexpr (std::is_base_of_v<devstage::MockBackend, B>) return backend.live_pinned_allocations();
    if constexpr (std::is_same_v<B, devstage::SimBackend>) {
        return backend.stats().pinned_mallocs - backend.stats().pinned_frees;
    }
    return 0;
}
template <class B>
std::uint64_t live_events(B& backend) {
    if constexpr (std::is_base_of_v<devstage::MockBackend, B>) return backend.live_events();
    if constexpr (std::is_same_v<B, devstage::SimBackend>) return backend.stats().live_events;
    return 0;
}
}  // namespace pinned_suite

using PinnedAsyncBackends = pinned_suite::AsyncOnly<PinnedBackends>::type;

TEMPLATE_LIST_TEST_CASE("pinned: buffers are RAII and their memory is the backend's pinned memory", "[pinned]",
                        PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    {
        auto buffer = pool.allocate(1000);
        REQUIRE(buffer.ok());
        CHECK(buffer->size() == 1000);
        CHECK(pool.owns(buffer->data()));
        CHECK(pool.stats().live_bytes == 1000);
        PinnedBuffer moved = std::move(*buffer);
        CHECK(buffer->empty());
        CHECK(pool.stats().live_allocations == 1);
        std::span<std::uint32_t> words = moved.as<std::uint32_t>();
        CHECK(words.size() == 250);
        words[249] = 7;
    }
    CHECK(pool.stats().live_allocations == 0);
    CHECK(pool.stats().live_bytes == 0);
    CHECK(pool.stats().peak_live_bytes == 1000);
}

TEMPLATE_LIST_TEST_CASE("pinned: unknown and double release are unknown_pointer", "[pinned]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    int stack_value = 0;
    const Status unknown = pool.release(&stack_value);
    CHECK(unknown.code() == Errc::unknown_pointer);
    CHECK_THAT(unknown.message(), Catch::Contains(std::string(backend->name())));
    auto raw = pool.allocate_raw(64);
    REQUIRE(raw.ok());
    CHECK(pool.release(*raw).ok());
    CHECK(pool.release(*raw).code() == Errc::unknown_pointer);
    CHECK_FALSE(pool.owns(*raw));
    CHECK(pool.allocate(0).status().code() == Errc::invalid_argument);
}

TEMPLATE_LIST_TEST_CASE("pinned: finalize frees the cache only; live memory stays valid until given back", "[pinned]",
                        PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    sink_calls = 0;
    PinnedBuffer survivor;
    std::shared_ptr<detail::PinnedCore> core;
    {
        PinnedHostPool<TestType> pool(*backend);
        pool.set_error_sink(&counting_sink);
        auto a = pool.allocate(100);
        auto b = pool.allocate_raw(300);
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        { auto released = pool.allocate(50); }  // into the cache
        REQUIRE(pool.stats().cached_blocks == 1);
        std::memset(a->data(), 0x5A, a->size());
        REQUIRE(pool.finalize().ok());
        const PinnedStats after = pool.stats();
        CHECK(after.cached_blocks == 0);
        CHECK(after.backend_frees == 1);  // the cached block, nothing live
        CHECK(after.live_allocations == 2);
        CHECK(after.live_bytes == 400);
        CHECK(after.finalized_allocations == 2);
        CHECK(after.finalized_bytes == 400);
        CHECK(after.detached_allocations == 2);
        CHECK(after.detached_bytes == 400);
        CHECK(sink_calls == 1);
        CHECK_THAT(sink_last, Catch::Contains("2 allocation(s) still live") && Catch::Contains("400 bytes") &&
                                  Catch::Contains(std::string(backend->name())));
        // The buffer and the raw pointer still own their memory.
        CHECK_FALSE(a->empty());
        CHECK(pool.owns(a->data()));
        CHECK(pool.owns(*b));
        CHECK(static_cast<unsigned char*>(a->data())[99] == 0x5A);
        std::memset(*b, 0x11, 300);
        REQUIRE(pool.finalize().ok());  // a second finalize counts nothing twice
        CHECK(pool.stats().finalized_allocations == 2);
        a->reset();  // detached: back to the backend, not into the cache
        CHECK(pool.stats().cached_blocks == 0);
        CHECK(pool.stats().backend_frees == 2);
        CHECK(pool.release(*b).ok());
        CHECK(pool.stats().backend_frees == pool.stats().backend_allocations);
        CHECK(pool.stats().detached_allocations == 0);
        CHECK(pool.stats().live_allocations == 0);
        // The pool stays usable (and caches again), and a buffer may outlive the pool itself.
        { auto cached = pool.allocate(70); }
        CHECK(pool.stats().cached_blocks == 1);
        auto c = pool.allocate(200);
        REQUIRE(c.ok());
        survivor = std::move(*c);
        core = pool.core();
        sink_calls = 0;
    }
    CHECK(sink_calls == 1);  // the destruction reported the survivor
    CHECK_THAT(sink_last, Catch::Contains("1 allocation(s) still live") && Catch::Contains("200 bytes"));
    REQUIRE_FALSE(survivor.empty());
    std::span<unsigned char> bytes = survivor.as<unsigned char>();
    std::fill(bytes.begin(), bytes.end(), static_cast<unsigned char>(0x33));  // still valid memory
    CHECK(bytes[199] == 0x33);
    CHECK(core->stats().live_allocations == 1);
    CHECK(core->stats().cached_blocks == 0);  // the destruction freed the cache
    survivor.reset();                         // now it goes back to the backend
    const PinnedStats last = core->stats();
    CHECK(last.live_allocations == 0);
    CHECK(last.backend_frees == last.backend_allocations);
}

TEMPLATE_LIST_TEST_CASE("pinned: the pool's destruction frees raw allocations nothing can release any more", "[pinned]",
                        PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    sink_calls = 0;
    std::shared_ptr<detail::PinnedCore> core;
    PinnedBuffer kept;
    {
        PinnedHostPool<TestType> pool(*backend);
        pool.set_error_sink(&counting_sink);
        core = pool.core();
        REQUIRE(pool.allocate_raw(300).ok());
        auto buffer = pool.allocate(100);
        REQUIRE(buffer.ok());
        kept = std::move(*buffer);
    }
    CHECK(sink_calls == 1);
    CHECK_THAT(sink_last, Catch::Contains("2 allocation(s) still live, 400 bytes") &&
                              Catch::Contains("1 raw (300 bytes) freed") &&
                              Catch::Contains("1 held by buffers or containers (100 bytes)"));
    CHECK(core->stats().live_allocations == 1);
    CHECK(core->stats().backend_frees + 1 == core->stats().backend_allocations);
    kept.reset();
    CHECK(core->stats().backend_frees == core->stats().backend_allocations);
}

TEMPLATE_LIST_TEST_CASE("pinned: containers outlive finalize and their pool; no held address is reused", "[pinned]",
                        PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    sink_calls = 0;
    std::optional<PinnedHostPool<TestType>> pool(std::in_place, *backend);
    pool->set_error_sink(&counting_sink);
    const std::shared_ptr<detail::PinnedCore> core = pool->core();
    const std::string text(100, 'x');  // longer than any small-string buffer: each string owns memory
    {
        PinnedMemoryResource resource(*pool);
        std::vector<std::string, PinnedAllocator<std::string>> strings{PinnedAllocator<std::string>(*pool)};
        std::pmr::vector<std::pmr::string> pmr_strings(&resource);
        strings.reserve(8);
        for (int i = 0; i < 8; ++i) {
            strings.push_back(text + std::to_string(i));
            pmr_strings.emplace_back(text + std::to_string(i));
        }
        void* const held = strings.data();
        REQUIRE(pool->finalize().ok());
        CHECK(sink_calls == 1);
        CHECK(pool->owns(held));
        CHECK(pool->owns(pmr_strings.data()));
        CHECK(strings[7] == text + "7");
        // An allocation of the same size class after finalize gets another address: nothing
        // still held is handed out twice.
        auto fresh = pool->allocate(strings.capacity() * sizeof(std::string));
        REQUIRE(fresh.ok());
        CHECK(fresh->data() != held);
        strings.push_back(text + "8");  // grows: the old block goes back to the backend
        CHECK_FALSE(pool->owns(held));
        CHECK(pool->owns(fresh->data()));  // the container's deallocation did not touch it
        fresh->reset();

        pool.reset();  // the pool dies; the containers' memory stays theirs
        CHECK(strings[8] == text + "8");
        CHECK(std::string_view(pmr_strings[7]) == text + "7");
        pmr_strings[0][0] = 'y';
        CHECK(core->stats().live_allocations == 2 + 8);                            // two vectors, eight pmr strings
        CHECK_THROWS_AS(strings.reserve(strings.capacity() * 2), std::bad_alloc);  // no pool to grow from
        CHECK(strings.size() == 9);
    }  // destructors run on memory that is still valid, then give it back
    const PinnedStats last = core->stats();
    CHECK(last.live_allocations == 0);
    CHECK(last.backend_frees == last.backend_allocations);
}

TEMPLATE_LIST_TEST_CASE("pinned: move assignment and swap carry the allocator, across pools too", "[pinned]",
                        PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    using Floats = std::vector<float, PinnedAllocator<float>>;
    auto backend = test::make_backend<TestType>();
    std::optional<PinnedHostPool<TestType>> first(std::in_place, *backend);
    first->set_error_sink(&test::quiet_sink);
    PinnedHostPool<TestType> second(*backend);
    {
        Floats a(100, 1.0f, PinnedAllocator<float>(*first));
        Floats b(50, 2.0f, PinnedAllocator<float>(second));
        a.swap(b);
        CHECK(second.owns(a.data()));
        CHECK(a.get_allocator() == PinnedAllocator<float>(second));
        first.reset();     // b's pool dies
        a = std::move(b);  // nothing allocated from the dead pool: memory and allocator move together
        CHECK(a.size() == 100);
        CHECK(a[99] == 1.0f);
        CHECK(second.stats().live_allocations == 0);
    }
    CHECK(second.stats().live_allocations == 0);
}

TEMPLATE_LIST_TEST_CASE("pinned: a container's memory is given back only by its allocator", "[pinned]",
                        PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    sink_calls = 0;
    pool.set_error_sink(&counting_sink);
    std::vector<int, PinnedAllocator<int>> values(100, 1, PinnedAllocator<int>(pool));
    const Status refused = pool.release(values.data());
    CHECK(refused.code() == Errc::invalid_argument);
    CHECK_THAT(refused.message(), Catch::Contains("belongs to a container"));
    CHECK(pool.owns(values.data()));
    auto buffer = pool.allocate(64);
    REQUIRE(buffer.ok());
    PinnedAllocator<char> chars(pool);
    chars.deallocate(static_cast<char*>(buffer->data()), 64);  // not a container's: reported, kept
    CHECK(sink_calls == 1);
    CHECK_THAT(sink_last, Catch::Contains("not a container's"));
    CHECK(pool.owns(buffer->data()));
    char stranger = 0;
    chars.deallocate(&stranger, 1);
    CHECK(sink_calls == 2);
    CHECK_THAT(sink_last, Catch::Contains("is not a live allocation of this pool"));
    CHECK(values[99] == 1);
}

TEMPLATE_LIST_TEST_CASE("pinned: threads allocating while the pool is destroyed get memory or bad_alloc, never a leak",
                        "[pinned][threads]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    std::optional<PinnedHostPool<TestType>> pool(std::in_place, *backend);
    pool->set_error_sink(&test::quiet_sink);  // the destruction reports what the threads hold
    const std::shared_ptr<detail::PinnedCore> core = pool->core();
    const PinnedAllocator<std::uint64_t> allocator(*pool);
    std::atomic<int> running{0};
    std::atomic<int> refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, allocator, t] {
            for (std::uint64_t i = 0;; ++i) {
                try {
                    std::vector<std::uint64_t, PinnedAllocator<std::uint64_t>> values(
                        64 + (i * 37 + static_cast<std::uint64_t>(t) * 101) % 700, i, allocator);
                    if (values.back() != i) break;
                } catch (const std::bad_alloc&) {
                    ++refused;  // the pool is gone
                    break;
                }
                if (i == 8) ++running;
            }
        });
    }
    while (running < 4) std::this_thread::yield();
    pool.reset();
    for (auto& thread : threads) thread.join();
    CHECK(refused == 4);
    const PinnedStats stats = core->stats();
    CHECK(stats.live_allocations == 0);
    CHECK(stats.cached_blocks == 0);
    CHECK(stats.backend_frees == stats.backend_allocations);
}

TEMPLATE_LIST_TEST_CASE("pinned: over-aligned requests are padded, not refused", "[pinned]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    PinnedMemoryResource resource(pool);
    for (std::size_t alignment : {std::size_t{64}, std::size_t{256}, std::size_t{4096}, std::size_t{1} << 16}) {
        void* pointer = resource.allocate(1000, alignment);
        CHECK(detail::is_aligned(pointer, alignment));
        CHECK(pool.owns(pointer));
        std::memset(pointer, 0x7E, 1000);
        resource.deallocate(pointer, 1000, alignment);
    }
    CHECK(pool.stats().live_allocations == 0);
    struct alignas(8192) Page {
        unsigned char bytes[8192];
    };
    {
        std::vector<Page, PinnedAllocator<Page>> pages(3, Page{}, PinnedAllocator<Page>(pool));
        CHECK(detail::is_aligned(pages.data(), alignof(Page)));
        pages[2].bytes[8191] = 1;
        CHECK(pool.owns(pages.data()));
    }
    CHECK(pool.stats().live_allocations == 0);
    REQUIRE(pool.trim().ok());
    CHECK(pool.stats().backend_frees == pool.stats().backend_allocations);
}

TEMPLATE_LIST_TEST_CASE("pinned: the cache reuses blocks by size class and trims", "[pinned]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    void* first = nullptr;
    {
        auto a = pool.allocate(3000);
        REQUIRE(a.ok());
        first = a->data();
    }
    CHECK(pool.stats().cached_blocks == 1);
    CHECK(pool.stats().cached_bytes == 4096);
    {
        auto b = pool.allocate(4000);  // same class: a hit, the same block
        REQUIRE(b.ok());
        CHECK(b->data() == first);
        CHECK(pool.stats().cache_hits == 1);
        auto c = pool.allocate(5000);  // another class: a miss
        REQUIRE(c.ok());
        CHECK(pool.stats().cache_misses == 2);
    }
    CHECK(pool.stats().backend_allocations == 2);
    REQUIRE(pool.trim().ok());
    CHECK(pool.stats().cached_bytes == 0);
    CHECK(pool.stats().backend_frees == 2);
}

TEMPLATE_LIST_TEST_CASE("pinned: concurrent allocate and release from 8 threads", "[pinned][threads]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend, CachingPinned{.max_cached_bytes = 1 << 20});
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&pool, &failures, t] {
            std::vector<PinnedBuffer> held;
            for (int i = 0; i < 200; ++i) {
                auto buffer = pool.allocate(static_cast<std::size_t>(64 + (i * 37 + t * 101) % 5000));
                if (!buffer) {
                    ++failures;
                    continue;
                }
                static_cast<unsigned char*>(buffer->data())[0] = static_cast<unsigned char>(t);
                held.push_back(std::move(*buffer));
                if (i % 3 == 0) held.erase(held.begin());
                if (i % 7 == 0) {
                    auto raw = pool.allocate_raw(128);
                    if (!raw || !pool.release(*raw)) ++failures;
                }
            }
        });
    }
    for (auto& thread : threads) thread.join();
    CHECK(failures == 0);
    CHECK(pool.stats().live_allocations == 0);
    REQUIRE(pool.trim().ok());
    CHECK(pool.stats().backend_frees == pool.stats().backend_allocations);
}

TEMPLATE_LIST_TEST_CASE("pinned: std::vector with PinnedAllocator fills pinned memory", "[pinned]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    {
        std::vector<float, PinnedAllocator<float>> values(1000, 1.5f, PinnedAllocator<float>(pool));
        values.push_back(2.5f);
        CHECK(pool.owns(values.data()));
        CHECK(values.back() == 2.5f);
        PinnedAllocator<double> rebound(values.get_allocator());
        CHECK(PinnedAllocator<float>(rebound) == values.get_allocator());
    }
    CHECK(pool.stats().live_allocations == 0);
}

TEMPLATE_LIST_TEST_CASE("pinned: the pmr adaptor serves pmr containers", "[pinned]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    PinnedMemoryResource resource(pool);
    {
        std::pmr::vector<std::uint64_t> values(&resource);
        values.resize(4096, 9);
        CHECK(pool.owns(values.data()));
    }
    CHECK(pool.stats().live_allocations == 0);
    PinnedMemoryResource same(pool);
    CHECK(resource.is_equal(same));
    CHECK_FALSE(resource.is_equal(*std::pmr::new_delete_resource()));
}

TEMPLATE_LIST_TEST_CASE("pinned: as<T>() rejects sizes and alignments that do not fit", "[pinned]", PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    PinnedHostPool<TestType> pool(*backend);
    auto odd_result = pool.allocate(10);
    REQUIRE(odd_result.ok());
    const PinnedBuffer& odd = *odd_result;
    CHECK(odd.as<std::uint32_t>().empty());  // 10 is not a multiple of 4
    CHECK(odd.as<std::uint16_t>().size() == 5);
    struct alignas(8192) Huge {
        char c[8192];
    };
    auto big_result = pool.allocate(8192);
    REQUIRE(big_result.ok());
    const PinnedBuffer& big = *big_result;
    // Buffers are not padded for alignment: 8192 alignment holds only by chance, and as<> checks it.
    CHECK(big.as<Huge>().size() == ((reinterpret_cast<std::uintptr_t>(big.data()) % 8192 == 0) ? 1u : 0u));
    PinnedBuffer empty;
    CHECK(empty.as<char>().empty());
}

// ---- pinned memory and streams ---------------------------------------------------------------

TEMPLATE_LIST_TEST_CASE("pinned streams: a recorded block is not handed out again until its copy completed",
                        "[pinned][streams]", PinnedAsyncBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    constexpr std::size_t bytes = 4096;
    auto backend = test::make_backend<TestType>();
    const auto stream = test::make_stream(*backend);
    const auto before = test::make_event(*backend);
    const auto after = test::make_event(*backend);
    {
        PinnedHostPool<TestType> pool(*backend);
        test::DeviceBytes<TestType> device(*backend, bytes);
        // The stream waits behind a held host function where the backend has them (the copy
        // then cannot run); the deferred mock runs nothing before the host synchronizes.
        constexpr bool holdable = HostFunctionBackend<TestType>;
        test::StreamGate gate;
        if constexpr (holdable) REQUIRE(backend->launch_host_func(stream, &test::StreamGate::hold, &gate).ok());
        const std::vector<std::byte> original = test::pattern(bytes, 1);
        auto first = pool.allocate(bytes);
        REQUIRE(first.ok());
        std::copy(original.begin(), original.end(), static_cast<std::byte*>(first->data()));
        REQUIRE(backend->copy_to_device_async(device.get(), first->data(), bytes, stream).ok());
        REQUIRE(backend->record_event(before, stream).ok());
        REQUIRE(pool.record(*first, stream).ok());
        void* const block = first->data();
        first->reset();
        REQUIRE(backend->record_event(after, stream).ok());
        CHECK(pool.stats().pending_blocks == 1);
        CHECK(pool.stats().cached_blocks == 1);
        // Held or deferred: the copy has not run. A host function that ran inline ran at the
        // call (eager streams): so did the copy.
        const bool held = holdable && !gate.ran_inline();
        const bool eager = holdable && gate.ran_inline();

        std::vector<PinnedBuffer> taken;
        for (int i = 0; i < 4; ++i) {  // none of these waits for the stream
            auto next = pool.allocate(bytes);
            REQUIRE(next.ok());
            if (next->data() == block) {
                // Handed out again: only once the copy (and `before`, recorded after it) completed.
                const Result<bool> done = backend->event_ready(before);
                REQUIRE(done.ok());
                CHECK(*done);
                const bool first_while_held = held && i == 0;
                CHECK_FALSE(first_while_held);
            } else {
                const bool first_when_eager = eager && i == 0;  // the copy ran at the call: a cache hit
                CHECK_FALSE(first_when_eager);
            }
            const std::vector<std::byte> other = test::pattern(bytes, 2);
            std::copy(other.begin(), other.end(), static_cast<std::byte*>(next->data()));  // a reuse would leak here
            taken.push_back(std::move(*next));
        }
        if (held) CHECK(pool.stats().pending_skips >= 1);
        gate.open();
        REQUIRE(backend->synchronize_event(after).ok());
        CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, device.get(), bytes), original));
        const bool reused = std::any_of(taken.begin(), taken.end(),
                                        [block](const PinnedBuffer& buffer) { return buffer.data() == block; });
        if (!reused) {
            auto again = pool.allocate(bytes);  // the copy completed: now the block serves
            REQUIRE(again.ok());
            CHECK(again->data() == block);
        }
        CHECK(pool.stats().pending_blocks == 0);
        CHECK(misuses(*backend) == 0);
    }
    CHECK(backend->destroy_event(before).ok());
    CHECK(backend->destroy_event(after).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("pinned streams: trim, finalize and the destruction wait for recorded work before freeing",
                        "[pinned][streams]", PinnedAsyncBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    constexpr std::size_t bytes = 4096;
    auto backend = test::make_backend<TestType>();
    const auto stream = test::make_stream(*backend);
    const auto done = test::make_event(*backend);
    const std::uint64_t events_before = live_events(*backend);
    std::vector<std::vector<std::byte>> patterns;
    for (std::uint32_t k = 0; k < 6; ++k) patterns.push_back(test::pattern(bytes, 10 + k));
    {
        test::DeviceBytes<TestType> device(*backend, 6 * bytes);
        const auto region = [&device](std::size_t k) { return device.get() + k * bytes; };
        std::shared_ptr<detail::PinnedCore> core;
        PinnedBuffer survivor;
        sink_calls = 0;
        {
            PinnedHostPool<TestType> pool(*backend);
            pool.set_error_sink(&counting_sink);
            core = pool.core();
            // Copies region k's pattern from pinned memory at `host` and records the stream there.
            const auto upload = [&](void* host, std::size_t k) {
                std::copy(patterns[k].begin(), patterns[k].end(), static_cast<std::byte*>(host));
                REQUIRE(backend->copy_to_device_async(region(k), host, bytes, stream).ok());
                REQUIRE(pool.record(host, stream).ok());
            };
            {
                auto buffer = pool.allocate(bytes);
                REQUIRE(buffer.ok());
                upload(buffer->data(), 0);
                buffer->reset();
                CHECK(pool.stats().pending_blocks == 1);
                REQUIRE(pool.trim().ok());  // waits for the copy, then frees
                const PinnedStats trimmed = pool.stats();
                CHECK(trimmed.pending_blocks == 0);
                CHECK(trimmed.cached_blocks == 0);
                CHECK(trimmed.host_waits == 1);
                CHECK(trimmed.backend_frees == trimmed.backend_allocations);
            }
            {
                auto cached = pool.allocate(bytes);
                auto live = pool.allocate(bytes);
                REQUIRE(cached.ok());
                REQUIRE(live.ok());
                upload(cached->data(), 1);
                upload(live->data(), 2);
                cached->reset();
                REQUIRE(pool.finalize().ok());  // waits for the cached block; reports the live one
                CHECK(sink_calls == 1);
                CHECK(pool.stats().pending_blocks == 0);
                CHECK(pool.stats().cached_blocks == 0);
                live->reset();  // detached: not cached, freed once its copy completed
                CHECK(pool.stats().retiring_blocks == 1);
                CHECK(pool.stats().pending_blocks == 1);
                CHECK(pool.stats().cached_blocks == 0);
                REQUIRE(pool.trim().ok());
                CHECK(pool.stats().retiring_blocks == 0);
                CHECK(pool.stats().backend_frees == pool.stats().backend_allocations);
            }
            auto pending = pool.allocate(bytes);
            auto outliving = pool.allocate(bytes);
            auto raw = pool.allocate_raw(bytes);
            REQUIRE(pending.ok());
            REQUIRE(outliving.ok());
            REQUIRE(raw.ok());
            upload(pending->data(), 3);
            upload(outliving->data(), 4);
            upload(*raw, 5);
            pending->reset();
            survivor = std::move(*outliving);
            sink_calls = 0;
        }  // waits for the pending block's and the raw allocation's copies, frees both
        CHECK(sink_calls == 1);
        CHECK_THAT(sink_last, Catch::Contains("1 raw (4096 bytes) freed") && Catch::Contains("1 held by buffers"));
        const PinnedStats after_pool = core->stats();
        CHECK(after_pool.live_allocations == 1);
        CHECK(after_pool.pending_blocks == 0);
        CHECK(after_pool.backend_allocations - after_pool.backend_frees == 1);
        core.reset();
        survivor.reset();  // after the pool's death: the core waits for its copy, then frees it
        REQUIRE(backend->record_event(done, stream).ok());
        REQUIRE(backend->synchronize_event(done).ok());
        for (std::size_t k = 0; k < patterns.size(); ++k) {
            INFO("region " << k);
            CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, region(k), bytes), patterns[k]));
        }
        CHECK(misuses(*backend) == 0);
        CHECK(live_pinned_blocks(*backend) == 0);
        CHECK(live_events(*backend) == events_before);  // the pool destroyed every event it made
    }
    CHECK(backend->destroy_event(done).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("pinned streams: events are created once and re-recorded", "[pinned][streams]",
                        PinnedAsyncBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    constexpr std::size_t bytes = 1000;
    auto backend = test::make_backend<TestType>();
    const auto upload = test::make_stream(*backend);
    const auto other = test::make_stream(*backend);
    const auto upload_done = test::make_event(*backend);
    const auto other_done = test::make_event(*backend);
    const std::uint64_t events_before = live_events(*backend);
    {
        test::DeviceBytes<TestType> device(*backend, 2 * bytes);
        PinnedHostPool<TestType> pool(*backend);
        for (int round = 0; round < 20; ++round) {
            auto buffer = pool.allocate(bytes);
            REQUIRE(buffer.ok());
            std::memset(buffer->data(), round, bytes);
            REQUIRE(backend->copy_to_device_async(device.get(), buffer->data(), bytes, upload).ok());
            REQUIRE(backend->copy_to_device_async(device.get() + bytes, buffer->data(), bytes, other).ok());
            REQUIRE(pool.record(*buffer, upload).ok());
            REQUIRE(pool.record(*buffer, other).ok());
            REQUIRE(pool.record(*buffer, upload).ok());  // once per stream
            buffer->reset();
            REQUIRE(backend->record_event(upload_done, upload).ok());
            REQUIRE(backend->record_event(other_done, other).ok());
            REQUIRE(backend->synchronize_event(upload_done).ok());
            REQUIRE(backend->synchronize_event(other_done).ok());
        }
        const PinnedStats stats = pool.stats();
        CHECK(stats.events_created == 2);  // one per stream, re-recorded at every release
        CHECK(stats.backend_allocations == 1);
        CHECK(stats.cache_hits == 19);
        if (events_before > 0) CHECK(live_events(*backend) == events_before + 2);  // where the backend tells
    }
    CHECK(live_events(*backend) == events_before);  // destroyed with the pool
    CHECK(misuses(*backend) == 0);
    CHECK(backend->destroy_event(upload_done).ok());
    CHECK(backend->destroy_event(other_done).ok());
    CHECK(backend->destroy_stream(upload).ok());
    CHECK(backend->destroy_stream(other).ok());
}

TEMPLATE_LIST_TEST_CASE("pinned streams: record takes buffers, raw pointers and container memory of its pool only",
                        "[pinned][streams]", PinnedAsyncBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    const auto stream = test::make_stream(*backend);
    const auto done = test::make_event(*backend);
    {
        test::DeviceBytes<TestType> device(*backend, 8192);
        PinnedHostPool<TestType> pool(*backend);
        PinnedHostPool<TestType> other(*backend);
        const std::string name(backend->name());

        const Status empty = pool.record(PinnedBuffer(), stream);
        CHECK(empty.code() == Errc::invalid_argument);
        CHECK_THAT(empty.message(),
                   Catch::Contains("pinned pool record") && Catch::Contains("empty") && Catch::Contains(name));
        auto foreign = other.allocate(300);
        REQUIRE(foreign.ok());
        const Status refused = pool.record(*foreign, stream);
        CHECK(refused.code() == Errc::invalid_argument);
        CHECK_THAT(refused.message(),
                   Catch::Contains("300-byte buffer") && Catch::Contains("another pool") && Catch::Contains(name));
        int stranger = 0;
        CHECK(pool.record(&stranger, stream).code() == Errc::unknown_pointer);
        auto given_back = pool.allocate(100);
        REQUIRE(given_back.ok());
        REQUIRE(pool.release(given_back->data()).ok());
        CHECK(pool.record(*given_back, stream).code() == Errc::unknown_pointer);  // its grant is gone
        CHECK(pool.stats().pending_blocks == 0);

        // A raw allocation, recorded and released.
        auto raw = pool.allocate_raw(2000);
        REQUIRE(raw.ok());
        std::memset(*raw, 0x21, 2000);
        REQUIRE(backend->copy_to_device_async(device.get(), *raw, 2000, stream).ok());
        REQUIRE(pool.record(*raw, stream).ok());
        REQUIRE(pool.release(*raw).ok());
        CHECK(pool.stats().pending_blocks == 1);

        // A container's memory: growing the vector gives the recorded block back, pending.
        std::vector<std::uint8_t, PinnedAllocator<std::uint8_t>> values(4096, 0x42,
                                                                        PinnedAllocator<std::uint8_t>(pool));
        REQUIRE(backend->copy_to_device_async(device.get() + 4096, values.data(), 4096, stream).ok());
        REQUIRE(pool.record(values.data(), stream).ok());
        values.resize(3 * 4096, 0x43);
        CHECK(pool.stats().pending_blocks == 2);

        REQUIRE(backend->record_event(done, stream).ok());
        REQUIRE(backend->synchronize_event(done).ok());
        CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, device.get(), 2000),
                                         std::vector<std::byte>(2000, std::byte{0x21})));
        CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, device.get() + 4096, 4096),
                                         std::vector<std::byte>(4096, std::byte{0x42})));
        CHECK(misuses(*backend) == 0);
    }
    CHECK(backend->destroy_event(done).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("pinned streams: a block the pool would free waits, retiring, until its work completed",
                        "[pinned][streams]", PinnedAsyncBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    const auto stream = test::make_stream(*backend);
    const auto done = test::make_event(*backend);
    {
        test::DeviceBytes<TestType> device(*backend, 1000);
        PinnedHostPool<TestType, DirectPinned> pool(*backend);
        auto buffer = pool.allocate(1000);
        REQUIRE(buffer.ok());
        std::memset(buffer->data(), 0x5C, 1000);
        REQUIRE(backend->copy_to_device_async(device.get(), buffer->data(), 1000, stream).ok());
        REQUIRE(pool.record(*buffer, stream).ok());
        buffer->reset();  // DirectPinned frees on release: here only once the copy completed
        CHECK(pool.stats().retiring_blocks == 1);
        CHECK(pool.stats().retiring_bytes == 1000);
        CHECK(pool.stats().pending_blocks == 1);
        CHECK(pool.stats().cached_blocks == 0);
        REQUIRE(backend->record_event(done, stream).ok());
        REQUIRE(backend->synchronize_event(done).ok());
        { auto next = pool.allocate(500); }  // a later release frees what completed since
        CHECK(pool.stats().retiring_blocks == 0);
        CHECK(pool.stats().pending_blocks == 0);
        CHECK(pool.stats().backend_frees == 2);
        CHECK(pool.stats().host_waits == 0);
        CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, device.get(), 1000),
                                         std::vector<std::byte>(1000, std::byte{0x5C})));
        CHECK(misuses(*backend) == 0);
    }
    CHECK(backend->destroy_event(done).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("pinned streams: 8 threads allocate, record on several streams and release",
                        "[pinned][streams][threads]", PinnedAsyncBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    constexpr int thread_count = 8, rounds = 25;
    constexpr std::size_t region = 8192;  // per round: the upload at 0, a raw upload at 4096
    auto backend = test::make_backend<TestType>();
    std::vector<typename TestType::Stream> streams;
    for (int s = 0; s < 3; ++s) streams.push_back(test::make_stream(*backend));
    {
        PinnedHostPool<TestType> pool(*backend, CachingPinned{.max_cached_bytes = 1 << 20});
        sink_calls = 0;
        pool.set_error_sink(&counting_sink);
        std::vector<std::unique_ptr<test::DeviceBytes<TestType>>> devices;
        for (int t = 0; t < thread_count; ++t) {
            devices.push_back(std::make_unique<test::DeviceBytes<TestType>>(*backend, rounds * region));
        }
        struct Copied {
            PinnedBuffer buffer;  // filled from the device by the stream: must end as `fill`
            unsigned char fill;
        };
        std::vector<std::vector<Copied>> copied(thread_count);
        std::atomic<int> failures{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < thread_count; ++t) {
            threads.emplace_back([&, t] {
                for (int i = 0; i < rounds; ++i) {
                    const auto size = static_cast<std::size_t>(64 + (i * 37 + t * 101) % 4000);
                    const auto fill = static_cast<unsigned char>(t * 31 + i + 1);
                    const auto stream = streams[static_cast<std::size_t>(t + i) % streams.size()];
                    std::byte* device =
                        devices[static_cast<std::size_t>(t)]->get() + static_cast<std::size_t>(i) * region;
                    auto source = pool.allocate(size);
                    auto result = pool.allocate(size);
                    if (!source || !result) {
                        ++failures;
                        continue;
                    }
                    std::memset(source->data(), fill, size);
                    std::memset(result->data(), 0, size);
                    // The source goes back at once: were its block handed out again before
                    // the upload ran, the next owner's bytes would reach the result.
                    if (!backend->copy_to_device_async(device, source->data(), size, stream) ||
                        !backend->copy_from_device_async(result->data(), device, size, stream) ||
                        !pool.record(*source, stream) || !pool.record(*result, stream)) {
                        ++failures;
                    }
                    if (i % 4 == 0 &&
                        !pool.record(*source, streams[static_cast<std::size_t>(t + i + 1) % streams.size()])) {
                        ++failures;
                    }
                    source->reset();
                    if (i % 5 == 0) {
                        auto raw = pool.allocate_raw(256);
                        if (!raw) {
                            ++failures;
                        } else {
                            std::memset(*raw, fill, 256);
                            if (!backend->copy_to_device_async(device + 4096, *raw, 256, stream) ||
                                !pool.record(*raw, stream) || !pool.release(*raw)) {
                                ++failures;
                            }
                        }
                    }
                    copied[static_cast<std::size_t>(t)].push_back(Copied{std::move(*result), fill});
                }
            });
        }
        for (auto& thread : threads) thread.join();
        for (const auto stream : streams) {
            const auto drained = test::make_event(*backend);
            CHECK(backend->record_event(drained, stream).ok());
            CHECK(backend->synchronize_event(drained).ok());
            CHECK(backend->destroy_event(drained).ok());
        }
        int wrong = 0;
        for (const auto& list : copied) {
            for (const Copied& item : list) {
                const std::span<unsigned char> got = item.buffer.template as<unsigned char>();
                wrong += static_cast<int>(
                    std::count_if(got.begin(), got.end(), [&](unsigned char b) { return b != item.fill; }) > 0);
            }
        }
        CHECK(failures == 0);
        CHECK(wrong == 0);
        CHECK(sink_calls == 0);
        copied.clear();
        REQUIRE(pool.trim().ok());
        const PinnedStats stats = pool.stats();
        CHECK(stats.live_allocations == 0);
        CHECK(stats.cached_blocks == 0);
        CHECK(stats.pending_blocks == 0);
        CHECK(stats.retiring_blocks == 0);
        CHECK(stats.backend_frees == stats.backend_allocations);
        CHECK(misuses(*backend) == 0);
    }
    for (const auto stream : streams) CHECK(backend->destroy_stream(stream).ok());
}
