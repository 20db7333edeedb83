// SPDX-License-Identifier: Apache-2.0
// CudaBackend loading, on any machine: a missing library is library_not_found naming it; a
// runtime that loads but finds no GPU (as on CI) is a clean not_supported, never a crash.
#include <catch2/catch.hpp>

#include "devstage/backends/cuda.hpp"

using namespace devstage;

TEST_CASE("cuda: a missing library is library_not_found naming it", "[cuda]") {
    auto missing = CudaBackend::create(0, "/nonexistent/libcudart.so.13");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.status().code() == Errc::library_not_found);
    CHECK_THAT(missing.status().message(), Catch::Contains("/nonexistent/libcudart.so.13"));
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
