// SPDX-License-Identifier: Apache-2.0
// A tensor-parallel decode step on 8 simulated devices of one host (`./dev demo --devices 8`).
//
// Each device holds its shard of the LM head (vocab / N columns) on the device; every step
// each device stages the batch's tokens, positions, block table and temperatures — from one
// pinned pool for the whole host — and gets back its shard of the logits. The "kernel" (a host
// function on the device's stream) computes the shard; every shard of every step is checked
// bitwise against a host reference, and the program prints PASS or FAIL. Per device and in
// total it prints the copies, device mallocs and the modeled link time per step.
//
//   decode_devices [--devices N] [--steps S] [--threads] [--link h200|ascend]
// --threads drives each device from a thread of its own; by default one thread drives the
// devices in turn.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "decode_step.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/pinned.hpp"
#include "devstage/stager.hpp"

namespace {

using devstage::Direction;
using devstage::Placement;
using devstage::SimBackend;
using devstage::TensorArg;
using Packed = devstage::RetainedBump<devstage::ExactGrowth, 1024, devstage::PackSmall<>>;

constexpr std::size_t batch = decode::batch;

struct Options {
    std::size_t devices = 8;
    int steps = 4;
    bool threads = false;
    bool ascend_link = false;
};

// The shard of logits device `d` of `n` computes: columns [first, first + count) of the vocab.
struct Shard {
    std::size_t first = 0, count = 0;
};
Shard shard_of(std::size_t d, std::size_t n) {
    const std::size_t base = decode::vocab / n, extra = decode::vocab % n;
    return {d * base + std::min(d, extra), base + (d < extra ? 1 : 0)};
}

float weight(std::size_t column) {
    return static_cast<float>((column * 2654435761u) % 1000) * 0.001f - 0.5f;
}

// What the kernel computes, written once: on the device's copies by the kernel, on the host's
// by the reference.
void lm_head(const std::int32_t* tokens, const std::int32_t* positions, const std::int32_t* table,
             const float* temperatures, const float* weights, std::size_t columns, float* logits) {
    for (std::size_t b = 0; b < batch; ++b) {
        const float x = static_cast<float>(tokens[b] % 97) + 0.001f * static_cast<float>(positions[b]) +
                        0.01f * static_cast<float>(table[b * decode::blocks_per_sequence]);
        const float inverse = 1.0f / temperatures[b];
        for (std::size_t j = 0; j < columns; ++j) logits[b * columns + j] = (weights[j] * x) * inverse;
    }
}

struct Kernel {
    std::vector<TensorArg> device;  // the run's device args
    std::size_t columns = 0;
    static void run(void* self) {
        const auto& k = *static_cast<Kernel*>(self);
        lm_head(static_cast<const std::int32_t*>(k.device[0].data), static_cast<const std::int32_t*>(k.device[1].data),
                static_cast<const std::int32_t*>(k.device[2].data), static_cast<const float*>(k.device[3].data),
                static_cast<const float*>(k.device[4].data), k.columns, static_cast<float*>(k.device[5].data));
    }
};

struct Report {
    std::string failure;
    devstage::StagerStats stats;
    devstage::SimStats sim;
    std::uint64_t resident_ns = 0;  // the one-time upload of the shard's weights
};

void fill(int step, std::span<std::byte* const, 4> inputs) {
    auto* t = reinterpret_cast<std::int32_t*>(inputs[0]);
    auto* p = reinterpret_cast<std::int32_t*>(inputs[1]);
    auto* table = reinterpret_cast<std::int32_t*>(inputs[2]);
    auto* temperature = reinterpret_cast<float*>(inputs[3]);
    for (std::size_t b = 0; b < batch; ++b) {
        const std::size_t at = decode::Batch::prompt_length(b) + static_cast<std::size_t>(step);
        t[b] = decode::Batch::token(b, at);
        p[b] = static_cast<std::int32_t>(at);
        temperature[b] = decode::Batch::temperature(b);
        for (std::size_t i = 0; i < decode::blocks_per_sequence; ++i)
            table[b * decode::blocks_per_sequence + i] = static_cast<std::int32_t>(b * 32 + i);
    }
}

// Device d's part of every step; the first failure in report.failure.
void drive(SimBackend& gpu, devstage::PinnedHostPool<SimBackend>& pool, std::size_t d, const Options& o,
           Report& report) {
    auto fail = [&](std::string what) {
        if (report.failure.empty()) report.failure = "device " + std::to_string(d) + ": " + std::move(what);
    };
    const Shard shard = shard_of(d, o.devices);
    std::vector<float> weights(shard.count);
    for (std::size_t j = 0; j < shard.count; ++j) weights[j] = weight(shard.first + j);
    const std::uint64_t before = gpu.stats().modeled_ns;
    devstage::Result<void*> resident = gpu.device_malloc(shard.count * sizeof(float));
    if (!resident) return fail(resident.status().message());
    if (devstage::Status up = gpu.copy_to_device(*resident, weights.data(), shard.count * sizeof(float)); !up) {
        return fail(up.message());
    }
    report.resident_ns = gpu.stats().modeled_ns - before;
    devstage::Result<SimBackend::Stream> stream = gpu.create_stream();
    if (!stream) return fail(stream.status().message());
    {
        devstage::Stager<SimBackend, Packed> stager(gpu);
        const std::size_t logits_bytes = batch * shard.count * sizeof(float);
        std::vector<float> expected(batch * shard.count);
        const devstage::SimStats at_start = gpu.stats();
        for (int step = 0; step < o.steps && report.failure.empty(); ++step) {
            std::vector<devstage::PinnedBuffer> buffers;
            std::array<std::byte*, 4> inputs{};
            for (std::size_t i = 0; i < 4; ++i) {
                devstage::Result<devstage::PinnedBuffer> buffer = pool.allocate(decode::input_bytes[i]);
                if (!buffer) return fail(buffer.status().message());
                inputs[i] = static_cast<std::byte*>(buffer->data());
                buffers.push_back(std::move(*buffer));
            }
            devstage::Result<devstage::PinnedBuffer> logits = pool.allocate(logits_bytes);
            if (!logits) return fail(logits.status().message());
            fill(step, inputs);
            std::vector<TensorArg> args;
            for (std::size_t i = 0; i < 4; ++i) args.push_back({inputs[i], decode::input_bytes[i], Direction::In});
            args.push_back({*resident, shard.count * sizeof(float), Direction::In, Placement::Device});
            args.push_back({logits->data(), logits_bytes, Direction::Out});
            devstage::Result<devstage::StagedRun> run = stager.bind(args, *stream);
            if (!run) return fail(run.status().message());
            Kernel kernel{{run->device_args().begin(), run->device_args().end()}, shard.count};
            if (devstage::Status launched = gpu.launch_host_func(*stream, &Kernel::run, &kernel); !launched) {
                return fail(launched.message());
            }
            devstage::Result<devstage::Completion> done = stager.finish(std::move(*run), *stream);
            if (!done) return fail(done.status().message());
            if (devstage::Status waited = done->wait(); !waited) return fail(waited.message());
            lm_head(reinterpret_cast<const std::int32_t*>(inputs[0]), reinterpret_cast<const std::int32_t*>(inputs[1]),
                    reinterpret_cast<const std::int32_t*>(inputs[2]), reinterpret_cast<const float*>(inputs[3]),
                    weights.data(), shard.count, expected.data());
            if (std::memcmp(logits->data(), expected.data(), logits_bytes) != 0) {
                return fail("logits differ from the host reference at step " + std::to_string(step));
            }
        }
        report.stats = stager.stats();
        devstage::SimStats end = gpu.stats();
        report.sim = end;
        report.sim.copies_to_device = end.copies_to_device - at_start.copies_to_device;
        report.sim.copies_from_device = end.copies_from_device - at_start.copies_from_device;
        report.sim.modeled_ns = end.modeled_ns - at_start.modeled_ns;
        report.sim.bounced_bytes = end.bounced_bytes - at_start.bounced_bytes;
        if (devstage::Status released = stager.release(); !released) fail(released.message());
    }
    if (devstage::Status destroyed = gpu.destroy_stream(*stream); !destroyed) fail(destroyed.message());
    if (devstage::Status freed = gpu.device_free(*resident); !freed) fail(freed.message());
}

bool parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--devices" && has_value) {
            const long n = std::strtol(argv[++i], nullptr, 10);
            if (n < 1 || n > 64) return false;
            o.devices = static_cast<std::size_t>(n);
        } else if (a == "--steps" && has_value) {
            const long n = std::strtol(argv[++i], nullptr, 10);
            if (n < 1 || n > 1000) return false;
            o.steps = static_cast<int>(n);
        } else if (a == "--threads") {
            o.threads = true;
        } else if (a == "--link" && has_value) {
            const std::string_view link = argv[++i];
            if (link != "h200" && link != "ascend") return false;
            o.ascend_link = link == "ascend";
        } else {
            return false;
        }
    }
    return true;
}

double per_step(std::uint64_t total, int steps) {
    return static_cast<double>(total) / steps;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    if (!parse(argc, argv, o)) {
        std::fprintf(stderr,
                     "usage: decode_devices [--devices 1-64] [--steps 1-1000] [--threads] [--link h200|ascend]\n");
        return 2;
    }
    devstage::SimHost host;
    const devstage::SimLinkModel link =
        o.ascend_link ? devstage::SimLinkModel::ascend_a2a3() : devstage::SimLinkModel::h200();
    std::vector<std::unique_ptr<SimBackend>> gpus;
    for (std::size_t d = 0; d < o.devices; ++d) {
        gpus.push_back(
            std::make_unique<SimBackend>(devstage::SimConfig{.device = static_cast<int>(d), .link = link}, host));
    }
    devstage::PinnedHostPool<SimBackend> pool(*gpus[0]);  // one pool for the host's devices
    std::vector<Report> reports(o.devices);
    if (o.threads) {
        std::vector<std::thread> threads;
        for (std::size_t d = 0; d < o.devices; ++d) {
            threads.emplace_back([&, d] { drive(*gpus[d], pool, d, o, reports[d]); });
        }
        for (std::thread& t : threads) t.join();
    } else {
        for (std::size_t d = 0; d < o.devices; ++d) drive(*gpus[d], pool, d, o, reports[d]);
    }

    std::printf("tensor-parallel decode step: %zu simulated devices of one host, %d steps, %s, %s link model\n",
                o.devices, o.steps, o.threads ? "a thread per device" : "one thread driving every device",
                o.ascend_link ? "ascend a2a3" : "h200");
    std::printf("%-8s %14s %14s %14s %16s %14s\n", "device", "copies in", "copies out", "device mallocs",
                "modeled us/step", "logit columns");
    double total_ns = 0, slowest_ns = 0, total_in = 0, total_out = 0;
    std::uint64_t mallocs = 0, bounced = 0;
    bool ok = true;
    for (std::size_t d = 0; d < o.devices; ++d) {
        const Report& r = reports[d];
        if (!r.failure.empty()) {
            std::printf("FAIL %s\n", r.failure.c_str());
            ok = false;
            continue;
        }
        const double ns = per_step(r.sim.modeled_ns, o.steps);
        std::printf("%-8zu %14.1f %14.1f %14llu %16.1f %14zu\n", d, per_step(r.sim.copies_to_device, o.steps),
                    per_step(r.sim.copies_from_device, o.steps),
                    static_cast<unsigned long long>(r.stats.device_mallocs), ns / 1000.0, shard_of(d, o.devices).count);
        total_ns += ns;
        slowest_ns = std::max(slowest_ns, ns);
        total_in += per_step(r.sim.copies_to_device, o.steps);
        total_out += per_step(r.sim.copies_from_device, o.steps);
        mallocs += r.stats.device_mallocs;
        bounced += r.sim.bounced_bytes;
    }
    std::printf("%-8s %14.1f %14.1f %14llu %16.1f   (the devices' links in parallel: %.1f us per step)\n", "total",
                total_in, total_out, static_cast<unsigned long long>(mallocs), total_ns / 1000.0, slowest_ns / 1000.0);
    const devstage::PinnedStats pinned = pool.stats();
    std::printf(
        "one pinned pool on device 0 for all: %llu allocations from the backend, %llu cache hits; %llu bytes "
        "bounced through pageable memory\n",
        static_cast<unsigned long long>(pinned.backend_allocations), static_cast<unsigned long long>(pinned.cache_hits),
        static_cast<unsigned long long>(bounced));
    ok = ok && bounced == 0;
    std::printf("%s: every device's logits equal the host reference bitwise at every step\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
