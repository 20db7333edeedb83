// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// TensorLease: who owns the device memory behind one staged tensor, and how to release it.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>

#include "devstage/backend.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

/// How a lease's device memory is given back at the end of a run.
enum class ReleaseKind : std::uint8_t {
    Free,          ///< allocated for this run alone: device_free(allocation)
    BufferNoop,    ///< a slice of the stager's retained buffer: nothing to free per tensor
    ExternalNoop,  ///< caller-owned device memory (Placement::Device): never freed by devstage
};

/// One staged tensor of a live run. `release(backend, lease)` ends it.
struct TensorLease {
    void* host;    ///< the caller's host pointer (null for Placement::Device args)
    void* device;  ///< where the kernel reads and writes the tensor
    std::size_t bytes;
    bool copy_back;  ///< copied to `host` by a finish after a successful execution
    ReleaseKind release_kind;
    void* allocation = nullptr;                    ///< what device_free gets for Free leases; differs from
                                                   ///< `device` when the allocation was aligned up
    bool upload = false;                           ///< copied from `host` to `device` by the bind (In and InOut)
    HostMemory host_memory = HostMemory::unknown;  ///< the arg's hint about `host`
};

/// Releases one lease by its kind. Free leases call device_free(allocation); the others do
/// nothing. The lease is left with its pointers cleared, so a second release is a no-op.
template <Backend B>
Status release(B& backend, TensorLease& lease) noexcept {
    Status status;
    if (lease.release_kind == ReleaseKind::Free && lease.allocation != nullptr) {
        status = backend.device_free(lease.allocation);
    }
    lease.allocation = nullptr;
    lease.device = nullptr;
    return status;
}

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
