// SPDX-License-Identifier: Apache-2.0
// Two translation units include every header and are linked together: no ODR violation,
// no non-inline definitions in headers.
#include "devstage/backends/ascend.hpp"
#include "devstage/backends/cuda.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"

int odr_b();

int main() {
    devstage::MockBackend mock;
    devstage::Stager<devstage::MockBackend> stager(mock);
    return odr_b() + static_cast<int>(stager.stats().runs);
}
