// SPDX-License-Identifier: Apache-2.0
// Sequential equivalence: random engine programs, compared byte for byte with their synchronous run.
//
// Reproduce one program: DEVSTAGE_SEQ_SEED=<seed> build/tests/test_sequential "[repro]"
// (prints its configuration and trace). DEVSTAGE_SEQ_PROGRAMS=<n> changes how many programs
// the random case runs (DEVSTAGE_SEQ_FIRST=<seed> where they start).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
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
    const std::uint64_t programs = from_env("DEVSTAGE_SEQ_PROGRAMS", tsan ? config_count / 4 : 2 * config_count);
    std::uint64_t failed = 0;
    std::ostringstream shown;
    std::map<std::string, std::pair<std::uint64_t, std::string>> by_failure;  // programs, and the first seeds
    for (std::uint64_t seed = first; seed < first + programs; ++seed) {
        const Report report = run_seed_isolated(seed);
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
    INFO(summary.str() << shown.str());
    CHECK(failed == 0);
}

TEST_CASE("one program, by seed", "[.repro][repro]") {
    const std::uint64_t seed = from_env("DEVSTAGE_SEQ_SEED", 1);
    const Report report = run_seed(seed);
    WARN("seed " << seed << "\n" << report.text());
    CHECK(report.ok());
}

// ---- fixed programs for the defects of issue 20 -------------------------------------------------

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

TEST_CASE("issue 20: an InOut state incremented by two pipelined runs ends at +2", "[sequential][regression]") {
    for (unsigned slots : {1u, 2u, 3u}) {
        inout_twice<devstage::MockBackend, Packed>(slots);
        inout_twice<devstage::SimBackend, Packed>(slots);
        inout_twice<SlowBackend, Packed>(slots);
        inout_twice<devstage::MockBackend, Bump>(slots);
        inout_twice<SlowBackend, PerTensor>(slots);
    }
}

TEST_CASE("issue 20: two runs writing one Out buffer, the later Completion waited first", "[sequential][regression]") {
    for (unsigned streams : {1u, 2u}) {
        same_out_later_waited_first<devstage::MockBackend, Packed>(2, streams);
        same_out_later_waited_first<devstage::MockBackend, Bump>(2, streams);
        same_out_later_waited_first<devstage::MockBackend, PerTensor>(2, streams);
        same_out_later_waited_first<devstage::SimBackend, Packed>(2, streams);
        same_out_later_waited_first<SlowBackend, Packed>(2, streams);
        same_out_later_waited_first<SlowBackend, Bump>(2, streams);
    }
}

TEST_CASE("issue 20: runs sharing host buffers over 2 slots and 2 streams keep call order",
          "[sequential][regression]") {
    shared_across_streams<devstage::MockBackend, Bump>();
    shared_across_streams<devstage::MockBackend, PerTensor>();
    shared_across_streams<devstage::MockBackend, Packed>();
    shared_across_streams<SlowBackend, Bump>();
    shared_across_streams<SlowBackend, PerTensor>();
    shared_across_streams<devstage::SimBackend, Bump>();
}

TEST_CASE("issue 20: a frame's slot is not taken while its Completion lives", "[sequential][regression]") {
    for (unsigned slots : {1u, 2u, 3u}) {
        frame_slot_held<devstage::MockBackend>(slots);
        frame_slot_held<SlowBackend>(slots);
        frame_slot_held<devstage::SimBackend>(slots);
    }
}

TEST_CASE("issue 20: a frame's output fed back as an input into a growing bind", "[sequential][regression]") {
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
        sum.map_failures += report.stats.map_failures;
        sum.packed_args += report.stats.packed_args;
    }
    REQUIRE(seen.size() == 5);
    for (const auto& [backend, sum] : seen) {
        CAPTURE(static_cast<int>(backend), sum.runs, sum.mapped_runs, sum.host_maps);
        CHECK(sum.mapped_runs > sum.runs / 4);
        CHECK(sum.host_maps > 0);
        CHECK(sum.map_failures == 0);
        CHECK(sum.packed_args > 0);
    }
}
