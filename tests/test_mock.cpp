// SPDX-License-Identifier: Apache-2.0
// MockBackend specifics: journal, counters, fault injection, alignment modes, misuse detection.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "devstage/backends/mock.hpp"

using devstage::Errc;
using devstage::MockBackend;
using devstage::MockConfig;
using devstage::MockOp;

namespace {
std::string last_sink_message;
void capture_sink(const devstage::Status& status) noexcept {
    last_sink_message = status.message();
}
}  // namespace

TEST_CASE("mock: journal and counters record every call", "[mock]") {
    MockBackend mock;
    auto p = mock.device_malloc(100);
    REQUIRE(p.ok());
    std::vector<std::byte> host(100);
    REQUIRE(mock.copy_to_device(*p, host.data(), 100).ok());
    REQUIRE(mock.device_free(*p).ok());
    const auto journal = mock.journal();
    REQUIRE(journal.size() == 3);
    CHECK(journal[0].op == MockOp::device_malloc);
    CHECK(journal[0].pointer == *p);
    CHECK(journal[1].op == MockOp::copy_to_device);
    CHECK(journal[1].bytes == 100);
    CHECK(journal[2].op == MockOp::device_free);
    CHECK(journal[2].result == Errc::ok);
    CHECK(mock.calls(MockOp::device_malloc) == 1);
    CHECK(mock.total_calls() == 3);
}

TEST_CASE("mock: the k-th call fails, or every call from k on", "[mock]") {
    MockBackend mock;
    mock.fail_call(MockOp::device_malloc, 2, Errc::out_of_memory);
    auto first = mock.device_malloc(8);
    auto second = mock.device_malloc(8);
    auto third = mock.device_malloc(8);
    CHECK(first.ok());
    CHECK(second.status().code() == Errc::out_of_memory);
    CHECK_THAT(second.status().message(), Catch::Contains("call 2"));
    CHECK(third.ok());
    mock.fail_from(MockOp::device_free, 2);
    CHECK(mock.device_free(*first).ok());
    CHECK_FALSE(mock.device_free(*third).ok());
    CHECK_FALSE(mock.device_free(*third).ok());
    mock.clear_faults();
    CHECK(mock.device_free(*third).ok());
    CHECK(mock.journal().back().result == Errc::ok);
}

TEST_CASE("mock: adversarial alignment is exactly device_alignment", "[mock]") {
    MockBackend mock(MockConfig::adversarial());
    for (std::size_t bytes : {1, 64, 1000, 5000}) {
        auto p = mock.device_malloc(bytes);
        REQUIRE(p.ok());
        const auto address = reinterpret_cast<std::uintptr_t>(*p);
        CHECK(address % 64 == 0);
        CHECK(address % 128 != 0);
        REQUIRE(mock.device_free(*p).ok());
    }
    MockBackend natural;
    auto q = natural.device_malloc(10);
    REQUIRE(q.ok());
    CHECK(reinterpret_cast<std::uintptr_t>(*q) % 4096 == 0);
    REQUIRE(natural.device_free(*q).ok());
}

TEST_CASE("mock: double free, unknown pointers and out-of-bounds copies are reported", "[mock]") {
    MockBackend mock;
    auto p = mock.device_malloc(256);
    REQUIRE(p.ok());
    std::vector<std::byte> host(512);
    CHECK(mock.copy_to_device(*p, host.data(), 257).code() == Errc::invalid_argument);
    CHECK(mock.copy_from_device(host.data(), static_cast<std::byte*>(*p) + 200, 100).code() == Errc::invalid_argument);
    CHECK(mock.copy_from_device(host.data(), static_cast<std::byte*>(*p) + 200, 56).ok());
    REQUIRE(mock.device_free(*p).ok());
    const auto twice = mock.device_free(*p);
    CHECK(twice.code() == Errc::unknown_pointer);
    CHECK_THAT(twice.message(), Catch::Contains("double free"));
    const auto unknown = mock.device_free(host.data());
    CHECK_THAT(unknown.message(), Catch::Contains("unknown pointer"));
    CHECK(mock.misuses() == 4);
}

TEST_CASE("mock: allocations never freed are reported on destruction", "[mock]") {
    last_sink_message.clear();
    {
        MockBackend mock(MockConfig{.sink = &capture_sink});
        REQUIRE(mock.device_malloc(123).ok());
        REQUIRE(mock.pinned_malloc(45).ok());
        CHECK(mock.live_device_allocations() == 1);
        CHECK(mock.live_device_bytes() == 123);
        CHECK(mock.live_pinned_allocations() == 1);
    }
    CHECK_THAT(last_sink_message, Catch::Contains("leaked device allocation of 123 bytes") &&
                                      Catch::Contains("leaked pinned allocation of 45 bytes"));
}

TEST_CASE("mock: a device capacity gives out_of_memory", "[mock]") {
    MockBackend mock(MockConfig{.device_capacity = 1000});
    auto a = mock.device_malloc(600);
    REQUIRE(a.ok());
    CHECK(mock.device_malloc(600).status().code() == Errc::out_of_memory);
    REQUIRE(mock.device_free(*a).ok());
}
