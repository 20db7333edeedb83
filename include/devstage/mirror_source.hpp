// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// MirrorSource: where a stager takes the pinned host memory of its packed mirrors (and so of
/// its frames) from instead of the backend's pinned_malloc — a region of a pinned pool, or the
/// pool itself (devstage/pinned/mirror_source.hpp makes both), so that the memory lies in
/// regions a transfer engine registered once with the pool's hooks.
/// `StagerOptions{.pack_limit = 16384, .mirror_source = mirror_source(region->allocator())}`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <functional>

#include "devstage/status.hpp"

namespace devstage {

/// Pinned host memory for mirrors: `allocate(bytes, alignment)` gives `bytes` from a base
/// aligned to `alignment` (a power of two) or why not; `deallocate(pointer)` takes back exactly
/// what allocate gave. Both must be set; the memory must stay valid until given back.
struct MirrorSource {
    std::function<Result<void*>(std::size_t bytes, std::size_t alignment)> allocate;
    std::function<Status(void* pointer)> deallocate;

    explicit operator bool() const noexcept { return allocate && deallocate; }
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
