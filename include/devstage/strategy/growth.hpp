// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Growth policies for RetainedBump: given the capacity held and the bytes a run requires,
/// how large the next retained buffer is. A policy is any type with
/// `Result<std::size_t> next_capacity(std::size_t current, std::size_t required) const noexcept`
/// returning a value >= required (or an error that fails the run before any backend call).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <concepts>
#include <cstddef>

#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// A growth policy. `static_assert(GrowthPolicy<ExactGrowth>);`
template <class G>
concept GrowthPolicy = requires(const G& g, std::size_t current, std::size_t required) {
    { g.next_capacity(current, required) }
    noexcept->std::same_as<Result<std::size_t>>;
};

/// Grows to exactly what the run requires: the least memory, one regrow per larger plan.
/// Ideal when shapes settle (decode).
struct ExactGrowth {
    Result<std::size_t> next_capacity(std::size_t /*current*/, std::size_t required) const noexcept { return required; }
};

/// Grows to max(required, current * Num / Den): a sequence that keeps growing (prefill)
/// regrows O(log) times instead of every step, at the cost of up to Num/Den slack. The product
/// is computed without overflow; a target beyond std::size_t is out_of_memory naming the sizes.
/// `RetainedBump<GeometricGrowth<3, 2>>`
template <std::size_t Num, std::size_t Den>
struct GeometricGrowth {
    static_assert(Den > 0 && Num > Den, "GeometricGrowth needs a factor above 1");
    Result<std::size_t> next_capacity(std::size_t current, std::size_t required) const noexcept {
        constexpr std::size_t max = static_cast<std::size_t>(-1);
        // current * Num / Den == (current / Den) * Num + (current % Den) * Num / Den, exactly.
        const std::size_t whole = current / Den, rest = current % Den;
        if (whole > max / Num || rest > max / Num || whole * Num > max - rest * Num / Den) {
            return Status(Errc::out_of_memory,
                          detail::message("geometric growth: ", current, " bytes x ", Num, "/", Den,
                                          " does not fit in size_t (plan requires ", required, " bytes)"));
        }
        const std::size_t scaled = whole * Num + rest * Num / Den;
        return scaled > required ? scaled : required;
    }
};

/// Rounds the requirement up to a multiple of `Granule` (a power of two, e.g. 2 MiB, the
/// page size of huge-page device allocators), so nearby plans share one buffer.
template <std::size_t Granule>
struct GranularGrowth {
    static_assert(Granule > 0 && (Granule & (Granule - 1)) == 0, "Granule must be a power of two");
    Result<std::size_t> next_capacity(std::size_t /*current*/, std::size_t required) const noexcept {
        const auto rounded = detail::align_up(required, Granule);
        if (!rounded) {
            return Status(Errc::invalid_argument,
                          detail::message("granular growth: ", required, " bytes cannot be rounded to ", Granule));
        }
        return *rounded;
    }
};

/// Bounds another policy by a byte cap set at construction: a plan over the cap fails fast
/// with out_of_memory ("required X bytes, cap Y") before any backend call; a grow the inner
/// policy would take past the cap is clamped to it. For deployments that need bounded memory.
/// `RetainedBump<CappedGrowth<ExactGrowth>> strategy{CappedGrowth<ExactGrowth>(64 << 20)};`
template <GrowthPolicy Inner = ExactGrowth>
class CappedGrowth {
public:
    explicit CappedGrowth(std::size_t cap_bytes, Inner inner = {}) noexcept : cap_(cap_bytes), inner_(inner) {}

    Result<std::size_t> next_capacity(std::size_t current, std::size_t required) const noexcept {
        if (required > cap_) {
            return Status(Errc::out_of_memory,
                          detail::message("retained buffer cap: required ", required, " bytes, cap ", cap_));
        }
        Result<std::size_t> next = inner_.next_capacity(current, required);
        if (!next) return next;
        return *next > cap_ ? cap_ : *next;
    }
    std::size_t cap() const noexcept { return cap_; }

private:
    std::size_t cap_;
    Inner inner_;
};

static_assert(GrowthPolicy<ExactGrowth>);
static_assert(GrowthPolicy<GeometricGrowth<3, 2>>);
static_assert(GrowthPolicy<GranularGrowth<4096>>);
static_assert(GrowthPolicy<CappedGrowth<>>);

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
