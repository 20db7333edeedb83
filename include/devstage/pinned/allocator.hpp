// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Standard allocator adaptors over any PinnedHostPool: PinnedAllocator<T> and
/// PinnedMemoryResource (a std::pmr::memory_resource), so containers fill pinned memory
/// directly.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <memory>
#include <memory_resource>
#include <type_traits>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/pool.hpp"

namespace devstage {

/// A standard allocator over any PinnedHostPool. Copies and rebinds share the pool's core.
/// `std::vector<float, PinnedAllocator<float>> v(n, PinnedAllocator<float>(pool));`
/// Any alignof(T) is served (a block that misses it is padded). Allocation failure throws
/// std::bad_alloc, as the Allocator requirements demand (it aborts when exceptions are
/// disabled); so does allocating after the pool died. Deallocation never throws: it gives the
/// memory back only to the pool that allocated it, and reports any other pointer to the
/// error sink. A container may outlive its pool: its memory stays valid until deallocated.
/// Move assignment and swap carry the allocator along with the memory, so they never allocate
/// and never mix pools; copy assignment keeps the target's pool.
template <class T>
class PinnedAllocator {
public:
    using value_type = T;
    using propagate_on_container_move_assignment = std::true_type;
    using propagate_on_container_swap = std::true_type;

    template <PinnedHostBackend B, class Cache>
    PinnedAllocator(const PinnedHostPool<B, Cache>& pool) noexcept  // NOLINT(google-explicit-constructor)
        : core_(pool.core()) {}
    template <class U>
    PinnedAllocator(const PinnedAllocator<U>& other) noexcept  // NOLINT(google-explicit-constructor)
        : core_(other.core()) {}

    T* allocate(std::size_t n) {
        if (n > std::size_t(-1) / sizeof(T)) detail::throw_bad_alloc();
        return static_cast<T*>(core_->allocate_or_throw(n * sizeof(T), alignof(T)));
    }
    void deallocate(T* pointer, std::size_t /*n*/) noexcept { core_->deallocate(pointer); }

    const std::shared_ptr<detail::PinnedCore>& core() const noexcept { return core_; }
    friend bool operator==(const PinnedAllocator& a, const PinnedAllocator& b) noexcept { return a.core_ == b.core_; }

private:
    std::shared_ptr<detail::PinnedCore> core_;
};

/// A std::pmr::memory_resource over any PinnedHostPool, with the same rules as
/// PinnedAllocator (any alignment; failure throws std::bad_alloc; may outlive the pool).
/// `PinnedMemoryResource mr(pool); std::pmr::vector<float> v(&mr);`
class PinnedMemoryResource final : public std::pmr::memory_resource {
public:
    template <PinnedHostBackend B, class Cache>
    explicit PinnedMemoryResource(const PinnedHostPool<B, Cache>& pool) noexcept : core_(pool.core()) {}

private:
    void* do_allocate(std::size_t bytes, std::size_t alignment) override {
        return core_->allocate_or_throw(bytes, alignment);
    }
    void do_deallocate(void* pointer, std::size_t /*bytes*/, std::size_t /*alignment*/) override {
        core_->deallocate(pointer);
    }
    bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
        const auto* same = dynamic_cast<const PinnedMemoryResource*>(&other);
        return same != nullptr && same->core_ == core_;
    }

    std::shared_ptr<detail::PinnedCore> core_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
