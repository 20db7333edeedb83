// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: size and pointer arithmetic that reports overflow instead of wrapping (the layout
// rule, align_up and bump, is detail/layout/bump.hpp).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>

#include "devstage/detail/layout/bump.hpp"  // align_up, for the users of this header

namespace devstage::detail {

/// `value` rounded up to a multiple of `multiple` (> 0, any value), or nullopt on overflow.
constexpr std::optional<std::size_t> round_up(std::size_t value, std::size_t multiple) noexcept {
    const std::size_t remainder = value % multiple;
    if (remainder == 0) return value;
    if (value > std::numeric_limits<std::size_t>::max() - (multiple - remainder)) return std::nullopt;
    return value + (multiple - remainder);
}

/// `a + b`, or nullopt on overflow.
constexpr std::optional<std::size_t> add(std::size_t a, std::size_t b) noexcept {
    if (a > std::numeric_limits<std::size_t>::max() - b) return std::nullopt;
    return a + b;
}

/// `pointer` rounded up to a multiple of `alignment` (a power of two).
inline void* align_pointer(void* pointer, std::size_t alignment) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    const auto aligned = (address + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
    return static_cast<std::byte*>(pointer) + (aligned - address);
}

/// True when `pointer` lies in [begin, begin + bytes).
inline bool inside(const void* pointer, const std::byte* begin, std::size_t bytes) noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(pointer);
    const auto from = reinterpret_cast<std::uintptr_t>(begin);
    return begin != nullptr && from <= at && at < from + bytes;
}

inline bool is_aligned(const void* pointer, std::size_t alignment) noexcept {
    return (reinterpret_cast<std::uintptr_t>(pointer) & (alignment - 1)) == 0;
}

/// Extra bytes to allocate so that a block whose base is aligned to `guaranteed` can be
/// aligned up to `wanted` inside it.
constexpr std::size_t alignment_slack(std::size_t guaranteed, std::size_t wanted) noexcept {
    return wanted > guaranteed ? wanted - guaranteed : 0;
}

}  // namespace devstage::detail
