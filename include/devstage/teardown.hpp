// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// TeardownBackend: a backend that tells the holders of its memory before its device or
/// context goes — before it resets the device, destroys its context or unloads its runtime —
/// so pinned memory is unregistered and freed first, on every path. A pinned pool hooks itself
/// to its backend (and to the backends of the streams it records), and gives everything back
/// when told. Every backend devstage ships models it.
/// `static_assert(devstage::TeardownBackend<MyBackend>);`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <concepts>
#include <cstdint>

#include "devstage/status.hpp"

namespace devstage {

/// What a backend calls before it goes: `function(user)`, once. A plain function and a user
/// pointer, so a C caller can give one.
struct TeardownHook {
    void (*function)(void* user) noexcept = nullptr;
    void* user = nullptr;
};

/// `b.add_teardown_hook(hook)` noexcept -> Result<std::uint64_t>: `hook` runs once, before the
/// backend's device or context is reset or finalized (its destruction, or a reset it offers),
/// the hooks added last first; the id removes it. `b.remove_teardown_hook(id)` noexcept: the
/// hook will not run; if it is running in another thread, the call returns once it returned.
/// A hook may call the backend (to wait, unregister and free) but not add or remove hooks of
/// it.
template <class B>
concept TeardownBackend = requires(B& b, TeardownHook hook, std::uint64_t id) {
    { b.add_teardown_hook(hook) }
    noexcept->std::same_as<Result<std::uint64_t>>;
    { b.remove_teardown_hook(id) }
    noexcept->std::same_as<void>;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
