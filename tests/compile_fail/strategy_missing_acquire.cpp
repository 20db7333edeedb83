// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a Stager over a strategy without acquire. The diagnostic must name the
// missing operation (checked by expect_compile_error.sh).
#include "../fake_backends.hpp"
#include "devstage/stager.hpp"

struct NoAcquire {
    static constexpr std::size_t alignment = 256;
    static constexpr devstage::ReleaseKind lease_kind = devstage::ReleaseKind::Free;
    template <class B>
    devstage::Status prepare(B&, const devstage::Requirement&, devstage::StagerStats&,
                             devstage::FreeQueue<B>&) noexcept {
        return {};
    }
    template <class B>
    devstage::Status release_retained(B&, devstage::StagerStats&) noexcept {
        return {};
    }
    void abandon(devstage::StagerStats&) noexcept {}
    std::size_t capacity() const noexcept { return 0; }
    void* base() const noexcept { return nullptr; }
};

int main() {
    devstage::test::FakeBackend<devstage::test::Missing::nothing> backend;
    devstage::Stager<decltype(backend), NoAcquire> stager(backend);
    return static_cast<int>(stager.stats().runs);
}
