// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the fuzz targets: a silent error sink and an invariant check that aborts (so
// libFuzzer records the input).

#include <cstdio>
#include <cstdlib>

#include "devstage/status.hpp"

namespace fuzz {

inline void quiet(const devstage::Status&) noexcept {}

[[noreturn]] inline void violated(const char* what) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
}

}  // namespace fuzz

#define EXPECT(condition)                               \
    do {                                                \
        if (!(condition)) ::fuzz::violated(#condition); \
    } while (0)
