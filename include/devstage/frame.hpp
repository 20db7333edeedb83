// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// HostFrame: a run's inputs written in place. A packing stager hands out the pinned mirror of
/// one pipeline slot laid out for the given shapes; the caller writes its inputs there and binds
/// the frame, which then uploads every In/InOut byte with one copy and no host memcpy. The frame
/// owns its slot until it is bound: destroyed (or moved over) unbound, it gives the slot back.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "devstage/tensor.hpp"

namespace devstage {

/// The size and direction of one tensor of a frame, and where it lives. `device` null: a host
/// tensor, given mirror space in the frame. `device` set: a device-resident tensor (weights, a
/// KV cache) passed through at its position in `device_args()`; it takes no mirror space and
/// its `host(i)` is empty. `TensorShape{kv_bytes, Direction::InOut, kv_cache}`
struct TensorShape {
    std::size_t bytes;
    Direction direction = Direction::InOut;
    void* device = nullptr;
};

class HostFrame;

namespace detail {

/// What a HostFrame calls back into; implemented by every Stager. The owner keeps its frames in
/// an intrusive list (no allocation per frame), so either may die first: a frame destroyed
/// unbound gives its slot back, and frames whose memory the owner gives back (or that outlive
/// it) become inert.
class FrameOwner {
public:
    /// The frame handed out on `slot` as `generation` is destroyed (or moved over).
    virtual void drop_frame(std::size_t slot, std::uint64_t generation) noexcept = 0;

protected:
    FrameOwner() = default;
    FrameOwner(const FrameOwner&) = delete;
    FrameOwner& operator=(const FrameOwner&) = delete;
    ~FrameOwner() = default;

    /// A frame of this owner for `slot`, linked.
    inline HostFrame make_frame(std::size_t slot, std::uint64_t generation, std::span<const TensorArg> args) noexcept;
    /// Makes the linked frames of `slot` other than `generation`'s inert (all slots: `all`).
    inline void retire_frames(std::size_t slot, std::uint64_t keep) noexcept;
    inline void retire_all_frames() noexcept;
    inline void link_frame(HostFrame& frame) noexcept;
    static bool ours(const HostFrame& frame, const FrameOwner* owner) noexcept;
    static std::size_t slot_of(const HostFrame& frame) noexcept;
    static std::uint64_t generation_of(const HostFrame& frame) noexcept;

private:
    friend class devstage::HostFrame;
    HostFrame* head_ = nullptr;
};

}  // namespace detail

/// The mirror of one slot, laid out for a run; move-only. `host(i)` is tensor i's bytes, aligned
/// as the device slice (the strategy's alignment); `args()` are TensorArgs pointing at them,
/// for `Stager::bind`. `auto f = stager.frame(shapes); fill(f->host(0)); auto run = stager.bind(*f);`
///
/// Unbound, the frame owns its slot: no other frame() or bind() takes it, and destroying the
/// frame (or moving another over it) gives the slot back. Bound, its memory belongs to the run
/// until the run's Completion is destroyed or detached (a synchronous finish ends it when it
/// returns); outputs (Out, InOut) are copied back into the frame: read them from `host(i)` once
/// the Completion is ready, and pass them as inputs to a later bind while it is held. A frame
/// becomes inert — host(i) and args() empty — when its slot is taken again (a later frame() or
/// bind on it) or its stager releases, reserves, abandons or dies: a view never points at memory
/// given to another frame or back to the backend.
class HostFrame {
public:
    HostFrame(HostFrame&& other) noexcept { take(other); }
    HostFrame& operator=(HostFrame&& other) noexcept {
        if (this != &other) {
            reset();
            take(other);
        }
        return *this;
    }
    HostFrame(const HostFrame&) = delete;
    HostFrame& operator=(const HostFrame&) = delete;
    ~HostFrame() { reset(); }

    /// Tensor i's bytes in the mirror; empty for a zero-byte or device-resident tensor, an
    /// index out of range, or an inert frame.
    std::span<std::byte> host(std::size_t i) const noexcept {
        if (i >= args_.size() || args_[i].data == nullptr || args_[i].placement == Placement::Device) return {};
        return {static_cast<std::byte*>(args_[i].data), args_[i].bytes};
    }
    /// The frame's args, in the order of the shapes: bind exactly this span (empty once inert).
    std::span<const TensorArg> args() const noexcept { return args_; }
    std::size_t size() const noexcept { return args_.size(); }
    /// The pipeline slot the frame belongs to; it binds there.
    std::size_t slot() const noexcept { return slot_; }
    /// False once inert (see above) or moved from.
    bool live() const noexcept { return owner_ != nullptr; }

private:
    friend class detail::FrameOwner;
// A frame made as a temporary is linked, then moved (relinked) into its Result: g++ 12 sees
// only the link of the temporary's address.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
    HostFrame(detail::FrameOwner* owner, std::size_t slot, std::uint64_t generation,
              std::span<const TensorArg> args) noexcept
        : owner_(owner), slot_(slot), generation_(generation), args_(args) {
        owner->link_frame(*this);
    }
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

    void take(HostFrame& other) noexcept {
        owner_ = std::exchange(other.owner_, nullptr);
        slot_ = other.slot_;
        generation_ = other.generation_;
        args_ = std::exchange(other.args_, {});
        prev_ = std::exchange(other.prev_, nullptr);
        next_ = std::exchange(other.next_, nullptr);
        if (owner_ != nullptr) {
            (prev_ != nullptr ? prev_->next_ : owner_->head_) = this;
            if (next_ != nullptr) next_->prev_ = this;
        }
    }
    // Unlinked and inert; the owner is not told.
    void unlink() noexcept {
        if (owner_ == nullptr) return;
        (prev_ != nullptr ? prev_->next_ : owner_->head_) = next_;
        if (next_ != nullptr) next_->prev_ = prev_;
        owner_ = nullptr;
        prev_ = next_ = nullptr;
        args_ = {};
    }
    void reset() noexcept {
        detail::FrameOwner* owner = owner_;
        if (owner == nullptr) return;
        unlink();
        owner->drop_frame(slot_, generation_);
    }

    detail::FrameOwner* owner_ = nullptr;
    std::size_t slot_ = 0;
    std::uint64_t generation_ = 0;
    std::span<const TensorArg> args_;
    HostFrame* prev_ = nullptr;
    HostFrame* next_ = nullptr;
};

namespace detail {

inline HostFrame FrameOwner::make_frame(std::size_t slot, std::uint64_t generation,
                                        std::span<const TensorArg> args) noexcept {
    return HostFrame(this, slot, generation, args);
}

inline void FrameOwner::link_frame(HostFrame& frame) noexcept {
    frame.next_ = head_;
    if (head_ != nullptr) head_->prev_ = &frame;
    head_ = &frame;
}

inline void FrameOwner::retire_frames(std::size_t slot, std::uint64_t keep) noexcept {
    for (HostFrame* frame = head_; frame != nullptr;) {
        HostFrame* next = frame->next_;
        if (frame->slot_ == slot && frame->generation_ != keep) frame->unlink();
        frame = next;
    }
}

inline void FrameOwner::retire_all_frames() noexcept {
    while (head_ != nullptr) head_->unlink();
}

inline bool FrameOwner::ours(const HostFrame& frame, const FrameOwner* owner) noexcept {
    return frame.owner_ == owner;
}
inline std::size_t FrameOwner::slot_of(const HostFrame& frame) noexcept {
    return frame.slot_;
}
inline std::uint64_t FrameOwner::generation_of(const HostFrame& frame) noexcept {
    return frame.generation_;
}

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
