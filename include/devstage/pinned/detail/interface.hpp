// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the type-erased interface of a pinned pool's core (PinnedCore) and who may give an
/// allocation back (PinnedHolder). Buffers, region handles and allocator adaptors hold a pool's
/// core through this interface, whatever the pool's backend and cache policy.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/pinned/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// Who holds a live allocation; it decides which call may give the allocation back.
enum class PinnedHolder : std::uint8_t {
    raw,        ///< from allocate_raw(): PinnedHostPool::release()
    buffer,     ///< a PinnedBuffer: its reset() (by id) or PinnedHostPool::release()
    container,  ///< PinnedAllocator, PinnedMemoryResource or a RegionAllocator: their deallocation only
};

/// The type-erased interface of a pool's core, through which buffers, region handles and
/// allocator adaptors reach the pool whatever its backend and cache policy.
class PinnedCore {
public:
    struct Grant {
        void* pointer;
        std::uint64_t id;  ///< unique per grant: identifies it even when its address is reused
    };
    virtual ~PinnedCore() = default;

    /// At least `bytes` (> 0) bytes aligned to `alignment` (a power of two), held by `holder`.
    virtual Result<Grant> allocate(std::size_t bytes, std::size_t alignment, PinnedHolder holder) noexcept = 0;
    /// Gives back the live allocation starting at `pointer`: any grant there when `id` is 0,
    /// otherwise only that grant. A container's allocation is given back only by a container
    /// (`holder` container), and a container gives back nothing else.
    virtual Status release(void* pointer, std::uint64_t id, PinnedHolder holder) noexcept = 0;
    virtual PinnedStats stats() const noexcept = 0;
    /// Sends `status` to the pool's error sink.
    virtual void report(const Status& status) noexcept = 0;

    // ---- regions made with create_region, by id --------------------------------------------
    virtual RegionProgress region_progress(std::uint64_t region) const noexcept = 0;
    /// True once registered; false while registering; the failure once failed or cancelled.
    virtual Result<bool> region_ready(std::uint64_t region) const noexcept = 0;
    /// Blocks until the registration ended; ok when registered.
    virtual Status region_wait(std::uint64_t region) noexcept = 0;
    /// Stops a registration in progress and rolls it back.
    virtual Status region_cancel(std::uint64_t region) noexcept = 0;
    /// A slice of a registered region, held by `holder`.
    virtual Result<Grant> region_allocate(std::uint64_t region, std::size_t bytes, std::size_t alignment,
                                          PinnedHolder holder) noexcept = 0;
    /// The region's handle lets go: the region goes once its last slice does (a registration
    /// in progress is cancelled first).
    virtual void region_drop(std::uint64_t region) noexcept = 0;

    /// A buffer's release. A grant already given back through PinnedHostPool::release() is
    /// fine; any other failure goes to the error sink.
    void give_back(void* pointer, std::uint64_t id) noexcept {
        if (Status status = release(pointer, id, PinnedHolder::buffer);
            !status && status.code() != Errc::unknown_pointer) {
            report(status);
        }
    }

    /// For the Allocator and memory_resource interfaces: throws std::bad_alloc on failure
    /// (aborts without exceptions). Zero bytes get a one-byte allocation.
    void* allocate_or_throw(std::size_t bytes, std::size_t alignment) {
        Result<Grant> grant = allocate(std::max<std::size_t>(bytes, 1), alignment, PinnedHolder::container);
        if (!grant) throw_bad_alloc();
        return grant->pointer;
    }

    /// A container's deallocation: every failure goes to the error sink.
    void deallocate(void* pointer) noexcept {
        if (Status status = release(pointer, 0, PinnedHolder::container); !status) report(status);
    }

protected:
    PinnedCore() = default;
    PinnedCore(const PinnedCore&) = default;
    PinnedCore& operator=(const PinnedCore&) = default;
};

}  // namespace devstage::detail
