// SPDX-License-Identifier: Apache-2.0
// The Backend concept: each required operation is required, with its exact signature.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string_view>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/stream.hpp"
#include "fake_backends.hpp"

using devstage::test::FakeAsyncBackend;
using devstage::test::FakeBackend;
using devstage::test::Missing;
using devstage::test::MissingAsync;

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

TEST_CASE("backend: a complete async fake models AsyncBackend", "[backend][concept][async]") {
    STATIC_REQUIRE(devstage::AsyncBackend<FakeAsyncBackend<MissingAsync::nothing>>);
    STATIC_REQUIRE_FALSE(devstage::AsyncBackend<FakeBackend<Missing::nothing>>);
}

TEST_CASE("backend: missing any one stream or event operation is rejected", "[backend][concept][async]") {
    using devstage::AsyncBackend;
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::stream_type>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::create_stream>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::destroy_stream>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::copy_to_device_async>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::copy_from_device_async>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::create_event>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::destroy_event>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::record_event>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::event_ready>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::synchronize_event>>);
    STATIC_REQUIRE_FALSE(AsyncBackend<FakeAsyncBackend<MissingAsync::stream_wait_event>>);
}

namespace {
template <class B, class S, class E>
concept waits_with = requires(B& b, S s, E e) {
    b.stream_wait_event(s, e);
};
template <class B, class E, class S>
concept records_with = requires(B& b, E e, S s) {
    b.record_event(e, s);
};
}  // namespace

TEST_CASE("backend: Stream and Event must be distinct types, so a swapped argument does not compile",
          "[backend][concept][async]") {
    STATIC_REQUIRE_FALSE(devstage::AsyncBackend<FakeAsyncBackend<MissingAsync::same_handles>>);
    using Fake = FakeAsyncBackend<MissingAsync::nothing>;
    using devstage::test::FakeEvent;
    using devstage::test::FakeStream;
    STATIC_REQUIRE(waits_with<Fake, FakeStream, FakeEvent>);
    STATIC_REQUIRE_FALSE(waits_with<Fake, FakeEvent, FakeStream>);
    STATIC_REQUIRE_FALSE(records_with<Fake, FakeStream, FakeStream>);
}

TEST_CASE("backend: SynchronousAdapter makes any Backend an AsyncBackend with an immediate stream",
          "[backend][concept][async]") {
    using Sync = FakeBackend<Missing::nothing>;
    STATIC_REQUIRE(devstage::AsyncBackend<devstage::SynchronousAdapter<Sync>>);
    STATIC_REQUIRE(std::is_same_v<devstage::stream_backend_t<Sync>, devstage::SynchronousAdapter<Sync>>);
    using Async = FakeAsyncBackend<MissingAsync::nothing>;
    STATIC_REQUIRE(std::is_same_v<devstage::stream_backend_t<Async>, Async>);
    STATIC_REQUIRE(devstage::is_immediate_v<devstage::SynchronousAdapter<Sync>>);
    devstage::MockBackend mock;
    devstage::SynchronousAdapter<devstage::MockBackend> adapter(mock);
    auto device = adapter.device_malloc(64);
    REQUIRE(device.ok());
    std::vector<std::byte> in(64, std::byte{7}), out(64);
    auto stream = adapter.create_stream();
    auto event = adapter.create_event();
    REQUIRE(stream.ok());
    REQUIRE(event.ok());
    REQUIRE(adapter.copy_to_device_async(*device, in.data(), 64, *stream).ok());
    REQUIRE(adapter.record_event(*event, *stream).ok());
    CHECK(*adapter.event_ready(*event));
    REQUIRE(adapter.copy_from_device_async(out.data(), *device, 64, *stream).ok());
    CHECK(out == in);  // done when the call returned
    CHECK(mock.calls(devstage::MockOp::copy_to_device) == 1);
    CHECK(adapter.synchronize_event(*event).ok());
    CHECK(adapter.stream_wait_event(*stream, *event).ok());
    CHECK(adapter.device_free(*device).ok());
}

namespace {
// A pinned fake with the mapping operations, each removable for the negative tests.
enum class MissingMap { nothing, alignment, odd_alignment, map_host, unmap_host };
template <MissingMap M>
struct FakeMapped : FakeBackend<Missing::nothing> {
    static constexpr std::size_t host_map_alignment = M == MissingMap::odd_alignment ? 3000 : 4096;
    devstage::Result<void*> map_host(void* host, std::size_t) noexcept requires(M != MissingMap::map_host) {
        return host;
    }
    devstage::Status unmap_host(void*) noexcept requires(M != MissingMap::unmap_host) { return {}; }
};
struct FakeUnaligned : FakeBackend<Missing::nothing> {
    devstage::Result<void*> map_host(void* host, std::size_t) noexcept { return host; }
    devstage::Status unmap_host(void*) noexcept { return {}; }
};
struct FakeMapThrows : FakeMapped<MissingMap::map_host> {
    devstage::Result<void*> map_host(void* host, std::size_t) { return host; }  // not noexcept
};
}  // namespace

TEST_CASE("backend: MappedHostBackend needs map_host, unmap_host and a power-of-two host_map_alignment",
          "[backend][concept][mapped]") {
    STATIC_REQUIRE(devstage::MappedHostBackend<FakeMapped<MissingMap::nothing>>);
    STATIC_REQUIRE_FALSE(devstage::MappedHostBackend<FakeUnaligned>);
    STATIC_REQUIRE_FALSE(devstage::MappedHostBackend<FakeMapped<MissingMap::odd_alignment>>);
    STATIC_REQUIRE_FALSE(devstage::MappedHostBackend<FakeMapped<MissingMap::map_host>>);
    STATIC_REQUIRE_FALSE(devstage::MappedHostBackend<FakeMapped<MissingMap::unmap_host>>);
    STATIC_REQUIRE_FALSE(devstage::MappedHostBackend<FakeMapThrows>);
    // Only pinned memory maps: a backend without it does not model the capability.
    STATIC_REQUIRE_FALSE(devstage::MappedHostBackend<FakeBackend<Missing::pinned_malloc>>);
    // The kernels' accesses and the host's checks are capabilities of their own.
    STATIC_REQUIRE_FALSE(devstage::KernelAccessBackend<FakeMapped<MissingMap::nothing>>);
    STATIC_REQUIRE_FALSE(devstage::HostAccessCheckBackend<FakeMapped<MissingMap::nothing>>);
    STATIC_REQUIRE(devstage::MappedHostBackend<devstage::SimBackend>);
    STATIC_REQUIRE(devstage::KernelAccessBackend<devstage::SimBackend>);
    STATIC_REQUIRE_FALSE(devstage::HostAccessCheckBackend<devstage::SimBackend>);
    STATIC_REQUIRE(devstage::MappedHostBackend<devstage::MockBackend>);
    STATIC_REQUIRE(devstage::KernelAccessBackend<devstage::MockBackend>);
    STATIC_REQUIRE(devstage::HostAccessCheckBackend<devstage::MockBackend>);
}
