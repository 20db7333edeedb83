// SPDX-License-Identifier: Apache-2.0
// The AsyncBackend contract over the simulator (real streams), the mock (work at the call) and
// the deferred mock (work when the host synchronizes, in an adversarial order).
#include <tuple>

#include "support.hpp"

using AsyncBackends = std::tuple<devstage::SimBackend, devstage::MockBackend, devstage::test::DeferredMock>;
#include "async_contract.hpp"
