// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a backend that declares streams and events but lacks stream_wait_event,
// used with a Stager. It must not silently stage synchronously; the diagnostic must name the
// missing operation (checked by expect_compile_error.sh).
#include "../fake_backends.hpp"
#include "devstage/stager.hpp"

int main() {
    devstage::test::FakeAsyncBackend<devstage::test::MissingAsync::stream_wait_event> backend;
    devstage::Stager<decltype(backend)> stager(backend);
    return static_cast<int>(stager.stats().runs);
}
