// SPDX-License-Identifier: Apache-2.0
#pragma once
// Backends that miss exactly one required operation, for the concept's negative tests.

#include <cstddef>
#include <string_view>

#include "devstage/status.hpp"

namespace devstage::test {

enum class Missing {
    nothing,
    name,
    device_malloc,
    device_free,
    copy_to_device,
    copy_from_device,
    pinned_malloc,
    pinned_free
};

template <Missing M>
struct FakeBackend {
    static constexpr std::size_t device_alignment = 64;
    std::string_view name() const noexcept requires(M != Missing::name) { return "fake"; }
    Result<void*> device_malloc(std::size_t) noexcept requires(M != Missing::device_malloc) {
        return Status(Errc::out_of_memory, "fake");
    }
    Status device_free(void*) noexcept requires(M != Missing::device_free) { return {}; }
    Status copy_to_device(void*, const void*, std::size_t) noexcept requires(M != Missing::copy_to_device) {
        return {};
    }
    Status copy_from_device(void*, const void*, std::size_t) noexcept requires(M != Missing::copy_from_device) {
        return {};
    }
    Result<void*> pinned_malloc(std::size_t) noexcept requires(M != Missing::pinned_malloc) {
        return Status(Errc::out_of_memory, "fake");
    }
    Status pinned_free(void*) noexcept requires(M != Missing::pinned_free) { return {}; }
};

}  // namespace devstage::test
