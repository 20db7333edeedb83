// SPDX-License-Identifier: Apache-2.0
// The C stagers of one strategy: Packed<DEVSTAGE_PACK_LIMIT_4K>.
#include "stager_of.hpp"

namespace devstage::capi {

template std::unique_ptr<AnyStager> make_stager_of<Packed<DEVSTAGE_PACK_LIMIT_4K>>(AnyBackend&,
                                                                                   Packed<DEVSTAGE_PACK_LIMIT_4K>,
                                                                                   std::size_t);

}  // namespace devstage::capi
