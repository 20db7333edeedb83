// SPDX-License-Identifier: Apache-2.0
// devstage benchmarks. Every comparison runs side by side in one process; bench/run.sh turns
// the JSON into docs/performance.md. Counters sit next to the times.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <string>
#include <utility>
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
    const auto step = [&] {
        auto run = stager.bind(f.inputs.args);
        return run && stager.finish(std::move(*run)).ok();
    };
    if (!step()) state.SkipWithError("decode step failed");  // outside the timing: RetainedBump grows
    const StagerStats before = stager.stats();
    const std::uint64_t bounced_before = f.sim.stats().bounced_bytes;
    for (auto _ : state) {
        if (!step()) state.SkipWithError("decode step failed");
    }
    const StagerStats& s = stager.stats();
    const auto steps = static_cast<double>(std::max<std::uint64_t>(s.runs - before.runs, 1));
    state.counters["scale"] = decode_scale;
    state.counters["mallocs_per_step"] = static_cast<double>(s.device_mallocs - before.device_mallocs) / steps;
    state.counters["MB_per_step"] = static_cast<double>(s.bytes_to_device + s.bytes_from_device -
                                                        before.bytes_to_device - before.bytes_from_device) /
                                    1e6 / steps;
    state.counters["bounced_MB_per_step"] =
        static_cast<double>(f.sim.stats().bounced_bytes - bounced_before) / 1e6 / steps;
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

// ---- 5. copies per decode step: packing, frames, stream order -----------------------------
// A decode step is bound by the number of copies, not bytes: each costs microseconds whatever
// its size. Two input sets in pinned memory: the small step of the H200 reference (four small
// In tensors and one Out tensor) and the Qwen3-14B set above. Each is staged without packing,
// packing args of at most 16 KiB, packing every arg of the small step (limit 160 KiB), and as
// a frame written in place; synchronously, and stream-ordered (bind, finish on a stream, wait
// on the Completion: one host wait per step). The limit: one H2D and one D2H of the same
// bytes, modeled by the simulator's link model and timed as bare copies.
enum class CopySet { small_step, qwen3 };

constexpr std::size_t pack_all_small = 163840;  // the largest tensor of the small step

struct CopyFixture {
    SimBackend sim;
    PinnedHostPool<SimBackend> pool{sim};
    qwen3::PinnedStorage storage{pool};
    std::vector<TensorArg> args;
    std::vector<TensorShape> shapes;
    std::uint64_t in_bytes = 0, out_bytes = 0;
    double scale = 1;

    explicit CopyFixture(CopySet set) {
        if (set == CopySet::qwen3) {
            scale = decode_scale;
            args = qwen3::generate(storage, decode_scale).args;
        } else {
            const std::pair<std::size_t, Direction> small[] = {{163840, Direction::In},
                                                               {2048, Direction::In},
                                                               {128, Direction::In},
                                                               {64, Direction::In},
                                                               {163840, Direction::Out}};
            for (const auto& [bytes, direction] : small) {
                const std::span<std::byte> memory = storage.allocate(bytes);
                if (memory.size() != bytes) {
                    args.clear();
                    break;
                }
                std::memset(memory.data(), 0x5A, bytes);
                args.push_back(TensorArg{memory.data(), bytes, direction});
            }
        }
        for (const TensorArg& arg : args) {
            shapes.push_back(TensorShape{arg.bytes, arg.direction});
            if (uploads(arg.direction)) in_bytes += arg.bytes;
            if (copies_back(arg.direction)) out_bytes += arg.bytes;
        }
    }
    bool ok() const { return !args.empty(); }

    // The modeled packed limit: one H2D and one D2H of the step's bytes on the link model.
    double limit_ns() const {
        const SimLinkModel& link = sim.config().link;
        return static_cast<double>(link.to_device_pinned.nanoseconds(in_bytes) +
                                   link.from_device_pinned.nanoseconds(out_bytes));
    }

    // What every section-5 benchmark reports beside its time, from counter deltas over `steps`.
    void report(benchmark::State& state, const SimStats& before, std::uint64_t steps) const {
        const SimStats& after = sim.stats();
        const auto n = static_cast<double>(std::max<std::uint64_t>(steps, 1));
        const double modeled = static_cast<double>(after.modeled_ns - before.modeled_ns) / n;
        state.counters["copies_per_step"] = static_cast<double>(after.copies_to_device + after.copies_from_device -
                                                                before.copies_to_device - before.copies_from_device) /
                                            n;
        state.counters["modeled_us_per_step"] = modeled / 1e3;
        state.counters["limit_us"] = limit_ns() / 1e3;
        state.counters["modeled_over_limit"] = modeled / limit_ns();
        state.counters["KB_per_step"] = static_cast<double>(in_bytes + out_bytes) / 1e3;
        state.counters["tensors"] = static_cast<double>(args.size());
        state.counters["scale"] = scale;
        const SimLinkCost& link = sim.config().link.to_device_pinned;
        state.counters["link_latency_ns"] = static_cast<double>(link.latency_ns);
        state.counters["link_GBps"] = static_cast<double>(link.bytes_per_second) / 1e9;
    }
};

template <class Strategy, bool InPlace, bool Streamed>
void BM_copies(benchmark::State& state, CopySet set) {
    CopyFixture f(set);
    if (!f.ok()) {
        state.SkipWithError("could not allocate the input set");
        return;
    }
    std::optional<SimBackend::Stream> stream;
    if constexpr (Streamed) {
        auto created = f.sim.create_stream();
        if (!created) {
            state.SkipWithError("create_stream failed");
            return;
        }
        stream = *created;
    }
    {
        Stager<SimBackend, Strategy> stager(f.sim, {}, Streamed ? 2 : 1);
        std::uint64_t token = 0;
        const auto step = [&]() -> Status {
            std::optional<HostFrame> frame;
            std::span<const TensorArg> args = f.args;
            if constexpr (InPlace) {
                // The engine writes its inputs into the frame; one word per tensor stands in
                // for that (the other variants reuse inputs written once).
                Result<HostFrame> made = stager.frame(f.shapes);
                if (!made) return made.status();
                frame.emplace(std::move(*made));
                ++token;
                for (std::size_t i = 0; i < frame->size(); ++i) {
                    if (uploads(f.shapes[i].direction)) std::memcpy(frame->host(i).data(), &token, sizeof token);
                }
                args = frame->args();
            }
            if constexpr (Streamed) {
                auto run = stager.bind(args, *stream);
                if (!run) return run.status();
                auto done = stager.finish(std::move(*run), *stream);
                if (!done) return done.status();
                return done->wait();
            } else {
                auto run = stager.bind(args);
                if (!run) return run.status();
                return stager.finish(std::move(*run));
            }
        };
        // One step per slot outside the timing: each grows its slot's buffer and mirror.
        for (std::size_t slot = 0; slot < stager.pipeline_slots(); ++slot) {
            if (Status warm = step(); !warm) {
                state.SkipWithError(warm.message().c_str());
                return;
            }
        }
        const SimStats before = f.sim.stats();
        const StagerStats stager_before = stager.stats();
        for (auto _ : state) {
            if (Status stepped = step(); !stepped) {
                state.SkipWithError(stepped.message().c_str());
                break;
            }
        }
        const StagerStats& after = stager.stats();
        const std::uint64_t steps = after.runs - stager_before.runs;
        f.report(state, before, steps);
        const auto n = static_cast<double>(std::max<std::uint64_t>(steps, 1));
        state.counters["host_waits_per_step"] = static_cast<double>(after.host_waits - stager_before.host_waits) / n;
        state.counters["packed_args_per_step"] = static_cast<double>(after.packed_args - stager_before.packed_args) / n;
        state.counters["mirror_copy_KB_per_step"] =
            static_cast<double>(after.mirror_copy_bytes - stager_before.mirror_copy_bytes) / 1e3 / n;
        state.counters["device_mallocs_per_step"] =
            static_cast<double>(after.device_mallocs - stager_before.device_mallocs) / n;
    }
    if (stream) (void)f.sim.destroy_stream(*stream);
}

// The limit, timed: one H2D of every input byte and one D2H of every output byte on a stream,
// between pinned host memory and one device buffer. Synchronous: the host waits after each
// copy, as a synchronous bind and finish must; stream-ordered: once, after both.
template <bool Streamed>
void BM_copies_raw(benchmark::State& state, CopySet set) {
    CopyFixture f(set);
    auto host_in = f.pool.allocate(std::max<std::uint64_t>(f.in_bytes, 1));
    auto host_out = f.pool.allocate(std::max<std::uint64_t>(f.out_bytes, 1));
    auto device = f.sim.device_malloc(f.in_bytes + f.out_bytes);
    auto stream = f.sim.create_stream();
    auto event = f.sim.create_event();
    if (!f.ok() || !host_in || !host_out || !device || !stream || !event) {
        state.SkipWithError("could not set up the raw copies");
        return;
    }
    auto* const in_device = static_cast<std::byte*>(*device);
    std::byte* const out_device = in_device + f.in_bytes;
    std::uint64_t waits = 0;
    const auto wait = [&] {
        ++waits;
        Status recorded = f.sim.record_event(*event, *stream);
        return recorded ? f.sim.synchronize_event(*event) : recorded;
    };
    const auto step = [&] {
        Status status = f.sim.copy_to_device_async(in_device, host_in->data(), f.in_bytes, *stream);
        if (status && !Streamed) status = wait();
        if (status) status = f.sim.copy_from_device_async(host_out->data(), out_device, f.out_bytes, *stream);
        return status ? wait() : status;
    };
    Status status = step();  // outside the timing: the first touch of the device buffer faults
    const SimStats before = f.sim.stats();
    waits = 0;
    std::uint64_t steps = 0;
    for (auto _ : state) {
        if (status) status = step();
        if (!status) {
            state.SkipWithError(status.message().c_str());
            break;
        }
        ++steps;
    }
    f.report(state, before, steps);
    state.counters["host_waits_per_step"] =
        static_cast<double>(waits) / static_cast<double>(std::max<std::uint64_t>(steps, 1));
    (void)f.sim.destroy_event(*event);
    (void)f.sim.destroy_stream(*stream);
    (void)f.sim.device_free(*device);
}

using PackDefault = RetainedBump<ExactGrowth, 1024, PackSmall<>>;
using PackAll = RetainedBump<ExactGrowth, 1024, PackSmall<pack_all_small>>;

// Registered in this order: per set, every variant synchronously, then stream-ordered.
const bool copies_registered = [] {
    using Bench = void (*)(benchmark::State&, CopySet);
    const std::pair<const char*, CopySet> sets[] = {{"small_step", CopySet::small_step}, {"qwen3", CopySet::qwen3}};
    const std::pair<const char*, Bench> sync[] = {{"NoPacking", BM_copies<RetainedBump<>, false, false>},
                                                  {"PackSmall<16384>", BM_copies<PackDefault, false, false>},
                                                  {"PackSmall<163840>", BM_copies<PackAll, false, false>},
                                                  {"frame", BM_copies<PackDefault, true, false>},
                                                  {"limit", BM_copies_raw<false>}};
    const std::pair<const char*, Bench> streamed[] = {{"NoPacking", BM_copies<RetainedBump<>, false, true>},
                                                      {"PackSmall<16384>", BM_copies<PackDefault, false, true>},
                                                      {"PackSmall<163840>", BM_copies<PackAll, false, true>},
                                                      {"frame", BM_copies<PackDefault, true, true>},
                                                      {"limit", BM_copies_raw<true>}};
    for (const auto& [set_name, set] : sets) {
        for (const auto& [mode, variants] :
             {std::pair{"sync", std::span(sync)}, std::pair{"stream", std::span(streamed)}}) {
            for (const auto& [variant, bench] : variants) {
                const std::string name = std::string("copies/") + set_name + "/" + variant + "/" + mode;
                benchmark::RegisterBenchmark(name.c_str(), bench, set)->Unit(benchmark::kMicrosecond)->UseRealTime();
            }
        }
    }
    return true;
}();

// ---- 6. large pageable args: direct vs the pinned ring --------------------------------------
// One arg of 64 MiB, 256 MiB or 1 GiB per step: an In arg (the upload of a synchronous bind) or
// an Out arg (the copy-back of a synchronous finish). From pageable memory directly (the sim's
// bounce buffer, modeled at the pageable rate), through a PageableRing (default chunks) with
// 0, 1, 2, 4 or 8 copy threads besides the caller, and from pinned memory directly (the upper
// reference). wall_GBps: bytes over the wall time of bind + finish, this machine's memcpy and
// threads; modeled_GBps: bytes over SimStats::modeled_ns, the link model's time of the copies
// alone (the ring's host memcpy into and out of its chunks is wall time, never modeled).
enum class RingSource { pinned, pageable };

void BM_pageable_ring(benchmark::State& state, std::size_t bytes, Direction direction, RingSource source,
                      std::optional<std::size_t> ring_threads) {
    SimBackend sim;
    std::unique_ptr<std::byte[]> pageable;
    void* pinned = nullptr;
    TensorArg arg{nullptr, bytes, direction};
    if (source == RingSource::pinned) {
        Result<void*> allocated = sim.pinned_malloc(bytes);
        if (!allocated) {
            state.SkipWithError(allocated.status().message().c_str());
            return;
        }
        pinned = *allocated;
        arg.data = pinned;
        arg.memory = HostMemory::pinned;
    } else {
        pageable = std::make_unique_for_overwrite<std::byte[]>(bytes);
        arg.data = pageable.get();
        arg.memory = HostMemory::pageable;
    }
    std::memset(arg.data, 0x5A, bytes);  // every page touched before the timing
    {
        Stager<SimBackend> stager(sim);
        const auto step = [&]() -> Status {
            auto run = stager.bind(std::span(&arg, 1));
            if (!run) return run.status();
            return stager.finish(std::move(*run));
        };
        Status ready;
        if (ring_threads) ready = stager.set_pageable_ring(PageableRing{.threads = *ring_threads});
        // Outside the timing: the first step faults the device buffer in and makes the ring.
        if (ready) ready = step();
        if (!ready) {
            state.SkipWithError(ready.message().c_str());
        } else {
            const SimStats before = sim.stats();
            const StagerStats stager_before = stager.stats();
            double wall_ns = 0;
            for (auto _ : state) {
                const auto start = std::chrono::steady_clock::now();
                const Status stepped = step();
                wall_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
                if (!stepped) {
                    state.SkipWithError(stepped.message().c_str());
                    break;
                }
            }
            const SimStats& after = sim.stats();
            const StagerStats& stager_after = stager.stats();
            const auto steps = static_cast<double>(stager_after.runs - stager_before.runs);
            const double moved = static_cast<double>(bytes) * steps;
            state.counters["MiB"] = static_cast<double>(bytes >> 20);
            state.counters["wall_GBps"] = wall_ns > 0 ? moved / wall_ns : 0;
            state.counters["modeled_GBps"] =
                moved / static_cast<double>(std::max<std::uint64_t>(after.modeled_ns - before.modeled_ns, 1));
            state.counters["ring_chunks_per_step"] =
                static_cast<double>(stager_after.ring_chunks - stager_before.ring_chunks) / std::max(steps, 1.0);
            state.counters["bounced_MiB_per_step"] =
                static_cast<double>((after.bounced_bytes - before.bounced_bytes) >> 10) / 1024.0 / std::max(steps, 1.0);
        }
    }
    if (pinned != nullptr) (void)sim.pinned_free(pinned);
}

// Few steps: a step of 1 GiB takes a fraction of a second here, and the input is made once per
// benchmark. At most one input and its device copy (2 GiB) are held at a time.
const bool pageable_ring_registered = [] {
    const std::pair<const char*, Direction> ways[] = {{"upload", Direction::In}, {"copy_back", Direction::Out}};
    const std::size_t sizes_mib[] = {64, 256, 1024};
    const std::size_t ring_threads[] = {0, 1, 2, 4, 8};
    for (const auto& way : ways) {
        const Direction direction = way.second;
        for (const std::size_t mib : sizes_mib) {
            const std::size_t bytes = mib << 20;
            const std::string prefix = std::string("pageable_ring/") + way.first + "/" + std::to_string(mib) + "MiB/";
            const auto add = [&](const std::string& variant, RingSource source, std::optional<std::size_t> threads) {
                benchmark::RegisterBenchmark((prefix + variant).c_str(), BM_pageable_ring, bytes, direction, source,
                                             threads)
                    ->Iterations(mib <= 64 ? 8 : 2)
                    ->Unit(benchmark::kMillisecond)
                    ->UseRealTime();
            };
            add("direct", RingSource::pageable, std::nullopt);
            for (const std::size_t threads : ring_threads) {
                add("ring_threads:" + std::to_string(threads), RingSource::pageable, threads);
            }
            add("pinned", RingSource::pinned, std::nullopt);
        }
    }
    return true;
}();

}  // namespace

BENCHMARK_MAIN();
