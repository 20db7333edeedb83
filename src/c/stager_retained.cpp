// SPDX-License-Identifier: Apache-2.0
// The C stagers of one strategy kind: RetainedBump with a run-time growth rule (packing and mapping are options).
#include "stager_of.hpp"

namespace devstage::capi {

template std::unique_ptr<AnyStager> make_stager_of<Retained>(AnyBackend&, Retained, const StagerOptions&);

}  // namespace devstage::capi
