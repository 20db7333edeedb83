// SPDX-License-Identifier: Apache-2.0
// The backend contract, staging and pinned suites over CudaBackend. Without a usable GPU the
// executable reports itself skipped (exit code 77).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <tuple>

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

using ContractBackends = std::tuple<devstage::CudaBackend>;
using PinnedBackends = std::tuple<devstage::CudaBackend>;
using StagingBackends = std::tuple<devstage::CudaBackend>;
#include "backend_contract.hpp"
#include "pinned_suite.hpp"
#include "staging_suite.hpp"

int main(int argc, char** argv) {
    auto gpu = devstage::CudaBackend::create(0);
    if (!gpu) {
        std::printf("skipped: %s\n", gpu.status().message().c_str());
        return 77;
    }
    return Catch::Session().run(argc, argv);
}
