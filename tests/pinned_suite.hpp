// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pinned-pool contract, written once and instantiated for every PinnedHostBackend. The
// including TU defines `PinnedBackends` (a std::tuple of backend types with a BackendFactory).

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
#include <vector>

#include "devstage/pinned.hpp"
#include "support.hpp"

namespace pinned_suite {
inline std::atomic<int> sink_calls{0};
inline std::string sink_last;
inline void counting_sink(const devstage::Status& status) noexcept {
    ++sink_calls;
    sink_last = status.message();
}
}  // namespace pinned_suite

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
