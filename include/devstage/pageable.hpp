// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Pageable inputs at pinned speed: a Stager can move large args in pageable host memory
/// through a retained ring of pinned chunks (detail/transfer/pinned_ring.hpp). Host threads fill one chunk while the
/// copy engine drains the previous one; an event per chunk guards its reuse. Copy-backs go the same way in reverse.
/// `stager.set_pageable_ring(PageableRing{.threshold = 8 << 20, .threads = 8});`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>

namespace devstage {

/// How a Stager stages large pageable args. Args of at least `threshold` bytes whose host memory
/// is pageable (TensorArg::memory, else the backend's `is_pinned` query, else assumed) go
/// through `chunks` pinned chunks of `chunk_bytes`; `threads` host threads (besides the caller;
/// 0: the caller copies alone) fill and empty them, unless the engine supplies its own pool.
/// A pool the engine supplies is only pointed to: it must outlive the stager (declare it first).
struct PageableRing {
    std::size_t threshold = std::size_t{4} << 20;
    std::size_t chunk_bytes = std::size_t{16} << 20;
    std::size_t chunks = 4;
    std::size_t threads = 4;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
