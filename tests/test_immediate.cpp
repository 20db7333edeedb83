// SPDX-License-Identifier: Apache-2.0
// Streams immediate at run time (ImmediateStreamsQuery, detail/schedule/immediate.hpp): a
// backend that says its streams are immediate is staged as SynchronousAdapter's stream is — no
// event recorded or waited for, no host wait, no copy counted as asynchronous — with the same
// bytes; one that does not say so is not.
#include <catch2/catch.hpp>

#include <cstddef>
#include <utility>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/detail/schedule/immediate.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/stream.hpp"
#include "support.hpp"

using namespace devstage;

namespace {

// The mock at the call (its enqueued work runs at once), saying so — or, with `Says` false, not.
template <bool Says>
class EagerMock : public MockBackend {
public:
    bool streams_immediate() const noexcept { return Says; }
};
static_assert(ImmediateStreamsQuery<EagerMock<true>>);
static_assert(!ImmediateStreamsQuery<MockBackend>);
static_assert(!ImmediateStreamsQuery<test::SyncOnly<MockBackend>>);  // no streams at all

template <class Strategy, bool Says>
void staged_on_immediate_streams() {
    EagerMock<Says> mock;
    CHECK(detail::streams_immediate(mock) == Says);
    Stager<EagerMock<Says>, Strategy> stager(mock, {}, 2);
    auto stream = mock.create_stream();
    REQUIRE(stream.ok());
    for (int step = 0; step < 3; ++step) {
        test::HostRun host;
        host.add(300, Direction::In, 1 + step);
        host.add(200, Direction::InOut, 2 + step);
        host.add(40000, Direction::Out, 3 + step);
        test::HostRun reference = host;
        auto run = stager.bind(host.args, *stream);
        REQUIRE(run.ok());
        REQUIRE(test::fake_kernel(mock, run->device_args(), host.args).ok());
        auto done = stager.finish(std::move(*run), *stream);
        REQUIRE(done.ok());
        REQUIRE(done->wait().ok());
        // The same bytes as a synchronous run.
        MockBackend plain;
        Stager<MockBackend, Strategy> synchronous(plain);
        reference.relink();
        auto sync_run = synchronous.bind(reference.args);
        REQUIRE(sync_run.ok());
        REQUIRE(test::fake_kernel(plain, sync_run->device_args(), reference.args).ok());
        REQUIRE(synchronous.finish(std::move(*sync_run)).ok());
        CHECK(test::same_bytes(host.buffers, reference.buffers));
    }
    const StagerStats& stats = stager.stats();
    if constexpr (Says) {
        CHECK(stats.async_uploads == 0);
        CHECK(stats.async_copy_backs == 0);
        CHECK(stats.host_waits == 0);
        CHECK(mock.calls(MockOp::record_event) == 0);
        CHECK(mock.calls(MockOp::synchronize_event) == 0);
        CHECK(mock.calls(MockOp::create_event) == 0);
    } else {
        CHECK(stats.async_uploads > 0);
        CHECK(stats.async_copy_backs > 0);
        CHECK(mock.calls(MockOp::record_event) > 0);
    }
    REQUIRE(mock.destroy_stream(*stream).ok());
}

}  // namespace

TEST_CASE("immediate: SynchronousAdapter's stream is immediate at compile time", "[immediate]") {
    MockBackend mock;
    SynchronousAdapter<MockBackend> adapter(mock);
    CHECK(detail::streams_immediate(adapter));
    CHECK_FALSE(detail::streams_immediate(mock));
}

TEST_CASE("immediate: a backend whose streams are immediate at run time waits for nothing", "[immediate]") {
    staged_on_immediate_streams<RetainedBump<>, true>();
    staged_on_immediate_streams<RetainedBump<ExactGrowth, 1024, PackSmall<>>, true>();
    staged_on_immediate_streams<PerTensorMalloc<>, true>();
}

TEST_CASE("immediate: one that does not say so is staged with events", "[immediate]") {
    staged_on_immediate_streams<RetainedBump<>, false>();
    staged_on_immediate_streams<RetainedBump<ExactGrowth, 1024, PackSmall<>>, false>();
}
