// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// MirrorSources over a pinned pool: a region made with create_region (its RegionAllocator), or
/// the pool itself (its blocks, in size classes or at their exact size). A stager given one
/// (StagerOptions::mirror_source) carves its mirrors and frames out of the pool, whose regions(),
/// hooks and describe() then cover them. The source shares the pool's core: its memory stays
/// valid until the stager gives it back, even after the pool object is gone.
/// `auto source = mirror_source(region->allocator());`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <memory>

#include "devstage/backend.hpp"
#include "devstage/mirror_source.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/pool.hpp"
#include "devstage/pinned/region_handle.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// Mirrors carved out of one region (RegionAllocator::allocate and deallocate): busy while the
/// region registers, out_of_memory when no free range fits.
inline MirrorSource mirror_source(RegionAllocator allocator) {
    return MirrorSource{
        [allocator](std::size_t bytes, std::size_t alignment) mutable { return allocator.allocate(bytes, alignment); },
        [allocator](void* pointer) mutable { return allocator.deallocate(pointer); }};
}

/// Mirrors from the pool's own blocks (any alignment served; given back to the pool's cache).
template <PinnedHostBackend B, class Cache>
MirrorSource mirror_source(const PinnedHostPool<B, Cache>& pool) {
    std::shared_ptr<detail::PinnedCore> core = pool.core();
    return MirrorSource{[core](std::size_t bytes, std::size_t alignment) -> Result<void*> {
                            Result<detail::PinnedCore::Grant> grant =
                                core->allocate(bytes, alignment, detail::PinnedHolder::container);
                            if (!grant) return grant.status();
                            return grant->pointer;
                        },
                        [core](void* pointer) { return core->release(pointer, 0, detail::PinnedHolder::container); }};
}

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
