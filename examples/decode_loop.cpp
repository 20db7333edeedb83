// SPDX-License-Identifier: Apache-2.0
// The main example: N decode steps of a Qwen3-14B-decode-shaped input set through a Stager on
// the simulator, once per strategy, inputs generated in pinned memory. Prints per-step time,
// device allocations per step, bytes staged each way, bounced bytes and the speed-up.
//
//   decode_loop [--steps N] [--scale S] [--strategy both|retained|per-tensor] [--pageable]
//               [--backend sim|ascend]
// --backend ascend runs on Ascend device 0 through CANN ACL (libascendcl.so, or
// $DEVSTAGE_ACL_LIBRARY); bounced bytes are then not known (the driver does not say).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "devstage/backends/ascend.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"
#include "qwen3_decode.hpp"

namespace {

struct Options {
    int steps = 30;
    double scale = 0.002;
    std::string strategy = "both";
    std::string backend = "sim";
    bool pageable = false;
};

struct Report {
    double median_ms = 0;
    double first_ms = 0;
    devstage::StagerStats stats;
    devstage::StagerStats after_first;
    std::uint64_t bounced = 0;
    bool bounced_known = false;  // only the simulator reports bounced bytes
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// One decode step's "kernel": writes the output and one KV slot per sequence on the device.
template <devstage::MemsetBackend B>
devstage::Status execute(B& backend, std::span<const devstage::TensorArg> device_args, int step) {
    const devstage::TensorArg& output = device_args[18];
    if (auto s = backend.device_memset(output.data, step & 0x7F, output.bytes); !s) return s;
    for (std::size_t cache : {13u, 14u}) {
        const devstage::TensorArg& kv = device_args[cache];
        if (auto s = backend.device_memset(kv.data, step & 0x7F, std::min<std::size_t>(kv.bytes, 16 * 2048)); !s) {
            return s;
        }
    }
    if constexpr (devstage::SynchronizingBackend<B>) return backend.synchronize();
    return {};
}

// Bytes the backend staged through a bounce buffer so far; only the simulator can tell.
template <class B>
std::uint64_t bounced_bytes(const B& backend) {
    if constexpr (std::is_same_v<B, devstage::SimBackend>) return backend.stats().bounced_bytes;
    return 0;
}

template <class Strategy, class Storage, class B>
bool run(const Options& options, Storage& storage, B& backend, Report& report) {
    qwen3::Inputs inputs = qwen3::generate(storage, options.scale);
    if (!inputs.ok()) {
        std::fprintf(stderr, "could not allocate the input set\n");
        return false;
    }
    devstage::Stager<B, Strategy> stager(backend);
    const std::uint64_t bounced_before = bounced_bytes(backend);
    std::vector<double> times;
    for (int step = 0; step < options.steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        auto staged = stager.bind(inputs.args);
        if (!staged) {
            std::fprintf(stderr, "bind failed: %s\n", staged.status().message().c_str());
            return false;
        }
        const devstage::Status executed = execute(backend, staged->device_args(), step);
        if (auto finished = stager.finish(std::move(*staged), executed); !finished || !executed) {
            std::fprintf(stderr, "step %d failed: %s%s\n", step, executed.message().c_str(),
                         finished.message().c_str());
            return false;
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (step == 0) {
            report.first_ms = ms;
            report.after_first = stager.stats();
        } else {
            times.push_back(ms);
        }
    }
    report.median_ms = median(times);
    report.stats = stager.stats();
    report.bounced = bounced_bytes(backend) - bounced_before;
    report.bounced_known = std::is_same_v<B, devstage::SimBackend>;
    if (auto released = stager.release(); !released) std::fprintf(stderr, "%s\n", released.message().c_str());
    return true;
}

void print(const char* label, const Report& r, int steps) {
    const double later = std::max(steps - 1, 1);
    const auto& s = r.stats;
    char bounced[32] = "n/a";
    if (r.bounced_known) std::snprintf(bounced, sizeof bounced, "%.1f", static_cast<double>(r.bounced) / 1e6);
    std::printf("%-16s %9.2f %9.2f %10.1f %10.1f %10.1f %10.1f %12s %7llu %10.1f\n", label, r.median_ms, r.first_ms,
                static_cast<double>(s.device_mallocs - r.after_first.device_mallocs) / later,
                static_cast<double>(s.device_frees - r.after_first.device_frees) / later,
                static_cast<double>(s.bytes_to_device) / steps / 1e6,
                static_cast<double>(s.bytes_from_device) / steps / 1e6, bounced,
                static_cast<unsigned long long>(s.regrows), static_cast<double>(s.retained_bytes) / 1e6);
}

bool parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const bool has_value = i + 1 < argc;
        if (arg == "--steps" && has_value)
            o.steps = std::max(2, std::atoi(argv[++i]));
        else if (arg == "--scale" && has_value)
            o.scale = std::atof(argv[++i]);
        else if (arg == "--strategy" && has_value)
            o.strategy = argv[++i];
        else if (arg == "--backend" && has_value)
            o.backend = argv[++i];
        else if (arg == "--pageable")
            o.pageable = true;
        else
            return false;
    }
    return o.scale > 0 && o.scale <= 1 &&
           (o.strategy == "both" || o.strategy == "retained" || o.strategy == "per-tensor");
}

}  // namespace

template <class B>
int decode(const Options& options, B& backend) {
    devstage::PinnedHostPool<B> pool(backend);
    qwen3::PinnedStorage pinned(pool);
    qwen3::PageableStorage pageable;

    std::printf("devstage decode loop: Qwen3-14B decode shapes x %.4g, %d steps, inputs in %s memory, backend '%s'\n",
                options.scale, options.steps, options.pageable ? "pageable" : "pinned",
                std::string(backend.name()).c_str());
    std::printf("%-16s %9s %9s %10s %10s %10s %10s %12s %7s %10s\n", "strategy", "step ms", "first ms", "mallocs/st",
                "frees/st", "MB in/st", "MB out/st", "bounced MB", "regrows", "retain MB");
    Report per_tensor, retained;
    bool ok = true;
    const auto go = [&](auto strategy_tag, Report& report) {
        using Strategy = decltype(strategy_tag);
        return options.pageable ? run<Strategy>(options, pageable, backend, report)
                                : run<Strategy>(options, pinned, backend, report);
    };
    if (options.strategy != "retained") {
        ok = ok && go(devstage::PerTensorMalloc<>{}, per_tensor);
        if (ok) print("PerTensorMalloc", per_tensor, options.steps);
    }
    if (options.strategy != "per-tensor") {
        ok = ok && go(devstage::RetainedBump<>{}, retained);
        if (ok) print("RetainedBump", retained, options.steps);
    }
    if (!ok) return 1;
    if (options.strategy == "both" && retained.median_ms > 0) {
        std::printf("speed-up of RetainedBump over PerTensorMalloc (median step): %.2fx\n",
                    per_tensor.median_ms / retained.median_ms);
    }
    std::printf("(mallocs/frees per step are counted after the first step; time is this machine's wall clock)\n");
    return 0;
}

int main(int argc, char** argv) {
    Options options;
    if (!parse(argc, argv, options)) {
        std::fprintf(stderr,
                     "usage: decode_loop [--steps N] [--scale 0<S<=1] [--strategy both|retained|per-tensor] "
                     "[--pageable] [--backend sim|ascend]\n");
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
