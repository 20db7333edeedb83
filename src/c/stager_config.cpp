// SPDX-License-Identifier: Apache-2.0
// From a devstage_stager_config to one of the stagers the library is built with: the config is
// checked field by field, then the strategy it names is made.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "any_stager.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"

namespace devstage::capi {

Result<std::size_t> RuntimeGrowth::next_capacity(std::size_t current, std::size_t required) const noexcept {
    switch (kind_) {
        case Kind::exact:
            return required;
        case Kind::geometric: {
            __extension__ using Wide = unsigned __int128;  // current * numerator_ cannot overflow it
            const Wide scaled = static_cast<Wide>(current) * numerator_ / denominator_;
            if (scaled > std::numeric_limits<std::size_t>::max()) {
                return Status(Errc::out_of_memory,
                              detail::message("geometric growth: ", current, " bytes x ", numerator_, "/", denominator_,
                                              " does not fit in size_t (plan requires ", required, " bytes)"));
            }
            const auto next = static_cast<std::size_t>(scaled);
            return next > required ? next : required;
        }
        case Kind::granular: {
            const auto rounded = detail::align_up(required, granule_);
            if (!rounded) {
                return Status(Errc::invalid_argument,
                              detail::message("granular growth: ", required, " bytes cannot be rounded to ", granule_));
            }
            return *rounded;
        }
    }
    return required;
}

namespace {

// Every error of a config, collected: the message names them all, in field order.
class Problems {
public:
    template <class... Parts>
    void invalid(const Parts&... parts) {
        add(detail::message(parts...));
        invalid_ = true;
    }
    template <class... Parts>
    void unsupported(const Parts&... parts) {
        add(detail::message(parts...));
    }
    bool any() const noexcept { return !text_.empty(); }
    // not_supported only when that is all that is wrong.
    Status status(const AnyBackend& backend) const {
        return Status(invalid_ ? Errc::invalid_argument : Errc::not_supported,
                      detail::message("devstage_stager_create: ", text_, " (backend '", backend.name(), "')"));
    }

private:
    void add(const std::string& problem) { text_ += text_.empty() ? problem : "; " + problem; }
    std::string text_;
    bool invalid_ = false;
};

bool retained(const devstage_stager_config& c) noexcept {
    return c.strategy == DEVSTAGE_STRATEGY_RETAINED;
}

// Checks every field of `c`; the growth policy when the config is valid.
Result<Growth> checked(const devstage_stager_config& c, const AnyBackend& backend, Problems& problems) {
    Growth growth(c.growth_cap != 0 ? c.growth_cap : std::numeric_limits<std::size_t>::max());
    if (c.strategy != DEVSTAGE_STRATEGY_RETAINED && c.strategy != DEVSTAGE_STRATEGY_PER_TENSOR) {
        problems.invalid("strategy ", c.strategy, " is not DEVSTAGE_STRATEGY_RETAINED or DEVSTAGE_STRATEGY_PER_TENSOR");
    }
    const bool known_limit = c.pack_limit == 0 || c.pack_limit == DEVSTAGE_PACK_LIMIT_4K ||
                             c.pack_limit == DEVSTAGE_PACK_LIMIT_16K || c.pack_limit == DEVSTAGE_PACK_LIMIT_64K;
    if (!known_limit) {
        problems.invalid("pack_limit ", c.pack_limit,
                         " is not 0, 4096, 16384 or 65536 (the limits this library is built with)");
    }
    if (c.pack_limit != 0 && c.strategy == DEVSTAGE_STRATEGY_PER_TENSOR) {
        problems.invalid("pack_limit ", c.pack_limit,
                         " needs the retained strategy (the per-tensor strategy packs nothing)");
    }
    if (c.pipeline_slots > max_pipeline_slots) {
        problems.invalid(c.pipeline_slots, " pipeline slots asked for; at most ", max_pipeline_slots);
    }
    if (c.strategy == DEVSTAGE_STRATEGY_PER_TENSOR &&
        (c.growth != DEVSTAGE_GROWTH_EXACT || c.growth_cap != 0 || c.grow_order != DEVSTAGE_GROW_ALLOCATE_FIRST)) {
        problems.invalid(
            "growth, growth_cap and grow_order apply to the retained strategy; the per-tensor strategy allocates per "
            "arg");
    }
    switch (c.growth) {
        case DEVSTAGE_GROWTH_EXACT:
            break;
        case DEVSTAGE_GROWTH_GEOMETRIC:
            if (c.growth_denominator == 0 || c.growth_numerator <= c.growth_denominator) {
                problems.invalid("geometric growth ", c.growth_numerator, "/", c.growth_denominator,
                                 " is not a factor above 1 (numerator > denominator > 0)");
            } else {
                growth = Growth(growth.cap(), RuntimeGrowth(RuntimeGrowth::Kind::geometric, c.growth_numerator,
                                                            c.growth_denominator, 1));
            }
            break;
        case DEVSTAGE_GROWTH_GRANULAR:
            if (c.growth_granule == 0 || (c.growth_granule & (c.growth_granule - 1)) != 0) {
                problems.invalid("growth_granule ", c.growth_granule, " is not a power of two");
            } else {
                growth = Growth(growth.cap(), RuntimeGrowth(RuntimeGrowth::Kind::granular, 1, 1, c.growth_granule));
            }
            break;
        default:
            problems.invalid("growth ", c.growth,
                             " is not DEVSTAGE_GROWTH_EXACT, DEVSTAGE_GROWTH_GEOMETRIC or DEVSTAGE_GROWTH_GRANULAR");
    }
    if (c.grow_order != DEVSTAGE_GROW_ALLOCATE_FIRST && c.grow_order != DEVSTAGE_GROW_FREE_FIRST) {
        problems.invalid("grow_order ", c.grow_order,
                         " is not DEVSTAGE_GROW_ALLOCATE_FIRST or DEVSTAGE_GROW_FREE_FIRST");
    }
    if (c.output_policy != DEVSTAGE_OUTPUT_ZERO && c.output_policy != DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL) {
        problems.invalid("output_policy ", c.output_policy,
                         " is not DEVSTAGE_OUTPUT_ZERO or DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL");
    }
    if (c.pack_limit != 0 && !backend.has_pinned()) {
        problems.unsupported("pack_limit ", c.pack_limit, " needs pinned host memory for the packed mirror; backend '",
                             backend.name(), "' has none");
    }
    if (problems.any()) return problems.status(backend);
    return growth;
}

// The stager of the strategy `c` (valid) names, output policy aside.
std::unique_ptr<AnyStager> make_strategy(AnyBackend& backend, const devstage_stager_config& c, const Growth& growth) {
    if (!retained(c)) return make_stager_of(backend, PerTensor{}, c.pipeline_slots);
    const GrowOrder order =
        c.grow_order == DEVSTAGE_GROW_FREE_FIRST ? GrowOrder::free_first : GrowOrder::allocate_first;
    switch (c.pack_limit) {
        case DEVSTAGE_PACK_LIMIT_4K:
            return make_stager_of(backend, Packed<DEVSTAGE_PACK_LIMIT_4K>(growth, order), c.pipeline_slots);
        case DEVSTAGE_PACK_LIMIT_16K:
            return make_stager_of(backend, Packed<DEVSTAGE_PACK_LIMIT_16K>(growth, order), c.pipeline_slots);
        case DEVSTAGE_PACK_LIMIT_64K:
            return make_stager_of(backend, Packed<DEVSTAGE_PACK_LIMIT_64K>(growth, order), c.pipeline_slots);
        default:
            return make_stager_of(backend, Retained(growth, order), c.pipeline_slots);
    }
}

}  // namespace

Result<std::unique_ptr<AnyStager>> make_stager(AnyBackend& backend, const devstage_stager_config* config) {
    const devstage_stager_config c = config != nullptr ? *config : devstage_stager_config{};
    Problems problems;
    Result<Growth> growth = checked(c, backend, problems);
    if (!growth) return growth.status();
    std::unique_ptr<AnyStager> made = make_strategy(backend, c, *growth);
    made->set_output_policy(c.output_policy == DEVSTAGE_OUTPUT_ZERO ? OutputPolicy::zero
                                                                    : OutputPolicy::kernel_writes_all);
    return made;
}

}  // namespace devstage::capi
