// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Umbrella header: every public devstage facility (backends are included separately).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include "devstage/backend.hpp"
#include "devstage/completion.hpp"
#include "devstage/frame.hpp"
#include "devstage/host_copy.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/lease.hpp"
#include "devstage/output_policy.hpp"
#include "devstage/pageable.hpp"
#include "devstage/pinned.hpp"
#include "devstage/plan.hpp"
#include "devstage/region.hpp"
#include "devstage/run.hpp"
#include "devstage/stager.hpp"
#include "devstage/stager_options.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/strategy/retained_vmm.hpp"
#include "devstage/stream.hpp"
#include "devstage/teardown.hpp"
#include "devstage/tensor.hpp"

#endif  // DEVSTAGE_CXX20
