// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// HostFrame: a run's inputs written in place. A packed stager hands out the pinned mirror of
/// one pipeline slot laid out for the given shapes; the caller writes its inputs there and
/// binds the frame, which then uploads every In/InOut byte with one copy and no host memcpy.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <span>

#include "devstage/backend.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

template <Backend B, class Strategy>
class Stager;

/// The size and direction of one tensor of a frame, and where it lives. `device` null: a host
/// tensor, given mirror space in the frame. `device` set: a device-resident tensor (weights, a
/// KV cache) passed through at its position in `device_args()`; it takes no mirror space and
/// its `host(i)` is empty. `TensorShape{kv_bytes, Direction::InOut, kv_cache}`
struct TensorShape {
    std::size_t bytes;
    Direction direction = Direction::InOut;
    void* device = nullptr;
};

/// The mirror of one slot, laid out for a run. A view: it belongs to the caller from frame()
/// until the Completion of the run that bound it is destroyed or detached (a synchronous
/// finish ends it when it returns), or until its stager is released, abandoned or destroyed;
/// no frame() or bind() takes its slot before. `host(i)` is tensor i's bytes, aligned as the
/// device slice (the strategy's Alignment); `args()` are TensorArgs pointing at them, for
/// `Stager::bind`. `auto f = stager.frame(shapes); fill(f->host(0)); auto run = stager.bind(f->args());`
/// Outputs (Out, InOut) are copied back into the frame: read them from `host(i)` once the run's
/// Completion is ready, and pass them as inputs to a later bind while it is held.
class HostFrame {
public:
    /// Tensor i's bytes in the mirror; empty for a zero-byte or device-resident tensor, or an
    /// index out of range.
    std::span<std::byte> host(std::size_t i) const noexcept {
        if (i >= args_.size() || args_[i].data == nullptr || args_[i].placement == Placement::Device) return {};
        return {static_cast<std::byte*>(args_[i].data), args_[i].bytes};
    }
    /// The frame's args, in the order of the shapes: bind exactly this span.
    std::span<const TensorArg> args() const noexcept { return args_; }
    std::size_t size() const noexcept { return args_.size(); }
    /// The pipeline slot the frame belongs to; it binds there.
    std::size_t slot() const noexcept { return slot_; }

private:
    template <Backend, class>
    friend class Stager;
    HostFrame(const void* owner, std::size_t slot, std::uint64_t generation, std::span<const TensorArg> args) noexcept
        : owner_(owner), slot_(slot), generation_(generation), args_(args) {}

    const void* owner_;
    std::size_t slot_;
    std::uint64_t generation_;
    std::span<const TensorArg> args_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
