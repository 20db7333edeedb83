// SPDX-License-Identifier: Apache-2.0
// PinnedHostPool, PinnedBuffer, PinnedAllocator and PinnedMemoryResource: the pinned suite
// over the simulator and the mock, plus policy facts that need no backend variety.
#include <catch2/catch.hpp>

#include <tuple>

#include "support.hpp"

using PinnedBackends = std::tuple<devstage::SimBackend, devstage::MockBackend>;
#include "pinned_suite.hpp"

using namespace devstage;

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
