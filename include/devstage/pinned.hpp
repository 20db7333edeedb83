// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Pinned host memory: PinnedHostPool (page-locked host memory from a backend, thread-safe,
/// cached), PinnedBuffer (RAII), PinnedAllocator<T> and PinnedMemoryResource (standard
/// allocator adaptors) — so inputs are generated directly in pinned memory and uploads need no
/// pageable-to-pinned bounce; big requests pinned at their exact size, regions for slices and
/// for transfer engines. The header to include; each part lives in devstage/pinned/:
/// cache.hpp (DirectPinned, CachingPinned), stats.hpp (PinnedStats), buffer.hpp, pool.hpp,
/// allocator.hpp, numa.hpp (NUMA placement), limits.hpp (the limits pinning must fit),
/// regions.hpp (ExactPinning, RegionOptions, PinnedPoolOptions), region_handle.hpp
/// (PinnedRegionHandle, RegionAllocator); the pool's core is private, in pinned/detail/.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include "devstage/pinned/allocator.hpp"
#include "devstage/pinned/buffer.hpp"
#include "devstage/pinned/cache.hpp"
#include "devstage/pinned/limits.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/pinned/pool.hpp"
#include "devstage/pinned/region_handle.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/pinned/stats.hpp"

#endif  // DEVSTAGE_CXX20
