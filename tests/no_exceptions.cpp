// SPDX-License-Identifier: Apache-2.0
// Compiled with -fno-exceptions: every header must build, and a staged run must work.
#include <cstdio>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"

int main() {
    devstage::SimBackend sim;
    devstage::PinnedHostPool<devstage::SimBackend> pool(sim);
    devstage::Result<devstage::PinnedBuffer> input = pool.allocate(4096);
    if (!input) return 1;
    std::vector<float> output(256, 0.0f);
    const devstage::TensorArg args[] = {{input->data(), input->size(), devstage::Direction::In},
                                        {output.data(), output.size() * sizeof(float), devstage::Direction::Out}};
    devstage::Stager<devstage::SimBackend> stager(sim);
    devstage::Result<devstage::StagedRun> run = stager.bind(args);
    if (!run) return 2;
    if (!stager.finish(std::move(*run))) return 3;
    {
        // One pool over several mocks with NUMA placement: a stream of another backend, forget.
        devstage::MockBackend host, other;
        devstage::PinnedHostPool<devstage::MockBackend> shared(host, {}, devstage::NumaPlacement{.enabled = true});
        if (!shared.set_numa_node(other, 0)) return 5;
        devstage::Result<devstage::PinnedBuffer> near = shared.allocate_near(other, 4096);
        devstage::Result<devstage::MockBackend::Stream> stream = other.create_stream();
        if (!near || !stream || !shared.record(*near, *stream, other)) return 6;
        near->reset();
        if (!shared.forget(other) || !other.destroy_stream(*stream)) return 7;
    }
    {
        // Big requests, regions in background threads and their hooks, describe, the limits.
        devstage::MockBackend mock;
        devstage::PinnedHostPool<devstage::MockBackend> big(
            mock, {}, devstage::PinnedPoolOptions{.exact = {.threshold = 1 << 16, .chunk_bytes = 1 << 14}});
        int added = 0;
        devstage::RegionHooks hooks;
        hooks.added = [&added](const devstage::PinnedRegion&) {
            ++added;
            return devstage::Status();
        };
        if (!big.set_region_hooks(std::move(hooks))) return 8;
        devstage::Result<devstage::PinnedBuffer> exact = big.allocate((1 << 16) + 1);
        devstage::Result<devstage::PinnedRegionHandle> region =
            big.create_region(1 << 20, devstage::RegionOptions{.threads = 2});
        if (!exact || !region || !region->wait()) return 9;
        devstage::Result<devstage::PinnedBuffer> slice = region->allocate(4096, 4096);
        if (!slice || !big.describe(slice->data()) || big.regions().size() != 2 || added != 2) return 10;
        if (!devstage::check_pin_request(4096, 0, devstage::PinLimits{}, false)) return 11;
    }
    std::printf("staged %llu bytes without exceptions\n",
                static_cast<unsigned long long>(stager.stats().bytes_to_device));
    return stager.stats().runs == 1 ? 0 : 4;
}
