// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: how one arg of a run is treated (`check_arg`, the one predicate) and the pass that
// lays a run's staged args out by the bump rule (`PlanPass`), shared by StagingPlan, the
// Stager's staging passes and its frames, so that plan and staging never disagree. The layout
// vocabulary (PackGroup, StagingLayout) is public: plan.hpp re-exports it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "devstage/detail/layout/bump.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// Where a staged arg lives in the layout: packed small args grouped by direction, then the
/// args moved directly (all of them without packing).
enum class PackGroup : std::uint8_t { in, in_out, out, direct };

/// The regions of a run's buffer. Packed args come first, In then InOut then Out, so one copy
/// uploads [0, upload_end) and one copy brings back [copy_back_begin, copy_back_end); direct
/// args follow from `base[direct]`.
struct StagingLayout {
    std::size_t required_bytes = 0;  ///< every staged arg, aligned
    std::size_t packed_bytes = 0;    ///< the packed region is [0, packed_bytes)
    std::size_t upload_end = 0;      ///< end of the last packed In/InOut arg (0: nothing packed to upload)
    std::size_t copy_back_begin = 0;
    std::size_t copy_back_end = 0;      ///< equal to copy_back_begin when nothing packed comes back
    std::array<std::size_t, 4> base{};  ///< start of each PackGroup
};

namespace detail {

/// How one arg is treated, or why it is refused.
enum class ArgCheck : std::uint8_t { skipped, external, staged, bad_placement, bad_direction, null_data, null_device };

/// The common case of check_arg in one test: a Host arg with a valid direction, bytes and data.
constexpr bool is_staged(const TensorArg& arg) noexcept {
    // Placement::Host is 0, so placement and direction together are at most InOut (2) exactly
    // when the arg is a Host arg with a direction inside the enum.
    const unsigned key = (static_cast<unsigned>(arg.placement) << 8) | static_cast<unsigned>(arg.direction);
    return key <= static_cast<unsigned>(Direction::InOut) && arg.bytes != 0 && arg.data != nullptr;
}

/// The one predicate: zero bytes are skipped (any placement), Device args pass through, Host
/// args with bytes are staged; an enumerator outside the enum or a null pointer (host or
/// device) with bytes is refused.
constexpr ArgCheck check_arg(const TensorArg& arg) noexcept {
    if (is_staged(arg)) [[likely]]
        return ArgCheck::staged;
    if (static_cast<std::uint8_t>(arg.placement) > static_cast<std::uint8_t>(Placement::Device)) {
        return ArgCheck::bad_placement;
    }
    if (static_cast<std::uint8_t>(arg.direction) > static_cast<std::uint8_t>(Direction::InOut)) {
        return ArgCheck::bad_direction;
    }
    if (arg.bytes == 0) return ArgCheck::skipped;
    if (arg.data == nullptr) return arg.placement == Placement::Device ? ArgCheck::null_device : ArgCheck::null_data;
    if (arg.placement == Placement::Device) return ArgCheck::external;
    return ArgCheck::staged;
}

/// The packing group of a staged arg: small args (at most `pack_limit` bytes) by direction.
constexpr PackGroup group_of(const TensorArg& arg, std::size_t pack_limit) noexcept {
    if (arg.bytes > pack_limit) return PackGroup::direct;
    if (arg.direction == Direction::In) return PackGroup::in;
    return arg.direction == Direction::InOut ? PackGroup::in_out : PackGroup::out;
}

/// A pack limit that packs every staged arg (a frame).
inline constexpr std::size_t pack_everything = static_cast<std::size_t>(-1);

[[gnu::cold]] [[gnu::noinline]] inline Status plan_failure(ArgCheck check, std::size_t index, const TensorArg& arg,
                                                           std::size_t before, std::size_t alignment) noexcept {
    switch (check) {
        case ArgCheck::bad_placement:
            return Status(Errc::invalid_argument,
                          message("staging plan: arg ", index, " has placement ", static_cast<unsigned>(arg.placement),
                                  ", neither Host (0) nor Device (1)"));
        case ArgCheck::bad_direction:
            return Status(Errc::invalid_argument,
                          message("staging plan: arg ", index, " has direction ", static_cast<unsigned>(arg.direction),
                                  ", none of In (0), Out (1), InOut (2)"));
        case ArgCheck::null_data:
            return Status(Errc::invalid_argument,
                          message("staging plan: arg ", index, " has a null host pointer with ", arg.bytes, " bytes"));
        case ArgCheck::null_device:
            return Status(Errc::invalid_argument,
                          message("staging plan: arg ", index, " is Placement::Device with a null device pointer and ",
                                  arg.bytes, " bytes"));
        default:
            return Status(Errc::invalid_argument,
                          message("staging plan: total size overflows at arg ", index, " (", arg.bytes, " bytes after ",
                                  before, " bytes, alignment ", alignment, ")"));
    }
}

[[gnu::cold]] [[gnu::noinline]] inline Status bad_alignment(std::size_t alignment) noexcept {
    return Status(Errc::invalid_argument,
                  message("staging plan: alignment ", alignment, " is not a power of two (it must be 1, 2, 4, ...)"));
}

/// One pass over a run's args: validates each with check_arg, and bumps each staged arg into
/// its group at `alignment`. `visit(index, arg, group, offset_in_group)` is called per staged
/// arg; `finish()` then turns the group sizes into a StagingLayout.
struct PlanPass {
    std::array<std::size_t, 4> size{};      ///< aligned bytes per group
    std::array<std::size_t, 4> last_end{};  ///< offset in group + bytes of the group's last arg

    /// `Packs` false: every staged arg is direct (`pack_limit` is ignored), known at compile time.
    template <bool Packs, class Visit>
    Status run(std::span<const TensorArg> args, std::size_t alignment, std::size_t pack_limit, Visit&& visit) noexcept {
        std::size_t direct = size[3];  // in a register: the only group without packing
        for (std::size_t index = 0; index < args.size(); ++index) {
            const TensorArg& arg = args[index];
            const ArgCheck check = check_arg(arg);
            if (check != ArgCheck::staged) [[unlikely]] {
                if (check == ArgCheck::skipped || check == ArgCheck::external) continue;
                size[3] = direct;
                return plan_failure(check, index, arg, 0, alignment);
            }
            const std::size_t group = Packs ? static_cast<std::size_t>(group_of(arg, pack_limit))
                                            : static_cast<std::size_t>(PackGroup::direct);
            std::size_t& sum = Packs ? size[group] : direct;
            const std::size_t offset = sum;
            if (!bump(offset, arg.bytes, alignment, sum)) [[unlikely]] {
                size[3] = direct;
                return plan_failure(ArgCheck::staged, index, arg, offset, alignment);
            }
            if constexpr (Packs) last_end[group] = offset + arg.bytes;
            visit(index, arg, static_cast<PackGroup>(group), offset);
        }
        if constexpr (!Packs) size[3] = direct;
        return {};
    }

    /// The layout of the groups summed by run(); invalid_argument when they do not fit in
    /// std::size_t together.
    Result<StagingLayout> finish() const noexcept {
        StagingLayout layout;
        std::size_t end = 0;
        for (std::size_t group = 0; group < size.size(); ++group) {  // in packed order
            layout.base[group] = end;
            if (__builtin_add_overflow(end, size[group], &end)) {
                return Status(Errc::invalid_argument, message("staging plan: total size overflows (",
                                                              layout.base[group], " + ", size[group], " bytes)"));
            }
        }
        layout.required_bytes = end;
        layout.packed_bytes = layout.base[3];
        const auto in = static_cast<std::size_t>(PackGroup::in);
        const auto in_out = static_cast<std::size_t>(PackGroup::in_out);
        const auto out = static_cast<std::size_t>(PackGroup::out);
        layout.upload_end = size[in_out] != 0 ? layout.base[in_out] + last_end[in_out] : last_end[in];
        layout.copy_back_begin = size[in_out] != 0 ? layout.base[in_out] : layout.base[out];
        layout.copy_back_end = size[out] != 0      ? layout.base[out] + last_end[out]
                               : size[in_out] != 0 ? layout.base[in_out] + last_end[in_out]
                                                   : layout.copy_back_begin;
        return layout;
    }
};

}  // namespace detail
}  // namespace devstage
