// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sequential equivalence, checked from outside: a random engine program (binds, frames,
// kernels, finishes, waits, polls, destroys and detaches) is run against a Stager on a
// stream-ordered backend, and every host buffer is compared byte for byte with a pure host
// model of the same program run one call at a time, synchronously, in call order.
//
// The engine here is a well-behaved one: it orders its own kernels on its own streams (a kernel
// runs on the bind stream, or on the finish stream after waiting for the bind stream; kernels
// that share caller-owned device memory wait for each other across streams), it reads or
// writes a host buffer with its own code only when no run in flight writes it (reads) or uses
// it (writes), it hands a frame back (destroys or detaches its Completion) only when no run in
// flight uses the frame's memory, and it never reads a frame's memory after handing it back.
// Everything else is the stager's job. A refusal (busy) is allowed only where the contract
// allows one — every slot held by a live run or a frame, or host memory a live run will still
// copy back — and the refused step is then skipped by the model too. Every other error is a
// failure. Calls with no host conflict must not wait on the host (StagerStats::host_waits).
//
// The program's choices come from a Choices source: a seeded generator (the unit suite) or the
// fuzzer's bytes. On failure the report holds the configuration and a readable trace.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/pageable.hpp"
#include "devstage/stager.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "sequential_backend.hpp"

#include <csignal>

#include <sys/wait.h>
#include <unistd.h>

namespace sequential {

using devstage::Completion;
using devstage::Direction;
using devstage::Errc;
using devstage::HostFrame;
using devstage::HostMemory;
using devstage::OutputPolicy;
using devstage::Placement;
using devstage::Result;
using devstage::StagedRun;
using devstage::Status;
using devstage::TensorArg;
using devstage::TensorShape;

// ---- sizes ---------------------------------------------------------------------------------

inline constexpr std::size_t alignment = 256;       // of every strategy's slices
inline constexpr std::size_t pack_limit = 512;      // PackSmall's limit
inline constexpr std::size_t ring_chunk = 512;      // the pageable ring's chunk
inline constexpr std::size_t ring_threshold = 700;  // args this large (and pageable) use the ring
inline constexpr std::size_t sizes[] = {1,   7,   64,  200,  pack_limit - 1,     pack_limit, pack_limit + 1,
                                        699, 700, 701, 1000, 2 * ring_chunk + 3, 1800};

using Bump = devstage::RetainedBump<devstage::ExactGrowth, alignment, devstage::NoPacking>;
using Packed = devstage::RetainedBump<devstage::GeometricGrowth<3, 2>, alignment, devstage::PackSmall<pack_limit>>;
/// PackSmall's layout in a mirror mapped for the device: on every backend here (they all map)
/// the kernels read and write the small args and frames in place.
using Mapped = devstage::RetainedBump<devstage::GeometricGrowth<3, 2>, alignment, devstage::MapSmall<pack_limit>>;
using PerTensor = devstage::PerTensorMalloc<alignment>;

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

// ---- configuration ---------------------------------------------------------------------------

enum class BackendKind : std::uint8_t { mock, sim, slow, mock_no_memset, eager_mock };

/// The deferred mock without device_memset_async (nor device_memset): the stager zeroes Out
/// args by uploading zeros from its static block, which the mock's host-hazard checks see.
class NoMemsetMock : public devstage::MockBackend {
public:
    using MockBackend::MockBackend;
    std::string_view name() const noexcept { return "mock without memset"; }
    devstage::Status device_memset_async(void*, int, std::size_t, Stream) noexcept = delete;
    devstage::Status device_memset(void*, int, std::size_t) noexcept = delete;
};
static_assert(devstage::AsyncBackend<NoMemsetMock> && devstage::PinnedHostBackend<NoMemsetMock>);
static_assert(!devstage::AsyncMemsetBackend<NoMemsetMock> && !devstage::MemsetBackend<NoMemsetMock>);
enum class StrategyKind : std::uint8_t { bump, packed, per_tensor, mapped };

/// Waits that fail, injected by the engine: none; `recover`, a failed wait for an event that the
/// backend's synchronize() recovers from (the mock); `stuck`, a failed wait with the work left
/// pending — the mock's synchronize() fails too, the slow backend has none.
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
    OutputPolicy policy = OutputPolicy::zero;
    bool switch_policy = false;
    /// Failed waits the engine injects (the mock and the slow backend only).
    WaitFaults wait_faults = WaitFaults::none;

    std::string describe() const {
        static const char* const backends[] = {"deferred mock", "sim (threads)", "slow user backend",
                                               "deferred mock without memset", "eager mock"};
        static const char* const strategies[] = {"RetainedBump<Exact, 256, NoPacking>",
                                                 "RetainedBump<Geometric, 256, PackSmall<512>>", "PerTensorMalloc<256>",
                                                 "RetainedBump<Geometric, 256, MapSmall<512>>"};
        std::ostringstream out;
        out << backends[static_cast<int>(backend)] << ", " << strategies[static_cast<int>(strategy)] << ", " << slots
            << " slot(s), " << streams << " stream(s), ring " << (ring ? "on" : "off")
            << (disjoint ? ", runs share no host memory" : ", shared host memory");
        if (backend == BackendKind::mock) out << ", mock offset " << mock_offset << ", polls " << not_ready_polls;
        if (ring) out << ", ring threads " << ring_threads;
        const bool packs = strategy == StrategyKind::packed || strategy == StrategyKind::mapped;
        if (packs) out << (frames ? ", frames" : ", no frames");
        if (packs && frames && device_frames) out << " with device tensors";
        out << (policy == OutputPolicy::zero ? ", Out zeroed" : ", kernel_writes_all")
            << (switch_policy ? " (switched)" : "") << (partial_kernels ? ", partial kernels" : "");
        if (wait_faults != WaitFaults::none) {
            out << (wait_faults == WaitFaults::recover ? ", failed waits recovered by synchronize()"
                                                       : ", failed waits left pending");
        }
        out << ", up to " << max_steps << " steps";
        return out.str();
    }
};

/// The number of distinct configurations config_for() cycles through.
inline constexpr std::uint64_t config_count = 5 * 4 * 3 * 3 * 2 * 2;

/// Configuration `index` (mod config_count) of every combination, with the small knobs from
/// `choices`.
inline Config config_for(std::uint64_t index, Choices& choices) {
    Config config;
    std::uint64_t i = index % config_count;
    const auto digit = [&i](std::uint64_t base) {
        const auto d = static_cast<unsigned>(i % base);
        i /= base;
        return d;
    };
    config.backend = static_cast<BackendKind>(digit(5));
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
    config.policy = choices.chance(1, 4) ? OutputPolicy::kernel_writes_all : OutputPolicy::zero;
    config.switch_policy = choices.chance(1, 3);
    if (choices.chance(1, 3)) {
        if (config.backend == BackendKind::mock || config.backend == BackendKind::mock_no_memset) {
            config.wait_faults = choices.chance(1, 2) ? WaitFaults::recover : WaitFaults::stuck;
        } else if (config.backend == BackendKind::slow) {
            config.wait_faults = WaitFaults::stuck;  // it has no synchronize()
        }
    }
    return config;
}

/// What a program run found.
struct Report {
    Config config;
    std::string trace;
    std::vector<std::string> failures;
    /// The stager's counters at the end: which way the runs went (StagerStats::mapped_runs, ...).
    devstage::StagerStats stats;

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

// ---- the kernel ------------------------------------------------------------------------------

/// One arg as a kernel sees it.
struct View {
    std::byte* data;
    std::size_t bytes;
    Direction direction;
};

inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xFF51AFD7ED558CCDull;
    return h ^ (h >> 29);
}

/// Whether a kernel of step `step` writes byte `b` of an output of `bytes`: every byte, or
/// (`partial`) all but the last quarter and every 7th byte — a kernel that stops early.
inline bool writes_byte(std::uint32_t step, bool partial, std::size_t b, std::size_t bytes) noexcept {
    return !partial || (b < bytes - bytes / 4 && b % 7 != step % 7);
}

/// The kernel of step `step`: reads every input byte (In, InOut), then writes every output
/// byte (Out: from the inputs and the step; InOut: its old value plus a non-zero increment
/// that depends on the inputs and the step) — with `partial`, only those writes_byte() names.
/// The device runs it on device memory, the model on its own copies.
inline void compute(std::uint32_t step, std::span<const View> views, bool partial = false) noexcept {
    std::uint64_t h = mix(0x5EC0E1CEull, step);
    for (std::size_t i = 0; i < views.size(); ++i) {
        const View& v = views[i];
        if (!devstage::uploads(v.direction)) continue;
        h = mix(h, i + 1);
        std::size_t b = 0;
        for (; b + 8 <= v.bytes; b += 8) {
            std::uint64_t word;
            std::memcpy(&word, v.data + b, 8);
            h = mix(h, word);
        }
        for (; b < v.bytes; ++b) h = mix(h, static_cast<std::uint64_t>(v.data[b]));
    }
    for (std::size_t j = 0; j < views.size(); ++j) {
        const View& v = views[j];
        if (!devstage::copies_back(v.direction)) continue;
        std::uint64_t g = mix(h, 0x100 + j);
        for (std::size_t b = 0; b < v.bytes; ++b) {
            if (b % 8 == 0) g = mix(g, b);
            const auto value = static_cast<std::uint8_t>(g >> (8 * (b % 8)));
            if (!writes_byte(step, partial, b, v.bytes)) continue;
            if (v.direction == Direction::InOut) {
                v.data[b] = static_cast<std::byte>(static_cast<std::uint8_t>(v.data[b]) + (value | 1u));
            } else {
                v.data[b] = static_cast<std::byte>(value);
            }
        }
    }
}

/// The bytes the engine writes itself (initial contents, new inputs): a function of `tag`.
inline void pattern(std::uint64_t tag, std::byte* data, std::size_t bytes) noexcept {
    std::uint64_t g = mix(0xFEEDull, tag);
    for (std::size_t b = 0; b < bytes; ++b) {
        if (b % 8 == 0) g = mix(g, b);
        data[b] = static_cast<std::byte>(g >> (8 * (b % 8)));
    }
}

inline const std::uint8_t* as_u8(const std::byte* p) noexcept {
    return reinterpret_cast<const std::uint8_t*>(p);
}

inline const char* direction_name(Direction d) noexcept {
    return d == Direction::In ? "In" : d == Direction::Out ? "Out" : "InOut";
}

// ---- a program's steps -----------------------------------------------------------------------

/// What an arg points at: a host buffer, a caller-owned device buffer, or a tensor of a frame.
enum class Where : std::uint8_t { host, device, frame };

struct ArgSpec {
    Where where = Where::host;
    int index = 0;   // the buffer, or the frame's step
    int tensor = 0;  // a frame's tensor
    std::size_t offset = 0;
    std::size_t bytes = 0;
    Direction direction = Direction::InOut;
    HostMemory memory = HostMemory::unknown;
};

/// Where a frame's input tensor is filled from: a pattern, or a host buffer or another frame's
/// tensor the engine owns (nothing in flight writes it).
struct FillSpec {
    bool from_source = false;
    Where where = Where::host;
    int index = 0;
    int tensor = 0;
};

struct StepSpec {
    bool frame = false;
    bool bind_object = false;   // bind(*frame, stream) rather than bind(frame->args(), stream)
    std::vector<ArgSpec> args;  // for a frame: its shapes (where = frame, index = the step itself)
    std::vector<FillSpec> fills;
    unsigned bind_stream = 0;
    unsigned finish_stream = 0;
    // The kernel on the finish stream, after waiting for the bind stream (odd steps through
    // Stager::order_after_uploads, even ones with the engine's own event).
    bool kernel_on_finish = false;
    bool partial = false;  // the kernel leaves some output bytes unwritten
};

/// How the engine ends with a Completion.
enum class End : std::uint8_t { wait, poll, destroy, detach };

// ---- the runner ------------------------------------------------------------------------------

/// One line of a trace: `log() << "s" << id << " kernel\n";` appends when the statement ends.
class Line {
public:
    explicit Line(std::string& into) noexcept : into_(into) {}
    Line(const Line&) = delete;
    Line& operator=(const Line&) = delete;
    ~Line() { into_ += out_.str(); }
    template <class T>
    Line& operator<<(const T& value) {
        out_ << value;
        return *this;
    }

private:
    std::string& into_;
    std::ostringstream out_;
};

template <class B>
std::unique_ptr<B> make_backend(const Config& config, devstage::ErrorSink sink) {
    if constexpr (std::is_base_of_v<devstage::MockBackend, B>) {
        devstage::MockConfig mock;
        mock.offset = config.mock_offset;
        mock.journal = false;
        mock.deferred_async = config.backend != BackendKind::eager_mock;
        mock.not_ready_polls = config.not_ready_polls;
        mock.sink = sink;
        return std::make_unique<B>(mock);
    } else if constexpr (std::is_same_v<B, devstage::SimBackend>) {
        devstage::SimConfig sim;
        sim.lock_pinned = false;
        sim.bounce_buffer_bytes = 4096;
        return std::make_unique<B>(sim);
    } else {
        return std::make_unique<B>();
    }
}

/// Runs one program against Stager<B, S> and checks it against the model.
template <class B, class S>
class Runner {
public:
    using Stream = typename B::Stream;
    using Event = typename B::Event;
    static constexpr bool packs = devstage::detail::pack_limit_of<S>() > 0;

    Runner(const Config& config, Report& report)
        : config_(config),
          report_(report),
          backend_(make_backend<B>(config, devstage::ErrorSink(&Runner::leaked, this))) {
        report_.config = config;
    }
    Runner(const Runner&) = delete;
    Runner& operator=(const Runner&) = delete;
    ~Runner() { teardown(); }

    /// Destroys the stager, frees the buffers, streams and events, and checks the backend's
    /// misuse counter once more (also done by the destructor).
    void teardown() {
        if (!backend_) return;
        for (Step& step : steps_) {
            step.done.reset();
            step.run.reset();
        }
        stager_.reset();
        if (!streams_.empty()) drain_streams();
        for (std::size_t i = 0; i < streams_.size(); ++i) {
            (void)backend_->destroy_event(kernel_events_[i]);
            (void)backend_->destroy_event(bind_events_[i]);
            (void)backend_->destroy_stream(streams_[i]);
        }
        for (HostBuffer& buffer : host_) {
            if (buffer.pinned) (void)backend_->pinned_free(buffer.data);
        }
        for (DeviceBuffer& buffer : device_) (void)backend_->device_free(buffer.data);
        if (misuses() != 0 && ok()) fail("the backend counted misuse(s) at teardown: " + first_misuse());
        backend_.reset();
    }

    // ---- set-up ------------------------------------------------------------------------------

    /// A host buffer of `bytes`, from the backend's pinned memory when `pinned`.
    int add_host_buffer(std::size_t bytes, bool pinned, HostMemory hint = HostMemory::unknown) {
        HostBuffer buffer;
        buffer.bytes = bytes;
        buffer.pinned = pinned;
        buffer.hint = hint;
        if (pinned) {
            Result<void*> allocated = backend_->pinned_malloc(bytes);
            if (!allocated) {
                fail("pinned_malloc for a host buffer failed: " + allocated.status().message());
                buffer.pinned = false;
            } else {
                buffer.data = static_cast<std::byte*>(*allocated);
            }
        }
        if (buffer.data == nullptr) {
            buffer.storage = std::make_unique<std::byte[]>(bytes);
            buffer.data = buffer.storage.get();
        }
        const int index = static_cast<int>(host_.size());
        pattern(0x1000 + static_cast<std::uint64_t>(index), buffer.data, bytes);
        buffer.model.assign(as_u8(buffer.data), as_u8(buffer.data) + bytes);
        buffer.unknown.assign(bytes, 0);
        host_.push_back(std::move(buffer));
        log() << "host buffer b" << index << ": " << bytes << " bytes, " << (pinned ? "pinned" : "pageable")
              << (hint == HostMemory::pinned     ? " (said pinned)"
                  : hint == HostMemory::pageable ? " (said pageable)"
                                                 : "")
              << "\n";
        return index;
    }

    /// A caller-owned device buffer of `bytes`.
    int add_device_buffer(std::size_t bytes) {
        DeviceBuffer buffer;
        buffer.bytes = bytes;
        Result<void*> allocated = backend_->device_malloc(bytes);
        const int index = static_cast<int>(device_.size());
        if (!allocated) {
            fail("device_malloc for a device buffer failed: " + allocated.status().message());
            return -1;
        }
        buffer.data = static_cast<std::byte*>(*allocated);
        buffer.model.resize(bytes);
        buffer.unknown.assign(bytes, 0);
        pattern(0x2000 + static_cast<std::uint64_t>(index), reinterpret_cast<std::byte*>(buffer.model.data()), bytes);
        if (Status copied = backend_->copy_to_device(buffer.data, buffer.model.data(), bytes); !copied) {
            fail("filling a device buffer failed: " + copied.message());
        }
        device_.push_back(std::move(buffer));
        log() << "device buffer d" << index << ": " << bytes << " bytes\n";
        return index;
    }

    /// Creates the stager, the streams and the engine's events. Call once, after the buffers.
    bool start() {
        stager_.emplace(*backend_, S{}, config_.slots);
        stager_->set_error_sink(devstage::ErrorSink(&Runner::sink, this));
        stager_->set_output_policy(config_.policy);
        policy_ = config_.policy;
        if (config_.ring) {
            if constexpr (devstage::PinnedHostBackend<B>) {
                devstage::PageableRing ring;
                ring.threshold = ring_threshold;
                ring.chunk_bytes = ring_chunk;
                ring.chunks = 2;
                ring.threads = config_.ring_threads;
                if (Status set = stager_->set_pageable_ring(ring); !set) fail("set_pageable_ring: " + set.message());
            }
        }
        for (unsigned i = 0; i < config_.streams; ++i) {
            Result<Stream> stream = backend_->create_stream();
            Result<Event> after_kernel = backend_->create_event();
            Result<Event> after_bind = backend_->create_event();
            if (!stream || !after_kernel || !after_bind) {
                fail("creating the engine's streams and events failed");
                return false;
            }
            streams_.push_back(*stream);
            kernel_events_.push_back(*after_kernel);
            bind_events_.push_back(*after_bind);
        }
        log() << "stager: " << config_.slots << " slot(s); " << config_.streams << " stream(s)\n";
        return ok();
    }

    // ---- the engine's calls ------------------------------------------------------------------

    /// Starts a step: a plain bind, or a frame() (filled at once; bound by bind_frame()).
    /// Returns the step's id, or -1 when the stager refused (justifiably) or failed.
    int begin_step(StepSpec spec) {
        if (!running()) return -1;  // the program stops at its first failure
        const int id = static_cast<int>(steps_.size());
        steps_.emplace_back();
        Step& step = steps_.back();
        step.id = id;
        step.spec = std::move(spec);
        for (ArgSpec& arg : step.spec.args) {
            if (arg.where == Where::frame && step.spec.frame) arg.index = id;
        }
        return step.spec.frame ? begin_frame(step) : begin_plain(step);
    }

    /// Binds the frame of step `id` (taken by begin_step).
    bool bind_frame(int id) {
        if (!running()) return false;
        Step& step = steps_[static_cast<std::size_t>(id)];
        const std::uint64_t waits = stats().host_waits;
        const Stream stream = streams_[step.spec.bind_stream];
        Result<StagedRun> run =
            step.spec.bind_object ? stager_->bind(*step.frame, stream) : stager_->bind(step.frame->args(), stream);
        log() << "s" << id << " bind frame" << (step.spec.bind_object ? "" : " args") << " on stream "
              << step.spec.bind_stream;
        if (!run) {
            log() << " -> " << run.status().message() << "\n";
            fail("s" + std::to_string(id) + ": binding a frame failed: " + run.status().message());
            step.phase = Phase::refused;
            return false;
        }
        log() << " -> slot " << run->slot() << "\n";
        if (run->slot() != step.slot) {
            fail("s" + std::to_string(id) + ": the frame of slot " + std::to_string(step.slot) + " was bound on slot " +
                 std::to_string(run->slot()));
        }
        if (stats().host_waits != waits) {
            note("s" + std::to_string(id) + ": binding a frame waited on the host (" +
                 std::to_string(stats().host_waits - waits) + " host wait(s)); its slot was settled by frame()");
        }
        step.args.assign(step.frame->args().begin(), step.frame->args().end());
        check_device_args(step, *run);
        // Mapped, a frame's device args are its host tensors' device addresses, which are the
        // host addresses on every backend here: the kernel then writes the frame in place.
        for (std::size_t i = 0; i < step.tensors.size(); ++i) {
            if (step.tensors[i] == nullptr || step.spec.args[i].bytes == 0) continue;
            step.in_place = run->device_args()[i].data == step.tensors[i];
            if (!step.in_place) break;
        }
        step.run.emplace(std::move(*run));
        step.phase = Phase::bound;
        model_bind(step);
        return true;
    }

    /// Enqueues step `id`'s kernel (on its bind stream, or on its finish stream after a wait).
    void kernel(int id) {
        if (!running()) return;
        Step& step = steps_[static_cast<std::size_t>(id)];
        if (!step.run) {
            fail("s" + std::to_string(id) + ": the script launches a kernel of a step that is not bound");
            return;
        }
        unsigned on = step.spec.bind_stream;
        if (step.spec.kernel_on_finish && step.spec.finish_stream != step.spec.bind_stream) {
            on = step.spec.finish_stream;
            if (id % 2 == 1) {  // odd steps let the stager order the kernel after the uploads
                expect_ok(stager_->order_after_uploads(*step.run, streams_[on]), "stager order_after_uploads");
            } else {
                const Event after_bind = bind_events_[step.spec.bind_stream];
                expect_ok(backend_->record_event(after_bind, streams_[step.spec.bind_stream]), "engine record_event");
                expect_ok(backend_->stream_wait_event(streams_[on], after_bind), "engine stream_wait_event");
            }
        }
        auto job = std::make_unique<Job>();
        job->step = static_cast<std::uint32_t>(id);
        job->partial = step.spec.partial;
        const std::span<const TensorArg> device_args = step.run->device_args();
        std::vector<devstage::KernelAccess> accesses;  // what the kernel reads and writes, for the backend
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            job->views.push_back(View{static_cast<std::byte*>(device_args[i].data), arg.bytes, arg.direction});
            if (arg.bytes > 0) {
                accesses.push_back(devstage::KernelAccess{device_args[i].data, arg.bytes,
                                                          devstage::uploads(arg.direction),
                                                          devstage::copies_back(arg.direction)});
            }
            if (arg.where == Where::device) {
                // The engine orders its own kernels on caller-owned device memory.
                std::vector<bool>& touched = device_[static_cast<std::size_t>(arg.index)].touched_on;
                touched.resize(streams_.size());
                for (unsigned other = 0; other < streams_.size(); ++other) {
                    if (other != on && touched[other]) {
                        expect_ok(backend_->stream_wait_event(streams_[on], kernel_events_[other]),
                                  "engine stream_wait_event");
                    }
                }
                touched[on] = true;
            }
        }
        Status launched;
        if constexpr (devstage::KernelAccessBackend<B>) {
            launched = backend_->launch_kernel(streams_[on], &Job::run, job.get(), accesses);
        } else {
            launched = backend_->launch_host_func(streams_[on], &Job::run, job.get());
        }
        expect_ok(launched, "launching the kernel");
        expect_ok(backend_->record_event(kernel_events_[on], streams_[on]), "engine record_event");
        jobs_.push_back(std::move(job));
        step.kernel = true;
        log() << "s" << id << " kernel on stream " << on << (step.spec.partial ? " (leaves bytes unwritten)" : "")
              << "\n";
        model_kernel(step);
    }

    /// Finishes step `id` on its finish stream (execution failed: no copy-back).
    bool finish(int id, bool execution_ok = true) {
        if (!running()) return false;
        Step& step = steps_[static_cast<std::size_t>(id)];
        if (!step.run) {
            fail("s" + std::to_string(id) + ": the script finishes a step that is not bound");
            return false;
        }
        const bool conflict = conflicts(step);
        const std::uint64_t waits = stats().host_waits;
        const Status execution = execution_ok ? Status() : Status(Errc::backend_failure, "the kernel failed");
        Result<Completion> done = stager_->finish(std::move(*step.run), streams_[step.spec.finish_stream], execution);
        if (id % 3 == 0) {  // the run object, moved into finish: no longer live
            const Status refused = stager_->order_after_uploads(*step.run, streams_[0]);
            if (refused.code() != Errc::invalid_argument) {
                fail("s" + std::to_string(id) + ": order_after_uploads of a finished run answered '" +
                     refused.message() + "', not invalid_argument");
            }
        }
        step.run.reset();
        log() << "s" << id << " finish on stream " << step.spec.finish_stream
              << (execution_ok ? "" : " (execution failed)");
        if (!done) {
            log() << " -> " << done.status().message() << "\n";
            fail("s" + std::to_string(id) + ": finish failed: " + done.status().message());
            step.phase = Phase::dropped;
            return false;
        }
        log() << "\n";
        if (!conflict && stats().host_waits != waits) {
            note("s" + std::to_string(id) + ": finish waited on the host (" +
                 std::to_string(stats().host_waits - waits) +
                 " host wait(s)) though no run in flight shares its host memory");
        }
        step.done.emplace(std::move(*done));
        step.phase = Phase::finished;
        step.execution_ok = execution_ok;
        step.finish_order = ++finishes_;
        model_finish(step);
        return true;
    }

    /// Destroys step `id`'s run without finishing it (before its kernel: nothing copied back).
    void drop(int id) {
        if (!running()) return;
        Step& step = steps_[static_cast<std::size_t>(id)];
        step.run.reset();
        step.phase = Phase::dropped;
        log() << "s" << id << " dropped\n";
    }

    /// Ends with step `id`'s Completion.
    void end(int id, End how) {
        if (!running()) return;
        Step& step = steps_[static_cast<std::size_t>(id)];
        static const char* const names[] = {"wait", "ready", "destroy", "detach"};
        log() << "s" << id << " " << names[static_cast<int>(how)];
        switch (how) {
            case End::wait: {
                Status waited = step.done->wait();
                log() << (waited ? "\n" : " -> " + waited.message() + "\n");
                // A failed wait another step's failed wait settled this slot with is expected.
                if (!waited && !step.wait_may_fail)
                    fail("s" + std::to_string(id) + ": wait() failed: " + waited.message());
                completed(step);
                break;
            }
            case End::poll: {
                Result<bool> ready = step.done->ready();
                if (!ready) {
                    log() << " -> " << ready.status().message() << "\n";
                    fail("s" + std::to_string(id) + ": ready() failed: " + ready.status().message());
                    break;
                }
                log() << " -> " << (*ready ? "true" : "false") << "\n";
                if (*ready) completed(step);
                break;
            }
            case End::destroy:
                step.done.reset();
                step.released = true;
                log() << "\n";
                completed(step);
                break;
            case End::detach:
                step.done->detach();
                step.done.reset();
                step.released = true;
                step.detached = true;
                log() << "\n";
                break;
        }
    }

    /// Ends with step `id`'s Completion through a wait (`destroy`: its destructor) whose first
    /// wait for an event fails — this slot's, or, when its packed outputs follow another run's,
    /// that run's; none is made when a poll found the work complete already. With `recover` the
    /// backend's synchronize() then succeeds: the runs it settled are complete, every output
    /// delivered, and their waits may report the failure. With `stuck` the work stays pending —
    /// the Completion with it, its host memory devstage's — and the engine waits again once the
    /// fault is spent; a destructor reports to the error sink instead, and the stager settles
    /// the slot later (as for a detached Completion).
    void failed_wait(int id, bool destroy) {
        if (!running()) return;
        Step& step = steps_[static_cast<std::size_t>(id)];
        const bool stuck = config_.wait_faults == WaitFaults::stuck;
        log() << "s" << id << (destroy ? " destroy" : " wait") << " with a failing wait"
              << (stuck ? " (left pending)" : " (recovered by synchronize())");
        const std::size_t sunk_before = sunk_.size();
        std::vector<int> pending;  // the runs the failure may reach
        for (const Step& other : steps_) {
            if (other.phase == Phase::finished && !other.complete) pending.push_back(other.id);
        }
        arm_wait_fault(stuck);
        Status waited;
        if (destroy) {
            step.done.reset();
            step.released = true;
        } else {
            waited = step.done->wait();
        }
        disarm_wait_faults();
        log() << (waited ? "\n" : " -> " + waited.message() + "\n");
        const bool reported = sunk_.size() > sunk_before;
        for (std::size_t i = sunk_before; i < sunk_.size(); ++i, ++expected_sinks_) {
            if (sunk_[i].find("could not be waited for") == std::string::npos &&
                sunk_[i].find("injected") == std::string::npos) {
                fail("s" + std::to_string(id) + ": the error sink got a report no failed wait explains: " + sunk_[i]);
            }
        }
        if (!stuck) {
            for (int other : pending) steps_[static_cast<std::size_t>(other)].wait_may_fail = true;
            if (!destroy && step.done->pending()) {
                fail("s" + std::to_string(id) +
                     ": a failed wait synchronize() recovered from left the Completion "
                     "pending: " +
                     waited.message());
            }
            completed(step);
            return;
        }
        if (destroy) {
            if (reported) {
                step.detached = true;  // its outputs arrive when the stager next settles the slot
            } else {
                completed(step);
            }
            return;
        }
        if (waited) {  // nothing was left to wait for
            completed(step);
            return;
        }
        if (!step.done->pending()) {
            fail("s" + std::to_string(id) +
                 ": a failed wait whose work stays pending left the Completion not pending "
                 "(its host memory handed back early): " +
                 waited.message());
        }
        const Status again = step.done->wait();
        log() << "s" << id << " wait again" << (again ? "\n" : " -> " + again.message() + "\n");
        if (!again) fail("s" + std::to_string(id) + ": the wait after a failed one failed: " + again.message());
        completed(step);
    }

    /// Switches the output policy; the next bind follows it.
    void switch_policy() {
        if (!running()) return;
        policy_ = policy_ == OutputPolicy::zero ? OutputPolicy::kernel_writes_all : OutputPolicy::zero;
        stager_->set_output_policy(policy_);
        log() << "output policy " << (policy_ == OutputPolicy::zero ? "zero" : "kernel_writes_all") << "\n";
        if (stager_->output_policy() != policy_) fail("output_policy() does not answer the policy just set");
    }

    /// A call the contract refuses (invalid_argument, or busy where every slot is held), which
    /// must change nothing: a copy of an unbound frame's args, a Device arg with a null pointer,
    /// order_after_uploads of a moved-from run.
    void misuse(Choices& choices) {
        if (!running()) return;
        const std::uint64_t runs = stats().runs;
        const Stream stream = streams_[choices.below(static_cast<std::uint32_t>(streams_.size()))];
        const auto expect = [&](const Status& status, const char* what, bool busy_too) {
            log() << "misuse: " << what << " -> " << (status ? std::string("ok") : status.message()) << "\n";
            if (status.code() != Errc::invalid_argument && !(busy_too && status.code() == Errc::busy)) {
                fail(std::string("misuse ") + what + " answered '" + (status ? "ok" : status.message()) +
                     "', not invalid_argument");
            }
            if (stats().runs != runs) fail(std::string("misuse ") + what + " counted a run");
        };
        std::vector<int> framed, bound;
        for (const Step& step : steps_) {
            if (step.phase == Phase::framed) {
                for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
                    if (step.spec.args[i].where == Where::frame && step.spec.args[i].bytes > 0) {
                        framed.push_back(step.id);
                        break;
                    }
                }
            }
            if (step.phase == Phase::bound) bound.push_back(step.id);
        }
        const std::uint32_t kind = choices.below(3);
        if (kind == 0 && !framed.empty()) {
            const Step& step =
                steps_[static_cast<std::size_t>(framed[choices.below(static_cast<std::uint32_t>(framed.size()))])];
            std::vector<TensorArg> copy(step.frame->args().begin(), step.frame->args().end());
            Result<StagedRun> run = stager_->bind(copy, stream);
            expect(run.status(), "bind of a copy of a frame's args", false);
            if (run) step_run_leak(std::move(*run));
        } else if (kind == 1 && !bound.empty()) {
            Step& step =
                steps_[static_cast<std::size_t>(bound[choices.below(static_cast<std::uint32_t>(bound.size()))])];
            StagedRun moved(std::move(*step.run));
            expect(stager_->order_after_uploads(*step.run, stream), "order_after_uploads of a moved-from run", false);
            step.run.emplace(std::move(moved));  // the run lives on in the step
        } else {
            const TensorArg null_device[] = {{nullptr, 64, Direction::In, Placement::Device}};
            Result<StagedRun> run = stager_->bind(null_device, stream);
            expect(run.status(), "bind of a Device arg with a null pointer", true);
            if (run) step_run_leak(std::move(*run));
        }
    }
    // A run a misuse was wrongly given: finished at once so that the program can go on.
    void step_run_leak(StagedRun run) {
        Result<Completion> done = stager_->finish(std::move(run), streams_[0]);
        if (done) (void)done->wait();
    }

    /// The engine writes new contents into host buffer `index` (nothing in flight uses it).
    void engine_write(int index) {
        if (!running()) return;
        HostBuffer& buffer = host_[static_cast<std::size_t>(index)];
        engine_access(buffer.data, buffer.bytes, true, "the engine writes b" + std::to_string(index));
        const std::uint64_t tag = 0x3000 + ++writes_;
        pattern(tag, buffer.data, buffer.bytes);
        buffer.model.assign(as_u8(buffer.data), as_u8(buffer.data) + buffer.bytes);
        std::fill(buffer.unknown.begin(), buffer.unknown.end(), std::uint8_t{0});
        log() << "engine writes b" << index << "\n";
    }

    /// Ends the program: binds, runs and finishes what is open, waits for every Completion (in
    /// the order `choices` gives), releases the stager and compares every host buffer.
    void conclude(Choices& choices) {
        if (!running()) return;
        log() << "-- the end: finish what is open, wait for everything, release the stager\n";
        for (Step& step : steps_) {
            if (step.phase == Phase::framed) bind_frame(step.id);
        }
        for (Step& step : steps_) {
            if (step.phase != Phase::bound) continue;
            if (!step.kernel) kernel(step.id);
            finish(step.id);
        }
        std::vector<int> open;
        for (Step& step : steps_) {
            if (step.done) open.push_back(step.id);
        }
        while (!open.empty()) {
            const std::size_t pick = choices.below(static_cast<std::uint32_t>(open.size()));
            const int id = open[pick];
            open.erase(open.begin() + static_cast<std::ptrdiff_t>(pick));
            Step& step = steps_[static_cast<std::size_t>(id)];
            if (!step.complete) end(id, End::wait);
        }
        for (Step& step : steps_) {
            if (step.done) end(step.id, End::destroy);
        }
        const std::uint64_t misuses_before = misuses();
        if (Status released = stager_->release(); !released) fail("release() failed: " + released.message());
        log() << "release\n";
        for (Step& step : steps_) {
            if (step.phase == Phase::finished) step.complete = true;
        }
        drain_streams();
        for (std::size_t i = 0; i < host_.size(); ++i) {
            compare("at the end, host buffer b" + std::to_string(i), host_[i].data, host_[i].model.data(),
                    host_[i].bytes, host_[i].unknown.data());
        }
        for (std::size_t i = 0; i < device_.size(); ++i) {
            std::vector<std::uint8_t> actual(device_[i].bytes);
            if (Status copied = backend_->copy_from_device(actual.data(), device_[i].data, device_[i].bytes); !copied) {
                fail("reading device buffer d" + std::to_string(i) + " failed: " + copied.message());
            } else {
                compare("at the end, device buffer d" + std::to_string(i), reinterpret_cast<std::byte*>(actual.data()),
                        device_[i].model.data(), device_[i].bytes, device_[i].unknown.data());
            }
        }
        if (misuses_before != 0 || misuses() != 0) {
            fail("the backend counted " + std::to_string(misuses()) + " misuse(s): " + first_misuse());
        }
        if (sunk_.size() != expected_sinks_) {
            fail("the stager's error sink was called " + std::to_string(sunk_.size()) + " time(s), " +
                 std::to_string(expected_sinks_) + " expected" + (sunk_.empty() ? "" : ": " + sunk_.front()));
        }
        report_.stats = stats();
    }

    // ---- the random engine --------------------------------------------------------------------

    /// A random program from `choices`: buffers, then up to max_steps steps interleaved with
    /// kernels, finishes and the Completions' ends; then conclude().
    void drive(Choices& choices) {
        const unsigned buffers = 6 + choices.below(5);
        for (unsigned i = 0; i < buffers; ++i) {
            const std::size_t bytes = sizes[choices.below(std::size(sizes))];
            const bool pinned = choices.chance(1, 3);
            const std::uint32_t said = choices.below(4);
            const HostMemory hint =
                said == 0 ? (pinned ? HostMemory::pinned : HostMemory::pageable) : HostMemory::unknown;
            add_host_buffer(bytes, pinned, hint);
        }
        const unsigned devices = config_.device_frames ? 1 + choices.below(2) : choices.below(3);
        for (unsigned i = 0; i < devices; ++i) add_device_buffer(sizes[choices.below(std::size(sizes))]);
        if (!start()) return;
        for (unsigned action = 0; action < config_.max_actions && !choices.exhausted() && running(); ++action) {
            if (!act(choices)) break;
        }
        conclude(choices);
    }

    bool ok() const noexcept { return report_.ok(); }
    /// False once a failure left the program in a state it cannot go on from (a slot taken from
    /// under a frame, an error returned): the program stops there. Wrong bytes, waits and
    /// misaligned frames are reported and the program goes on.
    bool running() const noexcept { return !stopped_; }
    /// Host buffer `index` itself (for the checker's own tests).
    std::byte* host_data(int index) noexcept { return host_[static_cast<std::size_t>(index)].data; }
    const devstage::StagerStats& stats() const noexcept { return stager_->stats(); }
    B& backend() noexcept { return *backend_; }

private:
    enum class Phase : std::uint8_t { framed, bound, finished, dropped, refused };

    struct HostBuffer {
        std::size_t bytes = 0;
        bool pinned = false;
        HostMemory hint = HostMemory::unknown;
        std::byte* data = nullptr;
        std::unique_ptr<std::byte[]> storage;
        std::vector<std::uint8_t> model;
        std::vector<std::uint8_t> unknown;  // 1: a byte no sequential run defines (kernel_writes_all)
    };
    struct DeviceBuffer {
        std::size_t bytes = 0;
        std::byte* data = nullptr;
        std::vector<std::uint8_t> model;
        std::vector<std::uint8_t> unknown;
        std::vector<bool> touched_on;  // streams whose kernels used it
    };
    struct Step {
        int id = 0;
        StepSpec spec;
        Phase phase = Phase::refused;
        std::size_t slot = 0;
        bool kernel = false;
        bool execution_ok = true;
        bool complete = false;  // known complete: waited, ready, destroyed
        bool released = false;  // its Completion destroyed or detached: a frame is handed back
        bool detached = false;
        bool in_place = false;       // a frame whose kernel uses its tensors where they lie (a mapped mirror)
        bool wait_may_fail = false;  // resolved with another step's injected wait failure
        std::uint64_t finish_order = 0;
        std::optional<HostFrame> frame;
        std::optional<StagedRun> run;
        std::optional<Completion> done;
        std::vector<TensorArg> args;                            // as bound
        std::vector<std::byte*> tensors;                        // a frame's host(i)
        std::vector<std::vector<std::uint8_t>> model;           // a frame's tensors in the model
        std::vector<bool> defined;                              // a frame's tensor holds modelled bytes
        std::vector<std::vector<std::uint8_t>> staged;          // the model's device copies of the args
        std::vector<std::vector<std::uint8_t>> unknown;         // of a frame's tensors in the model
        std::vector<std::vector<std::uint8_t>> staged_unknown;  // of the device copies
        OutputPolicy policy = OutputPolicy::zero;               // at its bind
    };
    struct Job {
        std::uint32_t step = 0;
        bool partial = false;
        std::vector<View> views;
        static void run(void* self) noexcept {
            auto* job = static_cast<Job*>(self);
            compute(job->step, job->views, job->partial);
        }
    };
    // A host range a step uses.
    struct Use {
        const std::byte* begin;
        std::size_t bytes;
        bool reads, writes;
    };

    // ---- the steps' memory ------------------------------------------------------------------

    std::byte* pointer(const ArgSpec& arg) {
        switch (arg.where) {
            case Where::host:
                return host_[static_cast<std::size_t>(arg.index)].data + arg.offset;
            case Where::device:
                return device_[static_cast<std::size_t>(arg.index)].data + arg.offset;
            case Where::frame:
                return steps_[static_cast<std::size_t>(arg.index)].tensors[static_cast<std::size_t>(arg.tensor)] +
                       arg.offset;
        }
        return nullptr;
    }
    std::uint8_t* model_of(const ArgSpec& arg) {
        switch (arg.where) {
            case Where::host:
                return host_[static_cast<std::size_t>(arg.index)].model.data() + arg.offset;
            case Where::device:
                return device_[static_cast<std::size_t>(arg.index)].model.data() + arg.offset;
            case Where::frame:
                return steps_[static_cast<std::size_t>(arg.index)].model[static_cast<std::size_t>(arg.tensor)].data() +
                       arg.offset;
        }
        return nullptr;
    }
    // The model's mask of bytes no sequential run defines (1), beside model_of(arg).
    std::uint8_t* unknown_of(const ArgSpec& arg) {
        switch (arg.where) {
            case Where::host:
                return host_[static_cast<std::size_t>(arg.index)].unknown.data() + arg.offset;
            case Where::device:
                return device_[static_cast<std::size_t>(arg.index)].unknown.data() + arg.offset;
            case Where::frame:
                return steps_[static_cast<std::size_t>(arg.index)]
                           .unknown[static_cast<std::size_t>(arg.tensor)]
                           .data() +
                       arg.offset;
        }
        return nullptr;
    }
    std::string name(const ArgSpec& arg) const {
        std::ostringstream out;
        switch (arg.where) {
            case Where::host:
                out << "b" << arg.index;
                break;
            case Where::device:
                out << "d" << arg.index;
                break;
            case Where::frame:
                out << "s" << arg.index << ".t" << arg.tensor;
                break;
        }
        const std::size_t whole = arg.where == Where::host     ? host_[static_cast<std::size_t>(arg.index)].bytes
                                  : arg.where == Where::device ? device_[static_cast<std::size_t>(arg.index)].bytes
                                                               : arg.bytes + arg.offset;
        if (arg.offset != 0 || arg.bytes != whole) out << "[" << arg.offset << ":" << arg.offset + arg.bytes << ")";
        return out.str();
    }

    std::vector<Use> uses(const Step& step) {
        std::vector<Use> list;
        for (const ArgSpec& arg : step.spec.args) {
            if (arg.where == Where::device || arg.bytes == 0) continue;
            list.push_back(
                Use{pointer(arg), arg.bytes, devstage::uploads(arg.direction), devstage::copies_back(arg.direction)});
        }
        return list;
    }
    static bool overlap(const Use& a, const Use& b) noexcept {
        return a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes;
    }
    static bool in_flight(const Step& step) noexcept {
        return step.phase == Phase::bound || (step.phase == Phase::finished && !step.complete);
    }
    // A slot held: a live run, or a frame until its Completion is destroyed or detached.
    static bool holds_slot(const Step& step) noexcept {
        if (step.phase == Phase::bound) return true;
        return step.spec.frame && (step.phase == Phase::framed || (step.phase == Phase::finished && !step.released));
    }
    std::size_t held_slots() const noexcept {
        return static_cast<std::size_t>(std::count_if(steps_.begin(), steps_.end(), holds_slot));
    }
    // Slots that may hold a live run, a frame or pending work (an upper bound).
    std::size_t busy_slots() const noexcept {
        return static_cast<std::size_t>(
            std::count_if(steps_.begin(), steps_.end(), [](const Step& s) { return holds_slot(s) || in_flight(s); }));
    }

    // True when `step` shares host memory with a run in flight, one of them writing it.
    bool conflicts(const Step& step) {
        const std::vector<Use> mine = uses(step);
        for (const Step& other : steps_) {
            if (other.id == step.id || !in_flight(other)) continue;
            for (const Use& theirs : uses(other)) {
                for (const Use& use : mine) {
                    if (overlap(use, theirs) && (use.writes || theirs.writes)) return true;
                }
            }
        }
        return false;
    }
    // The first live run that will copy back host memory `step` uses (a justified busy).
    std::optional<std::string> live_overlap(const Step& step) {
        const std::vector<Use> mine = uses(step);
        for (const Step& other : steps_) {
            if (other.id == step.id || other.phase != Phase::bound) continue;
            for (const Use& theirs : uses(other)) {
                if (!theirs.writes) continue;
                for (const Use& use : mine) {
                    if (overlap(use, theirs)) return "s" + std::to_string(other.id);
                }
            }
        }
        return std::nullopt;
    }
    // True when a run in flight (other than `except`) writes memory overlapping `use`.
    bool written_in_flight(const Use& use, int except = -1, std::uint64_t after = 0) {
        for (const Step& other : steps_) {
            if (other.id == except || !in_flight(other)) continue;
            if (other.phase == Phase::finished && other.finish_order <= after) continue;
            for (const Use& theirs : uses(other)) {
                if (theirs.writes && overlap(use, theirs)) return true;
            }
        }
        return false;
    }
    bool used_in_flight(const Use& use) {
        for (const Step& other : steps_) {
            if (!in_flight(other)) continue;
            for (const Use& theirs : uses(other)) {
                if (overlap(use, theirs)) return true;
            }
        }
        return false;
    }

    // ---- beginning a step ---------------------------------------------------------------------

    int begin_plain(Step& step) {
        std::ostringstream what;
        what << "s" << step.id << " bind [";
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            TensorArg t{pointer(arg), arg.bytes, arg.direction,
                        arg.where == Where::device ? Placement::Device : Placement::Host, arg.memory};
            step.args.push_back(t);
            what << (i ? ", " : "") << name(arg) << " " << direction_name(arg.direction)
                 << (arg.where == Where::device ? " (device)" : "")
                 << (arg.memory == HostMemory::pinned     ? " (said pinned)"
                     : arg.memory == HostMemory::pageable ? " (said pageable)"
                                                          : "");
        }
        what << "] on stream " << step.spec.bind_stream << ", finish on " << step.spec.finish_stream
             << (step.spec.kernel_on_finish && step.spec.finish_stream != step.spec.bind_stream ? ", kernel there"
                                                                                                : "");
        log() << what.str();
        const std::size_t held = held_slots();
        const bool idle = busy_slots() < config_.slots;
        const bool conflict = conflicts(step);
        const std::optional<std::string> live = live_overlap(step);
        const std::uint64_t waits = stats().host_waits;
        Result<StagedRun> run = stager_->bind(step.args, streams_[step.spec.bind_stream]);
        if (!run) {
            log() << " -> " << run.status().message() << "\n";
            step.phase = Phase::refused;
            if (run.status().code() != Errc::busy) {
                fail("s" + std::to_string(step.id) + ": bind failed: " + run.status().message());
            } else if (held < config_.slots && !live) {
                fail("s" + std::to_string(step.id) + ": bind refused (busy) without cause: " + std::to_string(held) +
                     " of " + std::to_string(config_.slots) +
                     " slot(s) held, and no live run copies back its host memory: " + run.status().message());
            }
            return -1;
        }
        log() << " -> slot " << run->slot() << "\n";
        step.slot = run->slot();
        if (!check_slot_taken(step, held, "bind")) {
            step.run.emplace(std::move(*run));
            step.phase = Phase::bound;
            return -1;
        }
        if (!conflict && (!packs || idle) && stats().host_waits != waits) {
            note("s" + std::to_string(step.id) + ": bind waited on the host (" +
                 std::to_string(stats().host_waits - waits) + " host wait(s)) though no run in flight shares its " +
                 "host memory" + (packs ? " and a slot was idle" : ""));
        }
        check_device_args(step, *run);
        step.run.emplace(std::move(*run));
        step.phase = Phase::bound;
        model_bind(step);
        return step.id;
    }

    int begin_frame(Step& step) {
        std::ostringstream what;
        what << "s" << step.id << " frame [";
        std::vector<TensorShape> shapes;
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            if (arg.where == Where::device) {  // a device-resident tensor, passed through
                shapes.push_back(TensorShape{arg.bytes, arg.direction, pointer(arg)});
                what << (i ? ", " : "") << name(arg) << " " << direction_name(arg.direction) << " (device)";
                continue;
            }
            shapes.push_back(TensorShape{arg.bytes, arg.direction});
            what << (i ? ", " : "") << arg.bytes << " " << direction_name(arg.direction);
            if (devstage::uploads(arg.direction) && i < step.spec.fills.size() && step.spec.fills[i].from_source) {
                const FillSpec& fill = step.spec.fills[i];
                what << " from " << (fill.where == Where::host ? "b" : "s") << fill.index
                     << (fill.where == Where::frame ? ".t" + std::to_string(fill.tensor) : "");
            }
        }
        what << "], bound on stream " << step.spec.bind_stream << ", finish on " << step.spec.finish_stream;
        log() << what.str();
        const std::size_t held = held_slots();
        const bool idle = busy_slots() < config_.slots;
        const std::uint64_t waits = stats().host_waits;
        Result<HostFrame> frame = [&]() -> Result<HostFrame> {
            if constexpr (packs) {
                return stager_->frame(shapes);
            } else {
                return Status(Errc::not_supported, "no frames without packing");
            }
        }();
        if (!frame) {
            log() << " -> " << frame.status().message() << "\n";
            step.phase = Phase::refused;
            if (frame.status().code() != Errc::busy) {
                fail("s" + std::to_string(step.id) + ": frame() failed: " + frame.status().message());
            } else if (held < config_.slots) {
                fail("s" + std::to_string(step.id) + ": frame() refused (busy) with " + std::to_string(held) + " of " +
                     std::to_string(config_.slots) + " slot(s) held: " + frame.status().message());
            }
            return -1;
        }
        log() << " -> slot " << frame->slot() << "\n";
        step.slot = frame->slot();
        if (!check_slot_taken(step, held, "frame()")) {
            step.frame.emplace(std::move(*frame));
            step.phase = Phase::framed;
            return -1;  // the held frame's memory may be gone: the program stops here
        }
        if (idle && stats().host_waits != waits) {
            note("s" + std::to_string(step.id) + ": frame() waited on the host (" +
                 std::to_string(stats().host_waits - waits) + " host wait(s)) though a slot was idle");
        }
        step.frame.emplace(std::move(*frame));
        const std::size_t count = step.spec.args.size();
        step.tensors.resize(count);
        step.model.resize(count);
        step.unknown.resize(count);
        step.defined.assign(count, false);
        if (step.frame->size() != count)
            fail("s" + std::to_string(step.id) + ": the frame has the wrong number of tensors");
        for (std::size_t i = 0; i < count && i < step.frame->size(); ++i) {
            const std::span<std::byte> tensor = step.frame->host(i);
            const ArgSpec& arg = step.spec.args[i];
            if (arg.where == Where::device) {
                const TensorArg& passed = step.frame->args()[i];
                if (!tensor.empty() || passed.placement != Placement::Device || passed.data != pointer(arg) ||
                    passed.bytes != arg.bytes || passed.direction != arg.direction) {
                    fail("s" + std::to_string(step.id) + ": frame tensor " + std::to_string(i) +
                         " is device-resident, but host(i) has " + std::to_string(tensor.size()) +
                         " bytes or args()[i] is not the device pointer as a Device arg");
                    step.phase = Phase::refused;
                    return -1;
                }
                step.tensors[i] = nullptr;
                continue;
            }
            if (tensor.size() != arg.bytes || (arg.bytes > 0 && tensor.data() == nullptr)) {
                fail("s" + std::to_string(step.id) + ": frame tensor " + std::to_string(i) + " has " +
                     std::to_string(tensor.size()) + " bytes, not " + std::to_string(arg.bytes));
                step.phase = Phase::refused;
                return -1;
            }
            if (arg.bytes > 0 && reinterpret_cast<std::uintptr_t>(tensor.data()) % S::alignment != 0) {
                note("s" + std::to_string(step.id) + ": frame tensor " + std::to_string(i) + " at " +
                     std::to_string(reinterpret_cast<std::uintptr_t>(tensor.data()) % S::alignment) + " mod " +
                     std::to_string(S::alignment) + ": host(i) must be aligned as the device slice");
            }
            step.tensors[i] = tensor.data();
            step.model[i].assign(arg.bytes, 0);
            step.unknown[i].assign(arg.bytes, 0);
        }
        step.phase = Phase::framed;
        fill_frame(step);
        return step.id;
    }

    // The engine writes the frame's inputs: a pattern, or bytes of a buffer it owns.
    void fill_frame(Step& step) {
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            if (arg.where == Where::device) continue;  // the device's own: never defined as a frame tensor
            if (!devstage::uploads(arg.direction) || arg.bytes == 0) {
                step.defined[i] = arg.bytes == 0;
                continue;
            }
            std::byte* into = step.tensors[i];
            engine_access(into, arg.bytes, true, "s" + std::to_string(step.id) + ": the engine fills its frame");
            pattern(0x4000 + static_cast<std::uint64_t>(step.id) * 16 + i, into, arg.bytes);
            if (i < step.spec.fills.size() && step.spec.fills[i].from_source) {
                const FillSpec& fill = step.spec.fills[i];
                ArgSpec source;
                source.where = fill.where;
                source.index = fill.index;
                source.tensor = fill.tensor;
                const std::size_t whole = fill.where == Where::host ? host_[static_cast<std::size_t>(fill.index)].bytes
                                                                    : steps_[static_cast<std::size_t>(fill.index)]
                                                                          .model[static_cast<std::size_t>(fill.tensor)]
                                                                          .size();
                source.bytes = std::min(whole, arg.bytes);
                const Use use{pointer(source), source.bytes, true, false};
                if (!written_in_flight(use)) {  // the engine reads it: it owns it now
                    engine_access(use.begin, use.bytes, false,
                                  "s" + std::to_string(step.id) + " reads " + name(source));
                    compare("s" + std::to_string(step.id) + " reading " + name(source) + " for its frame", use.begin,
                            model_of(source), source.bytes, unknown_of(source));
                    std::memcpy(into, use.begin, source.bytes);
                }
            }
            step.model[i].assign(reinterpret_cast<std::uint8_t*>(into),
                                 reinterpret_cast<std::uint8_t*>(into) + arg.bytes);
            std::fill(step.unknown[i].begin(), step.unknown[i].end(), std::uint8_t{0});  // the engine's bytes
            step.defined[i] = true;
        }
    }

    bool check_slot_taken(const Step& step, std::size_t held, const char* call) {
        if (held >= config_.slots) {
            fail("s" + std::to_string(step.id) + ": " + call + " succeeded (slot " + std::to_string(step.slot) +
                 ") though all " + std::to_string(config_.slots) +
                 " slot(s) are held by live runs or frames whose Completion lives");
            return false;
        }
        for (const Step& other : steps_) {
            if (other.id == step.id || !holds_slot(other)) continue;
            if (other.slot == step.slot) {
                fail("s" + std::to_string(step.id) + ": " + call + " took slot " + std::to_string(step.slot) +
                     ", held by s" + std::to_string(other.id) +
                     (other.phase == Phase::bound ? " (a live run)" : " (a frame whose Completion lives)"));
                return false;
            }
        }
        return true;
    }

    void check_device_args(const Step& step, const StagedRun& run) {
        const std::span<const TensorArg> device = run.device_args();
        if (device.size() != step.spec.args.size()) {
            fail("s" + std::to_string(step.id) + ": device_args() has the wrong size");
            return;
        }
        for (std::size_t i = 0; i < device.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            if (arg.bytes == 0) {
                if (device[i].data != nullptr) fail("s" + std::to_string(step.id) + ": a zero-byte arg is not null");
            } else if (arg.where == Where::device && device[i].data != step.args[i].data) {
                fail("s" + std::to_string(step.id) + ": a Device arg was not passed through");
            } else if (arg.where != Where::device &&
                       reinterpret_cast<std::uintptr_t>(device[i].data) % S::alignment != 0) {
                fail("s" + std::to_string(step.id) + ": a staged arg's device pointer is not aligned");
            }
        }
    }

    // ---- completions --------------------------------------------------------------------------

    // Step `step` is known complete: its outputs must be in host memory now, where no run
    // finished after it writes the same memory and is not known complete.
    void completed(Step& step) {
        step.complete = true;
        if (!step.execution_ok) return;
        for (const ArgSpec& arg : step.spec.args) {
            if (arg.where == Where::device || arg.bytes == 0 || !devstage::copies_back(arg.direction)) continue;
            if (arg.where == Where::frame && steps_[static_cast<std::size_t>(arg.index)].released) continue;
            const Use use{pointer(arg), arg.bytes, false, true};
            if (written_in_flight(use, step.id, step.finish_order)) continue;
            engine_access(use.begin, arg.bytes, false,
                          "s" + std::to_string(step.id) + " complete: reading " + name(arg));
            compare("s" + std::to_string(step.id) + " complete, its output " + name(arg), use.begin, model_of(arg),
                    arg.bytes, unknown_of(arg));
        }
    }

    // ---- the model ------------------------------------------------------------------------------

    // Out args start as zeros (OutputPolicy::zero) or as bytes nobody defines
    // (kernel_writes_all): the policy at the bind counts.
    void model_bind(Step& step) {
        step.policy = policy_;
        step.staged.resize(step.spec.args.size());
        step.staged_unknown.resize(step.spec.args.size());
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            if (arg.where == Where::device) continue;
            if (devstage::uploads(arg.direction)) {
                const std::uint8_t* from = model_of(arg);
                const std::uint8_t* unknown = unknown_of(arg);
                step.staged[i].assign(from, from + arg.bytes);
                step.staged_unknown[i].assign(unknown, unknown + arg.bytes);
            } else {
                step.staged[i].assign(arg.bytes, 0);
                step.staged_unknown[i].assign(arg.bytes, policy_ == OutputPolicy::zero ? 0 : 1);
            }
        }
    }
    // The kernel on the model's copies; a byte it writes is undefined when any input byte is
    // (the whole hash is), or, for InOut, when its old value was.
    void model_kernel(Step& step) {
        std::vector<View> views;
        std::vector<std::uint8_t*> masks;
        bool tainted = false;
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            const bool device = arg.where == Where::device;
            std::byte* data = device ? reinterpret_cast<std::byte*>(model_of(arg))
                                     : reinterpret_cast<std::byte*>(step.staged[i].data());
            std::uint8_t* mask = device ? unknown_of(arg) : step.staged_unknown[i].data();
            views.push_back(View{data, arg.bytes, arg.direction});
            masks.push_back(mask);
            if (devstage::uploads(arg.direction) && arg.bytes > 0) {
                tainted = tainted || std::any_of(mask, mask + arg.bytes, [](std::uint8_t u) { return u != 0; });
            }
        }
        const auto id = static_cast<std::uint32_t>(step.id);
        compute(id, views, step.spec.partial);
        for (std::size_t i = 0; i < views.size(); ++i) {
            const View& v = views[i];
            if (!devstage::copies_back(v.direction)) continue;
            for (std::size_t b = 0; b < v.bytes; ++b) {
                if (!writes_byte(id, step.spec.partial, b, v.bytes)) continue;
                masks[i][b] = (tainted || (v.direction == Direction::InOut && masks[i][b] != 0)) ? 1 : 0;
            }
        }
    }
    void model_finish(Step& step) {
        if (!step.execution_ok) {
            // Nothing is copied back, but a frame used in place holds what its kernel wrote.
            if (step.in_place) model_in_place_writes(step);
            return;
        }
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            if (arg.where == Where::device || !devstage::copies_back(arg.direction) || arg.bytes == 0) continue;
            std::memcpy(model_of(arg), step.staged[i].data(), arg.bytes);
            std::memcpy(unknown_of(arg), step.staged_unknown[i].data(), arg.bytes);
            if (arg.where == Where::frame && arg.offset == 0 &&
                arg.bytes ==
                    steps_[static_cast<std::size_t>(arg.index)].model[static_cast<std::size_t>(arg.tensor)].size()) {
                steps_[static_cast<std::size_t>(arg.index)].defined[static_cast<std::size_t>(arg.tensor)] = true;
            }
        }
    }

    // The frame's own tensors as its kernel left them (the model's device copies).
    void model_in_place_writes(Step& step) {
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            if (arg.where != Where::frame || arg.index != step.id || !devstage::copies_back(arg.direction)) continue;
            if (arg.bytes == 0) continue;
            std::memcpy(model_of(arg), step.staged[i].data(), arg.bytes);
            std::memcpy(unknown_of(arg), step.staged_unknown[i].data(), arg.bytes);
            step.defined[i] = true;
        }
    }

    // The engine's own read (or write) of host memory: a checking backend (the deferred mock)
    // reports pending work that still writes it (or, for a write, still reads it).
    void engine_access(const std::byte* data, std::size_t bytes, bool writes, const std::string& what) {
        if constexpr (devstage::HostAccessCheckBackend<B>) {
            if (Status clear = backend_->check_host_access(data, bytes, writes); !clear) {
                note(what + ", which pending work still uses: " + clear.message());
            }
        } else {
            (void)data, (void)bytes, (void)writes, (void)what;
        }
    }

    // Byte for byte, but for the bytes `unknown` (when given) marks: no sequential run defines them.
    void compare(const std::string& what, const std::byte* actual, const std::uint8_t* model, std::size_t bytes,
                 const std::uint8_t* unknown = nullptr) {
        if (bytes == 0 || std::memcmp(actual, model, bytes) == 0) return;
        const auto differs = [&](std::size_t b) {
            return static_cast<std::uint8_t>(actual[b]) != model[b] && (unknown == nullptr || unknown[b] == 0);
        };
        std::size_t first = 0;
        while (first < bytes && !differs(first)) ++first;
        if (first == bytes) return;
        std::size_t differ = 0;
        for (std::size_t b = 0; b < bytes; ++b) differ += differs(b) ? 1 : 0;
        std::ostringstream out;
        out << what << ": " << differ << " of " << bytes << " bytes differ from the sequential run, first at byte "
            << first << " (0x" << std::hex << static_cast<int>(static_cast<std::uint8_t>(actual[first]))
            << ", expected 0x" << static_cast<int>(model[first]) << ")";
        note(out.str());
    }

    // ---- the random engine's moves ----------------------------------------------------------------

    enum class Move : std::uint8_t {
        policy,
        misuse,
        step,
        bind_frame,
        kernel,
        finish,
        fail_finish,
        failed_wait,
        failed_destroy,
        drop,
        wait,
        poll,
        destroy,
        detach,
        write
    };

    // One move of the random engine; false when there is nothing left to do.
    bool act(Choices& choices) {
        std::vector<std::pair<Move, int>> moves;  // (move, step or buffer)
        const auto add = [&](Move move, int target, int weight) {
            for (int i = 0; i < weight; ++i) moves.emplace_back(move, target);
        };
        const bool more_steps = steps_.size() < config_.max_steps;
        if (config_.switch_policy) add(Move::policy, -1, 2);
        add(Move::misuse, -1, 1);
        if (more_steps && (!config_.disjoint || held_slots() < config_.slots)) add(Move::step, -1, 6);
        for (const Step& step : steps_) {
            if (step.phase == Phase::framed) add(Move::bind_frame, step.id, 3);
            if (step.phase == Phase::bound && !step.kernel) add(Move::kernel, step.id, 3);
            if (step.phase == Phase::bound && step.kernel) add(Move::finish, step.id, 3);
            if (step.phase == Phase::bound && step.kernel && (step.id % 5) == 0) add(Move::fail_finish, step.id, 1);
            if (step.phase == Phase::bound && !step.kernel && !step.spec.frame && (step.id % 4) == 0) {
                add(Move::drop, step.id, 1);
            }
            if (step.phase == Phase::finished && step.done) {
                add(Move::wait, step.id, 2);
                add(Move::poll, step.id, 2);
                if (config_.wait_faults != WaitFaults::none) add(Move::failed_wait, step.id, 2);
                if (may_hand_back(step)) {
                    add(Move::destroy, step.id, 2);
                    add(Move::detach, step.id, config_.disjoint ? 0 : 1);
                    if (config_.wait_faults != WaitFaults::none) add(Move::failed_destroy, step.id, 1);
                }
            }
        }
        for (std::size_t i = 0; i < host_.size(); ++i) {
            const Use use{host_[i].data, host_[i].bytes, true, true};
            if (!used_in_flight(use) && !tainted(static_cast<int>(i))) add(Move::write, static_cast<int>(i), 1);
        }
        if (moves.empty() || (!more_steps && moves.size() == 0)) return false;
        if (!more_steps) {
            bool open = false;
            for (const Step& step : steps_) open = open || step.phase == Phase::framed || step.phase == Phase::bound;
            if (!open && choices.chance(1, 3)) return false;  // the rest is left to conclude()
        }
        const auto [move, target] = moves[choices.below(static_cast<std::uint32_t>(moves.size()))];
        switch (move) {
            case Move::policy:
                switch_policy();
                break;
            case Move::misuse:
                misuse(choices);
                break;
            case Move::step:
                begin_step(random_step(choices));
                break;
            case Move::bind_frame:
                bind_frame(target);
                break;
            case Move::kernel:
                kernel(target);
                break;
            case Move::finish:
                finish(target);
                break;
            case Move::fail_finish:
                finish(target, false);
                break;
            case Move::failed_wait:
                failed_wait(target, false);
                break;
            case Move::failed_destroy:
                failed_wait(target, true);
                break;
            case Move::drop:
                drop(target);
                break;
            case Move::wait:
                end(target, End::wait);
                break;
            case Move::poll:
                end(target, End::poll);
                break;
            case Move::destroy:
                end(target, End::destroy);
                break;
            case Move::detach:
                end(target, End::detach);
                break;
            case Move::write:
                engine_write(target);
                break;
        }
        return true;
    }

    // A frame is handed back only when no run in flight uses its memory.
    bool may_hand_back(const Step& step) {
        if (!step.spec.frame) return true;
        for (const Step& other : steps_) {
            if (other.id == step.id || !in_flight(other)) continue;
            for (const ArgSpec& arg : other.spec.args) {
                if (arg.where == Where::frame && arg.index == step.id) return false;
            }
        }
        return true;
    }
    // Host buffer `index` is written by a detached run that is not known complete: the engine
    // leaves it alone (runs may still use it: the stager orders them).
    bool tainted(int index) {
        for (const Step& step : steps_) {
            if (!step.detached || step.complete) continue;
            for (const ArgSpec& arg : step.spec.args) {
                if (arg.where == Where::host && arg.index == index && devstage::copies_back(arg.direction)) return true;
            }
        }
        return false;
    }

    Direction random_direction(Choices& choices) {
        const std::uint32_t d = choices.below(3);
        return d == 0 ? Direction::In : d == 1 ? Direction::Out : Direction::InOut;
    }

    StepSpec random_step(Choices& choices) {
        StepSpec spec;
        spec.frame = packs && config_.frames && choices.chance(1, 3);
        spec.bind_stream = choices.below(config_.streams);
        spec.finish_stream = choices.chance(1, 2) ? spec.bind_stream : choices.below(config_.streams);
        spec.kernel_on_finish = choices.chance(1, 2);
        spec.partial = config_.partial_kernels && choices.chance(1, 2);
        const unsigned count = 1 + choices.below(4);
        if (spec.frame) {
            spec.bind_object = choices.chance(1, 2);
            std::vector<int> devices;  // each device buffer at most once a frame
            for (std::size_t d = 0; d < device_.size(); ++d) devices.push_back(static_cast<int>(d));
            for (unsigned i = 0; i < count; ++i) {
                ArgSpec arg;
                arg.where = Where::frame;
                arg.tensor = static_cast<int>(i);
                arg.bytes = choices.chance(1, 16) ? 0 : sizes[choices.below(std::size(sizes))];
                arg.direction = random_direction(choices);
                if (config_.device_frames && !devices.empty() && choices.chance(1, 3)) {
                    const std::size_t pick = choices.below(static_cast<std::uint32_t>(devices.size()));
                    arg.where = Where::device;
                    arg.index = devices[pick];
                    devices.erase(devices.begin() + static_cast<std::ptrdiff_t>(pick));
                    arg.bytes = device_[static_cast<std::size_t>(arg.index)].bytes;
                    if (arg.bytes > 1 && choices.chance(1, 3)) {  // a part of it
                        arg.offset = choices.below(static_cast<std::uint32_t>(arg.bytes));
                        arg.bytes = 1 + choices.below(static_cast<std::uint32_t>(arg.bytes - arg.offset));
                    } else if (choices.chance(1, 16)) {
                        arg.bytes = 0;
                    }
                }
                spec.args.push_back(arg);
                FillSpec fill;
                if (choices.chance(1, 2)) {
                    std::vector<FillSpec> sources;
                    for (std::size_t b = 0; b < host_.size(); ++b) {
                        const Use use{host_[b].data, host_[b].bytes, true, false};
                        if (!written_in_flight(use) && !tainted(static_cast<int>(b))) {
                            sources.push_back(FillSpec{true, Where::host, static_cast<int>(b), 0});
                        }
                    }
                    for (const FillSpec& source : frame_outputs(true)) sources.push_back(source);
                    if (!sources.empty()) fill = sources[choices.below(static_cast<std::uint32_t>(sources.size()))];
                }
                spec.fills.push_back(fill);
            }
            return spec;
        }
        std::vector<ArgSpec> candidates;
        for (std::size_t b = 0; b < host_.size(); ++b) {
            const Use use{host_[b].data, host_[b].bytes, true, true};
            if (config_.disjoint && (used_in_flight(use) || tainted(static_cast<int>(b)))) continue;
            ArgSpec arg;
            arg.where = Where::host;
            arg.index = static_cast<int>(b);
            arg.bytes = host_[b].bytes;
            candidates.push_back(arg);
        }
        for (std::size_t d = 0; d < device_.size(); ++d) {
            ArgSpec arg;
            arg.where = Where::device;
            arg.index = static_cast<int>(d);
            arg.bytes = device_[d].bytes;
            candidates.push_back(arg);
        }
        if (!config_.disjoint) {
            for (const FillSpec& source : frame_outputs(false)) {
                ArgSpec arg;
                arg.where = Where::frame;
                arg.index = source.index;
                arg.tensor = source.tensor;
                arg.bytes = steps_[static_cast<std::size_t>(source.index)]
                                .model[static_cast<std::size_t>(source.tensor)]
                                .size();
                candidates.push_back(arg);
                candidates.push_back(arg);  // fed back often
            }
        }
        for (unsigned i = 0; i < count && !candidates.empty(); ++i) {
            const std::size_t pick = choices.below(static_cast<std::uint32_t>(candidates.size()));
            ArgSpec arg = candidates[pick];
            candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                            [&](const ArgSpec& c) {
                                                return c.where == arg.where && c.index == arg.index &&
                                                       c.tensor == arg.tensor;
                                            }),
                             candidates.end());
            if (arg.where == Where::device && !choices.chance(1, 2)) continue;  // device args less often
            arg.direction = random_direction(choices);
            if (arg.where == Where::frame && choices.chance(2, 3)) arg.direction = Direction::In;
            if (arg.bytes > 1 && choices.chance(1, 4)) {  // a part of the buffer
                arg.offset = choices.below(static_cast<std::uint32_t>(arg.bytes));
                arg.bytes = 1 + choices.below(static_cast<std::uint32_t>(arg.bytes - arg.offset));
            } else if (choices.chance(1, 24)) {
                arg.bytes = 0;
            }
            if (arg.where == Where::host) {
                const HostBuffer& buffer = host_[static_cast<std::size_t>(arg.index)];
                arg.memory = choices.chance(1, 3) ? buffer.hint : HostMemory::unknown;
            }
            spec.args.push_back(arg);
        }
        return spec;  // possibly no args at all: an empty bind
    }

    // Tensors of frames still held whose run finished: fed back as inputs (a decode loop). With
    // `owned`, only those the engine may read itself (the run known complete).
    std::vector<FillSpec> frame_outputs(bool owned) {
        std::vector<FillSpec> list;
        for (const Step& step : steps_) {
            if (!step.spec.frame || step.phase != Phase::finished || step.released) continue;
            if (owned && !step.complete) continue;
            for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
                if (step.spec.args[i].bytes == 0 || !step.defined[i]) continue;
                if (owned) {
                    const Use use{step.tensors[i], step.spec.args[i].bytes, true, false};
                    if (written_in_flight(use)) continue;
                }
                list.push_back(FillSpec{true, Where::frame, step.id, static_cast<int>(i)});
            }
        }
        return list;
    }

    // ---- plumbing -------------------------------------------------------------------------------

    void drain_streams() {
        for (std::size_t i = 0; i < streams_.size(); ++i) {
            expect_ok(backend_->record_event(kernel_events_[i], streams_[i]), "engine record_event");
            expect_ok(backend_->synchronize_event(kernel_events_[i]), "engine synchronize_event");
        }
    }

    // The next wait for an event fails; `stuck`: and so does the mock's next synchronize().
    void arm_wait_fault(bool stuck) {
        if constexpr (std::is_base_of_v<devstage::MockBackend, B>) {
            backend_->fail_call(devstage::MockOp::synchronize_event,
                                backend_->calls(devstage::MockOp::synchronize_event) + 1);
            if (stuck)
                backend_->fail_call(devstage::MockOp::synchronize, backend_->calls(devstage::MockOp::synchronize) + 1);
        } else if constexpr (std::is_same_v<B, SlowBackend>) {
            (void)stuck;
            backend_->fail_next_waits(1);
        } else {
            (void)stuck;
        }
    }
    void disarm_wait_faults() {
        if constexpr (std::is_base_of_v<devstage::MockBackend, B>) {
            backend_->clear_faults();
        } else if constexpr (std::is_same_v<B, SlowBackend>) {
            backend_->fail_next_waits(0);
        }
    }
    std::uint64_t misuses() const {
        if constexpr (std::is_base_of_v<devstage::MockBackend, B> || std::is_same_v<B, SlowBackend>) {
            return backend_->misuses();
        } else {
            return 0;
        }
    }
    std::string first_misuse() const {
        if constexpr (std::is_same_v<B, SlowBackend>) {
            return backend_->first_misuse();
        } else {
            return "(see the mock's journal)";
        }
    }

    static void leaked(void* self, const Status& status) noexcept {
        auto* runner = static_cast<Runner*>(self);
        if (runner->ok()) runner->fail("at teardown the backend reports: " + status.message());
    }
    static void sink(void* self, const Status& status) noexcept {
        auto* runner = static_cast<Runner*>(self);
        runner->sunk_.push_back(status.message());
        runner->log() << "   (error sink: " << status.message() << ")\n";
    }

    void expect_ok(const Status& status, const char* what) {
        if (!status) fail(std::string(what) + " failed: " + status.message());
    }
    void fail(const std::string& what) {
        report_.failures.push_back(what);
        log() << "   !! " << what << "\n";
        stopped_ = true;
    }
    void note(const std::string& what) {  // a failure the program can go on from
        report_.failures.push_back(what);
        log() << "   !! " << what << "\n";
    }
    Line log() { return Line(trace_); }

public:
    /// The program as it ran.
    const std::string& trace() const noexcept { return trace_; }

private:
    Config config_;
    Report& report_;
    std::unique_ptr<B> backend_;
    std::vector<HostBuffer> host_;
    std::vector<DeviceBuffer> device_;
    std::optional<devstage::Stager<B, S>> stager_;
    std::vector<Stream> streams_;
    std::vector<Event> kernel_events_, bind_events_;
    std::deque<Step> steps_;
    std::vector<std::unique_ptr<Job>> jobs_;
    std::vector<std::string> sunk_;
    std::size_t expected_sinks_ = 0;  // reports of destructors whose wait was made to fail
    std::string trace_;
    std::uint64_t finishes_ = 0;
    std::uint64_t writes_ = 0;
    OutputPolicy policy_ = OutputPolicy::zero;
    bool stopped_ = false;
};

// ---- entry points -----------------------------------------------------------------------------

/// In a child process (run_seed_isolated): where a crash writes the trace so far.
inline int crash_fd = -1;
inline const std::string* crash_trace = nullptr;

inline void on_crash(int signal) {
    if (crash_fd >= 0 && crash_trace != nullptr) {
        const char* text = crash_trace->data();
        std::size_t left = crash_trace->size();
        while (left > 0) {
            const ssize_t wrote = ::write(crash_fd, text, left);
            if (wrote <= 0) break;
            text += wrote;
            left -= static_cast<std::size_t>(wrote);
        }
    }
    std::signal(signal, SIG_DFL);
    std::raise(signal);
}

template <class B, class S>
void run_typed(const Config& config, Choices& choices, Report& report, int trace_fd) {
    Runner<B, S> runner(config, report);
    if (trace_fd >= 0) {
        crash_fd = trace_fd;
        crash_trace = &runner.trace();
        for (int signal : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) std::signal(signal, &on_crash);
    }
    runner.drive(choices);
    runner.teardown();
    report.trace = runner.trace();
    crash_trace = nullptr;
}

template <class B>
void run_on(const Config& config, Choices& choices, Report& report, int trace_fd) {
    switch (config.strategy) {
        case StrategyKind::bump:
            return run_typed<B, Bump>(config, choices, report, trace_fd);
        case StrategyKind::packed:
            return run_typed<B, Packed>(config, choices, report, trace_fd);
        case StrategyKind::per_tensor:
            return run_typed<B, PerTensor>(config, choices, report, trace_fd);
        case StrategyKind::mapped:
            return run_typed<B, Mapped>(config, choices, report, trace_fd);
    }
}

/// Runs the program `choices` gives under `config` (its trace also written to `trace_fd`).
inline Report run_program(const Config& config, Choices& choices, int trace_fd = -1) {
    Report report;
    report.config = config;
    switch (config.backend) {
        case BackendKind::mock:
            run_on<devstage::MockBackend>(config, choices, report, trace_fd);
            break;
        case BackendKind::sim:
            run_on<devstage::SimBackend>(config, choices, report, trace_fd);
            break;
        case BackendKind::slow:
            run_on<SlowBackend>(config, choices, report, trace_fd);
            break;
        case BackendKind::mock_no_memset:
            run_on<NoMemsetMock>(config, choices, report, trace_fd);
            break;
        case BackendKind::eager_mock:
            run_on<devstage::MockBackend>(config, choices, report, trace_fd);
            break;
    }
    return report;
}

/// The configuration of program `seed`: it cycles through every combination.
inline Config seed_config(std::uint64_t seed, Choices& choices, unsigned max_steps) {
    Config config = config_for(seed, choices);
    config.max_steps = max_steps;
    return config;
}

/// Program `seed`, in this process.
inline Report run_seed(std::uint64_t seed, unsigned max_steps = 14) {
    Choices choices(seed);
    const Config config = seed_config(seed, choices, max_steps);
    return run_program(config, choices);
}

/// Program `seed` in a child process, so that a stager that crashes (a use after free) is
/// reported with the trace so far instead of ending the suite.
inline Report run_seed_isolated(std::uint64_t seed, unsigned max_steps = 14) {
    int trace[2], verdict[2];
    if (::pipe(trace) != 0) return run_seed(seed, max_steps);
    if (::pipe(verdict) != 0) {
        ::close(trace[0]);
        ::close(trace[1]);
        return run_seed(seed, max_steps);
    }
    const pid_t child = ::fork();
    if (child < 0) {
        for (int fd : {trace[0], trace[1], verdict[0], verdict[1]}) ::close(fd);
        return run_seed(seed, max_steps);
    }
    if (child == 0) {
        ::close(trace[0]);
        ::close(verdict[0]);
        Choices choices(seed);
        const Config config = seed_config(seed, choices, max_steps);
        const Report report = run_program(config, choices, trace[1]);
        for (std::size_t at = 0; at < report.trace.size();) {
            const ssize_t wrote = ::write(trace[1], report.trace.data() + at, report.trace.size() - at);
            if (wrote <= 0) break;
            at += static_cast<std::size_t>(wrote);
        }
        std::string failures;
        for (const std::string& failure : report.failures) failures += failure + '\n';
        std::size_t at = 0;
        while (at < failures.size()) {
            const ssize_t wrote = ::write(verdict[1], failures.data() + at, failures.size() - at);
            if (wrote <= 0) break;
            at += static_cast<std::size_t>(wrote);
        }
        ::_exit(0);
    }
    ::close(trace[1]);
    ::close(verdict[1]);
    Report report;
    Choices choices(seed);
    report.config = seed_config(seed, choices, max_steps);
    const auto drain = [](int fd) {
        std::string text;
        char buffer[4096];
        for (;;) {
            const ssize_t got = ::read(fd, buffer, sizeof buffer);
            if (got <= 0) break;
            text.append(buffer, static_cast<std::size_t>(got));
        }
        ::close(fd);
        return text;
    };
    report.trace = drain(trace[0]);  // the child closes it when it exits
    const std::string failures = drain(verdict[0]);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
    }
    std::size_t from = 0;
    for (std::size_t end = failures.find('\n'); end != std::string::npos; end = failures.find('\n', from)) {
        report.failures.push_back(failures.substr(from, end - from));
        from = end + 1;
    }
    if (WIFSIGNALED(status)) {
        report.failures.insert(report.failures.begin(), "the program crashed with signal " +
                                                            std::to_string(WTERMSIG(status)) +
                                                            " (the trace ends where it crashed)");
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        report.failures.insert(report.failures.begin(),
                               "the program's process ended with status " + std::to_string(WEXITSTATUS(status)));
    }
    return report;
}

}  // namespace sequential
