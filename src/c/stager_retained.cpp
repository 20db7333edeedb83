// SPDX-License-Identifier: Apache-2.0
// The C stagers of one strategy: Retained.
#include "stager_of.hpp"

namespace devstage::capi {

template std::unique_ptr<AnyStager> make_stager_of<Retained>(AnyBackend&, Retained, std::size_t);

}  // namespace devstage::capi
