// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// PinnedHostPool: page-locked host memory from a backend, thread-safe and cached, handed out
/// as PinnedBuffers or raw pointers.

#include <cstddef>
#include <memory>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/buffer.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/core.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// A pool of page-locked host memory over one backend instance (and so that backend's
/// device, never the calling thread's current one). Thread-safe: every call may come from any
/// thread. The backend must accept concurrent calls and outlive the pool and every buffer and
/// container holding memory from it.
/// `PinnedHostPool<SimBackend> pool(sim); auto buf = pool.allocate(1 << 20);`
template <PinnedHostBackend B, class Cache = CachingPinned>
class PinnedHostPool {
    using Core = detail::PinnedPoolCore<B, Cache>;

public:
    explicit PinnedHostPool(B& backend, Cache cache = {}) : core_(std::make_shared<Core>(backend, std::move(cache))) {}
    PinnedHostPool(const PinnedHostPool&) = delete;
    PinnedHostPool& operator=(const PinnedHostPool&) = delete;
    /// Refuses every later allocation (through allocator copies, or one in flight), frees the
    /// cache and the raw allocations never released (nothing could release them later), and
    /// reports what buffers and containers still hold: that memory stays valid and goes back
    /// to the backend when they give it back.
    ~PinnedHostPool() {
        if (Status status = core_->close(); !status) core_->report(status);
    }

    /// Pinned memory of at least `bytes` (> 0) bytes, given back when the buffer dies.
    Result<PinnedBuffer> allocate(std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant = core_->allocate(bytes, 1, detail::PinnedHolder::buffer);
        if (!grant) return grant.status();
        return PinnedBuffer(core_, grant->pointer, bytes, grant->id);
    }

    /// Pinned memory for callers that hand raw pointers around; give it back with release().
    Result<void*> allocate_raw(std::size_t bytes) noexcept {
        Result<detail::PinnedCore::Grant> grant = core_->allocate(bytes, 1, detail::PinnedHolder::raw);
        if (!grant) return grant.status();
        return grant->pointer;
    }

    /// Gives back memory from allocate_raw() (or a buffer's data(): the buffer then gives back
    /// nothing). A pointer the pool does not own, or one already released, is
    /// Errc::unknown_pointer; a container's memory is Errc::invalid_argument (its allocator
    /// gives it back).
    Status release(void* pointer) noexcept { return core_->release(pointer, 0, detail::PinnedHolder::raw); }

    /// True when `pointer` is the start of a live allocation of this pool.
    bool owns(const void* pointer) const noexcept { return core_->owns(pointer); }

    /// Frees every cached block. Allocations still live stay valid: they are counted in
    /// stats().finalized_* and detached_*, reported to the error sink, and go back to the
    /// backend (not the cache) when given back. The pool stays usable. Returns the first
    /// backend failure, if any.
    Status finalize() noexcept { return core_->finalize(); }

    /// Frees every cached block (nothing live is touched).
    Status trim() noexcept { return core_->trim(); }

    PinnedStats stats() const noexcept { return core_->stats(); }
    /// Where reports go (stderr by default), also after the pool died, while buffers and
    /// containers still hold its memory: the sink must outlive them too.
    void set_error_sink(ErrorSink sink) noexcept { core_->set_sink(sink); }
    B& backend() const noexcept { return core_->backend(); }

    /// The shared core, for PinnedAllocator and PinnedMemoryResource; its stats() stay
    /// readable after the pool died.
    std::shared_ptr<detail::PinnedCore> core() const noexcept { return core_; }

private:
    std::shared_ptr<Core> core_;
};

}  // namespace devstage
