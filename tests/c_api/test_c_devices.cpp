// SPDX-License-Identifier: Apache-2.0
// Several simulated devices of one host through the C interface: devstage_backend_create_sim_device
// and its host_of, a stream of another device refused, and 8 devices each staging a checked
// shard of a decode step over one pinned pool, driven by 1 thread and by 8 threads.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "c_support.hpp"

using namespace devstage::c_test;  // NOLINT(google-build-using-namespace): the shared helpers

namespace {

constexpr std::size_t devices = 8, tokens = 96, width = 16;

struct Shard {
    int device = 0;
    int step = 0;
    const std::uint8_t* ids = nullptr;  // device args
    std::uint8_t* logits = nullptr;

    static std::uint8_t expected(int device, int step, std::uint8_t id, std::size_t j) {
        return static_cast<std::uint8_t>(id * 7 + j + static_cast<std::size_t>(device) * 13 +
                                         static_cast<std::size_t>(step));
    }
    static void kernel(void* self) {
        auto& s = *static_cast<Shard*>(self);
        for (std::size_t t = 0; t < tokens; ++t) {
            for (std::size_t j = 0; j < width; ++j) s.logits[t * width + j] = expected(s.device, s.step, s.ids[t], j);
        }
    }
};

struct Device {
    devstage_backend* backend = nullptr;
    devstage_stager* stager = nullptr;
    devstage_stream stream = nullptr;
};

// `steps` checked steps of device `d`; the first failure, or empty.
std::string drive(const Device& dev, devstage_pinned_pool* pool, int d, int steps) {
    for (int step = 0; step < steps; ++step) {
        void* ids = nullptr;
        void* logits = nullptr;
        if (devstage_pinned_pool_allocate(pool, tokens, &ids) != DEVSTAGE_OK ||
            devstage_pinned_pool_allocate(pool, tokens * width, &logits) != DEVSTAGE_OK) {
            return last();
        }
        auto* id_bytes = static_cast<std::uint8_t*>(ids);
        for (std::size_t t = 0; t < tokens; ++t) id_bytes[t] = static_cast<std::uint8_t>(t + d * 3 + step);
        const devstage_tensor_arg args[] = {arg(ids, tokens, DEVSTAGE_IN), arg(logits, tokens * width, DEVSTAGE_OUT)};
        devstage_run* run = nullptr;
        if (devstage_bind_on(dev.stager, args, 2, dev.stream, &run) != DEVSTAGE_OK) return last();
        void* device_args[2] = {};
        if (devstage_run_device_args(run, device_args, 2) != DEVSTAGE_OK) return last();
        Shard shard{d, step, static_cast<const std::uint8_t*>(device_args[0]),
                    static_cast<std::uint8_t*>(device_args[1])};
        if (devstage_launch_host_function(dev.backend, dev.stream, &Shard::kernel, &shard) != DEVSTAGE_OK)
            return last();
        devstage_completion* done = nullptr;
        if (devstage_finish_on(dev.stager, run, dev.stream, DEVSTAGE_OK, &done) != DEVSTAGE_OK) return last();
        // The ids go back to the pool (device 0's) before the run completed, recorded with this
        // device's stream: the pool reuses them only once that stream's work ran.
        const std::vector<std::uint8_t> id_copy(id_bytes, id_bytes + tokens);
        if (devstage_pinned_pool_record(pool, ids, dev.stream) != DEVSTAGE_OK) return last();
        if (devstage_pinned_pool_free(pool, ids) != DEVSTAGE_OK) return last();
        if (devstage_completion_wait(done) != DEVSTAGE_OK) return last();
        if (devstage_completion_destroy(done) != DEVSTAGE_OK) return last();
        const auto* out = static_cast<const std::uint8_t*>(logits);
        for (std::size_t t = 0; t < tokens; ++t) {
            for (std::size_t j = 0; j < width; ++j) {
                if (out[t * width + j] != Shard::expected(d, step, id_copy[t], j)) {
                    return "device " + std::to_string(d) + ": wrong logit at step " + std::to_string(step);
                }
            }
        }
        if (devstage_pinned_pool_free(pool, logits) != DEVSTAGE_OK) return last();
    }
    return {};
}

}  // namespace

TEST_CASE("c devices: simulated devices of one host, their numbers, and another device's stream refused",
          "[c][devices]") {
    devstage_backend* zero = nullptr;
    devstage_backend* three = nullptr;
    C_OK(devstage_backend_create_sim_device(0, 0, nullptr, &zero));
    C_OK(devstage_backend_create_sim_device(3, 0, zero, &three));
    int kind = -1, device = -1;
    C_OK(devstage_backend_device(three, &kind, &device));
    CHECK(kind == DEVSTAGE_BACKEND_SIM);
    CHECK(device == 3);

    devstage_stream theirs = nullptr;
    C_OK(devstage_stream_create(three, &theirs));
    devstage_stager* stager = nullptr;
    C_OK(devstage_stager_create(zero, nullptr, &stager));
    std::vector<std::uint8_t> in(512, 1);
    const devstage_tensor_arg args[] = {arg(in.data(), in.size(), DEVSTAGE_IN)};
    devstage_run* run = nullptr;
    CHECK(devstage_bind_on(stager, args, 1, theirs, &run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(run == nullptr);
    CHECK_THAT(last(), Catch::Contains("sim"));
    CHECK(devstage_bind_on(stager, args, 0, theirs, &run) == DEVSTAGE_INVALID_ARGUMENT);  // even with nothing to upload
    C_OK(devstage_bind(stager, args, 1, &run));                                           // the stager goes on
    C_OK(devstage_finish(stager, run, DEVSTAGE_OK));

    C_OK(devstage_stager_destroy(stager));
    C_OK(devstage_stream_destroy(three, theirs));
    C_OK(devstage_backend_destroy(three));
    C_OK(devstage_backend_destroy(zero));
}

TEST_CASE("c devices: 8 simulated devices stage a checked shard each over one pinned pool, from 1 thread and from 8",
          "[c][devices]") {
    std::array<Device, devices> devs{};
    for (std::size_t d = 0; d < devices; ++d) {
        C_OK(devstage_backend_create_sim_device(static_cast<int>(d), 0, d == 0 ? nullptr : devs[0].backend,
                                                &devs[d].backend));
        C_OK(devstage_stager_create(devs[d].backend, nullptr, &devs[d].stager));
        C_OK(devstage_stream_create(devs[d].backend, &devs[d].stream));
    }
    devstage_pinned_pool* pool = nullptr;
    C_OK(devstage_pinned_pool_create(devs[0].backend, 1 << 20, &pool));  // device 0's, for all eight
    std::array<std::string, devices> failures;
    if (GENERATE(false, true)) {
        std::vector<std::thread> threads;
        for (std::size_t d = 0; d < devices; ++d) {
            threads.emplace_back([&, d] { failures[d] = drive(devs[d], pool, static_cast<int>(d), 10); });
        }
        for (std::thread& t : threads) t.join();
    } else {
        for (int round = 0; round < 2; ++round) {
            for (std::size_t d = 0; d < devices && failures[d].empty(); ++d) {
                failures[d] = drive(devs[d], pool, static_cast<int>(d), 5);
            }
        }
    }
    for (const std::string& failure : failures) CHECK(failure == std::string());
    C_OK(devstage_pinned_pool_destroy(pool));
    for (Device& dev : devs) {
        C_OK(devstage_stream_destroy(dev.backend, dev.stream));
        C_OK(devstage_stager_destroy(dev.stager));
    }
    for (std::size_t d = devices; d-- > 0;) C_OK(devstage_backend_destroy(devs[d].backend));
}
