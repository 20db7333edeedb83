// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedRegionState, one region a pinned pool made with create_region — its memory,
/// its registration (in chunks, maybe in background threads) and where it is, and once
/// registered the sub-allocation of its bytes into slices. The registration state has its own
/// lock; the slices, the handle flag and the count of live slices are the core's to guard.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/chunked_registration.hpp"
#include "devstage/pinned/detail/range_allocator.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class PinnedRegionState {
public:
    PinnedRegionState(std::uint64_t id, PinnedBlock block, std::size_t asked) noexcept
        : id_(id), block_(block), asked_(asked) {
        block_.region = id;
    }
    PinnedRegionState(const PinnedRegionState&) = delete;
    PinnedRegionState& operator=(const PinnedRegionState&) = delete;
    /// Stops and joins a registration still running (it rolls itself back).
    ~PinnedRegionState() { stop(); }

    std::uint64_t id() const noexcept { return id_; }
    const PinnedBlock& block() const noexcept { return block_; }
    PinnedBlock& block() noexcept { return block_; }
    std::size_t asked() const noexcept { return asked_; }

    /// The registration of the region's chunks (mapped memory), owned here.
    void set_registration(std::unique_ptr<ChunkedRegistration<B>> registration) noexcept {
        registration_ = std::move(registration);
    }
    ChunkedRegistration<B>* registration() noexcept { return registration_.get(); }

    /// The registration ended: `state` (ready, failed, cancelled) and the failure.
    void settle(RegionState state, Status failure) noexcept {
        std::lock_guard lock(mutex_);
        state_ = state;
        failure_ = std::move(failure);
        changed_.notify_all();
    }
    RegionState state() const noexcept {
        std::lock_guard lock(mutex_);
        return state_;
    }
    Status failure() const noexcept {
        std::lock_guard lock(mutex_);
        return failure_;
    }

    /// Blocks until the registration ended, joins its threads; ok when ready.
    Status wait() noexcept {
        {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] { return state_ != RegionState::registering; });
        }
        if (registration_) registration_->join();
        std::lock_guard lock(mutex_);
        return state_ == RegionState::ready ? Status() : failure_;
    }

    /// Cancels a registration in progress and waits until it ended.
    void stop() noexcept {
        if (!registration_) return;
        if (state() == RegionState::registering) registration_->cancel();
        (void)wait();
    }

    RegionProgress progress() const noexcept {
        RegionProgress out;
        if (registration_) {
            out = registration_->progress();
        } else {
            out.bytes_total = block_.capacity;
            out.chunks_total = 1;
        }
        out.state = state();
        if (!registration_ && out.state == RegionState::ready) {
            out.bytes_registered = out.bytes_total;
            out.chunks_registered = 1;
        }
        return out;
    }

    // ---- guarded by the core's mutex ---------------------------------------------------------
    std::optional<RangeAllocator> slices;  ///< made once ready
    bool held = true;                      ///< the handle still holds the region
    bool torn_down = false;                ///< unpinned (or freed) when the backend was torn down

private:
    std::uint64_t id_;
    PinnedBlock block_;
    std::size_t asked_;
    std::unique_ptr<ChunkedRegistration<B>> registration_;
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    RegionState state_ = RegionState::registering;
    Status failure_;
};

}  // namespace devstage::detail
