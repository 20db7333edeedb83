// SPDX-License-Identifier: Apache-2.0
// Several devices of one host: SimBackends of one SimHost share their pinned memory and keep
// their streams and events; a stager refuses another device's stream at bind, finish and
// order_after_uploads; 8 devices stage a checked decode-step shard each over one pinned pool,
// from one thread and from 8 threads (the threads suite: TSan runs it).
#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "devstage/backends/sim.hpp"
#include "devstage/pinned.hpp"
#include "devstage/stager.hpp"

using devstage::Direction;
using devstage::Errc;
using devstage::PinnedBuffer;
using devstage::PinnedHostPool;
using devstage::SimBackend;
using devstage::SimConfig;
using devstage::SimHost;
using devstage::Stager;
using devstage::TensorArg;

TEST_CASE("devices: pinned memory of one device of a SimHost is pinned for every device of it", "[devices]") {
    SimHost host;
    SimBackend gpu0(SimConfig{.device = 0}, host), gpu1(SimConfig{.device = 1}, host);
    CHECK(gpu0.device_id() == 0);
    CHECK(gpu1.device_id() == 1);
    CHECK(gpu0.host() == gpu1.host());
    void* pinned = *gpu0.pinned_malloc(8192);
    CHECK(gpu1.is_pinned(pinned));
    std::memset(pinned, 7, 8192);
    void* device = *gpu1.device_malloc(8192);
    const SimBackend::Stream stream = *gpu1.create_stream();
    REQUIRE(gpu1.copy_to_device_async(device, pinned, 8192, stream).ok());
    REQUIRE(gpu1.synchronize().ok());
    CHECK(gpu1.stats().direct_bytes == 8192);  // no bounce: the host's pinned memory
    CHECK(gpu1.stats().pageable_async_copies == 0);
    CHECK(static_cast<unsigned char*>(device)[8191] == 7);
    CHECK(gpu0.stats().live_pinned_bytes == 8192);  // the host's, seen from either device
    CHECK(gpu1.stats().live_pinned_bytes == 8192);
    REQUIRE(gpu1.pinned_free(pinned).ok());  // portable: any device of the host frees it
    CHECK(gpu0.stats().live_pinned_bytes == 0);
    CHECK(gpu0.pinned_free(pinned).code() == Errc::unknown_pointer);
    REQUIRE(gpu1.destroy_stream(stream).ok());
    REQUIRE(gpu1.device_free(device).ok());

    SimBackend alone;  // a host of its own: the other host's pinned memory is pageable to it
    void* other = *gpu0.pinned_malloc(4096);
    CHECK_FALSE(alone.is_pinned(other));
    CHECK_FALSE(alone.host() == gpu0.host());
    REQUIRE(gpu0.pinned_free(other).ok());
}

TEST_CASE("devices: a stream or event of another device is refused, naming both devices", "[devices]") {
    SimHost host;
    SimBackend gpu0(SimConfig{.device = 0}, host), gpu3(SimConfig{.device = 3}, host);
    SimBackend elsewhere(SimConfig{.device = 3});
    const SimBackend::Stream own = *gpu0.create_stream(), theirs = *gpu3.create_stream();
    const SimBackend::Stream foreign = *elsewhere.create_stream();
    CHECK(own.id != theirs.id);  // ids are unique in the process
    CHECK(theirs.id != foreign.id);
    void* device = *gpu0.device_malloc(64);
    std::array<std::byte, 64> host_bytes{};

    const devstage::Status copied = gpu0.copy_to_device_async(device, host_bytes.data(), 64, theirs);
    CHECK(copied.code() == Errc::invalid_argument);
    CHECK_THAT(copied.message(), Catch::Contains("sim device 0") && Catch::Contains("belongs to sim device 3"));
    const devstage::Status unknown = gpu0.copy_to_device_async(device, host_bytes.data(), 64, foreign);
    CHECK(unknown.code() == Errc::invalid_argument);
    CHECK_THAT(unknown.message(), Catch::Contains("unknown stream"));
    CHECK(gpu0.check_stream(own).ok());
    CHECK_THAT(gpu0.check_stream(theirs).message(), Catch::Contains("belongs to sim device 3"));

    const SimBackend::Event event3 = *gpu3.create_event();
    const devstage::Status recorded = gpu0.record_event(event3, own);
    CHECK(recorded.code() == Errc::invalid_argument);
    CHECK_THAT(recorded.message(), Catch::Contains("event") && Catch::Contains("belongs to sim device 3"));
    const SimBackend::Event event0 = *gpu0.create_event();
    CHECK_THAT(gpu0.record_event(event0, theirs).message(), Catch::Contains("belongs to sim device 3"));
    REQUIRE(gpu0.record_event(event0, own).ok());  // nothing was lost: the device goes on
    REQUIRE(gpu0.synchronize_event(event0).ok());

    REQUIRE(gpu3.destroy_event(event3).ok());
    REQUIRE(gpu0.destroy_event(event0).ok());
    REQUIRE(gpu3.destroy_stream(theirs).ok());
    // A destroyed stream is no longer anyone's.
    CHECK_THAT(gpu0.check_stream(theirs).message(), Catch::Contains("unknown stream"));
    REQUIRE(elsewhere.destroy_stream(foreign).ok());
    REQUIRE(gpu0.destroy_stream(own).ok());
    REQUIRE(gpu0.device_free(device).ok());
}

TEST_CASE("devices: a stager refuses another device's stream before enqueuing anything, and goes on", "[devices]") {
    SimHost host;
    SimBackend gpu0(SimConfig{.device = 0}, host), gpu1(SimConfig{.device = 1}, host);
    const SimBackend::Stream own = *gpu0.create_stream(), theirs = *gpu1.create_stream();
    Stager<SimBackend> stager(gpu0);
    std::vector<std::uint8_t> in(3000, 5), out(2000, 0);
    const std::vector<TensorArg> args = {{in.data(), in.size(), Direction::In},
                                         {out.data(), out.size(), Direction::Out}};

    // Even a bind that would enqueue nothing checks its stream.
    auto empty = stager.bind(std::span<const TensorArg>{}, theirs);
    REQUIRE_FALSE(empty.ok());
    CHECK(empty.status().code() == Errc::invalid_argument);
    CHECK_THAT(empty.status().message(), Catch::Contains("stager bind") && Catch::Contains("sim device 1"));
    auto refused = stager.bind(args, theirs);
    REQUIRE_FALSE(refused.ok());
    CHECK(gpu0.stats().copies_to_device == 0);
    CHECK(gpu0.stats().device_mallocs == 0);

    auto run = stager.bind(args, own);
    REQUIRE(run.ok());
    CHECK_THAT(stager.order_after_uploads(*run, theirs).message(), Catch::Contains("order_after_uploads"));
    auto wrong = stager.finish(std::move(*run), theirs);
    REQUIRE_FALSE(wrong.ok());
    CHECK_THAT(wrong.status().message(), Catch::Contains("stager finish") && Catch::Contains("sim device 1"));
    REQUIRE(run->live());  // refused: the run is left as it was
    auto done = stager.finish(std::move(*run), own);
    REQUIRE(done.ok());
    REQUIRE(done->wait().ok());
    CHECK(out == std::vector<std::uint8_t>(2000, 0));  // zeroed Out, no kernel wrote it
    CHECK(stager.stats().runs == 1);
    REQUIRE(stager.release().ok());
    REQUIRE(gpu1.destroy_stream(theirs).ok());
    REQUIRE(gpu0.destroy_stream(own).ok());
}

TEST_CASE("devices: a frame of device 1's stager bound on device 0's is refused; device 1 binds it", "[devices]") {
    using Packed = devstage::RetainedBump<devstage::ExactGrowth, 1024, devstage::PackSmall<>>;
    SimHost host;
    SimBackend gpu0(SimConfig{.device = 0}, host), gpu1(SimConfig{.device = 1}, host);
    Stager<SimBackend, Packed> zero(gpu0), one(gpu1);
    const devstage::TensorShape shapes[] = {{256, Direction::In}, {128, Direction::Out}};
    auto frame = one.frame(shapes);
    REQUIRE(frame.ok());
    std::memset(frame->host(0).data(), 9, 256);
    auto refused = zero.bind(*frame);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == Errc::invalid_argument);
    CHECK_THAT(refused.status().message(), Catch::Contains("belongs to another stager"));
    auto run = one.bind(*frame);
    REQUIRE(run.ok());
    REQUIRE(one.finish(std::move(*run)).ok());
    CHECK(gpu1.stats().copies_to_device == 1);  // the frame's one packed upload, on device 1
    CHECK(gpu0.stats().copies_to_device == 0);
}

namespace {

constexpr std::size_t devices = 8;
constexpr std::size_t tokens = 64, hidden = 32;

// One device's shard of a decode step: its tokens and positions in, its slice of the logits
// out, computed in stream order by a host function standing in for the kernel.
struct Shard {
    std::size_t device = 0;
    std::uint64_t step = 0;
    std::span<const std::byte> dev_tokens, dev_positions;
    std::span<std::byte> dev_logits;

    static std::uint8_t logit(std::size_t device, std::uint64_t step, std::uint8_t token, std::uint8_t position,
                              std::size_t j) noexcept {
        return static_cast<std::uint8_t>(token * 3 + position + j * 7 + device * 11 + step);
    }
    static void kernel(void* self) noexcept {
        auto& s = *static_cast<Shard*>(self);
        for (std::size_t t = 0; t < tokens; ++t) {
            for (std::size_t j = 0; j < hidden; ++j) {
                s.dev_logits[t * hidden + j] =
                    static_cast<std::byte>(logit(s.device, s.step, std::to_integer<std::uint8_t>(s.dev_tokens[t]),
                                                 std::to_integer<std::uint8_t>(s.dev_positions[t]), j));
            }
        }
    }
};

// Stages `steps` checked decode steps of device `d`'s shard from buffers of the shared pool.
void run_device(SimBackend& gpu, PinnedHostPool<SimBackend>& pool, std::size_t d, int steps, std::string& failure) {
    auto fail = [&](const std::string& what) {
        if (failure.empty()) failure = "device " + std::to_string(d) + ": " + what;
    };
    devstage::Result<SimBackend::Stream> stream = gpu.create_stream();
    if (!stream) return fail(stream.status().message());
    {
        Stager<SimBackend> stager(gpu);
        for (int step = 0; step < steps && failure.empty(); ++step) {
            devstage::Result<PinnedBuffer> ids = pool.allocate(tokens), positions = pool.allocate(tokens),
                                           logits = pool.allocate(tokens * hidden);
            if (!ids || !positions || !logits) return fail("pool allocation failed");
            auto* id_bytes = static_cast<std::uint8_t*>(ids->data());
            auto* pos_bytes = static_cast<std::uint8_t*>(positions->data());
            for (std::size_t t = 0; t < tokens; ++t) {
                id_bytes[t] = static_cast<std::uint8_t>(t * 5 + d + static_cast<std::size_t>(step));
                pos_bytes[t] = static_cast<std::uint8_t>(step + static_cast<int>(t));
            }
            const std::vector<TensorArg> args = {{ids->data(), tokens, Direction::In},
                                                 {positions->data(), tokens, Direction::In},
                                                 {logits->data(), tokens * hidden, Direction::Out}};
            devstage::Result<devstage::StagedRun> run = stager.bind(args, *stream);
            if (!run) return fail(run.status().message());
            const auto dev = run->device_args();
            Shard shard{d,
                        static_cast<std::uint64_t>(step),
                        {static_cast<const std::byte*>(dev[0].data), tokens},
                        {static_cast<const std::byte*>(dev[1].data), tokens},
                        {static_cast<std::byte*>(dev[2].data), tokens * hidden}};
            if (devstage::Status launched = gpu.launch_host_func(*stream, &Shard::kernel, &shard); !launched) {
                return fail(launched.message());
            }
            devstage::Result<devstage::Completion> done = stager.finish(std::move(*run), *stream);
            if (!done) return fail(done.status().message());
            // The inputs go back to the pool before the run completed: their use by this device's
            // stream is recorded, so the pool reuses them only once that work ran.
            const std::vector<std::uint8_t> ids_copy(id_bytes, id_bytes + tokens),
                pos_copy(pos_bytes, pos_bytes + tokens);
            for (devstage::PinnedBuffer* input : {&*ids, &*positions}) {
                if (devstage::Status recorded = pool.record(*input, *stream, gpu); !recorded) {
                    return fail(recorded.message());
                }
                input->reset();
            }
            if (devstage::Status waited = done->wait(); !waited) return fail(waited.message());
            const auto* out = static_cast<const std::uint8_t*>(logits->data());
            for (std::size_t t = 0; t < tokens; ++t) {
                for (std::size_t j = 0; j < hidden; ++j) {
                    if (out[t * hidden + j] !=
                        Shard::logit(d, static_cast<std::uint64_t>(step), ids_copy[t], pos_copy[t], j)) {
                        return fail("wrong logit at step " + std::to_string(step));
                    }
                }
            }
        }
        if (devstage::Status released = stager.release(); !released) fail(released.message());
    }
    if (devstage::Status destroyed = gpu.destroy_stream(*stream); !destroyed) fail(destroyed.message());
}

}  // namespace

TEST_CASE("devices: 8 simulated devices stage a checked decode step over one pinned pool, from 1 thread and from 8",
          "[devices][threads]") {
    SimHost host;
    std::vector<std::unique_ptr<SimBackend>> gpus;
    for (std::size_t d = 0; d < devices; ++d) {
        gpus.push_back(std::make_unique<SimBackend>(SimConfig{.device = static_cast<int>(d)}, host));
    }
    PinnedHostPool<SimBackend> pool(*gpus[0]);  // one pool, on device 0, for every device of the host
    const bool threaded = GENERATE(false, true);
    std::array<std::string, devices> failures;
    if (threaded) {
        std::vector<std::thread> threads;
        for (std::size_t d = 0; d < devices; ++d) {
            threads.emplace_back([&, d] { run_device(*gpus[d], pool, d, 12, failures[d]); });
        }
        for (std::thread& t : threads) t.join();
    } else {
        for (int round = 0; round < 3; ++round) {  // one thread drives every device in turn
            for (std::size_t d = 0; d < devices; ++d) run_device(*gpus[d], pool, d, 4, failures[d]);
        }
    }
    for (const std::string& failure : failures) CHECK(failure.empty());
    for (std::size_t d = 0; d < devices; ++d) {
        const devstage::SimStats stats = gpus[d]->stats();
        INFO("device " << d);
        CHECK(stats.copies_to_device == 2 * 12);  // 12 steps of 2 inputs
        CHECK(stats.copies_from_device == 12);    // and the logits back
        CHECK(stats.bounced_bytes == 0);          // the pool's memory is pinned on every device
        CHECK(stats.pageable_async_copies == 0);
        CHECK(stats.device_mallocs == stats.device_frees);
        CHECK(stats.failed_calls == 0);
    }
    CHECK(pool.stats().cache_hits + pool.stats().cache_misses == 3 * 12 * devices);
    CHECK(pool.stats().live_allocations == 0);
    CHECK(pool.stats().events_created >= 1);                       // the recorded uses, on every device's backend
    for (const auto& gpu : gpus) REQUIRE(pool.forget(*gpu).ok());  // before the backends go
}
