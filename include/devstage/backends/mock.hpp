// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// MockBackend: a backend for tests — ours and our users'. Plain host memory behind device
/// pointers (data round-trips can be checked), a journal of every call, per-operation
/// counters, fault injection, configurable returned alignment (including adversarial
/// offsets), and detection of double free, unknown pointers, out-of-bounds copies and leaks.
/// Its streams run work at the call, or — `MockConfig::deferred_async` — only when the host
/// synchronizes, in an adversarial order: a race detector for stream-ordered code.
/// The header to include; its parts: mock_journal.hpp (MockOp, MockCall), mock_config.hpp
/// (MockConfig), and in
/// backends/detail/ the call ledger (counts, journal, fault injection) and the streams with
/// their deferred-execution engine.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include "devstage/backend.hpp"
#include "devstage/backends/detail/mock_backend.hpp"  // IWYU pragma: export
#include "devstage/backends/detail/mock_mapped.hpp"   // IWYU pragma: export
#include "devstage/backends/detail/mock_memory.hpp"   // IWYU pragma: export
#include "devstage/instrumentation.hpp"

namespace devstage {

static_assert(Backend<MockBackend>);
static_assert(PinnedHostBackend<MockBackend>);
static_assert(MemsetBackend<MockBackend>);
static_assert(SynchronizingBackend<MockBackend>);
static_assert(AsyncBackend<MockBackend>);
static_assert(HostFunctionBackend<MockBackend>);
static_assert(AsyncMemsetBackend<MockBackend>);
static_assert(BatchCopyBackend<MockBackend>);
static_assert(HostRegisterBackend<MockBackend>);
static_assert(MappedHostBackend<MockBackend>);
static_assert(KernelAccessBackend<MockBackend>);
static_assert(HostAccessCheckBackend<MockBackend>);
static_assert(TeardownBackend<MockBackend>);

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
