// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// OutputPolicy: what a Stager does with the device bytes of a run's Out args before the
/// run's kernels can see them (re-exported by stager.hpp).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstdint>

namespace devstage {

/// `stager.set_output_policy(devstage::OutputPolicy::kernel_writes_all)`
enum class OutputPolicy : std::uint8_t {
    /// The default: every Out arg's device bytes are set to zero on the bind's stream, so a
    /// byte the kernel leaves unwritten comes back as zero, never as another run's data.
    zero,
    /// Out args are left as the device memory was (a retained buffer holds what an earlier run
    /// left there): for engines whose kernels write every byte of every output.
    kernel_writes_all,
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
