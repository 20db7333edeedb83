// SPDX-License-Identifier: Apache-2.0
// The ordering rules of runs in flight (detail/schedule/run_order.hpp) on their own, then through a
// Stager on the deferred mock (work runs only when the host waits, in an adversarial order):
// shared host memory ends as the runs one at a time would leave it, a frame's slot is not
// taken while its Completion lives, and what the misuse fixes promise.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "async_support.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/detail/schedule/run_order.hpp"
#include "devstage/detail/stager/slot.hpp"
#include "devstage/devstage.hpp"

using namespace devstage;
using detail::Need;
using detail::Touch;

namespace {

using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<>>;
using Mock = MockBackend;

// A kernel on a stream: every InOut byte gains `add`, every Out byte becomes `fill`.
struct AddKernel {
    Mock* mock = nullptr;
    std::vector<TensorArg> device;
    std::vector<Direction> directions;
    std::uint8_t add = 1;
    std::uint8_t fill = 0;
    Status status;

    static void run(void* self) {
        auto* k = static_cast<AddKernel*>(self);
        std::vector<std::byte> bytes;
        for (std::size_t i = 0; i < k->device.size(); ++i) {
            if (k->directions[i] == Direction::In || k->device[i].bytes == 0) continue;
            bytes.resize(k->device[i].bytes);
            if (k->directions[i] == Direction::InOut) {
                if (Status s = k->mock->copy_from_device(bytes.data(), k->device[i].data, bytes.size()); !s) {
                    k->status = s;
                    return;
                }
                for (std::byte& b : bytes) b = static_cast<std::byte>(static_cast<std::uint8_t>(b) + k->add);
            } else {
                std::fill(bytes.begin(), bytes.end(), static_cast<std::byte>(k->fill));
            }
            if (Status s = k->mock->copy_to_device(k->device[i].data, bytes.data(), bytes.size()); !s) k->status = s;
        }
    }
};

// bind(args, bind_stream), the kernel on `kernel_stream` (after the bind stream's uploads),
// finish on `kernel_stream`.
template <class S>
Result<Completion> step(S& stager, Mock& mock, std::span<const TensorArg> args, AddKernel& kernel,
                        Mock::Stream bind_stream, Mock::Stream kernel_stream) {
    Result<StagedRun> run = stager.bind(args, bind_stream);
    if (!run) return run.status();
    kernel.mock = &mock;
    kernel.device.assign(run->device_args().begin(), run->device_args().end());
    kernel.directions.clear();
    for (const TensorArg& arg : args) kernel.directions.push_back(arg.direction);
    if (bind_stream != kernel_stream) {
        Result<Mock::Event> uploaded = mock.create_event();
        REQUIRE(uploaded.ok());
        REQUIRE(mock.record_event(*uploaded, bind_stream).ok());
        REQUIRE(mock.stream_wait_event(kernel_stream, *uploaded).ok());
        REQUIRE(mock.destroy_event(*uploaded).ok());
    }
    REQUIRE(mock.launch_host_func(kernel_stream, &AddKernel::run, &kernel).ok());
    return stager.finish(std::move(*run), kernel_stream);
}

bool all_equal(const std::vector<std::byte>& bytes, std::uint8_t value) {
    return std::all_of(bytes.begin(), bytes.end(),
                       [value](std::byte b) { return static_cast<std::uint8_t>(b) == value; });
}

}  // namespace

// ---- the rules alone ---------------------------------------------------------------------------

TEST_CASE("ordering: two reads never conflict; a live run's outputs refuse; host copies settle", "[ordering]") {
    CHECK(detail::order_for(Touch::device, Touch::none, Touch::device, Touch::none, false) == Need::none);
    CHECK(detail::order_for(Touch::host_now, Touch::none, Touch::device, Touch::none, true) == Need::none);
    // Read after write.
    CHECK(detail::order_for(Touch::device, Touch::none, Touch::none, Touch::device, false) == Need::stream_wait);
    CHECK(detail::order_for(Touch::host_now, Touch::none, Touch::none, Touch::device, false) == Need::settle_now);
    CHECK(detail::order_for(Touch::device, Touch::none, Touch::none, Touch::host_deferred, false) == Need::settle_now);
    CHECK(detail::order_for(Touch::device, Touch::none, Touch::none, Touch::device, true) == Need::refuse);
    // Write after write.
    CHECK(detail::order_for(Touch::none, Touch::device, Touch::none, Touch::device, false) == Need::stream_wait);
    CHECK(detail::order_for(Touch::none, Touch::host_deferred, Touch::none, Touch::device, false) == Need::stream_wait);
    CHECK(detail::order_for(Touch::none, Touch::host_deferred, Touch::none, Touch::host_deferred, false) ==
          Need::settle_after);
    CHECK(detail::order_for(Touch::none, Touch::device, Touch::none, Touch::host_deferred, false) == Need::settle_now);
    CHECK(detail::order_for(Touch::host_now, Touch::host_deferred, Touch::none, Touch::host_deferred, false) ==
          Need::settle_now);
    CHECK(detail::order_for(Touch::none, Touch::device, Touch::none, Touch::device, true) == Need::refuse);
    // Write after read.
    CHECK(detail::order_for(Touch::none, Touch::device, Touch::device, Touch::none, false) == Need::stream_wait);
    CHECK(detail::order_for(Touch::none, Touch::host_deferred, Touch::device, Touch::none, true) ==
          Need::after_uploads);
    CHECK(detail::order_for(Touch::none, Touch::device, Touch::none, Touch::none, false) == Need::none);
}

TEST_CASE("ordering: host boxes meet only when their ranges overlap", "[ordering]") {
    std::vector<std::byte> a(100), b(100);
    detail::HostBox x, y;
    CHECK(x.empty());
    x.add(a.data(), 50);
    y.add(a.data() + 50, 50);
    CHECK_FALSE(x.meets(y));
    y.add(a.data() + 49, 1);
    CHECK(x.meets(y));
    const TensorArg args[] = {
        {a.data(), 10, Direction::In}, {b.data(), 0, Direction::In}, {b.data(), 10, Direction::In, Placement::Device}};
    const detail::HostBox only_a = detail::box_of(args);
    CHECK(only_a.begin == reinterpret_cast<std::uintptr_t>(a.data()));
    CHECK(only_a.end == reinterpret_cast<std::uintptr_t>(a.data() + 10));
}

TEST_CASE("ordering: a slot is chosen least recently used first, idle before pending, never a taken one",
          "[ordering][slots]") {
    std::vector<detail::SlotView> slots{{false, false, 5}, {false, true, 1}, {false, false, 3}, {true, false, 0}};
    std::vector<bool> idle(slots.size(), false);
    std::vector<bool> usable(slots.size(), true);
    auto choose = [&] {
        return detail::choose_slot(
            slots.size(), [&](std::size_t i) { return slots[i]; }, [&](std::size_t i) { return bool(idle[i]); },
            [&](std::size_t i) { return bool(usable[i]); });
    };
    CHECK(choose() == std::optional<std::size_t>(2));  // idle, least recently used; 3 is taken
    idle[1] = true;                                    // slot 1's pending work turns out complete
    CHECK(choose() == std::optional<std::size_t>(1));
    usable[1] = false;
    CHECK(choose() == std::optional<std::size_t>(2));
    slots[0].taken = slots[2].taken = true;
    CHECK(choose() == std::optional<std::size_t>(1));  // only an unusable one left: the bind says why
    slots[1].taken = true;
    CHECK_FALSE(choose().has_value());
    std::vector<detail::SlotView> pending{{false, true, 4}, {false, true, 2}};
    CHECK(detail::choose_slot(
              2, [&](std::size_t i) { return pending[i]; }, [](std::size_t) { return false; },
              [](std::size_t) { return true; }) == std::optional<std::size_t>(1));  // the one bound longest ago
}

// ---- through a Stager on the deferred mock -----------------------------------------------------

TEMPLATE_TEST_CASE("ordering: InOut state chained through host memory by runs in flight gains every step",
                   "[ordering][deferred]", RetainedBump<>, PerTensorMalloc<>, Packed) {
    for (const bool two_streams : {false, true}) {
        for (const std::size_t slots : {std::size_t{2}, std::size_t{3}}) {
            CAPTURE(two_streams, slots);
            Mock mock(MockConfig{.deferred_async = true});
            const auto one = test::make_stream(mock);
            const auto two = two_streams ? test::make_stream(mock) : one;
            std::vector<std::byte> state(64, std::byte{10});
            const TensorArg args[] = {{state.data(), state.size(), Direction::InOut}};
            {
                Stager<Mock, TestType> stager(mock, TestType{}, slots);
                std::vector<std::unique_ptr<AddKernel>> kernels;
                std::vector<Completion> done;
                constexpr int steps = 5;
                for (int i = 0; i < steps; ++i) {
                    kernels.push_back(std::make_unique<AddKernel>());
                    const auto stream = i % 2 == 0 ? one : two;
                    Result<Completion> finished = step(stager, mock, args, *kernels.back(), stream, stream);
                    REQUIRE(finished.ok());
                    done.push_back(std::move(*finished));
                }
                while (!done.empty()) {  // waited last first, as locals are destroyed
                    REQUIRE(done.back().wait().ok());
                    done.pop_back();
                }
                CHECK(all_equal(state, 10 + steps));
                for (const auto& kernel : kernels) CHECK(kernel->status.ok());
                if constexpr (detail::pack_limit_of<TestType>() > 0) CHECK(stager.stats().hazard_settles > 0);
            }
            CHECK(mock.misuses() == 0);
            REQUIRE(mock.destroy_stream(one).ok());
            if (two_streams) REQUIRE(mock.destroy_stream(two).ok());
        }
    }
}

TEMPLATE_TEST_CASE("ordering: two runs writing one Out leave the later run's bytes, whatever the wait order",
                   "[ordering][deferred]", RetainedBump<>, PerTensorMalloc<>, Packed) {
    for (const bool two_streams : {false, true}) {
        CAPTURE(two_streams);
        Mock mock(MockConfig{.deferred_async = true});
        const auto one = test::make_stream(mock);
        const auto two = two_streams ? test::make_stream(mock) : one;
        std::vector<std::byte> out(3000), in(100, std::byte{1});
        const TensorArg args[] = {{in.data(), in.size(), Direction::In}, {out.data(), out.size(), Direction::Out}};
        {
            Stager<Mock, TestType> stager(mock, TestType{}, 2);
            AddKernel first, second;
            first.fill = 1;
            second.fill = 2;
            Result<Completion> a = step(stager, mock, args, first, one, one);
            Result<Completion> b = step(stager, mock, args, second, two, two);
            REQUIRE(a.ok());
            REQUIRE(b.ok());
            REQUIRE(b->wait().ok());
            CHECK(all_equal(out, 2));  // wait() ok: this run's outputs are in host memory
            REQUIRE(a->wait().ok());
            CHECK(all_equal(out, 2));  // the earlier run's outputs do not come after
            // With nothing shared between them, the runs did not wait for each other at bind.
            CHECK(stager.stats().hazard_settles == 0);
        }
        CHECK(mock.misuses() == 0);
        REQUIRE(mock.destroy_stream(one).ok());
        if (two_streams) REQUIRE(mock.destroy_stream(two).ok());
    }
}

TEMPLATE_TEST_CASE("ordering: a run reading what a run in flight on another stream writes is ordered after it",
                   "[ordering][deferred]", RetainedBump<>, PerTensorMalloc<>, Packed) {
    Mock mock(MockConfig{.deferred_async = true});
    const auto one = test::make_stream(mock);
    const auto two = test::make_stream(mock);
    std::vector<std::byte> x(20000, std::byte{0}), y(20000, std::byte{0});  // above the pack limit
    {
        Stager<Mock, TestType> stager(mock, TestType{}, 2);
        AddKernel producer, consumer;
        producer.fill = 7;
        consumer.add = 1;
        const TensorArg write_x[] = {{x.data(), x.size(), Direction::Out}};
        const TensorArg x_into_y[] = {{x.data(), x.size(), Direction::InOut}, {y.data(), y.size(), Direction::Out}};
        consumer.fill = 3;
        Result<Completion> a = step(stager, mock, write_x, producer, one, one);
        REQUIRE(a.ok());
        Result<Completion> b = step(stager, mock, x_into_y, consumer, two, two);
        REQUIRE(b.ok());
        CHECK(stager.stats().hazard_stream_waits == 1);
        CHECK(stager.stats().host_waits == 0);  // the device orders it: no host wait
        REQUIRE(b->wait().ok());
        CHECK(all_equal(x, 8));
        CHECK(all_equal(y, 3));
        REQUIRE(a->wait().ok());
        CHECK(all_equal(x, 8));
    }
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(one).ok());
    REQUIRE(mock.destroy_stream(two).ok());
}

TEST_CASE("ordering: with nothing shared, two slots overlap with no host wait in bind, frame or finish",
          "[ordering][deferred]") {
    Mock mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    {
        Stager<Mock, Packed> stager(mock, Packed{}, 2);
        std::vector<std::vector<std::byte>> buffers;
        for (int i = 0; i < 20; ++i) buffers.emplace_back(512 + 100 * i, std::byte{1});
        std::vector<std::unique_ptr<AddKernel>> kernels;
        Completion previous;
        for (int i = 0; i < 10; ++i) {
            auto& a = buffers[2 * i];
            auto& b = buffers[2 * i + 1];
            const TensorArg args[] = {{a.data(), a.size(), Direction::In}, {b.data(), b.size(), Direction::InOut}};
            kernels.push_back(std::make_unique<AddKernel>());
            Result<Completion> done = step(stager, mock, args, *kernels.back(), stream, stream);
            REQUIRE(done.ok());
            previous = std::move(*done);  // waits for step i-1, after step i was enqueued
        }
        (void)previous.wait();
        CHECK(stager.stats().hazard_settles == 0);
        CHECK(stager.stats().hazard_stream_waits == 0);
        for (int i = 0; i < 10; ++i) CHECK(all_equal(buffers[2 * i + 1], 2));
    }
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("ordering: a frame's slot is not taken while its Completion lives", "[ordering][frame]") {
    Mock mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    {
        Stager<Mock, Packed> stager(mock, Packed{}, 2);
        const TensorShape shapes[] = {{256, Direction::In}, {512, Direction::Out}};
        Result<HostFrame> first = stager.frame(shapes);
        REQUIRE(first.ok());
        AddKernel ka, kb;
        ka.fill = 1;
        kb.fill = 2;
        Result<StagedRun> run = stager.bind(*first, stream);
        REQUIRE(run.ok());
        ka.mock = &mock;
        ka.device.assign(run->device_args().begin(), run->device_args().end());
        ka.directions = {Direction::In, Direction::Out};
        REQUIRE(mock.launch_host_func(stream, &AddKernel::run, &ka).ok());
        Result<Completion> a = stager.finish(std::move(*run), stream);
        REQUIRE(a.ok());
        REQUIRE(a->wait().ok());  // waited, but still held: the engine reads host(1)
        const std::span<std::byte> out = first->host(1);
        CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{1}; }));

        Result<HostFrame> second = stager.frame(shapes);
        REQUIRE(second.ok());
        CHECK(second->slot() != first->slot());
        Result<StagedRun> other = stager.bind(*second, stream);
        REQUIRE(other.ok());
        kb.mock = &mock;
        kb.device.assign(other->device_args().begin(), other->device_args().end());
        kb.directions = {Direction::In, Direction::Out};
        REQUIRE(mock.launch_host_func(stream, &AddKernel::run, &kb).ok());
        Result<Completion> b = stager.finish(std::move(*other), stream);
        REQUIRE(b.ok());
        // Both slots held: a third frame and a plain bind are busy, naming why.
        Result<HostFrame> third = stager.frame(shapes);
        REQUIRE_FALSE(third.ok());
        CHECK(third.status().code() == Errc::busy);
        CHECK_THAT(third.status().message(), Catch::Contains("Completion is still held"));
        std::vector<std::byte> plain(100);
        const TensorArg plain_args[] = {{plain.data(), plain.size(), Direction::In}};
        CHECK(stager.bind(plain_args, stream).status().code() == Errc::busy);
        CHECK(stager.bind_slot(first->slot(), plain_args, stream).status().code() == Errc::busy);
        REQUIRE(b->wait().ok());
        CHECK(std::all_of(out.begin(), out.end(), [](std::byte x) { return x == std::byte{1}; }));  // untouched
        const std::size_t first_slot = first->slot();
        a->detach();  // gives the frame back
        Result<HostFrame> again = stager.frame(shapes);
        REQUIRE(again.ok());
        CHECK(again->slot() == first_slot);
        Result<StagedRun> last = stager.bind(*again, stream);
        REQUIRE(last.ok());
        REQUIRE(stager.finish(std::move(*last), stream).ok());  // destroyed at once: the hold ends
    }
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("ordering: a frame's output fed back into a bind that grows is read before anything is freed",
          "[ordering][frame]") {
    Mock mock(MockConfig{.deferred_async = true});
    const auto stream = test::make_stream(mock);
    {
        Stager<Mock, Packed> stager(mock, Packed{}, 2);
        const TensorShape shapes[] = {{256, Direction::In}, {512, Direction::Out}};
        Result<HostFrame> frame = stager.frame(shapes);
        REQUIRE(frame.ok());
        AddKernel kernel;
        kernel.fill = 9;
        Result<StagedRun> run = stager.bind(*frame, stream);
        REQUIRE(run.ok());
        kernel.mock = &mock;
        kernel.device.assign(run->device_args().begin(), run->device_args().end());
        kernel.directions = {Direction::In, Direction::Out};
        REQUIRE(mock.launch_host_func(stream, &AddKernel::run, &kernel).ok());
        Result<Completion> done = stager.finish(std::move(*run), stream);
        REQUIRE(done.ok());
        // Not waited for: the next bind reads the frame's output, which the run will still write.
        std::vector<std::byte> big(12000, std::byte{4}), result(512);
        const TensorArg fed[] = {{frame->host(1).data(), 512, Direction::In},
                                 {big.data(), big.size(), Direction::In},
                                 {result.data(), result.size(), Direction::Out}};
        AddKernel copy;
        copy.fill = 5;
        Result<Completion> next = step(stager, mock, fed, copy, stream, stream);
        REQUIRE(next.ok());
        CHECK(stager.stats().hazard_settles == 1);  // the packed copy of the input waited for it
        REQUIRE(next->wait().ok());
        CHECK(all_equal(result, 5));
        REQUIRE(done->wait().ok());
    }
    {
        // One slot, the frame's Completion gone: an arg in the slot's own mirror is refused
        // before the mirror is grown or rewritten.
        Stager<Mock, Packed> stager(mock, Packed{});
        const TensorShape shapes[] = {{256, Direction::In}, {512, Direction::Out}};
        Result<HostFrame> frame = stager.frame(shapes);
        REQUIRE(frame.ok());
        Result<StagedRun> run = stager.bind(*frame, stream);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run), stream).ok());
        std::vector<std::byte> big(12000);
        const TensorArg fed[] = {{frame->host(1).data(), 512, Direction::In}, {big.data(), big.size(), Direction::In}};
        Result<StagedRun> refused = stager.bind(fed, stream);
        REQUIRE_FALSE(refused.ok());
        CHECK_THAT(refused.status().message(), Catch::Contains("arg 0") && Catch::Contains("frame mirror"));
        CHECK(stager.live_runs() == 0);
    }
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(stream).ok());
}

TEST_CASE("ordering: host(i) is aligned as the device slice whatever pinned_malloc returns", "[ordering][frame]") {
    Mock mock(MockConfig::adversarial());  // pointers 64 past a 4096 boundary
    Stager<Mock, Packed> stager(mock);
    const TensorShape shapes[] = {{100, Direction::In}, {3000, Direction::InOut}, {10, Direction::Out}};
    Result<HostFrame> frame = stager.frame(shapes);
    REQUIRE(frame.ok());
    for (std::size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(reinterpret_cast<std::uintptr_t>(frame->host(i).data()) % 1024 == 0);
    }
    Result<StagedRun> run = stager.bind(*frame);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    REQUIRE(stager.release().ok());
    CHECK(mock.live_pinned_allocations() == 0);
}

TEMPLATE_TEST_CASE("ordering: a failed join keeps the run's memory until the finish stream's kernel ran",
                   "[ordering][deferred][faults]", RetainedBump<>, PerTensorMalloc<>) {
    Mock mock(MockConfig{.deferred_async = true});
    const auto upload = test::make_stream(mock);
    const auto compute = test::make_stream(mock);
    std::vector<std::byte> in(5000, std::byte{3}), out(5000);
    const TensorArg args[] = {{in.data(), in.size(), Direction::In}, {out.data(), out.size(), Direction::Out}};
    {
        Stager<Mock, TestType> stager(mock);
        AddKernel kernel;
        kernel.fill = 1;
        Result<StagedRun> run = stager.bind(args, upload);
        REQUIRE(run.ok());
        kernel.mock = &mock;
        kernel.device.assign(run->device_args().begin(), run->device_args().end());
        kernel.directions = {Direction::In, Direction::Out};
        REQUIRE(mock.launch_host_func(compute, &AddKernel::run, &kernel).ok());
        const std::uint64_t waits = mock.calls(MockOp::stream_wait_event);
        mock.fail_call(MockOp::stream_wait_event, waits + 1);  // the stager's own join
        Result<Completion> done = stager.finish(std::move(*run), compute);
        CHECK_FALSE(done.ok());
        REQUIRE(stager.release().ok());  // waits for the kernel's stream before anything is freed
        CHECK(kernel.status.ok());
    }
    CHECK(mock.misuses() == 0);
    CHECK(mock.live_device_allocations() == 0);
    REQUIRE(mock.destroy_stream(upload).ok());
    REQUIRE(mock.destroy_stream(compute).ok());
}

TEST_CASE("ordering: a failed reserve keeps what the slot held", "[ordering][reserve]") {
    Mock mock(MockConfig{.device_capacity = 1 << 20});
    Stager<Mock> stager(mock);
    std::vector<std::byte> host(4096);
    const TensorArg args[] = {{host.data(), host.size(), Direction::InOut}};
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    const void* base = stager.strategy().base();
    const std::size_t capacity = stager.strategy().capacity();
    const Status refused = stager.reserve(std::size_t{1} << 30);
    CHECK(refused.code() == Errc::out_of_memory);
    CHECK(stager.strategy().base() == base);
    CHECK(stager.strategy().capacity() == capacity);
    const std::uint64_t mallocs = mock.calls(MockOp::device_malloc);
    auto again = stager.bind(args);
    REQUIRE(again.ok());
    REQUIRE(stager.finish(std::move(*again)).ok());
    CHECK(mock.calls(MockOp::device_malloc) == mallocs);
}

TEST_CASE("ordering: a stager of too many slots says so at every call, throwing nothing", "[ordering][misuse]") {
    Mock mock;
    Stager<Mock> stager(mock, RetainedBump<>{}, std::numeric_limits<std::size_t>::max());
    CHECK(stager.status().code() == Errc::invalid_argument);
    CHECK_THAT(stager.status().message(), Catch::Contains("pipeline slots") && Catch::Contains("at most 256"));
    std::vector<std::byte> host(64);
    const TensorArg args[] = {{host.data(), host.size(), Direction::In}};
    Result<StagedRun> run = stager.bind(args);
    REQUIRE_FALSE(run.ok());
    CHECK(run.status().code() == Errc::invalid_argument);
    CHECK(stager.reserve(1024).code() == Errc::invalid_argument);
    CHECK(stager.release().ok());
    CHECK(mock.live_device_allocations() == 0);
}

TEMPLATE_TEST_CASE("ordering: a run writing what a live run's pending upload reads waits for that upload",
                   "[ordering][deferred]", RetainedBump<>, PerTensorMalloc<>) {
    Mock mock(MockConfig{.deferred_async = true});
    const auto one = test::make_stream(mock);
    const auto two = test::make_stream(mock);
    std::vector<std::byte> x(600, std::byte{5}), y(100);
    {
        Stager<Mock, TestType> stager(mock, TestType{}, 2);
        const TensorArg reads_x[] = {{x.data(), x.size(), Direction::In}, {y.data(), y.size(), Direction::Out}};
        const TensorArg writes_x[] = {{x.data() + 500, 100, Direction::Out}};
        Result<StagedRun> live = stager.bind(reads_x, one);  // its upload of x is pending
        REQUIRE(live.ok());
        AddKernel writer;
        writer.fill = 9;
        Result<Completion> b = step(stager, mock, writes_x, writer, two, two);
        REQUIRE(b.ok());
        CHECK(stager.stats().hazard_stream_waits == 1);
        AddKernel reader;
        reader.mock = &mock;
        reader.device.assign(live->device_args().begin(), live->device_args().end());
        reader.directions = {Direction::In, Direction::Out};
        reader.fill = 1;
        REQUIRE(mock.launch_host_func(one, &AddKernel::run, &reader).ok());
        Result<Completion> a = stager.finish(std::move(*live), one);
        REQUIRE(a.ok());
        REQUIRE(b->wait().ok());
        REQUIRE(a->wait().ok());
        CHECK(all_equal(std::vector<std::byte>(x.begin() + 500, x.end()), 9));
    }
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(one).ok());
    REQUIRE(mock.destroy_stream(two).ok());
}
