// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// TensorArg: one argument of a run, as the caller describes it.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>

namespace devstage {

/// Which way a tensor's data flows across a run.
enum class Direction : std::uint8_t {
    In,     ///< uploaded before the run, never copied back
    Out,    ///< not uploaded, copied back after a successful run
    InOut,  ///< uploaded, and copied back after a successful run
};

/// Where a tensor's `data` lives.
enum class Placement : std::uint8_t {
    Host,    ///< host memory: staged on the device for the run
    Device,  ///< caller-owned device memory: passed through untouched, never freed by devstage
};

/// What the caller knows of a Host arg's memory. Page-locked (pinned) memory is copied by DMA
/// directly; pageable memory is staged by the driver — or, when the stager has a pageable ring,
/// through it (see Stager::set_pageable_ring).
enum class HostMemory : std::uint8_t {
    unknown,   ///< the backend is asked (when it can tell), else pageable is assumed
    pageable,  ///< ordinary host memory
    pinned,    ///< page-locked memory of this backend (a PinnedHostPool, the stager's frames)
};

/// One argument of a run. `TensorArg{logits.data(), logits.size() * 4, Direction::Out}`
/// Contract: `bytes > 0` requires `data != nullptr`; zero-byte args stage as a null pointer.
/// `direction` and `placement` must hold one of their enumerators (a bind refuses any other
/// value with invalid_argument); `memory` is a hint (any other value reads as unknown).
struct TensorArg {
    void* data;
    std::size_t bytes;
    Direction direction = Direction::InOut;
    Placement placement = Placement::Host;
    HostMemory memory = HostMemory::unknown;

    /// An input from read-only memory (a `const` vector, a string literal): In args are never
    /// written, so the const is shed safely. `TensorArg::in(tokens.data(), tokens.size() * 4)`
    static constexpr TensorArg in(const void* data, std::size_t bytes) noexcept {
        return TensorArg{const_cast<void*>(data), bytes, Direction::In, Placement::Host};  // NOLINT: never written
    }
    /// An output, copied back after a successful run.
    static constexpr TensorArg out(void* data, std::size_t bytes) noexcept {
        return TensorArg{data, bytes, Direction::Out, Placement::Host};
    }
    /// State read and written by the run (a KV cache).
    static constexpr TensorArg in_out(void* data, std::size_t bytes) noexcept {
        return TensorArg{data, bytes, Direction::InOut, Placement::Host};
    }
};

/// True when the data must be uploaded before the run.
constexpr bool uploads(Direction direction) noexcept {
    return direction != Direction::Out;
}
/// True when the data must be copied back after a successful run.
constexpr bool copies_back(Direction direction) noexcept {
    return direction != Direction::In;
}

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
