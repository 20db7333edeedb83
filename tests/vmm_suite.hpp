// SPDX-License-Identifier: Apache-2.0
#pragma once
// RetainedVmm over every VirtualMemoryBackend, written once. The including TU defines
// `VmmBackends` (a std::tuple of backend types with a test::BackendFactory).

#include <catch2/catch.hpp>

#include <vector>

#include "devstage/stager.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_vmm.hpp"
#include "support.hpp"

namespace vmm_suite {
inline std::vector<devstage::TensorArg> one_arg(std::vector<std::byte>& host, std::size_t bytes,
                                                devstage::Direction direction = devstage::Direction::InOut) {
    host.resize(std::max(host.size(), bytes));
    return {devstage::TensorArg{host.data(), bytes, direction}};
}
}  // namespace vmm_suite

TEMPLATE_LIST_TEST_CASE("vmm: the base never moves and mapped data survives a grow", "[vmm]", VmmBackends) {
    using namespace devstage;
    auto backend = test::make_backend<TestType>();
    Stager<TestType, RetainedVmm<>> stager(*backend, RetainedVmm<>(std::size_t{256} << 20));
    stager.set_output_policy(OutputPolicy::kernel_writes_all);  // the Out args below leave the device bytes
    const std::size_t granularity = backend->vmm_granularity();
    std::vector<std::byte> host;
    auto small = vmm_suite::one_arg(host, 1000);
    auto run = stager.bind(small);
    REQUIRE(run.ok());
    const void* base = stager.strategy().base();
    REQUIRE(base != nullptr);
    CHECK(stager.strategy().capacity() == granularity);
    const auto marker = test::pattern(1000, 5);
    REQUIRE(backend->copy_to_device(const_cast<void*>(base), marker.data(), marker.size()).ok());
    REQUIRE(stager.finish(std::move(*run)).ok());

    for (std::size_t bytes : {granularity + 1, 3 * granularity, 7 * granularity + 5}) {
        // An Out arg, not zeroed: nothing uploaded, so the old bytes at the base stay as they were.
        auto bigger = vmm_suite::one_arg(host, bytes, Direction::Out);
        auto grown = stager.bind(bigger);
        REQUIRE(grown.ok());
        CHECK(stager.strategy().base() == base);
        CHECK(grown->device_args()[0].data == base);
        CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, base, marker.size()), marker));
        // The whole slice is usable device memory, across chunk boundaries.
        const auto fill = test::pattern(bytes, 9);
        REQUIRE(backend->copy_to_device(const_cast<void*>(base), fill.data(), bytes).ok());
        REQUIRE(backend->copy_to_device(const_cast<void*>(base), marker.data(), marker.size()).ok());
        REQUIRE(stager.finish(std::move(*grown)).ok());
    }
    CHECK(stager.stats().regrows == 4);
    CHECK(stager.stats().device_frees == 0);  // nothing freed on growth
    REQUIRE(stager.release().ok());
    CHECK(stager.stats().retained_bytes == 0);
    CHECK(stager.stats().device_frees == stager.stats().device_mallocs);
}

TEMPLATE_LIST_TEST_CASE("vmm: reservation exhaustion is reported and the mapped part stays usable", "[vmm]",
                        VmmBackends) {
    using namespace devstage;
    auto backend = test::make_backend<TestType>();
    const std::size_t granularity = backend->vmm_granularity();
    Stager<TestType, RetainedVmm<>> stager(*backend, RetainedVmm<>(2 * granularity));
    std::vector<std::byte> host;
    auto fits = vmm_suite::one_arg(host, granularity);
    auto run = stager.bind(fits);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    auto too_big = vmm_suite::one_arg(host, 2 * granularity + 1);
    auto failed = stager.bind(too_big);
    REQUIRE_FALSE(failed.ok());
    CHECK(failed.status().code() == Errc::out_of_memory);
    CHECK_THAT(failed.status().message(),
               Catch::Contains("reservation exhausted") && Catch::Contains(std::string(backend->name())));
    CHECK(stager.stats().grow_failures == 1);
    CHECK(stager.strategy().capacity() == granularity);
    fits = vmm_suite::one_arg(host, granularity);
    auto again = stager.bind(fits);
    REQUIRE(again.ok());
    REQUIRE(stager.finish(std::move(*again)).ok());
}

TEMPLATE_LIST_TEST_CASE("vmm: results equal the per-tensor reference; destruction unmaps and releases", "[vmm]",
                        VmmBackends) {
    using namespace devstage;
    auto backend = test::make_backend<TestType>();
    test::HostRun a;
    for (std::uint32_t i = 0; i < 6; ++i) a.add(1000 + 5000 * i, static_cast<Direction>(i % 3), i);
    test::HostRun b = a;
    b.relink();
    {
        Stager<TestType, RetainedVmm<>> vmm(*backend, RetainedVmm<>(std::size_t{64} << 20));
        Stager<TestType, PerTensorMalloc<>> reference(*backend);
        auto run_a = vmm.bind(a.args);
        REQUIRE(run_a.ok());
        REQUIRE(test::fake_kernel(*backend, run_a->device_args(), a.args).ok());
        REQUIRE(vmm.finish(std::move(*run_a)).ok());
        auto run_b = reference.bind(b.args);
        REQUIRE(run_b.ok());
        REQUIRE(test::fake_kernel(*backend, run_b->device_args(), b.args).ok());
        REQUIRE(reference.finish(std::move(*run_b)).ok());
    }
    CHECK(devstage::test::same_bytes(a.buffers, b.buffers));
    // After the stager died, its reservation is gone: a fresh one of the same size succeeds.
    auto reservation = backend->vmm_reserve(std::size_t{64} << 20);
    REQUIRE(reservation.ok());
    CHECK(backend->vmm_release(*reservation).ok());
}

TEMPLATE_LIST_TEST_CASE("vmm: an Out the kernel leaves unwritten reads back as zeros, across a grow", "[vmm][zeroing]",
                        VmmBackends) {
    using namespace devstage;
    auto backend = test::make_backend<TestType>();
    Stager<TestType, RetainedVmm<>> stager(*backend, RetainedVmm<>(std::size_t{256} << 20));
    const std::size_t granularity = backend->vmm_granularity();
    std::vector<std::byte> host(granularity + 100, std::byte{0xAB});
    auto in = vmm_suite::one_arg(host, granularity, Direction::In);
    auto run = stager.bind(in);
    REQUIRE(run.ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    for (const std::size_t bytes : {granularity, granularity + 100}) {  // the second one grows in place
        std::fill(host.begin(), host.end(), std::byte{0xCD});
        auto out = vmm_suite::one_arg(host, bytes, Direction::Out);
        run = stager.bind(out);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
        CHECK(devstage::test::same_bytes(std::span(host).first(bytes), std::vector<std::byte>(bytes)));
    }
    CHECK(stager.stats().zeroing_calls == 2);
}
