// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: what a Stager's components share — the backend and its stream view, the slots, the
// counters, the error sink, the run-time options, the pageable ring — and the small helpers
// every component uses. It holds state and no rules: the rules are in the components
// (settle.hpp, hazards.hpp, select.hpp, bind.hpp, finish.hpp, release.hpp), which the Stager
// makes over one core and calls.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/completion.hpp"
#include "devstage/detail/schedule/run_order.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/stager/slot.hpp"
#include "devstage/detail/transfer/pinned_ring.hpp"
#include "devstage/detail/transfer/transfers.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/output_policy.hpp"
#include "devstage/stager_options.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/stream.hpp"

namespace devstage::detail {

/// A backend that declares a Stream type means to be an AsyncBackend: one that misses an
/// operation must not be staged synchronously without a word.
template <class B>
consteval bool streams_complete() {
    if constexpr (requires { typename B::Stream; }) {
        static_assert(AsyncBackend<B>,
                      "the backend declares a Stream type but does not model devstage::AsyncBackend (see the "
                      "unsatisfied operation below): add it, or the backend would stage synchronously");
    }
    return true;
}

/// A strategy the Stager can use: a StagingStrategy, with `acquire` where it allocates per
/// tensor, and over pinned memory where its packing policy packs by default.
template <class S, class B>
consteval bool strategy_complete() {
    static_assert(StagingStrategy<S, B>, "the strategy does not model devstage::StagingStrategy for this backend");
    if constexpr (StagingStrategy<S, B>) {
        if constexpr (S::lease_kind == ReleaseKind::Free) {
            static_assert(strategy_requires::acquire<S, B>,
                          "a strategy of ReleaseKind::Free needs acquire (see the unsatisfied operation below)");
        }
        static_assert(pack_limit_of<S>() == 0 || PinnedHostBackend<B>,
                      "PackSmall needs a PinnedHostBackend: the packed mirror is page-locked host memory "
                      "(pinned_malloc/pinned_free), which is what lets one copy each way move a run's small args");
    }
    return true;
}

template <class B, class Strategy>
struct StagerCore {
    using Async = stream_backend_t<B>;
    using Stream = typename Async::Stream;
    using Slot = StagerSlot<Strategy, Async>;
    using Moves = Transfers<B, Strategy, Async>;
    static constexpr bool retained = Strategy::lease_kind == ReleaseKind::BufferNoop;
    static constexpr bool immediate = is_immediate_v<Async>;
    /// Packing, mapping and frames are possible: a strategy with a mirror over pinned memory.
    static constexpr bool mirrored = MirroredStrategy<Strategy, B> && PinnedHostBackend<B>;

    struct NoAdapter {
        explicit NoAdapter(B& /*backend*/) noexcept {}
    };
    using Adapter = std::conditional_t<AsyncBackend<B>, NoAdapter, Async>;
    struct NoRing {
        explicit operator bool() const noexcept { return false; }
        void* get() const noexcept { return nullptr; }
    };
    using Ring = std::conditional_t<PinnedHostBackend<B>, std::unique_ptr<PinnedRing<B, Async>>, NoRing>;

    explicit StagerCore(B& b) noexcept : backend(&b), adapter(b) {}

    B* backend;
    [[no_unique_address]] Adapter adapter;
    std::vector<Slot> slots;
    StagerStats stats;
    ErrorSink sink;
    Ring ring{};
    std::size_t ring_threshold = std::numeric_limits<std::size_t>::max();  // max: no ring
    std::optional<Stream> own_stream;
    std::uint64_t ticks = 0;
    Status broken;                    // why the stager has no slot
    std::optional<HostBox> bind_box;  // of the args being bound, computed once per bind call
    OutputPolicy outputs = OutputPolicy::zero;
    std::size_t pack_limit = 0;  // 0: no packing (always, without a mirror)
    bool map_small = false;
    CompletionOwner* completions = nullptr;  // the stager's, for the results of settled runs

    Async& async() noexcept {
        if constexpr (AsyncBackend<B>) {
            return *backend;
        } else {
            return adapter;
        }
    }
    Moves moves() noexcept {
        return Moves(*backend, async(), stats, static_cast<RingOf<B, Async>*>(ring.get()), ring_threshold);
    }
    /// Takes `options` (unset ones from the strategy's defaults) and makes the slots, each with
    /// its copy of `strategy`; on a refusal the stager keeps no slot and `broken` says why.
    void configure(const StagerOptions& options, Strategy strategy, std::size_t max_slots) noexcept {
        outputs = options.outputs;
        pack_limit = options.pack_limit.value_or(pack_limit_of<Strategy>());
        map_small = pack_limit > 0 && options.map_small.value_or(maps_of<Strategy>());
        const std::size_t count = options.pipeline_slots > 0 ? options.pipeline_slots : 1;
        if (Status refused = refusal(options, count, max_slots); !refused) {
            broken = Status(refused.code(), with_backend(refused.message()));
            return;
        }
        if constexpr (strategy_requires::growth_rule<Strategy>) {
            if (options.growth) strategy.set_growth(*options.growth);
        }
        if constexpr (strategy_requires::grow_order<Strategy>) {
            if (options.grow_order) strategy.set_grow_order(*options.grow_order);
        }
        if (!make_slots(slots, count, std::move(strategy))) {
            broken = Status(Errc::out_of_memory,
                            with_backend(message("stager: host memory for ", count, " pipeline slots")));
        }
    }

    /// The stream of synchronous calls: the immediate one, or the stager's own, made at first use.
    Result<Stream> synchronous_stream() noexcept {
        if constexpr (immediate) {
            return Stream{};
        } else {
            if (!own_stream) {
                Result<Stream> created = async().create_stream();
                if (!created) {
                    return Status(created.status().code(), with_backend(message("stager: creating its stream failed: ",
                                                                                created.status().message())));
                }
                own_stream = *created;
            }
            return *own_stream;
        }
    }

    std::size_t index_of(const Slot& slot) const noexcept { return static_cast<std::size_t>(&slot - slots.data()); }

    std::string with_backend(std::string_view message) const { return on_backend(message, backend->name()); }
    Status busy(const char* what) const noexcept { return all_slots_busy(what, slots.size(), backend->name()); }
    Status out_of_range(const char* what, std::size_t slot) const noexcept {
        return slot_out_of_range(what, slot, slots.size(), backend->name());
    }
    std::size_t count(SlotState state) const noexcept {
        std::size_t n = 0;
        for (const Slot& slot : slots) n += slot.state == state ? 1 : 0;
        return n;
    }
    std::size_t bookkeeping_bytes() const noexcept {
        std::size_t bytes = 0;
        for (const Slot& slot : slots) bytes += slot.bookkeeping_bytes();
        return bytes;
    }
    std::size_t live_runs() const noexcept {
        std::size_t n = 0;
        for (const Slot& slot : slots) n += slot.bound() ? 1 : 0;
        return n;
    }

private:
    // Why `options` cannot be honoured, or ok.
    Status refusal(const StagerOptions& options, std::size_t count, std::size_t max_slots) const noexcept {
        if (count > max_slots) {
            return Status(Errc::invalid_argument, message("stager: ", options.pipeline_slots,
                                                          " pipeline slots asked for; at most ", max_slots));
        }
        if (pack_limit > 0 && !mirrored) {
            return Status(
                Errc::not_supported,
                message("stager: pack limit ", pack_limit,
                        PinnedHostBackend<B> ? " needs a strategy with a pinned mirror (MirroredStrategy)"
                                             : " needs pinned host memory for the mirror; the backend has none"));
        }
        if (options.map_small.value_or(false) && pack_limit == 0) {
            return Status(Errc::invalid_argument, "stager: map_small needs a pack limit above 0 (small args to map)");
        }
        if (options.growth && !strategy_requires::growth_rule<Strategy>) {
            return Status(
                Errc::invalid_argument,
                "stager: a growth rule needs a strategy that takes one at run time (RetainedBump<GrowthRule>)");
        }
        if (options.grow_order && !strategy_requires::grow_order<Strategy>) {
            return Status(Errc::invalid_argument, "stager: a grow order needs a retained strategy that grows");
        }
        return {};
    }
};

}  // namespace devstage::detail
