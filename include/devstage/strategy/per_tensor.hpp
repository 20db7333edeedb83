// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// PerTensorMalloc: one device allocation per staged tensor per run, freed when the run ends.
/// The reference the retained strategies must equal, byte for byte.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>

#include "devstage/backend.hpp"
#include "devstage/detail/strategy/device_alloc.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// Temporary-buffer strategy without retained memory. `Stager<SimBackend, PerTensorMalloc<>> s(sim);`
/// Each staged arg gets its own device_malloc (over-allocated and aligned up to `Alignment`
/// when the backend guarantees less); leases are ReleaseKind::Free with `allocation` set. The
/// Stager frees them when the run ends, through its FreeQueue: after the run's stream work
/// completed.
template <std::size_t Alignment = 1024>
class PerTensorMalloc {
    static_assert(Alignment > 0 && (Alignment & (Alignment - 1)) == 0, "Alignment must be a power of two");

public:
    static constexpr std::size_t alignment = Alignment;
    static constexpr ReleaseKind lease_kind = ReleaseKind::Free;

    template <Backend B>
    Status prepare(B& /*backend*/, const Requirement& /*need*/, StagerStats& /*stats*/,
                   FreeQueue<B>& /*queue*/) noexcept {
        return {};
    }

    template <Backend B>
    Status acquire(B& backend, const PlannedTensor& tensor, const TensorArg& arg, TensorLease& lease,
                   StagerStats& stats) noexcept {
        Result<detail::AlignedAllocation> allocated =
            detail::allocate_aligned<Alignment>(backend, tensor.bytes, "per-tensor device allocation", stats);
        if (!allocated) return allocated.status();
        lease = TensorLease{arg.data,          allocated->base,       tensor.bytes,          copies_back(arg.direction),
                            ReleaseKind::Free, allocated->allocation, uploads(arg.direction)};
        return {};
    }

    template <Backend B>
    Status release_retained(B& /*backend*/, StagerStats& /*stats*/) noexcept {
        return {};
    }

    void abandon(StagerStats& /*stats*/) noexcept {}

    /// No memory is retained across runs.
    std::size_t capacity() const noexcept { return 0; }
    void* base() const noexcept { return nullptr; }
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
