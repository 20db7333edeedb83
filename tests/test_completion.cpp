// SPDX-License-Identifier: Apache-2.0
// Completion (completion.hpp): the end of a stream-ordered run — wait, ready, detach, moves,
// a stager that dies first, and a wait that fails: pending until a later wait succeeds, on a
// backend without synchronize(), with one that fails, and with one that recovers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "devstage/completion.hpp"
#include "devstage/stager.hpp"
#include "support.hpp"

using namespace devstage;

TEST_CASE("completion: a default Completion is complete and ok", "[completion]") {
    Completion done;
    CHECK_FALSE(done.pending());
    CHECK(done.wait().ok());
    auto ready = done.ready();
    REQUIRE(ready.ok());
    CHECK(*ready);
    done.detach();
    CHECK(done.wait().ok());
}

TEST_CASE("completion: on an immediate stream the outputs are in place when wait returns", "[completion]") {
    // A backend without streams is staged through SynchronousAdapter: its stream is immediate.
    test::SyncOnly<MockBackend> mock;
    using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<>>;
    Stager<test::SyncOnly<MockBackend>, Packed> stager(mock);
    STATIC_REQUIRE(std::is_same_v<decltype(stager)::Stream, ImmediateStream>);
    test::HostRun host;
    host.add(300, Direction::In, 1);
    host.add(200, Direction::Out, 2);
    auto run = stager.bind(host.args, ImmediateStream{});
    REQUIRE(run.ok());
    REQUIRE(test::fake_kernel(mock, run->device_args(), host.args).ok());
    const auto device_out = test::read_device(mock, run->device_args()[1].data, 200);
    auto done = stager.finish(std::move(*run), ImmediateStream{});
    REQUIRE(done.ok());
    Completion moved = std::move(*done);
    CHECK_FALSE(done->pending());
    auto ready = moved.ready();
    REQUIRE(ready.ok());
    CHECK(*ready);
    CHECK(host.buffers[1] == device_out);  // packed outputs unpacked when the run was settled
    CHECK(moved.wait().ok());
}

// ---- a wait that fails --------------------------------------------------------------------------

namespace {

// A deferred MockBackend without synchronize(): a failed wait for a slot's event cannot be
// recovered from by waiting for the whole device.
class NoSyncMock : public test::DeferredMock {
public:
    using DeferredMock::DeferredMock;
    Status synchronize() noexcept = delete;
};
static_assert(!SynchronizingBackend<NoSyncMock> && SynchronizingBackend<test::DeferredMock>);

using PackedSmall = RetainedBump<ExactGrowth, 1024, PackSmall<>>;

// The kernel as a host function on the stream: the mock's copies made there are stream work.
struct StreamKernel {
    MockBackend* mock = nullptr;
    std::vector<TensorArg> device;
    std::vector<TensorArg> host;
    Status status;
    static void run(void* self) noexcept {
        auto* k = static_cast<StreamKernel*>(self);
        k->status = test::fake_kernel(*k->mock, k->device, k->host);
    }
};

// Small packed args and a large direct one, each way.
test::HostRun failed_wait_run() {
    test::HostRun host;
    host.add(300, Direction::In, 11);
    host.add(200, Direction::Out, 12);
    host.add(40000, Direction::Out, 13);
    host.add(64, Direction::InOut, 14);
    host.add(30000, Direction::InOut, 15);
    return host;
}

// What the run leaves in host memory when nothing fails (a synchronous run).
std::vector<std::vector<std::byte>> expected_outputs() {
    MockBackend mock;
    Stager<MockBackend, PackedSmall> stager(mock);
    test::HostRun host = failed_wait_run();
    auto run = stager.bind(host.args);
    REQUIRE(run.ok());
    REQUIRE(test::fake_kernel(mock, run->device_args(), host.args).ok());
    REQUIRE(stager.finish(std::move(*run)).ok());
    return host.buffers;
}

struct Reports {
    std::vector<std::string> messages;
    static void add(void* self, const Status& status) noexcept {
        static_cast<Reports*>(self)->messages.push_back(status.message());
    }
};

// Binds, launches the kernel and finishes the run on `stream`: nothing has run yet.
template <class B>
Completion start_run(B& mock, Stager<B, PackedSmall>& stager, typename B::Stream stream, test::HostRun& host,
                     StreamKernel& kernel) {
    auto run = stager.bind(host.args, stream);
    REQUIRE(run.ok());
    kernel.mock = &mock;
    kernel.device.assign(run->device_args().begin(), run->device_args().end());
    kernel.host = host.args;
    REQUIRE(mock.launch_host_func(stream, &StreamKernel::run, &kernel).ok());
    auto done = stager.finish(std::move(*run), stream);
    REQUIRE(done.ok());
    return std::move(*done);
}

// The next wait for an event fails; with `device_too`, the next synchronize() as well.
void fail_next_wait(MockBackend& mock, bool device_too) {
    mock.fail_call(MockOp::synchronize_event, mock.calls(MockOp::synchronize_event) + 1);
    if (device_too) mock.fail_call(MockOp::synchronize, mock.calls(MockOp::synchronize) + 1);
}

template <class B>
void failed_wait_stays_pending(bool device_too) {
    const auto expected = expected_outputs();
    B mock;
    Reports reports;
    Stager<B, PackedSmall> stager(mock);
    stager.set_error_sink(ErrorSink(&Reports::add, &reports));
    auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    test::HostRun host = failed_wait_run();
    const auto before = host.buffers;
    StreamKernel kernel;
    Completion done = start_run(mock, stager, *stream, host, kernel);
    fail_next_wait(mock, device_too);
    const Status failed = done.wait();
    CHECK(failed.code() == Errc::backend_failure);
    CHECK_THAT(failed.message(), Catch::Contains("could not be waited for"));
    // Not known complete: still pending, the host memory still devstage's and untouched.
    CHECK(done.pending());
    CHECK(test::same_bytes(host.buffers, before));
    // The fault was one call: the next wait succeeds and delivers every output, packed ones too.
    CHECK(done.wait().ok());
    CHECK_FALSE(done.pending());
    CHECK(kernel.status.ok());
    CHECK(test::same_bytes(host.buffers, expected));
    CHECK(done.wait().ok());  // repeated: the same
    CHECK(reports.messages.empty());
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(*stream).ok());
}

}  // namespace

TEST_CASE("completion: a failed wait without synchronize() stays pending; a later wait delivers", "[completion]") {
    failed_wait_stays_pending<NoSyncMock>(false);
}

TEST_CASE("completion: a failed wait whose synchronize() fails too stays pending; a later wait delivers",
          "[completion]") {
    failed_wait_stays_pending<test::DeferredMock>(true);
}

TEST_CASE("completion: a failed wait recovered by synchronize() reports the failure and delivers", "[completion]") {
    const auto expected = expected_outputs();
    test::DeferredMock mock;
    Stager<test::DeferredMock, PackedSmall> stager(mock);
    auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    test::HostRun host = failed_wait_run();
    StreamKernel kernel;
    Completion done = start_run(mock, stager, *stream, host, kernel);
    fail_next_wait(mock, false);
    CHECK(done.wait().code() == Errc::backend_failure);  // the run's failure, as far as the backend told
    CHECK_FALSE(done.pending());                         // the device was waited for: complete
    CHECK(test::same_bytes(host.buffers, expected));     // direct and packed outputs alike
    REQUIRE(mock.destroy_stream(*stream).ok());
}

TEST_CASE("completion: a destructor that cannot wait reports it; a later wait of the stager delivers", "[completion]") {
    const auto expected = expected_outputs();
    NoSyncMock mock;
    Reports reports;
    Stager<NoSyncMock, PackedSmall> stager(mock);
    stager.set_error_sink(ErrorSink(&Reports::add, &reports));
    auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    test::HostRun host = failed_wait_run();
    const auto before = host.buffers;
    StreamKernel kernel;
    {
        Completion done = start_run(mock, stager, *stream, host, kernel);
        fail_next_wait(mock, false);
    }  // its destructor's wait fails
    REQUIRE(reports.messages.size() == 1);
    CHECK_THAT(reports.messages[0], Catch::Contains("could not be waited for"));
    CHECK(test::same_bytes(host.buffers, before));  // nothing delivered, nothing freed
    CHECK(stager.release().ok());                   // waits for the slot: it settles now
    CHECK(test::same_bytes(host.buffers, expected));
    CHECK(kernel.status.ok());
    CHECK(reports.messages.size() == 1);
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(*stream).ok());
}

TEST_CASE("completion: a stager destroyed with work it cannot wait for resolves its completions with a failure",
          "[completion]") {
    NoSyncMock mock;
    mock.set_error_sink(ErrorSink(&test::quiet_sink));  // the buffers kept from the device are reported
    Reports reports;
    test::HostRun host = failed_wait_run();
    StreamKernel kernel;
    Completion done;
    auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    {
        Stager<NoSyncMock, PackedSmall> stager(mock);
        stager.set_error_sink(ErrorSink(&Reports::add, &reports));
        done = start_run(mock, stager, *stream, host, kernel);
        mock.fail_from(MockOp::synchronize_event, mock.calls(MockOp::synchronize_event) + 1);
        CHECK_FALSE(done.wait().ok());
        CHECK(done.pending());
    }
    CHECK_FALSE(done.pending());
    CHECK_THAT(done.wait().message(), Catch::Contains("could not be waited for"));
    CHECK_FALSE(reports.messages.empty());
    mock.clear_faults();
    REQUIRE(mock.destroy_stream(*stream).ok());  // the device runs what was left
}

TEST_CASE("completion: a run whose packed outputs follow another's is settled only after it", "[completion]") {
    // Two runs in flight write one small Out buffer: the later one's packed output must land last.
    std::vector<std::byte> in_a = test::pattern(300, 21), in_b = test::pattern(300, 22);
    const auto args_of = [](std::vector<std::byte>& in, std::vector<std::byte>& out) {
        return std::vector<TensorArg>{{in.data(), in.size(), Direction::In}, {out.data(), out.size(), Direction::Out}};
    };
    std::vector<std::byte> expected(200);
    {
        MockBackend plain;
        Stager<MockBackend, PackedSmall> synchronous(plain);
        for (std::vector<std::byte>* in : {&in_a, &in_b}) {
            const std::vector<TensorArg> args = args_of(*in, expected);
            auto run = synchronous.bind(args);
            REQUIRE(run.ok());
            REQUIRE(test::fake_kernel(plain, run->device_args(), args).ok());
            REQUIRE(synchronous.finish(std::move(*run)).ok());
        }
    }
    NoSyncMock mock;
    Stager<NoSyncMock, PackedSmall> stager(mock, {}, 2);
    auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    std::vector<std::byte> out(200, std::byte{0xEE});
    const std::vector<TensorArg> a = args_of(in_a, out), b = args_of(in_b, out);
    StreamKernel ka, kb;
    Completion done_a, done_b;
    for (auto [args, kernel, done] : {std::tuple{&a, &ka, &done_a}, std::tuple{&b, &kb, &done_b}}) {
        auto run = stager.bind(*args, *stream);
        REQUIRE(run.ok());
        kernel->mock = &mock;
        kernel->device.assign(run->device_args().begin(), run->device_args().end());
        kernel->host = *args;
        REQUIRE(mock.launch_host_func(*stream, &StreamKernel::run, kernel).ok());
        auto finished = stager.finish(std::move(*run), *stream);
        REQUIRE(finished.ok());
        *done = std::move(*finished);
    }
    REQUIRE(done_a.pending());
    REQUIRE(done_b.pending());
    // The wait for b's own event succeeds; the one for a's, which b's output follows, fails.
    mock.fail_call(MockOp::synchronize_event, mock.calls(MockOp::synchronize_event) + 2);
    const Status failed = done_b.wait();
    INFO(failed.message());
    CHECK_FALSE(failed.ok());
    CHECK_THAT(failed.message(), Catch::Contains("follow those of slot"));
    CHECK(done_b.pending());
    CHECK(done_a.pending());
    CHECK(std::all_of(out.begin(), out.end(), [](std::byte x) { return x == std::byte{0xEE}; }));
    CHECK(done_b.wait().ok());  // both settled now, a's output first
    CHECK_FALSE(done_a.pending());
    CHECK(done_a.wait().ok());
    CHECK(test::same_bytes(out, expected));
    CHECK(mock.misuses() == 0);
    REQUIRE(mock.destroy_stream(*stream).ok());
}
