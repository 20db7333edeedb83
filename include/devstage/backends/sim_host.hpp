// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// SimHost: the simulated host that SimBackends of several devices share, as the devices of one
/// server share its host memory.
///
/// `SimHost host; SimBackend gpu0(SimConfig{.device = 0}, host), gpu1(SimConfig{.device = 1}, host);`
///
/// - Pinned memory is the host's: memory pinned by any of its devices (pinned_malloc, or
///   host_register in place) is pinned for every one of them — their copies of it are direct
///   and asynchronous — and any of them may free it (portable pinned memory).
/// - Streams and events stay their device's: one given to another device of the host is
///   invalid_argument naming both devices; one of another host is an unknown stream.
/// - Each device keeps its own memory, capacity, streams, link model and SimStats.
///
/// A SimBackend constructed without a SimHost has a host of its own. Copies of a SimHost refer
/// to the same host, which lives as long as its last copy or backend.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <memory>

#include "devstage/backends/detail/sim_host_state.hpp"

namespace devstage {

class SimBackend;

/// A simulated host shared by SimBackends of several devices (cheap to copy: a reference).
class SimHost {
public:
    SimHost() : state_(std::make_shared<detail::SimHostState>()) {}
    /// True when both name the same host.
    friend bool operator==(const SimHost&, const SimHost&) = default;

private:
    friend class SimBackend;
    std::shared_ptr<detail::SimHostState> state_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
