// SPDX-License-Identifier: Apache-2.0
// AscendBackend over the ACL shim: the backend contract, staging and pinned suites (the same
// templated tests as for every backend), device binding, error messages, loading failures.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <tuple>

#include "devstage/backends/ascend.hpp"
#include "support.hpp"

namespace {
// The shim's test-control functions, from the same library the backend loads.
struct Shim {
    void (*set_capacity)(int, std::size_t);
    void (*fail)(const char*, int, int);
    int (*device_of)(const void*);
    std::size_t (*live_allocations)(int);
    int (*device_refs)(int);

    static const Shim& get() {
        static const Shim shim = [] {
            const char* path = std::getenv("DEVSTAGE_ACL_LIBRARY");
            void* handle = ::dlopen(path != nullptr ? path : "libascendcl.so", RTLD_NOW);
            Shim s{};
            if (handle == nullptr) return s;
            s.set_capacity = reinterpret_cast<decltype(s.set_capacity)>(::dlsym(handle, "shim_set_capacity"));
            s.fail = reinterpret_cast<decltype(s.fail)>(::dlsym(handle, "shim_fail"));
            s.device_of = reinterpret_cast<decltype(s.device_of)>(::dlsym(handle, "shim_device_of"));
            s.live_allocations =
                reinterpret_cast<decltype(s.live_allocations)>(::dlsym(handle, "shim_live_allocations"));
            s.device_refs = reinterpret_cast<decltype(s.device_refs)>(::dlsym(handle, "shim_device_refs"));
            return s;
        }();
        return shim;
    }
};
}  // namespace

template <>
struct devstage::test::BackendFactory<devstage::AscendBackend> {
    static std::unique_ptr<AscendBackend> make(std::size_t capacity = std::size_t{1} << 32) {
        REQUIRE(Shim::get().set_capacity != nullptr);
        Shim::get().set_capacity(0, capacity);
        Result<AscendBackend> backend = AscendBackend::create(0);
        REQUIRE(backend.ok());
        return std::make_unique<AscendBackend>(std::move(*backend));
    }
};

using ContractBackends = std::tuple<devstage::AscendBackend>;
using StagingBackends = std::tuple<devstage::AscendBackend>;
using PinnedBackends = std::tuple<devstage::AscendBackend>;
using VmmBackends = std::tuple<devstage::AscendBackend>;
#include "backend_contract.hpp"
#include "pinned_suite.hpp"
#include "staging_suite.hpp"
#include "vmm_suite.hpp"

using namespace devstage;

TEST_CASE("ascend: two backends on two devices, used alternately from one thread, allocate on their own device",
          "[ascend]") {
    const Shim& shim = Shim::get();
    auto zero = AscendBackend::create(0);
    auto one = AscendBackend::create(1);
    REQUIRE(zero.ok());
    REQUIRE(one.ok());
    const std::size_t live0 = shim.live_allocations(0), live1 = shim.live_allocations(1);
    for (int round = 0; round < 3; ++round) {
        auto a = zero->device_malloc(4096);
        auto b = one->device_malloc(4096);
        auto c = zero->pinned_malloc(64);
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        REQUIRE(c.ok());
        CHECK(shim.device_of(*a) == 0);
        CHECK(shim.device_of(*b) == 1);
        CHECK(shim.device_of(*c) == -1);
        CHECK(zero->device_free(*a).ok());
        CHECK(one->device_free(*b).ok());
        CHECK(zero->pinned_free(*c).ok());
    }
    CHECK(shim.live_allocations(0) == live0);
    CHECK(shim.live_allocations(1) == live1);
    // A stager on device 1 stages there, whatever the thread used last.
    Stager<AscendBackend> stager(*one);
    std::vector<std::byte> host(3000);
    const TensorArg args[] = {{host.data(), host.size(), Direction::InOut}};
    auto probe = zero->device_malloc(64);  // device 0's context is now current on this thread
    REQUIRE(probe.ok());
    auto run = stager.bind(args);
    REQUIRE(run.ok());
    CHECK(shim.live_allocations(1) == live1 + 1);
    CHECK(shim.live_allocations(0) == live0 + 1);
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(zero->device_free(*probe).ok());
}

TEST_CASE("ascend: failures name the call, the sizes, the device, the ACL code and ACL's message", "[ascend]") {
    const Shim& shim = Shim::get();
    shim.set_capacity(1, 1 << 20);
    auto one = AscendBackend::create(1);
    REQUIRE(one.ok());
    auto oom = one->device_malloc(2 << 20);
    REQUIRE_FALSE(oom.ok());
    CHECK(oom.status().code() == Errc::out_of_memory);
    CHECK_THAT(oom.status().message(), Catch::Contains("aclrtMalloc") && Catch::Contains("2097152 bytes") &&
                                           Catch::Contains("device 1") && Catch::Contains("207001") &&
                                           Catch::Contains("out of memory"));
    shim.set_capacity(1, std::size_t{1} << 34);
    auto device = one->device_malloc(128);
    REQUIRE(device.ok());
    std::vector<std::byte> host(128);
    shim.fail("aclrtMemcpy", 1, 507899);
    const Status copy = one->copy_to_device(*device, host.data(), 128);
    CHECK(copy.code() == Errc::backend_failure);
    CHECK_THAT(copy.message(), Catch::Contains("aclrtMemcpy(host to device)") && Catch::Contains("128 bytes") &&
                                   Catch::Contains("507899") && Catch::Contains("injected"));
    CHECK(one->copy_to_device(*device, host.data(), 0).ok());  // guarded: ACL rejects destMax 0
    CHECK(one->device_free(*device).ok());
    CHECK_FALSE(one->device_free(*device).ok());
}

TEST_CASE("ascend: a missing library or symbol is library_not_found naming it", "[ascend]") {
    auto missing = AscendBackend::create(0, "/nonexistent/libascendcl.so");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.status().code() == Errc::library_not_found);
    CHECK_THAT(missing.status().message(), Catch::Contains("/nonexistent/libascendcl.so"));
    const char* partial = std::getenv("DEVSTAGE_ACL_PARTIAL_LIBRARY");
    REQUIRE(partial != nullptr);
    auto incomplete = AscendBackend::create(0, partial);
    REQUIRE_FALSE(incomplete.ok());
    CHECK(incomplete.status().code() == Errc::library_not_found);
    CHECK_THAT(incomplete.status().message(), Catch::Contains("aclrtSetDevice") && Catch::Contains(partial));
}

TEST_CASE("ascend: a failed device open releases what it took; destruction resets the device", "[ascend]") {
    const Shim& shim = Shim::get();
    auto bad = AscendBackend::create(9);
    CHECK(bad.status().code() == Errc::backend_failure);
    CHECK_THAT(bad.status().message(), Catch::Contains("aclrtSetDevice") && Catch::Contains("107001"));
    const int refs = shim.device_refs(2);
    {
        auto two = AscendBackend::create(2);
        REQUIRE(two.ok());
        CHECK(shim.device_refs(2) == refs + 1);
        AscendBackend moved = std::move(*two);
        CHECK(moved.device_id() == 2);
    }
    CHECK(shim.device_refs(2) == refs);
}

TEST_CASE("ascend: virtual memory is bound to the backend's device; a library without it says not_supported",
          "[ascend][vmm]") {
    const Shim& shim = Shim::get();
    auto one = AscendBackend::create(1);
    REQUIRE(one.ok());
    REQUIRE(one->vmm_granularity() == std::size_t{2} << 20);
    shim.set_capacity(1, std::size_t{4} << 20);
    Stager<AscendBackend, RetainedVmm<>> stager(*one, RetainedVmm<>(std::size_t{64} << 20));
    std::vector<std::byte> host(std::size_t{5} << 20);
    const TensorArg fits[] = {{host.data(), std::size_t{3} << 20, Direction::In}};
    auto run = stager.bind(fits);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    const TensorArg over[] = {{host.data(), std::size_t{5} << 20, Direction::In}};
    auto failed = stager.bind(over);
    REQUIRE_FALSE(failed.ok());
    CHECK(failed.status().code() == Errc::out_of_memory);
    CHECK_THAT(failed.status().message(), Catch::Contains("aclrtMallocPhysical") && Catch::Contains("device 1"));
    CHECK(stager.strategy().capacity() == std::size_t{4} << 20);  // what was mapped stays
    REQUIRE(stager.release().ok());
    shim.set_capacity(1, std::size_t{1} << 34);

    CHECK(one->vmm_reserve(std::size_t{3} << 20).status().code() == Errc::backend_failure);  // not a granule multiple

    const char* without_vmm = std::getenv("DEVSTAGE_ACL_NO_VMM_LIBRARY");
    REQUIRE(without_vmm != nullptr);
    auto plain = AscendBackend::create(0, without_vmm);
    REQUIRE(plain.ok());
    CHECK(plain->vmm_granularity() == 0);
    CHECK(plain->vmm_reserve(std::size_t{2} << 20).status().code() == Errc::not_supported);
    Stager<AscendBackend, RetainedVmm<>> unsupported(*plain);
    auto refused = unsupported.bind(fits);
    CHECK(refused.status().code() == Errc::not_supported);
}
