// SPDX-License-Identifier: Apache-2.0
#pragma once
// The contract every Backend must pass, written once. Use it for your own backend:
//
//   using ContractBackends = std::tuple<MyBackend>;
//   #include "backend_contract.hpp"
//
// (and specialize devstage::test::BackendFactory<MyBackend> if it is not default-constructible).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "devstage/backend.hpp"
#include "support.hpp"

TEMPLATE_LIST_TEST_CASE("contract: static facts", "[contract]", ContractBackends) {
    STATIC_REQUIRE(devstage::Backend<TestType>);
    STATIC_REQUIRE(std::has_single_bit(TestType::device_alignment));
    auto backend = devstage::test::make_backend<TestType>();
    REQUIRE_FALSE(std::string_view(backend->name()).empty());
}

TEMPLATE_LIST_TEST_CASE("contract: allocations are aligned, distinct and freed", "[contract]", ContractBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    const std::size_t sizes[] = {1, 63, 64, 65, 1000, 1023, 1024, 1025, 4096, (std::size_t{1} << 20) + 3};
    std::vector<void*> pointers;
    for (std::size_t bytes : sizes) {
        devstage::Result<void*> p = backend->device_malloc(bytes);
        REQUIRE(p.ok());
        CHECK(*p != nullptr);
        CHECK(reinterpret_cast<std::uintptr_t>(*p) % TestType::device_alignment == 0);
        pointers.push_back(*p);
    }
    CHECK(std::set<void*>(pointers.begin(), pointers.end()).size() == pointers.size());
    for (void* p : pointers) CHECK(backend->device_free(p).ok());
}

TEMPLATE_LIST_TEST_CASE("contract: data round-trips at boundaries", "[contract]", ContractBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    for (std::size_t bytes :
         {std::size_t{1}, std::size_t{1023}, std::size_t{1024}, std::size_t{1025}, std::size_t{3} << 20}) {
        CAPTURE(bytes);
        devstage::Result<void*> device = backend->device_malloc(bytes);
        REQUIRE(device.ok());
        const auto in = devstage::test::pattern(bytes, static_cast<std::uint32_t>(bytes));
        REQUIRE(backend->copy_to_device(*device, in.data(), bytes).ok());
        CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, *device, bytes), in));
        // The last byte alone: a copy that ends exactly at the end of the allocation.
        std::byte last{};
        REQUIRE(backend->copy_from_device(&last, static_cast<std::byte*>(*device) + bytes - 1, 1).ok());
        CHECK(last == in.back());
        REQUIRE(backend->device_free(*device).ok());
    }
}

TEMPLATE_LIST_TEST_CASE("contract: zero-byte copies are no-ops", "[contract]", ContractBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    devstage::Result<void*> device = backend->device_malloc(64);
    REQUIRE(device.ok());
    std::byte host[1]{};
    CHECK(backend->copy_to_device(*device, host, 0).ok());
    CHECK(backend->copy_from_device(host, *device, 0).ok());
    CHECK(backend->device_free(*device).ok());
}

TEMPLATE_LIST_TEST_CASE("contract: out of memory is reported, not crashed", "[contract]", ContractBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    devstage::Result<void*> huge = backend->device_malloc(std::numeric_limits<std::size_t>::max() / 4);
    REQUIRE_FALSE(huge.ok());
    CHECK(huge.status().code() == devstage::Errc::out_of_memory);
    CHECK_FALSE(huge.status().message().empty());
    // Still usable afterwards.
    devstage::Result<void*> small = backend->device_malloc(128);
    REQUIRE(small.ok());
    CHECK(backend->device_free(*small).ok());
}

TEMPLATE_LIST_TEST_CASE("contract: freeing twice is an error", "[contract]", ContractBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    devstage::Result<void*> device = backend->device_malloc(256);
    REQUIRE(device.ok());
    REQUIRE(backend->device_free(*device).ok());
    const devstage::Status again = backend->device_free(*device);
    CHECK_FALSE(again.ok());
    CHECK_FALSE(again.message().empty());
}

TEMPLATE_LIST_TEST_CASE("contract: pinned memory round-trips", "[contract][pinned]", ContractBackends) {
    if constexpr (devstage::PinnedHostBackend<TestType>) {
        auto backend = devstage::test::make_backend<TestType>();
        constexpr std::size_t bytes = (std::size_t{1} << 20) + 17;
        devstage::Result<void*> source = backend->pinned_malloc(bytes);
        devstage::Result<void*> sink = backend->pinned_malloc(bytes);
        devstage::Result<void*> device = backend->device_malloc(bytes);
        REQUIRE(source.ok());
        REQUIRE(sink.ok());
        REQUIRE(device.ok());
        const auto in = devstage::test::pattern(bytes, 7);
        std::copy(in.begin(), in.end(), static_cast<std::byte*>(*source));
        REQUIRE(backend->copy_to_device(*device, *source, bytes).ok());
        REQUIRE(backend->copy_from_device(*sink, *device, bytes).ok());
        CHECK(devstage::test::same_bytes(std::span(static_cast<const std::byte*>(*sink), bytes), in));
        CHECK(backend->device_free(*device).ok());
        CHECK(backend->pinned_free(*source).ok());
        CHECK(backend->pinned_free(*sink).ok());
        CHECK_FALSE(backend->pinned_free(*sink).ok());
    } else {
        SUCCEED("backend has no pinned host memory");
    }
}

TEMPLATE_LIST_TEST_CASE("contract: optional memset and synchronize", "[contract]", ContractBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    if constexpr (devstage::MemsetBackend<TestType>) {
        devstage::Result<void*> device = backend->device_malloc(300);
        REQUIRE(device.ok());
        REQUIRE(backend->device_memset(*device, 0x5A, 300).ok());
        const auto bytes = devstage::test::read_device(*backend, *device, 300);
        REQUIRE(bytes.size() == 300);
        CHECK(std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0x5A}; }));
        CHECK(backend->device_free(*device).ok());
    }
    if constexpr (devstage::SynchronizingBackend<TestType>) {
        CHECK(backend->synchronize().ok());
    }
}
