// SPDX-License-Identifier: Apache-2.0
#pragma once
// Stream-ordered staging, written once and instantiated for every AsyncBackend. The including
// TU defines `AsyncStagingBackends` (a std::tuple of backend types with a test::BackendFactory;
// each a PinnedHostBackend). Results must equal synchronous staging byte for byte.

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "devstage/stager.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "suite_strategies.hpp"
#include "support.hpp"

namespace async_staging {
using namespace devstage;
using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<4096>>;

// Blocks the host until everything enqueued on `stream` so far completed.
template <class B>
Status wait_stream(B& backend, typename B::Stream stream) {
    Result<typename B::Event> event = backend.create_event();
    if (!event) return event.status();
    Status status = backend.record_event(*event, stream);
    if (status) status = backend.synchronize_event(*event);
    (void)backend.destroy_event(*event);
    return status;
}

// The stand-in kernel, in stream order: a host function where the backend runs them, else the
// host waits for the stream and runs it itself. The object must live until the run completed.
template <class B>
struct Kernel {
    B* backend = nullptr;
    std::vector<TensorArg> device_args;
    std::span<const TensorArg> host_args;
    Status status;

    static void run(void* self) {
        auto* kernel = static_cast<Kernel*>(self);
        kernel->status = test::fake_kernel(*kernel->backend, kernel->device_args, kernel->host_args);
    }
    Status launch(B& on, typename B::Stream stream, std::span<const TensorArg> device,
                  std::span<const TensorArg> host) {
        backend = &on;
        device_args.assign(device.begin(), device.end());
        host_args = host;
        if constexpr (HostFunctionBackend<B>) {
            return on.launch_host_func(stream, &Kernel::run, this);
        } else {
            if (Status waited = wait_stream(on, stream); !waited) return waited;
            run(this);
            return status;
        }
    }
};

// One stream-ordered run: bind on `bind_stream`, the kernel there, finish on `finish_stream`.
template <class S, class B>
Result<Completion> stream_run(S& stager, B& backend, test::HostRun& host, Kernel<B>& kernel,
                              typename B::Stream bind_stream, typename B::Stream finish_stream) {
    Result<StagedRun> run = stager.bind(host.args, bind_stream);
    if (!run) return run.status();
    if (Status launched = kernel.launch(backend, bind_stream, run->device_args(), host.args); !launched) {
        return launched;
    }
    return stager.finish(std::move(*run), finish_stream);
}

// The synchronous reference result of a run over PerTensorMalloc.
template <class B>
std::vector<std::vector<std::byte>> reference(B& backend, const test::HostRun& host) {
    test::HostRun copy = host;
    copy.relink();
    Stager<B, PerTensorMalloc<>> stager(backend);
    Result<StagedRun> run = stager.bind(copy.args);
    REQUIRE(run.ok());
    REQUIRE(test::fake_kernel(backend, run->device_args(), copy.args).ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    return copy.buffers;
}

inline test::HostRun random_run(std::uint32_t seed) {
    std::uint32_t x = seed;
    const auto next = [&x] {
        x = x * 1664525u + 1013904223u;
        return x >> 8;
    };
    test::HostRun host;
    const std::size_t sizes[] = {0, 1, 63, 1023, 1024, 4095, 4096, 4097, 9000, 70000};
    const std::size_t count = 1 + next() % 12;
    for (std::size_t i = 0; i < count; ++i) {
        host.add(sizes[next() % 10] + next() % 2, static_cast<Direction>(next() % 3), next());
    }
    return host;
}

template <class B>
struct Streams {
    explicit Streams(B& b) : backend(b), one(test::make_stream(b)), two(test::make_stream(b)) {}
    Streams(const Streams&) = delete;
    Streams& operator=(const Streams&) = delete;
    ~Streams() {
        CHECK(backend.destroy_stream(one).ok());
        CHECK(backend.destroy_stream(two).ok());
    }
    B& backend;
    typename B::Stream one, two;
};
}  // namespace async_staging

TEMPLATE_LIST_TEST_CASE("async staging: stream-ordered runs equal synchronous ones, byte for byte",
                        "[async][staging][equivalence]", AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    const std::uint32_t seed = GENERATE(range(1u, 9u));
    CAPTURE(seed);
    const test::HostRun original = random_run(seed);
    const auto expected = reference(*backend, original);
    const auto check = [&](auto strategy, typename TestType::Stream finish_stream) {
        Stager<TestType, decltype(strategy)> stager(*backend);
        test::HostRun host = original;
        host.relink();
        Kernel<TestType> kernel;
        Result<Completion> done = stream_run(stager, *backend, host, kernel, streams.one, finish_stream);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        REQUIRE(kernel.status.ok());
        CHECK(devstage::test::same_bytes(host.buffers, expected));
        CHECK(stager.stats().async_uploads > 0);
    };
    check(devstage::test::RetainedOf<TestType>{}, streams.one);
    check(PerTensorMalloc<>{}, streams.one);
    check(devstage::test::PackedOf<TestType>{}, streams.one);
    check(devstage::test::RetainedOf<TestType>{}, streams.two);  // finished on another stream than the bind's
    check(devstage::test::PackedOf<TestType>{}, streams.two);
}

TEMPLATE_LIST_TEST_CASE("async staging: a slot reused on its stream needs no host wait", "[async][staging][slots]",
                        AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);  // one slot
    constexpr int steps = 4;
    std::vector<test::HostRun> hosts;
    for (int i = 0; i < steps; ++i) hosts.push_back(random_run(100 + static_cast<std::uint32_t>(i)));
    for (auto& host : hosts) host.relink();
    std::vector<std::vector<std::vector<std::byte>>> expected;
    for (const auto& host : hosts) expected.push_back(reference(*backend, host));
    std::vector<std::unique_ptr<Kernel<TestType>>> kernels;
    std::vector<Completion> pending;
    for (int i = 0; i < steps; ++i) {
        kernels.push_back(std::make_unique<Kernel<TestType>>());
        // Alternate streams: a reuse from the other stream waits through the slot's event.
        const auto stream = i % 2 == 0 ? streams.one : streams.two;
        Result<Completion> done = stream_run(stager, *backend, hosts[i], *kernels.back(), stream, stream);
        REQUIRE(done.ok());
        pending.push_back(std::move(*done));
    }
    if constexpr (HostFunctionBackend<TestType>) CHECK(stager.stats().host_waits == 0);
    for (auto& done : pending) REQUIRE(done.wait().ok());
    for (int i = 0; i < steps; ++i) {
        CAPTURE(i);
        CHECK(kernels[i]->status.ok());
        CHECK(devstage::test::same_bytes(hosts[i].buffers, expected[i]));
    }
    CHECK(stager.stats().regrows >= 1);
}

TEMPLATE_LIST_TEST_CASE("async staging: per-tensor allocations are freed once the run completed",
                        "[async][staging][per_tensor]", AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    Stager<TestType, PerTensorMalloc<>> stager(*backend);
    test::HostRun host = random_run(7);
    host.add(5000, Direction::InOut, 70);
    Kernel<TestType> kernel;
    Result<Completion> done = stream_run(stager, *backend, host, kernel, streams.one, streams.one);
    REQUIRE(done.ok());
    const std::uint64_t staged = stager.stats().device_mallocs;
    CHECK(stager.stats().deferred_frees == staged);  // not freed under the pending copy-backs
    CHECK(stager.stats().device_frees == 0);
    REQUIRE(done->wait().ok());
    CHECK(stager.stats().device_frees == staged);
}

TEMPLATE_LIST_TEST_CASE("async staging: a packed slot is waited for before its mirror is rewritten",
                        "[async][staging][packing]", AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    test::HostRun a = random_run(11), b = random_run(12);
    a.add(100, Direction::InOut, 110);  // something packed in each
    b.add(100, Direction::In, 120);
    a.relink();
    b.relink();
    const auto expected_a = reference(*backend, a), expected_b = reference(*backend, b);
    Stager<TestType, devstage::test::PackedOf<TestType>> one_slot(*backend);
    Kernel<TestType> ka, kb;
    Result<Completion> first = stream_run(one_slot, *backend, a, ka, streams.one, streams.one);
    REQUIRE(first.ok());
    const std::uint64_t waits = one_slot.stats().host_waits;
    Result<Completion> second = stream_run(one_slot, *backend, b, kb, streams.one, streams.one);
    REQUIRE(second.ok());
    // At most one wait: for the first run, if it was still pending (the deferred mock proves it
    // is, below); either way the results show the mirror was not rewritten under it.
    CHECK(one_slot.stats().host_waits <= waits + 1);
    REQUIRE(first->wait().ok());
    REQUIRE(second->wait().ok());
    CHECK(devstage::test::same_bytes(a.buffers, expected_a));
    CHECK(devstage::test::same_bytes(b.buffers, expected_b));
}

TEMPLATE_LIST_TEST_CASE("async staging: frames bind on a stream with one upload", "[async][staging][frame]",
                        AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    Stager<TestType, devstage::test::PackedOf<TestType>> stager(*backend, devstage::test::PackedOf<TestType>{}, 2);
    const TensorShape shapes[] = {
        {20000, Direction::In}, {100, Direction::In}, {3000, Direction::InOut}, {9000, Direction::Out}};
    for (int step = 0; step < 3; ++step) {
        auto frame = stager.frame(shapes);
        REQUIRE(frame.ok());
        test::HostRun host;  // the same inputs in ordinary memory, for the reference
        for (std::size_t i = 0; i < frame->size(); ++i) {
            const auto bytes = test::pattern(frame->host(i).size(), static_cast<std::uint32_t>(step * 10 + i));
            std::copy(bytes.begin(), bytes.end(), frame->host(i).begin());
            host.add(bytes.size(), frame->args()[i].direction, static_cast<std::uint32_t>(step * 10 + i));
        }
        const auto expected = reference(*backend, host);
        const std::uint64_t uploads = stager.stats().uploads;
        auto run = stager.bind(*frame, streams.one);
        REQUIRE(run.ok());
        CHECK(stager.stats().uploads == uploads + 1);
        Kernel<TestType> kernel;
        REQUIRE(kernel.launch(*backend, streams.one, run->device_args(), frame->args()).ok());
        auto done = stager.finish(std::move(*run), streams.one);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        for (std::size_t i = 0; i < frame->size(); ++i) {
            CAPTURE(step, i);
            CHECK(devstage::test::same_bytes(frame->host(i), expected[i]));
        }
    }
    CHECK(stager.stats().mirror_copy_bytes == 0);
}

TEMPLATE_LIST_TEST_CASE("async staging: release, the destructor and a Completion's destructor wait; detach does not",
                        "[async][staging][completion]", AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    test::HostRun host = random_run(21);
    host.add(777, Direction::Out, 210);
    host.relink();
    const auto expected = reference(*backend, host);
    SECTION("the Completion's destructor") {
        Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
        Kernel<TestType> kernel;
        {
            Result<Completion> done = stream_run(stager, *backend, host, kernel, streams.one, streams.one);
            REQUIRE(done.ok());
        }
        CHECK(devstage::test::same_bytes(host.buffers, expected));
    }
    SECTION("release") {
        Stager<TestType, PerTensorMalloc<>> stager(*backend);
        Kernel<TestType> kernel;
        Result<Completion> done = stream_run(stager, *backend, host, kernel, streams.one, streams.one);
        REQUIRE(done.ok());
        done->detach();
        REQUIRE(stager.release().ok());
        CHECK(stager.stats().device_frees == stager.stats().device_mallocs);
        CHECK(devstage::test::same_bytes(host.buffers, expected));
        CHECK(done->wait().ok());
    }
    SECTION("the stager's destructor, with a Completion still watching") {
        Kernel<TestType> kernel;
        Result<Completion> done = Status(Errc::busy, "unset");
        {
            Stager<TestType, devstage::test::PackedOf<TestType>> stager(*backend);
            done = stream_run(stager, *backend, host, kernel, streams.one, streams.one);
            REQUIRE(done.ok());
        }
        CHECK_FALSE(done->pending());
        CHECK(done->wait().ok());
        CHECK(devstage::test::same_bytes(host.buffers, expected));
    }
}

TEMPLATE_LIST_TEST_CASE("async staging: abandon forgets pending work; watched Completions fail", "[async][staging]",
                        AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    if constexpr (requires { backend->set_error_sink(&test::quiet_sink); }) {
        backend->set_error_sink(&test::quiet_sink);  // what abandon forgets is a leak to the mock
    }
    Streams<TestType> streams(*backend);
    test::HostRun host = random_run(31);
    Kernel<TestType> kernel;
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
    Result<Completion> done = stream_run(stager, *backend, host, kernel, streams.one, streams.one);
    REQUIRE(done.ok());
    REQUIRE(wait_stream(*backend, streams.one).ok());  // the work itself completes; only the stager forgets
    stager.abandon();
    const Status forgotten = done->wait();
    CHECK(forgotten.code() == Errc::backend_failure);
    CHECK_THAT(forgotten.message(), Catch::Contains("abandon"));
    // The stager starts afresh (new events, new stream, new buffer).
    test::HostRun again = random_run(32);
    const auto expected = reference(*backend, again);
    Kernel<TestType> next;
    Result<Completion> clean = stream_run(stager, *backend, again, next, streams.one, streams.one);
    REQUIRE(clean.ok());
    REQUIRE(clean->wait().ok());
    CHECK(devstage::test::same_bytes(again.buffers, expected));
}

TEMPLATE_LIST_TEST_CASE("async staging: a kernel on a compute stream runs after the uploads on the copy stream",
                        "[async][staging][streams]", AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);  // one: uploads and copy-backs; two: the kernel
    const auto check = [&](auto strategy) {
        Stager<TestType, decltype(strategy)> stager(*backend, decltype(strategy){}, 2);
        for (std::uint32_t seed = 1; seed <= 4; ++seed) {
            CAPTURE(seed);
            test::HostRun host = random_run(100 + seed);
            const auto expected = reference(*backend, host);
            Result<StagedRun> run = stager.bind(host.args, streams.one);
            REQUIRE(run.ok());
            const std::uint64_t waits = stager.stats().host_waits;
            REQUIRE(stager.order_after_uploads(*run, streams.two).ok());
            CHECK(stager.stats().host_waits == waits);                    // ordered on the device, not by the host
            REQUIRE(stager.order_after_uploads(*run, streams.one).ok());  // the bind's stream: nothing to do
            Kernel<TestType> kernel;
            REQUIRE(kernel.launch(*backend, streams.two, run->device_args(), host.args).ok());
            Result<Completion> done = stager.finish(std::move(*run), streams.two);
            REQUIRE(done.ok());
            REQUIRE(done->wait().ok());
            REQUIRE(kernel.status.ok());
            CHECK(devstage::test::same_bytes(host.buffers, expected));
        }
        // A run that is no longer live is refused, naming the call.
        test::HostRun host = random_run(99);
        Result<StagedRun> run = stager.bind(host.args, streams.one);
        REQUIRE(run.ok());
        StagedRun moved = std::move(*run);
        const Status stale = stager.order_after_uploads(*run, streams.two);
        CHECK(stale.code() == Errc::invalid_argument);
        CHECK_THAT(stale.message(), Catch::Contains("order_after_uploads") && Catch::Contains("not live"));
        Result<Completion> done = stager.finish(std::move(moved), streams.one);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
    };
    check(devstage::test::RetainedOf<TestType>{});
    check(PerTensorMalloc<>{});
    check(devstage::test::PackedOf<TestType>{});
}

TEMPLATE_LIST_TEST_CASE("async staging: device-resident tensors of a frame pass through; the kernel reads them",
                        "[async][staging][frame]", AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    // Weights (In) and a KV cache (InOut) live on the device; the frame's run and the reference
    // each get their own copy of the cache, which the kernel updates in place.
    const std::size_t weight_bytes = 6000, cache_bytes = 5000;
    test::DeviceBytes<TestType> weights(*backend, weight_bytes), cache(*backend, cache_bytes),
        reference_cache(*backend, cache_bytes);
    REQUIRE(backend->copy_to_device(weights.get(), test::pattern(weight_bytes, 7).data(), weight_bytes).ok());
    Stager<TestType, devstage::test::PackedOf<TestType>> stager(*backend, devstage::test::PackedOf<TestType>{}, 2);
    for (std::uint32_t step = 0; step < 3; ++step) {
        CAPTURE(step);
        const std::vector<std::byte> start = test::pattern(cache_bytes, 20 + step);
        REQUIRE(backend->copy_to_device(cache.get(), start.data(), cache_bytes).ok());
        REQUIRE(backend->copy_to_device(reference_cache.get(), start.data(), cache_bytes).ok());
        const TensorShape shapes[] = {{100, Direction::In},
                                      {weight_bytes, Direction::In, weights.get()},
                                      {3000, Direction::In},
                                      {cache_bytes, Direction::InOut, cache.get()},
                                      {2000, Direction::Out}};
        auto frame = stager.frame(shapes);
        REQUIRE(frame.ok());
        CHECK(frame->host(1).empty());
        CHECK(frame->host(3).empty());
        test::HostRun host;  // the same run with ordinary host memory, for the reference
        for (std::size_t i = 0; i < frame->size(); ++i) {
            const TensorArg& arg = frame->args()[i];
            if (arg.placement == Placement::Device) {
                host.add_device(i == 1 ? weights.get() : reference_cache.get(), arg.bytes);
                host.args.back().direction = arg.direction;
                continue;
            }
            const auto bytes = test::pattern(arg.bytes, step * 10 + static_cast<std::uint32_t>(i));
            std::copy(bytes.begin(), bytes.end(), frame->host(i).begin());
            host.add(arg.bytes, arg.direction, step * 10 + static_cast<std::uint32_t>(i));
        }
        const auto expected = reference(*backend, host);
        auto run = stager.bind(*frame, streams.one);
        REQUIRE(run.ok());
        CHECK(run->device_args()[1].data == weights.get());
        CHECK(run->device_args()[3].data == cache.get());
        CHECK(run->device_args()[3].placement == Placement::Device);
        Kernel<TestType> kernel;
        REQUIRE(kernel.launch(*backend, streams.one, run->device_args(), frame->args()).ok());
        auto done = stager.finish(std::move(*run), streams.one);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        REQUIRE(kernel.status.ok());
        for (const std::size_t i : {0, 2, 4}) CHECK(devstage::test::same_bytes(frame->host(i), expected[i]));
        std::vector<std::byte> updated(cache_bytes), wanted(cache_bytes);
        REQUIRE(backend->copy_from_device(updated.data(), cache.get(), cache_bytes).ok());
        REQUIRE(backend->copy_from_device(wanted.data(), reference_cache.get(), cache_bytes).ok());
        CHECK(devstage::test::same_bytes(updated, wanted));  // the kernel updated the cache in place
    }
    CHECK(stager.stats().mirror_copy_bytes == 0);
}

TEMPLATE_LIST_TEST_CASE("async staging: an Out the kernel leaves unwritten reads back as zeros, in every mode",
                        "[async][staging][zeroing]", AsyncStagingBackends) {
    using namespace async_staging;
    auto backend = test::make_backend<TestType>();
    Streams<TestType> streams(*backend);
    // Run one stages 0xAB bytes through the slot; run two's Out args, which no kernel writes,
    // must come back as zeros (and, opted out, as whatever the device memory held).
    const auto check = [&](auto strategy, bool streamed, OutputPolicy policy) {
        CAPTURE(streamed, policy == OutputPolicy::zero);
        Stager<TestType, decltype(strategy)> stager(*backend, decltype(strategy){});
        stager.set_output_policy(policy);
        std::vector<std::byte> first(4096 + 100, std::byte{0xAB});
        const TensorArg in[] = {{first.data(), 4096, Direction::In}, {first.data() + 4096, 100, Direction::In}};
        Result<StagedRun> run = streamed ? stager.bind(in, streams.one) : stager.bind(in);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
        std::vector<std::byte> out(4096 + 100, std::byte{0xCD});
        const TensorArg outs[] = {{out.data(), 4096, Direction::Out}, {out.data() + 4096, 100, Direction::Out}};
        run = streamed ? stager.bind(outs, streams.one) : stager.bind(outs);
        REQUIRE(run.ok());
        if (streamed) {
            Result<Completion> done = stager.finish(std::move(*run), streams.one);
            REQUIRE(done.ok());
            REQUIRE(done->wait().ok());
        } else {
            REQUIRE(stager.finish(std::move(*run)).ok());
        }
        if (policy == OutputPolicy::zero) {
            CHECK(devstage::test::same_bytes(out, std::vector<std::byte>(out.size())));
            // On the device, or in the packed mirror (carried by the packed upload).
            CHECK(stager.stats().zeroed_bytes + stager.stats().host_zeroed_bytes >= 4196);
        } else {
            CHECK(stager.stats().zeroing_calls == 0);
            if constexpr (decltype(strategy)::lease_kind == ReleaseKind::BufferNoop) {
                CHECK(devstage::test::same_bytes(out, first));  // the retained buffer still held run one's bytes
            }
        }
    };
    for (const bool streamed : {false, true}) {
        check(devstage::test::RetainedOf<TestType>{}, streamed, OutputPolicy::zero);
        check(PerTensorMalloc<>{}, streamed, OutputPolicy::zero);
        check(devstage::test::PackedOf<TestType>{}, streamed, OutputPolicy::zero);
        check(devstage::test::RetainedOf<TestType>{}, streamed, OutputPolicy::kernel_writes_all);
        check(devstage::test::PackedOf<TestType>{}, streamed, OutputPolicy::kernel_writes_all);
    }
    // A frame: its Out tensors come back into the frame as zeros.
    Stager<TestType, devstage::test::PackedOf<TestType>> stager(*backend);
    const auto frame_run = [&](std::span<const TensorShape> shapes, std::byte fill, bool zeros) {
        auto frame = stager.frame(shapes);
        REQUIRE(frame.ok());
        for (std::size_t i = 0; i < frame->size(); ++i) std::fill(frame->host(i).begin(), frame->host(i).end(), fill);
        auto run = stager.bind(*frame, streams.one);
        REQUIRE(run.ok());
        auto done = stager.finish(std::move(*run), streams.one);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        for (std::size_t i = 0; zeros && i < frame->size(); ++i) {
            CHECK(devstage::test::same_bytes(frame->host(i), std::vector<std::byte>(frame->host(i).size())));
        }
    };  // the Completion, destroyed, lets go of the frame's slot
    const TensorShape in_shapes[] = {{3000, Direction::In}, {200, Direction::In}};
    const TensorShape out_shapes[] = {{3000, Direction::Out}, {200, Direction::Out}};
    frame_run(in_shapes, std::byte{0xAB}, false);
    frame_run(out_shapes, std::byte{0xCD}, true);
    // Only Out tensors: no upload goes, so they are one device memset where the backend has
    // one, else zeroed in the mirror and uploaded (one call either way).
    if constexpr (detail::SetsDeviceMemory<stream_backend_t<TestType>>) {
        CHECK(stager.stats().zeroing_calls == 1);
        CHECK(stager.stats().host_zeroed_bytes == 0);
    } else {
        CHECK(stager.stats().zeroing_calls == 0);
        CHECK(stager.stats().host_zeroed_bytes == 3072 + 200);
    }
    // With an input, the Out tensors are zeroed in the mirror and go up with it: one copy, no
    // zeroing call, on every backend.
    const std::uint64_t calls = stager.stats().zeroing_calls, uploads = stager.stats().uploads;
    const std::uint64_t host_zeroed = stager.stats().host_zeroed_bytes;
    const TensorShape mixed_shapes[] = {{3000, Direction::In}, {200, Direction::Out}};
    frame_run(mixed_shapes, std::byte{0xEF}, false);
    CHECK(stager.stats().zeroing_calls == calls);
    CHECK(stager.stats().uploads == uploads + 1);
    CHECK(stager.stats().host_zeroed_bytes == host_zeroed + 200);
}
