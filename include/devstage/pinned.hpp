// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Pinned host memory: PinnedHostPool (page-locked host memory from a backend, thread-safe,
/// cached), PinnedBuffer (RAII), PinnedAllocator<T> and PinnedMemoryResource (standard
/// allocator adaptors) — so inputs are generated directly in pinned memory and uploads need no
/// pageable-to-pinned bounce. The header to include; each part lives in devstage/pinned/:
/// cache.hpp (DirectPinned, CachingPinned), core.hpp (PinnedStats, the shared core),
/// buffer.hpp, pool.hpp, allocator.hpp.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include "devstage/pinned/allocator.hpp"
#include "devstage/pinned/buffer.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/core.hpp"
#include "devstage/pinned/pool.hpp"

#endif  // DEVSTAGE_CXX20
