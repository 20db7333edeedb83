// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a backend without device_free used with a Stager. The diagnostic must
// name the missing operation (checked by expect_compile_error.sh).
#include "../fake_backends.hpp"
#include "devstage/stager.hpp"

int main() {
    devstage::test::FakeBackend<devstage::test::Missing::device_free> backend;
    devstage::Stager<decltype(backend)> stager(backend);
    return static_cast<int>(stager.stats().runs);
}
