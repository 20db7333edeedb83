// SPDX-License-Identifier: Apache-2.0
// Stages a few tensors through SimBackend with both strategies and prints what happened.
#include <cstdio>
#include <vector>

#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"

namespace {
template <class Strategy>
int demo(const char* label) {
    devstage::SimBackend sim;
    devstage::Stager<devstage::SimBackend, Strategy> stager(sim);
    std::vector<float> hidden(4096, 1.0f), weights(65536, 0.5f), cache(8192, 0.0f), logits(1000);
    const devstage::TensorArg args[] = {
        {hidden.data(), hidden.size() * sizeof(float), devstage::Direction::In},
        {weights.data(), weights.size() * sizeof(float), devstage::Direction::In},
        {cache.data(), cache.size() * sizeof(float), devstage::Direction::InOut},
        {logits.data(), logits.size() * sizeof(float), devstage::Direction::Out},
    };
    for (int step = 0; step < 10; ++step) {
        auto run = stager.bind(args);
        if (!run) {
            std::fprintf(stderr, "bind failed: %s\n", run.status().message().c_str());
            return 1;
        }
        // A real engine launches its kernel on run->device_args() here.
        if (auto status = stager.finish(std::move(*run)); !status) {
            std::fprintf(stderr, "finish failed: %s\n", status.message().c_str());
            return 1;
        }
    }
    const auto& s = stager.stats();
    std::printf(
        "%-16s runs %llu  device mallocs %llu  frees %llu  regrows %llu  retained %llu B  to device %llu B  back %llu "
        "B\n",
        label, static_cast<unsigned long long>(s.runs), static_cast<unsigned long long>(s.device_mallocs),
        static_cast<unsigned long long>(s.device_frees), static_cast<unsigned long long>(s.regrows),
        static_cast<unsigned long long>(s.retained_bytes), static_cast<unsigned long long>(s.bytes_to_device),
        static_cast<unsigned long long>(s.bytes_from_device));
    return 0;
}
}  // namespace

int main() {
    return demo<devstage::PerTensorMalloc<>>("PerTensorMalloc") | demo<devstage::RetainedBump<>>("RetainedBump");
}
