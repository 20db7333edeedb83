// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the one align-and-bump rule of every layout devstage makes — the plan's, the fused
// slicing pass of a retained buffer, a frame's, the merged zeroing of adjacent slices, the
// strategies' slices. An arg of `bytes` placed at `offset` ends its slot at
// offset + align_up(bytes, alignment): the next arg starts there, aligned as the first.

#include <cstddef>
#include <limits>
#include <optional>

namespace devstage::detail {

/// `value` rounded up to a multiple of `alignment` (a power of two), or nullopt on overflow.
constexpr std::optional<std::size_t> align_up(std::size_t value, std::size_t alignment) noexcept {
    const std::size_t mask = alignment - 1;
    if (value > std::numeric_limits<std::size_t>::max() - mask) return std::nullopt;
    return (value + mask) & ~mask;
}

/// Sizes and offsets up to a quarter of the address space: aligned and added, they cannot
/// overflow, so the per-arg path tests once that both are below it and skips the checks.
inline constexpr std::size_t small_size = std::numeric_limits<std::size_t>::max() >> 2;

/// The offset after an arg of `bytes` placed at `offset` (a multiple of `alignment`, a power of
/// two): offset + align_up(bytes, alignment). False, leaving `end` as it was, on overflow.
[[gnu::always_inline]] constexpr bool bump(std::size_t offset, std::size_t bytes, std::size_t alignment,
                                           std::size_t& end) noexcept {
    const std::size_t mask = alignment - 1;
    if ((bytes | offset) > small_size) [[unlikely]] {
        const std::optional<std::size_t> padded = align_up(bytes, alignment);
        if (!padded || offset > std::numeric_limits<std::size_t>::max() - *padded) return false;
        end = offset + *padded;
        return true;
    }
    end = offset + ((bytes + mask) & ~mask);
    return true;
}

/// bump() for an offset and size already known to fit (a layout that was planned with bump()).
[[gnu::always_inline]] constexpr std::size_t bumped(std::size_t offset, std::size_t bytes,
                                                    std::size_t alignment) noexcept {
    return offset + ((bytes + alignment - 1) & ~(alignment - 1));
}

}  // namespace devstage::detail
