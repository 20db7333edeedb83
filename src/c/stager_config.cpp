// SPDX-License-Identifier: Apache-2.0
// From a devstage_stager_config to one of the stagers the library is built with: the config is
// checked field by field, then the stager of the strategy kind it names is made with the
// config's options.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "any_stager.hpp"
#include "devstage/detail/util/message.hpp"

namespace devstage::capi {

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

const char* strategy_name(devstage_strategy strategy) noexcept {
    return strategy == DEVSTAGE_STRATEGY_PER_TENSOR ? "per-tensor" : "retained_vmm";
}

// Checks every field of `c`; the growth rule when the config is valid.
Result<GrowthRule> checked(const devstage_stager_config& c, const AnyBackend& backend, Problems& problems) {
    GrowthRule growth;
    const bool retained = c.strategy == DEVSTAGE_STRATEGY_RETAINED;
    if (!retained && c.strategy != DEVSTAGE_STRATEGY_PER_TENSOR && c.strategy != DEVSTAGE_STRATEGY_RETAINED_VMM) {
        problems.invalid("strategy ", c.strategy,
                         " is not DEVSTAGE_STRATEGY_RETAINED, DEVSTAGE_STRATEGY_PER_TENSOR or "
                         "DEVSTAGE_STRATEGY_RETAINED_VMM");
    }
    const bool known =
        retained || c.strategy == DEVSTAGE_STRATEGY_PER_TENSOR || c.strategy == DEVSTAGE_STRATEGY_RETAINED_VMM;
    if (c.pack_limit != 0 && known && !retained) {
        problems.invalid("pack_limit ", c.pack_limit, " needs the retained strategy (the ", strategy_name(c.strategy),
                         " strategy packs nothing)");
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
    if (c.strategy == DEVSTAGE_STRATEGY_RETAINED_VMM &&
        (c.growth != DEVSTAGE_GROWTH_EXACT || c.grow_order != DEVSTAGE_GROW_ALLOCATE_FIRST)) {
        problems.invalid(
            "growth and grow_order apply to the retained strategy; the retained_vmm strategy grows in place "
            "(growth_cap "
            "bounds its reservation)");
    }
    switch (c.growth) {
        case DEVSTAGE_GROWTH_EXACT:
            break;
        case DEVSTAGE_GROWTH_GEOMETRIC:
            if (Result<GrowthRule> rule = GrowthRule::geometric(c.growth_numerator, c.growth_denominator); !rule) {
                problems.invalid("geometric growth ", c.growth_numerator, "/", c.growth_denominator,
                                 " is not a factor above 1 (numerator > denominator > 0)");
            } else {
                growth = *rule;
            }
            break;
        case DEVSTAGE_GROWTH_GRANULAR:
            if (Result<GrowthRule> rule = GrowthRule::granular(c.growth_granule); !rule) {
                problems.invalid("growth_granule ", c.growth_granule, " is not a power of two");
            } else {
                growth = *rule;
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
    if (c.map_small != 0 && c.pack_limit == 0) {
        problems.invalid("map_small ", c.map_small, " needs a pack_limit above 0 (the small args it maps)");
    }
    if (c.pack_limit != 0 && !backend.has_pinned()) {
        problems.unsupported("pack_limit ", c.pack_limit, " needs pinned host memory for the packed mirror; backend '",
                             backend.name(), "' has none");
    }
    if (c.strategy == DEVSTAGE_STRATEGY_RETAINED_VMM && !backend.has_vmm()) {
        problems.unsupported("the retained_vmm strategy needs virtual memory to grow in place; backend '",
                             backend.name(), "' has none");
    }
    if (problems.any()) return problems.status(backend);
    return c.growth_cap != 0 && retained ? growth.capped(c.growth_cap) : growth;
}

// The stager of the strategy `c` (valid) names, with its options.
std::unique_ptr<AnyStager> make_strategy(AnyBackend& backend, const devstage_stager_config& c,
                                         const GrowthRule& growth) {
    const StagerOptions options{
        .pipeline_slots = c.pipeline_slots,
        .outputs = c.output_policy == DEVSTAGE_OUTPUT_ZERO ? OutputPolicy::zero : OutputPolicy::kernel_writes_all,
        .pack_limit = c.pack_limit,
        .map_small = c.map_small != 0};
    switch (c.strategy) {
        case DEVSTAGE_STRATEGY_PER_TENSOR:
            return make_stager_of(backend, PerTensor{}, options);
        case DEVSTAGE_STRATEGY_RETAINED_VMM:
            return make_stager_of(backend, c.growth_cap != 0 ? Vmm(c.growth_cap) : Vmm(), options);
        default:
            return make_stager_of(
                backend,
                Retained(growth,
                         c.grow_order == DEVSTAGE_GROW_FREE_FIRST ? GrowOrder::free_first : GrowOrder::allocate_first),
                options);
    }
}

}  // namespace

Result<std::unique_ptr<AnyStager>> make_stager(AnyBackend& backend, const devstage_stager_config* config) {
    const devstage_stager_config c = config != nullptr ? *config : devstage_stager_config{};
    Problems problems;
    Result<GrowthRule> growth = checked(c, backend, problems);
    if (!growth) return growth.status();
    return make_strategy(backend, c, *growth);
}

}  // namespace devstage::capi
