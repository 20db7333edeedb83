// SPDX-License-Identifier: Apache-2.0
// From a devstage_stager_config to one of the stagers the library is built with: the config is
// checked field by field, then the strategy it names is made.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

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

template <class Value>
Status bad(const char* field, Value value, const char* why, const AnyBackend& backend) {
    return Status(Errc::invalid_argument, detail::message("devstage_stager_create: ", field, " ", value, " ", why,
                                                          " (backend '", backend.name(), "')"));
}

Result<Growth> growth_of(const devstage_stager_config& c, const AnyBackend& backend) {
    const std::size_t cap = c.growth_cap != 0 ? c.growth_cap : std::numeric_limits<std::size_t>::max();
    switch (c.growth) {
        case DEVSTAGE_GROWTH_EXACT:
            return Growth(cap);
        case DEVSTAGE_GROWTH_GEOMETRIC:
            if (c.growth_denominator == 0 || c.growth_numerator <= c.growth_denominator) {
                return Status(Errc::invalid_argument,
                              detail::message("devstage_stager_create: geometric growth ", c.growth_numerator, "/",
                                              c.growth_denominator,
                                              " is not a factor above 1 (numerator > denominator > 0) (backend '",
                                              backend.name(), "')"));
            }
            return Growth(cap,
                          RuntimeGrowth(RuntimeGrowth::Kind::geometric, c.growth_numerator, c.growth_denominator, 1));
        case DEVSTAGE_GROWTH_GRANULAR:
            if (c.growth_granule == 0 || (c.growth_granule & (c.growth_granule - 1)) != 0) {
                return bad("growth_granule", c.growth_granule, "is not a power of two", backend);
            }
            return Growth(cap, RuntimeGrowth(RuntimeGrowth::Kind::granular, 1, 1, c.growth_granule));
    }
    return bad("growth", c.growth,
               "is not DEVSTAGE_GROWTH_EXACT, DEVSTAGE_GROWTH_GEOMETRIC or DEVSTAGE_GROWTH_GRANULAR", backend);
}

// The stager of the strategy `c` names, output policy aside.
Result<std::unique_ptr<AnyStager>> make_strategy(AnyBackend& backend, const devstage_stager_config& c) {
    if (c.strategy == DEVSTAGE_STRATEGY_PER_TENSOR) {
        if (c.pack_limit != 0) {
            return bad("pack_limit", c.pack_limit,
                       "needs the retained strategy (the per-tensor strategy packs nothing)", backend);
        }
        if (c.growth != DEVSTAGE_GROWTH_EXACT || c.growth_cap != 0 || c.grow_order != DEVSTAGE_GROW_ALLOCATE_FIRST) {
            return Status(Errc::invalid_argument,
                          detail::message("devstage_stager_create: growth, growth_cap and grow_order apply to the "
                                          "retained strategy; the per-tensor strategy allocates per arg (backend '",
                                          backend.name(), "')"));
        }
        return make_stager_of(backend, PerTensor{}, c.pipeline_slots);
    }
    if (c.strategy != DEVSTAGE_STRATEGY_RETAINED) {
        return bad("strategy", c.strategy, "is not DEVSTAGE_STRATEGY_RETAINED or DEVSTAGE_STRATEGY_PER_TENSOR",
                   backend);
    }
    if (c.grow_order != DEVSTAGE_GROW_ALLOCATE_FIRST && c.grow_order != DEVSTAGE_GROW_FREE_FIRST) {
        return bad("grow_order", c.grow_order, "is not DEVSTAGE_GROW_ALLOCATE_FIRST or DEVSTAGE_GROW_FREE_FIRST",
                   backend);
    }
    Result<Growth> growth = growth_of(c, backend);
    if (!growth) return growth.status();
    const GrowOrder order =
        c.grow_order == DEVSTAGE_GROW_FREE_FIRST ? GrowOrder::free_first : GrowOrder::allocate_first;
    if (c.pack_limit != 0 && !backend.has_pinned()) {
        return Status(Errc::not_supported, detail::message("devstage_stager_create: pack_limit ", c.pack_limit,
                                                           " needs pinned host memory for the packed mirror; backend '",
                                                           backend.name(), "' has none"));
    }
    switch (c.pack_limit) {
        case 0:
            return make_stager_of(backend, Retained(*growth, order), c.pipeline_slots);
        case DEVSTAGE_PACK_LIMIT_4K:
            return make_stager_of(backend, Packed<DEVSTAGE_PACK_LIMIT_4K>(*growth, order), c.pipeline_slots);
        case DEVSTAGE_PACK_LIMIT_16K:
            return make_stager_of(backend, Packed<DEVSTAGE_PACK_LIMIT_16K>(*growth, order), c.pipeline_slots);
        case DEVSTAGE_PACK_LIMIT_64K:
            return make_stager_of(backend, Packed<DEVSTAGE_PACK_LIMIT_64K>(*growth, order), c.pipeline_slots);
        default:
            return bad("pack_limit", c.pack_limit,
                       "is not 0, 4096, 16384 or 65536 (the limits this library is built with)", backend);
    }
}

}  // namespace

Result<std::unique_ptr<AnyStager>> make_stager(AnyBackend& backend, const devstage_stager_config* config) {
    const devstage_stager_config c = config != nullptr ? *config : devstage_stager_config{};
    if (c.output_policy != DEVSTAGE_OUTPUT_ZERO && c.output_policy != DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL) {
        return bad("output_policy", c.output_policy, "is not DEVSTAGE_OUTPUT_ZERO or DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL",
                   backend);
    }
    Result<std::unique_ptr<AnyStager>> made = make_strategy(backend, c);
    if (made) {
        (*made)->set_output_policy(c.output_policy == DEVSTAGE_OUTPUT_ZERO ? OutputPolicy::zero
                                                                           : OutputPolicy::kernel_writes_all);
    }
    return made;
}

}  // namespace devstage::capi
