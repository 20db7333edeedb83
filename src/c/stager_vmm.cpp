// SPDX-License-Identifier: Apache-2.0
// The C stagers of one strategy kind: RetainedVmm.
#include "stager_of.hpp"

namespace devstage::capi {

template std::unique_ptr<AnyStager> make_stager_of<Vmm>(AnyBackend&, Vmm, const StagerOptions&);

}  // namespace devstage::capi
