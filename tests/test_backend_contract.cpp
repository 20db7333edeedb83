// SPDX-License-Identifier: Apache-2.0
// The backend contract over the simulator and the mock (natural and adversarial alignment).
#include <tuple>

#include "support.hpp"

using ContractBackends = std::tuple<devstage::SimBackend, devstage::MockBackend, devstage::test::AdversarialMock>;
#include "backend_contract.hpp"
