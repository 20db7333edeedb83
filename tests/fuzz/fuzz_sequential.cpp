// SPDX-License-Identifier: Apache-2.0
// Sequential equivalence: a random engine program read from the fuzzer's bytes. The first two
// bytes choose the configuration (backend, strategy, slots, streams, ring, shared or disjoint
// host memory); the rest drive the engine's moves until they run out. Any difference from the
// program's sequential run, any unjustified refusal or error, and any misuse the backend
// counts aborts (tests/sequential_program.hpp says what is checked).
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "../sequential_program.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    sequential::Choices choices(data + 2, size - 2);
    sequential::Config config = sequential::config_for(static_cast<std::uint64_t>(data[0]) | data[1] << 8, choices);
    config.max_steps = 24;
    const sequential::Report report = sequential::run_program(config, choices);
    if (!report.ok()) std::fprintf(stderr, "%s\n", report.text().c_str());
    EXPECT(report.ok());
    return 0;
}
