// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// StagedRun: a live run of a Stager — the device view of its args and the leases that back
/// them, from bind until finish.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <span>
#include <utility>

#include "devstage/lease.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

class StagedRun;

namespace detail {
/// What a StagedRun calls back into; implemented by every Stager.
class RunOwner {
public:
    virtual void drop_run(std::size_t slot) noexcept = 0;
    virtual void relink_run(std::size_t slot, StagedRun* handle) noexcept = 0;

protected:
    RunOwner() = default;
    RunOwner(const RunOwner&) = default;
    RunOwner& operator=(const RunOwner&) = default;
    ~RunOwner() = default;

    /// A live run of this owner on `slot`, linked (relink_run is called with it).
    inline StagedRun make_run(std::size_t slot, std::span<const TensorArg> device_args,
                              std::span<const TensorLease> leases) noexcept;
    /// Whether `run` is a live run of this owner, and its slot.
    inline bool ours(const StagedRun& run) const noexcept;
    static bool dead(const StagedRun& run) noexcept;
    static std::size_t slot_of(const StagedRun& run) noexcept;
    /// Makes a live run's handle inert (its owner ended the run).
    static void unlink(StagedRun& run) noexcept;
};

}  // namespace detail

/// A live run: the device view of its args and the leases that back them. Move-only.
/// `auto run = stager.bind(args); launch(run->device_args()); (void)stager.finish(std::move(*run));`
/// Destroyed without finish, it releases its leases without copying back. Once its stager
/// finished, released or abandoned it, the handle is inert.
class StagedRun {
public:
    StagedRun(StagedRun&& other) noexcept { take(other); }
    StagedRun& operator=(StagedRun&& other) noexcept {
        if (this != &other) {
            reset();
            take(other);
        }
        return *this;
    }
    StagedRun(const StagedRun&) = delete;
    StagedRun& operator=(const StagedRun&) = delete;
    ~StagedRun() { reset(); }

    /// The args in input order: staged ones point at device memory (Placement::Device),
    /// Device args are unchanged, zero-byte args have a null pointer.
    std::span<const TensorArg> device_args() const noexcept { return device_args_; }
    /// One lease per staged arg and per Device arg with bytes, in input order.
    std::span<const TensorLease> leases() const noexcept { return leases_; }
    /// False once finished, dropped by its stager, or moved from.
    bool live() const noexcept { return owner_ != nullptr; }
    /// The pipeline slot the run is bound on.
    std::size_t slot() const noexcept { return slot_; }

private:
    friend class detail::RunOwner;

    StagedRun(detail::RunOwner* owner, std::size_t slot, std::span<const TensorArg> device_args,
              std::span<const TensorLease> leases) noexcept
        : owner_(owner), slot_(slot), device_args_(device_args), leases_(leases) {
        owner_->relink_run(slot_, this);
    }

    void take(StagedRun& other) noexcept {
        owner_ = std::exchange(other.owner_, nullptr);
        slot_ = other.slot_;
        device_args_ = std::exchange(other.device_args_, {});
        leases_ = std::exchange(other.leases_, {});
        if (owner_ != nullptr) owner_->relink_run(slot_, this);
    }
    void reset() noexcept {
        if (detail::RunOwner* owner = std::exchange(owner_, nullptr)) owner->drop_run(slot_);
        device_args_ = {};
        leases_ = {};
    }
    void unlink() noexcept {
        owner_ = nullptr;
        device_args_ = {};
        leases_ = {};
    }

    detail::RunOwner* owner_ = nullptr;
    std::size_t slot_ = 0;
    std::span<const TensorArg> device_args_;
    std::span<const TensorLease> leases_;
};

namespace detail {

inline StagedRun RunOwner::make_run(std::size_t slot, std::span<const TensorArg> device_args,
                                    std::span<const TensorLease> leases) noexcept {
    return StagedRun(this, slot, device_args, leases);
}
inline bool RunOwner::ours(const StagedRun& run) const noexcept {
    return run.owner_ == this;
}
inline bool RunOwner::dead(const StagedRun& run) noexcept {
    return run.owner_ == nullptr;
}
inline std::size_t RunOwner::slot_of(const StagedRun& run) noexcept {
    return run.slot_;
}
inline void RunOwner::unlink(StagedRun& run) noexcept {
    run.unlink();
}

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
