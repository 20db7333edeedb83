// SPDX-License-Identifier: Apache-2.0
// The main example: N decode steps of a Qwen3-14B-decode-shaped input set through a Stager,
// once per strategy, inputs generated in pinned memory. By default the steps are stream-ordered
// and pipelined over two slots: step k+1 is bound, launched and finished on the stream before
// the host waits for step k. Every column of the main table is per step.
//
//   decode_loop [--steps N] [--scale S] [--strategy all|both|retained|per-tensor|packed]
//               [--async|--sync] [--pageable] [--backend sim|ascend]
// --strategy both is PerTensorMalloc and RetainedBump; all adds RetainedBump with PackSmall.
// --async (the default on a backend with streams) binds and finishes on a stream; its kernel
// stand-in is a host function on that stream where the backend has them (the simulator), and
// otherwise (Ascend) a synchronous memset once the bind's uploads completed. --sync binds and
// finishes synchronously, one step at a time.
// --backend ascend runs on Ascend device 0 through CANN ACL (libascendcl.so, or
// $DEVSTAGE_ACL_LIBRARY); bounced bytes and the link model are then not known.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "devstage/backends/ascend.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"
#include "qwen3_decode.hpp"

namespace {

using PackedBump = devstage::RetainedBump<devstage::ExactGrowth, 1024, devstage::PackSmall<>>;

struct Options {
    int steps = 30;
    double scale = 0.002;
    std::string strategy = "all";
    std::string backend = "sim";
    std::optional<bool> async;  // unset: on where the backend has streams
    bool pageable = false;
};

// Counters at one point of the loop: the stager's, and the simulator's where it is one.
struct Sample {
    devstage::StagerStats stager;
    std::uint64_t bounced = 0, modeled_ns = 0;
};

struct Report {
    const char* label = "";
    int warmup = 1;  // the first step of each pipeline slot: it allocates
    double warmup_ms = 0, median_ms = 0;
    Sample start, warm, end;  // before step 1, after the warm-up steps, after the last step
    bool link_known = false;  // only the simulator models the link and reports bounced bytes
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

template <class B, class Strategy>
Sample sample(const B& backend, const devstage::Stager<B, Strategy>& stager) {
    Sample s{stager.stats()};
    if constexpr (std::is_same_v<B, devstage::SimBackend>) {
        s.bounced = backend.stats().bounced_bytes;
        s.modeled_ns = backend.stats().modeled_ns;
    }
    return s;
}

// One decode step's "kernel": writes the output and one KV slot per sequence on the device.
// The indices are those of qwen3::table().
struct Kernel {
    void* output = nullptr;
    std::size_t output_bytes = 0;
    std::array<void*, 2> cache{};
    std::array<std::size_t, 2> cache_bytes{};
    int step = 0;

    Kernel() = default;
    Kernel(std::span<const devstage::TensorArg> device_args, int step_index) : step(step_index) {
        output = device_args[18].data;
        output_bytes = device_args[18].bytes;
        for (std::size_t i = 0; i < 2; ++i) {
            cache[i] = device_args[13 + i].data;
            cache_bytes[i] = std::min<std::size_t>(device_args[13 + i].bytes, 16 * 2048);
        }
    }

    template <devstage::MemsetBackend B>
    devstage::Status run(B& backend) const noexcept {
        if (auto s = backend.device_memset(output, step & 0x7F, output_bytes); !s) return s;
        for (std::size_t i = 0; i < 2; ++i) {
            if (auto s = backend.device_memset(cache[i], step & 0x7F, cache_bytes[i]); !s) return s;
        }
        return {};
    }
};

// The kernel enqueued as a host function: it runs on the stream's worker, in stream order,
// and leaves its status for the host to read once the step's Completion was waited on.
template <class B>
struct KernelLaunch {
    B* backend = nullptr;
    Kernel kernel;
    devstage::Status status;

    static void run(void* self) noexcept {
        auto* launch = static_cast<KernelLaunch*>(self);
        launch->status = launch->kernel.run(*launch->backend);
    }
};

bool failed(const char* what, int step, const devstage::Status& status) {
    if (status) return false;
    std::fprintf(stderr, "decode_loop: %s of step %d failed: %s\n", what, step + 1, status.message().c_str());
    return true;
}

// One step at a time: bind (uploads done), the kernel, finish (copy-backs done).
template <class Strategy, class B>
bool run_sync(const qwen3::Inputs& inputs, int steps, B& backend, Report& report) {
    devstage::Stager<B, Strategy> stager(backend);
    report.start = sample(backend, stager);
    std::vector<double> times;
    for (int step = 0; step < steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        auto run = stager.bind(inputs.args);
        if (!run) return !failed("bind", step, run.status());
        devstage::Status executed = Kernel(run->device_args(), step).run(backend);
        if constexpr (devstage::SynchronizingBackend<B>) {
            if (executed) executed = backend.synchronize();
        }
        const devstage::Status finished = stager.finish(std::move(*run), executed);
        if (failed("kernel", step, executed) || failed("finish", step, finished)) return false;
        times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        if (step + 1 == report.warmup) report.warm = sample(backend, stager);
    }
    report.end = sample(backend, stager);
    report.warmup_ms = times.front();
    report.median_ms = median({times.begin() + report.warmup, times.end()});
    if (auto released = stager.release(); !released) std::fprintf(stderr, "%s\n", released.message().c_str());
    return true;
}

// Stream-ordered, two steps in flight: step k is bound, launched and finished on the stream,
// then the host waits for step k-1. On a backend without host functions the kernel runs on
// the host once the bind's uploads completed, and the copy-backs are enqueued after it.
template <class Strategy, class B>
requires devstage::AsyncBackend<B>
bool run_async(const qwen3::Inputs& inputs, int steps, B& backend, Report& report) {
    constexpr std::size_t slots = 2;
    report.warmup = slots;
    auto stream = backend.create_stream();
    if (failed("create_stream", 0, stream.status())) return false;
    std::optional<typename B::Event> bound;  // the host waits on it where the kernel runs on the host
    if constexpr (!devstage::HostFunctionBackend<B>) {
        auto event = backend.create_event();
        if (failed("create_event", 0, event.status())) return false;
        bound = *event;
    }
    bool ok = true;
    {
        devstage::Stager<B, Strategy> stager(backend, {}, slots);
        std::array<KernelLaunch<B>, slots> launches{};
        std::array<devstage::Completion, slots> pending{};
        std::vector<double> times;
        report.start = sample(backend, stager);
        // Waits for step `step`'s copy-backs (and its kernel's status).
        const auto complete = [&](int step) {
            const devstage::Status done = pending[step % slots].wait();
            return !failed("copy-back", step, done) && !failed("kernel", step, launches[step % slots].status);
        };
        for (int step = 0; ok && step < steps; ++step) {
            const auto start = std::chrono::steady_clock::now();
            auto run = stager.bind(inputs.args, *stream);
            if (failed("bind", step, run.status())) {
                ok = false;
                break;
            }
            KernelLaunch<B>& launch = launches[step % slots];
            launch = KernelLaunch<B>{&backend, Kernel(run->device_args(), step), {}};
            devstage::Status launched;
            if constexpr (devstage::HostFunctionBackend<B>) {
                launched = backend.launch_host_func(*stream, &KernelLaunch<B>::run, &launch);
            } else {
                launched = backend.record_event(*bound, *stream);
                if (launched) launched = backend.synchronize_event(*bound);
                if (launched) launched = launch.kernel.run(backend);
                if constexpr (devstage::SynchronizingBackend<B>) {
                    if (launched) launched = backend.synchronize();
                }
            }
            auto done = stager.finish(std::move(*run), *stream, launched);
            if (failed("kernel launch", step, launched) || failed("finish", step, done.status())) {
                ok = false;
                break;
            }
            pending[step % slots] = std::move(*done);
            if (step > 0 && !complete(step - 1)) {
                ok = false;
                break;
            }
            times.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
            if (step + 1 == report.warmup) report.warm = sample(backend, stager);
        }
        report.end = sample(backend, stager);
        ok = ok && complete(steps - 1);
        if (ok) {
            double warmup = 0;
            for (int i = 0; i < report.warmup; ++i) warmup += times[static_cast<std::size_t>(i)];
            report.warmup_ms = warmup / report.warmup;
            report.median_ms = median({times.begin() + report.warmup, times.end()});
        }
        for (auto& completion : pending) (void)completion.wait();
        if (auto released = stager.release(); !released) std::fprintf(stderr, "%s\n", released.message().c_str());
    }
    if (bound) (void)backend.destroy_event(*bound);
    (void)backend.destroy_stream(*stream);
    return ok;
}

template <class Strategy, class Storage, class B>
bool run(const Options& options, Storage& storage, B& backend, Report& report) {
    const qwen3::Inputs inputs = qwen3::generate(storage, options.scale);
    if (!inputs.ok()) {
        std::fprintf(stderr, "decode_loop: could not allocate the input set\n");
        return false;
    }
    report.link_known = std::is_same_v<B, devstage::SimBackend>;
    if constexpr (devstage::AsyncBackend<B>) {
        if (*options.async) return run_async<Strategy>(inputs, options.steps, backend, report);
    }
    return run_sync<Strategy>(inputs, options.steps, backend, report);
}

// The steady state: every column is a mean over the steps after the warm-up (a median for
// the wall time).
void print_steady(const Report& r, int steps) {
    const double n = steps - r.warmup;
    const auto& a = r.warm.stager;
    const auto& b = r.end.stager;
    const auto per = [n](std::uint64_t later, std::uint64_t earlier) {
        return static_cast<double>(later - earlier) / n;
    };
    char bounced[16] = "n/a", link[16] = "n/a";
    if (r.link_known) {
        std::snprintf(bounced, sizeof bounced, "%.1f", per(r.end.bounced, r.warm.bounced) / 1e6);
        std::snprintf(link, sizeof link, "%.0f", per(r.end.modeled_ns, r.warm.modeled_ns) / 1e3);
    }
    std::printf("%-20s %8.2f %7.1f %8s %7.1f %7.1f %8s %8.1f %7.1f %6.1f\n", r.label, r.median_ms,
                per(b.uploads + b.copy_backs, a.uploads + a.copy_backs), link,
                per(b.bytes_to_device, a.bytes_to_device) / 1e6, per(b.bytes_from_device, a.bytes_from_device) / 1e6,
                bounced, per(b.device_mallocs, a.device_mallocs), per(b.device_frees, a.device_frees),
                per(b.host_waits, a.host_waits));
}

// The warm-up steps: each pipeline slot's first, which allocates what later steps reuse.
void print_warmup(const Report& r) {
    const auto& a = r.start.stager;
    const auto& b = r.warm.stager;
    const auto per = [&r](std::uint64_t later, std::uint64_t earlier) {
        return static_cast<double>(later - earlier) / r.warmup;
    };
    std::printf("%-20s %8.2f %8.1f %7.1f %8.1f %8.1f\n", r.label, r.warmup_ms, per(b.device_mallocs, a.device_mallocs),
                per(b.regrows, a.regrows), static_cast<double>(b.retained_bytes) / 1e6,
                static_cast<double>(b.mirror_bytes) / 1e6);
}

bool parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const bool has_value = i + 1 < argc;
        if (arg == "--steps" && has_value)
            o.steps = std::atoi(argv[++i]);
        else if (arg == "--scale" && has_value)
            o.scale = std::atof(argv[++i]);
        else if (arg == "--strategy" && has_value)
            o.strategy = argv[++i];
        else if (arg == "--backend" && has_value)
            o.backend = argv[++i];
        else if (arg == "--async")
            o.async = true;
        else if (arg == "--sync")
            o.async = false;
        else if (arg == "--pageable")
            o.pageable = true;
        else
            return false;
    }
    return o.scale > 0 && o.scale <= 1 &&
           (o.strategy == "all" || o.strategy == "both" || o.strategy == "retained" || o.strategy == "per-tensor" ||
            o.strategy == "packed");
}

}  // namespace

template <class B>
int decode(Options options, B& backend) {
    if (!options.async) options.async = devstage::AsyncBackend<B>;
    if (*options.async && !devstage::AsyncBackend<B>) {
        std::fprintf(stderr, "decode_loop: backend '%s' has no streams: use --sync\n",
                     std::string(backend.name()).c_str());
        return 2;
    }
    const int warmup = *options.async ? 2 : 1;
    options.steps = std::max(options.steps, warmup + 1);
    devstage::PinnedHostPool<B> pool(backend);
    qwen3::PinnedStorage pinned(pool);
    qwen3::PageableStorage pageable;

    std::size_t step_bytes = 0, full_bytes = 0;
    for (const qwen3::TensorSpec& spec : qwen3::table()) {
        step_bytes += spec.bytes_at(options.scale);
        full_bytes += spec.bytes_at(1.0);
    }
    std::printf(
        "devstage decode loop: %d steps on backend '%s', Qwen3-14B decode shapes x %.4g (%.1f MB per step,\n"
        "  %.1f GB unscaled), inputs in %s memory\n",
        options.steps, std::string(backend.name()).c_str(), options.scale, static_cast<double>(step_bytes) / 1e6,
        static_cast<double>(full_bytes) / 1e9, options.pageable ? "pageable" : "pinned");
    std::printf(
        "x %.4g: the %zu tensors keep their shape, except that those stacked over the 40 layers (weights,\n"
        "  norms, KV cache) and the RoPE tables keep %.4g of their rows\n",
        options.scale, qwen3::tensor_count, options.scale);
    if (*options.async) {
        std::printf(
            "stream-ordered: each step is bound, launched (%s)\n"
            "  and finished on one stream over 2 pipeline slots; the host waits for step k only after step\n"
            "  k+1 is bound (--sync: one step at a time)\n",
            devstage::HostFunctionBackend<B>
                ? "a host function on the stream"
                : "a synchronous kernel once the bind's uploads\n  completed: a wait the waits column does not count");
    } else {
        std::printf("synchronous: each step is bound, run and finished before the next (--async: pipelined)\n");
    }

    std::vector<Report> reports;
    const auto go = [&](auto strategy_tag, const char* label) {
        using Strategy = decltype(strategy_tag);
        Report report;
        report.label = label;
        const bool ok = options.pageable ? run<Strategy>(options, pageable, backend, report)
                                         : run<Strategy>(options, pinned, backend, report);
        if (ok) reports.push_back(report);
        return ok;
    };
    const std::string& s = options.strategy;
    bool ok = true;
    if (s == "all" || s == "both" || s == "per-tensor") ok = ok && go(devstage::PerTensorMalloc<>{}, "PerTensorMalloc");
    if (s == "all" || s == "both" || s == "retained") ok = ok && go(devstage::RetainedBump<>{}, "RetainedBump");
    if (s == "all" || s == "packed") ok = ok && go(PackedBump{}, "RetainedBump+pack");
    if (!ok) return 1;

    char steady[32], first[32];
    std::snprintf(steady, sizeof steady, "steps %d-%d, per step", warmup + 1, options.steps);
    std::snprintf(first, sizeof first, warmup == 1 ? "warm-up: step 1" : "warm-up: steps 1-%d", warmup);
    std::printf("\n%-20s %8s %7s %8s %7s %7s %8s %8s %7s %6s\n", steady, "wall ms", "copies", "link us", "MB in",
                "MB out", "bounced", "mallocs", "frees", "waits");
    for (const Report& r : reports) print_steady(r, options.steps);
    std::printf("\n%-20s %8s %8s %7s %8s %8s\n", first, "wall ms", "mallocs", "grows", "held MB", "mirror");
    for (const Report& r : reports) print_warmup(r);

    std::printf(
        "\nPer step: wall ms is the median (a mean over the warm-up); copies are copy calls (a packed copy\n"
        "  counts once); link us is what they would cost on the modeled link; MB in and out are the bytes\n"
        "  uploaded and copied back; bounced the MB staged through the driver's bounce buffer (pageable\n"
        "  memory); mallocs, frees and grows are device allocations; waits are the times the host blocked on a\n"
        "  device event (Completion::wait included). Held MB and mirror: device and pinned MB held after it.\n"
        "RetainedBump+pack is RetainedBump<ExactGrowth, 1024, PackSmall<16384>>: the small inputs go up in\n"
        "  one copy through a pinned mirror.\n"
        "The warm-up of RetainedBump grows its buffer (one per pipeline slot): a fresh allocation whose pages\n"
        "  fault in as the first uploads touch them, the cost PerTensorMalloc pays on every step, so that\n"
        "  step is as slow as a PerTensorMalloc step, or slower; later steps reuse the buffer.\n");
    if (reports.front().link_known) {
        const devstage::SimLinkCost pinned_link = devstage::SimLinkModel{}.to_device_pinned;
        std::printf(
            "The simulator keeps device memory in this machine's RAM and copies with memcpy: wall times and\n"
            "  their ratios measure this machine's memory system (page faults, memcpy), not a device. Link us is\n"
            "  the simulator's link model (SimConfig::link, summed in SimStats::modeled_ns), from measurements on\n"
            "  an H200: %.1f us per copy plus bytes at %.1f GB/s from pinned memory, %.2f GB/s from pageable.\n"
            "  Nothing sleeps: the model only adds up what each copy would cost.\n",
            static_cast<double>(pinned_link.latency_ns) / 1e3, static_cast<double>(pinned_link.bytes_per_second) / 1e9,
            static_cast<double>(devstage::SimLinkModel{}.to_device_pageable.bytes_per_second) / 1e9);
    }
    const auto find = [&](std::string_view label) -> const Report* {
        for (const Report& r : reports) {
            if (label == r.label) return &r;
        }
        return nullptr;
    };
    const Report* per_tensor = find("PerTensorMalloc");
    const Report* retained = find("RetainedBump");
    if (per_tensor != nullptr && retained != nullptr && retained->median_ms > 0) {
        std::printf("speed-up of RetainedBump over PerTensorMalloc (median step): %.2fx on this machine",
                    per_tensor->median_ms / retained->median_ms);
        if (retained->link_known) {
            const auto link = [&](const Report& r) {
                return static_cast<double>(r.end.modeled_ns - r.warm.modeled_ns);
            };
            std::printf(", %.2fx on the modeled link", link(*per_tensor) / link(*retained));
        }
        std::printf("\n");
    }
    const Report* packed = find("RetainedBump+pack");
    if (packed != nullptr && retained != nullptr) {
        const auto copies = [&](const Report& r) {
            const auto& a = r.warm.stager;
            const auto& b = r.end.stager;
            return static_cast<double>(b.uploads + b.copy_backs - a.uploads - a.copy_backs) / (options.steps - warmup);
        };
        std::printf("packing the small tensors: %.1f copies per step instead of %.1f\n", copies(*packed),
                    copies(*retained));
    }
    return 0;
}

int main(int argc, char** argv) {
    Options options;
    if (!parse(argc, argv, options)) {
        std::fprintf(stderr,
                     "usage: decode_loop [--steps N] [--scale 0<S<=1] "
                     "[--strategy all|both|retained|per-tensor|packed] [--async|--sync] [--pageable] "
                     "[--backend sim|ascend]\n");
        return 2;
    }
    if (options.backend == "ascend") {
        auto npu = devstage::AscendBackend::create(0);
        if (!npu) {
            std::fprintf(stderr, "decode_loop: %s\n", npu.status().message().c_str());
            return 1;
        }
        return decode(options, *npu);
    }
    if (options.backend != "sim") {
        std::fprintf(stderr, "decode_loop: unknown backend '%s' (sim or ascend)\n", options.backend.c_str());
        return 2;
    }
    devstage::SimBackend sim;
    return decode(options, sim);
}
