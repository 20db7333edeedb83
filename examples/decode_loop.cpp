// SPDX-License-Identifier: Apache-2.0
// The main example: a decode loop as an engine runs it, once per strategy. The weights, RoPE
// tables and KV cache of a Qwen3-14B-shaped model (qwen3_decode.hpp) stay on the device: they
// are uploaded once, then passed to every step as Placement::Device args. Each step binds only
// its own inputs (tokens, positions, block table, temperatures) and copies back its logits. A
// kernel stand-in computes the step on the device's data (decode_step.hpp); the host checks
// every step's logits, and the KV cache at the end, against the same arithmetic run on its own
// copies, and one line says PASS or FAIL (exit status 1). The summary gives, per step, the
// device allocations and copies each strategy made, and on the simulator what its copies cost
// on two modeled links against the limit of one copy each way.
//
//   decode_loop [--steps N] [--scale S] [--strategy all|both|retained|per-tensor|packed|mapped]
//               [--async|--sync] [--pageable] [--backend sim|ascend] [--link both|h200|ascend]
// --strategy both is PerTensorMalloc and RetainedBump; all adds RetainedBump with PackSmall
// and, on the simulator, RetainedBump with MapSmall (mapped: that one alone), whose kernel
// reads the 4 inputs in the stager's mapped pinned mirror: no copy in. The simulator's link
// model charges those reads (SimBackend::launch_kernel), and the run fails unless each step
// made no copy in, one copy out (the logits, above the limit) and read the inputs mapped.
// --async (the default on a backend with streams) binds and finishes each step on a stream
// over two pipeline slots; the kernel stand-in is a kernel launched with its accesses
// (launch_kernel) on that stream on the simulator, and otherwise (Ascend) runs on the host once
// the bind's uploads completed. --sync binds and finishes synchronously, one step at a time
// (on the simulator the kernel is launched on a stream of its own and waited for).
// --pageable puts the step's inputs and logits in pageable host memory instead of pinned.
// --link chooses the simulator's link models (SimLinkModel::h200(), ascend_a2a3()).
// --backend ascend runs on Ascend device 0 through CANN ACL (libascendcl.so, or
// $DEVSTAGE_ACL_LIBRARY), where the link is not modeled.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "decode_step.hpp"
#include "devstage/backends/ascend.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"
#include "qwen3_decode.hpp"

namespace {

using PackedBump = devstage::RetainedBump<devstage::ExactGrowth, 1024, devstage::PackSmall<>>;
using MappedBump = devstage::RetainedBump<devstage::ExactGrowth, 1024, devstage::MapSmall<>>;
static_assert(devstage::MapSmall<>::limit == devstage::PackSmall<>::limit);
using Args = std::array<devstage::TensorArg, decode::arg_count>;

struct Options {
    int steps = 30;
    double scale = 0.002;
    std::string strategy = "all";
    std::string backend = "sim";
    std::optional<std::string> link;  // unset: both, on the simulator
    std::optional<bool> async;        // unset: on where the backend has streams
    bool pageable = false;
};

// A link model the simulator runs with.
struct Link {
    const char* option;  // its --link value
    const char* name;
    const char* preset;
    devstage::SimLinkModel model;
};

// The counters at one point of the loop: the stager's, and the simulator's modeled link time,
// bounced bytes and the bytes kernels read and wrote in mapped host memory.
struct Sample {
    devstage::StagerStats stager;
    std::uint64_t modeled_ns = 0, bounced = 0, mapped_read = 0, mapped_written = 0;
};

// A counter's smallest and largest value over the steady steps.
struct PerStep {
    std::uint64_t low = std::numeric_limits<std::uint64_t>::max(), high = 0;
    void add(std::uint64_t value) {
        low = std::min(low, value);
        high = std::max(high, value);
    }
};

// One strategy's run on one backend.
struct Report {
    const Link* link = nullptr;  // null on a device, where the link is not modeled
    const char* strategy = "";
    int warmup = 1;  // the first step of each pipeline slot: it allocates
    PerStep mallocs, frees, copies_in, copies_out, zeroing, modeled_ns, bounced;
    PerStep bytes_in, bytes_out;                                               // the stager's copies, each way
    PerStep mapped_runs, mapped_read, mapped_written;                          // the kernel's accesses to mapped memory
    PerStep mapped_ns;                                                         // their modeled cost, in modeled_ns too
    std::uint64_t warmup_mallocs = 0, warmup_buffers = 0, warmup_retries = 0;  // over the warm-up steps
    std::uint64_t limit_ns = 0;     // one copy each way of the step's bytes, on the link
    std::uint64_t resident_ns = 0;  // the one upload of the resident tensors, on the link
};

// The simulator's modeled link time so far; 0 elsewhere.
template <class B>
std::uint64_t modeled_ns(const B& backend) {
    if constexpr (std::is_same_v<B, devstage::SimBackend>) {
        return backend.stats().modeled_ns;
    } else {
        (void)backend;
        return 0;
    }
}

template <class B, class Strategy>
Sample sample(const B& backend, const devstage::Stager<B, Strategy>& stager) {
    if constexpr (std::is_same_v<B, devstage::SimBackend>) {
        const devstage::SimStats& sim = backend.stats();
        return Sample{stager.stats(), sim.modeled_ns, sim.bounced_bytes, sim.mapped_read_bytes, sim.mapped_write_bytes};
    } else {
        return Sample{stager.stats()};
    }
}

// Whether the host can dereference the backend's device memory: the simulator keeps it in
// host memory.
template <class B>
inline constexpr bool host_addressable = std::is_same_v<B, devstage::SimBackend>;

devstage::Status out_of_range() {
    return devstage::Status(devstage::Errc::invalid_argument,
                            "the kernel stand-in found a step input out of its range on the device");
}

// The kernel stand-in: decode::step on a run's device args. Where the host can read device
// memory (the simulator) it runs on that memory, mapped host memory included, and is launched
// with what it touches: every arg, read where it is uploaded and written where it is copied
// back, as its direction says. Elsewhere it copies the tensors step() reads to the host, runs
// there, and copies back what step() wrote: the KV cache and the logits.
template <class B>
class Kernel {
public:
    explicit Kernel(B& backend) : backend_(&backend) {}

    // The run's device args (the same sizes every step).
    void bind(std::span<const devstage::TensorArg> device_args) {
        std::copy(device_args.begin(), device_args.end(), args_.begin());
        for (std::size_t i = 0; i < args_.size(); ++i) {
            accesses_[i] = devstage::KernelAccess{args_[i].data, args_[i].bytes, devstage::uploads(args_[i].direction),
                                                  devstage::copies_back(args_[i].direction)};
        }
        if constexpr (!host_addressable<B>) {
            for (std::size_t i : read) scratch_[i].resize(args_[i].bytes);
            scratch_[decode::logits].resize(args_[decode::logits].bytes);
        }
    }

    devstage::Status run() noexcept {
        if constexpr (host_addressable<B>) {
            return decode::step(decode::view(args_)) ? devstage::Status{} : out_of_range();
        } else {
            Args host = args_;
            for (std::size_t i : read) {
                host[i].data = scratch_[i].data();
                if (auto s = backend_->copy_from_device(host[i].data, args_[i].data, args_[i].bytes); !s) return s;
            }
            host[decode::logits].data = scratch_[decode::logits].data();
            if (!decode::step(decode::view(host))) return out_of_range();
            for (std::size_t i : written) {
                if (auto s = backend_->copy_to_device(args_[i].data, host[i].data, args_[i].bytes); !s) return s;
            }
            return {};
        }
    }

    // As a host function on a stream: the status is read once the step's Completion was waited on.
    static void on_stream(void* self) noexcept {
        auto* kernel = static_cast<Kernel*>(self);
        kernel->status_ = kernel->run();
    }
    // Enqueues run() on `stream`: with its accesses where the backend takes them (the simulator
    // charges the mapped ones to its link model), else as a plain host function.
    template <class Stream>
    devstage::Status launch(Stream stream) noexcept {
        if constexpr (devstage::KernelAccessBackend<B>) {
            return backend_->launch_kernel(stream, &Kernel::on_stream, this, accesses_);
        } else {
            return backend_->launch_host_func(stream, &Kernel::on_stream, this);
        }
    }
    const devstage::Status& status() const { return status_; }
    void set_status(devstage::Status status) { status_ = std::move(status); }

private:
    static constexpr std::array<std::size_t, 9> read{decode::tokens,       decode::positions, decode::block_table,
                                                     decode::temperatures, decode::k_proj,    decode::v_proj,
                                                     decode::o_proj,       decode::key_cache, decode::value_cache};
    static constexpr std::array<std::size_t, 3> written{decode::key_cache, decode::value_cache, decode::logits};
    B* backend_;
    Args args_{};
    std::array<devstage::KernelAccess, decode::arg_count> accesses_{};
    std::array<std::vector<std::byte>, decode::arg_count> scratch_;
    devstage::Status status_;
};

// The resident tensors on the device: uploaded once with the backend's own copy, freed at the
// end of the run.
template <class B>
class Resident {
public:
    Resident(B& backend, const qwen3::Inputs& model) : backend_(backend) {
        for (std::size_t row = 1; row <= decode::resident_count; ++row) {
            const devstage::TensorArg& host = model.args[row];
            auto device = backend.device_malloc(host.bytes);
            if (!device) {
                status_ = device.status();
                return;
            }
            pointers_.push_back(*device);
            if (auto s = backend.copy_to_device(*device, host.data, host.bytes); !s) {
                status_ = s;
                return;
            }
        }
    }
    Resident(const Resident&) = delete;
    Resident& operator=(const Resident&) = delete;
    ~Resident() {
        for (void* pointer : pointers_) (void)backend_.device_free(pointer);
    }

    const devstage::Status& status() const { return status_; }
    // The device arg of qwen3::table() row `row` (1-14).
    devstage::TensorArg arg(const qwen3::Inputs& model, std::size_t row) const {
        const devstage::TensorArg& host = model.args[row];
        return devstage::TensorArg{pointers_[row - 1], host.bytes, host.direction, devstage::Placement::Device};
    }

private:
    B& backend_;
    std::vector<void*> pointers_;
    devstage::Status status_;
};

// The host reference: the same arithmetic on the host's copies of the weights, on a cache of
// its own that starts as the one uploaded, and on the step's inputs as the host wrote them.
class Reference {
public:
    explicit Reference(const qwen3::Inputs& model) {
        for (std::size_t row = 1; row <= decode::resident_count; ++row)
            args_[decode::resident_arg(row)] = model.args[row];
        for (std::size_t i : {decode::key_cache, decode::value_cache}) {
            const auto* data = static_cast<const std::byte*>(args_[i].data);
            cache_[i == decode::key_cache ? 0 : 1].assign(data, data + args_[i].bytes);
            args_[i].data = cache_[i == decode::key_cache ? 0 : 1].data();
        }
        logits_.resize(decode::batch * decode::vocab);
        args_[decode::logits] = devstage::TensorArg{logits_.data(), decode::logits_bytes};
    }

    // Runs step `step` on the inputs of `slot` and compares its logits: empty when they are
    // equal, else where they differ.
    std::string check(int step, const Args& slot) {
        for (std::size_t i = decode::tokens; i < decode::first_resident; ++i) args_[i] = slot[i];
        if (!decode::step(decode::view(args_))) return "the host's own inputs are out of range";
        const auto* got = static_cast<const float*>(slot[decode::logits].data);
        const auto [at, expected] = std::mismatch(got, got + logits_.size(), logits_.data(),
                                                  [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; });
        if (at == got + logits_.size()) return {};
        const auto index = static_cast<std::size_t>(at - got);
        char text[160];
        std::snprintf(text, sizeof text, "step %d: logit %zu of sequence %zu is %g, the host reference's %g", step + 1,
                      index % decode::vocab, index / decode::vocab, static_cast<double>(*at),
                      static_cast<double>(*expected));
        return text;
    }

    // The reference's cache (key_cache or value_cache).
    std::span<const std::byte> cache(std::size_t arg) const { return cache_[arg == decode::key_cache ? 0 : 1]; }

private:
    Args args_{};
    std::array<std::vector<std::byte>, 2> cache_;
    std::vector<float> logits_;
};

// Everything one backend's runs share: the model's host tensors (the caches prefilled), the
// batch, and each pipeline slot's args, whose inputs and logits lie in host memory.
struct Host {
    const Options& options;
    const qwen3::Inputs& model;
    const decode::Batch& batch;
    std::vector<Args>& slots;
};

// Keeps the first failure's description; false.
bool fail(std::string& failure, const std::string& what) {
    if (failure.empty()) failure = what;
    return false;
}
// True when `status` is ok; else keeps what failed and returns false.
bool succeeded(std::string& failure, const char* what, int step, const devstage::Status& status) {
    if (status) return true;
    return fail(failure, std::string(what) + " of step " + std::to_string(step + 1) + " failed: " + status.message());
}

// The device args of a run pass the resident tensors through untouched.
bool passed_through(std::span<const devstage::TensorArg> device_args, const Args& args) {
    for (std::size_t i = decode::first_resident; i < decode::logits; ++i) {
        if (device_args[i].data != args[i].data || device_args[i].placement != devstage::Placement::Device)
            return false;
    }
    return true;
}

// The steps of one run, stream-ordered over the host's pipeline slots, or one at a time.
// `check(step)` is called once step `step` completed, in step order; `record()` after every
// step.
template <class Strategy, class B, class Check, class Record>
bool run_steps(const Host& host, B& backend, std::vector<Kernel<B>>& kernels, std::string& failure, Check check,
               Record record) {
    const std::size_t slots = host.slots.size();
    if constexpr (devstage::AsyncBackend<B>) {
        if (*host.options.async) {
            auto stream = backend.create_stream();
            if (!stream) return succeeded(failure, "create_stream", 0, stream.status());
            std::optional<typename B::Event> bound;  // the host waits on it where the kernel runs on the host
            if constexpr (!devstage::HostFunctionBackend<B>) {
                auto event = backend.create_event();
                if (!event) return succeeded(failure, "create_event", 0, event.status());
                bound = *event;
            }
            bool ok = true;
            {
                devstage::Stager<B, Strategy> stager(backend, {}, slots);
                std::vector<devstage::Completion> pending(slots);
                record(stager);
                // Waits for step `step`'s copy-backs and its kernel's status, then checks it.
                const auto complete = [&](int step) {
                    const std::size_t slot = static_cast<std::size_t>(step) % slots;
                    return succeeded(failure, "copy-back", step, pending[slot].wait()) &&
                           succeeded(failure, "kernel", step, kernels[slot].status()) && check(step);
                };
                for (int step = 0; ok && step < host.options.steps; ++step) {
                    const std::size_t slot = static_cast<std::size_t>(step) % slots;
                    host.batch.fill(step, host.slots[slot]);
                    auto run = stager.bind(host.slots[slot], *stream);
                    if (!(ok = succeeded(failure, "bind", step, run.status()))) break;
                    if (!passed_through(run->device_args(), host.slots[slot])) {
                        ok = fail(failure, "bind moved a Placement::Device arg");
                        break;
                    }
                    Kernel<B>& kernel = kernels[slot];
                    kernel.bind(run->device_args());
                    devstage::Status launched;
                    if constexpr (devstage::HostFunctionBackend<B>) {
                        launched = kernel.launch(*stream);
                    } else {
                        launched = backend.record_event(*bound, *stream);
                        if (launched) launched = backend.synchronize_event(*bound);
                        if (launched) kernel.set_status(kernel.run());
                    }
                    auto done = stager.finish(std::move(*run), *stream, launched);
                    if (!(ok = succeeded(failure, "kernel launch", step, launched) &&
                               succeeded(failure, "finish", step, done.status()))) {
                        break;
                    }
                    pending[slot] = std::move(*done);
                    if (step > 0 && !(ok = complete(step - 1))) break;
                    record(stager);
                }
                ok = ok && complete(host.options.steps - 1);
                for (auto& completion : pending) (void)completion.wait();
                if (auto released = stager.release(); !released) ok = fail(failure, released.message());
            }
            if (bound) (void)backend.destroy_event(*bound);
            (void)backend.destroy_stream(*stream);
            return ok;
        }
    }
    // Where kernels are launched with their accesses (the simulator), the kernel runs on a
    // stream of its own and the host waits for it; elsewhere it runs on the host.
    struct KernelStream {
        B& backend;
        std::optional<devstage::Result<typename B::Stream>> stream;
        ~KernelStream() {
            if (stream && *stream) (void)backend.destroy_stream(**stream);
        }
    } kernel_stream{backend, std::nullopt};
    if constexpr (devstage::KernelAccessBackend<B>) {
        kernel_stream.stream.emplace(backend.create_stream());
        if (!*kernel_stream.stream) return succeeded(failure, "create_stream", 0, kernel_stream.stream->status());
    }
    const auto execute = [&](Kernel<B>& kernel) -> devstage::Status {
        if constexpr (devstage::KernelAccessBackend<B>) {
            if (auto launched = kernel.launch(**kernel_stream.stream); !launched) return launched;
            if (auto waited = backend.synchronize(); !waited) return waited;
            return kernel.status();
        } else {
            devstage::Status executed = kernel.run();
            if constexpr (devstage::SynchronizingBackend<B>) {
                if (executed) executed = backend.synchronize();
            }
            return executed;
        }
    };
    devstage::Stager<B, Strategy> stager(backend);
    record(stager);
    for (int step = 0; step < host.options.steps; ++step) {
        host.batch.fill(step, host.slots[0]);
        auto run = stager.bind(host.slots[0]);
        if (!succeeded(failure, "bind", step, run.status())) return false;
        if (!passed_through(run->device_args(), host.slots[0]))
            return fail(failure, "bind moved a Placement::Device arg");
        kernels[0].bind(run->device_args());
        const devstage::Status executed = execute(kernels[0]);
        const devstage::Status finished = stager.finish(std::move(*run), executed);
        if (!succeeded(failure, "kernel", step, executed) || !succeeded(failure, "finish", step, finished) ||
            !check(step)) {
            return false;
        }
        record(stager);
    }
    if (auto released = stager.release(); !released) return fail(failure, released.message());
    return true;
}

// One strategy's run: uploads the resident tensors, runs the steps, checks every step and the
// caches at the end.
template <class Strategy, class B>
bool run_strategy(const Host& host, B& backend, Report& report, std::string& failure) {
    const std::uint64_t before_upload = modeled_ns(backend);
    Resident<B> resident(backend, host.model);
    if (!resident.status())
        return fail(failure, "the upload of the resident tensors failed: " + resident.status().message());
    report.resident_ns = modeled_ns(backend) - before_upload;
    for (Args& args : host.slots) {
        for (std::size_t row = 1; row <= decode::resident_count; ++row)
            args[decode::resident_arg(row)] = resident.arg(host.model, row);
    }
    Reference reference(host.model);
    std::vector<Kernel<B>> kernels(host.slots.size(), Kernel<B>(backend));
    report.warmup = static_cast<int>(host.slots.size());

    std::vector<Sample> samples;
    const auto check = [&](int step) {
        const std::string wrong = reference.check(step, host.slots[static_cast<std::size_t>(step) % host.slots.size()]);
        return wrong.empty() || fail(failure, wrong);
    };
    const auto record = [&](const auto& stager) { samples.push_back(sample(backend, stager)); };
    if (!run_steps<Strategy>(host, backend, kernels, failure, check, record)) return false;

    // samples[k] follows step k (samples[0] precedes the first).
    const devstage::StagerStats& warm = samples[static_cast<std::size_t>(report.warmup)].stager;
    report.warmup_mallocs = warm.device_mallocs - samples[0].stager.device_mallocs;
    report.warmup_buffers = warm.regrows - samples[0].stager.regrows;
    report.warmup_retries = warm.alignment_retries - samples[0].stager.alignment_retries;
    for (std::size_t k = static_cast<std::size_t>(report.warmup) + 1; k < samples.size(); ++k) {
        const devstage::StagerStats& a = samples[k - 1].stager;
        const devstage::StagerStats& b = samples[k].stager;
        report.mallocs.add(b.device_mallocs - a.device_mallocs);
        report.frees.add(b.device_frees - a.device_frees);
        report.copies_in.add(b.uploads - a.uploads);
        report.copies_out.add(b.copy_backs - a.copy_backs);
        report.zeroing.add(b.zeroing_calls - a.zeroing_calls);
        report.modeled_ns.add(samples[k].modeled_ns - samples[k - 1].modeled_ns);
        report.bounced.add(samples[k].bounced - samples[k - 1].bounced);
        report.bytes_in.add(b.bytes_to_device - a.bytes_to_device);
        report.bytes_out.add(b.bytes_from_device - a.bytes_from_device);
        report.mapped_runs.add(b.mapped_runs - a.mapped_runs);
        const std::uint64_t read = samples[k].mapped_read - samples[k - 1].mapped_read;
        const std::uint64_t written = samples[k].mapped_written - samples[k - 1].mapped_written;
        report.mapped_read.add(read);
        report.mapped_written.add(written);
        if (report.link != nullptr) {
            // As the simulator charges them: bytes at the pinned rate, no call's latency.
            const auto over_link = [](const devstage::SimLinkCost& cost, std::uint64_t bytes) {
                return bytes == 0 ? 0 : cost.nanoseconds(bytes) - cost.latency_ns;
            };
            report.mapped_ns.add(over_link(report.link->model.to_device_pinned, read) +
                                 over_link(report.link->model.from_device_pinned, written));
        }
    }

    for (std::size_t i : {decode::key_cache, decode::value_cache}) {
        const std::span<const std::byte> expected = reference.cache(i);
        std::vector<std::byte> got(expected.size());
        const devstage::TensorArg device = host.slots[0][i];
        if (auto s = backend.copy_from_device(got.data(), device.data, device.bytes); !s) {
            return fail(failure, "reading the KV cache back failed: " + s.message());
        }
        if (!std::equal(got.begin(), got.end(), expected.begin())) {
            return fail(failure, std::string(i == decode::key_cache ? "key" : "value") +
                                     " cache on the device differs from the host reference's at the end");
        }
    }
    return true;
}

std::string per_step(const PerStep& p, double scale = 1) {
    const auto round = [scale](std::uint64_t v) {
        return std::to_string(std::llround(static_cast<double>(v) / scale));
    };
    if (round(p.low) == round(p.high)) return round(p.low);
    return round(p.low) + "-" + round(p.high);
}
std::string us(std::uint64_t ns) {
    return std::to_string(std::llround(static_cast<double>(ns) / 1e3));
}
// Microseconds to two decimals: the cost of a few KB over the link is a fraction of one.
std::string fine_us(const PerStep& p) {
    const auto text = [](std::uint64_t ns) {
        char out[32];
        std::snprintf(out, sizeof out, "%.2f", static_cast<double>(ns) / 1e3);
        return std::string(out);
    };
    return p.low == p.high ? text(p.low) : text(p.low) + "-" + text(p.high);
}

// The bytes of the step's 4 inputs.
constexpr std::size_t input_total =
    decode::input_bytes[0] + decode::input_bytes[1] + decode::input_bytes[2] + decode::input_bytes[3];

// What the RetainedBump+map run must show every steady step: the kernel read the 4 inputs in
// the mapped mirror (one mapped run, their bytes read mapped, nothing written there), none was
// copied in, and the only copy out was the logits (above the map limit, in the device buffer).
// False, having said which counter differs, otherwise.
bool mapped_in_place(const Report& r, std::string& failure) {
    const auto exactly = [&](const char* what, const PerStep& p, std::uint64_t want) {
        if (p.low == want && p.high == want) return true;
        return fail(failure, std::string("RetainedBump+map") +
                                 (r.link ? std::string(" on the ") + r.link->name + " link" : "") + ": " + what +
                                 " per step were " + per_step(p) + ", not " + std::to_string(want));
    };
    return exactly("mapped runs", r.mapped_runs, 1) && exactly("copies in", r.copies_in, 0) &&
           exactly("bytes copied in", r.bytes_in, 0) && exactly("copies out", r.copies_out, 1) &&
           exactly("bytes copied out", r.bytes_out, decode::logits_bytes) &&
           exactly("mapped bytes the kernel read", r.mapped_read, input_total) &&
           exactly("mapped bytes the kernel wrote", r.mapped_written, 0);
}

// The model's host tensors and the step buffers, in `storage`; then every strategy chosen.
template <class B, class Storage>
bool run_strategies(const Options& options, B& backend, Storage& storage, const Link* link,
                    std::vector<Report>& reports, std::string& failure) {
    const qwen3::Inputs model = qwen3::generate(storage, options.scale);
    if (!model.ok()) return fail(failure, "could not allocate the model's host tensors");
    const decode::Batch batch(decode::cache_blocks(options.scale), options.steps);
    {
        Args host_args{};
        for (std::size_t row = 1; row <= decode::resident_count; ++row)
            host_args[decode::resident_arg(row)] = model.args[row];
        batch.prefill(decode::view(host_args));
    }
    std::vector<Args> slots(*options.async ? 2 : 1);
    for (Args& args : slots) {
        for (std::size_t i = decode::tokens; i < decode::first_resident; ++i) {
            const std::span<std::byte> memory = storage.allocate(decode::input_bytes[i]);
            if (memory.empty()) return fail(failure, "could not allocate the step's host inputs");
            args[i] = devstage::TensorArg::in(memory.data(), memory.size());
        }
        const std::span<std::byte> logits = storage.allocate(decode::logits_bytes);
        if (logits.empty()) return fail(failure, "could not allocate the step's host logits");
        args[decode::logits] = devstage::TensorArg::out(logits.data(), logits.size());
    }
    const Host host{options, model, batch, slots};

    const auto go = [&](auto strategy_tag, const char* label) {
        using Strategy = decltype(strategy_tag);
        Report report;
        report.link = link;
        report.strategy = label;
        if (link != nullptr) {
            const devstage::SimLinkModel& m = link->model;
            const std::size_t in =
                decode::input_bytes[0] + decode::input_bytes[1] + decode::input_bytes[2] + decode::input_bytes[3];
            report.limit_ns =
                options.pageable
                    ? m.to_device_pageable.nanoseconds(in) + m.from_device_pageable.nanoseconds(decode::logits_bytes)
                    : m.to_device_pinned.nanoseconds(in) + m.from_device_pinned.nanoseconds(decode::logits_bytes);
        }
        if (!run_strategy<Strategy>(host, backend, report, failure)) {
            failure = std::string(label) + (link != nullptr ? std::string(" on the ") + link->name + " link" : "") +
                      ", " + failure;
            return false;
        }
        reports.push_back(report);
        return true;
    };
    const std::string& s = options.strategy;
    bool ok = true;
    if (s == "all" || s == "both" || s == "per-tensor") ok = ok && go(devstage::PerTensorMalloc<>{}, "PerTensorMalloc");
    if (s == "all" || s == "both" || s == "retained") ok = ok && go(devstage::RetainedBump<>{}, "RetainedBump");
    if (s == "all" || s == "packed") ok = ok && go(PackedBump{}, "RetainedBump+pack");
    if constexpr (host_addressable<B>) {  // the kernel stand-in reads mapped memory in place
        if (s == "all" || s == "mapped") {
            ok = ok && go(MappedBump{}, "RetainedBump+map");
            ok = ok && mapped_in_place(reports.back(), failure);
        }
    }
    return ok;
}

template <class B>
bool run_backend(const Options& options, B& backend, const Link* link, std::vector<Report>& reports,
                 std::string& failure) {
    if (options.pageable) {
        qwen3::PageableStorage pageable;
        return run_strategies(options, backend, pageable, link, reports, failure);
    }
    devstage::PinnedHostPool<B> pool(backend);
    qwen3::PinnedStorage pinned(pool);
    return run_strategies(options, backend, pinned, link, reports, failure);
}

void print_header(const Options& options, const char* backend, bool host_functions) {
    std::size_t resident = 0, full = 0;
    const auto specs = qwen3::table();
    for (std::size_t row = 1; row <= decode::resident_count; ++row) {
        resident += specs[row].bytes_at(options.scale);
        full += specs[row].bytes_at(1.0);
    }
    const char* mode =
        !*options.async ? "one step at a time\n  (bind, the kernel stand-in, finish)"
        : host_functions
            ? "stream-ordered\n  over 2 pipeline slots; the kernel stand-in is a host function on the stream"
            : "stream-ordered\n  over 2 pipeline slots; the kernel stand-in runs on the host, through copies of "
              "its own,\n  once a step's uploads completed";
    std::printf("devstage decode loop: %d steps of a Qwen3-14B-shaped decode (batch %zu) on %s, %s\n", options.steps,
                decode::batch, backend, mode);
    std::printf(
        "On the device, uploaded once and passed to every step as Placement::Device args: the weights, RoPE\n"
        "  tables and KV cache, 14 tensors, %.1f MB (their rows x %.4g; %.1f GB unscaled);\n"
        "  the cache holds %zu blocks of %zu tokens\n",
        static_cast<double>(resident) / 1e6, options.scale, static_cast<double>(full) / 1e9,
        decode::cache_blocks(options.scale), decode::block_size);
    std::printf(
        "Per step, in %s host memory: in 4 tensors, %zu B (tokens, positions, block table, temperatures);\n"
        "  out the logits, %zu x %zu fp32, %zu B\n",
        options.pageable ? "pageable" : "pinned",
        decode::input_bytes[0] + decode::input_bytes[1] + decode::input_bytes[2] + decode::input_bytes[3],
        decode::batch, decode::vocab, decode::logits_bytes);
    std::printf(
        "Each step writes every sequence's new key and value into the cache and computes its logits from the\n"
        "  cache and the weights; the host checks them against the same arithmetic on its own copies\n");
    std::fflush(stdout);
}

void print_summary(const Options& options, const std::vector<Report>& reports) {
    const int warmup = reports.front().warmup;
    char title[40];
    if (warmup + 1 == options.steps) {
        std::snprintf(title, sizeof title, "per step, step %d", options.steps);
    } else {
        std::snprintf(title, sizeof title, "per step, steps %d-%d", warmup + 1, options.steps);
    }
    std::printf("\n%-24s %14s %6s %10s %11s %8s %11s %10s %9s\n", title, "device mallocs", "frees", "copies in",
                "copies out", "zeroing", "modeled us", "mapped us", "limit us");
    const Link* section = nullptr;
    for (const Report& r : reports) {
        if (r.link != nullptr && r.link != section) {
            section = r.link;
            std::printf("%s link (SimLinkModel::%s())\n", r.link->name, r.link->preset);
        }
        const bool modeled = r.link != nullptr;
        std::printf("  %-22s %14s %6s %10s %11s %8s %11s %10s %9s\n", r.strategy, per_step(r.mallocs).c_str(),
                    per_step(r.frees).c_str(), per_step(r.copies_in).c_str(), per_step(r.copies_out).c_str(),
                    per_step(r.zeroing).c_str(), modeled ? per_step(r.modeled_ns, 1e3).c_str() : "-",
                    modeled ? fine_us(r.mapped_ns).c_str() : "-", modeled ? us(r.limit_ns).c_str() : "-");
    }
    if (reports.front().link != nullptr) {
        std::printf(
            "Bounced per step (staged through the simulator's bounce buffer, as a driver stages pageable\n  memory):");
        std::size_t column = 10;
        for (const Report& r : reports) {
            if (r.link != reports.front().link) continue;
            const std::string item =
                std::string(&r == &reports.front() ? "" : ",") + " " + per_step(r.bounced) + " B for " + r.strategy;
            if (column + item.size() > 100) {
                std::printf(",\n ");
                column = 1;
            }
            std::printf("%s", column == 1 ? item.c_str() + 1 : item.c_str());
            column += item.size();
        }
        std::printf(".\n");
        std::printf(
            "\nZeroing: the calls that set the logits (an Out arg) to zero on the device before the kernel\n"
            "  (OutputPolicy::zero, the default: a byte the kernel leaves unwritten never holds another step's\n"
            "  data); each is one device memset, modeled at one call's latency.\n"
            "Modeled us: what the step's copies would cost on the link (SimStats::modeled_ns; nothing sleeps);\n"
            "  mapped us, included in it: the kernel's reads and writes of mapped host memory, charged as bytes\n"
            "  over the link at the pinned rate with no call's latency (SimBackend::launch_kernel); the limit\n"
            "  is one copy each way of the step's bytes. The wall time is not shown: the simulator's device\n"
            "  memory is this machine's RAM.\n");
    } else {
        std::printf(
            "\nThe copies are the stager's; the kernel stand-in's own copies (it cannot read device memory from\n"
            "  the host) are not counted, and the link is not modeled.\n");
    }

    const auto find = [&](std::string_view strategy, const Link* link) -> const Report* {
        for (const Report& r : reports) {
            if (strategy == r.strategy && r.link == link) return &r;
        }
        return nullptr;
    };
    std::vector<const Link*> links;
    for (const Report& r : reports) {
        if (std::find(links.begin(), links.end(), r.link) == links.end()) links.push_back(r.link);
    }
    const Report* per_tensor = find("PerTensorMalloc", links.front());
    const Report* retained = find("RetainedBump", links.front());
    const Report* packed = find("RetainedBump+pack", links.front());
    if (per_tensor != nullptr && retained != nullptr) {
        const bool one_slot = retained->warmup == 1;
        std::string first = std::to_string(retained->warmup_mallocs) + " device malloc" +
                            (retained->warmup_mallocs == 1 ? "" : "s") +
                            (one_slot ? ", for its buffer" : ", for a buffer per pipeline slot");
        if (retained->warmup_retries > 0) {
            first += "; " + std::to_string(retained->warmup_retries) + " came back misaligned and " +
                     (retained->warmup_retries == 1 ? "was" : "were") + " freed";
        }
        std::printf(
            "RetainedBump makes %s device mallocs and %s frees per step, PerTensorMalloc %s and %s (one per staged\n"
            "  tensor). RetainedBump allocated in its first %s only, what later steps reuse:\n"
            "  %s.\n%s",
            per_step(retained->mallocs).c_str(), per_step(retained->frees).c_str(),
            per_step(per_tensor->mallocs).c_str(), per_step(per_tensor->frees).c_str(),
            one_slot ? "step" : (std::to_string(retained->warmup) + " steps").c_str(), first.c_str(),
            retained->link != nullptr
                ? "  The link model does not time allocations: neither preset has a measured figure for them.\n"
                : "");
    }
    if (packed != nullptr && retained != nullptr) {
        std::printf("RetainedBump+pack (PackSmall<16384>): the 4 inputs in one copy, %s copies per step instead of %s",
                    std::to_string(packed->copies_in.high + packed->copies_out.high).c_str(),
                    std::to_string(retained->copies_in.high + retained->copies_out.high).c_str());
        for (const Link* link : links) {
            const Report* p = find("RetainedBump+pack", link);
            const Report* r = find("RetainedBump", link);
            if (link == nullptr || p == nullptr || r == nullptr) continue;
            std::printf(";\n  %s us instead of %s on the %s link (the limit: %s us)",
                        per_step(p->modeled_ns, 1e3).c_str(), per_step(r->modeled_ns, 1e3).c_str(), link->name,
                        us(p->limit_ns).c_str());
        }
        std::printf(".\n");
    }
    if (const Report* mapped = find("RetainedBump+map", links.front()); mapped != nullptr) {
        std::printf(
            "RetainedBump+map (MapSmall<16384>): the kernel reads the 4 inputs (%zu B) in the stager's pinned\n"
            "  mirror, mapped for the device: %s copies in and %s out (the logits, above the limit) per step",
            input_total, per_step(mapped->copies_in).c_str(), per_step(mapped->copies_out).c_str());
        for (const Link* link : links) {
            const Report* m = find("RetainedBump+map", link);
            if (link == nullptr || m == nullptr) continue;
            std::printf(";\n  %s us on the %s link, %s us of it the mapped reads (the limit: %s us)",
                        per_step(m->modeled_ns, 1e3).c_str(), link->name, fine_us(m->mapped_ns).c_str(),
                        us(m->limit_ns).c_str());
        }
        std::printf(
            ".\n  The logits are still zeroed on the device before the kernel and copied back: a zeroing call\n"
            "  and one copy's latency remain.\n");
    }
    if (options.strategy == "all" && options.backend != "sim") {
        std::printf(
            "RetainedBump+map is not run here: the kernel stand-in reads device memory through copies, and\n"
            "  a mapped device address is for kernels only (the simulator runs it).\n");
    }
    if (links.front() != nullptr) {
        std::printf("Uploading the 14 resident tensors every step instead would add 14 copies to each step, and\n ");
        for (const Link* link : links) {
            std::printf("%s %s us on the %s link", link == links.front() ? "" : ",",
                        us(find(reports.front().strategy, link)->resident_ns).c_str(), link->name);
        }
        std::printf(".\n");
    }
}

std::string parse(int argc, char** argv, Options& o) {
    const auto one_of = [](std::string_view value, std::initializer_list<std::string_view> choices) {
        return std::find(choices.begin(), choices.end(), value) != choices.end();
    };
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--async" || arg == "--sync") {
            o.async = arg == "--async";
            continue;
        }
        if (arg == "--pageable") {
            o.pageable = true;
            continue;
        }
        if (!one_of(arg, {"--steps", "--scale", "--strategy", "--backend", "--link"}))
            return "unknown option '" + std::string(arg) + "'";
        if (i + 1 == argc) return std::string(arg) + " needs a value";
        const std::string value = argv[++i];
        const char* end = value.data() + value.size();
        if (arg == "--steps") {
            const auto [rest, error] = std::from_chars(value.data(), end, o.steps);
            if (error != std::errc{} || rest != end || o.steps < 3 || o.steps > 100000)
                return "--steps takes a whole number from 3 to 100000, not '" + value + "'";
        } else if (arg == "--scale") {
            char* rest = nullptr;
            o.scale = std::strtod(value.c_str(), &rest);
            if (value.empty() || rest != end || !(o.scale > 0 && o.scale <= 1))
                return "--scale takes a number above 0 and at most 1, not '" + value + "'";
        } else if (arg == "--strategy") {
            if (!one_of(value, {"all", "both", "retained", "per-tensor", "packed", "mapped"}))
                return "--strategy is all, both, retained, per-tensor, packed or mapped, not '" + value + "'";
            o.strategy = value;
        } else if (arg == "--backend") {
            if (!one_of(value, {"sim", "ascend"})) return "--backend is sim or ascend, not '" + value + "'";
            o.backend = value;
        } else {
            if (!one_of(value, {"both", "h200", "ascend"}))
                return "--link is both, h200 or ascend, not '" + value + "'";
            o.link = value;
        }
    }
    if (o.link && o.backend != "sim")
        return "--link chooses the simulator's link model; --backend " + o.backend + " has a real link";
    if (o.strategy == "mapped" && o.backend != "sim")
        return "--strategy mapped runs on the simulator only: the kernel stand-in cannot read mapped memory on "
               "--backend " +
               o.backend;
    return {};
}

int conclude(const Options& options, const std::vector<Report>& reports, bool ok, const std::string& failure) {
    if (!ok) {
        std::printf("\nFAIL: %s\n", failure.c_str());
        return 1;
    }
    print_summary(options, reports);
    std::printf(
        "\nPASS: %zu runs of %d steps; every step's logits equal the host reference's, and each run's KV cache\n"
        "  holds the %zu rows the prompts and steps wrote, as the reference's does\n",
        reports.size(), options.steps, decode::Batch::rows_written(options.steps));
    return 0;
}

// Resolves --async against what the backend can do; false (having said why) on misuse.
template <class B>
bool resolve_async(Options& options, std::string_view backend) {
    if (!options.async) options.async = devstage::AsyncBackend<B>;
    if (*options.async && !devstage::AsyncBackend<B>) {
        std::fprintf(stderr, "decode_loop: backend '%s' has no streams: use --sync\n", std::string(backend).c_str());
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        if (std::string_view(argv[i]) == "--help") {
            std::printf(
                "usage: decode_loop [options]: a checked decode loop of a Qwen3-14B-shaped model, per strategy\n"
                "  --steps N         decode steps of each run, 3 to 100000 (default 30)\n"
                "  --scale S         the rows the stacked layers and RoPE tables keep, 0 < S <= 1 (default 0.002)\n"
                "  --strategy NAME   all (the default), both (PerTensorMalloc and RetainedBump), retained,\n"
                "                    per-tensor, packed (RetainedBump with PackSmall) or mapped (RetainedBump\n"
                "                    with MapSmall, on the simulator only; all includes it there)\n"
                "  --async, --sync   stream-ordered over 2 pipeline slots (the default where the backend has\n"
                "                    streams), or one step at a time\n"
                "  --pageable        the step's inputs and logits in pageable host memory (default: pinned)\n"
                "  --backend NAME    sim (the default) or ascend: Ascend device 0 through CANN ACL\n"
                "                    (libascendcl.so, or $DEVSTAGE_ACL_LIBRARY)\n"
                "  --link NAME       the simulator's link models: both (the default), h200 or ascend\n"
                "Exit status: 0 on PASS, 1 on FAIL or a backend error, 2 on a bad option.\n");
            return 0;
        }
    }
    if (const std::string wrong = parse(argc, argv, options); !wrong.empty()) {
        std::fprintf(stderr, "decode_loop: %s (--help lists the options)\n", wrong.c_str());
        return 2;
    }
    if (const std::string wrong = decode::Batch::fits(decode::cache_blocks(options.scale), options.steps);
        !wrong.empty()) {
        std::fprintf(stderr, "decode_loop: at --scale %g, %s\n", options.scale, wrong.c_str());
        return 2;
    }
    std::vector<Report> reports;
    std::string failure;
    if (options.backend == "ascend") {
        auto npu = devstage::AscendBackend::create(0);
        if (!npu) {
            std::fprintf(stderr, "decode_loop: %s\n", npu.status().message().c_str());
            return 1;
        }
        if (!resolve_async<devstage::AscendBackend>(options, npu->name())) return 2;
        print_header(options, "an Ascend device", devstage::HostFunctionBackend<devstage::AscendBackend>);
        const bool ok = run_backend(options, *npu, nullptr, reports, failure);
        return conclude(options, reports, ok, failure);
    }
    if (!resolve_async<devstage::SimBackend>(options, "sim")) return 2;
    print_header(options, "the simulator", devstage::HostFunctionBackend<devstage::SimBackend>);
    const std::array<Link, 2> presets{
        {{"h200", "H200", "h200", devstage::SimLinkModel::h200()},
         {"ascend", "Ascend a2a3", "ascend_a2a3", devstage::SimLinkModel::ascend_a2a3()}}};
    const std::string link = options.link.value_or("both");
    bool ok = true;
    for (const Link& preset : presets) {
        if (link != "both" && link != preset.option) continue;
        // One simulator per link model: the model is fixed at construction.
        devstage::SimBackend sim(devstage::SimConfig{.link = preset.model});
        ok = ok && run_backend(options, sim, &preset, reports, failure);
    }
    return conclude(options, reports, ok, failure);
}
