// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pinned-pool contract, written once and instantiated for every PinnedHostBackend. The
// including TU defines `PinnedBackends` (a std::tuple of backend types with a BackendFactory).

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <memory_resource>
#include <string>
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

TEMPLATE_LIST_TEST_CASE("pinned: finalize frees leftovers, reports them, and buffers outlive it", "[pinned]",
                        PinnedBackends) {
    using namespace devstage;
    using namespace pinned_suite;
    auto backend = test::make_backend<TestType>();
    sink_calls = 0;
    PinnedBuffer survivor;
    {
        PinnedHostPool<TestType> pool(*backend);
        pool.set_error_sink(&counting_sink);
        auto a = pool.allocate(100);
        auto b = pool.allocate_raw(300);
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        REQUIRE(pool.finalize().ok());
        CHECK(pool.stats().finalized_allocations == 2);
        CHECK(pool.stats().finalized_bytes == 400);
        CHECK(sink_calls == 1);
        CHECK_THAT(sink_last, Catch::Contains("2 allocation(s)") && Catch::Contains("400 bytes"));
        CHECK(pool.stats().backend_frees == pool.stats().backend_allocations);
        a->reset();  // harmless after finalize
        // The pool stays usable, and a buffer may outlive the pool itself.
        auto c = pool.allocate(200);
        REQUIRE(c.ok());
        survivor = std::move(*c);
    }
    CHECK_FALSE(survivor.empty());
    survivor.reset();        // the pool died and freed it: no double free, no use after free
    CHECK(sink_calls == 2);  // the destructor's finalize reported the survivor
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
    // Blocks are at least 64-aligned; 8192 alignment holds only by chance, and as<> checks it.
    CHECK(big.as<Huge>().size() == ((reinterpret_cast<std::uintptr_t>(big.data()) % 8192 == 0) ? 1u : 0u));
    PinnedBuffer empty;
    CHECK(empty.as<char>().empty());
}
