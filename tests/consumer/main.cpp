// SPDX-License-Identifier: Apache-2.0
// A CMake project that uses an installed devstage through find_package (see install_check.sh).
#include <devstage/backends/sim.hpp>
#include <devstage/devstage.hpp>
int main() {
    devstage::SimBackend sim;
    devstage::Stager<devstage::SimBackend> stager(sim);
    float x[4] = {};
    const devstage::TensorArg args[] = {{x, sizeof x}};
    auto run = stager.bind(args);
    return run && stager.finish(std::move(*run)) ? 0 : 1;
}
