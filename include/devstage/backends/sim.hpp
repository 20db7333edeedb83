// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// SimBackend: an accelerator simulated in host memory, the default backend of the examples
/// and benchmarks. Device memory is mmap'd per allocation (a fresh allocation costs page
/// faults, as on a device), capacity is configurable (out-of-memory is reproducible), pinned
/// memory is really page-locked, and copies from pageable memory go through a bounded bounce
/// buffer in chunks, as drivers do — so pinned vs pageable is measurable without a device.
/// Streams are real: each runs its work in order on a thread of its own. A link model adds
/// the modeled cost of every copy to a counter, so the number of copies shows without a device.
/// The header to include; its parts: sim_config.hpp (SimConfig, SimStats), sim_link.hpp
/// (SimLinkCost, SimLinkModel), and in backends/detail/ the memory, virtual memory, bounce
/// buffer and streams it is built from.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include "devstage/backend.hpp"
#include "devstage/backends/detail/sim_async_copies.hpp"  // IWYU pragma: export
#include "devstage/backends/detail/sim_backend.hpp"       // IWYU pragma: export
#include "devstage/backends/detail/sim_copies.hpp"        // IWYU pragma: export
#include "devstage/backends/detail/sim_host_memory.hpp"   // IWYU pragma: export
#include "devstage/backends/detail/sim_mapped.hpp"        // IWYU pragma: export
#include "devstage/instrumentation.hpp"

namespace devstage {

static_assert(Backend<SimBackend>);
static_assert(BatchCopyBackend<SimBackend>);
static_assert(PinnedHostBackend<SimBackend>);
static_assert(MemsetBackend<SimBackend>);
static_assert(SynchronizingBackend<SimBackend>);
static_assert(VirtualMemoryBackend<SimBackend>);
static_assert(AsyncBackend<SimBackend>);
static_assert(HostFunctionBackend<SimBackend>);
static_assert(AsyncMemsetBackend<SimBackend>);
static_assert(PinnedQueryBackend<SimBackend>);
static_assert(HostRegisterBackend<SimBackend>);
static_assert(MappedHostBackend<SimBackend>);
static_assert(KernelAccessBackend<SimBackend>);
static_assert(StreamCheckBackend<SimBackend>);
static_assert(TeardownBackend<SimBackend>);

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
