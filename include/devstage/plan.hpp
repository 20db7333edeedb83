// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// StagingPlan: which args of a run are staged, where each lands in the run's device buffer,
/// and how many bytes the run needs in all. The one predicate that decides how an arg is
/// treated and the one layout rule (detail/layout/) are those the Stager's staging passes use,
/// so plan and staging can never disagree.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <bit>
#include <cstddef>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "devstage/detail/layout/plan_pass.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// One staged arg: its index in the run's arg list and its place in the buffer.
struct PlannedTensor {
    std::size_t arg_index;
    std::size_t offset;  ///< from the buffer's aligned base; a multiple of the plan's alignment
    std::size_t bytes;
    Direction direction = Direction::InOut;
    PackGroup group = PackGroup::direct;
};

/// The layout of a run's staged args at one alignment, small args optionally packed.
/// `auto plan = StagingPlan::build(args, 1024); if (plan) use(plan->required_bytes());`
///
/// Staged: Placement::Host args with bytes > 0. Each takes `align_up(bytes, alignment)` bytes.
/// Without packing (`pack_limit` 0) they are laid out in input order from offset 0, so
/// `required_bytes()` is the prefix sum of the aligned sizes. With a `pack_limit`, args of at
/// most that many bytes come first, grouped In, InOut, Out (see StagingLayout), then the rest in
/// input order. Placement::Device and zero-byte args are not staged. A null host pointer with
/// bytes > 0, a placement or direction outside its enum, an alignment that is not a power of
/// two, and a total that does not fit in std::size_t are invalid_argument.
class StagingPlan {
public:
    StagingPlan() = default;

    static Result<StagingPlan> build(std::span<const TensorArg> args, std::size_t alignment,
                                     std::size_t pack_limit = 0) noexcept {
        StagingPlan plan;
        if (Status status = plan.assign(args, alignment, pack_limit); !status) return status;
        return plan;
    }

    /// Rebuilds this plan in place, reusing its storage (no host allocation once the arg count
    /// has settled). On error the plan is left empty.
    Status assign(std::span<const TensorArg> args, std::size_t alignment, std::size_t pack_limit = 0) noexcept {
        clear();
        if (!std::has_single_bit(alignment)) return detail::bad_alignment(alignment);
        if (Status grown = reserve(args.size()); !grown) return grown;
        detail::PlanPass pass;
        const auto keep = [this](std::size_t index, const TensorArg& arg, PackGroup group, std::size_t offset) {
            tensors_[count_++] = PlannedTensor{index, offset, arg.bytes, arg.direction, group};
        };
        Status status = pack_limit > 0 ? pass.run<true>(args, alignment, pack_limit, keep)
                                       : pass.run<false>(args, alignment, 0, keep);
        Result<StagingLayout> layout = status.ok() ? pass.finish() : Result<StagingLayout>(status);
        if (!layout) {
            clear();
            return layout.status();
        }
        layout_ = *layout;
        alignment_ = alignment;
        for (PlannedTensor& tensor : planned()) tensor.offset += layout_.base[static_cast<std::size_t>(tensor.group)];
        return {};
    }

    /// The staged args, in input order.
    std::span<const PlannedTensor> tensors() const noexcept { return {tensors_.data(), count_}; }
    /// Bytes a buffer aligned to `alignment()` must hold for this run.
    std::size_t required_bytes() const noexcept { return layout_.required_bytes; }
    const StagingLayout& layout() const noexcept { return layout_; }
    std::size_t alignment() const noexcept { return alignment_; }

private:
    std::span<PlannedTensor> planned() noexcept { return {tensors_.data(), count_}; }

    void clear() noexcept {
        count_ = 0;
        layout_ = {};
    }

    // The storage only grows: writing into it by index keeps the per-run path free of
    // push_back bookkeeping.
    Status reserve(std::size_t count) noexcept {
        if (tensors_.size() >= count) return {};
#if defined(__cpp_exceptions)
        try {
            tensors_.resize(count);
        } catch (const std::bad_alloc&) {
            return Status(Errc::out_of_memory, detail::message("staging plan: host memory for ", count,
                                                               " planned tensors could not be allocated"));
        }
#else
        tensors_.resize(count);
#endif
        return {};
    }

    std::vector<PlannedTensor> tensors_;
    std::size_t count_ = 0;
    StagingLayout layout_;
    std::size_t alignment_ = 1;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
