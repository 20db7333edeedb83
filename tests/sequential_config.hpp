// SPDX-License-Identifier: Apache-2.0
#pragma once
// The random-program checker's configuration: where a program's choices come from (Choices),
// which backend, strategy, slots, streams and program features it runs with (Config, cycled
// through by config_for), what it found (Report, with the figures of what ran), and the
// behaviours the checker expects only once the library provides them (Expect).

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "devstage/output_policy.hpp"
#include "devstage/stats.hpp"
#include "sequential_faults.hpp"

namespace sequential {

// ---- sizes ---------------------------------------------------------------------------------

inline constexpr std::size_t alignment = 256;       // of every strategy's slices
inline constexpr std::size_t pack_limit = 512;      // PackSmall's limit
inline constexpr std::size_t ring_chunk = 512;      // the pageable ring's chunk
inline constexpr std::size_t ring_threshold = 700;  // args this large (and pageable) use the ring
inline constexpr std::size_t sizes[] = {1,   7,   64,  200,  pack_limit - 1,     pack_limit, pack_limit + 1,
                                        699, 700, 701, 1000, 2 * ring_chunk + 3, 1800};
/// What reserve() is asked for.
inline constexpr std::size_t reserve_sizes[] = {0, 300, 2048, 6000};
/// The batch limits of the backends that batch (0: no batches).
inline constexpr std::size_t batch_limits[] = {0, 2, 3, 64};

// ---- the choices of a program ----------------------------------------------------------------

/// Where a program's choices come from: a seeded generator, or a fuzzer's bytes (exhausted:
/// every later choice is 0, and exhausted() says so).
class Choices {
public:
    explicit Choices(std::uint64_t seed) noexcept : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
    Choices(const std::uint8_t* data, std::size_t size) noexcept : bytes_(data), size_(size), from_bytes_(true) {}

    /// Uniform in [0, n) (0 when n is 0).
    std::uint32_t below(std::uint32_t n) noexcept {
        if (n <= 1) return 0;
        if (from_bytes_) {
            std::uint32_t value = take();
            if (n > 256) value = value << 8 | take();
            return value % n;
        }
        return static_cast<std::uint32_t>(next() % n);
    }
    bool chance(std::uint32_t numerator, std::uint32_t denominator) noexcept { return below(denominator) < numerator; }
    bool exhausted() const noexcept { return from_bytes_ && position_ >= size_; }

private:
    std::uint32_t take() noexcept { return position_ < size_ ? bytes_[position_++] : (++position_, 0u); }
    std::uint64_t next() noexcept {
        std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

    std::uint64_t state_ = 0;
    const std::uint8_t* bytes_ = nullptr;
    std::size_t size_ = 0;
    std::size_t position_ = 0;
    bool from_bytes_ = false;
};

// ---- what the checker expects once the library provides it ----------------------------------

/// Behaviours the contract asks for that the library does not give yet. Each is off by default:
/// the random engine then leaves out the programs that need it (so the suite stays green).
/// DEVSTAGE_SEQ_EXPECT (a comma separated list of the names below, or "all") turns them on.
enum Expect : unsigned {
    /// On a backend without synchronize(), a record_event or stream_wait_event that fails in
    /// finish, a dropped run or release() leaves every later call exact, and no host wait beyond
    /// those the checker's rules allow. Off: no such fault in those calls on such a backend.
    /// (On, 20,000 programs from DEVSTAGE_SEQ_FIRST=100000 find a host buffer that differs at
    /// the end, seed 113888, and a bind and a frame() that wait on the host, seeds 116216 and
    /// 109136. A run's kernel streams are kept and waited for: that program is in the suite.)
    expect_failed_joins_without_synchronize = 1u << 0,
};
inline constexpr unsigned expect_all = (1u << 1) - 1;

inline const char* expect_name(unsigned bit) noexcept {
    switch (bit) {
        case expect_failed_joins_without_synchronize:
            return "failed_joins_without_synchronize";
        default:
            return "?";
    }
}

/// The expectations named in `text` ("all", or names separated by commas); unknown names are
/// ignored.
inline unsigned parse_expectations(std::string_view text) noexcept {
    if (text == "all") return expect_all;
    unsigned bits = 0;
    while (!text.empty()) {
        const std::size_t comma = text.find(',');
        const std::string_view name = text.substr(0, comma);
        for (unsigned bit = 1; bit <= expect_all; bit <<= 1) {
            if (name == expect_name(bit)) bits |= bit;
        }
        if (comma == std::string_view::npos) break;
        text.remove_prefix(comma + 1);
    }
    return bits;
}

/// DEVSTAGE_SEQ_EXPECT's expectations (none when unset).
inline unsigned expectations_from_env() noexcept {
    const char* value = std::getenv("DEVSTAGE_SEQ_EXPECT");
    return value == nullptr ? 0u : parse_expectations(value);
}

// ---- configuration ---------------------------------------------------------------------------

/// mock: the deferred mock (work runs when the host waits, in an adversarial order); sim: the
/// simulator (a thread per stream); slow: SlowBackend, no synchronize(); mock_no_memset: the
/// deferred mock without memsets; eager_mock: the mock running work at the call; streamless:
/// the mock without streams (the Stager sees it through SynchronousAdapter).
enum class BackendKind : std::uint8_t { mock, sim, slow, mock_no_memset, eager_mock, streamless };
inline constexpr unsigned backend_kinds = 6;

enum class StrategyKind : std::uint8_t { bump, packed, per_tensor, mapped };

/// Waits that fail, injected by the engine: none; `recover`, a failed wait for an event that the
/// backend's synchronize() recovers from; `stuck`, a failed wait with the work left pending —
/// synchronize() fails too, or the backend has none.
enum class WaitFaults : std::uint8_t { none, recover, stuck };

struct Config {
    BackendKind backend = BackendKind::mock;
    StrategyKind strategy = StrategyKind::bump;
    unsigned slots = 2;
    unsigned streams = 1;
    bool ring = false;
    /// Runs in flight never share host memory: then no call may wait on the host or refuse.
    bool disjoint = false;
    bool frames = true;           // a packing strategy also takes frames
    std::size_t mock_offset = 0;  // MockConfig::offset (64: pointers aligned to exactly 64)
    std::uint32_t not_ready_polls = 2;
    unsigned ring_threads = 0;
    unsigned max_steps = 14;
    unsigned max_actions = 160;
    /// Frames may hold device-resident tensors (TensorShape::device) of the device buffers.
    bool device_frames = false;
    /// Some kernels leave Out and InOut bytes unwritten (zeros under OutputPolicy::zero,
    /// unchecked under kernel_writes_all).
    bool partial_kernels = false;
    /// The output policy at the start; with `switch_policy` the engine switches it between steps.
    devstage::OutputPolicy policy = devstage::OutputPolicy::zero;
    bool switch_policy = false;
    /// Failed waits the engine injects.
    WaitFaults wait_faults = WaitFaults::none;
    /// The backend's batch_copy_limit (0: no batches).
    std::size_t batch_limit = 0;
    /// Backend operations fail at random during the stager's calls (FaultPlan).
    bool call_faults = false;
    /// Steps may bind on the slot the engine chooses (bind_slot), out of range too.
    bool bind_slots = false;
    /// The engine calls reserve() (retained strategies) and release() between steps.
    bool reserve_release = false;
    /// One run may pass a host buffer as several args (overlapping ranges, any directions).
    bool aliasing = false;
    /// Some plain steps are synchronous: bind(args), the kernel waited for, finish(run).
    bool sync_steps = false;
    /// Expect bits (see Expect).
    unsigned expect = 0;

    bool packs() const noexcept { return strategy == StrategyKind::packed || strategy == StrategyKind::mapped; }

    std::string describe() const {
        static const char* const backends[] = {"deferred mock",     "sim (threads)",
                                               "slow user backend", "deferred mock without memset",
                                               "eager mock",        "mock without streams"};
        static const char* const strategies[] = {"RetainedBump<Exact, 256, NoPacking>",
                                                 "RetainedBump<Geometric, 256, PackSmall<512>>", "PerTensorMalloc<256>",
                                                 "RetainedBump<Geometric, 256, MapSmall<512>>"};
        std::ostringstream out;
        out << backends[static_cast<int>(backend)] << ", " << strategies[static_cast<int>(strategy)] << ", " << slots
            << " slot(s), " << streams << " stream(s), ring " << (ring ? "on" : "off")
            << (disjoint ? ", runs share no host memory" : ", shared host memory");
        if (backend == BackendKind::mock) out << ", mock offset " << mock_offset << ", polls " << not_ready_polls;
        if (ring) out << ", ring threads " << ring_threads;
        if (packs()) out << (frames ? ", frames" : ", no frames");
        if (packs() && frames && device_frames) out << " with device tensors";
        out << (policy == devstage::OutputPolicy::zero ? ", Out zeroed" : ", kernel_writes_all")
            << (switch_policy ? " (switched)" : "") << (partial_kernels ? ", partial kernels" : "");
        if (wait_faults != WaitFaults::none) {
            out << (wait_faults == WaitFaults::recover ? ", failed waits recovered by synchronize()"
                                                       : ", failed waits left pending");
        }
        if (batch_limit > 0) out << ", batches of up to " << batch_limit;
        if (call_faults) out << ", faults at calls";
        if (bind_slots) out << ", bind_slot";
        if (reserve_release) out << ", reserve and release";
        if (aliasing) out << ", args sharing a buffer";
        if (sync_steps) out << ", synchronous steps";
        for (unsigned bit = 1; bit <= expect_all; bit <<= 1) {
            if ((expect & bit) != 0) out << ", expects " << expect_name(bit);
        }
        out << ", up to " << max_steps << " steps";
        return out.str();
    }
};

/// The number of distinct configurations config_for() cycles through.
inline constexpr std::uint64_t config_count = backend_kinds * 4 * 3 * 3 * 2 * 2;

/// Configuration `index` (mod config_count) of every combination, with the small knobs from
/// `choices`.
inline Config config_for(std::uint64_t index, Choices& choices, unsigned expect = 0) {
    Config config;
    std::uint64_t i = index % config_count;
    const auto digit = [&i](std::uint64_t base) {
        const auto d = static_cast<unsigned>(i % base);
        i /= base;
        return d;
    };
    config.backend = static_cast<BackendKind>(digit(backend_kinds));
    config.strategy = static_cast<StrategyKind>(digit(4));
    config.slots = 1 + digit(3);
    config.streams = 1 + digit(3);
    config.ring = digit(2) == 1;
    config.disjoint = digit(2) == 1;
    config.mock_offset = choices.chance(1, 4) ? 64 : 0;
    config.not_ready_polls = choices.below(4);
    config.ring_threads = choices.below(2);
    config.frames = choices.chance(1, 2);
    config.device_frames = choices.chance(1, 2);
    config.partial_kernels = choices.chance(1, 2);
    config.policy = choices.chance(1, 4) ? devstage::OutputPolicy::kernel_writes_all : devstage::OutputPolicy::zero;
    config.switch_policy = choices.chance(1, 3);
    const bool streams = config.backend != BackendKind::streamless;
    const bool synchronizes = config.backend != BackendKind::slow;  // every other backend has synchronize()
    if (choices.chance(1, 3) && streams) {
        config.wait_faults = synchronizes && choices.chance(1, 2) ? WaitFaults::recover : WaitFaults::stuck;
    }
    const std::uint32_t batch = choices.below(static_cast<std::uint32_t>(std::size(batch_limits)));
    if (streams && config.backend != BackendKind::mock_no_memset) config.batch_limit = batch_limits[batch];
    config.call_faults = choices.chance(1, 2);
    config.bind_slots = choices.chance(1, 2);
    config.reserve_release = choices.chance(1, 2);
    config.aliasing = choices.chance(1, 2) && !config.disjoint;
    config.sync_steps = choices.chance(1, 3);
    config.expect = expect;
    return config;
}

// ---- what a program found ----------------------------------------------------------------------

/// What a program ran, for the figures of a long run.
struct Tally {
    std::uint64_t programs = 0;
    std::uint64_t binds = 0;                                // runs bound (StagerStats::runs)
    std::uint64_t frames = 0;                               // frames handed out
    std::uint64_t bind_slots = 0;                           // binds on a chosen slot that succeeded
    std::uint64_t aliased_runs = 0;                         // runs with a host buffer in two args
    std::uint64_t sync_steps = 0;                           // synchronous binds that succeeded
    std::uint64_t reserves = 0;                             // reserve() calls
    std::uint64_t releases = 0;                             // release() calls between steps
    std::uint64_t faults = 0;                               // injected failures (call faults and failed waits)
    std::uint64_t failed_calls = 0;                         // stager calls that returned an injected failure
    std::uint64_t mapped_runs = 0;                          // StagerStats::mapped_runs
    std::uint64_t map_failures = 0;                         // StagerStats::map_failures
    std::uint64_t batched_copies = 0;                       // StagerStats::batched_copies
    std::array<std::uint64_t, fault_op_count> fault_ops{};  // injected failures per operation

    void add(const Tally& other) noexcept {
        for (std::size_t op = 0; op < fault_op_count; ++op) fault_ops[op] += other.fault_ops[op];
        programs += other.programs;
        binds += other.binds;
        frames += other.frames;
        bind_slots += other.bind_slots;
        aliased_runs += other.aliased_runs;
        sync_steps += other.sync_steps;
        reserves += other.reserves;
        releases += other.releases;
        faults += other.faults;
        failed_calls += other.failed_calls;
        mapped_runs += other.mapped_runs;
        map_failures += other.map_failures;
        batched_copies += other.batched_copies;
    }
    std::string text() const {
        std::ostringstream out;
        out << programs << " programs, " << binds << " binds (" << frames << " frames, " << bind_slots
            << " on a chosen slot, " << sync_steps << " synchronous, " << aliased_runs
            << " with a buffer in two args), " << reserves << " reserves, " << releases << " releases, " << faults
            << " injected faults (" << failed_calls << " calls failed), " << mapped_runs << " mapped runs, "
            << map_failures << " map failures, " << batched_copies << " batched copies; faults by operation:";
        for (std::size_t op = 0; op < fault_op_count; ++op) {
            if (fault_ops[op] > 0) out << " " << fault_op_name(static_cast<FaultOp>(op)) << " " << fault_ops[op];
        }
        return out.str();
    }
    /// The figures as one line of numbers, and back (a child process reports them).
    std::string numbers() const {
        std::ostringstream out;
        out << programs << ' ' << binds << ' ' << frames << ' ' << bind_slots << ' ' << aliased_runs << ' '
            << sync_steps << ' ' << reserves << ' ' << releases << ' ' << faults << ' ' << failed_calls << ' '
            << mapped_runs << ' ' << map_failures << ' ' << batched_copies;
        for (std::uint64_t n : fault_ops) out << ' ' << n;
        return out.str();
    }
    void read_numbers(const std::string& line) {
        std::istringstream in(line);
        in >> programs >> binds >> frames >> bind_slots >> aliased_runs >> sync_steps >> reserves >> releases >>
            faults >> failed_calls >> mapped_runs >> map_failures >> batched_copies;
        for (std::uint64_t& n : fault_ops) in >> n;
    }
};

/// What a program run found.
struct Report {
    Config config;
    std::string trace;
    std::vector<std::string> failures;
    /// The stager's counters at the end: which way the runs went (StagerStats::mapped_runs, ...).
    devstage::StagerStats stats;
    Tally tally;

    bool ok() const noexcept { return failures.empty(); }
    std::string text() const {
        std::ostringstream out;
        out << "configuration: " << config.describe() << "\n";
        for (std::size_t i = 0; i < failures.size() && i < 8; ++i) out << "FAILURE: " << failures[i] << "\n";
        if (failures.size() > 8) out << "(" << failures.size() - 8 << " more failures)\n";
        out << "program:\n" << trace;
        return out.str();
    }
};

}  // namespace sequential
