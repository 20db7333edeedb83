// SPDX-License-Identifier: Apache-2.0
// HostFrame (frame.hpp): inputs written in place in a slot's pinned mirror, bound with one
// upload and no host copy; misuse is a clear error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "async_support.hpp"
#include "devstage/frame.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "support.hpp"

using namespace devstage;

namespace {
using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<4096>>;

const TensorShape decode_shapes[] = {
    {163840, Direction::In},  // hidden states: larger than the packing limit, in the frame anyway
    {2048, Direction::In},    // block table
    {128, Direction::In},     // sequence lengths
    {64, Direction::In},      // slot mapping
    {0, Direction::In},       // empty
    {4096, Direction::InOut}, {163840, Direction::Out},  // logits
};

void fill(const HostFrame& frame, std::uint32_t seed) {
    for (std::size_t i = 0; i < frame.size(); ++i) {
        if (frame.args()[i].direction == Direction::Out) continue;
        const auto bytes = test::pattern(frame.host(i).size(), seed + static_cast<std::uint32_t>(i));
        std::copy(bytes.begin(), bytes.end(), frame.host(i).begin());
    }
}
}  // namespace

TEST_CASE("frame: inputs written in place upload with one copy and no host copy", "[frame]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    auto frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    REQUIRE(frame->size() == 7);
    CHECK(frame->host(4).empty());
    CHECK(frame->host(0).size() == 163840);
    for (std::size_t i = 0; i < frame->size(); ++i) {
        if (frame->host(i).empty()) continue;
        CHECK(reinterpret_cast<std::uintptr_t>(frame->host(i).data()) % 1024 ==
              reinterpret_cast<std::uintptr_t>(stager.strategy().mirror()) % 1024);
    }
    fill(*frame, 1);
    // The same inputs in ordinary host memory, staged the ordinary way, as the reference.
    test::HostRun reference;
    for (std::size_t i = 0; i < frame->size(); ++i) {
        reference.buffers.emplace_back(frame->host(i).begin(), frame->host(i).end());
        reference.args.push_back(TensorArg{nullptr, frame->args()[i].bytes, frame->args()[i].direction});
    }
    reference.relink();

    const std::uint64_t uploads = mock.calls(MockOp::copy_to_device_async);
    auto run = stager.bind(frame->args());
    REQUIRE(run.ok());
    CHECK(mock.calls(MockOp::copy_to_device_async) - uploads == 1);  // every In/InOut byte in one copy
    CHECK(stager.stats().mirror_copy_bytes == 0);                    // and no host memcpy
    REQUIRE(test::fake_kernel(mock, run->device_args(), frame->args()).ok());
    const std::uint64_t downloads = mock.calls(MockOp::copy_from_device_async);
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(mock.calls(MockOp::copy_from_device_async) - downloads == 1);
    CHECK(stager.stats().mirror_copy_bytes == 0);  // outputs land in the frame itself

    Stager<MockBackend> plain(mock);
    auto expected = plain.bind(reference.args);
    REQUIRE(expected.ok());
    REQUIRE(test::fake_kernel(mock, expected->device_args(), reference.args).ok());
    REQUIRE(plain.finish(std::move(*expected)).ok());
    for (std::size_t i = 0; i < frame->size(); ++i) {
        CAPTURE(i);
        CHECK(std::equal(frame->host(i).begin(), frame->host(i).end(), reference.buffers[i].begin(),
                         reference.buffers[i].end()));
    }
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: a frame binds once; its args again are a stale frame", "[frame][misuse]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    auto frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    fill(*frame, 2);
    auto run = stager.bind(frame->args());
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    auto again = stager.bind(frame->args());
    REQUIRE_FALSE(again.ok());
    CHECK(again.status().code() == Errc::invalid_argument);
    CHECK_THAT(again.status().message(),
               Catch::Contains("stale frame") && Catch::Contains("slot 0") && Catch::Contains("mock"));
    auto by_frame = stager.bind(*frame);
    CHECK(by_frame.status().code() == Errc::invalid_argument);
    // The stager is fine: a fresh frame binds.
    auto fresh = stager.frame(decode_shapes);
    REQUIRE(fresh.ok());
    auto bound = stager.bind(*fresh);
    REQUIRE(bound.ok());
    REQUIRE(stager.finish(std::move(*bound)).ok());
}

TEST_CASE("frame: a frame of another stager is refused", "[frame][misuse]") {
    MockBackend mock;
    Stager<MockBackend, Packed> one(mock), other(mock);
    auto frame = one.frame(decode_shapes);
    REQUIRE(frame.ok());
    auto foreign = other.bind(*frame);
    REQUIRE_FALSE(foreign.ok());
    CHECK(foreign.status().code() == Errc::invalid_argument);
    CHECK_THAT(foreign.status().message(), Catch::Contains("another stager"));
    auto own = one.bind(*frame);
    REQUIRE(own.ok());
    REQUIRE(one.finish(std::move(*own)).ok());
}

TEST_CASE("frame: args pointing into the frame at sizes that no longer match are refused", "[frame][misuse]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    auto frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    std::vector<TensorArg> resized(frame->args().begin(), frame->args().end());
    resized[1].bytes = 1000;  // the block table shrank: the layout moves everything after it
    resized[2].bytes = 3000;
    auto refused = stager.bind(resized);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == Errc::invalid_argument);
    CHECK_THAT(refused.status().message(), Catch::Contains("points into the unbound frame of slot 0") &&
                                               Catch::Contains("not that frame's own args()"));
    CHECK(stager.live_runs() == 0);
    // The frame itself still binds.
    auto run = stager.bind(frame->args());
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    // Bound, the frame's memory is the slot's mirror again: args into it at moved offsets are
    // refused rather than copied over themselves.
    auto stale = stager.bind(resized);
    REQUIRE_FALSE(stale.ok());
    CHECK_THAT(stale.status().message(), Catch::Contains("points into this stager's frame mirror"));
    CHECK(stager.live_runs() == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: frames belong to pipeline slots", "[frame][slots]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock, Packed{}, 2);
    auto a = stager.frame(decode_shapes);
    auto b = stager.frame(decode_shapes);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->slot() != b->slot());
    CHECK(a->host(0).data() != b->host(0).data());
    CHECK(stager.frame(decode_shapes).status().code() == Errc::busy);  // both slots hold a frame
    test::HostRun other;
    other.add(100, Direction::In, 1);
    CHECK(stager.bind(other.args).status().code() == Errc::busy);
    CHECK(stager.bind_slot(a->slot(), other.args).status().code() == Errc::busy);
    CHECK(stager.bind_slot(a->slot(), b->args()).status().code() == Errc::invalid_argument);
    fill(*a, 3);
    fill(*b, 4);
    auto run_b = stager.bind(b->args());
    auto run_a = stager.bind(*a);
    REQUIRE(run_a.ok());
    REQUIRE(run_b.ok());
    CHECK(run_a->slot() == a->slot());
    CHECK(run_b->slot() == b->slot());
    REQUIRE(stager.finish(std::move(*run_a)).ok());
    REQUIRE(stager.finish(std::move(*run_b)).ok());
}

TEST_CASE("frame: release is busy while a frame is unbound, and changes nothing", "[frame][ownership]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    Result<HostFrame> frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    fill(*frame, 4);
    const std::span<const TensorArg> args = frame->args();
    std::byte* const mirror = stager.strategy().mirror();
    const Status refused = stager.release();
    CHECK(refused.code() == Errc::busy);
    CHECK_THAT(refused.message(), Catch::Contains("release") && Catch::Contains("slot 0 holds an unbound frame") &&
                                      Catch::Contains("nothing was released") && Catch::Contains("mock"));
    CHECK(mock.live_pinned_allocations() == 1);  // the frame's memory is where it was
    CHECK(stager.strategy().mirror() == mirror);
    CHECK(frame->live());
    CHECK(frame->host(1).data() != nullptr);
    frame = Status(Errc::invalid_argument, "the engine drops the frame");  // unbound: its slot comes back
    REQUIRE(stager.release().ok());
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(stager.bind(args).status().code() == Errc::invalid_argument);  // a copy of its args is a stale frame
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: a frame destroyed or moved over unbound gives its slot back", "[frame][ownership]") {
    MockBackend mock;
    Stager<MockBackend, Packed> one(mock);
    for (int i = 0; i < 3; ++i) {  // with one slot, each frame after the first would be busy for good
        Result<HostFrame> frame = one.frame(decode_shapes);
        REQUIRE(frame.ok());
        CHECK(frame->slot() == 0);
    }
    test::HostRun plain;
    plain.add(100, Direction::InOut, 1);
    auto run = one.bind(plain.args);
    REQUIRE(run.ok());
    REQUIRE(one.finish(std::move(*run)).ok());

    Stager<MockBackend, Packed> two(mock, Packed{}, 2);
    Result<HostFrame> a = two.frame(decode_shapes);
    Result<HostFrame> b = two.frame(decode_shapes);
    REQUIRE((a.ok() && b.ok()));
    const std::size_t a_slot = a->slot();
    CHECK(two.frame(decode_shapes).status().code() == Errc::busy);
    *a = std::move(*b);  // a's frame, unbound, gives its slot back; b is moved from
    CHECK(a->slot() != a_slot);
    CHECK_FALSE(b->live());
    CHECK(b->args().empty());
    Result<HostFrame> again = two.frame(decode_shapes);
    REQUIRE(again.ok());
    CHECK(again->slot() == a_slot);
    auto bound = two.bind(*a);  // the moved frame still binds, on its own slot
    REQUIRE(bound.ok());
    REQUIRE(two.finish(std::move(*bound)).ok());
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: a frame held by its run's Completion makes release busy; once it goes, frames are inert",
          "[frame][ownership]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    Stager<MockBackend, Packed> stager(mock);
    const auto stream = test::make_stream(mock);
    Result<HostFrame> frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    fill(*frame, 6);
    auto run = stager.bind(*frame, stream);
    REQUIRE(run.ok());
    Result<Completion> done = stager.finish(std::move(*run), stream);
    REQUIRE(done.ok());
    REQUIRE(done->wait().ok());
    const Status refused = stager.release();
    CHECK(refused.code() == Errc::busy);
    CHECK_THAT(refused.message(), Catch::Contains("slot 0 holds a frame whose run's Completion is still held"));
    CHECK(mock.live_pinned_allocations() == 1);
    CHECK(frame->host(0).size() == 163840);  // the outputs are still the engine's to read
    done = Status(Errc::invalid_argument, "the engine lets go of the run");
    REQUIRE(stager.release().ok());
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK_FALSE(frame->live());  // its memory went back: the views are gone, not dangling
    CHECK(frame->host(0).empty());
    CHECK(frame->args().empty());
    CHECK(stager.bind(*frame).status().code() == Errc::invalid_argument);
    REQUIRE(mock.destroy_stream(stream).ok());
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: a frame whose slot is taken again, or whose stager is gone, is inert", "[frame][ownership]") {
    MockBackend mock;
    std::optional<HostFrame> outlives;
    {
        Stager<MockBackend, Packed> stager(mock);
        Result<HostFrame> first = stager.frame(decode_shapes);
        REQUIRE(first.ok());
        auto run = stager.bind(*first);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
        CHECK(first->live());  // finished, its outputs are read from it until its slot is taken again
        Result<HostFrame> second = stager.frame(decode_shapes);
        REQUIRE(second.ok());
        CHECK_FALSE(first->live());
        CHECK(first->host(0).empty());
        CHECK(second->live());
        outlives.emplace(std::move(*second));  // unbound when the stager goes
        Result<HostFrame> unbound = stager.frame(decode_shapes);
        CHECK(unbound.status().code() == Errc::busy);  // still held by `outlives`
    }
    CHECK_FALSE(outlives->live());
    CHECK(outlives->host(0).empty());
    CHECK(outlives->args().empty());
    outlives.reset();  // its stager is gone: nothing to give back
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: reserve is busy under an unbound frame; once it grows the mirror, ended frames are inert",
          "[frame][ownership]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    Result<HostFrame> frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    CHECK(stager.reserve(std::size_t{1} << 22).code() == Errc::busy);  // nothing moved under it
    CHECK(frame->live());
    auto run = stager.bind(*frame);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    const std::byte* before = frame->host(0).data();
    REQUIRE(before != nullptr);
    REQUIRE(stager.reserve(std::size_t{1} << 22).ok());  // the mirror grows: its old memory is freed
    CHECK(stager.strategy(0).mirror() != before);
    CHECK_FALSE(frame->live());  // no view into the freed mirror
    CHECK(frame->host(0).empty());
    CHECK(stager.bind(*frame).status().code() == Errc::invalid_argument);
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: abandon ends unbound and held frames; the slots are free again", "[frame][ownership]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink});
    Stager<MockBackend, Packed> stager(mock, Packed{}, 2);
    stager.set_error_sink(&test::quiet_sink);
    Result<HostFrame> a = stager.frame(decode_shapes);
    Result<HostFrame> b = stager.frame(decode_shapes);
    REQUIRE((a.ok() && b.ok()));
    stager.abandon();
    CHECK_FALSE(a->live());
    CHECK_FALSE(b->live());
    Result<HostFrame> c = stager.frame(decode_shapes);
    CHECK(c.ok());
    c = Status(Errc::invalid_argument, "dropped");
    REQUIRE(stager.release().ok());
}

namespace {
template <class S>
concept hands_out_frames = requires(S& s, std::span<const TensorShape> shapes) {
    s.frame(shapes);
};
}  // namespace

TEST_CASE("frame: only packing stagers hand out frames", "[frame]") {
    STATIC_REQUIRE(hands_out_frames<Stager<MockBackend, Packed>>);
    STATIC_REQUIRE(hands_out_frames<Stager<MockBackend>>);  // packing is a run-time option of every RetainedBump
    STATIC_REQUIRE_FALSE(hands_out_frames<Stager<MockBackend, PerTensorMalloc<>>>);  // no mirror
    MockBackend mock;
    Stager<MockBackend> unpacked(mock);
    const Result<HostFrame> refused = unpacked.frame(decode_shapes);
    CHECK(refused.status().code() == Errc::not_supported);
    CHECK_THAT(refused.status().message(), Catch::Contains("pack limit is 0") && Catch::Contains("mock"));
    Stager<MockBackend> packed(mock, {}, StagerOptions{.pack_limit = 4096});
    auto frame = packed.frame(decode_shapes);
    REQUIRE(frame.ok());
    auto run = packed.bind(*frame);
    REQUIRE(run.ok());
    REQUIRE(packed.finish(std::move(*run)).ok());
}

TEST_CASE("frame: no shapes is invalid_argument, and the stager stays usable", "[frame][misuse]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    auto empty = stager.frame(std::span<const TensorShape>{});
    REQUIRE_FALSE(empty.ok());
    CHECK(empty.status().code() == Errc::invalid_argument);
    CHECK_THAT(empty.status().message(), Catch::Contains("no shapes") && Catch::Contains("mock"));
    auto frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    auto run = stager.bind(*frame);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
}

TEST_CASE("frame: reserve is busy while a frame is unbound, since it would move the mirror", "[frame]") {
    MockBackend mock;
    Stager<MockBackend, Packed> stager(mock);
    auto frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    fill(*frame, 9);
    std::byte* const mirror = stager.strategy().mirror();
    const Status reserved = stager.reserve(std::size_t{1} << 22);
    CHECK(reserved.code() == Errc::busy);
    CHECK_THAT(reserved.message(),
               Catch::Contains("reserve") && Catch::Contains("1 unbound frame (bind it, or destroy the HostFrame)"));
    CHECK(stager.strategy().mirror() == mirror);  // the frame's memory is where it was
    auto run = stager.bind(*frame);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    REQUIRE(stager.reserve(std::size_t{1} << 22).ok());  // bound: reserve goes ahead
    CHECK(stager.strategy().mirror_capacity() >= std::size_t{1} << 22);
}

TEST_CASE("frame: a stale frame is invalid_argument before the stager makes its stream", "[frame][misuse]") {
    MockBackend mock(MockConfig{.sink = &test::quiet_sink});
    Stager<MockBackend, Packed> stager(mock);
    const auto stream = test::make_stream(mock);
    auto frame = stager.frame(decode_shapes);
    REQUIRE(frame.ok());
    auto run = stager.bind(*frame, stream);
    REQUIRE(run.ok());
    Result<Completion> done = stager.finish(std::move(*run), stream);
    REQUIRE(done.ok());
    REQUIRE(done->wait().ok());
    mock.fail_from(MockOp::create_stream, mock.calls(MockOp::create_stream) + 1);  // the own stream cannot be made
    auto stale = stager.bind(*frame);
    CHECK(stale.status().code() == Errc::invalid_argument);
    mock.clear_faults();
    REQUIRE(mock.destroy_stream(stream).ok());
}

namespace {
using PackedGeometric = RetainedBump<GeometricGrowth<3, 2>, 256, PackSmall<1024>>;

// Each host tensor's offset in the mirror.
std::vector<std::ptrdiff_t> host_offsets(const HostFrame& frame, const std::byte* mirror) {
    std::vector<std::ptrdiff_t> offsets;
    for (std::size_t i = 0; i < frame.size(); ++i) {
        if (!frame.host(i).empty()) offsets.push_back(frame.host(i).data() - mirror);
    }
    return offsets;
}
}  // namespace

TEMPLATE_TEST_CASE("frame: a device-resident tensor is passed through and takes no mirror space", "[frame][device]",
                   Packed, PackedGeometric) {
    MockBackend mock;
    std::vector<std::byte> weights_bytes = test::pattern(70000, 5);
    Result<void*> weights = mock.device_malloc(weights_bytes.size());
    Result<void*> cache = mock.device_malloc(9000);
    REQUIRE(weights.ok());
    REQUIRE(cache.ok());
    REQUIRE(mock.copy_to_device(*weights, weights_bytes.data(), weights_bytes.size()).ok());
    const TensorShape host_only[] = {{2048, Direction::In}, {64, Direction::In}, {4096, Direction::Out}};
    const TensorShape with_device[] = {{2048, Direction::In},
                                       {weights_bytes.size(), Direction::In, *weights},
                                       {64, Direction::In},
                                       {9000, Direction::InOut, *cache},
                                       {4096, Direction::Out}};
    Stager<MockBackend, TestType> plain(mock), stager(mock);
    auto reference = plain.frame(host_only);
    auto frame = stager.frame(with_device);
    REQUIRE(reference.ok());
    REQUIRE(frame.ok());
    CHECK(frame->host(1).empty());
    CHECK(frame->host(3).empty());
    CHECK(frame->args()[1].placement == Placement::Device);
    CHECK(frame->args()[1].data == *weights);
    CHECK(host_offsets(*frame, stager.strategy().mirror()) == host_offsets(*reference, plain.strategy().mirror()));
    CHECK(stager.strategy().mirror_capacity() == plain.strategy().mirror_capacity());
    fill(*frame, 9);
    const std::uint64_t uploads = mock.calls(MockOp::copy_to_device_async);
    auto run = stager.bind(*frame);
    REQUIRE(run.ok());
    CHECK(mock.calls(MockOp::copy_to_device_async) - uploads == 1);  // the host tensors, in one copy
    CHECK(run->device_args()[1].data == *weights);
    CHECK(run->device_args()[3].data == *cache);
    CHECK(run->leases().size() == 5);
    CHECK(run->leases()[1].release_kind == ReleaseKind::ExternalNoop);
    REQUIRE(stager.finish(std::move(*run)).ok());
    REQUIRE(stager.release().ok());
    reference = Status(Errc::invalid_argument, "never bound: the engine drops it");  // so plain may release
    REQUIRE(plain.release().ok());
    REQUIRE(mock.device_free(*weights).ok());
    REQUIRE(mock.device_free(*cache).ok());
    CHECK(mock.misuses() == 0);
}

TEST_CASE("frame: args added to a frame's args() are refused, naming TensorShape::device", "[frame][device][misuse]") {
    MockBackend mock;
    Result<void*> weights = mock.device_malloc(4096);
    REQUIRE(weights.ok());
    Stager<MockBackend, Packed> stager(mock);
    const TensorShape shapes[] = {{2048, Direction::In}, {4096, Direction::Out}};
    auto frame = stager.frame(shapes);
    REQUIRE(frame.ok());
    std::vector<TensorArg> extended(frame->args().begin(), frame->args().end());
    extended.push_back(TensorArg{*weights, 4096, Direction::In, Placement::Device});
    auto refused = stager.bind(extended);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == Errc::invalid_argument);
    CHECK_THAT(refused.status().message(),
               Catch::Contains("not that frame's own args()") && Catch::Contains("TensorShape::device"));
    CHECK(stager.live_runs() == 0);
    auto run = stager.bind(*frame);  // the frame itself still binds
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    REQUIRE(mock.device_free(*weights).ok());
}
