// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the frame storage of one pipeline slot — the args of the frame it handed out (laid
// out in the mirror by the bump rule, every host tensor packed) — and how the args of a bind
// are recognized as a slot's frame, a stale one, or a changed copy of one.

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "devstage/detail/layout/bump.hpp"
#include "devstage/detail/layout/plan_pass.hpp"
#include "devstage/detail/stager/messages.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/storage.hpp"
#include "devstage/frame.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

struct FrameStore {
    std::vector<TensorArg> args;                  // only grows; kept by release(): frames point here
    std::vector<std::vector<TensorArg>> retired;  // outgrown storage, for stale frames
    StagingLayout layout;                         // of the frame handed out last
    std::size_t count = 0;
    std::uint64_t generation = 0;  // frames handed out so far

    std::span<const TensorArg> frame() const noexcept { return {args.data(), count}; }
    bool is(std::span<const TensorArg> span) const noexcept { return span.data() == args.data(); }

    /// Lays a frame of `shapes` out at `alignment`: every host tensor packed (In, InOut, Out),
    /// each TensorArg's data a non-null placeholder until place(); a device-resident one is a
    /// Device arg, passed through. Outgrown storage is kept: a stale frame's args may still point
    /// there, and a bind of them must be recognized, not read as freed memory.
    Result<StagingLayout> plan(std::span<const TensorShape> shapes, std::size_t alignment, void* placeholder) noexcept {
        if (args.capacity() < shapes.size() && !args.empty()) {
#if defined(__cpp_exceptions)
            try {
                retired.push_back(std::move(args));
            } catch (const std::bad_alloc&) {
                return Status(Errc::out_of_memory,
                              "stager frame: host memory for the frame's args could not be allocated");
            }
#else
            retired.push_back(std::move(args));
#endif
            args = {};
        }
        if (Status sized = grow_storage(args, shapes.size()); !sized) return sized;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
            const TensorShape& shape = shapes[i];
            args[i] = shape.device != nullptr ? TensorArg{shape.device, shape.bytes, shape.direction, Placement::Device}
                                              : TensorArg{placeholder, shape.bytes, shape.direction, Placement::Host};
        }
        PlanPass pass;
        Status planned = pass.run<true>(std::span<const TensorArg>(args.data(), shapes.size()), alignment,
                                        pack_everything, [](std::size_t, const TensorArg&, PackGroup, std::size_t) {});
        if (!planned) return planned;
        return pass.finish();
    }

    /// Points the frame's args into `mirror` at the offsets of `planned` (the bump rule, as the
    /// plan laid them out) and makes it the slot's frame.
    std::span<const TensorArg> place(const StagingLayout& planned, std::size_t frame_count, std::byte* mirror,
                                     std::size_t alignment) noexcept {
        std::array<std::size_t, 4> next = planned.base;
        for (TensorArg& arg : std::span<TensorArg>(args.data(), frame_count)) {
            if (arg.placement == Placement::Device) continue;  // passed through
            if (arg.bytes == 0) {
                arg.data = nullptr;
                continue;
            }
            const auto group = static_cast<std::size_t>(group_of(arg, pack_everything));
            arg.data = mirror + next[group];
            next[group] = bumped(next[group], arg.bytes, alignment);
        }
        layout = planned;
        count = frame_count;
        ++generation;
        return frame();
    }
};

/// The slot whose frame `args` is (a bound or dropped frame is stale: an error), or nothing
/// when `args` is not a frame of these slots. Args that point into an unbound frame without
/// being its own args are a changed copy of them: an error too. `framed(slot)` says whether a
/// slot's frame is unbound; `mirror(slot)` gives its mirror and capacity.
template <class Slot, class Framed, class Mirror>
std::optional<Result<std::size_t>> find_frame(std::span<const Slot> slots, std::span<const TensorArg> args,
                                              std::string_view backend, Framed&& framed, Mirror&& mirror) noexcept {
    if (args.empty()) return std::nullopt;
    bool any_framed = false;
    for (std::size_t index = 0; index < slots.size(); ++index) {
        const FrameStore& store = slots[index].frames;
        any_framed = any_framed || framed(index);
        for (const std::vector<TensorArg>& old : store.retired) {
            if (args.data() == old.data()) return Result<std::size_t>(stale_frame(index, backend));
        }
        if (!store.is(args)) continue;
        if (!framed(index) || args.size() != store.count) return Result<std::size_t>(stale_frame(index, backend));
        return Result<std::size_t>(index);
    }
    if (!any_framed) return std::nullopt;
    for (std::size_t index = 0; index < slots.size(); ++index) {
        if (!framed(index)) continue;
        const std::pair<std::byte*, std::size_t> memory = mirror(index);
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i].bytes > 0 && inside(args[i].data, memory.first, memory.second)) {
                return Result<std::size_t>(frame_copy(i, args[i], index, backend));
            }
        }
    }
    return std::nullopt;
}

}  // namespace devstage::detail
