// SPDX-License-Identifier: Apache-2.0
// The Backend concept: each required operation is required, with its exact signature.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string_view>

#include "devstage/backend.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "fake_backends.hpp"

using devstage::test::FakeBackend;
using devstage::test::Missing;

TEST_CASE("backend: a complete fake models Backend and PinnedHostBackend", "[backend][concept]") {
    STATIC_REQUIRE(devstage::Backend<FakeBackend<Missing::nothing>>);
    STATIC_REQUIRE(devstage::PinnedHostBackend<FakeBackend<Missing::nothing>>);
    STATIC_REQUIRE_FALSE(devstage::MemsetBackend<FakeBackend<Missing::nothing>>);
    STATIC_REQUIRE_FALSE(devstage::SynchronizingBackend<FakeBackend<Missing::nothing>>);
}

TEST_CASE("backend: missing any one required operation is rejected", "[backend][concept]") {
    STATIC_REQUIRE_FALSE(devstage::Backend<FakeBackend<Missing::name>>);
    STATIC_REQUIRE_FALSE(devstage::Backend<FakeBackend<Missing::device_malloc>>);
    STATIC_REQUIRE_FALSE(devstage::Backend<FakeBackend<Missing::device_free>>);
    STATIC_REQUIRE_FALSE(devstage::Backend<FakeBackend<Missing::copy_to_device>>);
    STATIC_REQUIRE_FALSE(devstage::Backend<FakeBackend<Missing::copy_from_device>>);
    // Pinned operations are only required by PinnedHostBackend.
    STATIC_REQUIRE(devstage::Backend<FakeBackend<Missing::pinned_malloc>>);
    STATIC_REQUIRE_FALSE(devstage::PinnedHostBackend<FakeBackend<Missing::pinned_malloc>>);
    STATIC_REQUIRE_FALSE(devstage::PinnedHostBackend<FakeBackend<Missing::pinned_free>>);
}

namespace {
struct NoAlignment {
    std::string_view name() const noexcept { return "x"; }
    devstage::Result<void*> device_malloc(std::size_t) noexcept {
        return devstage::Status(devstage::Errc::out_of_memory, "x");
    }
    devstage::Status device_free(void*) noexcept { return {}; }
    devstage::Status copy_to_device(void*, const void*, std::size_t) noexcept { return {}; }
    devstage::Status copy_from_device(void*, const void*, std::size_t) noexcept { return {}; }
};
struct OddAlignment : NoAlignment {
    static constexpr std::size_t device_alignment = 48;
};
struct ThrowingFree : FakeBackend<Missing::device_free> {
    devstage::Status device_free(void*) { return {}; }  // not noexcept
};
struct RawMalloc : FakeBackend<Missing::device_malloc> {
    void* device_malloc(std::size_t) noexcept { return nullptr; }  // wrong return type
};
}  // namespace

TEST_CASE("backend: alignment, noexcept and return types are part of the contract", "[backend][concept]") {
    STATIC_REQUIRE_FALSE(devstage::Backend<NoAlignment>);
    STATIC_REQUIRE_FALSE(devstage::Backend<OddAlignment>);
    STATIC_REQUIRE_FALSE(devstage::Backend<ThrowingFree>);
    STATIC_REQUIRE_FALSE(devstage::Backend<RawMalloc>);
}

TEST_CASE("backend: the shipped backends model their capabilities", "[backend][concept]") {
    STATIC_REQUIRE(devstage::PinnedHostBackend<devstage::SimBackend>);
    STATIC_REQUIRE(devstage::MemsetBackend<devstage::SimBackend>);
    STATIC_REQUIRE(devstage::SynchronizingBackend<devstage::SimBackend>);
    STATIC_REQUIRE(devstage::PinnedHostBackend<devstage::MockBackend>);
    STATIC_REQUIRE(devstage::MemsetBackend<devstage::MockBackend>);
    STATIC_REQUIRE(devstage::SynchronizingBackend<devstage::MockBackend>);
}
