// SPDX-License-Identifier: Apache-2.0
// CudaBackend on a GPU: the backend contract, staging, pinned, virtual-memory, async contract
// and async staging suites, and the stream and event calls — ordering, cross-stream waits,
// queries while a stream is held by a host function —, is_pinned, and virtual memory from a
// thread that never called CUDA. Without a usable GPU the executable reports itself skipped
// (exit code 77).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_kernel_on_host.hpp"
#include "devstage/backends/cuda.hpp"
#include "support.hpp"

template <>
struct devstage::test::BackendFactory<devstage::CudaBackend> {
    static std::unique_ptr<CudaBackend> make() {
        Result<CudaBackend> gpu = CudaBackend::create(0);
        REQUIRE(gpu.ok());
        return std::make_unique<CudaBackend>(std::move(*gpu));
    }
};
template <>
struct devstage::test::BackendFactory<devstage::test::CudaKernelOnHost> {
    static std::unique_ptr<devstage::test::CudaKernelOnHost> make() {
        Result<CudaBackend> gpu = CudaBackend::create(0);
        REQUIRE(gpu.ok());
        return std::make_unique<devstage::test::CudaKernelOnHost>(std::move(*gpu));
    }
};

using ContractBackends = std::tuple<devstage::CudaBackend>;
using PinnedBackends = std::tuple<devstage::CudaBackend>;
using StagingBackends = std::tuple<devstage::CudaBackend>;
using VmmBackends = std::tuple<devstage::CudaBackend>;
#include "backend_contract.hpp"
#include "pinned_suite.hpp"
#include "staging_suite.hpp"
#include "vmm_suite.hpp"

// The stream-ordered suites. Left out, because CUDA does not promise them (main() below
// excludes them from every run): the "[stale-handle]" case — destroying a stream or an event
// twice is undefined; and the "[errors]" case — cudaMalloc rounds allocations up, so a copy
// that overruns one by a byte may be accepted at the call (and fault later, or not at all).
using AsyncBackends = std::tuple<devstage::CudaBackend>;
using AsyncStagingBackends = std::tuple<devstage::test::CudaKernelOnHost>;
#include "async_contract.hpp"
#include "async_staging_suite.hpp"

using namespace devstage;

namespace {
// Pinned host memory (so that copies are truly asynchronous), freed at the end.
struct Pinned {
    Pinned(CudaBackend& gpu, std::size_t bytes) : gpu(gpu), bytes(bytes) {
        auto allocated = gpu.pinned_malloc(bytes);
        REQUIRE(allocated.ok());
        data = static_cast<std::byte*>(*allocated);
        std::memset(data, 0, bytes);
    }
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
    ~Pinned() { CHECK(gpu.pinned_free(data).ok()); }
    void fill(const std::vector<std::byte>& from) { std::copy(from.begin(), from.end(), data); }
    bool equals(const std::vector<std::byte>& other) const { return std::equal(other.begin(), other.end(), data); }

    CudaBackend& gpu;
    std::size_t bytes;
    std::byte* data = nullptr;
};

// A host function that keeps its stream busy until the test opens the gate.
void wait_for_gate(void* gate) {
    while (!static_cast<std::atomic<bool>*>(gate)->load()) std::this_thread::yield();
}
}  // namespace

TEST_CASE("cuda gpu: a stream runs its copies in order; its event is not ready while a host function holds it",
          "[cuda][async]") {
    auto gpu = test::make_backend<CudaBackend>();
    constexpr std::size_t bytes = std::size_t{1} << 20;
    auto stream = gpu->create_stream();
    auto event = gpu->create_event();
    auto device = gpu->device_malloc(bytes);
    REQUIRE(stream.ok());
    REQUIRE(event.ok());
    REQUIRE(device.ok());
    Pinned a(*gpu, bytes), b(*gpu, bytes), first(*gpu, bytes), second(*gpu, bytes);
    a.fill(test::pattern(bytes, 1));
    b.fill(test::pattern(bytes, 2));
    std::atomic<bool> gate{false};
    REQUIRE(gpu->launch_host_func(*stream, wait_for_gate, &gate).ok());
    REQUIRE(gpu->copy_to_device_async(*device, a.data, bytes, *stream).ok());
    REQUIRE(gpu->copy_from_device_async(first.data, *device, bytes, *stream).ok());
    REQUIRE(gpu->copy_to_device_async(*device, b.data, bytes, *stream).ok());
    REQUIRE(gpu->copy_from_device_async(second.data, *device, bytes, *stream).ok());
    REQUIRE(gpu->record_event(*event, *stream).ok());
    Result<bool> held = gpu->event_ready(*event);
    REQUIRE(held.ok());
    CHECK_FALSE(*held);
    gate.store(true);
    REQUIRE(gpu->synchronize_event(*event).ok());
    Result<bool> done = gpu->event_ready(*event);
    REQUIRE(done.ok());
    CHECK(*done);
    CHECK(first.equals(test::pattern(bytes, 1)));
    CHECK(second.equals(test::pattern(bytes, 2)));
    CHECK(gpu->destroy_event(*event).ok());
    CHECK(gpu->destroy_stream(*stream).ok());
    CHECK(gpu->device_free(*device).ok());
}

TEST_CASE("cuda gpu: stream_wait_event orders work across streams; host functions run in stream order",
          "[cuda][async]") {
    auto gpu = test::make_backend<CudaBackend>();
    constexpr std::size_t bytes = std::size_t{1} << 20;
    auto producer = gpu->create_stream();
    auto consumer = gpu->create_stream();
    auto uploaded = gpu->create_event();
    auto done = gpu->create_event();
    auto device = gpu->device_malloc(bytes);
    REQUIRE(producer.ok());
    REQUIRE(consumer.ok());
    REQUIRE(uploaded.ok());
    REQUIRE(done.ok());
    REQUIRE(device.ok());
    Pinned in(*gpu, bytes), out(*gpu, bytes);
    in.fill(test::pattern(bytes, 3));
    std::atomic<bool> gate{false};
    struct Seen {
        const Pinned* out;
        std::vector<std::byte> expected;
        bool equal = false;
    } seen{&out, test::pattern(bytes, 3)};
    REQUIRE(gpu->launch_host_func(*producer, wait_for_gate, &gate).ok());
    REQUIRE(gpu->copy_to_device_async(*device, in.data, bytes, *producer).ok());
    REQUIRE(gpu->record_event(*uploaded, *producer).ok());
    REQUIRE(gpu->stream_wait_event(*consumer, *uploaded).ok());
    REQUIRE(gpu->copy_from_device_async(out.data, *device, bytes, *consumer).ok());
    REQUIRE(gpu->launch_host_func(
                   *consumer,
                   [](void* data) {
                       auto* s = static_cast<Seen*>(data);
                       s->equal = s->out->equals(s->expected);
                   },
                   &seen)
                .ok());
    REQUIRE(gpu->record_event(*done, *consumer).ok());
    Result<bool> waiting = gpu->event_ready(*done);
    REQUIRE(waiting.ok());
    CHECK_FALSE(*waiting);
    gate.store(true);
    REQUIRE(gpu->synchronize_event(*done).ok());
    CHECK(seen.equal);
    CHECK(out.equals(test::pattern(bytes, 3)));
    for (auto event : {*uploaded, *done}) CHECK(gpu->destroy_event(event).ok());
    for (auto stream : {*producer, *consumer}) CHECK(gpu->destroy_stream(stream).ok());
    CHECK(gpu->device_free(*device).ok());
}

TEST_CASE("cuda gpu: an event never recorded is ready; zero-byte copies succeed", "[cuda][async]") {
    auto gpu = test::make_backend<CudaBackend>();
    auto stream = gpu->create_stream();
    auto event = gpu->create_event();
    REQUIRE(stream.ok());
    REQUIRE(event.ok());
    Result<bool> fresh = gpu->event_ready(*event);
    REQUIRE(fresh.ok());
    CHECK(*fresh);
    CHECK(gpu->synchronize_event(*event).ok());
    CHECK(gpu->stream_wait_event(*stream, *event).ok());
    std::byte host[1]{};
    CHECK(gpu->copy_to_device_async(nullptr, host, 0, *stream).ok());
    CHECK(gpu->copy_from_device_async(host, nullptr, 0, *stream).ok());
    CHECK(gpu->destroy_event(*event).ok());
    CHECK(gpu->destroy_stream(*stream).ok());
}

TEST_CASE("cuda gpu: is_pinned tells page-locked memory from pageable and device memory", "[cuda][pageable]") {
    auto gpu = test::make_backend<CudaBackend>();
    auto pinned = gpu->pinned_malloc(4096);
    auto device = gpu->device_malloc(4096);
    REQUIRE(pinned.ok());
    REQUIRE(device.ok());
    std::vector<std::byte> pageable(4096);
    CHECK(gpu->is_pinned(*pinned));
    CHECK(gpu->is_pinned(static_cast<std::byte*>(*pinned) + 4095));
    CHECK_FALSE(gpu->is_pinned(pageable.data()));
    CHECK_FALSE(gpu->is_pinned(*device));
    CHECK(gpu->device_free(*device).ok());
    CHECK(gpu->pinned_free(*pinned).ok());
}

TEST_CASE("cuda gpu: virtual memory works from a thread that never called CUDA", "[cuda][vmm]") {
    auto gpu = test::make_backend<CudaBackend>();
    const std::size_t granule = gpu->vmm_granularity();
    REQUIRE(granule > 0);
    std::vector<std::pair<const char*, Status>> steps;
    bool round_trip = false;
    std::thread fresh([&] {  // no Catch2 assertion on this thread: steps are checked after join
        auto base = gpu->vmm_reserve(2 * granule);
        auto first = gpu->vmm_create(granule);
        auto second = gpu->vmm_create(granule);
        steps = {{"reserve", base.status()}, {"create", first.status()}, {"create", second.status()}};
        if (!base || !first || !second) return;
        auto* bytes = static_cast<std::byte*>(*base);
        steps.emplace_back("map", gpu->vmm_map(bytes, granule, *first));
        steps.emplace_back("map", gpu->vmm_map(bytes + granule, granule, *second));
        const auto in = test::pattern(4096, 8);
        void* straddling = bytes + granule - 2048;
        steps.emplace_back("copy", gpu->copy_to_device(straddling, in.data(), in.size()));
        round_trip = test::read_device(*gpu, straddling, in.size()) == in;
        steps.emplace_back("unmap", gpu->vmm_unmap(bytes + granule, granule));
        steps.emplace_back("unmap", gpu->vmm_unmap(bytes, granule));
        steps.emplace_back("free", gpu->vmm_free(*second));
        steps.emplace_back("free", gpu->vmm_free(*first));
        steps.emplace_back("release", gpu->vmm_release(*base));
    });
    fresh.join();
    REQUIRE(steps.size() == 11);
    for (const auto& [step, status] : steps) {
        INFO(step);
        CHECK(status.message() == "");
    }
    CHECK(round_trip);
}

// Runs what the command line selects, less the cases CUDA does not promise (see the suites
// above); without a usable GPU, nothing (exit code 77: skipped).
int main(int argc, char** argv) {
    auto gpu = devstage::CudaBackend::create(0);
    if (!gpu) {
        std::printf("skipped: %s\n", gpu.status().message().c_str());
        return 77;
    }
    Catch::Session session;
    if (const int bad = session.applyCommandLine(argc, argv); bad != 0) return bad;
    session.configData().testsOrTags.emplace_back("~[stale-handle]");
    session.configData().testsOrTags.emplace_back("~[errors]");
    return session.run();
}
