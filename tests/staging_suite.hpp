// SPDX-License-Identifier: Apache-2.0
#pragma once
// The staging contract, written once and instantiated for every backend. The including TU
// defines `StagingBackends` (a std::tuple of backend types with a test::BackendFactory).

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "devstage/stager.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "suite_strategies.hpp"
#include "support.hpp"

namespace staging_suite {
using namespace devstage;
using devstage::test::HostRun;

// Runs one bind → kernel → finish cycle; returns finish's status.
template <class S, class B>
Status run_once(S& stager, B& backend, HostRun& host) {
    Result<StagedRun> run = stager.bind(host.args);
    if (!run) return run.status();
    if (Status k = devstage::test::fake_kernel(backend, run->device_args(), host.args); !k) return k;
    return stager.finish(std::move(*run));
}

inline HostRun decode_like(std::uint32_t seed, std::size_t scale = 1) {
    HostRun host;
    host.add(4096 * scale, Direction::In, seed);         // hidden states
    host.add(1000 * scale, Direction::In, seed + 1);     // weights, unaligned size
    host.add(0, Direction::In, seed + 2);                // empty
    host.add(2048 * scale, Direction::InOut, seed + 3);  // kv cache
    host.add(513 * scale, Direction::Out, seed + 4);     // logits
    return host;
}
}  // namespace staging_suite

TEMPLATE_LIST_TEST_CASE("staging: device args keep input order; slices are aligned", "[staging]", StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    int external = 0;
    HostRun host = decode_like(1);
    host.add_device(&external, sizeof external);
    Stager<TestType, devstage::test::RetainedOf<TestType>> retained(*backend);
    Stager<TestType, PerTensorMalloc<>> per_tensor(*backend);
    auto check = [&](auto& stager, ReleaseKind staged_kind) {
        Result<StagedRun> run = stager.bind(host.args);
        REQUIRE(run.ok());
        const auto device = run->device_args();
        REQUIRE(device.size() == host.args.size());
        CHECK(device[2].data == nullptr);  // zero bytes: null, no lease
        CHECK(device[5].data == &external);
        const auto leases = run->leases();
        REQUIRE(leases.size() == 5);  // 4 staged + 1 device arg
        for (std::size_t i : {0u, 1u, 3u, 4u}) {
            CHECK(device[i].placement == Placement::Device);
            CHECK(device[i].bytes == host.args[i].bytes);
            CHECK(reinterpret_cast<std::uintptr_t>(device[i].data) % 1024 == 0);
        }
        CHECK(leases[0].host == host.args[0].data);
        CHECK(leases[0].release_kind == staged_kind);
        CHECK_FALSE(leases[0].copy_back);
        CHECK(leases[2].copy_back);
        CHECK(leases[3].copy_back);
        CHECK(leases[4].release_kind == ReleaseKind::ExternalNoop);
        CHECK(leases[4].device == &external);
        CHECK(stager.finish(std::move(*run)).ok());
        CHECK(external == 0);
    };
    check(retained, ReleaseKind::BufferNoop);
    check(per_tensor, ReleaseKind::Free);
}

TEMPLATE_LIST_TEST_CASE("staging: copy-back follows the direction", "[staging]", StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
    HostRun host = decode_like(2);
    const auto before = host.buffers;
    Result<StagedRun> run = stager.bind(host.args);
    REQUIRE(run.ok());
    // The kernel writes every device tensor, In ones included.
    for (const TensorArg& arg : run->device_args()) {
        if (arg.bytes == 0) continue;
        std::vector<std::byte> ones(arg.bytes, std::byte{1});
        REQUIRE(backend->copy_to_device(arg.data, ones.data(), ones.size()).ok());
    }
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(devstage::test::same_bytes(host.buffers[0], before[0]));  // In: never copied back
    CHECK(devstage::test::same_bytes(host.buffers[1], before[1]));
    CHECK(devstage::test::same_bytes(host.buffers[3],
                                     std::vector<std::byte>(host.buffers[3].size(), std::byte{1})));  // InOut
    CHECK(devstage::test::same_bytes(host.buffers[4],
                                     std::vector<std::byte>(host.buffers[4].size(), std::byte{1})));  // Out
    const StagerStats& stats = stager.stats();
    CHECK(stats.bytes_to_device == 4096 + 1000 + 2048);
    CHECK(stats.bytes_from_device == 2048 + 513);
    CHECK(stats.uploads_skipped == 1);
    CHECK(stats.copy_backs_skipped == 2);
}

TEMPLATE_LIST_TEST_CASE("staging: a failed execution copies nothing back", "[staging]", StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, PerTensorMalloc<>> stager(*backend);
    HostRun host = decode_like(3);
    const auto before = host.buffers;
    Result<StagedRun> run = stager.bind(host.args);
    REQUIRE(run.ok());
    REQUIRE(devstage::test::fake_kernel(*backend, run->device_args(), host.args).ok());
    const Status finished = stager.finish(std::move(*run), Status(Errc::backend_failure, "kernel failed"));
    CHECK(finished.ok());  // finish reports its own errors, not the execution's
    CHECK(devstage::test::same_bytes(host.buffers, before));
    CHECK(stager.stats().copy_backs_skipped == 4);
    CHECK(stager.stats().device_frees == 4);
    CHECK(stager.stats().device_mallocs == 4);
}

TEMPLATE_LIST_TEST_CASE("staging: a second bind on a busy stager fails with busy", "[staging]", StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
    HostRun host = decode_like(4);
    Result<StagedRun> first = stager.bind(host.args);
    REQUIRE(first.ok());
    Result<StagedRun> second = stager.bind(host.args);
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == Errc::busy);
    CHECK_THAT(second.status().message(), Catch::Contains(std::string(backend->name())));
    REQUIRE(stager.finish(std::move(*first)).ok());
    Result<StagedRun> third = stager.bind(host.args);
    CHECK(third.ok());
}

TEMPLATE_LIST_TEST_CASE("staging: a run dropped without finish releases without copy-back", "[staging]",
                        StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, PerTensorMalloc<>> stager(*backend);
    HostRun host = decode_like(5);
    const auto before = host.buffers;
    {
        Result<StagedRun> run = stager.bind(host.args);
        REQUIRE(run.ok());
        StagedRun moved = std::move(*run);  // a moved-from handle must not release twice
        CHECK_FALSE(run->live());
        CHECK(moved.live());
        REQUIRE(devstage::test::fake_kernel(*backend, moved.device_args(), host.args).ok());
    }
    CHECK(devstage::test::same_bytes(host.buffers, before));
    CHECK(stager.stats().device_frees == stager.stats().device_mallocs);
    CHECK(stager.live_runs() == 0);
    CHECK(run_once(stager, *backend, host).ok());
}

TEMPLATE_LIST_TEST_CASE("staging: finish of a dead or foreign run is refused", "[staging]", StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
    Stager<TestType, devstage::test::RetainedOf<TestType>> other(*backend);
    HostRun host = decode_like(6);
    Result<StagedRun> run = stager.bind(host.args);
    REQUIRE(run.ok());
    const Status foreign = other.finish(std::move(*run));
    CHECK(foreign.code() == Errc::invalid_argument);
    CHECK_THAT(foreign.message(), Catch::Contains("another stager"));
    CHECK(run->live());  // untouched
    REQUIRE(stager.finish(std::move(*run)).ok());
    const Status twice = stager.finish(std::move(*run));
    CHECK(twice.code() == Errc::invalid_argument);
    CHECK_THAT(twice.message(), Catch::Contains("not live"));
}

TEMPLATE_LIST_TEST_CASE("staging: release and destruction with a live run free everything once", "[staging]",
                        StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    HostRun host = decode_like(7);
    Result<StagedRun> orphan = Status(Errc::busy, "unset");
    {
        Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
        Result<StagedRun> run = stager.bind(host.args);
        REQUIRE(run.ok());
        CHECK(stager.stats().retained_bytes > 0);
        REQUIRE(stager.release().ok());
        CHECK_FALSE(run->live());
        CHECK(stager.stats().retained_bytes == 0);
        CHECK(stager.stats().device_frees == stager.stats().device_mallocs);
        // Usable after release; then destroyed with a live run.
        orphan = stager.bind(host.args);
        REQUIRE(orphan.ok());
    }
    CHECK_FALSE(orphan->live());
    orphan = Status(Errc::busy, "dropped");   // the inert handle is destroyed harmlessly
    auto probe = backend->device_malloc(64);  // the backend saw matching frees
    REQUIRE(probe.ok());
    REQUIRE(backend->device_free(*probe).ok());
}

TEMPLATE_LIST_TEST_CASE("staging: abandon forgets device memory without backend calls", "[staging]", StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    if constexpr (requires { backend->set_error_sink(&devstage::test::quiet_sink); }) {
        backend->set_error_sink(&devstage::test::quiet_sink);  // the abandoned buffer is a leak to the mock
    }
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
    HostRun host = decode_like(8);
    Result<StagedRun> run = stager.bind(host.args);
    REQUIRE(run.ok());
    const std::uint64_t frees = stager.stats().device_frees;
    stager.abandon();
    CHECK_FALSE(run->live());
    CHECK(stager.stats().device_frees == frees);
    CHECK(stager.stats().retained_bytes == 0);
    CHECK(stager.strategy().base() == nullptr);
    CHECK(run_once(stager, *backend, host).ok());
    CHECK(stager.stats().regrows == 2);
}

TEMPLATE_LIST_TEST_CASE("staging: the retained buffer grows, reuses and never shrinks", "[staging][retained]",
                        StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
    HostRun small = decode_like(9, 1), large = decode_like(10, 4);
    // A backend that returns misaligned memory costs a retry per grow (freed, asked again larger).
    const auto mallocs = [&] { return stager.stats().device_mallocs - stager.stats().alignment_retries; };
    const auto frees = [&] { return stager.stats().device_frees - stager.stats().alignment_retries; };
    REQUIRE(run_once(stager, *backend, small).ok());
    CHECK(stager.stats().regrows == 1);
    const std::size_t first_capacity = stager.strategy().capacity();
    CHECK(first_capacity == 4096 + 1024 + 2048 + 1024);
    REQUIRE(run_once(stager, *backend, small).ok());  // same plan: no allocation
    CHECK(mallocs() == 1);
    REQUIRE(run_once(stager, *backend, large).ok());  // larger: free old, malloc new
    CHECK(stager.stats().regrows == 2);
    CHECK(mallocs() == 2);
    CHECK(frees() == 1);
    const std::size_t grown = stager.strategy().capacity();
    CHECK(grown > first_capacity);
    REQUIRE(run_once(stager, *backend, small).ok());  // smaller: keeps the larger buffer
    CHECK(stager.strategy().capacity() == grown);
    CHECK(mallocs() == 2);
    CHECK(stager.stats().high_water_bytes == grown);
    CHECK(stager.stats().runs == 4);
}

TEMPLATE_LIST_TEST_CASE("staging: a failed grow leaves an empty slot; the next run succeeds", "[staging][retained]",
                        StagingBackends) {
    using namespace staging_suite;
    if constexpr (!requires { devstage::test::BackendFactory<TestType>::make(std::size_t{}); }) {
        SUCCEED("this backend's factory cannot limit device capacity");
    } else {
        auto backend = devstage::test::make_backend<TestType>(64 << 10);
        Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
        HostRun fits = decode_like(11, 2), too_big = decode_like(12, 16);
        REQUIRE(run_once(stager, *backend, fits).ok());
        Result<StagedRun> failed = stager.bind(too_big.args);
        REQUIRE_FALSE(failed.ok());
        CHECK(failed.status().code() == Errc::out_of_memory);
        CHECK_THAT(failed.status().message(), Catch::Contains("retained buffer grow failed") &&
                                                  Catch::Contains(std::string(backend->name())) &&
                                                  Catch::Contains("required"));
        CHECK(stager.stats().grow_failures == 1);
        CHECK(stager.strategy().capacity() == 0);
        CHECK(stager.stats().retained_bytes == 0);
        CHECK(stager.live_runs() == 0);
        REQUIRE(run_once(stager, *backend, fits).ok());
        CHECK(stager.stats().regrows == 2);
    }
}

TEMPLATE_LIST_TEST_CASE("staging: PerTensorMalloc allocates and frees once per staged arg", "[staging][per_tensor]",
                        StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, PerTensorMalloc<>> stager(*backend);
    HostRun host = decode_like(13);
    for (int i = 0; i < 3; ++i) REQUIRE(run_once(stager, *backend, host).ok());
    CHECK(stager.stats().device_mallocs == 12);
    CHECK(stager.stats().device_frees == 12);
    CHECK(stager.stats().retained_bytes == 0);
    CHECK(stager.stats().regrows == 0);
}

TEMPLATE_LIST_TEST_CASE("staging: retained and per-tensor results are byte-identical", "[staging][equivalence]",
                        StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, devstage::test::RetainedOf<TestType>> retained(*backend);
    Stager<TestType, PerTensorMalloc<>> reference(*backend);
    const std::uint32_t seed = GENERATE(range(1u, 17u));
    CAPTURE(seed);
    std::uint32_t x = seed;
    const auto next = [&x] {
        x = x * 1664525u + 1013904223u;
        return x >> 8;
    };
    HostRun a;
    const std::size_t count = 1 + next() % 12;
    const std::size_t sizes[] = {0, 1, 63, 1023, 1024, 1025, 4096, 70000};
    for (std::size_t i = 0; i < count; ++i) {
        const auto direction = static_cast<Direction>(next() % 3);
        a.add(sizes[next() % 8] + next() % 3, direction, next());
    }
    HostRun b = a;
    b.relink();
    REQUIRE(run_once(retained, *backend, a).ok());
    REQUIRE(run_once(reference, *backend, b).ok());
    CHECK(devstage::test::same_bytes(a.buffers, b.buffers));
}

TEMPLATE_LIST_TEST_CASE("staging: bad args are refused naming arg, bytes and backend; nothing is taken", "[staging]",
                        StagingBackends) {
    using namespace staging_suite;
    auto backend = devstage::test::make_backend<TestType>();
    Stager<TestType, devstage::test::RetainedOf<TestType>> stager(*backend);
    HostRun host = decode_like(14);
    host.args[3].data = nullptr;  // InOut, 2048 bytes, no host memory
    Result<StagedRun> refused = stager.bind(host.args);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == Errc::invalid_argument);
    CHECK_THAT(refused.status().message(), Catch::Contains("arg 3") && Catch::Contains("2048 bytes") &&
                                               Catch::Contains(std::string(backend->name())));
    CHECK(stager.stats().device_mallocs == 0);
    CHECK(stager.live_runs() == 0);
    host.relink();
    CHECK(run_once(stager, *backend, host).ok());
}
