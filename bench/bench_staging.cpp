// SPDX-License-Identifier: Apache-2.0
// devstage benchmarks. Every comparison runs side by side in one process; bench/run.sh turns
// the JSON into docs/performance.md. Counters sit next to the times.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory_resource>
#include <vector>

#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"
#include "qwen3_decode.hpp"

namespace {
using namespace devstage;

// ---- 1. bind+finish overhead, copies excluded ---------------------------------------------
// A backend whose copies do nothing: what remains is the staging bookkeeping.
class NullCopyBackend {
public:
    static constexpr std::size_t device_alignment = 256;
    std::string_view name() const noexcept { return "null-copy"; }
    Result<void*> device_malloc(std::size_t n) noexcept {
        void* p =
            std::aligned_alloc(device_alignment, (n + device_alignment - 1) / device_alignment * device_alignment);
        if (p == nullptr) return Status(Errc::out_of_memory, "null-copy: out of memory");
        return p;
    }
    Status device_free(void* p) noexcept {
        std::free(p);
        return {};
    }
    Status copy_to_device(void*, const void*, std::size_t) noexcept { return {}; }
    Status copy_from_device(void*, const void*, std::size_t) noexcept { return {}; }
};

std::vector<TensorArg> make_args(std::size_t count, std::vector<std::byte>& host) {
    std::vector<TensorArg> args;
    host.assign(64, std::byte{});
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t bytes = 512 + (i * 7919) % 65536;
        args.push_back(TensorArg{host.data(), bytes, static_cast<Direction>(i % 3)});
    }
    return args;
}

template <class Strategy>
void BM_bind_finish(benchmark::State& state) {
    NullCopyBackend backend;
    Stager<NullCopyBackend, Strategy> stager(backend);
    std::vector<std::byte> host;
    const auto args = make_args(static_cast<std::size_t>(state.range(0)), host);
    for (auto _ : state) {
        auto run = stager.bind(args);
        benchmark::DoNotOptimize(run->device_args().data());
        if (!stager.finish(std::move(*run))) state.SkipWithError("finish failed");
    }
    state.counters["tensors"] = static_cast<double>(args.size());
    state.counters["mallocs_per_run"] =
        static_cast<double>(stager.stats().device_mallocs) / static_cast<double>(stager.stats().runs);
    state.SetItemsProcessed(state.iterations() * state.range(0));
}

// Peers over the same device buffer: a pmr resource handing out 1024-aligned pieces of it.
template <class Resource>
void BM_pmr_peer(benchmark::State& state) {
    std::vector<std::byte> host;
    const auto args = make_args(static_cast<std::size_t>(state.range(0)), host);
    std::size_t total = 0;
    for (const auto& a : args) total += (a.bytes + 1023) / 1024 * 1024 + 1024;
    total = total * 4 + (std::size_t{1} << 20);  // the pool peer takes whole chunks from its upstream
    NullCopyBackend backend;
    void* device = *backend.device_malloc(total);
    std::vector<void*> pointers(args.size());
    for (auto _ : state) {
        std::pmr::monotonic_buffer_resource arena(device, total, std::pmr::null_memory_resource());
        if constexpr (std::is_same_v<Resource, std::pmr::monotonic_buffer_resource>) {
            for (std::size_t i = 0; i < args.size(); ++i) pointers[i] = arena.allocate(args[i].bytes, 1024);
        } else {
            Resource pool(&arena);
            for (std::size_t i = 0; i < args.size(); ++i) pointers[i] = pool.allocate(args[i].bytes, 1024);
            for (std::size_t i = 0; i < args.size(); ++i) pool.deallocate(pointers[i], args[i].bytes, 1024);
        }
        benchmark::DoNotOptimize(pointers.data());
    }
    (void)backend.device_free(device);
    state.SetItemsProcessed(state.iterations() * state.range(0));
}

// The limit: a bare prefix sum of the aligned sizes.
void BM_prefix_sum(benchmark::State& state) {
    std::vector<std::byte> host;
    const auto args = make_args(static_cast<std::size_t>(state.range(0)), host);
    std::vector<std::size_t> offsets(args.size());
    for (auto _ : state) {
        std::size_t end = 0;
        for (std::size_t i = 0; i < args.size(); ++i) {
            offsets[i] = end;
            end += (args[i].bytes + 1023) & ~std::size_t{1023};
        }
        benchmark::DoNotOptimize(offsets.data());
        benchmark::DoNotOptimize(end);
    }
    state.SetItemsProcessed(state.iterations() * state.range(0));
}

#define TENSOR_COUNTS Arg(1)->Arg(19)->Arg(256)->Arg(4096)
BENCHMARK(BM_bind_finish<RetainedBump<>>)->Name("overhead/RetainedBump")->TENSOR_COUNTS;
BENCHMARK(BM_bind_finish<PerTensorMalloc<>>)->Name("overhead/PerTensorMalloc")->TENSOR_COUNTS;
BENCHMARK(BM_pmr_peer<std::pmr::monotonic_buffer_resource>)->Name("overhead/pmr_monotonic")->TENSOR_COUNTS;
BENCHMARK(BM_pmr_peer<std::pmr::unsynchronized_pool_resource>)->Name("overhead/pmr_unsync_pool")->TENSOR_COUNTS;
BENCHMARK(BM_prefix_sum)->Name("overhead/prefix_sum")->TENSOR_COUNTS;

// ---- 2. decode steady state on SimBackend ---------------------------------------------------
constexpr double decode_scale = 0.001;

struct DecodeFixture {
    SimBackend sim;
    PinnedHostPool<SimBackend> pool{sim};
    qwen3::PinnedStorage storage{pool};
    qwen3::Inputs inputs = qwen3::generate(storage, decode_scale);
};

template <class Strategy>
void BM_decode(benchmark::State& state) {
    DecodeFixture f;
    Stager<SimBackend, Strategy> stager(f.sim);
    for (auto _ : state) {
        auto run = stager.bind(f.inputs.args);
        if (!run || !stager.finish(std::move(*run))) state.SkipWithError("decode step failed");
    }
    const auto& s = stager.stats();
    state.counters["mallocs_per_step"] = static_cast<double>(s.device_mallocs) / static_cast<double>(s.runs);
    state.counters["MB_per_step"] =
        static_cast<double>(s.bytes_to_device + s.bytes_from_device) / 1e6 / static_cast<double>(s.runs);
    state.counters["bounced_MB"] = static_cast<double>(f.sim.stats().bounced_bytes) / 1e6;
}

// The physical limit: a memcpy of the same bytes in and out, into one preallocated buffer.
void BM_decode_raw_memcpy(benchmark::State& state) {
    DecodeFixture f;
    std::size_t total = 0;
    for (const auto& a : f.inputs.args) total += a.bytes;
    std::vector<std::byte> device(total);
    for (auto _ : state) {
        std::size_t offset = 0;
        for (const auto& a : f.inputs.args) {
            if (uploads(a.direction)) std::memcpy(device.data() + offset, a.data, a.bytes);
            offset += a.bytes;
        }
        offset = 0;
        for (const auto& a : f.inputs.args) {
            if (copies_back(a.direction)) std::memcpy(a.data, device.data() + offset, a.bytes);
            offset += a.bytes;
        }
        benchmark::ClobberMemory();
    }
}
BENCHMARK(BM_decode<RetainedBump<>>)->Name("decode/RetainedBump")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_decode<PerTensorMalloc<>>)->Name("decode/PerTensorMalloc")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_decode_raw_memcpy)->Name("decode/raw_memcpy")->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- 3. prefill with a growing sequence -----------------------------------------------------
// One step per sequence length 128 → 8192 (doubling); each step stages activations sized by
// the length. Reports regrows and peak retained bytes per growth policy.
template <class Strategy>
void BM_prefill(benchmark::State& state) {
    const std::size_t hidden = 5120;
    std::vector<std::byte> host(8192 * hidden * 2);
    std::uint64_t regrows = 0, peak = 0;
    for (auto _ : state) {
        SimBackend sim;
        Stager<SimBackend, Strategy> stager(sim);
        for (std::size_t tokens = 128; tokens <= 8192; tokens += 128) {
            const TensorArg args[] = {{host.data(), tokens * hidden * 2, Direction::In},
                                      {host.data(), tokens * 1024 * 2, Direction::InOut}};
            auto run = stager.bind(args);
            if (!run || !stager.finish(std::move(*run))) state.SkipWithError("prefill step failed");
        }
        regrows = stager.stats().regrows;
        peak = sim.stats().peak_device_bytes;
    }
    state.counters["regrows"] = static_cast<double>(regrows);
    state.counters["peak_retained_MB"] = static_cast<double>(peak) / 1e6;
}
BENCHMARK(BM_prefill<RetainedBump<ExactGrowth>>)
    ->Name("prefill/ExactGrowth")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_prefill<RetainedBump<GeometricGrowth<3, 2>>>)
    ->Name("prefill/GeometricGrowth<3,2>")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_prefill<RetainedBump<GranularGrowth<std::size_t{32} << 20>>>)
    ->Name("prefill/GranularGrowth<32MiB>")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Steady-state step time per sequence length: the second plot of docs/performance.md.
template <class Strategy>
void BM_prefill_step(benchmark::State& state) {
    const auto tokens = static_cast<std::size_t>(state.range(0));
    const std::size_t hidden = 5120;
    SimBackend sim;
    PinnedHostPool<SimBackend> pool(sim);
    auto activations = pool.allocate(tokens * hidden * 2);
    auto cache = pool.allocate(tokens * 1024 * 2);
    const TensorArg args[] = {{activations->data(), activations->size(), Direction::In},
                              {cache->data(), cache->size(), Direction::InOut}};
    Stager<SimBackend, Strategy> stager(sim);
    for (auto _ : state) {
        auto run = stager.bind(args);
        if (!run || !stager.finish(std::move(*run))) state.SkipWithError("prefill step failed");
    }
    state.counters["tokens"] = static_cast<double>(tokens);
    state.counters["mallocs_per_step"] =
        static_cast<double>(stager.stats().device_mallocs) / static_cast<double>(stager.stats().runs);
}
#define SEQUENCE_LENGTHS Arg(128)->Arg(512)->Arg(1024)->Arg(2048)->Arg(4096)->Arg(8192)
BENCHMARK(BM_prefill_step<RetainedBump<>>)
    ->Name("prefill_step/RetainedBump")
    ->SEQUENCE_LENGTHS->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_prefill_step<PerTensorMalloc<>>)
    ->Name("prefill_step/PerTensorMalloc")
    ->SEQUENCE_LENGTHS->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_prefill<RetainedVmm<>>)->Name("prefill/RetainedVmm")->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- 4. pinned vs pageable staging; pinned pool with and without the cache -----------------
template <bool Pinned>
void BM_staging_memory(benchmark::State& state) {
    SimBackend sim;
    PinnedHostPool<SimBackend> pool(sim);
    qwen3::PinnedStorage pinned(pool);
    qwen3::PageableStorage pageable;
    const qwen3::Inputs inputs =
        Pinned ? qwen3::generate(pinned, decode_scale) : qwen3::generate(pageable, decode_scale);
    Stager<SimBackend> stager(sim);
    for (auto _ : state) {
        auto run = stager.bind(inputs.args);
        if (!run || !stager.finish(std::move(*run))) state.SkipWithError("step failed");
    }
    state.counters["bounced_MB_per_step"] =
        static_cast<double>(sim.stats().bounced_bytes) / 1e6 / static_cast<double>(stager.stats().runs);
}
BENCHMARK(BM_staging_memory<true>)->Name("host_memory/pinned")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_staging_memory<false>)->Name("host_memory/pageable")->Unit(benchmark::kMillisecond)->UseRealTime();

template <class Cache>
void BM_pinned_pool(benchmark::State& state) {
    SimBackend sim;
    PinnedHostPool<SimBackend, Cache> pool(sim);
    for (auto _ : state) {
        auto buffer = pool.allocate(static_cast<std::size_t>(state.range(0)));
        benchmark::DoNotOptimize(buffer->data());
    }
    state.counters["backend_allocations"] = static_cast<double>(pool.stats().backend_allocations);
}
BENCHMARK(BM_pinned_pool<CachingPinned>)->Name("pinned_pool/CachingPinned")->Arg(1 << 20);
BENCHMARK(BM_pinned_pool<DirectPinned>)->Name("pinned_pool/DirectPinned")->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
