// SPDX-License-Identifier: Apache-2.0
// The C stagers of one strategy kind: PerTensorMalloc.
#include "stager_of.hpp"

namespace devstage::capi {

template std::unique_ptr<AnyStager> make_stager_of<PerTensor>(AnyBackend&, PerTensor, const StagerOptions&);

}  // namespace devstage::capi
