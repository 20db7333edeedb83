// SPDX-License-Identifier: Apache-2.0
// Random programs over the C interface that use handles correctly or misuse them at random, each
// call checked against a model of what the header and docs/c_api.md say it returns.
//
// A program runs over one backend (the simulator, the fake device of fake_device.h with deferred
// streams or without streams, the CUDA stand-in runtime where it is given) and a second simulator
// whose streams and stagers are foreign to it. It makes stagers of several configurations
// (retained, packed with a pack limit, packed with map_small, per-tensor; one to three slots),
// a pinned pool, streams and events, and then, step by step, binds args or frames (synchronously
// or on a stream), runs a kernel on the host over the staged memory, finishes synchronously or on
// a stream, waits, polls and destroys completions, releases, reserves and abandons — or misuses a
// handle: drops it, uses it after it was destroyed or consumed, finishes twice, finishes on a
// stream of another backend, hands a run or frame to another stager, binds a frame twice, reads a
// frame whose memory went back, destroys a stager under its runs, frames and completions, a
// backend under its streams, a pool under its buffers, passes NULL, a handle of another kind or
// an integer devstage never handed out. The model predicts every call's code from the documented
// rules (which slots are held, which handles are live, which frames own their memory), checks
// the bytes the kernel sees (uploads) and the bytes the engine gets back wherever the model says
// they are delivered, and at the end that the fake device has nothing left allocated.
//
// DEVSTAGE_C_RANDOM_PROGRAMS and DEVSTAGE_C_RANDOM_STEPS set the count (the unit suite's is
// bounded; a long run sets them higher), DEVSTAGE_C_RANDOM_SEED the first seed.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "c_support.hpp"

namespace {

using namespace devstage::c_test;

std::uint64_t env_count(const char* name, std::uint64_t fallback) {
    const char* text = std::getenv(name);
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

const char* status_name(devstage_status s) {
    return devstage_status_name(s);
}

enum class Kind { sim, fake_streams, fake_immediate, cuda };

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::sim:
            return "sim";
        case Kind::fake_streams:
            return "fake (deferred streams)";
        case Kind::fake_immediate:
            return "fake (no streams)";
        case Kind::cuda:
            return "cuda stand-in";
    }
    return "?";
}

constexpr std::size_t kSizes[] = {1, 7, 100, 1000, 3000, 5000, 9000, 20000};

// One arg of a run: its host memory (owned by the program, never reused) and what the kernel
// must see and produce.
struct ArgRec {
    std::size_t bytes = 0;
    devstage_direction direction = DEVSTAGE_IN;
    unsigned char* host = nullptr;      // args: the engine's buffer; frames: resolved at each read
    std::vector<unsigned char> input;   // what was uploaded (In, InOut)
    std::vector<unsigned char> output;  // what the kernel wrote (Out, InOut), once it ran
    std::vector<unsigned char> before;  // the host bytes before the run (args: unchanged on failure)
};

enum class RunState { live, inert, gone };

struct RunRec {
    devstage_run* handle = nullptr;
    std::size_t stager = 0;
    int frame = -1;  // the FrameRec it bound, or -1
    std::vector<ArgRec> args;
    RunState state = RunState::live;
    bool dropped = false;
    int id = 0;
};

enum class FrameState { unbound, bound, gone };

struct FrameRec {
    devstage_frame* handle = nullptr;
    std::size_t stager = 0;
    std::size_t slot = 0;
    std::size_t tensors = 0;
    FrameState state = FrameState::unbound;
    bool memory = true;    // the frame's memory is its own (devstage_frame_host answers)
    bool unknown = false;  // a failed packed bind may have taken its slot: either answer
    bool inert = false;    // unbound, but its memory went (release, reserve, abandon)
    int run = -1;          // the RunRec that bound it
    bool dropped = false;
    std::vector<devstage_tensor_shape> shapes;
};

struct CompletionRec {
    devstage_completion* handle = nullptr;
    std::size_t stager = 0;
    int run = -1;  // its RunRec (for the data)
    bool execution_ok = true;
    bool gone = false;
    bool dropped = false;
    bool waited = false;  // a wait returned: later waits return the same
    devstage_status result = DEVSTAGE_OK;
    bool may_fail = false;    // abandoned or destroyed under it: backend_failure allowed
    bool holds_slot = false;  // a frame's run: the frame holds the slot until it is destroyed
};

struct StagerRec {
    devstage_stager* handle = nullptr;
    devstage_stager_config config{};
    std::size_t slots = 1;
    bool alive = true;
    bool abandoned = false;
    std::string what;
};

struct PoolRec {
    devstage_pinned_pool* handle = nullptr;
    std::vector<void*> live;
    std::vector<void*> freed;
    bool alive = true;
};

// Frees are recorded in the handle table only: a destroyed handle kept here is a stale one.
struct Stale {
    void* value;
    const char* kind;
};

// Where stagers and pools report what no call returns: into the program's trace.
// (A pool may report from another thread.)
struct Reports {
    std::mutex lock;
    std::vector<std::string> lines;
};
void report_to_trace(void* context, devstage_status status, const char* message) {
    auto* reports = static_cast<Reports*>(context);
    const std::lock_guard<std::mutex> hold(reports->lock);
    reports->lines.push_back(std::string("reported to the sink: ") + devstage_status_name(status) + ": " + message);
}

class Program {
public:
    Program(std::uint64_t seed, Kind kind, std::size_t steps) : seed_(seed), kind_(kind), steps_(steps), rng_(seed) {}

    void run();

private:
    // ---- checking ---------------------------------------------------------------------------
    void note(const std::string& line) {
        {
            const std::lock_guard<std::mutex> hold(reports_.lock);
            for (const std::string& report : reports_.lines) trace_.push_back(std::to_string(step_) + ": " + report);
            reports_.lines.clear();
        }
        trace_.push_back(std::to_string(step_) + ": " + line);
        if (trace_.size() > 60) trace_.pop_front();
    }
    std::string context() const {
        std::ostringstream out;
        out << "seed " << seed_ << " on " << kind_name(kind_) << ", step " << step_ << "; the last calls:\n";
        for (const std::string& line : trace_) out << "  " << line << "\n";
        return out.str();
    }
    void fail(const std::string& what) {
        if (broken_) return;
        broken_ = true;
        FAIL_CHECK(what << "\n" << context());
    }
    // The call's code must be one of `allowed`.
    bool expect(devstage_status got, std::initializer_list<devstage_status> allowed, const std::string& call) {
        note(call + " -> " + status_name(got) + (got != DEVSTAGE_OK ? std::string(" (") + last() + ")" : ""));
        ++calls;
        refused += got != DEVSTAGE_OK;
        for (devstage_status a : allowed) {
            if (a == got) return true;
        }
        std::string want;
        for (devstage_status a : allowed) want += std::string(want.empty() ? "" : " or ") + status_name(a);
        fail(call + " returned " + status_name(got) + " (" + last() + "), the model expects " + want);
        return false;
    }

    std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }
    bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

    // ---- the model's queries ----------------------------------------------------------------
    std::size_t held(std::size_t s) const {
        std::size_t n = 0;
        for (const RunRec& r : runs_) n += r.stager == s && r.state == RunState::live;
        for (const FrameRec& f : frames_) n += f.stager == s && f.state == FrameState::unbound && !f.inert;
        for (const CompletionRec& c : completions_) n += c.stager == s && !c.gone && c.holds_slot;
        return n;
    }
    bool frames_held(std::size_t s) const {
        for (const FrameRec& f : frames_) {
            if (f.stager == s && f.state == FrameState::unbound && !f.inert) return true;
        }
        for (const CompletionRec& c : completions_) {
            if (c.stager == s && !c.gone && c.holds_slot) return true;
        }
        return false;
    }
    bool live_runs(std::size_t s) const {
        for (const RunRec& r : runs_) {
            if (r.stager == s && r.state == RunState::live) return true;
        }
        return false;
    }
    // A bound frame's run ended for the engine: its slot is the stager's again.
    bool run_ended(const FrameRec& f) const {
        if (f.run < 0 || runs_[static_cast<std::size_t>(f.run)].state == RunState::live) return false;
        for (const CompletionRec& c : completions_) {
            if (c.run == f.run && !c.gone && c.holds_slot) return false;
        }
        return true;
    }
    bool packs(std::size_t s) const { return stagers_[s].config.pack_limit > 0; }
    bool retained(std::size_t s) const { return stagers_[s].config.strategy == DEVSTAGE_STRATEGY_RETAINED; }
    std::size_t active(std::size_t i) const { return active_[i]; }
    std::size_t any_active() { return active_[pick(active_.size())]; }

    template <class T>
    std::vector<std::size_t> where(const std::vector<T>& v, auto&& predicate) const {
        std::vector<std::size_t> out;
        for (std::size_t i = 0; i < v.size(); ++i) {
            if (predicate(v[i])) out.push_back(i);
        }
        return out;
    }

    // The frames of slot `slot` of stager `s` give their memory back: a later frame or bind took it.
    void slot_taken(std::size_t s, std::size_t slot, int except) {
        for (std::size_t i = 0; i < frames_.size(); ++i) {
            FrameRec& f = frames_[i];
            if (f.stager == s && f.slot == slot && static_cast<int>(i) != except && f.state != FrameState::gone) {
                if (f.state == FrameState::unbound && !f.inert) {
                    fail("a slot held by an unbound frame was taken by another bind or frame");
                }
                f.memory = false;
                f.unknown = false;
            }
        }
    }
    void all_frames_inert(std::size_t s) {
        for (FrameRec& f : frames_) {
            if (f.stager != s) continue;
            f.memory = false;
            f.unknown = false;
            if (f.state == FrameState::unbound) f.inert = true;
        }
    }

    // ---- making things ----------------------------------------------------------------------
    devstage_backend* make_backend();
    void make_stager(std::size_t position);
    devstage_stager_config random_config(std::string& what);

    // ---- the kernel -------------------------------------------------------------------------
    // Runs on the host over the run's device memory (every backend here keeps device memory in
    // host memory): checks the uploaded bytes, writes the outputs.
    void kernel(RunRec& r, devstage_stream stream);

    // ---- steps ------------------------------------------------------------------------------
    void step();
    void bind_args();
    void create_frame();
    void bind_frame();
    void finish_sync();
    void finish_stream();
    void use_completion();
    void destroy_run();
    void drop_something();
    void reuse_gone();
    void foreign();
    void bad_handles();
    void release();
    void reserve();
    void abandon();
    void pool_step();
    void scratch_stream();
    void backend_busy();
    void destroy_stager_early();
    void read_frame();
    void faulty_bind();
    void order_after();

    // Reads the run's outputs where the engine gets them and compares.
    void check_outputs(const RunRec& r, const char* when);
    void check_unchanged(const RunRec& r);
    bool frame_host_of(FrameRec& f, std::size_t i, unsigned char*& data);
    void wait_completion(CompletionRec& c);
    void teardown();

    std::uint64_t seed_;
    Kind kind_;
    std::size_t steps_;
    std::mt19937_64 rng_;
    std::size_t step_ = 0;
    bool broken_ = false;
    std::deque<std::string> trace_;
    Reports reports_;  // from the error sinks, since the last call

    fake_device* fake_ = nullptr;
    devstage_backend* backend_ = nullptr;   // the program's backend (the caller's reference)
    devstage_backend* other_ = nullptr;     // a second simulator: its streams and stagers are foreign
    std::vector<devstage_stream> streams_;  // of backend_
    devstage_stream other_stream_ = nullptr;
    devstage_stager* other_stager_ = nullptr;
    devstage_event event_ = nullptr;
    std::vector<StagerRec> stagers_;
    std::vector<std::size_t> active_;  // the two stagers in use
    std::vector<RunRec> runs_;
    std::vector<FrameRec> frames_;
    std::vector<CompletionRec> completions_;
    std::vector<PoolRec> pools_;
    std::vector<Stale> stale_;
    std::deque<std::vector<unsigned char>> memory_;  // host buffers, never freed during a program
    int next_run_id_ = 0;
    bool backend_leaks_ = false;  // an abandon forgot memory a callbacks backend frees at its end

public:
    std::size_t calls = 0;    // calls checked against the model
    std::size_t refused = 0;  // of them, calls the model expected to be refused
    std::size_t outputs = 0;  // runs whose outputs were compared byte for byte
};

devstage_backend* Program::make_backend() {
    devstage_backend* b = nullptr;
    switch (kind_) {
        case Kind::sim:
            C_OK(devstage_backend_create_sim(0, &b));
            break;
        case Kind::fake_streams:
        case Kind::fake_immediate: {
            fake_ = fake_device_create(std::size_t{1} << 30, kind_ == Kind::fake_streams ? 1 : 0);
            REQUIRE(fake_ != nullptr);
            devstage_callbacks callbacks;
            fake_device_callbacks(fake_, &callbacks);
            C_OK(devstage_backend_create_callbacks(&callbacks, &b));
            break;
        }
        case Kind::cuda:
            C_OK(devstage_backend_create_cuda(0, std::getenv("DEVSTAGE_C_TEST_CUDART"), &b));
            break;
    }
    return b;
}

devstage_stager_config Program::random_config(std::string& what) {
    devstage_stager_config c{};
    c.pipeline_slots = 1 + pick(3);
    c.output_policy = chance(0.5) ? DEVSTAGE_OUTPUT_ZERO : DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL;
    switch (pick(4)) {
        case 0:
            what = "retained";
            break;
        case 1:
            c.pack_limit = chance(0.5) ? DEVSTAGE_PACK_LIMIT_4K : 8192;
            what = "packed " + std::to_string(c.pack_limit);
            break;
        case 2:
            c.pack_limit = 8192;
            c.map_small = 1;
            what = "packed 8192 map_small";
            break;
        default:
            c.strategy = DEVSTAGE_STRATEGY_PER_TENSOR;
            what = "per_tensor";
            break;
    }
    if (c.strategy == DEVSTAGE_STRATEGY_RETAINED && chance(0.5)) {
        if (chance(0.5)) {
            c.growth = DEVSTAGE_GROWTH_GEOMETRIC;
            c.growth_numerator = 3;
            c.growth_denominator = 2;
        } else {
            c.growth = DEVSTAGE_GROWTH_GRANULAR;
            c.growth_granule = 4096;
        }
        c.grow_order = chance(0.5) ? DEVSTAGE_GROW_ALLOCATE_FIRST : DEVSTAGE_GROW_FREE_FIRST;
    }
    what += ", " + std::to_string(c.pipeline_slots) + " slot(s)";
    return c;
}

void Program::make_stager(std::size_t position) {
    StagerRec s;
    s.config = random_config(s.what);
    s.slots = s.config.pipeline_slots;
    expect(devstage_stager_create(backend_ != nullptr ? backend_ : nullptr, &s.config, &s.handle), {DEVSTAGE_OK},
           "stager_create(" + s.what + ")");
    if (broken_) return;
    expect(devstage_stager_set_error_sink(s.handle, report_to_trace, &reports_), {DEVSTAGE_OK},
           "stager_set_error_sink");
    stagers_.push_back(s);
    if (position < active_.size()) {
        active_[position] = stagers_.size() - 1;
    } else {
        active_.push_back(stagers_.size() - 1);
    }
}

void Program::kernel(RunRec& r, devstage_stream stream) {
    std::vector<void*> device(r.args.size());
    if (!expect(devstage_run_device_args(r.handle, device.data(), device.size()), {DEVSTAGE_OK}, "run_device_args")) {
        return;
    }
    if (stream != nullptr &&
        !expect(devstage_stream_synchronize(backend_, stream), {DEVSTAGE_OK}, "stream_synchronize")) {
        return;
    }
    unsigned seed = static_cast<unsigned>(r.id) & 0xFF;
    for (std::size_t k = 0; k < r.args.size(); ++k) {
        ArgRec& a = r.args[k];
        if (a.direction == DEVSTAGE_OUT) continue;
        const auto* d = static_cast<const unsigned char*>(device[k]);
        if (std::memcmp(d, a.input.data(), a.bytes) != 0) {
            fail("run " + std::to_string(r.id) + ": arg " + std::to_string(k) + " of " + std::to_string(a.bytes) +
                 " bytes is not on the device as it was uploaded");
            return;
        }
        seed = (seed * 31 + d[0] + d[a.bytes - 1] + static_cast<unsigned>(a.bytes)) & 0xFF;
    }
    for (std::size_t k = 0; k < r.args.size(); ++k) {
        ArgRec& a = r.args[k];
        if (a.direction == DEVSTAGE_IN) continue;
        auto* d = static_cast<unsigned char*>(device[k]);
        a.output.resize(a.bytes);
        for (std::size_t i = 0; i < a.bytes; ++i) {
            const unsigned old = a.direction == DEVSTAGE_IN_OUT ? a.input[i] : 0;
            a.output[i] = static_cast<unsigned char>(old + seed + 7 * k + i);
            d[i] = a.output[i];
        }
    }
}

bool Program::frame_host_of(FrameRec& f, std::size_t i, unsigned char*& data) {
    void* p = nullptr;
    std::size_t bytes = 0;
    const devstage_status s = devstage_frame_host(f.handle, i, &p, &bytes);
    const devstage_status want = f.memory && f.state != FrameState::gone ? DEVSTAGE_OK : DEVSTAGE_INVALID_ARGUMENT;
    if (!expect(s, {want, f.unknown && f.state != FrameState::gone ? DEVSTAGE_INVALID_ARGUMENT : want},
                "frame_host(" + std::to_string(i) + ") of the frame of slot " + std::to_string(f.slot) + " of stager " +
                    std::to_string(f.stager) +
                    (f.run >= 0 ? ", bound by run " + std::to_string(runs_[static_cast<std::size_t>(f.run)].id)
                                : std::string(", unbound")))) {
        return false;
    }
    if (s != DEVSTAGE_OK) {
        if (f.unknown) {  // it answers no more: its memory went
            f.memory = false;
            f.unknown = false;
        }
        if (p != nullptr || bytes != 0) fail("a refused frame_host gave an address");
        return false;
    }
    if (bytes != f.shapes[i].bytes)
        fail("frame_host gave " + std::to_string(bytes) + " bytes for a tensor of " +
             std::to_string(f.shapes[i].bytes));
    data = static_cast<unsigned char*>(p);
    return true;
}

void Program::check_outputs(const RunRec& r, const char* when) {
    ++outputs;
    for (std::size_t k = 0; k < r.args.size(); ++k) {
        const ArgRec& a = r.args[k];
        if (a.direction == DEVSTAGE_IN) continue;
        const unsigned char* host = a.host;
        if (r.frame >= 0) {
            FrameRec& f = frames_[static_cast<std::size_t>(r.frame)];
            if (f.state == FrameState::gone || !f.memory) return;  // nowhere left to read them
            unsigned char* data = nullptr;
            if (!frame_host_of(f, k, data)) return;
            host = data;
        }
        if (a.output.size() != a.bytes || std::memcmp(host, a.output.data(), a.bytes) != 0) {
            fail(std::string("run ") + std::to_string(r.id) + " " + when + ": arg " + std::to_string(k) + " (" +
                 std::to_string(a.bytes) + " bytes, " + (r.frame >= 0 ? "framed" : "args") +
                 ") is not what the kernel wrote");
            return;
        }
    }
}

void Program::check_unchanged(const RunRec& r) {
    if (r.frame >= 0) return;
    for (const ArgRec& a : r.args) {
        if (a.direction != DEVSTAGE_IN && std::memcmp(a.host, a.before.data(), a.bytes) != 0) {
            fail("run " + std::to_string(r.id) + ": a run finished with a failed execution wrote its host outputs");
            return;
        }
    }
}

void Program::bind_args() {
    const std::size_t s = any_active();
    RunRec r;
    r.stager = s;
    r.id = next_run_id_++;
    const std::size_t count = 1 + pick(4);
    std::vector<devstage_tensor_arg> args;
    for (std::size_t k = 0; k < count; ++k) {
        ArgRec a;
        a.bytes = kSizes[pick(std::size(kSizes))];
        a.direction = static_cast<devstage_direction>(pick(3));
        memory_.emplace_back(a.bytes);
        std::vector<unsigned char>& buffer = memory_.back();
        for (auto& b : buffer) b = static_cast<unsigned char>(rng_());
        a.host = buffer.data();
        a.before = buffer;
        if (a.direction != DEVSTAGE_OUT) a.input = buffer;
        args.push_back(arg(a.host, a.bytes, a.direction));
        r.args.push_back(std::move(a));
    }
    const bool on_stream = chance(0.6);
    devstage_stream stream = on_stream ? streams_[pick(streams_.size())] : nullptr;
    const devstage_status want = held(s) < stagers_[s].slots ? DEVSTAGE_OK : DEVSTAGE_BUSY;
    const devstage_status got = on_stream
                                    ? devstage_bind_on(stagers_[s].handle, args.data(), args.size(), stream, &r.handle)
                                    : devstage_bind(stagers_[s].handle, args.data(), args.size(), &r.handle);
    if (!expect(got, {want},
                std::string(on_stream ? "bind_on" : "bind") + " stager " + std::to_string(s) + " (" +
                    std::to_string(count) + " args) run " + std::to_string(r.id))) {
        return;
    }
    if (got != DEVSTAGE_OK) {
        if (r.handle != nullptr) fail("a failed bind left its run handle set");
        return;
    }
    std::size_t slot = 0;
    expect(devstage_run_slot(r.handle, &slot), {DEVSTAGE_OK}, "run_slot");
    if (packs(s)) slot_taken(s, slot, -1);
    kernel(r, stream);
    runs_.push_back(std::move(r));
}

void Program::create_frame() {
    const std::size_t s = any_active();
    FrameRec f;
    f.stager = s;
    const std::size_t count = 1 + pick(4);
    for (std::size_t k = 0; k < count; ++k) {
        f.shapes.push_back(
            devstage_tensor_shape{kSizes[pick(std::size(kSizes))], static_cast<devstage_direction>(pick(3)), nullptr});
    }
    const devstage_status want =
        !packs(s) ? DEVSTAGE_NOT_SUPPORTED : (held(s) < stagers_[s].slots ? DEVSTAGE_OK : DEVSTAGE_BUSY);
    const devstage_status got = devstage_frame_create(stagers_[s].handle, f.shapes.data(), count, &f.handle);
    if (!expect(got, {want}, "frame_create stager " + std::to_string(s) + " (" + std::to_string(count) + " tensors)")) {
        return;
    }
    if (got != DEVSTAGE_OK) {
        if (f.handle != nullptr) fail("a failed frame_create left its frame handle set");
        return;
    }
    f.tensors = count;
    expect(devstage_frame_slot(f.handle, &f.slot), {DEVSTAGE_OK}, "frame_slot");
    slot_taken(s, f.slot, static_cast<int>(frames_.size()));
    // The inputs, written in place: every tensor's place at once.
    std::vector<void*> data(count);
    std::vector<std::size_t> bytes(count);
    if (!expect(devstage_frame_hosts(f.handle, data.data(), bytes.data(), count), {DEVSTAGE_OK}, "frame_hosts")) return;
    for (std::size_t k = 0; k < count; ++k) {
        if (bytes[k] != f.shapes[k].bytes || reinterpret_cast<std::uintptr_t>(data[k]) % 1024 != 0) {
            fail("frame_hosts gave a place of the wrong size or alignment");
            return;
        }
        auto* p = static_cast<unsigned char*>(data[k]);
        for (std::size_t i = 0; i < bytes[k]; ++i) p[i] = static_cast<unsigned char>(rng_());
    }
    frames_.push_back(std::move(f));
    if (chance(0.5)) bind_frame();
}

void Program::bind_frame() {
    std::vector<std::size_t> unbound =
        where(frames_, [](const FrameRec& f) { return f.state == FrameState::unbound && !f.inert && !f.dropped; });
    if (unbound.empty()) return;
    const std::size_t fi = unbound[pick(unbound.size())];
    FrameRec& f = frames_[fi];
    const std::size_t s = f.stager;
    if (!stagers_[s].alive) return;
    RunRec r;
    r.stager = s;
    r.id = next_run_id_++;
    r.frame = static_cast<int>(fi);
    std::vector<void*> data(f.tensors);
    if (!expect(devstage_frame_hosts(f.handle, data.data(), nullptr, f.tensors), {DEVSTAGE_OK}, "frame_hosts")) return;
    for (std::size_t k = 0; k < f.tensors; ++k) {
        ArgRec a;
        a.bytes = f.shapes[k].bytes;
        a.direction = f.shapes[k].direction;
        const auto* p = static_cast<const unsigned char*>(data[k]);
        if (a.direction != DEVSTAGE_OUT) a.input.assign(p, p + a.bytes);
        r.args.push_back(std::move(a));
    }
    const bool on_stream = chance(0.6);
    devstage_stream stream = on_stream ? streams_[pick(streams_.size())] : nullptr;
    const devstage_status got = on_stream ? devstage_bind_frame_on(stagers_[s].handle, f.handle, stream, &r.handle)
                                          : devstage_bind_frame(stagers_[s].handle, f.handle, &r.handle);
    if (!expect(got, {DEVSTAGE_OK},
                std::string(on_stream ? "bind_frame_on" : "bind_frame") + " run " + std::to_string(r.id))) {
        return;
    }
    f.state = FrameState::bound;
    f.run = static_cast<int>(runs_.size());
    kernel(r, stream);
    runs_.push_back(std::move(r));
}

void Program::finish_sync() {
    std::vector<std::size_t> live = where(
        runs_, [this](const RunRec& r) { return r.state == RunState::live && !r.dropped && stagers_[r.stager].alive; });
    if (live.empty()) return;
    RunRec& r = runs_[live[pick(live.size())]];
    const bool ok = chance(0.85);
    if (!expect(devstage_finish(stagers_[r.stager].handle, r.handle, ok ? DEVSTAGE_OK : DEVSTAGE_BACKEND_FAILURE),
                {DEVSTAGE_OK}, std::string("finish run ") + std::to_string(r.id) + (ok ? "" : " (kernel failed)"))) {
        return;
    }
    r.state = RunState::gone;
    stale_.push_back({r.handle, "run"});
    if (ok) {
        check_outputs(r, "after its synchronous finish");
    } else {
        check_unchanged(r);
    }
}

void Program::finish_stream() {
    std::vector<std::size_t> live = where(
        runs_, [this](const RunRec& r) { return r.state == RunState::live && !r.dropped && stagers_[r.stager].alive; });
    if (live.empty()) return;
    const std::size_t ri = live[pick(live.size())];
    RunRec& r = runs_[ri];
    const bool ok = chance(0.9);
    CompletionRec c;
    c.stager = r.stager;
    c.run = static_cast<int>(ri);
    c.execution_ok = ok;
    c.holds_slot = r.frame >= 0;
    devstage_stream stream = streams_[pick(streams_.size())];
    if (!expect(devstage_finish_on(stagers_[r.stager].handle, r.handle, stream,
                                   ok ? DEVSTAGE_OK : DEVSTAGE_BACKEND_FAILURE, &c.handle),
                {DEVSTAGE_OK}, "finish_on run " + std::to_string(r.id) + (ok ? "" : " (kernel failed)"))) {
        return;
    }
    r.state = RunState::gone;
    stale_.push_back({r.handle, "run"});
    completions_.push_back(c);
}

void Program::wait_completion(CompletionRec& c) {
    const devstage_status got = devstage_completion_wait(c.handle);
    std::initializer_list<devstage_status> allowed = {DEVSTAGE_OK};
    std::initializer_list<devstage_status> either = {DEVSTAGE_OK, DEVSTAGE_BACKEND_FAILURE};
    const bool again = c.waited;
    if (!expect(got, again ? std::initializer_list<devstage_status>{c.result} : (c.may_fail ? either : allowed),
                std::string("completion_wait") + (again ? " (again)" : "") + " of run " +
                    std::to_string(runs_[static_cast<std::size_t>(c.run)].id))) {
        return;
    }
    c.waited = true;
    c.result = got;
    int pending = 1;
    expect(devstage_completion_pending(c.handle, &pending), {DEVSTAGE_OK}, "completion_pending");
    if (pending != 0) fail("a completion whose wait returned is still pending");
    int ready = 0;
    expect(devstage_completion_ready(c.handle, &ready), {DEVSTAGE_OK}, "completion_ready");
    if (ready != 1) fail("a completion whose wait returned is not ready");
    const RunRec& r = runs_[static_cast<std::size_t>(c.run)];
    if (got == DEVSTAGE_OK && c.execution_ok) {
        check_outputs(r, "after its completion's wait");
    } else if (!c.execution_ok) {
        check_unchanged(r);
    }
}

void Program::use_completion() {
    std::vector<std::size_t> open = where(completions_, [](const CompletionRec& c) { return !c.gone && !c.dropped; });
    if (open.empty()) return;
    CompletionRec& c = completions_[open[pick(open.size())]];
    switch (pick(4)) {
        case 0:
        case 1:
            wait_completion(c);
            break;
        case 2: {
            int ready = 0;
            expect(devstage_completion_ready(c.handle, &ready), {DEVSTAGE_OK}, "completion_ready");
            break;
        }
        default: {
            const devstage_status got = devstage_completion_destroy(c.handle);
            if (c.waited) {  // a wait ended it: the destroy only frees the handle
                expect(got, {DEVSTAGE_OK}, "completion_destroy (waited)");
            } else if (c.may_fail) {
                expect(got, {DEVSTAGE_OK, DEVSTAGE_BACKEND_FAILURE}, "completion_destroy");
            } else {
                expect(got, {DEVSTAGE_OK}, "completion_destroy");
                // It waited: the outputs are delivered (a frame's are read through the frame, whose
                // slot is the stager's again now; only args are checked here).
                const RunRec& r = runs_[static_cast<std::size_t>(c.run)];
                if (r.frame < 0 && c.execution_ok) check_outputs(r, "after its completion's destruction");
            }
            c.gone = true;
            stale_.push_back({c.handle, "completion"});
            break;
        }
    }
}

void Program::destroy_run() {
    std::vector<std::size_t> live =
        where(runs_, [](const RunRec& r) { return r.state != RunState::gone && !r.dropped; });
    if (live.empty()) return;
    RunRec& r = runs_[live[pick(live.size())]];
    expect(devstage_run_destroy(r.handle), {DEVSTAGE_OK}, "run_destroy run " + std::to_string(r.id));
    r.state = RunState::gone;
    stale_.push_back({r.handle, "run"});
    if (r.frame < 0) check_unchanged(r);
}

void Program::drop_something() {
    switch (pick(3)) {
        case 0: {
            std::vector<std::size_t> v =
                where(runs_, [](const RunRec& r) { return r.state == RunState::live && !r.dropped; });
            if (!v.empty()) {
                runs_[v[pick(v.size())]].dropped = true;
                note("drop a live run handle");
            }
            break;
        }
        case 1: {
            std::vector<std::size_t> v =
                where(frames_, [](const FrameRec& f) { return f.state != FrameState::gone && !f.dropped; });
            if (!v.empty()) {
                frames_[v[pick(v.size())]].dropped = true;
                note("drop a frame handle");
            }
            break;
        }
        default: {
            std::vector<std::size_t> v =
                where(completions_, [](const CompletionRec& c) { return !c.gone && !c.dropped; });
            if (!v.empty()) {
                completions_[v[pick(v.size())]].dropped = true;
                note("drop a completion handle, never waited or destroyed");
            }
            break;
        }
    }
}

void Program::reuse_gone() {
    const std::size_t s = any_active();
    std::vector<std::size_t> gone_runs = where(runs_, [](const RunRec& r) { return r.state == RunState::gone; });
    std::vector<std::size_t> gone_frames =
        where(frames_, [](const FrameRec& f) { return f.state == FrameState::gone; });
    std::vector<std::size_t> gone_completions = where(completions_, [](const CompletionRec& c) { return c.gone; });
    std::vector<std::size_t> bound_frames =
        where(frames_, [](const FrameRec& f) { return f.state == FrameState::bound && !f.dropped; });
    switch (pick(5)) {
        case 0:
            if (!gone_runs.empty()) {
                RunRec& r = runs_[gone_runs[pick(gone_runs.size())]];
                devstage_completion* done = nullptr;
                switch (pick(4)) {
                    case 0:
                        expect(devstage_finish(stagers_[s].handle, r.handle, DEVSTAGE_OK), {DEVSTAGE_INVALID_ARGUMENT},
                               "finish again");
                        break;
                    case 1:
                        expect(devstage_finish_on(stagers_[s].handle, r.handle, streams_[0], DEVSTAGE_OK, &done),
                               {DEVSTAGE_INVALID_ARGUMENT}, "finish_on again");
                        if (done != nullptr) fail("a refused finish_on gave a completion");
                        break;
                    case 2:
                        expect(devstage_run_destroy(r.handle), {DEVSTAGE_INVALID_ARGUMENT}, "run_destroy again");
                        break;
                    default: {
                        void* d[4];
                        expect(devstage_run_device_args(r.handle, d, r.args.size()), {DEVSTAGE_INVALID_ARGUMENT},
                               "run_device_args of a finished run");
                    }
                }
            }
            break;
        case 1:
            if (!gone_frames.empty()) {
                FrameRec& f = frames_[gone_frames[pick(gone_frames.size())]];
                devstage_run* run = nullptr;
                if (chance(0.5)) {
                    unsigned char* data = nullptr;
                    frame_host_of(f, 0, data);
                } else {
                    expect(devstage_bind_frame(stagers_[s].handle, f.handle, &run), {DEVSTAGE_INVALID_ARGUMENT},
                           "bind_frame of a destroyed frame");
                }
                if (run != nullptr) fail("a refused bind_frame gave a run");
            }
            break;
        case 2:
            if (!gone_completions.empty()) {
                CompletionRec& c = completions_[gone_completions[pick(gone_completions.size())]];
                if (chance(0.5)) {
                    expect(devstage_completion_wait(c.handle), {DEVSTAGE_INVALID_ARGUMENT},
                           "completion_wait after destroy");
                } else {
                    expect(devstage_completion_destroy(c.handle), {DEVSTAGE_INVALID_ARGUMENT},
                           "completion_destroy again");
                }
            }
            break;
        case 3:
            if (!bound_frames.empty()) {  // a frame is bound once
                FrameRec& f = frames_[bound_frames[pick(bound_frames.size())]];
                devstage_run* run = nullptr;
                const devstage_status got = devstage_bind_frame(
                    stagers_[f.stager].alive ? stagers_[f.stager].handle : stagers_[s].handle, f.handle, &run);
                expect(got, {DEVSTAGE_INVALID_ARGUMENT}, "bind_frame of a bound frame");
                if (run != nullptr) {
                    fail("a frame bound twice gave a second run");
                    (void)devstage_run_destroy(run);
                }
            }
            break;
        default:
            if (!stale_.empty()) {  // a stale handle of any kind, given as a stager
                const Stale st = stale_[pick(stale_.size())];
                devstage_stager_stats stats{};
                expect(devstage_stager_stats_get(static_cast<devstage_stager*>(st.value), &stats),
                       {DEVSTAGE_INVALID_ARGUMENT}, std::string("stats of a stale ") + st.kind + " handle");
            }
    }
}

void Program::foreign() {
    std::vector<std::size_t> live = where(
        runs_, [this](const RunRec& r) { return r.state == RunState::live && !r.dropped && stagers_[r.stager].alive; });
    switch (pick(4)) {
        case 0:
            if (!live.empty()) {  // a stream of another backend: refused, the run stays live
                RunRec& r = runs_[live[pick(live.size())]];
                devstage_completion* done = nullptr;
                expect(devstage_finish_on(stagers_[r.stager].handle, r.handle, other_stream_, DEVSTAGE_OK, &done),
                       {DEVSTAGE_INVALID_ARGUMENT},
                       "finish_on a stream of another backend, run " + std::to_string(r.id));
                if (done != nullptr) fail("a refused finish_on gave a completion");
                std::size_t slot = 0;
                expect(devstage_run_slot(r.handle, &slot), {DEVSTAGE_OK}, "run_slot of the refused run");
            }
            break;
        case 1:
            if (!live.empty()) {  // a run of another stager
                RunRec& r = runs_[live[pick(live.size())]];
                devstage_stager* stranger = other_stager_;
                for (std::size_t a : active_) {
                    if (a != r.stager && chance(0.5)) stranger = stagers_[a].handle;
                }
                expect(devstage_finish(stranger, r.handle, DEVSTAGE_OK), {DEVSTAGE_INVALID_ARGUMENT},
                       "finish on another stager, run " + std::to_string(r.id));
                void* d[4];
                expect(devstage_run_device_args(r.handle, d, r.args.size()), {DEVSTAGE_OK},
                       "run_device_args of the refused run");
            }
            break;
        case 2: {
            std::vector<std::size_t> unbound = where(
                frames_, [](const FrameRec& f) { return f.state == FrameState::unbound && !f.inert && !f.dropped; });
            if (!unbound.empty()) {
                FrameRec& f = frames_[unbound[pick(unbound.size())]];
                devstage_run* run = nullptr;
                expect(devstage_bind_frame(other_stager_, f.handle, &run), {DEVSTAGE_INVALID_ARGUMENT},
                       "bind_frame on another stager");
                if (chance(0.5) && stagers_[f.stager].alive) {
                    expect(devstage_bind_frame_on(stagers_[f.stager].handle, f.handle, other_stream_, &run),
                           {DEVSTAGE_INVALID_ARGUMENT}, "bind_frame_on a stream of another backend");
                }
                if (run != nullptr) fail("a refused bind_frame gave a run");
            }
            break;
        }
        default:
            if (!live.empty()) {
                RunRec& r = runs_[live[pick(live.size())]];
                expect(devstage_order_after_uploads(stagers_[r.stager].handle, r.handle, other_stream_),
                       {DEVSTAGE_INVALID_ARGUMENT}, "order_after_uploads on a stream of another backend");
            }
    }
}

void Program::bad_handles() {
    // NULL, an integer devstage never handed out, or a live handle of another kind.
    void* bad = nullptr;
    bool wrong_kind = false;
    std::string what = "NULL";
    switch (pick(3)) {
        case 0:
            break;
        case 1:
            bad = reinterpret_cast<void*>(static_cast<std::uintptr_t>(rng_() | 1));
            what = "a made-up integer";
            break;
        default:
            wrong_kind = true;
            what = "a handle of another kind";
    }
    const std::size_t s = any_active();
    devstage_run* run = nullptr;
    devstage_completion* done = nullptr;
    void* data = nullptr;
    std::size_t bytes = 0;
    const devstage_tensor_arg one = arg(&bytes, sizeof bytes, DEVSTAGE_IN);
    const std::size_t call = pick(7);
    if (wrong_kind) {  // live handles of every kind but the one the call takes
        const std::array<std::string, 7> takes = {"stager", "run", "stream", "frame", "completion", "pool", "stager"};
        const std::string taken = takes[call];
        std::vector<std::pair<void*, const char*>> live = {
            {backend_, "backend"}, {streams_[0], "stream"}, {pools_[0].handle, "pool"}, {stagers_[s].handle, "stager"}};
        for (const RunRec& r : runs_) {
            if (r.state != RunState::gone) live.emplace_back(r.handle, "run");
        }
        for (const FrameRec& f : frames_) {
            if (f.state != FrameState::gone) live.emplace_back(f.handle, "frame");
        }
        for (const CompletionRec& c : completions_) {
            if (!c.gone) live.emplace_back(c.handle, "completion");
        }
        std::erase_if(live, [&](const auto& h) { return taken == h.second; });
        const auto chosen = live[pick(live.size())];
        bad = chosen.first;
        what = std::string("a ") + chosen.second + " handle";
    }
    switch (call) {
        case 0:
            expect(devstage_bind(static_cast<devstage_stager*>(bad), &one, 1, &run), {DEVSTAGE_INVALID_ARGUMENT},
                   "bind on " + what);
            break;
        case 1:
            expect(devstage_finish(stagers_[s].handle, static_cast<devstage_run*>(bad), DEVSTAGE_OK),
                   {DEVSTAGE_INVALID_ARGUMENT}, "finish of " + what);
            break;
        case 2:
            expect(devstage_bind_on(stagers_[s].handle, &one, 1, static_cast<devstage_stream>(bad), &run),
                   {DEVSTAGE_INVALID_ARGUMENT}, "bind_on " + what + " as the stream");
            break;
        case 3:
            expect(devstage_frame_host(static_cast<devstage_frame*>(bad), 0, &data, &bytes),
                   {DEVSTAGE_INVALID_ARGUMENT}, "frame_host of " + what);
            break;
        case 4:
            expect(devstage_completion_wait(static_cast<devstage_completion*>(bad)), {DEVSTAGE_INVALID_ARGUMENT},
                   "completion_wait of " + what);
            break;
        case 5:
            expect(devstage_pinned_pool_allocate(static_cast<devstage_pinned_pool*>(bad), 64, &data),
                   {DEVSTAGE_INVALID_ARGUMENT}, "pool_allocate on " + what);
            break;
        default:
            if (bad == nullptr) {  // every destroy function accepts NULL
                expect(devstage_run_destroy(nullptr), {DEVSTAGE_OK}, "run_destroy(NULL)");
                expect(devstage_completion_destroy(nullptr), {DEVSTAGE_OK}, "completion_destroy(NULL)");
                expect(devstage_frame_destroy(nullptr), {DEVSTAGE_OK}, "frame_destroy(NULL)");
                expect(devstage_stager_destroy(nullptr), {DEVSTAGE_OK}, "stager_destroy(NULL)");
            } else {
                expect(devstage_stager_destroy(static_cast<devstage_stager*>(bad)), {DEVSTAGE_INVALID_ARGUMENT},
                       "stager_destroy of " + what);
            }
    }
    if (run != nullptr || done != nullptr || data != nullptr) fail("a refused call set its output");
}

void Program::release() {
    const std::size_t s = any_active();
    const bool busy = frames_held(s);
    if (!expect(devstage_stager_release(stagers_[s].handle), {busy ? DEVSTAGE_BUSY : DEVSTAGE_OK},
                "stager_release stager " + std::to_string(s))) {
        return;
    }
    if (busy) return;
    for (RunRec& r : runs_) {
        if (r.stager == s && r.state == RunState::live) r.state = RunState::inert;
    }
    all_frames_inert(s);
}

void Program::reserve() {
    const std::size_t s = any_active();
    const std::size_t bytes = 1024 + pick(64) * 1024;
    devstage_status want = DEVSTAGE_OK;
    if (!retained(s)) {
        want = DEVSTAGE_NOT_SUPPORTED;
    } else if (live_runs(s) || frames_held(s)) {
        want = DEVSTAGE_BUSY;
    }
    if (!expect(devstage_stager_reserve(stagers_[s].handle, bytes), {want}, "stager_reserve " + std::to_string(bytes)))
        return;
    if (want == DEVSTAGE_OK) all_frames_inert(s);
}

void Program::abandon() {
    const std::size_t s = any_active();
    if (!expect(devstage_stager_abandon(stagers_[s].handle), {DEVSTAGE_OK},
                "stager_abandon stager " + std::to_string(s)))
        return;
    stagers_[s].abandoned = true;
    backend_leaks_ = kind_ == Kind::fake_streams || kind_ == Kind::fake_immediate;
    for (RunRec& r : runs_) {
        if (r.stager == s && r.state == RunState::live) r.state = RunState::inert;
    }
    all_frames_inert(s);
    for (CompletionRec& c : completions_) {
        if (c.stager == s && !c.gone) {
            c.may_fail = true;
            c.holds_slot = false;
        }
    }
}

void Program::pool_step() {
    PoolRec& p = pools_[0];
    switch (pick(6)) {
        case 0:
        case 1: {
            void* host = nullptr;
            const std::size_t bytes = 1 + pick(70000);
            if (expect(devstage_pinned_pool_allocate(p.handle, bytes, &host), {DEVSTAGE_OK}, "pool_allocate")) {
                std::memset(host, 0x5A, bytes);
                p.live.push_back(host);
            }
            break;
        }
        case 2:
            if (!p.live.empty()) {
                const std::size_t i = pick(p.live.size());
                if (chance(0.5)) {
                    expect(devstage_pinned_pool_record(p.handle, p.live[i], streams_[pick(streams_.size())]),
                           {DEVSTAGE_OK}, "pool_record");
                }
                expect(devstage_pinned_pool_free(p.handle, p.live[i]), {DEVSTAGE_OK}, "pool_free");
                p.freed.push_back(p.live[i]);
                p.live.erase(p.live.begin() + static_cast<std::ptrdiff_t>(i));
            }
            break;
        case 3: {  // a pointer the pool does not hold: freed already, or never its own
            void* host = nullptr;
            if (!p.freed.empty() && chance(0.5)) {
                host = p.freed[pick(p.freed.size())];
                if (std::find(p.live.begin(), p.live.end(), host) != p.live.end()) break;  // handed out again
            } else {
                host = memory_.emplace_back(16).data();
            }
            expect(devstage_pinned_pool_free(p.handle, host), {DEVSTAGE_UNKNOWN_POINTER},
                   "pool_free of a pointer it does not hold");
            break;
        }
        case 4:
            if (!p.live.empty() && !stale_.empty()) {  // a destroyed stream
                for (const Stale& st : stale_) {
                    if (std::strcmp(st.kind, "stream") == 0) {
                        expect(devstage_pinned_pool_record(p.handle, p.live[0], static_cast<devstage_stream>(st.value)),
                               {DEVSTAGE_INVALID_ARGUMENT}, "pool_record on a destroyed stream");
                        break;
                    }
                }
            }
            break;
        default:
            expect(devstage_pinned_pool_trim(p.handle), {DEVSTAGE_OK}, "pool_trim");
    }
}

void Program::scratch_stream() {
    devstage_stream s = nullptr;
    if (!expect(devstage_stream_create(backend_, &s), {DEVSTAGE_OK}, "stream_create")) return;
    if (event_ != nullptr) {
        expect(devstage_event_record(backend_, event_, s), {DEVSTAGE_OK}, "event_record");
        int ready = 0;
        expect(devstage_event_ready(backend_, event_, &ready), {DEVSTAGE_OK}, "event_ready");
        expect(devstage_stream_wait_event(backend_, streams_[0], event_), {DEVSTAGE_OK}, "stream_wait_event");
        expect(devstage_event_synchronize(backend_, event_), {DEVSTAGE_OK}, "event_synchronize");
        expect(devstage_event_record(other_, event_, other_stream_), {DEVSTAGE_INVALID_ARGUMENT},
               "event_record through another backend");
    }
    expect(devstage_stream_destroy(backend_, s), {DEVSTAGE_OK}, "stream_destroy");
    stale_.push_back({s, "stream"});
    expect(devstage_stream_synchronize(backend_, s), {DEVSTAGE_INVALID_ARGUMENT},
           "stream_synchronize of a destroyed stream");
    expect(devstage_stream_destroy(backend_, s), {DEVSTAGE_INVALID_ARGUMENT}, "stream_destroy again");
    const std::size_t st = any_active();
    devstage_run* run = nullptr;
    std::size_t word = 0;
    const devstage_tensor_arg one = arg(&word, sizeof word, DEVSTAGE_IN);
    expect(devstage_bind_on(stagers_[st].handle, &one, 1, s, &run), {DEVSTAGE_INVALID_ARGUMENT},
           "bind_on a destroyed stream");
    if (run != nullptr) fail("a refused bind_on gave a run");
}

void Program::backend_busy() {
    // Its streams and events need the handle: refused, nothing taken.
    expect(devstage_backend_destroy(backend_), {DEVSTAGE_BUSY}, "backend_destroy under live streams");
    devstage_backend_info info{};
    expect(devstage_backend_get_info(backend_, &info), {DEVSTAGE_OK}, "backend_get_info after the refused destroy");
}

void Program::destroy_stager_early() {
    // Destroyed under its runs, frames and completions: runs inert, frames gone with its memory,
    // completions resolved; then a new stager takes its place.
    const std::size_t position = pick(active_.size());
    const std::size_t s = active_[position];
    if (!expect(devstage_stager_destroy(stagers_[s].handle), {DEVSTAGE_OK},
                "stager_destroy stager " + std::to_string(s) + " under its handles")) {
        return;
    }
    stagers_[s].alive = false;
    stale_.push_back({stagers_[s].handle, "stager"});
    for (RunRec& r : runs_) {
        if (r.stager == s && r.state == RunState::live) r.state = RunState::inert;
    }
    all_frames_inert(s);
    for (CompletionRec& c : completions_) {
        if (c.stager == s && !c.gone) {
            c.may_fail = true;
            c.holds_slot = false;
        }
    }
    // What the orphans answer now.
    for (RunRec& r : runs_) {
        if (r.stager != s || r.state != RunState::inert || r.dropped || !chance(0.5)) continue;
        void* d[4];
        expect(devstage_run_device_args(r.handle, d, r.args.size()), {DEVSTAGE_INVALID_ARGUMENT},
               "run_device_args of a run whose stager was destroyed");
        expect(devstage_finish(stagers_[any_active() == s ? active_[0] : any_active()].handle, r.handle, DEVSTAGE_OK),
               {DEVSTAGE_INVALID_ARGUMENT}, "finish of a run whose stager was destroyed, on another stager");
        break;
    }
    make_stager(position);
}

void Program::read_frame() {
    std::vector<std::size_t> v = where(frames_, [](const FrameRec& f) { return !f.dropped; });
    if (v.empty()) return;
    FrameRec& f = frames_[v[pick(v.size())]];
    unsigned char* data = nullptr;
    frame_host_of(f, pick(f.tensors == 0 ? 1 : f.tensors), data);
    if (f.state == FrameState::unbound && !f.inert && chance(0.3)) {  // an unbound frame gives its slot back
        expect(devstage_frame_destroy(f.handle), {DEVSTAGE_OK}, "frame_destroy of an unbound frame");
        f.state = FrameState::gone;
        stale_.push_back({f.handle, "frame"});
    } else if (f.state == FrameState::bound && chance(0.2)) {
        expect(devstage_frame_destroy(f.handle), {DEVSTAGE_OK}, "frame_destroy of a bound frame");
        f.state = FrameState::gone;
        stale_.push_back({f.handle, "frame"});
    }
}

void Program::faulty_bind() {
    // The fake device fails the next copy to the device or allocation: the bind fails with the
    // backend's code and takes nothing, or (a bind that makes no such call) succeeds.
    if (fake_ == nullptr) return bind_args();
    const fake_op op = std::array{FAKE_COPY_TO_DEVICE, FAKE_COPY_TO_DEVICE_ASYNC, FAKE_DEVICE_MALLOC}[pick(3)];
    fake_device_fail(fake_, op, 1);
    note("the fake device fails its next call of op " + std::to_string(static_cast<int>(op)));
    const std::size_t before = runs_.size();
    const std::size_t s = any_active();
    const bool room = held(s) < stagers_[s].slots;
    // bind_args expects ok: the fault's outcome is checked here instead.
    std::vector<devstage_tensor_arg> args;
    RunRec r;
    r.stager = s;
    r.id = next_run_id_++;
    for (std::size_t k = 0; k < 2; ++k) {
        ArgRec a;
        a.bytes = kSizes[pick(std::size(kSizes))];
        a.direction = k == 0 ? DEVSTAGE_IN : DEVSTAGE_OUT;
        memory_.emplace_back(a.bytes, static_cast<unsigned char>(k + 1));
        a.host = memory_.back().data();
        a.before = memory_.back();
        if (a.direction == DEVSTAGE_IN) a.input = memory_.back();
        args.push_back(arg(a.host, a.bytes, a.direction));
        r.args.push_back(std::move(a));
    }
    devstage_stream stream = chance(0.5) ? streams_[0] : nullptr;
    const devstage_status got = stream != nullptr
                                    ? devstage_bind_on(stagers_[s].handle, args.data(), 2, stream, &r.handle)
                                    : devstage_bind(stagers_[s].handle, args.data(), 2, &r.handle);
    fake_device_fail(fake_, op, 0);
    if (!room) {
        expect(got, {DEVSTAGE_BUSY}, "bind (fault armed, no slot)");
        return;
    }
    const devstage_status fault = op == FAKE_DEVICE_MALLOC ? DEVSTAGE_OUT_OF_MEMORY : DEVSTAGE_BACKEND_FAILURE;
    if (!expect(got, {DEVSTAGE_OK, fault},
                "bind with a fault armed, stager " + std::to_string(s) + ", run " + std::to_string(r.id))) {
        return;
    }
    if (got != DEVSTAGE_OK) {
        if (r.handle != nullptr) fail("a failed bind left its run handle set");
        // The bind chose a slot before it failed: a packed bind may have written that slot's
        // mirror, so a frame of a run that ended there may have given its memory back. Which
        // slot is not told: every such frame of the stager answers either way from now on.
        for (FrameRec& f : frames_) {
            if (f.stager == s && f.state == FrameState::bound && f.memory && run_ended(f)) f.unknown = true;
        }
        return;
    }
    std::size_t slot = 0;
    expect(devstage_run_slot(r.handle, &slot), {DEVSTAGE_OK}, "run_slot");
    if (packs(s)) slot_taken(s, slot, -1);
    kernel(r, stream);
    runs_.push_back(std::move(r));
    (void)before;
}

void Program::order_after() {
    std::vector<std::size_t> live = where(
        runs_, [this](const RunRec& r) { return r.state == RunState::live && !r.dropped && stagers_[r.stager].alive; });
    if (live.empty()) return;
    RunRec& r = runs_[live[pick(live.size())]];
    expect(devstage_order_after_uploads(stagers_[r.stager].handle, r.handle, streams_[pick(streams_.size())]),
           {DEVSTAGE_OK}, "order_after_uploads run " + std::to_string(r.id));
}

void Program::step() {
    static constexpr int weights[] = {14, 8, 6, 8, 8, 10, 2, 2, 5, 5, 5, 3, 2, 1, 6, 2, 1, 1, 4, 2, 2};
    int total = 0;
    for (int w : weights) total += w;
    int roll = static_cast<int>(pick(static_cast<std::size_t>(total)));
    int which = 0;
    while (roll >= weights[which]) roll -= weights[which++];
    switch (which) {
        case 0:
            bind_args();
            break;
        case 1:
            create_frame();
            break;
        case 2:
            bind_frame();
            break;
        case 3:
            finish_sync();
            break;
        case 4:
            finish_stream();
            break;
        case 5:
            use_completion();
            break;
        case 6:
            destroy_run();
            break;
        case 7:
            drop_something();
            break;
        case 8:
            reuse_gone();
            break;
        case 9:
            foreign();
            break;
        case 10:
            bad_handles();
            break;
        case 11:
            release();
            break;
        case 12:
            reserve();
            break;
        case 13:
            abandon();
            break;
        case 14:
            pool_step();
            break;
        case 15:
            scratch_stream();
            break;
        case 16:
            backend_busy();
            break;
        case 17:
            destroy_stager_early();
            break;
        case 18:
            read_frame();
            break;
        case 19:
            faulty_bind();
            break;
        default:
            order_after();
            break;
    }
}

void Program::teardown() {
    // Every handle left, in a random order: stagers, pools, runs, frames, completions (dropped
    // ones included), streams, the event, the backends; a backend is busy until its streams and
    // event are gone.
    enum What { stager, pool, run, frame, completion, stream, event, backend, other };
    std::vector<std::pair<What, std::size_t>> left;
    for (std::size_t i = 0; i < stagers_.size(); ++i) {
        if (stagers_[i].alive) left.emplace_back(stager, i);
    }
    for (std::size_t i = 0; i < pools_.size(); ++i) left.emplace_back(pool, i);
    for (std::size_t i = 0; i < runs_.size(); ++i) {
        if (runs_[i].state != RunState::gone) left.emplace_back(run, i);
    }
    for (std::size_t i = 0; i < frames_.size(); ++i) {
        if (frames_[i].state != FrameState::gone) left.emplace_back(frame, i);
    }
    for (std::size_t i = 0; i < completions_.size(); ++i) {
        if (!completions_[i].gone) left.emplace_back(completion, i);
    }
    for (std::size_t i = 0; i < streams_.size(); ++i) left.emplace_back(stream, i);
    if (event_ != nullptr) left.emplace_back(event, 0);
    left.emplace_back(backend, 0);
    left.emplace_back(other, 0);
    // A stream outlives the runs bound on it: a C stream destroyed under a live run leaves the
    // stager's release failing (reported), so the streams go after the stagers and runs.
    const auto streams_first = std::stable_partition(left.begin(), left.end(), [](const auto& item) {
        return item.first != stream && item.first != event && item.first != backend && item.first != other;
    });
    std::shuffle(left.begin(), streams_first, rng_);
    std::shuffle(streams_first, left.end(), rng_);
    std::size_t streams_left = streams_.size() + (event_ != nullptr ? 1 : 0);
    std::size_t owners_left = 0;  // stagers and pools of backend_ still alive
    for (auto& [what, i] : left) owners_left += what == stager || what == pool;
    bool other_streams = true;
    for (std::size_t guard = 0; !left.empty() && guard < 10000; ++guard) {
        const auto [what, i] = left.front();
        left.erase(left.begin());
        switch (what) {
            case stager:
                expect(devstage_stager_destroy(stagers_[i].handle), {DEVSTAGE_OK}, "teardown: stager_destroy");
                stagers_[i].alive = false;
                for (CompletionRec& c : completions_) {
                    if (c.stager == i) c.may_fail = true;
                }
                for (RunRec& r : runs_) {
                    if (r.stager == i && r.state == RunState::live) r.state = RunState::inert;
                }
                --owners_left;
                break;
            case pool:
                expect(devstage_pinned_pool_destroy(pools_[i].handle),
                       {pools_[i].live.empty() ? DEVSTAGE_OK : DEVSTAGE_LEAKED}, "teardown: pool_destroy");
                --owners_left;
                break;
            case run:
                expect(devstage_run_destroy(runs_[i].handle), {DEVSTAGE_OK}, "teardown: run_destroy");
                break;
            case frame:
                expect(devstage_frame_destroy(frames_[i].handle), {DEVSTAGE_OK}, "teardown: frame_destroy");
                break;
            case completion: {
                CompletionRec& c = completions_[i];
                const devstage_status got = devstage_completion_destroy(c.handle);
                if (c.waited) {
                    expect(got, {DEVSTAGE_OK}, "teardown: completion_destroy (waited)");
                } else {
                    expect(got, {DEVSTAGE_OK, c.may_fail ? DEVSTAGE_BACKEND_FAILURE : DEVSTAGE_OK},
                           "teardown: completion_destroy");
                }
                break;
            }
            case stream:
                expect(devstage_stream_destroy(backend_, streams_[i]), {DEVSTAGE_OK}, "teardown: stream_destroy");
                --streams_left;
                break;
            case event:
                expect(devstage_event_destroy(backend_, event_), {DEVSTAGE_OK}, "teardown: event_destroy");
                --streams_left;
                break;
            case backend: {
                const devstage_status got = devstage_backend_destroy(backend_);
                if (streams_left > 0) {
                    expect(got, {DEVSTAGE_BUSY}, "teardown: backend_destroy under streams");
                    left.emplace_back(backend, 0);
                } else if (backend_leaks_ && owners_left == 0) {
                    expect(got, {DEVSTAGE_OK, DEVSTAGE_LEAKED}, "teardown: backend_destroy");
                } else {
                    expect(got, {DEVSTAGE_OK}, "teardown: backend_destroy");
                }
                break;
            }
            case other:
                if (other_streams) {
                    expect(devstage_stager_destroy(other_stager_), {DEVSTAGE_OK}, "teardown: the other stager");
                    expect(devstage_stream_destroy(other_, other_stream_), {DEVSTAGE_OK}, "teardown: the other stream");
                    other_streams = false;
                }
                expect(devstage_backend_destroy(other_), {DEVSTAGE_OK}, "teardown: the other backend");
                break;
        }
    }
}

void Program::run() {
    backend_ = make_backend();
    C_OK(devstage_backend_create_sim(0, &other_));
    C_OK(devstage_stream_create(other_, &other_stream_));
    C_OK(devstage_stager_create(other_, nullptr, &other_stager_));
    for (int i = 0; i < 2; ++i) {
        devstage_stream s = nullptr;
        C_OK(devstage_stream_create(backend_, &s));
        streams_.push_back(s);
    }
    C_OK(devstage_event_create(backend_, &event_));
    PoolRec pool;
    C_OK(devstage_pinned_pool_create(backend_, std::size_t{1} << 20, &pool.handle));
    C_OK(devstage_pinned_pool_set_error_sink(pool.handle, report_to_trace, &reports_));
    pools_.push_back(pool);
    make_stager(0);
    make_stager(1);
    for (step_ = 0; step_ < steps_ && !broken_; ++step_) step();
    ++step_;
    if (!broken_) {
        // Every completion still held is waited for and checked before the teardown.
        for (CompletionRec& c : completions_) {
            if (!c.gone && !c.dropped && !broken_) wait_completion(c);
        }
        teardown();
    } else {
        // Best effort, unchecked: give everything back so that the next program starts clean.
        for (StagerRec& s : stagers_) {
            if (s.alive) (void)devstage_stager_destroy(s.handle);
        }
        for (RunRec& r : runs_) (void)devstage_run_destroy(r.handle);
        for (FrameRec& f : frames_) (void)devstage_frame_destroy(f.handle);
        for (CompletionRec& c : completions_) (void)devstage_completion_destroy(c.handle);
        (void)devstage_pinned_pool_destroy(pools_[0].handle);
        for (devstage_stream s : streams_) (void)devstage_stream_destroy(backend_, s);
        (void)devstage_event_destroy(backend_, event_);
        (void)devstage_backend_destroy(backend_);
        (void)devstage_stager_destroy(other_stager_);
        (void)devstage_stream_destroy(other_, other_stream_);
        (void)devstage_backend_destroy(other_);
    }
    if (fake_ != nullptr) {
        if (!broken_) {
            INFO(context());
            CHECK(fake_device_live_device(fake_) == 0);
            CHECK(fake_device_live_pinned(fake_) == 0);
            CHECK(fake_device_live_streams(fake_) == 0);
            CHECK(fake_device_live_events(fake_) == 0);
        }
        fake_device_destroy(fake_);
    }
}

}  // namespace

TEST_CASE("c random programs: handles used and misused against the model", "[c_api][random]") {
    const std::uint64_t programs = env_count("DEVSTAGE_C_RANDOM_PROGRAMS", 60);
    const std::uint64_t steps = env_count("DEVSTAGE_C_RANDOM_STEPS", 150);
    const std::uint64_t first = env_count("DEVSTAGE_C_RANDOM_SEED", 1);
    std::vector<Kind> kinds = {Kind::sim, Kind::fake_streams, Kind::fake_immediate};
    if (std::getenv("DEVSTAGE_C_TEST_CUDART") != nullptr) {
        kinds.push_back(Kind::cuda);
    } else {
        WARN("DEVSTAGE_C_TEST_CUDART is not set: the CUDA stand-in's programs are skipped");
    }
    std::size_t calls = 0, refused = 0, outputs = 0;
    for (std::uint64_t p = 0; p < programs; ++p) {
        const std::uint64_t seed = first + p;
        const Kind kind = kinds[seed % kinds.size()];
        Program program(seed, kind, steps);
        program.run();
        calls += program.calls;
        refused += program.refused;
        outputs += program.outputs;
    }
    std::printf(
        "c random programs: %llu programs of %llu steps, %zu calls checked (%zu refused as the model "
        "predicted), %zu runs' outputs compared\n",
        static_cast<unsigned long long>(programs), static_cast<unsigned long long>(steps), calls, refused, outputs);
    // Every program made its calls, refused some and delivered some outputs (a model that never
    // reaches a check checks nothing).
    CHECK(calls >= programs * steps / 2);
    CHECK(refused > 0);
    CHECK(outputs > 0);
}
