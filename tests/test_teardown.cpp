// SPDX-License-Identifier: Apache-2.0
// Teardown order (devstage/teardown.hpp, the pool's part in pinned/detail/core.hpp): pinned
// memory is unregistered and freed before the backend's device or context goes. On the
// stand-ins a reset that finds pinned memory of its device still allocated or registered
// refuses and counts it (tests/ascend_shim, tests/cuda_shim): AscendBackend's destruction
// (aclrtResetDevice) and CudaBackend::reset_device (cudaDeviceReset) with a pool holding live
// buffers, raw allocations, cached, pending and exact-size blocks and a region — on the healthy
// path and after a device fault (every wait fails) — and a control that leaks pinned memory on
// purpose, so the check is seen to fail. Then the simulator and the mock, whose pools outlive
// them, and the teardown hooks themselves (TeardownList).
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "devstage/backends/ascend.hpp"
#include "devstage/backends/cuda.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/pinned.hpp"
#include "devstage/teardown.hpp"

using namespace devstage;

namespace {

std::vector<std::string> reports;
void keep_report(const Status& status) noexcept {
    reports.emplace_back(status.message());
}
bool reported(const std::string& part) {
    for (const std::string& report : reports) {
        if (report.find(part) != std::string::npos) return true;
    }
    return false;
}

void* open_library(const char* variable, const char* fallback) {
    const char* path = std::getenv(variable);
    void* handle = ::dlopen(path != nullptr ? path : fallback, RTLD_NOW);
    REQUIRE(handle != nullptr);
    return handle;
}
template <class F>
F* symbol(void* handle, const char* name) {
    auto* found = reinterpret_cast<F*>(::dlsym(handle, name));
    REQUIRE(found != nullptr);
    return found;
}

// The ACL stand-in's test controls, from the library AscendBackend loads.
struct AclShim {
    AclShim() {
        void* handle = open_library("DEVSTAGE_ACL_LIBRARY", "libascendcl.so");
        violations = symbol<std::size_t()>(handle, "shim_reset_violations");
        last_violation = symbol<const char*()>(handle, "shim_last_violation");
        live_host = symbol<std::size_t(int)>(handle, "shim_live_host_allocations");
        fail_async = symbol<void(const char*, int, int)>(handle, "shim_fail_async");
    }
    std::size_t (*violations)();
    const char* (*last_violation)();
    std::size_t (*live_host)(int);
    void (*fail_async)(const char*, int, int);
};

// The CUDA stand-in's test controls.
struct CudaShim {
    CudaShim() {
        void* handle = open_library("DEVSTAGE_CUDA_SHIM_LIBRARY", "libcudart_shim.so");
        violations = symbol<std::size_t()>(handle, "cuda_shim_reset_violations");
        last_violation = symbol<const char*()>(handle, "cuda_shim_last_violation");
        live_pinned = symbol<std::size_t(int, int)>(handle, "cuda_shim_live_pinned");
        set_sticky_error = symbol<void(int)>(handle, "cuda_shim_set_sticky_error");
        event_not_ready = symbol<void(int)>(handle, "cuda_shim_event_not_ready");
    }
    std::size_t (*violations)();
    const char* (*last_violation)();
    std::size_t (*live_pinned)(int, int);
    void (*set_sticky_error)(int);
    void (*event_not_ready)(int);
};

constexpr std::size_t exact_threshold = std::size_t{1} << 20;

// What a pool holds when its backend goes: a buffer, a raw allocation, a cached block, an
// exact-size block, a region with a slice, and a block pending on a stream's copy.
template <class B>
struct Holdings {
    Holdings(B& backend, typename B::Stream stream, void* device)
        : pool(backend, {}, PinnedPoolOptions{.exact = {.threshold = exact_threshold, .chunk_bytes = 1 << 20}}) {
        pool.set_error_sink(&keep_report);
        held = std::move(*pool.allocate(1000));
        raw = *pool.allocate_raw(2000);
        { auto cached = pool.allocate(3000); }
        exact = std::move(*pool.allocate(exact_threshold * 3 + 100));  // several chunks
        region.emplace(std::move(*pool.create_region(exact_threshold)));
        REQUIRE(region->wait().ok());
        slice = std::move(*region->allocate(4096, 4096));
        auto pending = pool.allocate(4096);
        REQUIRE(pending.ok());
        std::memset(pending->data(), 0x5A, 4096);
        REQUIRE(backend.copy_to_device_async(device, pending->data(), 4096, stream).ok());
        REQUIRE(pool.record(*pending, stream).ok());
        pending->reset();
        std::memset(held.data(), 0x11, held.size());
        std::memset(exact.data(), 0x22, exact.size());
    }
    PinnedHostPool<B> pool;
    PinnedBuffer held;
    void* raw = nullptr;
    PinnedBuffer exact;
    std::optional<PinnedRegionHandle> region;
    PinnedBuffer slice;
};

// After the teardown: the pool hands out nothing more, and what was held gives back without
// a backend call (the backend is gone or reset).
template <class B>
void after_teardown(Holdings<B>& h) {
    const Result<PinnedBuffer> refused = h.pool.allocate(64);
    CHECK(refused.status().code() == Errc::invalid_argument);
    CHECK_THAT(std::string(refused.status().message()), Catch::Contains("torn down"));
    CHECK(h.pool.create_region(4096).status().code() == Errc::invalid_argument);
    if constexpr (AsyncBackend<B>) {  // no work may use the pool's memory any more
        CHECK(h.pool.record(h.held, typename B::Stream{}).code() == Errc::invalid_argument);
    }
    CHECK(h.pool.regions().empty());  // every region was removed
    CHECK(h.pool.stats().locked_bytes == 0);
    CHECK(reported("was torn down while"));
    h.held.reset();
    h.exact.reset();
    h.slice.reset();
    h.region.reset();
    CHECK(h.pool.release(h.raw).code() == Errc::unknown_pointer);  // freed at the teardown
}

}  // namespace

TEST_CASE("teardown: AscendBackend gives every pinned byte back before it resets its device, healthy or faulted",
          "[teardown]") {
    const AclShim shim;
    for (const bool fault : {false, true}) {
        INFO((fault ? "after a device fault" : "healthy"));
        reports.clear();
        const std::size_t violations = shim.violations();
        const std::size_t host_before = shim.live_host(0);
        Result<AscendBackend> created = AscendBackend::create(0);
        REQUIRE(created.ok());
        std::optional<AscendBackend> npu(std::move(*created));
        auto stream = npu->create_stream();
        REQUIRE(stream.ok());
        void* device = *npu->device_malloc(4096);
        // A faulted device: the copy fails when it runs, and every later wait on the stream
        // (and of the device) reports it.
        if (fault) shim.fail_async("aclrtMemcpyAsync", 1, 507011);
        Holdings<AscendBackend> h(*npu, *stream, device);
        CHECK(shim.live_host(0) > host_before);
        // The pool outlives its backend: the backend's destruction tells it first.
        npu.reset();
        CHECK(shim.violations() == violations);
        INFO(shim.last_violation());
        CHECK(shim.live_host(0) == host_before);
        if (fault) CHECK(reported("torn down"));
        // aclrtMallocHost memory cannot stay valid: what buffers held is revoked, and said so.
        CHECK(h.pool.stats().revoked_allocations == 3);  // held, exact, the region's slice
        after_teardown(h);
    }
}

TEST_CASE("teardown: memory left pinned past aclrtResetDevice is what the stand-in reports", "[teardown]") {
    const AclShim shim;
    const std::size_t violations = shim.violations();
    {
        Result<AscendBackend> npu = AscendBackend::create(0);
        REQUIRE(npu.ok());
        REQUIRE(npu->pinned_malloc(64).ok());  // never freed: outlives the reset
    }
    CHECK(shim.violations() == violations + 1);
    CHECK_THAT(std::string(shim.last_violation()), Catch::Contains("1 aclrtMallocHost allocation"));
}

TEST_CASE("teardown: CudaBackend::reset_device gives every pinned byte back first, healthy or faulted", "[teardown]") {
    const CudaShim shim;
    for (const bool fault : {false, true}) {
        INFO((fault ? "after a sticky fault" : "healthy"));
        reports.clear();
        const std::size_t violations = shim.violations();
        Result<CudaBackend> gpu = CudaBackend::create(0);
        REQUIRE(gpu.ok());
        auto stream = gpu->create_stream();
        REQUIRE(stream.ok());
        void* device = *gpu->device_malloc(4096);
        std::optional<Holdings<CudaBackend>> h;
        h.emplace(*gpu, *stream, device);
        shim.event_not_ready(1000);             // the pending block stays pending until a wait
        CHECK(shim.live_pinned(0, 0) > 0);      // cudaHostAlloc blocks
        CHECK(shim.live_pinned(0, 1) > 0);      // the exact block's and the region's chunks
        if (fault) shim.set_sticky_error(700);  // cudaErrorIllegalAddress, sticky
        const Status reset = gpu->reset_device();
        CHECK(reset.ok());
        INFO(shim.last_violation());
        CHECK(shim.violations() == violations);
        CHECK(shim.live_pinned(0, 0) == 0);
        CHECK(shim.live_pinned(0, 1) == 0);
        if (fault) CHECK(reported("torn down: its work is dropped"));
        // The pool mapped the exact block itself: unpinned in place, it stays valid memory.
        CHECK(static_cast<unsigned char*>(h->exact.data())[exact_threshold * 3] == 0x22);
        std::memset(h->exact.data(), 0x33, h->exact.size());
        CHECK(h->pool.stats().revoked_allocations == 1);  // the held cudaHostAlloc block
        after_teardown(*h);
        h.reset();
        shim.event_not_ready(0);
    }
}

TEST_CASE("teardown: memory left pinned past cudaDeviceReset is what the stand-in reports", "[teardown]") {
    const CudaShim shim;
    const std::size_t violations = shim.violations();
    Result<CudaBackend> gpu = CudaBackend::create(0);
    REQUIRE(gpu.ok());
    Result<void*> pinned = gpu->pinned_malloc(64);
    REQUIRE(pinned.ok());
    const Status reset = gpu->reset_device();
    CHECK_FALSE(reset.ok());
    CHECK_THAT(std::string(reset.message()), Catch::Contains("cudaDeviceReset"));
    CHECK(shim.violations() == violations + 1);
    CHECK_THAT(std::string(shim.last_violation()), Catch::Contains("1 cudaHostAlloc allocation"));
    CHECK(gpu->pinned_free(*pinned).ok());
}

TEMPLATE_TEST_CASE("teardown: a pool that outlives its backend gave everything back when the backend went",
                   "[teardown]", SimBackend, MockBackend) {
    reports.clear();
    std::optional<TestType> backend(std::in_place);
    PinnedHostPool<TestType> pool(*backend, {}, PinnedPoolOptions{.exact = {.threshold = exact_threshold}});
    pool.set_error_sink(&keep_report);
    auto held = pool.allocate(1000);
    auto exact = pool.allocate(exact_threshold + 1);
    REQUIRE(held.ok());
    REQUIRE(exact.ok());
    { auto cached = pool.allocate(5000); }
    CHECK(pool.regions().size() == 3);
    std::vector<PinnedRegion> removed;
    RegionHooks hooks;
    hooks.removing = [&](const PinnedRegion& region) { removed.push_back(region); };
    REQUIRE(pool.set_region_hooks(std::move(hooks)).ok());
    backend.reset();
    CHECK(removed.size() == 3);  // every region, before its memory went
    CHECK(pool.regions().empty());
    CHECK(pool.stats().revoked_allocations == 1);
    std::memset(exact->data(), 0x44, exact->size());  // mapped by the pool: still valid
    held->reset();
    exact->reset();
    CHECK(pool.allocate(10).status().code() == Errc::invalid_argument);
}

TEST_CASE("teardown: hooks run once, the last added first; a removed one never; removal waits for a running one",
          "[teardown][threads]") {
    struct Hook {
        std::vector<int>* order;
        int n;
        static void run(void* user) noexcept {
            auto* hook = static_cast<Hook*>(user);
            hook->order->push_back(hook->n);
        }
    };
    std::vector<int> order;
    Hook one{&order, 1}, two{&order, 2}, three{&order, 3};
    {
        MockBackend mock;
        REQUIRE(mock.add_teardown_hook({&Hook::run, &one}).ok());
        const Result<std::uint64_t> removed = mock.add_teardown_hook({&Hook::run, &two});
        REQUIRE(removed.ok());
        REQUIRE(mock.add_teardown_hook({&Hook::run, &three}).ok());
        mock.remove_teardown_hook(*removed);
        CHECK(mock.add_teardown_hook({nullptr, nullptr}).status().code() == Errc::invalid_argument);
        CHECK(order.empty());
    }
    CHECK(order == std::vector<int>{3, 1});
    order.clear();
    {
        detail::TeardownList list;
        REQUIRE(list.add({&Hook::run, &one}, "test").ok());
        REQUIRE(list.add({&Hook::run, &three}, "test").ok());
        list.run_all();
        list.run_all();  // once each
        CHECK(order == std::vector<int>{3, 1});
    }
    // Removing a hook that runs in another thread returns once it returned.
    struct Slow {
        std::atomic<bool> started{false}, finished{false};
        static void run(void* user) noexcept {
            auto* slow = static_cast<Slow*>(user);
            slow->started = true;
            for (int i = 0; i < 2000; ++i) std::this_thread::yield();
            slow->finished = true;
        }
    } slow;
    detail::TeardownList list;
    const Result<std::uint64_t> id = list.add({&Slow::run, &slow}, "test");
    REQUIRE(id.ok());
    std::thread runner([&] { list.run_all(); });
    while (!slow.started) std::this_thread::yield();
    list.remove(*id);
    CHECK(slow.finished);
    runner.join();
}
