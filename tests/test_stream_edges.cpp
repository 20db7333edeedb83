// SPDX-License-Identifier: Apache-2.0
// Edges of the stream-ordered API where the three newest facilities meet: frames with
// device-resident tensors, order_after_uploads with a kernel on another stream, and Out args
// zeroed before the kernel (by a device memset, or by zeros uploaded where the backend has none).
// Faults are injected at every call of every operation a fixed program makes; after each the
// stager must hold nothing, have misused nothing, and stage the next program correctly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "sequential_backend.hpp"
#include "sequential_program.hpp"

using namespace devstage;

namespace {

using EdgePacked = RetainedBump<GeometricGrowth<3, 2>, 256, PackSmall<512>>;

void silent(const Status&) noexcept {}

// The kernel: Out[i] = In[i % in] + step for the first `written` bytes of each Out arg; the
// rest is left unwritten (a kernel that stops early). InOut (the device-resident cache) += 1.
struct EdgeKernel {
    std::vector<TensorArg> args;
    std::size_t written = 0;
    std::uint8_t step = 0;
    static void run(void* self) noexcept {
        auto* k = static_cast<EdgeKernel*>(self);
        const std::byte* in = nullptr;
        std::size_t in_bytes = 0;
        for (const TensorArg& a : k->args) {
            if (a.direction == Direction::In && a.bytes > 0) {
                in = static_cast<const std::byte*>(a.data);
                in_bytes = a.bytes;
                break;
            }
        }
        for (const TensorArg& a : k->args) {
            auto* p = static_cast<std::uint8_t*>(a.data);
            if (a.direction == Direction::InOut) {
                for (std::size_t b = 0; b < a.bytes; ++b) p[b] = static_cast<std::uint8_t>(p[b] + 1);
            } else if (a.direction == Direction::Out) {
                for (std::size_t b = 0; b < a.bytes && b < k->written; ++b) {
                    p[b] = static_cast<std::uint8_t>(std::to_integer<std::uint8_t>(in[b % in_bytes]) + k->step);
                }
            }
        }
    }
};

// One step of an engine: a frame of {tokens In (host), cache InOut (device-resident), logits
// Out (host)} and a plain bind of {big In, big Out} (direct, above the packing limit), both
// bound on `copy`, ordered onto `compute` with order_after_uploads, their kernels there, and
// finished there. Returns the first failure (the program goes on past none).
template <class B>
struct EdgeProgram {
    B& backend;
    typename B::Stream copy, compute;
    void* cache = nullptr;  // device-resident, 300 bytes
    std::vector<std::byte> big_in = std::vector<std::byte>(1500, std::byte{9});
    std::vector<std::byte> big_out = std::vector<std::byte>(1500, std::byte{0xEE});
    std::vector<std::byte> logits_seen = {};  // the frame's logits, read when its run completed
    // A frame whose bind failed stays unbound, its slot held: the engine binds it again (and
    // ends that run at once) before anything else.
    std::optional<HostFrame> unbound = std::nullopt;

    Status bind_unbound(Stager<B, EdgePacked>& stager) {
        if (!unbound) return {};
        Result<StagedRun> run = stager.bind(*unbound, copy);
        if (!run && run.status().code() == Errc::invalid_argument) {
            unbound.reset();  // used up (a bind that failed after it moved the mirror, say)
            return {};
        }
        if (!run) return run.status();
        unbound.reset();
        Result<Completion> done = stager.finish(std::move(*run), copy, Status(Errc::backend_failure, "skipped"));
        if (!done) return done.status();
        return done->wait();
    }

    Status step(Stager<B, EdgePacked>& stager, std::uint8_t n, std::size_t written) {
        if (Status retried = bind_unbound(stager); !retried) return retried;
        const TensorShape shapes[] = {{200, Direction::In}, {300, Direction::InOut, cache}, {400, Direction::Out}};
        Result<HostFrame> frame = stager.frame(shapes);
        if (!frame) return frame.status();
        if (!frame->host(1).empty()) return Status(Errc::invalid_argument, "a device tensor has host bytes");
        std::memset(frame->host(0).data(), 0x10 + n, 200);
        std::memset(frame->host(2).data(), 0xCC, 400);  // stale bytes a zeroing must not let through
        Result<StagedRun> framed = stager.bind(*frame, copy);
        if (!framed) {
            unbound.emplace(std::move(*frame));
            return framed.status();
        }
        if (framed->device_args()[1].data != cache) return Status(Errc::invalid_argument, "not passed through");
        const TensorArg plain[] = {{big_in.data(), big_in.size(), Direction::In},
                                   {big_out.data(), big_out.size(), Direction::Out}};
        Result<StagedRun> direct = stager.bind(plain, copy);
        if (!direct) return direct.status();  // the frame's run is dropped
        EdgeKernel k1{{framed->device_args().begin(), framed->device_args().end()}, written, n};
        EdgeKernel k2{{direct->device_args().begin(), direct->device_args().end()}, written, n};
        Status first;
        for (auto* run : {&*framed, &*direct}) {
            if (Status s = stager.order_after_uploads(*run, compute); !s && first.ok()) first = s;
        }
        const bool launch = first.ok();
        if (launch) {
            for (EdgeKernel* k : {&k1, &k2}) {
                if (Status s = backend.launch_host_func(compute, &EdgeKernel::run, k); !s && first.ok()) first = s;
            }
        }
        // The kernels ran (or never will): finishing on compute orders the copy-backs after them.
        const Status execution = launch ? Status() : Status(Errc::backend_failure, "not launched");
        Result<Completion> done_framed = stager.finish(std::move(*framed), compute, execution);
        Result<Completion> done_direct = stager.finish(std::move(*direct), compute, execution);
        for (Result<Completion>* done : {&done_framed, &done_direct}) {
            if (!*done) {
                if (first.ok()) first = done->status();
                continue;
            }
            if (Status s = (*done)->wait(); !s && first.ok()) first = s;
        }
        if (done_framed && first.ok()) logits_seen.assign(frame->host(2).begin(), frame->host(2).end());
        // The Completions die here: the frame goes back to the stager.
        if (launch && !execution.ok() && first.ok()) first = execution;
        return first;
    }
};

// The bytes a correct step leaves: `written` bytes of In + n, then zeros.
std::vector<std::byte> expected_out(std::size_t bytes, std::uint8_t in, std::uint8_t n, std::size_t written) {
    std::vector<std::byte> out(bytes, std::byte{0});
    for (std::size_t b = 0; b < bytes && b < written; ++b) out[b] = std::byte(static_cast<std::uint8_t>(in + n));
    return out;
}

template <class B>
void check_clean_step(B& mock, EdgeProgram<B>& program, Stager<B, EdgePacked>& stager, std::uint8_t n) {
    program.big_out.assign(1500, std::byte{0xEE});
    program.logits_seen.clear();
    const Status s = program.step(stager, n, 100);
    INFO(s.message());
    REQUIRE(s.ok());
    CHECK(program.logits_seen == expected_out(400, 0x10 + n, n, 100));
    CHECK(program.big_out == expected_out(1500, 9, n, 100));
    CHECK(mock.misuses() == 0);
}

// Every call of `op` a clean program makes, failed in turn (at the call, or when it runs).
template <class B>
void sweep(MockOp op, bool when_run) {
    for (std::uint64_t k = 1;; ++k) {
        CAPTURE(static_cast<int>(op), when_run, k);
        B mock(MockConfig{.sink = &silent, .deferred_async = true, .not_ready_polls = 1});
        auto copy = mock.create_stream(), compute = mock.create_stream();
        REQUIRE((copy && compute));
        Result<void*> cache = mock.device_malloc(300);
        REQUIRE(cache);
        REQUIRE(mock.copy_to_device(*cache, std::vector<std::byte>(300).data(), 300).ok());
        const std::size_t device_baseline = mock.live_device_allocations();
        const std::size_t pinned_baseline = mock.live_pinned_allocations();
        EdgeProgram<B> program{mock, *copy, *compute, *cache};
        bool injected = false;
        {
            Stager<B, EdgePacked> stager(mock, {}, 2);
            stager.set_error_sink(&silent);
            check_clean_step(mock, program, stager, 1);  // grown, nothing injected yet
            const std::uint64_t before = mock.calls(op);
            if (when_run) {
                mock.fail_when_run(op, before + k);
            } else {
                mock.fail_call(op, before + k);
            }
            // Two steps under the fault: the first may fail anywhere; nothing may leak or be misused.
            for (std::uint8_t n = 2; n < 4; ++n) (void)program.step(stager, n, 50);
            injected = mock.calls(op) >= before + k;
            mock.clear_faults();
            mock.clear_failures();
            (void)mock.synchronize();
            // The stager goes on: a clean step stages, zeroes and copies back correctly.
            check_clean_step(mock, program, stager, 5);
            REQUIRE(stager.release().ok());
            CHECK(stager.live_runs() == 0);
        }
        CHECK(mock.live_device_allocations() == device_baseline);
        CHECK(mock.live_pinned_allocations() == pinned_baseline);
        CHECK(mock.misuses() == 0);
        REQUIRE(mock.device_free(*cache).ok());
        REQUIRE(mock.destroy_stream(*copy).ok());
        REQUIRE(mock.destroy_stream(*compute).ok());
        if (!injected || k > 64) break;  // every call of the two steps was failed once
    }
}

}  // namespace

TEST_CASE("stream edges: a fault at any call of a frame/device-tensor/order_after_uploads program leaks nothing",
          "[stream_edges][transactional]") {
    for (MockOp op : {MockOp::device_memset_async, MockOp::copy_to_device_async, MockOp::copy_from_device_async,
                      MockOp::record_event, MockOp::stream_wait_event, MockOp::event_ready, MockOp::synchronize_event,
                      MockOp::device_malloc, MockOp::pinned_malloc, MockOp::launch_host_func}) {
        sweep<MockBackend>(op, false);
    }
}

TEST_CASE("stream edges: enqueued work failing when it runs is reported; the stager goes on",
          "[stream_edges][transactional][deferred]") {
    for (MockOp op : {MockOp::device_memset_async, MockOp::copy_to_device_async, MockOp::copy_from_device_async,
                      MockOp::launch_host_func}) {
        sweep<MockBackend>(op, true);
    }
}

TEST_CASE("stream edges: without a device memset, a failed zero upload leaks nothing",
          "[stream_edges][transactional]") {
    for (MockOp op : {MockOp::copy_to_device_async, MockOp::record_event, MockOp::stream_wait_event}) {
        sweep<sequential::NoMemsetMock>(op, false);
    }
    sweep<sequential::NoMemsetMock>(MockOp::copy_to_device_async, true);
}

namespace {

// A frame of {In 200, Out 400}, whose bind fails once at the first call of `op`, then is bound
// again; returns the status of that second bind.
Status rebind_after_failure(MockOp op) {
    MockBackend mock(MockConfig{.sink = &silent});  // synchronous calls: on the stager's own stream
    Stager<MockBackend, EdgePacked> stager(mock);
    stager.set_error_sink(&silent);
    const TensorShape shapes[] = {{200, Direction::In}, {400, Direction::Out}};
    Result<HostFrame> frame = stager.frame(shapes);
    REQUIRE(frame.ok());
    std::memset(frame->host(0).data(), 3, 200);
    std::memset(frame->host(1).data(), 0xCC, 400);
    mock.fail_call(op, mock.calls(op) + 1);
    Result<StagedRun> failed = stager.bind(*frame);
    REQUIRE_FALSE(failed.ok());
    mock.clear_faults();
    Result<StagedRun> again = stager.bind(*frame);
    if (!again) return again.status();
    REQUIRE(stager.finish(std::move(*again)).ok());
    CHECK(frame->host(1)[0] == std::byte{0});  // zeroed, never written
    return {};
}

}  // namespace

TEST_CASE("stream edges: a frame whose packed upload was refused stays unbound and binds again",
          "[stream_edges][frame]") {
    const Status again = rebind_after_failure(MockOp::copy_to_device_async);
    INFO(again.message());
    CHECK(again.ok());
}

// A frame's Out args are zeroed in the mirror and carried by its one upload: no device memset is
// called, so a memset the backend would refuse cannot fail the bind.
TEST_CASE("stream edges: a frame's Out zeroing makes no memset call", "[stream_edges][frame]") {
    MockBackend mock(MockConfig{.sink = &silent});
    Stager<MockBackend, EdgePacked> stager(mock);
    stager.set_error_sink(&silent);
    const TensorShape shapes[] = {{200, Direction::In}, {400, Direction::Out}};
    Result<HostFrame> frame = stager.frame(shapes);
    REQUIRE(frame.ok());
    std::memset(frame->host(1).data(), 0xCC, 400);
    mock.fail_call(MockOp::device_memset_async, mock.calls(MockOp::device_memset_async) + 1);
    Result<StagedRun> run = stager.bind(*frame);
    REQUIRE(run.ok());
    CHECK(mock.calls(MockOp::device_memset_async) == 0);
    REQUIRE(stager.finish(std::move(*run)).ok());
    CHECK(frame->host(1)[0] == std::byte{0});  // zeroed, never written
}

// A run dropped (destroyed without finish) after order_after_uploads put its kernel on another
// stream frees its PerTensorMalloc allocations only once that kernel completed: the slow
// backend counts the free of memory a pending kernel said it touches.
TEST_CASE("stream edges: a run dropped after its kernel was ordered onto another stream frees nothing early",
          "[stream_edges]") {
    sequential::SlowBackend slow;
    auto copy = slow.create_stream(), compute = slow.create_stream();
    REQUIRE((copy && compute));
    std::vector<std::byte> in(2000, std::byte{1}), out(2000, std::byte{2});
    {
        Stager<sequential::SlowBackend, PerTensorMalloc<256>> stager(slow);
        stager.set_error_sink(&silent);
        const TensorArg args[] = {{in.data(), in.size(), Direction::In}, {out.data(), out.size(), Direction::Out}};
        Result<StagedRun> run = stager.bind(args, *copy);
        REQUIRE(run.ok());
        REQUIRE(stager.order_after_uploads(*run, *compute).ok());
        EdgeKernel kernel{{run->device_args().begin(), run->device_args().end()}, 2000, 1};
        const devstage::KernelAccess ranges[] = {{run->device_args()[0].data, 2000, true, false},
                                                 {run->device_args()[1].data, 2000, false, true}};
        REQUIRE(slow.launch_kernel(*compute, &EdgeKernel::run, &kernel, ranges).ok());
        run = Status(Errc::backend_failure, "the engine gives up on the run");  // dropped, not finished
        INFO(slow.first_misuse());
        CHECK(slow.misuses() == 0);
        Result<sequential::SlowBackend::Event> event = slow.create_event();
        REQUIRE(event.ok());
        REQUIRE(slow.record_event(*event, *compute).ok());
        REQUIRE(slow.synchronize_event(*event).ok());
        REQUIRE(slow.destroy_event(*event).ok());
    }
    CHECK(slow.misuses() == 0);
    REQUIRE(slow.destroy_stream(*copy).ok());
    REQUIRE(slow.destroy_stream(*compute).ok());
}

namespace {

// A packed (or mapped) run whose stream-ordered finish fails at the call (its event cannot be
// recorded) and whose settle cannot wait either (synchronize_event and synchronize() fail): the
// finish returns the failure, and the run's packed outputs are dropped. The engine owns its host
// memory again and rewrites the output; a later settle of the slot (release()) must not copy the
// run's outputs over it.
template <class Strategy>
void failed_finish_never_delivers() {
    MockBackend mock(MockConfig{.sink = &silent, .deferred_async = true});
    Stager<MockBackend, Strategy> stager(mock);
    stager.set_error_sink(&silent);
    const auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    std::vector<std::byte> in(100, std::byte{7}), out(200, std::byte{0xAA});
    const TensorArg args[] = {{in.data(), in.size(), Direction::In}, {out.data(), out.size(), Direction::Out}};
    Result<StagedRun> run = stager.bind(args, *stream);
    REQUIRE(run.ok());
    for (MockOp op : {MockOp::record_event, MockOp::synchronize_event, MockOp::synchronize}) {
        mock.fail_from(op, mock.calls(op) + 1);
    }
    Result<Completion> done = stager.finish(std::move(*run), *stream);
    REQUIRE_FALSE(done.ok());
    CHECK(done.status().code() == Errc::backend_failure);
    std::fill(out.begin(), out.end(), std::byte{0x55});  // the engine's memory again: it rewrites it
    mock.clear_faults();
    REQUIRE(stager.release().ok());
    CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x55}; }));
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(*stream).ok());
}

}  // namespace

TEST_CASE("stream edges: a finish that fails at the call and cannot wait never delivers its packed outputs later",
          "[stream_edges][deferred]") {
    SECTION("packed") {
        failed_finish_never_delivers<RetainedBump<ExactGrowth, 256, PackSmall<512>>>();
    }
    SECTION("mapped") {
        failed_finish_never_delivers<RetainedBump<ExactGrowth, 256, MapSmall<512>>>();
    }
}
