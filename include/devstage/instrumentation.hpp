// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Instrumentation: optional capabilities of backends that model or check what kernels and the
/// host touch — the test doubles (MockBackend checks them against pending work) and the
/// simulator (which charges mapped accesses to its link model). They are not part of what a
/// production backend needs: the Stager's only use is to announce, to a backend that models
/// HostAccessCheckBackend, the host's own reads and writes of a mapped mirror, so that such a
/// backend can flag a host access racing with a kernel.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <concepts>
#include <cstddef>
#include <span>

#include "devstage/backend.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// A range a kernel reads or writes, by its device address: device memory, or mapped host
/// memory (a device address from map_host). For backends that model or check what kernels
/// touch (KernelAccessBackend).
/// `KernelAccess{args[i].data, args[i].bytes, true, false}` for an In arg: read, not written.
struct KernelAccess {
    const void* device = nullptr;
    std::size_t bytes = 0;
    bool reads = true;
    bool writes = false;
};

/// Optional, for backends that model or check what kernels touch (SimBackend models mapped
/// accesses as bytes over the link; MockBackend checks them against the host's use):
/// `b.launch_kernel(s, fn, data, accesses)` noexcept -> Status enqueues a HostFunction standing in
/// for a kernel that touches `accesses` (read during the call only).
template <class B>
concept KernelAccessBackend = HostFunctionBackend<B> &&
    requires(B& b, typename B::Stream s, HostFunction fn, void* data, std::span<const KernelAccess> accesses) {
    { b.launch_kernel(s, fn, data, accesses) }
    noexcept->std::same_as<Status>;
};

/// Optional, for checking backends (MockBackend): `b.check_host_access(host, n, writes)` noexcept
/// -> Status: the host is about to read (or, `writes`, write) `n` bytes of host memory with its
/// own code; busy (a misuse) when pending work still writes them, or still reads them and the
/// host writes. The Stager announces its reads and writes of a mapped mirror this way.
template <class B>
concept HostAccessCheckBackend = MappedHostBackend<B> && requires(B& b, const void* host, std::size_t n, bool w) {
    { b.check_host_access(host, n, w) }
    noexcept->std::same_as<Status>;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
