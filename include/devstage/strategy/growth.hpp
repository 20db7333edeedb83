// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Growth policies for RetainedBump: given the capacity held and the bytes a run requires,
/// how large the next retained buffer is. A policy is any type with
/// `Result<std::size_t> next_capacity(std::size_t current, std::size_t required) const noexcept`
/// returning a value >= required (or an error that fails the run before any backend call).

#include <concepts>
#include <cstddef>

#include "devstage/status.hpp"

namespace devstage {

/// A growth policy. `static_assert(GrowthPolicy<ExactGrowth>);`
template <class G>
concept GrowthPolicy = requires(const G& g, std::size_t current, std::size_t required) {
    { g.next_capacity(current, required) } noexcept -> std::same_as<Result<std::size_t>>;
};

/// Grows to exactly what the run requires: the least memory, one regrow per larger plan.
/// Ideal when shapes settle (decode).
struct ExactGrowth {
    Result<std::size_t> next_capacity(std::size_t /*current*/, std::size_t required) const noexcept {
        return required;
    }
};

static_assert(GrowthPolicy<ExactGrowth>);

}  // namespace devstage
