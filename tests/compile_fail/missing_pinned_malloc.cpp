// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a PinnedHostPool over a backend without pinned_malloc. The diagnostic
// must name the missing operation (checked by expect_compile_error.sh).
#include "../fake_backends.hpp"
#include "devstage/pinned.hpp"

int main() {
    devstage::test::FakeBackend<devstage::test::Missing::pinned_malloc> backend;
    devstage::PinnedHostPool<decltype(backend)> pool(backend);
    return static_cast<int>(pool.stats().live_allocations);
}
