// SPDX-License-Identifier: Apache-2.0
// CudaBackend on any machine. Loading: a missing library or entry point is library_not_found
// naming it; a runtime that loads but finds no GPU (as on CI) is a clean not_supported; a
// missing or incapable driver only turns virtual memory off. Then the backend over
// tests/cuda_shim/ — a stand-in runtime and driver — runs the contract, staging, pinned,
// virtual-memory, async contract and async staging suites, and its stream, event and driver
// calls are checked for what they send: flags, devices, the primary context, messages. Where
// cuda.h is installed, the ABI declarations of cuda.hpp are checked against it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_kernel_on_host.hpp"
#include "devstage/backends/cuda.hpp"
#include "devstage/pageable.hpp"
#include "devstage/stager.hpp"
#include "support.hpp"

#ifdef DEVSTAGE_TEST_CUDA_H
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <driver_types.h>
#endif

namespace {
const char* shim_path() {
    const char* path = std::getenv("DEVSTAGE_CUDA_SHIM_LIBRARY");
    return path != nullptr ? path : "libcudart_shim.so";
}

// The stand-in's test-control functions, from the same library the backend loads.
struct CudaShim {
    void (*set_capacity)(int, std::size_t);
    void (*fail)(const char*, int, int);
    void (*event_not_ready)(int);
    void (*set_vmm_supported)(int);
    int (*device_of)(const void*);
    int (*stream_info)(void*, unsigned*);
    int (*event_info)(void*, unsigned*);
    unsigned (*last_wait_flags)();
    std::size_t (*live)(int);
    int (*set_device)(int);  // the runtime's cudaSetDevice: changes the thread's current device
    void (*fail_batch_at)(std::size_t, int);
    void (*set_can_map)(int);
    unsigned (*host_flags)(const void*);
    void (*set_host_numa)(int, int);
    void (*set_pci_bus_id)(int, const char*);

    enum Live { streams, events, reservations, mappings, physicals };

    static const CudaShim& get() {
        static const CudaShim shim = [] {
            void* handle = ::dlopen(shim_path(), RTLD_NOW);
            CudaShim s{};
            if (handle == nullptr) return s;
            s.set_capacity = reinterpret_cast<decltype(s.set_capacity)>(::dlsym(handle, "cuda_shim_set_capacity"));
            s.fail = reinterpret_cast<decltype(s.fail)>(::dlsym(handle, "cuda_shim_fail"));
            s.event_not_ready =
                reinterpret_cast<decltype(s.event_not_ready)>(::dlsym(handle, "cuda_shim_event_not_ready"));
            s.set_vmm_supported =
                reinterpret_cast<decltype(s.set_vmm_supported)>(::dlsym(handle, "cuda_shim_set_vmm_supported"));
            s.device_of = reinterpret_cast<decltype(s.device_of)>(::dlsym(handle, "cuda_shim_device_of"));
            s.stream_info = reinterpret_cast<decltype(s.stream_info)>(::dlsym(handle, "cuda_shim_stream_info"));
            s.event_info = reinterpret_cast<decltype(s.event_info)>(::dlsym(handle, "cuda_shim_event_info"));
            s.last_wait_flags =
                reinterpret_cast<decltype(s.last_wait_flags)>(::dlsym(handle, "cuda_shim_last_wait_flags"));
            s.live = reinterpret_cast<decltype(s.live)>(::dlsym(handle, "cuda_shim_live"));
            s.set_device = reinterpret_cast<decltype(s.set_device)>(::dlsym(handle, "cudaSetDevice"));
            s.fail_batch_at = reinterpret_cast<decltype(s.fail_batch_at)>(::dlsym(handle, "cuda_shim_fail_batch_at"));
            s.set_can_map = reinterpret_cast<decltype(s.set_can_map)>(::dlsym(handle, "cuda_shim_set_can_map"));
            s.host_flags = reinterpret_cast<decltype(s.host_flags)>(::dlsym(handle, "cuda_shim_host_flags"));
            s.set_host_numa = reinterpret_cast<decltype(s.set_host_numa)>(::dlsym(handle, "cuda_shim_set_host_numa"));
            s.set_pci_bus_id =
                reinterpret_cast<decltype(s.set_pci_bus_id)>(::dlsym(handle, "cuda_shim_set_pci_bus_id"));
            return s;
        }();
        REQUIRE(shim.set_capacity != nullptr);
        return shim;
    }
};

devstage::CudaBackend make_on_shim(int device) {
    devstage::Result<devstage::CudaBackend> backend = devstage::CudaBackend::create(device, shim_path(), shim_path());
    REQUIRE(backend.ok());
    return std::move(*backend);
}

}  // namespace

template <>
struct devstage::test::BackendFactory<devstage::CudaBackend> {
    static std::unique_ptr<CudaBackend> make(std::size_t capacity = std::size_t{1} << 32) {
        CudaShim::get().set_capacity(0, capacity);
        return std::make_unique<CudaBackend>(make_on_shim(0));
    }
};

template <>
struct devstage::test::BackendFactory<devstage::test::CudaKernelOnHost> {
    static std::unique_ptr<devstage::test::CudaKernelOnHost> make() {
        CudaShim::get().set_capacity(0, std::size_t{1} << 32);
        return std::make_unique<devstage::test::CudaKernelOnHost>(make_on_shim(0));
    }
};

using ContractBackends = std::tuple<devstage::CudaBackend>;
using StagingBackends = std::tuple<devstage::CudaBackend>;
using PinnedBackends = std::tuple<devstage::CudaBackend>;
using VmmBackends = std::tuple<devstage::CudaBackend>;
#include "backend_contract.hpp"
#include "pinned_suite.hpp"
#include "staging_suite.hpp"
#include "vmm_suite.hpp"

// The stream-ordered suites. The stand-in's streams run their work inside the enqueuing call
// and its host functions run there too, on the test's thread: the cases that hold a stream
// with a host function see it run inline and check the order of the calls, not the
// asynchrony (test_cuda does, on a GPU). Left out: the "[stale-handle]" case — CUDA leaves
// the use of a destroyed stream or event undefined, so what the stand-in answers proves
// nothing about CUDA; main() below excludes it from every run.
using AsyncBackends = std::tuple<devstage::CudaBackend>;
using AsyncStagingBackends = std::tuple<devstage::test::CudaKernelOnHost>;
#include "async_contract.hpp"
#include "async_staging_suite.hpp"

using namespace devstage;

TEST_CASE("cuda: a missing library is library_not_found naming it", "[cuda]") {
    auto missing = CudaBackend::create(0, "/nonexistent/libcudart.so.13");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.status().code() == Errc::library_not_found);
    CHECK_THAT(missing.status().message(), Catch::Contains("/nonexistent/libcudart.so.13"));
}

TEST_CASE("cuda: a runtime missing an entry point is library_not_found naming it", "[cuda]") {
    const char* without_query = std::getenv("DEVSTAGE_CUDA_SHIM_NO_QUERY_LIBRARY");
    REQUIRE(without_query != nullptr);
    auto incomplete = CudaBackend::create(0, without_query, shim_path());
    REQUIRE_FALSE(incomplete.ok());
    CHECK(incomplete.status().code() == Errc::library_not_found);
    CHECK_THAT(incomplete.status().message(),
               Catch::Contains("symbol cudaEventQuery not found") && Catch::Contains(without_query));
}

TEST_CASE("cuda: the installed runtime either gives a device or says why not", "[cuda]") {
    auto gpu = CudaBackend::create(0);
    if (gpu.ok()) {
        CHECK(gpu->name() == "cuda");
        auto p = gpu->device_malloc(1024);
        REQUIRE(p.ok());
        CHECK(reinterpret_cast<std::uintptr_t>(*p) % CudaBackend::device_alignment == 0);
        CHECK(gpu->device_free(*p).ok());
    } else {
        const Errc code = gpu.status().code();
        // The documented outcomes: no runtime, a runtime without a usable GPU, or no device 0.
        CHECK((code == Errc::library_not_found || code == Errc::not_supported || code == Errc::invalid_argument));
        CHECK_THAT(gpu.status().message(), Catch::Contains("cuda"));
    }
}

TEST_CASE("cuda: without a capable driver, creation succeeds and virtual memory is not_supported, saying why",
          "[cuda][vmm]") {
    const CudaShim& shim = CudaShim::get();
    const char* runtime_only = std::getenv("DEVSTAGE_CUDA_SHIM_NO_DRIVER_LIBRARY");
    REQUIRE(runtime_only != nullptr);
    struct Case {
        const char* what;
        std::string driver;
        int supported;
        const char* why;
    };
    const Case cases[] = {
        {"no driver library", "/nonexistent/libcuda.so.1", 1, "/nonexistent/libcuda.so.1"},
        {"a driver without the entry points", runtime_only, 1, "cuDeviceGet"},
        {"a device without virtual memory", shim_path(), 0, "no virtual memory management"},
    };
    for (const Case& c : cases) {
        SECTION(c.what) {
            shim.set_vmm_supported(c.supported);
            auto gpu = CudaBackend::create(0, shim_path(), c.driver);
            shim.set_vmm_supported(1);
            REQUIRE(gpu.ok());
            CHECK(gpu->vmm_granularity() == 0);
            const Status reserve = gpu->vmm_reserve(std::size_t{2} << 20).status();
            CHECK(reserve.code() == Errc::not_supported);
            CHECK_THAT(reserve.message(),
                       Catch::Contains("virtual memory is not available for device 0") && Catch::Contains(c.why));
            CHECK(gpu->vmm_create(std::size_t{2} << 20).status().code() == Errc::not_supported);
            CHECK(gpu->vmm_map(nullptr, std::size_t{2} << 20, 1).code() == Errc::not_supported);
            CHECK(gpu->vmm_unmap(nullptr, std::size_t{2} << 20).code() == Errc::not_supported);
            CHECK(gpu->vmm_free(1).code() == Errc::not_supported);
            CHECK(gpu->vmm_release(nullptr).code() == Errc::not_supported);
            Stager<CudaBackend, RetainedVmm<>> stager(*gpu);
            std::vector<std::byte> host(4096);
            const TensorArg args[] = {{host.data(), host.size(), Direction::In}};
            CHECK(stager.bind(args).status().code() == Errc::not_supported);
            auto device = gpu->device_malloc(256);  // the rest of the backend works
            REQUIRE(device.ok());
            CHECK(gpu->device_free(*device).ok());
        }
    }
    auto capable = CudaBackend::create(0, shim_path(), shim_path());
    REQUIRE(capable.ok());
    CHECK(capable->vmm_granularity() == std::size_t{2} << 20);
}

TEST_CASE("cuda: streams and events are made on the backend's device with the documented flags", "[cuda][async]") {
    const CudaShim& shim = CudaShim::get();
    CudaBackend one = make_on_shim(1);
    REQUIRE(shim.set_device(0) == 0);  // another device is current on this thread
    auto stream = one.create_stream();
    REQUIRE(stream.ok());
    REQUIRE(shim.set_device(0) == 0);
    auto event = one.create_event();
    REQUIRE(event.ok());
    unsigned flags = 0;
    CHECK(shim.stream_info(stream->handle, &flags) == 1);
    CHECK(flags == cudart::stream_non_blocking);
    CHECK(shim.event_info(event->handle, &flags) == 1);
    CHECK(flags == cudart::event_disable_timing);

    REQUIRE(shim.set_device(0) == 0);
    auto device = one.device_malloc(4096);
    REQUIRE(device.ok());
    CHECK(shim.device_of(*device) == 1);
    const auto in = test::pattern(4096, 3);
    std::vector<std::byte> out(4096);
    REQUIRE(one.copy_to_device_async(*device, in.data(), in.size(), *stream).ok());
    REQUIRE(one.copy_from_device_async(out.data(), *device, out.size(), *stream).ok());
    REQUIRE(shim.set_device(0) == 0);
    REQUIRE(one.record_event(*event, *stream).ok());  // the shim refuses a record across devices
    REQUIRE(one.stream_wait_event(*stream, *event).ok());
    CHECK(shim.last_wait_flags() == 0);
    REQUIRE(one.synchronize_event(*event).ok());
    CHECK(out == in);

    int calls = 0;
    REQUIRE(one.launch_host_func(
                   *stream, [](void* data) { ++*static_cast<int*>(data); }, &calls)
                .ok());
    CHECK(calls == 1);

    const std::size_t streams = shim.live(CudaShim::streams), events = shim.live(CudaShim::events);
    CHECK(one.destroy_event(*event).ok());
    CHECK(one.destroy_stream(*stream).ok());
    CHECK(shim.live(CudaShim::streams) == streams - 1);
    CHECK(shim.live(CudaShim::events) == events - 1);
    CHECK(one.device_free(*device).ok());
}

TEST_CASE("cuda: a CUDA call from a host function is refused by the stand-in and reported", "[cuda][async]") {
    // cudaLaunchHostFunc: the function must not call CUDA. The stand-in refuses such a call
    // (cudaErrorNotPermitted, as CUDA may), so a test whose host function calls CUDA fails here
    // as it would on a GPU; the async staging suite runs over CudaKernelOnHost for that reason.
    CudaBackend gpu = make_on_shim(0);
    auto stream = gpu.create_stream();
    REQUIRE(stream.ok());
    struct Inside {
        CudaBackend* gpu;
        Status status;
    } inside{&gpu, {}};
    REQUIRE(gpu.launch_host_func(
                   *stream,
                   [](void* data) {
                       auto* in = static_cast<Inside*>(data);
                       in->status = in->gpu->device_malloc(64).status();
                   },
                   &inside)
                .ok());
    CHECK(inside.status.code() == Errc::backend_failure);
    CHECK_THAT(inside.status.message(), Catch::Contains("cudaError 800 (operation not permitted)"));
    auto device = gpu.device_malloc(64);  // outside a host function, calls work again
    REQUIRE(device.ok());
    CHECK(gpu.device_free(*device).ok());
    CHECK(gpu.destroy_stream(*stream).ok());
}

TEST_CASE("cuda: event_ready reads cudaErrorNotReady as false, never as an error", "[cuda][async]") {
    const CudaShim& shim = CudaShim::get();
    CudaBackend gpu = make_on_shim(0);
    auto stream = gpu.create_stream();
    auto event = gpu.create_event();
    REQUIRE(stream.ok());
    REQUIRE(event.ok());
    CHECK(*gpu.event_ready(*event));  // never recorded: cudaEventQuery says cudaSuccess
    REQUIRE(gpu.record_event(*event, *stream).ok());
    shim.event_not_ready(2);
    for (int poll = 0; poll < 2; ++poll) {
        Result<bool> ready = gpu.event_ready(*event);
        REQUIRE(ready.ok());
        CHECK_FALSE(*ready);
    }
    Result<bool> ready = gpu.event_ready(*event);
    REQUIRE(ready.ok());
    CHECK(*ready);
    // Any other code is an error: a sticky one of earlier work surfaces here.
    shim.fail("cudaEventQuery", 1, 700);
    Result<bool> failed = gpu.event_ready(*event);
    REQUIRE_FALSE(failed.ok());
    CHECK(failed.status().code() == Errc::backend_failure);
    CHECK_THAT(failed.status().message(), Catch::Contains("cuda cudaEventQuery failed on device 0: cudaError 700") &&
                                              Catch::Contains("illegal memory access"));
    CHECK(gpu.destroy_event(*event).ok());
    CHECK(gpu.destroy_stream(*stream).ok());
}

TEST_CASE("cuda: zero-byte asynchronous copies make no runtime call", "[cuda][async]") {
    const CudaShim& shim = CudaShim::get();
    CudaBackend gpu = make_on_shim(0);
    auto stream = gpu.create_stream();
    REQUIRE(stream.ok());
    auto device = gpu.device_malloc(64);
    REQUIRE(device.ok());
    std::byte host[64]{};
    shim.fail("cudaMemcpyAsync", 1, 1);  // the next call that reaches the runtime fails
    CHECK(gpu.copy_to_device_async(*device, host, 0, *stream).ok());
    CHECK(gpu.copy_from_device_async(host, *device, 0, *stream).ok());
    CHECK_FALSE(gpu.copy_to_device_async(*device, host, 64, *stream).ok());
    CHECK(gpu.device_free(*device).ok());
    CHECK(gpu.destroy_stream(*stream).ok());
}

TEST_CASE("cuda: pinned memory is portable, pinned for every device; the device says where it sits", "[cuda][pinned]") {
    const CudaShim& shim = CudaShim::get();
    REQUIRE(shim.host_flags != nullptr);
    CudaBackend gpu = make_on_shim(1);
    Result<void*> pinned = gpu.pinned_malloc(4096);
    REQUIRE(pinned.ok());
    CHECK(shim.host_flags(*pinned) == cudart::host_alloc_portable);
    std::vector<std::byte> host(3 * 4096);
    void* const page = detail::align_pointer(host.data(), 4096);
    REQUIRE(gpu.host_register(page, 4096).ok());
    CHECK(shim.host_flags(page) == cudart::host_register_portable);
    REQUIRE(gpu.host_unregister(page).ok());
    CHECK(shim.host_flags(page) == ~0U);

    // A pool over device 1's backend serves device 0's copies: the memory is portable.
    PinnedHostPool<CudaBackend> pool(gpu);
    CudaBackend gpu0 = make_on_shim(0);
    Result<PinnedBuffer> buffer = pool.allocate(256);
    REQUIRE(buffer.ok());
    CHECK(shim.host_flags(buffer->data()) == cudart::host_alloc_portable);
    Result<void*> device = gpu0.device_malloc(256);
    REQUIRE(device.ok());
    std::memset(buffer->data(), 7, 256);
    CHECK(gpu0.copy_to_device(*device, buffer->data(), 256).ok());
    CHECK(gpu0.device_free(*device).ok());

    const auto node_of = [](const CudaBackend& b) {
        const Result<int> node = b.host_numa_node();
        REQUIRE(node.ok());
        return *node;
    };
    const auto bus_of = [](const CudaBackend& b) {
        const Result<std::string> id = b.pci_bus_id();
        REQUIRE(id.ok());
        return *id;
    };
    CHECK(node_of(gpu) == -1);  // the stand-in's default: no NUMA
    shim.set_host_numa(1, 3);
    CHECK(node_of(gpu) == 3);
    CHECK(node_of(gpu0) == -1);
    shim.set_host_numa(1, -1);
    CHECK(bus_of(gpu) == "0000:65:00.0");
    shim.set_pci_bus_id(0, "0001:a3:00.0");
    CHECK(bus_of(gpu0) == "0001:a3:00.0");
    shim.set_pci_bus_id(0, "0000:17:00.0");
    shim.fail("cudaDeviceGetPCIBusId", 1, 101);
    const Result<std::string> failed = gpu0.pci_bus_id();
    CHECK(failed.status().code() != Errc::ok);
    CHECK_THAT(std::string(failed.status().message()), Catch::Contains("cudaDeviceGetPCIBusId"));
    CHECK(gpu.pinned_free(*pinned).ok());
}

TEST_CASE("cuda: is_pinned asks cudaPointerGetAttributes, and the pageable ring follows its answer",
          "[cuda][pageable]") {
    const CudaShim& shim = CudaShim::get();
    CudaBackend gpu = make_on_shim(0);
    constexpr std::size_t bytes = 8192;
    auto pinned = gpu.pinned_malloc(bytes);
    auto device = gpu.device_malloc(bytes);
    REQUIRE(pinned.ok());
    REQUIRE(device.ok());
    std::vector<std::byte> pageable(bytes);
    auto* const pinned_bytes = static_cast<std::byte*>(*pinned);
    CHECK(gpu.is_pinned(pinned_bytes));
    CHECK(gpu.is_pinned(pinned_bytes + bytes - 1));  // inside the allocation too
    CHECK_FALSE(gpu.is_pinned(pageable.data()));
    CHECK_FALSE(gpu.is_pinned(*device));
    shim.fail("cudaPointerGetAttributes", 1, 1);  // a query that fails answers pageable
    CHECK_FALSE(gpu.is_pinned(pinned_bytes));
    CHECK(gpu.is_pinned(pinned_bytes));

    // On another thread, whose current device is another one, it asks about this device.
    std::thread([&] {
        REQUIRE(shim.set_device(1) == 0);
        CHECK(gpu.is_pinned(pinned_bytes));
    }).join();

    Stager<CudaBackend> stager(gpu);
    REQUIRE(
        stager.set_pageable_ring(PageableRing{.threshold = 1024, .chunk_bytes = 4096, .chunks = 2, .threads = 0}).ok());
    std::memset(pinned_bytes, 0x5A, bytes);
    std::memset(pageable.data(), 0xA5, bytes);
    const TensorArg args[] = {
        {pinned_bytes, bytes, Direction::In},       // cudaHostAlloc memory: copied directly
        {pageable.data(), bytes, Direction::InOut}  // pageable: through the ring
    };
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    CHECK(stager.stats().ring_uploads == 1);
    CHECK(stager.stats().ring_chunks == 2);
    std::vector<std::byte> seen(bytes);
    REQUIRE(gpu.copy_from_device(seen.data(), run->device_args()[1].data, bytes).ok());
    CHECK(seen == pageable);
    REQUIRE(gpu.copy_from_device(seen.data(), run->device_args()[0].data, bytes).ok());
    CHECK(std::all_of(seen.begin(), seen.end(), [](std::byte b) { return b == std::byte{0x5A}; }));
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(stager.stats().ring_copy_backs == 1);
    REQUIRE(stager.release().ok());
    CHECK(gpu.device_free(*device).ok());
    CHECK(gpu.pinned_free(*pinned).ok());
}

TEST_CASE(
    "cuda: map_host gives cudaHostGetDevicePointer's address; a device that cannot map is not_supported, "
    "and a MapSmall stager then copies",
    "[cuda][mapped]") {
    const CudaShim& shim = CudaShim::get();
    REQUIRE(shim.set_can_map != nullptr);
    using Mapped = RetainedBump<ExactGrowth, 1024, MapSmall<>>;
    const TensorShape shapes[] = {{4096, Direction::In}, {128, Direction::In}, {4000, Direction::Out}};
    const auto step = [&shapes](Stager<CudaBackend, Mapped>& stager) {
        auto frame = stager.frame(shapes);
        REQUIRE(frame.ok());
        std::fill(frame->host(0).begin(), frame->host(0).end(), std::byte{3});
        auto run = stager.bind(*frame);
        REQUIRE(run.ok());
        // The kernel: the stand-in's device memory, mapped or not, is host memory.
        auto* out = static_cast<std::byte*>(run->device_args()[2].data);
        CHECK(out[3999] == std::byte{0});  // zeroed
        std::memcpy(out, run->device_args()[0].data, 4000);
        REQUIRE(stager.finish(std::move(*run)).ok());
        CHECK(frame->host(2)[3999] == std::byte{3});
    };
    {
        CudaBackend gpu = make_on_shim(1);
        CHECK(gpu.maps_host_memory());
        auto pinned = gpu.pinned_malloc(4096);
        REQUIRE(pinned.ok());
        auto device = gpu.map_host(*pinned, 4096);
        REQUIRE(device.ok());
        CHECK(*device == *pinned);  // unified addressing
        CHECK(gpu.unmap_host(*pinned).ok());
        std::vector<std::byte> pageable(64);
        const auto refused = gpu.map_host(pageable.data(), 64);  // not page-locked
        CHECK(refused.status().code() == Errc::backend_failure);
        CHECK_THAT(refused.status().message(), Catch::Contains("cudaHostGetDevicePointer") &&
                                                   Catch::Contains("64 bytes") && Catch::Contains("device 1"));
        CHECK(gpu.pinned_free(*pinned).ok());
        Stager<CudaBackend, Mapped> stager(gpu);
        step(stager);
        CHECK(stager.stats().mapped_runs == 1);
        CHECK(stager.stats().uploads + stager.stats().copy_backs == 0);
        CHECK(stager.stats().device_mallocs == 0);
    }
    shim.set_can_map(0);
    {
        CudaBackend gpu = make_on_shim(0);
        CHECK_FALSE(gpu.maps_host_memory());
        auto pinned = gpu.pinned_malloc(64);
        REQUIRE(pinned.ok());
        const auto refused = gpu.map_host(*pinned, 64);
        CHECK(refused.status().code() == Errc::not_supported);
        CHECK_THAT(refused.status().message(), Catch::Contains("does not map host memory"));
        CHECK(gpu.pinned_free(*pinned).ok());
        Stager<CudaBackend, Mapped> stager(gpu);
        step(stager);
        CHECK(stager.stats().map_failures == 1);
        CHECK(stager.stats().mapped_runs == 0);
        CHECK(stager.stats().uploads == 1);  // the inputs and the zeroed Out
        CHECK(stager.stats().copy_backs == 1);
    }
    shim.set_can_map(1);
}

TEST_CASE("cuda: failed stream and event calls name the call, the bytes, the device, the code and its text",
          "[cuda][async]") {
    const CudaShim& shim = CudaShim::get();
    CudaBackend gpu = make_on_shim(1);
    auto stream = gpu.create_stream();
    auto event = gpu.create_event();
    auto device = gpu.device_malloc(128);
    REQUIRE(stream.ok());
    REQUIRE(event.ok());
    REQUIRE(device.ok());
    std::vector<std::byte> host(128);
    const CudaBackend::Stream s = *stream;
    const CudaBackend::Event e = *event;
    void* d = *device;
    struct Call {
        const char* function;
        const char* named;
        std::size_t bytes;
        std::function<Status()> run;
    };
    const Call calls[] = {
        {"cudaStreamCreateWithFlags", "cudaStreamCreateWithFlags", 0, [&] { return gpu.create_stream().status(); }},
        {"cudaEventCreateWithFlags", "cudaEventCreateWithFlags", 0, [&] { return gpu.create_event().status(); }},
        {"cudaMemcpyAsync", "cudaMemcpyAsync(host to device)", 128,
         [&] { return gpu.copy_to_device_async(d, host.data(), 128, s); }},
        {"cudaMemcpyAsync", "cudaMemcpyAsync(device to host)", 128,
         [&] { return gpu.copy_from_device_async(host.data(), d, 128, s); }},
        {"cudaEventRecord", "cudaEventRecord", 0, [&] { return gpu.record_event(e, s); }},
        {"cudaEventQuery", "cudaEventQuery", 0, [&] { return gpu.event_ready(e).status(); }},
        {"cudaEventSynchronize", "cudaEventSynchronize", 0, [&] { return gpu.synchronize_event(e); }},
        {"cudaStreamWaitEvent", "cudaStreamWaitEvent", 0, [&] { return gpu.stream_wait_event(s, e); }},
        {"cudaLaunchHostFunc", "cudaLaunchHostFunc", 0,
         [&] {
             return gpu.launch_host_func(
                 s, [](void*) {}, nullptr);
         }},
        {"cudaSetDevice", "cudaSetDevice", 0, [&] { return gpu.record_event(e, s); }},
    };
    for (const Call& call : calls) {
        INFO(call.named);
        if (std::string_view(call.function) == "cudaSetDevice") REQUIRE(shim.set_device(0) == 0);
        shim.fail(call.function, 1, 700);
        const Status failed = call.run();
        REQUIRE_FALSE(failed.ok());
        CHECK(failed.code() == Errc::backend_failure);
        const std::string bytes = call.bytes > 0 ? std::to_string(call.bytes) + " bytes" : "on device";
        CHECK_THAT(failed.message(), Catch::StartsWith(std::string("cuda ") + call.named + " failed") &&
                                         Catch::Contains(bytes) && Catch::Contains("device 1") &&
                                         Catch::Contains("cudaError 700 (an illegal memory access was encountered)"));
    }
    shim.fail("cudaStreamCreateWithFlags", 1, 2);
    CHECK(gpu.create_stream().status().code() == Errc::out_of_memory);
    CHECK(gpu.device_free(d).ok());
    CHECK(gpu.destroy_event(e).ok());
    CHECK(gpu.destroy_stream(s).ok());
}

TEST_CASE("cuda: virtual memory runs through the driver in the runtime's primary context, on any thread",
          "[cuda][vmm]") {
    const CudaShim& shim = CudaShim::get();
    CudaBackend gpu = make_on_shim(0);
    const std::size_t granule = gpu.vmm_granularity();
    REQUIRE(granule == std::size_t{2} << 20);
    // A thread that never called the runtime has no current context: the backend makes the
    // primary context current before each driver call (the shim refuses a call without one).
    std::vector<std::pair<const char*, Status>> steps;
    bool round_trip = false;
    std::thread fresh([&] {  // no Catch2 assertion on this thread: steps are checked after join
        auto base = gpu.vmm_reserve(4 * granule);
        auto first = gpu.vmm_create(granule);
        auto second = gpu.vmm_create(granule);
        steps = {{"reserve", base.status()}, {"create", first.status()}, {"create", second.status()}};
        if (!base || !first || !second) return;
        auto* bytes = static_cast<std::byte*>(*base);
        steps.emplace_back("map", gpu.vmm_map(bytes, granule, *first));
        steps.emplace_back("map", gpu.vmm_map(bytes + granule, granule, *second));
        // Mapped memory is usable only once access was granted (cuMemSetAccess), across chunks.
        const auto in = test::pattern(4096, 8);
        void* straddling = bytes + granule - 2048;
        steps.emplace_back("copy", gpu.copy_to_device(straddling, in.data(), in.size()));
        round_trip = test::read_device(gpu, straddling, in.size()) == in;
        steps.emplace_back("unmap", gpu.vmm_unmap(bytes + granule, granule));
        steps.emplace_back("unmap", gpu.vmm_unmap(bytes, granule));
        steps.emplace_back("free", gpu.vmm_free(*second));
        steps.emplace_back("free", gpu.vmm_free(*first));
        steps.emplace_back("release", gpu.vmm_release(*base));
    });
    fresh.join();
    REQUIRE(steps.size() == 11);
    for (const auto& [step, status] : steps) {
        INFO(step);
        CHECK(status.message() == "");
    }
    CHECK(round_trip);
    CHECK(shim.live(CudaShim::reservations) == 0);
    CHECK(shim.live(CudaShim::mappings) == 0);
    CHECK(shim.live(CudaShim::physicals) == 0);

    int unknown = 0;
    const Status foreign = gpu.vmm_release(&unknown);
    CHECK(foreign.code() == Errc::invalid_argument);
    CHECK_THAT(foreign.message(), Catch::Contains("not a reservation of this backend"));
}

TEST_CASE("cuda: failed driver calls name the call, the bytes, the device and the CUresult; a failed map is undone",
          "[cuda][vmm]") {
    const CudaShim& shim = CudaShim::get();
    CudaBackend gpu = make_on_shim(0);
    const std::size_t granule = gpu.vmm_granularity();
    shim.fail("cuMemCreate", 1, 2);
    auto oom = gpu.vmm_create(granule);
    REQUIRE_FALSE(oom.ok());
    CHECK(oom.status().code() == Errc::out_of_memory);
    CHECK_THAT(oom.status().message(), Catch::Contains("cuda cuMemCreate failed for 2097152 bytes on device 0") &&
                                           Catch::Contains("CUresult 2 (out of memory)"));

    auto base = gpu.vmm_reserve(granule);
    auto chunk = gpu.vmm_create(granule);
    REQUIRE(base.ok());
    REQUIRE(chunk.ok());
    shim.fail("cuMemSetAccess", 1, 1);
    const Status mapped = gpu.vmm_map(*base, granule, *chunk);
    CHECK(mapped.code() == Errc::backend_failure);
    CHECK_THAT(mapped.message(), Catch::Contains("cuMemSetAccess") && Catch::Contains("CUresult 1 (invalid argument)"));
    CHECK(shim.live(CudaShim::mappings) == 0);  // unmapped again
    CHECK(gpu.vmm_free(*chunk).ok());
    CHECK(gpu.vmm_release(*base).ok());
    CHECK(shim.live(CudaShim::reservations) == 0);
}

namespace {
// The decode-like run of the batch tests: 4 In, one InOut, one Out, in pinned memory.
struct BatchRun {
    explicit BatchRun(CudaBackend& gpu) : gpu(gpu) {
        const std::size_t sizes[] = {40000, 2048, 128, 64, 3000, 40000};
        const Direction directions[] = {Direction::In, Direction::In,    Direction::In,
                                        Direction::In, Direction::InOut, Direction::Out};
        for (std::size_t i = 0; i < 6; ++i) {
            Result<void*> pinned = gpu.pinned_malloc(sizes[i]);
            REQUIRE(pinned.ok());
            auto* bytes = static_cast<std::byte*>(*pinned);
            for (std::size_t b = 0; b < sizes[i]; ++b) bytes[b] = static_cast<std::byte>(b * 7 + i);
            args.push_back(TensorArg{bytes, sizes[i], directions[i]});
        }
    }
    BatchRun(const BatchRun&) = delete;
    BatchRun& operator=(const BatchRun&) = delete;
    ~BatchRun() {
        for (const TensorArg& arg : args) CHECK(gpu.pinned_free(arg.data).ok());
    }
    std::vector<std::vector<std::byte>> host() const {
        std::vector<std::vector<std::byte>> bytes;
        for (const TensorArg& arg : args) {
            const auto* at = static_cast<const std::byte*>(arg.data);
            bytes.emplace_back(at, at + arg.bytes);
        }
        return bytes;
    }
    CudaBackend& gpu;
    std::vector<TensorArg> args;
};

// One synchronous run with the stand-in kernel; the host bytes after it.
std::vector<std::vector<std::byte>> batch_run(CudaBackend& gpu, Stager<CudaBackend>& stager) {
    BatchRun run(gpu);
    Result<StagedRun> bound = stager.bind(run.args);
    REQUIRE(bound.ok());
    REQUIRE(test::fake_kernel(gpu, bound->device_args(), run.args).ok());
    REQUIRE(stager.finish(std::move(*bound)).ok());
    return run.host();
}
}  // namespace

TEST_CASE("cuda: cudaMemcpyBatchAsync carries a run's copies, in either form, with the per-copy results",
          "[cuda][async][batch]") {
    const char* no_batch = std::getenv("DEVSTAGE_CUDA_SHIM_NO_DRIVER_LIBRARY");
    const char* runtime_12_8 = std::getenv("DEVSTAGE_CUDA_SHIM_12_8_LIBRARY");
    REQUIRE(no_batch != nullptr);
    REQUIRE(runtime_12_8 != nullptr);
    auto plain = CudaBackend::create(0, no_batch, no_batch);
    REQUIRE(plain.ok());
    CHECK(plain->batch_runtime_version() == 0);
    const auto stream = test::make_stream(*plain);
    CHECK(plain->batch_copy_limit(stream) == 0);
    Stager<CudaBackend> per_copy(*plain);
    const auto expected = batch_run(*plain, per_copy);
    CHECK(per_copy.stats().uploads == 5);
    CHECK(per_copy.stats().batched_copies == 0);
    const Status refused = plain->copy_to_device_batch(nullptr, nullptr, nullptr, 0, stream);
    CHECK(refused.code() == Errc::not_supported);
    CHECK_THAT(refused.message(), Catch::Contains("no cudaMemcpyBatchAsync") && Catch::Contains(no_batch));
    CHECK(plain->destroy_stream(stream).ok());

    const auto form = GENERATE(13000, 12080);
    CAPTURE(form);
    const std::string library = form == 13000 ? std::string(shim_path()) : std::string(runtime_12_8);
    auto gpu = CudaBackend::create(0, library, library);
    REQUIRE(gpu.ok());
    CHECK(gpu->batch_runtime_version() == form);
    CHECK(gpu->batch_copy_limit(CudaBackend::Stream{}) == 0);  // the legacy default stream
    {
        Stager<CudaBackend> stager(*gpu);
        CHECK(test::same_bytes(batch_run(*gpu, stager), expected));
        CHECK(stager.stats().uploads == 1);
        CHECK(stager.stats().copy_backs == 1);
        CHECK(stager.stats().batched_copies == 5 + 2);
    }
    SECTION("the legacy default stream is refused by the batch call (the Stager copies one by one there)") {
        const Status legacy = gpu->copy_to_device_batch(nullptr, nullptr, nullptr, 1, CudaBackend::Stream{});
        CHECK(legacy.code() == Errc::invalid_argument);
        CHECK_THAT(legacy.message(), Catch::Contains("legacy default stream"));
    }
    SECTION("a batch refused part way fails the run; the stager goes on") {
        void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
        REQUIRE(handle != nullptr);
        auto fail_at = reinterpret_cast<void (*)(std::size_t, int)>(::dlsym(handle, "cuda_shim_fail_batch_at"));
        REQUIRE(fail_at != nullptr);
        Stager<CudaBackend> stager(*gpu);
        {
            BatchRun run(*gpu);
            fail_at(3, 1);  // cudaErrorInvalidValue at copy 3: copies 0-2 were made
            Result<StagedRun> bound = stager.bind(run.args);
            REQUIRE_FALSE(bound.ok());
            const std::string message = bound.status().message();
            CHECK_THAT(message, Catch::Contains("a batch of 5 copies") &&
                                    Catch::Contains("cudaMemcpyBatchAsync(host to device) failed") &&
                                    Catch::Contains("cudaError 1"));
            if (form == 12080) CHECK_THAT(message, Catch::Contains("at copy 3 of 5"));
            CHECK(stager.live_runs() == 0);
        }
        CHECK(test::same_bytes(batch_run(*gpu, stager), expected));
        REQUIRE(stager.release().ok());
        CHECK(stager.stats().device_mallocs == stager.stats().device_frees);
        ::dlclose(handle);
    }
}

#ifdef DEVSTAGE_TEST_CUDA_H
// The declarations cuda.hpp keeps for itself, against the installed CUDA headers.
static_assert(cudart::success == cudaSuccess);
static_assert(cudart::error_memory_allocation == cudaErrorMemoryAllocation);
static_assert(cudart::error_insufficient_driver == cudaErrorInsufficientDriver);
static_assert(cudart::error_no_device == cudaErrorNoDevice);
static_assert(cudart::error_not_ready == cudaErrorNotReady);
static_assert(cudart::memcpy_host_to_device == cudaMemcpyHostToDevice);
static_assert(cudart::memcpy_device_to_host == cudaMemcpyDeviceToHost);
static_assert(cudart::host_alloc_default == cudaHostAllocDefault);
static_assert(cudart::host_alloc_portable == cudaHostAllocPortable);
static_assert(cudart::host_register_portable == cudaHostRegisterPortable);
static_assert(cudart::device_attribute_host_numa_id == cudaDevAttrHostNumaId);
static_assert(cudart::stream_non_blocking == cudaStreamNonBlocking);
static_assert(cudart::event_disable_timing == cudaEventDisableTiming);
static_assert(sizeof(cudaError_t) == sizeof(cudart::cudaError_t) && sizeof(cudaMemcpyKind) == sizeof(int));
static_assert(sizeof(cudaStream_t) == sizeof(cudart::cudaStream_t) &&
              sizeof(cudaEvent_t) == sizeof(cudart::cudaEvent_t));
static_assert(std::is_same_v<cudaHostFn_t, cudart::cudaHostFn_t>);
static_assert(cudart::memory_type_unregistered == cudaMemoryTypeUnregistered);
static_assert(cudart::memory_type_host == cudaMemoryTypeHost);
static_assert(cudart::memory_type_device == cudaMemoryTypeDevice);
static_assert(cudart::memory_type_managed == cudaMemoryTypeManaged);
static_assert(sizeof(cudaPointerAttributes) <= sizeof(cudart::PointerAttributes));  // CUDA 12's is smaller
static_assert(offsetof(cudaPointerAttributes, type) == offsetof(cudart::PointerAttributes, type));
static_assert(offsetof(cudaPointerAttributes, device) == offsetof(cudart::PointerAttributes, device));
static_assert(offsetof(cudaPointerAttributes, devicePointer) == offsetof(cudart::PointerAttributes, device_pointer));
static_assert(offsetof(cudaPointerAttributes, hostPointer) == offsetof(cudart::PointerAttributes, host_pointer));
static_assert(
    std::is_same_v<decltype(&cudaPointerGetAttributes), cudaError_t (*)(cudaPointerAttributes*, const void*)>);

static_assert(cudrv::success == CUDA_SUCCESS);
static_assert(cudrv::error_out_of_memory == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(cudrv::error_not_supported == CUDA_ERROR_NOT_SUPPORTED);
static_assert(cudrv::device_attribute_virtual_memory_management_supported ==
              CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
static_assert(cudrv::mem_allocation_type_pinned == CU_MEM_ALLOCATION_TYPE_PINNED);
static_assert(cudrv::mem_handle_type_none == CU_MEM_HANDLE_TYPE_NONE);
static_assert(cudrv::mem_location_type_device == CU_MEM_LOCATION_TYPE_DEVICE);
static_assert(cudrv::mem_access_flags_prot_readwrite == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
static_assert(cudrv::mem_alloc_granularity_minimum == CU_MEM_ALLOC_GRANULARITY_MINIMUM);
static_assert(sizeof(CUresult) == sizeof(cudrv::CUresult) && sizeof(CUdevice) == sizeof(cudrv::CUdevice));
static_assert(std::is_same_v<CUdeviceptr, cudrv::CUdeviceptr>);
static_assert(std::is_same_v<CUmemGenericAllocationHandle, cudrv::CUmemGenericAllocationHandle>);
static_assert(sizeof(CUmemLocation) == sizeof(cudrv::MemLocation));
static_assert(offsetof(CUmemLocation, type) == offsetof(cudrv::MemLocation, type));
static_assert(offsetof(CUmemLocation, id) == offsetof(cudrv::MemLocation, id));
static_assert(sizeof(CUmemAllocationProp) == sizeof(cudrv::MemAllocationProp));
static_assert(offsetof(CUmemAllocationProp, type) == offsetof(cudrv::MemAllocationProp, type));
static_assert(offsetof(CUmemAllocationProp, requestedHandleTypes) ==
              offsetof(cudrv::MemAllocationProp, requested_handle_types));
static_assert(offsetof(CUmemAllocationProp, location) == offsetof(cudrv::MemAllocationProp, location));
static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) ==
              offsetof(cudrv::MemAllocationProp, win32_handle_meta_data));
static_assert(offsetof(CUmemAllocationProp, allocFlags) == offsetof(cudrv::MemAllocationProp, alloc_flags));
static_assert(sizeof(CUmemAccessDesc) == sizeof(cudrv::MemAccessDesc));
static_assert(offsetof(CUmemAccessDesc, location) == offsetof(cudrv::MemAccessDesc, location));
static_assert(offsetof(CUmemAccessDesc, flags) == offsetof(cudrv::MemAccessDesc, flags));

// cudaMemcpyBatchAsync (CUDA 13 form) and what it takes.
static_assert(sizeof(cudaMemcpyAttributes) == sizeof(cudart::MemcpyAttributes));
static_assert(offsetof(cudaMemcpyAttributes, srcAccessOrder) == offsetof(cudart::MemcpyAttributes, src_access_order));
static_assert(offsetof(cudaMemcpyAttributes, srcLocHint) == offsetof(cudart::MemcpyAttributes, src_loc_hint));
static_assert(offsetof(cudaMemcpyAttributes, dstLocHint) == offsetof(cudart::MemcpyAttributes, dst_loc_hint));
static_assert(offsetof(cudaMemcpyAttributes, flags) == offsetof(cudart::MemcpyAttributes, flags));
static_assert(sizeof(cudaMemLocation) == sizeof(cudart::MemLocation));
static_assert(offsetof(cudaMemLocation, id) == offsetof(cudart::MemLocation, id));
static_assert(cudart::memcpy_src_access_order_stream == cudaMemcpySrcAccessOrderStream);
static_assert(cudart::mem_location_type_device == cudaMemLocationTypeDevice);
static_assert(cudart::mem_location_type_host == cudaMemLocationTypeHost);
static_assert(CUDART_VERSION < 13000 || CUDART_VERSION >= cudart::batch_without_fail_index_version);
static_assert(std::is_same_v<decltype(&::cudaMemcpyBatchAsync),
                             cudaError_t (*)(void* const*, const void* const*, const size_t*, size_t,
                                             cudaMemcpyAttributes*, size_t*, size_t, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&::cudaRuntimeGetVersion), cudaError_t (*)(int*)>);

// Mapped pinned memory.
static_assert(cudart::device_attribute_can_map_host_memory == cudaDevAttrCanMapHostMemory);
static_assert(cudart::device_attribute_unified_addressing == cudaDevAttrUnifiedAddressing);
static_assert(std::is_same_v<decltype(&::cudaHostGetDevicePointer), cudaError_t (*)(void**, void*, unsigned int)>);
static_assert(std::is_same_v<decltype(&::cudaDeviceGetAttribute), cudaError_t (*)(int*, cudaDeviceAttr, int)>);

TEST_CASE("cuda: the ABI declarations match the installed cuda.h", "[cuda]") {
    SUCCEED("checked at compile time");
}
#endif

// Runs what the command line selects, less the "[stale-handle]" case (see the suites above).
int main(int argc, char** argv) {
    Catch::Session session;
    if (const int bad = session.applyCommandLine(argc, argv); bad != 0) return bad;
    session.configData().testsOrTags.emplace_back("~[stale-handle]");
    return session.run();
}

TEST_CASE("cuda: a stream of device 1 given to a stager of device 0 is refused, naming both devices",
          "[cuda][async][devices]") {
    CudaBackend zero = make_on_shim(0), one = make_on_shim(1);
    auto theirs = one.create_stream();
    auto own = zero.create_stream();
    REQUIRE(theirs.ok());
    REQUIRE(own.ok());
    const Status refused = zero.check_stream(*theirs);
    CHECK(refused.code() == Errc::invalid_argument);
    CHECK_THAT(refused.message(), Catch::Contains("cuda device 0") && Catch::Contains("belongs to cuda device 1"));
    CHECK(zero.check_stream(*own).ok());
    CHECK(zero.check_stream(CudaBackend::Stream{}).ok());  // the default stream: the current device's

    Stager<CudaBackend> stager(zero);
    std::vector<std::byte> in = test::pattern(2048, 4), out(1024);
    const std::vector<TensorArg> args = {{in.data(), in.size(), Direction::In},
                                         {out.data(), out.size(), Direction::Out}};
    auto empty = stager.bind(std::span<const TensorArg>{}, *theirs);  // enqueues nothing, still checked
    REQUIRE_FALSE(empty.ok());
    CHECK_THAT(empty.status().message(), Catch::Contains("stager bind") && Catch::Contains("cuda device 1"));
    auto wrong = stager.bind(args, *theirs);
    REQUIRE_FALSE(wrong.ok());
    CHECK(stager.stats().runs == 0);
    auto run = stager.bind(args, *own);
    REQUIRE(run.ok());
    auto misfinished = stager.finish(std::move(*run), *theirs);
    REQUIRE_FALSE(misfinished.ok());
    CHECK(run->live());  // left as it was
    auto done = stager.finish(std::move(*run), *own);
    REQUIRE(done.ok());
    CHECK(done->wait().ok());
    REQUIRE(stager.release().ok());
    CHECK(one.destroy_stream(*theirs).ok());
    CHECK(zero.destroy_stream(*own).ok());
}

TEST_CASE("cuda: without cudaStreamGetDevice (before CUDA 12.8) a stream is not checked", "[cuda][devices]") {
    const char* older = std::getenv("DEVSTAGE_CUDA_SHIM_NO_DRIVER_LIBRARY");  // no 12.8 calls
    REQUIRE(older != nullptr);
    auto zero = CudaBackend::create(0, older);
    auto one = CudaBackend::create(1, older);
    REQUIRE(zero.ok());
    REQUIRE(one.ok());
    auto theirs = one->create_stream();
    REQUIRE(theirs.ok());
    CHECK(zero->check_stream(*theirs).ok());
    CHECK(one->destroy_stream(*theirs).ok());
}
