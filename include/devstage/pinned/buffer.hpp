// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// PinnedBuffer: pinned host memory held from a PinnedHostPool, given back when destroyed.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/pinned/detail/interface.hpp"

namespace devstage {

template <PinnedHostBackend B, class Cache>
class PinnedHostPool;
class PinnedRegionHandle;

/// Pinned host memory held from a PinnedHostPool; given back when destroyed. Move-only.
/// `auto buf = pool.allocate(n * sizeof(float)); std::span<float> v = buf->as<float>();`
/// The memory stays valid until the buffer gives it back, even after the pool's finalize() or
/// its destruction; it then goes straight back to the backend, which must outlive the buffer.
class PinnedBuffer {
public:
    PinnedBuffer() noexcept = default;
    PinnedBuffer(PinnedBuffer&& other) noexcept
        : core_(std::move(other.core_)),
          data_(std::exchange(other.data_, nullptr)),
          size_(std::exchange(other.size_, 0)),
          id_(std::exchange(other.id_, 0)) {}
    PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
        if (this != &other) {
            reset();
            core_ = std::move(other.core_);
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
            id_ = std::exchange(other.id_, 0);
        }
        return *this;
    }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    ~PinnedBuffer() { reset(); }

    void* data() const noexcept { return data_; }
    /// The bytes asked for (the block behind may be larger).
    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return data_ == nullptr; }

    /// The memory as T elements; empty when the size is not a multiple of sizeof(T) or the
    /// data is not aligned for T. T must be trivial: the memory holds bytes, and only a
    /// trivial type's objects exist as soon as its bytes do.
    template <class T>
    std::span<T> as() const noexcept {
        static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>,
                      "PinnedBuffer::as<T>() needs a trivial T (trivially default-constructible and trivially "
                      "copyable): pinned memory holds raw bytes, not constructed objects");
        if (data_ == nullptr || size_ % sizeof(T) != 0 || !detail::is_aligned(data_, alignof(T))) return {};
        return {static_cast<T*>(data_), size_ / sizeof(T)};
    }

    /// Gives the memory back now: to the pool's cache, or to the backend once the pool was
    /// finalized or destroyed. The buffer is empty afterwards. A no-op when the memory was
    /// already given back through PinnedHostPool::release(data()).
    void reset() noexcept {
        if (core_ != nullptr && data_ != nullptr) core_->give_back(data_, id_);
        core_.reset();
        data_ = nullptr;
        size_ = 0;
        id_ = 0;
    }

private:
    template <PinnedHostBackend, class>
    friend class PinnedHostPool;
    friend class PinnedRegionHandle;
    PinnedBuffer(std::shared_ptr<detail::PinnedCore> core, void* data, std::size_t size, std::uint64_t id) noexcept
        : core_(std::move(core)), data_(data), size_(size), id_(id) {}

    std::shared_ptr<detail::PinnedCore> core_;
    void* data_ = nullptr;
    std::size_t size_ = 0;
    std::uint64_t id_ = 0;  ///< the grant's id: a stale buffer never gives back a newer grant
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
