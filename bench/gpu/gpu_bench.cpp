// SPDX-License-Identifier: Apache-2.0
// The seeds' claims measured on an NVIDIA GPU through CudaBackend:
//  1. decode steady state, RetainedBump vs PerTensorMalloc, on the Qwen3-14B-decode-shaped set;
//  2. host-to-device and device-to-host throughput from pinned vs pageable memory;
//  3. cudaHostAlloc cost vs a PinnedHostPool cache hit.
// Usage: gpu_bench [scale (default 1.0)] [steps (default 4)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "devstage/backends/cuda.hpp"
#include "devstage/devstage.hpp"
#include "qwen3_decode.hpp"

using namespace devstage;
using Clock = std::chrono::steady_clock;

namespace {
double ms_since(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

struct StepTimes {
    double bind_ms, finish_ms, step_ms, mallocs_per_step;
    std::uint64_t up, down;
};

template <class Strategy>
StepTimes decode(CudaBackend& gpu, const qwen3::Inputs& inputs, int steps) {
    Stager<CudaBackend, Strategy> stager(gpu);
    std::vector<double> bind, finish, step;
    std::uint64_t mallocs_after_first = 0;
    for (int i = 0; i < steps; ++i) {
        const auto t0 = Clock::now();
        auto run = stager.bind(inputs.args);
        if (!run) {
            std::fprintf(stderr, "bind: %s\n", run.status().message().c_str());
            std::exit(1);
        }
        (void)gpu.synchronize();
        const double b = ms_since(t0);
        const auto t1 = Clock::now();
        if (Status s = stager.finish(std::move(*run)); !s) {
            std::fprintf(stderr, "finish: %s\n", s.message().c_str());
            std::exit(1);
        }
        const double f = ms_since(t1);
        if (i == 0) {
            mallocs_after_first = stager.stats().device_mallocs;
            continue;
        }
        bind.push_back(b);
        finish.push_back(f);
        step.push_back(b + f);
    }
    const auto& s = stager.stats();
    return {median(bind),
            median(finish),
            median(step),
            static_cast<double>(s.device_mallocs - mallocs_after_first) / std::max(steps - 1, 1),
            s.bytes_to_device / s.runs,
            s.bytes_from_device / s.runs};
}
}  // namespace

int main(int argc, char** argv) {
    const double scale = argc > 1 ? std::atof(argv[1]) : 1.0;
    const int steps = argc > 2 ? std::max(2, std::atoi(argv[2])) : 4;
    auto gpu = CudaBackend::create(0);
    if (!gpu) {
        std::printf("no GPU: %s\n", gpu.status().message().c_str());
        return 77;
    }
    PinnedHostPool<CudaBackend> pool(*gpu);
    qwen3::PinnedStorage pinned_storage(pool);
    qwen3::PageableStorage pageable_storage;
    const auto g0 = Clock::now();
    const qwen3::Inputs pinned = qwen3::generate(pinned_storage, scale);
    const qwen3::Inputs pageable = qwen3::generate(pageable_storage, scale);
    if (!pinned.ok() || !pageable.ok()) {
        std::printf("could not allocate the input set at scale %g: %s\n", scale,
                    pinned_storage.status().message().c_str());
        return 1;
    }
    std::printf("Qwen3-14B decode set at scale %g: %.2f GB in 19 tensors (generated in %.1f s), %d steps\n\n", scale,
                pinned.total_bytes / 1e9, ms_since(g0) / 1e3, steps);

    std::printf("1. decode steady state (pinned inputs)\n%-16s %12s %16s\n", "strategy", "ms/step",
                "device mallocs/step");
    const StepTimes retained = decode<RetainedBump<>>(*gpu, pinned, steps);
    const StepTimes per_tensor = decode<PerTensorMalloc<>>(*gpu, pinned, steps);
    std::printf("%-16s %12.2f %16.1f\n%-16s %12.2f %16.1f\nspeed-up %.2fx\n\n", "RetainedBump", retained.step_ms,
                retained.mallocs_per_step, "PerTensorMalloc", per_tensor.step_ms, per_tensor.mallocs_per_step,
                per_tensor.step_ms / retained.step_ms);

    std::printf("2. copy throughput, RetainedBump (GB/s)\n%-10s %10s %10s\n", "host", "H2D", "D2H");
    const StepTimes paged = decode<RetainedBump<>>(*gpu, pageable, steps);
    for (const auto& [label, t] : {std::pair{"pinned", retained}, std::pair{"pageable", paged}}) {
        std::printf("%-10s %10.2f %10.2f\n", label, t.up / (t.bind_ms * 1e6), t.down / (t.finish_ms * 1e6));
    }

    std::printf("\n3. pinned allocation of 64 MiB (microseconds, median of 20)\n");
    PinnedHostPool<CudaBackend, DirectPinned> direct(*gpu);
    std::vector<double> direct_us, cached_us;
    for (int i = 0; i < 20; ++i) {
        auto t = Clock::now();
        { auto b = direct.allocate(64 << 20); }
        direct_us.push_back(ms_since(t) * 1e3);
        { auto warm = pool.allocate(64 << 20); }
        t = Clock::now();
        { auto b = pool.allocate(64 << 20); }
        cached_us.push_back(ms_since(t) * 1e3);
    }
    std::printf("cudaHostAlloc+cudaFreeHost (DirectPinned) %10.1f\nPinnedHostPool cache hit (CachingPinned) %10.1f\n",
                median(direct_us), median(cached_us));
    return 0;
}
