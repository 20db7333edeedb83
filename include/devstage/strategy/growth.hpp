// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Growth policies for RetainedBump: given the capacity held and the bytes a run requires,
/// how large the next retained buffer is. A policy is any type with
/// `Result<std::size_t> next_capacity(std::size_t current, std::size_t required) const noexcept`
/// returning a value >= required (or an error that fails the run before any backend call).
/// Each rule is implemented once (detail::*_capacity): the compile-time policies and GrowthRule,
/// the same rules with parameters chosen at run time, call the same arithmetic.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "devstage/detail/layout/bump.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// A growth policy. `static_assert(GrowthPolicy<ExactGrowth>);`
template <class G>
concept GrowthPolicy = requires(const G& g, std::size_t current, std::size_t required) {
    { g.next_capacity(current, required) }
    noexcept->std::same_as<Result<std::size_t>>;
};

/// The order of a grow. `allocate_first` keeps the old buffer until the new one exists (the
/// grow is transactional where memory allows; the device briefly holds both). `free_first`
/// frees the old buffer before allocating (the least peak memory: for a device near full).
enum class GrowOrder : std::uint8_t { allocate_first, free_first };

namespace detail {

/// max(required, current * num / den), computed exactly without overflow (num > den > 0); a
/// product beyond std::size_t is out_of_memory naming the sizes.
inline Result<std::size_t> geometric_capacity(std::size_t current, std::size_t required, std::size_t num,
                                              std::size_t den) noexcept {
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    // current * num / den == (current / den) * num + (current % den) * num / den, exactly.
    const std::size_t whole = current / den, rest = current % den;
    if (whole > max / num || rest > max / num || whole * num > max - rest * num / den) {
        return Status(Errc::out_of_memory, message("geometric growth: ", current, " bytes x ", num, "/", den,
                                                   " does not fit in size_t (plan requires ", required, " bytes)"));
    }
    const std::size_t scaled = whole * num + rest * num / den;
    return scaled > required ? scaled : required;
}

/// `required` rounded up to a multiple of `granule` (a power of two).
inline Result<std::size_t> granular_capacity(std::size_t required, std::size_t granule) noexcept {
    const auto rounded = align_up(required, granule);
    if (!rounded) {
        return Status(Errc::invalid_argument,
                      message("granular growth: ", required, " bytes cannot be rounded to ", granule));
    }
    return *rounded;
}

/// `next` (an inner policy's answer for `required`) bounded by `cap`: a requirement over the cap
/// is out_of_memory, an answer over it is clamped to it.
inline Result<std::size_t> capped_capacity(Result<std::size_t> next, std::size_t required, std::size_t cap) noexcept {
    if (required > cap) {
        return Status(Errc::out_of_memory, message("retained buffer cap: required ", required, " bytes, cap ", cap));
    }
    if (!next) return next;
    return *next > cap ? cap : *next;
}

}  // namespace detail

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
        return detail::geometric_capacity(current, required, Num, Den);
    }
};

/// Rounds the requirement up to a multiple of `Granule` (a power of two, e.g. 2 MiB, the
/// page size of huge-page device allocators), so nearby plans share one buffer.
template <std::size_t Granule>
struct GranularGrowth {
    static_assert(Granule > 0 && (Granule & (Granule - 1)) == 0, "Granule must be a power of two");
    Result<std::size_t> next_capacity(std::size_t /*current*/, std::size_t required) const noexcept {
        return detail::granular_capacity(required, Granule);
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
        if (required > cap_) return detail::capped_capacity(required, required, cap_);
        return detail::capped_capacity(inner_.next_capacity(current, required), required, cap_);
    }
    std::size_t cap() const noexcept { return cap_; }

private:
    std::size_t cap_;
    Inner inner_;
};

/// The growth rules above with their parameters chosen at run time (from a configuration, the C
/// interface, Python), and an optional cap. The same arithmetic as the compile-time policies.
/// `RetainedBump<GrowthRule> strategy(*GrowthRule::geometric(3, 2));`
class GrowthRule {
public:
    enum class Kind : std::uint8_t { exact, geometric, granular };

    /// ExactGrowth, uncapped (the default).
    constexpr GrowthRule() noexcept = default;
    static constexpr GrowthRule exact() noexcept { return GrowthRule(); }
    /// GeometricGrowth<num, den>; invalid_argument unless num > den > 0.
    static Result<GrowthRule> geometric(std::size_t num, std::size_t den) noexcept {
        if (den == 0 || num <= den) {
            return Status(Errc::invalid_argument, detail::message("geometric growth ", num, "/", den,
                                                                  " is not a factor above 1 (numerator > denominator "
                                                                  "> 0)"));
        }
        GrowthRule rule;
        rule.kind_ = Kind::geometric;
        rule.num_ = num;
        rule.den_ = den;
        return rule;
    }
    /// GranularGrowth<granule>; invalid_argument unless granule is a power of two.
    static Result<GrowthRule> granular(std::size_t granule) noexcept {
        if (granule == 0 || (granule & (granule - 1)) != 0) {
            return Status(Errc::invalid_argument,
                          detail::message("growth granule ", granule, " is not a power of two"));
        }
        GrowthRule rule;
        rule.kind_ = Kind::granular;
        rule.granule_ = granule;
        return rule;
    }
    /// This rule bounded as CappedGrowth bounds its inner policy (cap 0: no cap).
    constexpr GrowthRule capped(std::size_t cap_bytes) const noexcept {
        GrowthRule rule = *this;
        rule.cap_ = cap_bytes;
        return rule;
    }

    Result<std::size_t> next_capacity(std::size_t current, std::size_t required) const noexcept {
        if (cap_ != 0 && required > cap_) return detail::capped_capacity(required, required, cap_);
        Result<std::size_t> next = required;
        if (kind_ == Kind::geometric) next = detail::geometric_capacity(current, required, num_, den_);
        if (kind_ == Kind::granular) next = detail::granular_capacity(required, granule_);
        return cap_ != 0 ? detail::capped_capacity(next, required, cap_) : next;
    }

    constexpr Kind kind() const noexcept { return kind_; }
    constexpr std::size_t numerator() const noexcept { return num_; }
    constexpr std::size_t denominator() const noexcept { return den_; }
    constexpr std::size_t granule() const noexcept { return granule_; }
    /// 0: no cap.
    constexpr std::size_t cap() const noexcept { return cap_; }

private:
    Kind kind_ = Kind::exact;
    std::size_t num_ = 1, den_ = 1, granule_ = 1, cap_ = 0;
};

static_assert(GrowthPolicy<ExactGrowth>);
static_assert(GrowthPolicy<GeometricGrowth<3, 2>>);
static_assert(GrowthPolicy<GranularGrowth<4096>>);
static_assert(GrowthPolicy<CappedGrowth<>>);
static_assert(GrowthPolicy<GrowthRule>);

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
