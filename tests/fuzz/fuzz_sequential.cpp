// SPDX-License-Identifier: Apache-2.0
// Sequential equivalence: a random engine program read from the fuzzer's bytes. The first two
// bytes choose the configuration (backend, strategy, slots, streams, ring, shared or disjoint
// host memory); the rest drive the engine's moves until they run out — and, where the
// configuration has them, the faults injected at the stager's calls, batched copies, bind_slot,
// reserve and release, buffers in several args of one run and synchronous steps. Any difference
// from the program's sequential run, any unjustified refusal or error, any failure no injected
// fault explains, any leak and any misuse the backend counts aborts
// (tests/sequential_program.hpp says what is checked). DEVSTAGE_SEQ_EXPECT turns on what the
// library does not give yet (tests/sequential_config.hpp).
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "../sequential_program.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    static const unsigned expect = sequential::expectations_from_env();
    sequential::Choices choices(data + 2, size - 2);
    sequential::Config config =
        sequential::config_for(static_cast<std::uint64_t>(data[0]) | data[1] << 8, choices, expect);
    config.max_steps = 24;
    const sequential::Report report = sequential::run_program(config, choices);
    if (!report.ok()) std::fprintf(stderr, "%s\n", report.text().c_str());
    EXPECT(report.ok());
    return 0;
}
