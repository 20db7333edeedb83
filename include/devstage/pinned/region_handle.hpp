// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// PinnedRegionHandle: a region a PinnedHostPool made with create_region — one exact-size
/// range of pinned memory, registered in chunks (in background threads if asked), with its
/// progress, a ready query, a wait and cancellation — and the slices carved out of it:
/// PinnedBuffers (allocate) and raw slices through RegionAllocator, the entry point for
/// whatever else pins memory (a stager's mirrors and frames).
/// `auto region = pool.create_region(8ull << 30, {.threads = 2}); region->wait();`
/// `auto kv = region->allocate(block_bytes);   // a PinnedBuffer inside the region`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/buffer.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// Raw slices of one region: what a component that pins memory for itself (a stager's packed
/// mirror, its frames, a ring) takes instead of calling the backend's pinned_malloc, so its
/// memory lies in a region a transfer engine registered once. Copyable; copies share the pool's
/// core, which stays alive while they do. A slice is given back by deallocate() only (the
/// pool's release() refuses it), and stays valid until then, even after the handle and the
/// pool are gone. `void* mirror = *region->allocator().allocate(64 << 10, 1024);`
class RegionAllocator {
public:
    RegionAllocator() noexcept = default;

    /// `bytes` (> 0) of the region aligned to `alignment` (a power of two). busy while the
    /// region is still registering; out_of_memory when no free range fits, naming the bytes
    /// in use and the largest free range.
    Result<void*> allocate(std::size_t bytes, std::size_t alignment = 1) noexcept {
        if (!core_) return Status(Errc::invalid_argument, "region allocator: made without a region");
        Result<detail::PinnedCore::Grant> grant =
            core_->region_allocate(region_, bytes, alignment, detail::PinnedHolder::container);
        if (!grant) return grant.status();
        return grant->pointer;
    }
    /// Gives back a slice from allocate(); anything else is an error, and changes nothing.
    Status deallocate(void* pointer) noexcept {
        if (!core_) return Status(Errc::invalid_argument, "region allocator: made without a region");
        return core_->release(pointer, 0, detail::PinnedHolder::container);
    }

    /// The region's id (PinnedRegion::id, RegionSlice::region).
    std::uint64_t region() const noexcept { return region_; }
    friend bool operator==(const RegionAllocator& a, const RegionAllocator& b) noexcept {
        return a.core_ == b.core_ && a.region_ == b.region_;
    }

private:
    friend class PinnedRegionHandle;
    RegionAllocator(std::shared_ptr<detail::PinnedCore> core, std::uint64_t region) noexcept
        : core_(std::move(core)), region_(region) {}

    std::shared_ptr<detail::PinnedCore> core_;
    std::uint64_t region_ = 0;
};

/// A region of a PinnedHostPool (create_region), move-only. Nothing of the region is handed out
/// before its registration completed and the region hooks accepted it; cancel() (or dropping
/// the handle while it registers) stops and rolls back every chunk. Dropped, the handle lets the
/// region go once its last slice is given back: the hooks' `removing` runs, then every chunk is
/// unregistered and the memory unmapped.
class PinnedRegionHandle {
public:
    PinnedRegionHandle() noexcept = default;
    PinnedRegionHandle(PinnedRegionHandle&& other) noexcept
        : core_(std::move(other.core_)),
          id_(std::exchange(other.id_, 0)),
          data_(std::exchange(other.data_, nullptr)),
          size_(std::exchange(other.size_, 0)) {}
    PinnedRegionHandle& operator=(PinnedRegionHandle&& other) noexcept {
        if (this != &other) {
            reset();
            core_ = std::move(other.core_);
            id_ = std::exchange(other.id_, 0);
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
        }
        return *this;
    }
    PinnedRegionHandle(const PinnedRegionHandle&) = delete;
    PinnedRegionHandle& operator=(const PinnedRegionHandle&) = delete;
    ~PinnedRegionHandle() { reset(); }

    /// The region's id: PinnedRegion::id in regions() once registered, RegionSlice::region.
    std::uint64_t id() const noexcept { return id_; }
    /// Where the region starts (valid, but not to be handed out, before it is ready).
    void* data() const noexcept { return data_; }
    /// The bytes asked for (the region itself is rounded up to whole pages).
    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return core_ == nullptr; }

    /// Bytes and chunks registered of the total, and the state.
    RegionProgress progress() const noexcept {
        if (!core_) return RegionProgress{0, 0, 0, 0, RegionState::failed, false};
        return core_->region_progress(id_);
    }
    /// True once registered and accepted by the hooks, false while registering; the failure
    /// (a chunk, a hook, or the cancellation) once it failed. Never blocks.
    Result<bool> ready() const noexcept {
        if (!core_) return Status(Errc::invalid_argument, "pinned region: the handle is empty");
        return core_->region_ready(id_);
    }
    /// Blocks until the registration ended; ok when the region is ready, else its failure.
    Status wait() noexcept {
        if (!core_) return Status(Errc::invalid_argument, "pinned region: the handle is empty");
        return core_->region_wait(id_);
    }
    /// Stops a registration in progress and rolls it back (every chunk registered so far is
    /// unregistered, the memory unmapped); returns once that is done. A region registered
    /// already is invalid_argument (drop the handle to free it).
    Status cancel() noexcept {
        if (!core_) return Status(Errc::invalid_argument, "pinned region: the handle is empty");
        return core_->region_cancel(id_);
    }

    /// A PinnedBuffer of `bytes` (> 0) inside the region, aligned to `alignment` (a power of
    /// two): a live allocation of the pool like any other (record(), release(), describe()).
    /// busy while the region is registering; out_of_memory when nothing fits; invalid_argument
    /// once the pool was destroyed (its slices stay valid, no new one is handed out).
    Result<PinnedBuffer> allocate(std::size_t bytes, std::size_t alignment = 1) noexcept {
        if (!core_) return Status(Errc::invalid_argument, "pinned region: the handle is empty");
        Result<detail::PinnedCore::Grant> grant =
            core_->region_allocate(id_, bytes, alignment, detail::PinnedHolder::buffer);
        if (!grant) return grant.status();
        return PinnedBuffer(core_, grant->pointer, bytes, grant->id);
    }

    /// Raw slices of the region, for what pins memory for itself (see RegionAllocator).
    RegionAllocator allocator() const noexcept { return RegionAllocator(core_, id_); }

    /// Lets the region go (cancelling a registration in progress): it is freed once its last
    /// slice is given back. The handle is empty afterwards.
    void reset() noexcept {
        if (core_) core_->region_drop(id_);
        core_.reset();
        id_ = 0;
        data_ = nullptr;
        size_ = 0;
    }

private:
    template <PinnedHostBackend, class>
    friend class PinnedHostPool;
    PinnedRegionHandle(std::shared_ptr<detail::PinnedCore> core, std::uint64_t id, void* data,
                       std::size_t size) noexcept
        : core_(std::move(core)), id_(id), data_(data), size_(size) {}

    std::shared_ptr<detail::PinnedCore> core_;
    std::uint64_t id_ = 0;
    void* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
