// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: PackSmall over a backend without pinned host memory. The diagnostic must
// say why (checked by expect_compile_error.sh).
#include "../fake_backends.hpp"
#include "devstage/stager.hpp"

int main() {
    using Packed = devstage::RetainedBump<devstage::ExactGrowth, 1024, devstage::PackSmall<>>;
    devstage::test::FakeBackend<devstage::test::Missing::pinned_malloc> backend;
    devstage::Stager<decltype(backend), Packed> stager(backend);
    int x = 0;
    const devstage::TensorArg args[] = {{&x, sizeof x, devstage::Direction::In}};
    return stager.bind(args).ok() ? 0 : 1;
}
