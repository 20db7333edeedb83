// SPDX-License-Identifier: Apache-2.0
// A program that uses an installed devstage, or devstage as a Meson subproject (see
// install_check.sh). With CONSUMER_AFTER_CXX20 defined it also checks that the consumer's own
// standard, newer than C++20, survived the flags the package added.
#include <devstage/backends/sim.hpp>
#include <devstage/devstage.hpp>
#if defined(CONSUMER_AFTER_CXX20) && __cplusplus <= 202002L
#error "the consumer asked for a standard after C++20 and the package's flags overrode it"
#endif
int main() {
    devstage::SimBackend sim;
    devstage::Stager<devstage::SimBackend> stager(sim);
    float x[4] = {};
    const devstage::TensorArg args[] = {{x, sizeof x}};
    auto run = stager.bind(args);
    return run && stager.finish(std::move(*run)) ? 0 : 1;
}
