// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// MockConfig: the construction options of MockBackend (backends/mock.hpp, which includes
/// this header).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <limits>

#include "devstage/status.hpp"

namespace devstage {

/// Construction options of a MockBackend. `MockBackend mock(MockConfig::adversarial());`
struct MockConfig {
    /// Returned pointers are a 4096-aligned block plus this offset. The default 0 gives
    /// page alignment; `device_alignment` (64) gives pointers aligned to exactly 64 and not
    /// 128; an offset that is not a multiple of 64 breaks the backend's own promise, to test
    /// that callers check it.
    std::size_t offset = 0;
    std::size_t device_capacity = std::numeric_limits<std::size_t>::max();
    bool journal = true;
    ErrorSink sink{};  ///< where the leak report goes on destruction
    /// Enqueued work runs only when the host synchronizes, in an adversarial order across
    /// streams (see MockBackend). False: it runs at the enqueuing call.
    bool deferred_async = false;
    /// With deferred_async: event_ready answers "not ready" this many times per recording,
    /// then runs what the recording depends on and answers ready.
    std::uint32_t not_ready_polls = 2;
    /// What batch_copy_limit() answers: the most copies a copy_*_batch call takes. 0 (the
    /// default): no batches, as a runtime without the batch call; a Stager then copies one by one.
    std::size_t batch_copy_limit = 0;

    static MockConfig adversarial() noexcept { return MockConfig{.offset = 64}; }
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
