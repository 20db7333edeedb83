// SPDX-License-Identifier: Apache-2.0
// Sequential equivalence: random engine programs, compared byte for byte with their synchronous
// run — with faults injected at the stager's calls, batched copies, bind_slot, reserve and
// release, buffers passed as several args, and mapped runs whose map fails — and the fixed
// programs, fault sweeps and self-tests of the checker (tests/sequential_*.hpp).
//
// Reproduce one program: DEVSTAGE_SEQ_SEED=<seed> build/tests/test_sequential "[repro]"
// (prints its configuration and trace). DEVSTAGE_SEQ_PROGRAMS=<n> changes how many programs
// the random case runs (DEVSTAGE_SEQ_FIRST=<seed> where they start). DEVSTAGE_SEQ_EXPECT=all
// (or names, sequential_config.hpp) turns on what the library does not give yet: the random
// programs then also run what needs it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sequential_program.hpp"

namespace {

using namespace sequential;

#if defined(__SANITIZE_THREAD__)
constexpr bool tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool tsan = true;
#else
constexpr bool tsan = false;
#endif
#else
constexpr bool tsan = false;
#endif

// What went wrong, not where: numbers become '#'.
std::string kind_of(const std::string& failure) {
    std::string kind;
    for (char c : failure) {
        if (c >= '0' && c <= '9') {
            if (kind.empty() || kind.back() != '#') kind += '#';
        } else {
            kind += c;
        }
    }
    if (const auto at = kind.find(", first at byte"); at != std::string::npos) kind.resize(at);
    if (kind.size() > 140) kind.resize(140);
    return kind;
}

std::uint64_t from_env(const char* name, std::uint64_t otherwise) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return otherwise;
    return std::strtoull(value, nullptr, 0);
}

}  // namespace

TEST_CASE("random engine programs equal their sequential run on every configuration", "[sequential]") {
    const std::uint64_t first = from_env("DEVSTAGE_SEQ_FIRST", 1);
    const std::uint64_t programs = from_env("DEVSTAGE_SEQ_PROGRAMS", tsan ? config_count / 4 : 6 * config_count);
    const unsigned expect = expectations_from_env();
    std::uint64_t failed = 0;
    std::ostringstream shown;
    std::map<std::string, std::pair<std::uint64_t, std::string>> by_failure;  // programs, and the first seeds
    Tally tally;
    std::map<BackendKind, Tally> by_backend;
    for (std::uint64_t seed = first; seed < first + programs; ++seed) {
        const Report report = run_seed_isolated(seed, 14, expect);
        tally.add(report.tally);
        by_backend[report.config.backend].add(report.tally);
        if (report.ok()) continue;
        if (failed < 2) shown << "---- seed " << seed << "\n" << report.text() << "\n";
        ++failed;
        std::set<std::string> kinds;
        for (const std::string& failure : report.failures) kinds.insert(kind_of(failure));
        for (const std::string& kind : kinds) {
            auto& [count, seeds] = by_failure[kind];
            if (count++ < 3) seeds += "      seed " + std::to_string(seed) + ": " + report.config.describe() + "\n";
        }
    }
    std::ostringstream summary;
    summary << failed << " of " << programs << " programs failed\n";
    for (const auto& [kind, found] : by_failure) {
        summary << "  " << found.first << " programs: " << kind << "\n" << found.second;
    }
    std::printf("sequential: %s\n", tally.text().c_str());
    if (std::getenv("DEVSTAGE_SEQ_PROGRAMS") != nullptr) {  // a long run: the figures per backend
        static const char* const names[] = {"deferred mock",   "sim",        "slow",
                                            "mock, no memset", "eager mock", "mock, no streams"};
        for (const auto& [backend, figures] : by_backend) {
            std::printf("  %s: %s\n", names[static_cast<int>(backend)], figures.text().c_str());
        }
    }
    INFO(summary.str() << shown.str());
    CHECK(failed == 0);
    // Over two cycles of the configurations every blind spot of the checker is visited: faults
    // at every operation a stager call makes, batches, bind_slot, reserve and release, buffers
    // in two args of one run, mapped runs whose map failed.
    if (programs >= 2 * config_count) {
        INFO(tally.text());
        CHECK(tally.programs == programs);
        CHECK(tally.frames > 0);
        CHECK(tally.bind_slots > 0);
        CHECK(tally.aliased_runs > 0);
        CHECK(tally.sync_steps > 0);
        CHECK(tally.reserves > 0);
        CHECK(tally.releases > 0);
        CHECK(tally.failed_calls > 0);
        CHECK(tally.mapped_runs > 0);
        CHECK(tally.map_failures > 0);
        CHECK(tally.batched_copies > 0);
        for (std::size_t op = 0; op < fault_op_count; ++op) {
            CAPTURE(fault_op_name(static_cast<FaultOp>(op)));
            CHECK(tally.fault_ops[op] > 0);
        }
    }
}

TEST_CASE("one program, by seed", "[.repro][repro]") {
    const std::uint64_t seed = from_env("DEVSTAGE_SEQ_SEED", 1);
    const Report report = run_seed(seed, 14, expectations_from_env());
    WARN("seed " << seed << "\n" << report.text());
    CHECK(report.ok());
}

// ---- fixed programs ------------------------------------------------------------------------------

namespace {

ArgSpec host_arg(int buffer, std::size_t bytes, Direction direction) {
    ArgSpec arg;
    arg.where = Where::host;
    arg.index = buffer;
    arg.bytes = bytes;
    arg.direction = direction;
    return arg;
}
ArgSpec frame_arg(int step, int tensor, std::size_t bytes, Direction direction) {
    ArgSpec arg;
    arg.where = Where::frame;
    arg.index = step;
    arg.tensor = tensor;
    arg.bytes = bytes;
    arg.direction = direction;
    return arg;
}
StepSpec plain(std::vector<ArgSpec> args, unsigned bind_stream = 0, unsigned finish_stream = 0) {
    StepSpec spec;
    spec.args = std::move(args);
    spec.bind_stream = bind_stream;
    spec.finish_stream = finish_stream;
    return spec;
}
StepSpec frame(std::vector<ArgSpec> shapes, unsigned stream = 0) {
    StepSpec spec;
    spec.frame = true;
    spec.args = std::move(shapes);
    spec.bind_stream = spec.finish_stream = stream;
    return spec;
}

template <class B, class S>
using Script = std::function<void(Runner<B, S>&)>;

// Runs `script` on Stager<B, S>, then concludes (waits for everything, releases, compares).
template <class B, class S>
Report scripted(Config config, const std::vector<std::size_t>& buffers, const Script<B, S>& script) {
    Report report;
    {
        Runner<B, S> runner(config, report);
        for (std::size_t bytes : buffers) runner.add_host_buffer(bytes, false);
        REQUIRE(runner.start());
        script(runner);
        Choices in_order(0);
        runner.conclude(in_order);
        runner.teardown();
        report.trace = runner.trace();
    }
    return report;
}

template <class B, class S>
Config config_of(unsigned slots, unsigned streams) {
    Config config;
    config.backend = std::is_same_v<B, devstage::MockBackend>  ? BackendKind::mock
                     : std::is_same_v<B, devstage::SimBackend> ? BackendKind::sim
                     : std::is_same_v<B, StreamlessMock>       ? BackendKind::streamless
                                                               : BackendKind::slow;
    config.strategy = std::is_same_v<S, Bump>     ? StrategyKind::bump
                      : std::is_same_v<S, Packed> ? StrategyKind::packed
                      : std::is_same_v<S, Mapped> ? StrategyKind::mapped
                                                  : StrategyKind::per_tensor;
    config.slots = slots;
    config.streams = streams;
    return config;
}

// Step: bind, kernel, finish.
template <class R>
int full_step(R& runner, StepSpec spec) {
    const bool framed = spec.frame;
    const int id = runner.begin_step(std::move(spec));
    if (id < 0) return id;
    if (framed && !runner.bind_frame(id)) return -1;
    runner.kernel(id);
    runner.finish(id);
    return id;
}

#define CHECK_REPORT(report)         \
    do {                             \
        const Report& r_ = (report); \
        INFO(r_.text());             \
        CHECK(r_.ok());              \
    } while (0)

template <class B, class S>
void inout_twice(unsigned slots) {
    CHECK_REPORT((scripted<B, S>(config_of<B, S>(slots, 1), {64, 32}, [](Runner<B, S>& r) {
        full_step(r, plain({host_arg(0, 64, Direction::InOut), host_arg(1, 32, Direction::In)}));
        full_step(r, plain({host_arg(0, 64, Direction::InOut)}));
    })));
}

template <class B, class S>
void same_out_later_waited_first(unsigned slots, unsigned streams) {
    CHECK_REPORT((scripted<B, S>(config_of<B, S>(slots, streams), {64, 16, 16}, [streams](Runner<B, S>& r) {
        const int a = full_step(r, plain({host_arg(0, 64, Direction::Out), host_arg(1, 16, Direction::In)}));
        const int b = full_step(
            r, plain({host_arg(0, 64, Direction::Out), host_arg(2, 16, Direction::In)}, streams - 1, streams - 1));
        if (b >= 0) r.end(b, End::wait);
        if (a >= 0) r.end(a, End::wait);
    })));
}

template <class B, class S>
void shared_across_streams() {
    CHECK_REPORT((scripted<B, S>(config_of<B, S>(2, 2), {64, 700, 48}, [](Runner<B, S>& r) {
        full_step(r, plain({host_arg(0, 64, Direction::InOut), host_arg(1, 700, Direction::Out)}, 0, 0));
        full_step(r, plain({host_arg(0, 64, Direction::InOut), host_arg(1, 700, Direction::In)}, 1, 1));
        full_step(r, plain({host_arg(1, 700, Direction::InOut), host_arg(2, 48, Direction::Out)}, 0, 1));
        full_step(r, plain({host_arg(2, 48, Direction::In), host_arg(0, 64, Direction::InOut)}, 1, 0));
    })));
}

template <class B>
void frame_slot_held(unsigned slots) {
    using S = Packed;
    CHECK_REPORT((scripted<B, S>(config_of<B, S>(slots, 1), {64, 64}, [](Runner<B, S>& r) {
        const int f = full_step(r, frame({frame_arg(-1, 0, 64, Direction::In), frame_arg(-1, 1, 200, Direction::Out)}));
        // The frame's Completion lives: its outputs stay the engine's; other runs go elsewhere.
        full_step(r, plain({host_arg(0, 64, Direction::InOut)}));
        full_step(r, frame({frame_arg(-1, 0, 64, Direction::In), frame_arg(-1, 1, 200, Direction::Out)}));
        full_step(r, plain({host_arg(1, 64, Direction::Out), host_arg(0, 64, Direction::In)}));
        if (f >= 0) r.end(f, End::wait);
    })));
}

template <class B>
void frame_output_fed_back(unsigned slots) {
    using S = Packed;
    CHECK_REPORT((scripted<B, S>(config_of<B, S>(slots, 1), {500, 500, 500, 500}, [](Runner<B, S>& r) {
        const int f = full_step(r, frame({frame_arg(-1, 0, 64, Direction::In), frame_arg(-1, 1, 64, Direction::Out)}));
        if (f < 0) return;
        r.end(f, End::wait);
        // Its output as an input of a bind whose plan is far larger than the frame's mirror.
        full_step(r, plain({frame_arg(f, 1, 64, Direction::In), host_arg(0, 500, Direction::In),
                            host_arg(1, 500, Direction::InOut), host_arg(2, 500, Direction::Out),
                            host_arg(3, 500, Direction::InOut)}));
        // And fed back without waiting for the frame's run first.
        const int g = full_step(r, frame({frame_arg(-1, 0, 64, Direction::In), frame_arg(-1, 1, 64, Direction::Out)}));
        if (g >= 0) full_step(r, plain({frame_arg(g, 1, 64, Direction::In), host_arg(0, 500, Direction::Out)}));
    })));
}

// A frame's kernel fails part way: nothing is copied back, but a mapped frame holds what the
// kernel wrote in place. Its InOut tensor is then fed into a plain run, whose output shows it.
template <class B, class S>
void failed_frame_fed_back(unsigned slots) {
    CHECK_REPORT((scripted<B, S>(config_of<B, S>(slots, 1), {64, 200}, [](Runner<B, S>& r) {
        const int f = r.begin_step(frame({frame_arg(-1, 0, 64, Direction::InOut), frame_arg(-1, 1, 200, Direction::Out),
                                          frame_arg(-1, 2, 32, Direction::In)}));
        if (f < 0 || !r.bind_frame(f)) return;
        r.kernel(f);
        r.finish(f, false);
        r.end(f, End::wait);
        full_step(r, plain({frame_arg(f, 0, 64, Direction::In), host_arg(0, 64, Direction::Out)}));
        full_step(r, plain({frame_arg(f, 0, 64, Direction::In), host_arg(1, 200, Direction::InOut)}));
    })));
}

}  // namespace

TEST_CASE("a failed kernel of a frame: copied, its tensors stay; mapped, they hold what it wrote",
          "[sequential][mapped]") {
    for (unsigned slots : {1u, 2u}) {
        failed_frame_fed_back<devstage::MockBackend, Packed>(slots);
        failed_frame_fed_back<devstage::MockBackend, Mapped>(slots);
        failed_frame_fed_back<devstage::SimBackend, Mapped>(slots);
        failed_frame_fed_back<SlowBackend, Mapped>(slots);
    }
}

TEST_CASE("an InOut state incremented by two pipelined runs ends at +2", "[sequential][regression]") {
    for (unsigned slots : {1u, 2u, 3u}) {
        inout_twice<devstage::MockBackend, Packed>(slots);
        inout_twice<devstage::SimBackend, Packed>(slots);
        inout_twice<SlowBackend, Packed>(slots);
        inout_twice<devstage::MockBackend, Bump>(slots);
        inout_twice<SlowBackend, PerTensor>(slots);
    }
}

TEST_CASE("two runs writing one Out buffer, the later Completion waited first", "[sequential][regression]") {
    for (unsigned streams : {1u, 2u}) {
        same_out_later_waited_first<devstage::MockBackend, Packed>(2, streams);
        same_out_later_waited_first<devstage::MockBackend, Bump>(2, streams);
        same_out_later_waited_first<devstage::MockBackend, PerTensor>(2, streams);
        same_out_later_waited_first<devstage::SimBackend, Packed>(2, streams);
        same_out_later_waited_first<SlowBackend, Packed>(2, streams);
        same_out_later_waited_first<SlowBackend, Bump>(2, streams);
    }
}

TEST_CASE("runs sharing host buffers over 2 slots and 2 streams keep call order", "[sequential][regression]") {
    shared_across_streams<devstage::MockBackend, Bump>();
    shared_across_streams<devstage::MockBackend, PerTensor>();
    shared_across_streams<devstage::MockBackend, Packed>();
    shared_across_streams<SlowBackend, Bump>();
    shared_across_streams<SlowBackend, PerTensor>();
    shared_across_streams<devstage::SimBackend, Bump>();
}

TEST_CASE("a frame's slot is not taken while its Completion lives", "[sequential][regression]") {
    for (unsigned slots : {1u, 2u, 3u}) {
        frame_slot_held<devstage::MockBackend>(slots);
        frame_slot_held<SlowBackend>(slots);
        frame_slot_held<devstage::SimBackend>(slots);
    }
}

TEST_CASE("a frame's output fed back as an input into a growing bind", "[sequential][regression]") {
    for (unsigned slots : {1u, 2u}) {
        frame_output_fed_back<devstage::MockBackend>(slots);
        frame_output_fed_back<SlowBackend>(slots);
        frame_output_fed_back<devstage::SimBackend>(slots);
    }
}

TEST_CASE("the checker sees a wrong byte", "[sequential]") {
    // A self-test: an engine that writes a buffer behind the model's back is reported.
    Report report;
    {
        Runner<devstage::MockBackend, Bump> runner(config_of<devstage::MockBackend, Bump>(1, 1), report);
        const int buffer = runner.add_host_buffer(16, false);
        REQUIRE(runner.start());
        const int id = full_step(runner, plain({host_arg(buffer, 16, Direction::InOut)}));
        REQUIRE(id == 0);
        runner.end(id, End::wait);
        CHECK(report.ok());
        runner.host_data(buffer)[3] ^= std::byte{1};
        Choices none(0);
        runner.conclude(none);
    }
    // Seen where the run's Completion is destroyed (its output checked again) and at the end.
    REQUIRE_FALSE(report.failures.empty());
    for (const std::string& failure : report.failures) {
        INFO(failure);
        CHECK(failure.find("b0: 1 of 16 bytes differ") != std::string::npos);
    }
    CHECK(report.failures.back().find("host buffer b0: 1 of 16 bytes differ") != std::string::npos);
}

TEST_CASE("the checker's mapped programs run mapped on every backend, frames in place", "[sequential]") {
    // Programs of MapSmall on each backend kind (all of them map): their runs go through the
    // mapped mirror, with no packed copy; the programs' checks above hold for them too.
    std::map<BackendKind, devstage::StagerStats> seen;
    const std::uint64_t programs = std::min(from_env("DEVSTAGE_SEQ_PROGRAMS", config_count), config_count);
    for (std::uint64_t seed = 1; seed <= std::max<std::uint64_t>(programs, 100); ++seed) {
        Choices choices(seed);
        Config config = seed_config(seed, choices, 14);
        if (config.strategy != StrategyKind::mapped) continue;
        const Report report = run_program(config, choices);
        INFO(report.text());
        REQUIRE(report.ok());
        devstage::StagerStats& sum = seen[config.backend];
        sum.mapped_runs += report.stats.mapped_runs;
        sum.runs += report.stats.runs;
        sum.host_maps += report.stats.host_maps;
        // Only an injected map_host failure leaves a slot unmapped (then it copies).
        if (!config.call_faults) sum.map_failures += report.stats.map_failures;
        sum.packed_args += report.stats.packed_args;
    }
    REQUIRE(seen.size() == backend_kinds);
    for (const auto& [backend, sum] : seen) {
        CAPTURE(static_cast<int>(backend), sum.runs, sum.mapped_runs, sum.host_maps);
        CHECK(sum.mapped_runs > sum.runs / 4);
        CHECK(sum.host_maps > 0);
        CHECK(sum.map_failures == 0);
        CHECK(sum.packed_args > 0);
    }
}

// ---- the checker's blind spots, closed: fixed programs ----------------------------------------

namespace {

FaultPlan fails(FaultOp op, unsigned nth = 1, bool persistent = false) {
    FaultPlan plan;
    plan.op = op;
    plan.nth = nth;
    plan.persistent = persistent;
    plan.code = op == FaultOp::device_malloc || op == FaultOp::pinned_malloc ? devstage::Errc::out_of_memory
                                                                             : devstage::Errc::backend_failure;
    return plan;
}

// One buffer in several args of one run: In and InOut over the same bytes, Out twice over one
// buffer, overlapping ranges; then the state read back by the next run.
template <class B, class S>
void shared_in_one_run(unsigned slots, std::size_t batch_limit) {
    Config config = config_of<B, S>(slots, 2);
    config.batch_limit = batch_limit;
    CHECK_REPORT((scripted<B, S>(config, {64, 1000, 700, 32}, [](Runner<B, S>& r) {
        ArgSpec tail = host_arg(1, 600, Direction::Out);
        tail.offset = 400;
        full_step(r, plain({host_arg(0, 64, Direction::In), host_arg(0, 64, Direction::InOut)}));
        full_step(r, plain({host_arg(1, 1000, Direction::Out), host_arg(1, 1000, Direction::Out),
                            host_arg(3, 32, Direction::In)},
                           1, 1));
        full_step(r, plain({host_arg(1, 1000, Direction::InOut), tail, host_arg(2, 700, Direction::In),
                            host_arg(2, 700, Direction::In)},
                           0, 1));
        full_step(r, plain({host_arg(2, 700, Direction::InOut), host_arg(1, 1000, Direction::In),
                            host_arg(0, 64, Direction::Out)}));
    })));
}

}  // namespace

TEST_CASE("a buffer passed as several args of one run: uploads see it as bound, copy-backs land", "[sequential]") {
    for (std::size_t batches : {std::size_t{0}, std::size_t{3}}) {
        for (unsigned slots : {1u, 2u}) {
            shared_in_one_run<devstage::MockBackend, Bump>(slots, batches);
            shared_in_one_run<devstage::MockBackend, Packed>(slots, batches);
            shared_in_one_run<devstage::MockBackend, Mapped>(slots, batches);
            shared_in_one_run<devstage::MockBackend, PerTensor>(slots, batches);
            shared_in_one_run<devstage::SimBackend, Packed>(slots, batches);
            shared_in_one_run<SlowBackend, Bump>(slots, batches);
            shared_in_one_run<SlowBackend, Mapped>(slots, batches);
        }
    }
}

TEST_CASE("bind_slot runs on the slot chosen, refuses a held one and one out of range", "[sequential]") {
    using S = Packed;
    using B = devstage::MockBackend;
    CHECK_REPORT((scripted<B, S>(config_of<B, S>(2, 1), {64, 64, 200}, [](Runner<B, S>& r) {
        StepSpec on1 = plain({host_arg(0, 64, Direction::InOut)});
        on1.slot = 1;
        const int a = r.begin_step(on1);  // slot 1, live
        REQUIRE(a >= 0);
        StepSpec again = plain({host_arg(1, 64, Direction::In)});
        again.slot = 1;
        CHECK(r.begin_step(again) < 0);  // busy: slot 1 holds a live run
        StepSpec out_of_range = plain({host_arg(1, 64, Direction::In)});
        out_of_range.slot = 2;
        CHECK(r.begin_step(out_of_range) < 0);  // invalid_argument
        r.kernel(a);
        r.finish(a);
        const int f = full_step(r, frame({frame_arg(-1, 0, 64, Direction::In), frame_arg(-1, 1, 200, Direction::Out)}));
        REQUIRE(f >= 0);  // slot 0: slot 1 was bound last
        StepSpec on0 = plain({host_arg(1, 64, Direction::Out)});
        on0.slot = 0;
        CHECK(r.begin_step(on0) < 0);  // busy: the frame's Completion holds slot 0
        r.end(f, End::destroy);
        CHECK(full_step(r, on0) >= 0);
        r.end(a, End::wait);
    })));
}

TEST_CASE("reserve is refused while runs or frames hold slots; after it, runs that fit move no address",
          "[sequential]") {
    for (unsigned slots : {1u, 2u}) {
        using S = Mapped;
        using B = devstage::MockBackend;
        CHECK_REPORT((scripted<B, S>(config_of<B, S>(slots, 1), {64, 1000, 200}, [](Runner<B, S>& r) {
            const int live = r.begin_step(plain({host_arg(0, 64, Direction::InOut)}));
            REQUIRE(live >= 0);
            r.reserve(4096);  // busy: a live run
            r.kernel(live);
            r.finish(live);
            const int f = r.begin_step(frame({frame_arg(-1, 0, 64, Direction::In)}));
            REQUIRE(f >= 0);
            r.reserve(4096);  // busy: an unbound frame
            r.bind_frame(f);
            r.kernel(f);
            r.finish(f);
            r.reserve(4096);  // busy: the frame's Completion holds its slot
            r.end(f, End::detach);
            r.reserve(4096);  // waits for the runs in flight, grows every slot
            full_step(r, plain({host_arg(1, 1000, Direction::InOut), host_arg(2, 200, Direction::Out)}));
            full_step(r, plain({host_arg(0, 64, Direction::In), host_arg(1, 1000, Direction::Out)}));
        })));
    }
}

TEST_CASE("release between steps ends live runs, delivers the runs in flight, and the stager goes on", "[sequential]") {
    for (unsigned streams : {1u, 2u}) {
        using S = Packed;
        using B = devstage::MockBackend;
        CHECK_REPORT((scripted<B, S>(config_of<B, S>(3, streams), {64, 64, 700}, [streams](Runner<B, S>& r) {
            full_step(r, plain({host_arg(0, 64, Direction::InOut), host_arg(2, 700, Direction::Out)}));
            const int live = r.begin_step(plain({host_arg(1, 64, Direction::Out)}, streams - 1, streams - 1));
            REQUIRE(live >= 0);
            r.kernel(live);  // launched, never finished: release() ends it without a copy-back
            r.release();
            full_step(r, plain({host_arg(0, 64, Direction::InOut), host_arg(1, 64, Direction::In)}));
            r.release();
            full_step(r, plain({host_arg(2, 700, Direction::InOut)}, streams - 1, 0));
        })));
    }
}

TEST_CASE("a mapped slot whose map_host failed copies, with the same results", "[sequential][mapped]") {
    const auto program = []<class B>(std::type_identity<B>, unsigned slots) {
        using S = Mapped;
        Report report = scripted<B, S>(config_of<B, S>(slots, 1), {64, 200}, [](Runner<B, S>& r) {
            r.fault_next(fails(FaultOp::map_host));  // the first slot's mirror stays unmapped
            const int f =
                full_step(r, frame({frame_arg(-1, 0, 64, Direction::InOut), frame_arg(-1, 1, 200, Direction::Out)}));
            if (f >= 0) r.end(f, End::wait);
            full_step(r, plain({host_arg(0, 64, Direction::InOut), host_arg(1, 200, Direction::Out)}));
            const int g =
                full_step(r, frame({frame_arg(-1, 0, 64, Direction::In), frame_arg(-1, 1, 64, Direction::InOut)}));
            if (g >= 0) full_step(r, plain({frame_arg(g, 1, 64, Direction::In), host_arg(1, 200, Direction::InOut)}));
        });
        CHECK_REPORT(report);
        CHECK(report.stats.map_failures >= 1);
        CHECK(report.stats.mapped_runs < report.stats.runs);
    };
    for (unsigned slots : {1u, 2u}) {
        program(std::type_identity<devstage::MockBackend>{}, slots);
        program(std::type_identity<devstage::SimBackend>{}, slots);
        program(std::type_identity<SlowBackend>{}, slots);
        program(std::type_identity<StreamlessMock>{}, slots);
    }
}

TEST_CASE("a finish refused at the call ends the run: its memory is the engine's, the stager goes on", "[sequential]") {
    const auto program = []<class B, class S>(std::type_identity<B>, std::type_identity<S>, FaultOp op,
                                              std::size_t batches) {
        Config config = config_of<B, S>(2, 2);
        config.batch_limit = batches;
        Report report = scripted<B, S>(config, {64, 700, 1000, 48}, [op](Runner<B, S>& r) {
            const int a = r.begin_step(plain({host_arg(0, 64, Direction::InOut), host_arg(1, 700, Direction::Out),
                                              host_arg(2, 1000, Direction::InOut)},
                                             0, 1));
            REQUIRE(a >= 0);
            r.kernel(a);
            r.fault_next(fails(op));
            CHECK_FALSE(r.finish(a));  // the run ended
            r.engine_write(0);         // the engine's again
            full_step(r, plain({host_arg(0, 64, Direction::In), host_arg(3, 48, Direction::Out)}));
            full_step(r, plain({host_arg(2, 1000, Direction::InOut), host_arg(1, 700, Direction::In)}, 1, 0));
        });
        CHECK_REPORT(report);
    };
    for (FaultOp op : {FaultOp::copy_from_device_async, FaultOp::copy_from_device_batch, FaultOp::record_event,
                       FaultOp::stream_wait_event}) {
        for (std::size_t batches : {std::size_t{0}, std::size_t{2}}) {
            // The direct copy-backs go one by one without batches, in batches of 2 with them.
            if ((op == FaultOp::copy_from_device_async && batches > 0) ||
                (op == FaultOp::copy_from_device_batch && batches == 0)) {
                continue;
            }
            program(std::type_identity<devstage::MockBackend>{}, std::type_identity<Bump>{}, op, batches);
            program(std::type_identity<devstage::MockBackend>{}, std::type_identity<Packed>{}, op, batches);
            program(std::type_identity<devstage::MockBackend>{}, std::type_identity<Mapped>{}, op, batches);
            program(std::type_identity<devstage::MockBackend>{}, std::type_identity<PerTensor>{}, op, batches);
            program(std::type_identity<devstage::SimBackend>{}, std::type_identity<Packed>{}, op, batches);
        }
    }
}

// Every call of a decode-loop-like program (frames, plain runs sharing buffers, bind_slot,
// waits, polls, destroys, reserve, release) under one plan: each operation failing at its
// first, second or every call. The program must come out exactly as its sequential run, with
// every failure clean.
namespace {

template <class B, class S>
void sweep_program(Runner<B, S>& r, unsigned streams) {
    const unsigned last = streams - 1;
    int f = -1;
    if constexpr (Runner<B, S>::packs) {
        f = full_step(r, frame({frame_arg(-1, 0, 64, Direction::In), frame_arg(-1, 1, 200, Direction::Out),
                                frame_arg(-1, 2, 700, Direction::InOut)},
                               last));
    }
    const int a = full_step(
        r, plain({host_arg(0, 64, Direction::InOut), host_arg(1, 700, Direction::Out), host_arg(0, 64, Direction::In)},
                 0, last));
    if (f >= 0) full_step(r, plain({frame_arg(f, 1, 200, Direction::In), host_arg(2, 1000, Direction::Out)}));
    if (a >= 0) r.end(a, End::poll);
    StepSpec chosen = plain({host_arg(2, 1000, Direction::InOut), host_arg(3, 48, Direction::In)}, last, 0);
    chosen.slot = 1;
    const int b = full_step(r, chosen);
    if (a >= 0) r.end(a, End::wait);
    if (f >= 0) r.end(f, End::destroy);
    if (b >= 0) r.end(b, End::wait);
    if constexpr (Runner<B, S>::retained) {
        r.reserve(3000);
    }
    const int c = full_step(r, plain({host_arg(1, 700, Direction::InOut), host_arg(3, 48, Direction::Out)}));
    if (c >= 0) r.end(c, End::destroy);
    r.release();
    full_step(r, plain({host_arg(0, 64, Direction::InOut), host_arg(1, 700, Direction::In)}, last, last));
}

template <class B, class S>
void sweep(FaultOp op, std::size_t batches) {
    for (unsigned nth : {1u, 2u}) {
        for (bool persistent : {false, true}) {
            Config config = config_of<B, S>(2, 2);
            config.batch_limit = batches;
            const Report report = scripted<B, S>(config, {64, 700, 1000, 48}, [&](Runner<B, S>& r) {
                r.fault_every_call(fails(op, nth, persistent));
                sweep_program(r, 2);
            });
            CAPTURE(fault_op_name(op), nth, persistent, batches);
            CHECK_REPORT(report);
        }
    }
}

template <class B, class S>
void sweep_every_operation(std::size_t batches) {
    for (std::size_t op = 0; op < fault_op_count; ++op) {
        const auto fault = static_cast<FaultOp>(op);
        if (!has_fault_op<Faulty<B>>(fault)) continue;
        // Without synchronize() a failed wait leaves work pending (checked by failed waits).
        const bool waits = fault == FaultOp::record_event || fault == FaultOp::synchronize_event ||
                           fault == FaultOp::stream_wait_event;
        if (waits && !devstage::SynchronizingBackend<B>) continue;
        sweep<B, S>(fault, batches);
    }
}

}  // namespace

TEST_CASE("a fault at any operation of any stager call: clean failures, exact results", "[sequential][sweep]") {
    for (std::size_t batches : {std::size_t{0}, std::size_t{3}}) {
        sweep_every_operation<devstage::MockBackend, Bump>(batches);
        sweep_every_operation<devstage::MockBackend, Packed>(batches);
        sweep_every_operation<devstage::MockBackend, Mapped>(batches);
        sweep_every_operation<devstage::MockBackend, PerTensor>(batches);
        sweep_every_operation<SlowBackend, Mapped>(batches);
    }
    sweep_every_operation<devstage::SimBackend, Packed>(2);
    sweep_every_operation<StreamlessMock, Mapped>(0);
    sweep_every_operation<StreamlessMock, PerTensor>(0);
}

// ---- failures of the contract found by the random programs, as fixed programs --------------------

TEST_CASE("a finish that fails at the call and cannot wait never delivers over the engine's memory", "[sequential]") {
    // finish: record_event fails, and so does every wait; finish returns the record's failure
    // (the wait's goes to the error sink). The engine owns b0 again and writes it; the packed
    // output must not be unpacked over it later (release() settles the slot).
    for (const bool mapped : {false, true}) {
        const auto program = [&]<class S>(std::type_identity<S>) {
            using B = devstage::MockBackend;
            Config config = config_of<B, S>(1, 1);
            CHECK_REPORT((scripted<B, S>(config, {64}, [](Runner<B, S>& r) {
                const int a = r.begin_step(plain({host_arg(0, 64, Direction::Out)}));
                REQUIRE(a >= 0);
                r.kernel(a);
                FaultPlan plan = fails(FaultOp::record_event, 1, true);
                plan.stuck = true;
                r.fault_next(plan);
                r.finish(a);
                r.engine_write(0);
            })));
        };
        if (mapped) {
            program(std::type_identity<Mapped>{});
        } else {
            program(std::type_identity<Packed>{});
        }
    }
}

TEST_CASE("reserve() reports a failed unmap or free of the mirror it replaces", "[sequential]") {
    for (FaultOp op : {FaultOp::unmap_host, FaultOp::pinned_free}) {
        using B = devstage::MockBackend;
        using S = Mapped;
        Config config = config_of<B, S>(1, 1);
        CHECK_REPORT((scripted<B, S>(config, {64}, [op](Runner<B, S>& r) {
            const int a = full_step(r, plain({host_arg(0, 64, Direction::InOut)}));
            if (a >= 0) r.end(a, End::destroy);
            r.fault_next(fails(op));
            r.reserve(6000);  // a new mirror; the old one's unmap (or free) fails
        })));
    }
}

TEST_CASE("release() is refused while a frame is unbound or held", "[sequential]") {
    using B = devstage::MockBackend;
    using S = Packed;
    Config config = config_of<B, S>(2, 1);
    CHECK_REPORT((scripted<B, S>(config, {64}, [](Runner<B, S>& r) {
        const int held = full_step(r, frame({frame_arg(-1, 0, 64, Direction::InOut)}));
        REQUIRE(held >= 0);
        r.release();  // busy: the frame's Completion holds it
        const int unbound = r.begin_step(frame({frame_arg(-1, 0, 64, Direction::In)}));
        if (unbound < 0) return;
        r.end(held, End::destroy);
        r.release();  // busy: an unbound frame
        r.bind_frame(unbound);
        r.kernel(unbound);
        r.finish(unbound);
        r.end(unbound, End::wait);
        r.end(unbound, End::destroy);
        r.release();
    })));
}

TEST_CASE("a failed free of a misaligned mirror asked again with the slack is returned", "[sequential][faults]") {
    using B = devstage::MockBackend;
    using S = Packed;
    Config config = config_of<B, S>(1, 1);
    config.mock_offset = 64;  // pinned memory 64 past a page: misaligned for the 256-byte slices
    CHECK_REPORT((scripted<B, S>(config, {64}, [](Runner<B, S>& r) {
        r.fault_next(fails(FaultOp::pinned_free));
        full_step(r, plain({host_arg(0, 64, Direction::InOut)}));
    })));
}

TEST_CASE("a live run's kernel stream is waited for after ordering after it failed", "[sequential][faults]") {
    // SlowBackend has no synchronize(): release() cannot order after the run's kernel stream
    // (record_event fails, once or every time), and the stager must not free the slot's memory
    // under that kernel: the settle that frees it waits for the stream on the host first, or
    // keeps the memory while that wait fails too.
    using B = SlowBackend;
    using S = Bump;
    for (const bool persistent : {false, true}) {
        CAPTURE(persistent);
        const Config config = config_of<B, S>(1, 2);
        CHECK_REPORT((scripted<B, S>(config, {64, 64}, [&](Runner<B, S>& r) {
            const int first = full_step(r, plain({host_arg(1, 64, Direction::In)}));
            if (first >= 0) r.end(first, End::wait);
            StepSpec spec = plain({host_arg(0, 64, Direction::InOut)}, 1, 0);
            spec.kernel_on_finish = true;  // an odd step: order_after_uploads onto stream 0
            const int live = r.begin_step(spec);
            REQUIRE(live == 1);
            r.kernel(live);
            r.fault_next(fails(FaultOp::record_event, 1, persistent));
            r.release();
        })));
    }
}

// ---- the checker's own parts -----------------------------------------------------------------------

TEST_CASE("Faulty fails the operation a plan names, at its n-th call, and keeps the books", "[sequential]") {
    Faulty<devstage::MockBackend> mock(devstage::MockConfig{.deferred_async = true, .batch_copy_limit = 4});
    Result<void*> a = mock.device_malloc(64);
    REQUIRE(a);
    CHECK(mock.live_device() == 1);
    mock.arm(fails(FaultOp::device_malloc, 2));
    const Result<void*> first = mock.device_malloc(8);
    const Result<void*> refused = mock.device_malloc(8);
    const Result<void*> third = mock.device_malloc(8);  // not persistent: the third call succeeds
    REQUIRE((first && third));
    CHECK(refused.status().code() == devstage::Errc::out_of_memory);
    CHECK(refused.status().message().find("injected") != std::string::npos);
    CHECK(mock.fired() == 1);
    CHECK(mock.live_device() == 3);
    // A free that fails leaves the memory with the backend; give_back() returns it.
    mock.arm(fails(FaultOp::device_free, 1, true));
    CHECK_FALSE(mock.device_free(*a));
    CHECK(mock.fired_gives_back() == 1);
    mock.disarm();
    CHECK(mock.orphans() == 1);
    CHECK(mock.live_device() == 3);
    CHECK(mock.give_back().ok());
    CHECK(mock.orphans() == 0);
    CHECK(mock.live_device() == 2);
    // Stuck: every wait fails and the work stays pending.
    Result<devstage::MockBackend::Stream> stream = mock.create_stream();
    Result<devstage::MockBackend::Event> event = mock.create_event();
    REQUIRE((stream && event));
    std::byte host[8]{};
    Result<void*> device = mock.device_malloc(8);
    REQUIRE(device);
    CHECK(mock.copy_to_device_async(*device, host, 8, *stream).ok());
    CHECK(mock.record_event(*event, *stream).ok());
    FaultPlan stuck;
    stuck.stuck = true;
    mock.arm(stuck);
    CHECK_FALSE(mock.synchronize_event(*event));
    CHECK_FALSE(mock.synchronize());
    CHECK(mock.pending_operations() > 0);
    mock.disarm();
    CHECK(mock.synchronize_event(*event).ok());
    CHECK(mock.pending_operations() == 0);
    // A batch that fails enqueues its first half.
    std::byte out[4][8]{};
    void* dsts[4] = {out[0], out[1], out[2], out[3]};
    const void* srcs[4] = {*device, *device, *device, *device};
    const std::size_t sizes[4] = {8, 8, 8, 8};
    mock.arm(fails(FaultOp::copy_from_device_batch));
    const devstage::Status batch = mock.copy_from_device_batch(dsts, srcs, sizes, 4, *stream);
    mock.disarm();
    CHECK(batch.message().find("copies 0 to 2 of 4") != std::string::npos);
    CHECK(mock.pending_operations() == 2);
    CHECK(mock.synchronize().ok());
    CHECK(mock.destroy_event(*event).ok());
    CHECK(mock.destroy_stream(*stream).ok());
    for (void* p : {*device, *first, *third}) CHECK(mock.device_free(p).ok());
    CHECK(mock.live_device() == 0);
    CHECK(mock.live_events() == 0);
    CHECK(mock.live_streams() == 0);
    CHECK(mock.total_fired(FaultOp::copy_from_device_batch) == 1);
}
