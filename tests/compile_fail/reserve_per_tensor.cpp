// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: reserve() on a PerTensorMalloc stager, whose device addresses change every
// run, so there is nothing to reserve (checked by expect_compile_error.sh: the diagnostic names
// the constraint).
#include "devstage/backends/mock.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/per_tensor.hpp"

int main() {
    devstage::MockBackend mock;
    devstage::Stager<devstage::MockBackend, devstage::PerTensorMalloc<>> stager(mock);
    return static_cast<int>(stager.reserve(1024).code());
}
