// SPDX-License-Identifier: Apache-2.0
#include "devstage/backends/ascend.hpp"
#include "devstage/backends/cuda.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"

int odr_b() {
    devstage::SimBackend sim;
    devstage::Stager<devstage::SimBackend, devstage::PerTensorMalloc<>> stager(sim);
    return static_cast<int>(stager.stats().runs);
}
