// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// StagingPlan: which args of a run are staged, where each lands in a packed buffer, and how
/// many bytes the run needs in all.

#include <cstddef>
#include <span>
#include <vector>

#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/filter.hpp>

#include "devstage/detail/align.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// One staged arg: its index in the run's arg list and its packed place.
struct PlannedTensor {
    std::size_t arg_index;
    std::size_t offset;  ///< from the buffer's aligned base; a multiple of the plan's alignment
    std::size_t bytes;
};

/// The packed layout of a run's staged args at one alignment.
/// `auto plan = StagingPlan::build(args, 1024); if (plan) use(plan->required_bytes());`
///
/// Staged: Placement::Host args with bytes > 0. Each takes `align_up(bytes, alignment)` bytes,
/// so `required_bytes()` is the prefix sum of the aligned sizes. Placement::Device and
/// zero-byte args are not staged. A null host pointer with bytes > 0, and a total that does
/// not fit in std::size_t, are invalid_argument.
class StagingPlan {
public:
    StagingPlan() = default;

    /// Contract: `alignment` is a power of two.
    static Result<StagingPlan> build(std::span<const TensorArg> args, std::size_t alignment) noexcept {
        StagingPlan plan;
        if (Status status = plan.assign(args, alignment); !status) return status;
        return plan;
    }

    /// Rebuilds this plan in place, reusing its storage (no host allocation once the arg count
    /// has settled). On error the plan is left empty.
    Status assign(std::span<const TensorArg> args, std::size_t alignment) noexcept {
        // The storage only grows: writing into it by index keeps the per-run path free of
        // push_back bookkeeping.
        if (tensors_.size() < args.size()) tensors_.resize(args.size());
        count_ = 0;
        required_ = 0;
        alignment_ = alignment;
        auto staged = args | ranges::views::enumerate | ranges::views::filter([](const auto& indexed) {
                          const TensorArg& arg = indexed.second;
                          return arg.placement == Placement::Host && arg.bytes > 0;
                      });
        std::size_t end = 0;
        for (const auto& [index, arg] : staged) {
            if (arg.data == nullptr) {
                return fail(detail::message("staging plan: arg ", index, " has a null host pointer with ", arg.bytes,
                                            " bytes"));
            }
            const auto aligned = detail::align_up(arg.bytes, alignment);
            const auto next = aligned ? detail::add(end, *aligned) : std::nullopt;
            if (!next) {
                return fail(detail::message("staging plan: total size overflows at arg ", index, " (", arg.bytes,
                                            " bytes after ", end, " bytes, alignment ", alignment, ")"));
            }
            tensors_[count_++] = PlannedTensor{static_cast<std::size_t>(index), end, arg.bytes};
            end = *next;
        }
        // Null host pointers of zero-byte or device args are fine; a null Device arg with bytes
        // is the caller's business, passed through as given.
        required_ = end;
        return {};
    }

    /// The staged args, in input order.
    std::span<const PlannedTensor> tensors() const noexcept { return {tensors_.data(), count_}; }
    /// Bytes a buffer aligned to `alignment()` must hold for this run.
    std::size_t required_bytes() const noexcept { return required_; }
    std::size_t alignment() const noexcept { return alignment_; }

private:
    Status fail(std::string message) noexcept {
        count_ = 0;
        required_ = 0;
        return Status(Errc::invalid_argument, std::move(message));
    }

    std::vector<PlannedTensor> tensors_;
    std::size_t count_ = 0;
    std::size_t required_ = 0;
    std::size_t alignment_ = 1;
};

}  // namespace devstage
