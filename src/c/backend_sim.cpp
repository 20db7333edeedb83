// SPDX-License-Identifier: Apache-2.0
// The simulator as a C backend.
#include <cstddef>
#include <utility>

#include "any_backend.hpp"
#include "devstage/backends/sim.hpp"
#include "wrapped_backend.hpp"

namespace devstage::capi {

Result<BackendPtr> make_sim_backend(int device, std::size_t device_capacity, const SimHost* host) {
    SimConfig config{.device = device};
    if (device_capacity != 0) config.device_capacity = device_capacity;
    return share(
        new Wrapped<SimBackend>(DEVSTAGE_BACKEND_SIM, std::in_place, config, host != nullptr ? *host : SimHost{}));
}

}  // namespace devstage::capi
