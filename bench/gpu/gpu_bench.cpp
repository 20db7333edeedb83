// SPDX-License-Identifier: Apache-2.0
// devstage on an NVIDIA GPU through CudaBackend, all in one process:
//  1. one decode step staged each way devstage offers — synchronous, stream-ordered on 1 and 2
//     pipeline slots, one call per copy or the copies batched (cudaMemcpyBatchAsync), PackSmall,
//     MapSmall (the small args in mapped pinned memory: no copy; no kernel runs, so the bytes a
//     kernel would read and write there are reported and timed at the pinned copy rate measured
//     here), in-place frames — next to the raw limits measured through the same backend (cudaMemcpy per
//     tensor, cudaMemcpyAsync per tensor + one wait, one packed copy each way + one wait, one
//     batch each way + one wait), for the small decode step and the 19-tensor Qwen3-14B set:
//     copies and microseconds per step, each way's bytes checked first, and the ratios to the
//     limits;
//  2. decode steady state, RetainedBump vs PerTensorMalloc, on the Qwen3 set;
//  3. host-to-device and device-to-host throughput from pinned vs pageable memory;
//  4. cudaHostAlloc cost vs a PinnedHostPool cache hit;
//  5. one large pageable arg (64 MiB, 256 MiB, 1 GiB) up and back: directly, through the
//     pageable ring with 0, 1, 2, 4, 8 copy threads, and from pinned memory, in GB/s.
// No CUDA header is needed: the runtime (and, for the device's name, the driver and NVML) are
// loaded at run time. Without a usable GPU it says so and exits with 77.
// Usage: gpu_bench [--steps N] [--set-scale S] [--set-steps N] [--scale S] [--scale-steps N]
//                  [--ring-steps N] [--ring-max-mib N] [--ring-only]
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "devstage/backends/cuda.hpp"
#include "devstage/devstage.hpp"
#include "qwen3_decode.hpp"

using namespace devstage;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
    int steps = 3000;          // measured steps of the small decode step, per way of staging
    double set_scale = 0.002;  // the Qwen3 set of section 1
    int set_steps = 300;
    double scale = 0.02;  // the Qwen3 set of sections 2 and 3
    int scale_steps = 10;
    int ring_steps = 5;               // steps of each way in section 5 (the first is not counted)
    std::size_t ring_max_mib = 1024;  // the largest arg of section 5
    bool ring_only = false;           // section 5 alone
    bool list_sets = false;           // print the tensors of section 1 and exit (for torch_copies.py)
};

[[noreturn]] void usage(const char* argv0) {
    std::fprintf(stderr,
                 "usage: %s [--steps N (3000)] [--set-scale S (0.002)] [--set-steps N (300)] [--scale S (0.02)] "
                 "[--scale-steps N (10)] [--ring-steps N (5)] [--ring-max-mib N (1024)] [--ring-only] [--list-sets]\n",
                 argv0);
    std::exit(2);
}

// A whole argument read as a number; usage() otherwise.
double number(const char* text, const char* argv0) {
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end == text || *end != '\0') usage(argv0);
    return value;
}

Options parse(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--ring-only") {
            options.ring_only = true;
            continue;
        }
        if (flag == "--list-sets") {
            options.list_sets = true;
            continue;
        }
        if (i + 1 >= argc) usage(argv[0]);
        const double value = number(argv[++i], argv[0]);
        const int count = value >= 0 && value <= 1e8 ? static_cast<int>(value) : -1;
        if (flag == "--steps") {
            options.steps = count;
        } else if (flag == "--set-scale") {
            options.set_scale = value;
        } else if (flag == "--set-steps") {
            options.set_steps = count;
        } else if (flag == "--scale") {
            options.scale = value;
        } else if (flag == "--scale-steps") {
            options.scale_steps = count;
        } else if (flag == "--ring-steps") {
            options.ring_steps = count;
        } else if (flag == "--ring-max-mib") {
            if (count < 1 || count > 65536) usage(argv[0]);
            options.ring_max_mib = static_cast<std::size_t>(count);
        } else {
            usage(argv[0]);
        }
    }
    if (options.steps < 10 || options.set_steps < 10 || options.scale_steps < 2 || options.ring_steps < 2 ||
        options.set_scale <= 0 || options.scale <= 0) {
        usage(argv[0]);
    }
    return options;
}

[[noreturn]] void fail(std::string_view what, const Status& status) {
    std::fprintf(stderr, "%.*s failed: %s\n", static_cast<int>(what.size()), what.data(), status.message().c_str());
    std::exit(1);
}

double us_since(Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

std::size_t align_up(std::size_t n, std::size_t a) {
    return (n + a - 1) / a * a;
}

// ---- what the process runs on -------------------------------------------------------------

// The CUDA runtime, found as CudaBackend finds it ($DEVSTAGE_CUDART_LIBRARY, then the usual
// names), else a copy next to this executable (run.sh --build-only puts one there).
struct Runtime {
    std::string name;  // what CudaBackend::create is given
    std::string path;  // the file the loader mapped
    int runtime_version = 0, driver_version = 0;
};

std::string executable_dir() {
    char buffer[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof buffer - 1);
    if (n <= 0) return ".";
    std::string path(buffer, static_cast<std::size_t>(n));
    return path.substr(0, path.rfind('/'));
}

Runtime find_runtime() {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("DEVSTAGE_CUDART_LIBRARY"); env != nullptr && *env != '\0') {
        candidates.emplace_back(env);
    }
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) candidates.emplace_back(name);
    candidates.push_back(executable_dir() + "/libcudart.so.13");
    Runtime runtime;
    for (const std::string& candidate : candidates) {
        void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) continue;
        runtime.name = candidate;
        using Version = int (*)(int*);
        auto runtime_version = reinterpret_cast<Version>(::dlsym(handle, "cudaRuntimeGetVersion"));
        auto driver_version = reinterpret_cast<Version>(::dlsym(handle, "cudaDriverGetVersion"));
        if (runtime_version != nullptr) (void)runtime_version(&runtime.runtime_version);
        if (driver_version != nullptr) (void)driver_version(&runtime.driver_version);
        Dl_info info{};
        if (runtime_version != nullptr && ::dladdr(reinterpret_cast<void*>(runtime_version), &info) != 0 &&
            info.dli_fname != nullptr) {
            runtime.path = info.dli_fname;
        }
        break;  // kept loaded: CudaBackend opens the same library
    }
    return runtime;
}

std::string cuda_version(int v) {
    if (v <= 0) return "unknown";
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// The device's name and memory (driver API) and the driver's release (NVML), where present.
void print_device(const Runtime& runtime, int device) {
    std::string name = "unknown", memory = "unknown", release = "unknown";
    if (void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); cuda != nullptr) {
        auto init = reinterpret_cast<int (*)(unsigned)>(::dlsym(cuda, "cuInit"));
        auto get = reinterpret_cast<int (*)(int*, int)>(::dlsym(cuda, "cuDeviceGet"));
        auto get_name = reinterpret_cast<int (*)(char*, int, int)>(::dlsym(cuda, "cuDeviceGetName"));
        auto total = reinterpret_cast<int (*)(std::size_t*, int)>(::dlsym(cuda, "cuDeviceTotalMem_v2"));
        int handle = 0;
        if (init != nullptr && get != nullptr && init(0) == 0 && get(&handle, device) == 0) {
            char text[256] = {};
            if (get_name != nullptr && get_name(text, sizeof text, handle) == 0) name = text;
            std::size_t bytes = 0;
            if (total != nullptr && total(&bytes, handle) == 0) {
                memory = std::to_string(bytes >> 20) + " MiB";
            }
        }
    }
    if (void* nvml = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL); nvml != nullptr) {
        auto init = reinterpret_cast<int (*)()>(::dlsym(nvml, "nvmlInit_v2"));
        auto version = reinterpret_cast<int (*)(char*, unsigned)>(::dlsym(nvml, "nvmlSystemGetDriverVersion"));
        auto shutdown = reinterpret_cast<int (*)()>(::dlsym(nvml, "nvmlShutdown"));
        if (init != nullptr && version != nullptr && init() == 0) {
            char text[96] = {};
            if (version(text, sizeof text) == 0) release = text;
            if (shutdown != nullptr) (void)shutdown();
        }
    }
    std::printf("GPU %d: %s, %s\n", device, name.c_str(), memory.c_str());
    std::printf("driver %s (supports CUDA %s); CUDA runtime %s from %s\n", release.c_str(),
                cuda_version(runtime.driver_version).c_str(), cuda_version(runtime.runtime_version).c_str(),
                runtime.path.empty() ? runtime.name.c_str() : runtime.path.c_str());
}

// ---- section 1: one decode step, each way ---------------------------------------------------

// CudaBackend without its batch operations (not a BatchCopyBackend): stagers over it make one
// call per copy whatever the runtime offers, so the per-copy rows stay per copy.
class PerCopy {
public:
    using Stream = CudaBackend::Stream;
    using Event = CudaBackend::Event;
    static constexpr std::size_t device_alignment = CudaBackend::device_alignment;
    explicit PerCopy(CudaBackend& gpu) noexcept : gpu_(&gpu) {}
    std::string_view name() const noexcept { return gpu_->name(); }
    Result<void*> device_malloc(std::size_t n) noexcept { return gpu_->device_malloc(n); }
    Status device_free(void* p) noexcept { return gpu_->device_free(p); }
    Status copy_to_device(void* d, const void* h, std::size_t n) noexcept { return gpu_->copy_to_device(d, h, n); }
    Status copy_from_device(void* h, const void* d, std::size_t n) noexcept { return gpu_->copy_from_device(h, d, n); }
    Result<void*> pinned_malloc(std::size_t n) noexcept { return gpu_->pinned_malloc(n); }
    Status pinned_free(void* p) noexcept { return gpu_->pinned_free(p); }
    bool is_pinned(const void* p) const noexcept { return gpu_->is_pinned(p); }
    Result<Stream> create_stream() noexcept { return gpu_->create_stream(); }
    Status destroy_stream(Stream s) noexcept { return gpu_->destroy_stream(s); }
    Status copy_to_device_async(void* d, const void* h, std::size_t n, Stream s) noexcept {
        return gpu_->copy_to_device_async(d, h, n, s);
    }
    Status copy_from_device_async(void* h, const void* d, std::size_t n, Stream s) noexcept {
        return gpu_->copy_from_device_async(h, d, n, s);
    }
    Status device_memset_async(void* d, int v, std::size_t n, Stream s) noexcept {
        return gpu_->device_memset_async(d, v, n, s);
    }
    Result<Event> create_event() noexcept { return gpu_->create_event(); }
    Status destroy_event(Event e) noexcept { return gpu_->destroy_event(e); }
    Status record_event(Event e, Stream s) noexcept { return gpu_->record_event(e, s); }
    Result<bool> event_ready(Event e) noexcept { return gpu_->event_ready(e); }
    Status synchronize_event(Event e) noexcept { return gpu_->synchronize_event(e); }
    Status stream_wait_event(Stream s, Event e) noexcept { return gpu_->stream_wait_event(s, e); }
    static constexpr std::size_t host_map_alignment = CudaBackend::host_map_alignment;
    Result<void*> map_host(void* h, std::size_t n) noexcept { return gpu_->map_host(h, n); }
    Status unmap_host(void* h) noexcept { return gpu_->unmap_host(h); }

private:
    CudaBackend* gpu_;
};
static_assert(AsyncBackend<PerCopy> && PinnedHostBackend<PerCopy> && MappedHostBackend<PerCopy> &&
              !BatchCopyBackend<PerCopy>);

// The bytes of one step a kernel reads and writes in mapped host memory (MapSmall ways).
struct MappedBytes {
    std::uint64_t read = 0, written = 0;
};

// One way of staging a step: `step()` runs one, `copies()` and `bytes()` count what the steps
// so far moved (copy calls, bytes either way).
struct Way {
    std::string label;
    std::function<Status()> step;
    std::function<std::uint64_t()> copies;
    std::function<std::uint64_t()> bytes;
    std::function<Status()> check;          // one step whose bytes are checked (see checked_step)
    bool available = true;                  // false: not on this runtime (printed as n/a)
    std::shared_ptr<MappedBytes> mapped{};  // MapSmall ways: set by the checked step
};

struct Measured {
    double median_us = 0, p90_us = 0, copies = 0, bytes = 0;
    MappedBytes mapped;  // per step, MapSmall ways
};

// Runs every way `warmup` steps, then `steps` more in rounds, so that slow drifts of the
// machine spread over all of them; per-step times are medians over the measured steps.
std::vector<Measured> measure(std::vector<Way>& ways, int warmup, int steps) {
    constexpr int rounds = 10;
    std::vector<std::vector<double>> samples(ways.size());
    std::vector<std::uint64_t> copies(ways.size()), bytes(ways.size());
    for (Way& way : ways) {
        if (!way.available) continue;
        if (Status s = way.check(); !s) fail(way.label + ": the checked step", s);
        for (int i = 0; i < warmup; ++i) {
            if (Status s = way.step(); !s) fail(way.label, s);
        }
    }
    for (std::size_t w = 0; w < ways.size(); ++w) {
        copies[w] = ways[w].copies();
        bytes[w] = ways[w].bytes();
    }
    for (int round = 0; round < rounds; ++round) {
        const int count = steps / rounds + (round < steps % rounds ? 1 : 0);
        for (std::size_t w = 0; w < ways.size(); ++w) {
            if (!ways[w].available) continue;
            for (int i = 0; i < count; ++i) {
                const auto start = Clock::now();
                if (Status s = ways[w].step(); !s) fail(ways[w].label, s);
                samples[w].push_back(us_since(start));
            }
        }
    }
    std::vector<Measured> out;
    for (std::size_t w = 0; w < ways.size(); ++w) {
        if (!ways[w].available) {
            out.push_back({});
            continue;
        }
        out.push_back({percentile(samples[w], 0.5), percentile(samples[w], 0.9),
                       static_cast<double>(ways[w].copies() - copies[w]) / steps,
                       static_cast<double>(ways[w].bytes() - bytes[w]) / steps,
                       ways[w].mapped ? *ways[w].mapped : MappedBytes{}});
    }
    return out;
}

using PerTensor = RetainedBump<>;
using Packed = RetainedBump<ExactGrowth, 1024, PackSmall<16384>>;
constexpr std::size_t all_five_limit = 262144;  // above 163840: packs every tensor of the small step
using PackedAll = RetainedBump<ExactGrowth, 1024, PackSmall<all_five_limit>>;
using Mapped = RetainedBump<ExactGrowth, 1024, MapSmall<16384>>;
using MappedAll = RetainedBump<ExactGrowth, 1024, MapSmall<all_five_limit>>;

std::uint64_t stager_copies(const StagerStats& s) {
    return s.uploads + s.copy_backs;
}
std::uint64_t stager_bytes(const StagerStats& s) {
    return s.bytes_to_device + s.bytes_from_device;
}

// The bytes of device memory at `device`, read back synchronously.
template <class B>
Result<std::vector<std::byte>> device_bytes(B& backend, const void* device, std::size_t bytes) {
    std::vector<std::byte> out(bytes);
    if (Status s = backend.copy_from_device(out.data(), device, bytes); !s) return s;
    return out;
}

// The host waits for the work enqueued on `stream` so far.
template <class B>
Status wait_for(B& backend, typename B::Stream stream) {
    Result<typename B::Event> event = backend.create_event();
    if (!event) return event.status();
    Status waited = backend.record_event(*event, stream);
    if (waited) waited = backend.synchronize_event(*event);
    (void)backend.destroy_event(*event);
    return waited;
}

Status mismatch(std::string what, std::size_t arg) {
    return Status(Errc::backend_failure, what + " of arg " + std::to_string(arg) + " differ from what was staged");
}

// One step whose bytes are checked: after the bind every In/InOut device arg holds its host
// bytes; after the wait every InOut host arg still holds them (the device gave them back) and
// every Out arg is zero (OutputPolicy::zero sets it on the device; its host bytes were 0xEE).
template <class B, class S>
Status checked_step(B& backend, S& stager, std::span<const TensorArg> args, typename B::Stream stream, bool ordered) {
    for (const TensorArg& arg : args) {
        if (arg.direction == Direction::Out) std::memset(arg.data, 0xEE, arg.bytes);
    }
    Result<StagedRun> run = ordered ? stager.bind(args, stream) : stager.bind(args);
    if (!run) return run.status();
    if (ordered) {  // the uploads are on `stream`: wait for them before reading the device
        if (Status waited = wait_for(backend, stream); !waited) return waited;
    }
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (args[i].direction == Direction::Out) continue;
        Result<std::vector<std::byte>> on_device = device_bytes(backend, run->device_args()[i].data, args[i].bytes);
        if (!on_device) return on_device.status();
        if (std::memcmp(on_device->data(), args[i].data, args[i].bytes) != 0) return mismatch("device bytes", i);
    }
    std::vector<std::vector<std::byte>> in_out;
    for (const TensorArg& arg : args) {
        const auto* at = static_cast<const std::byte*>(arg.data);
        in_out.emplace_back(arg.direction == Direction::InOut ? at : nullptr,
                            arg.direction == Direction::InOut ? at + arg.bytes : nullptr);
    }
    if (ordered) {
        Result<Completion> done = stager.finish(std::move(*run), stream);
        if (!done) return done.status();
        if (Status waited = done->wait(); !waited) return waited;
    } else if (Status finished = stager.finish(std::move(*run)); !finished) {
        return finished;
    }
    for (std::size_t i = 0; i < args.size(); ++i) {
        const auto* at = static_cast<const std::byte*>(args[i].data);
        if (args[i].direction == Direction::InOut && std::memcmp(at, in_out[i].data(), args[i].bytes) != 0) {
            return mismatch("host bytes after the copy-back", i);
        }
        if (args[i].direction == Direction::Out &&
            std::any_of(at, at + args[i].bytes, [](std::byte b) { return b != std::byte{0}; })) {
            return mismatch("zeroed Out bytes", i);
        }
    }
    return {};
}

// The backend a stager of a way runs on: the CudaBackend itself (batches where the runtime has
// them) or PerCopy over it.
template <class B>
std::shared_ptr<B> backend_of(CudaBackend& gpu) {
    if constexpr (std::is_same_v<B, CudaBackend>) {
        return std::shared_ptr<CudaBackend>(&gpu, [](CudaBackend*) {});
    } else {
        return std::make_shared<B>(gpu);
    }
}

template <class B, class Strategy>
Way synchronous_way(std::string label, CudaBackend& gpu, CudaBackend::Stream stream, std::span<const TensorArg> args) {
    auto backend = backend_of<B>(gpu);
    auto stager = std::make_shared<Stager<B, Strategy>>(*backend);
    return {std::move(label),
            [backend, stager, args]() -> Status {
                Result<StagedRun> run = stager->bind(args);
                if (!run) return run.status();
                return stager->finish(std::move(*run));
            },
            [stager] { return stager_copies(stager->stats()); }, [stager] { return stager_bytes(stager->stats()); },
            [backend, stager, args, stream] { return checked_step(*backend, *stager, args, stream, false); }};
}

// On `slots` pipeline slots: with two, a step binds and finishes a run, then waits for the run
// before it (one run stays in flight between steps).
template <class B, class Strategy>
Way stream_way(std::string label, CudaBackend& gpu, CudaBackend::Stream stream, std::span<const TensorArg> args,
               std::size_t slots = 1) {
    auto backend = backend_of<B>(gpu);
    auto stager = std::make_shared<Stager<B, Strategy>>(*backend, Strategy{}, slots);
    auto in_flight = std::make_shared<std::optional<Completion>>();
    return {std::move(label),
            [backend, stager, in_flight, stream, args, slots]() -> Status {
                Result<StagedRun> run = stager->bind(args, stream);
                if (!run) return run.status();
                Result<Completion> done = stager->finish(std::move(*run), stream);
                if (!done) return done.status();
                if (slots == 1) return done->wait();
                Status waited;
                if (*in_flight) waited = (*in_flight)->wait();
                *in_flight = std::move(*done);
                return waited;
            },
            [stager] { return stager_copies(stager->stats()); }, [stager] { return stager_bytes(stager->stats()); },
            [backend, stager, in_flight, args, stream]() -> Status {
                if (*in_flight) {
                    if (Status waited = (*in_flight)->wait(); !waited) return waited;
                    in_flight->reset();
                }
                return checked_step(*backend, *stager, args, stream, true);
            }};
}

// In-place frames: the inputs are written into the frame (here: a step number stamped into
// each input, the rest left from the first step, which copies the whole set in), bound, and
// finished; the output is read after the wait. The checked step compares the device bytes
// with the frame's after the bind, and checks the Out args are zero after the wait.
Way frame_way(std::string label, CudaBackend& gpu, CudaBackend::Stream stream, std::span<const TensorArg> args) {
    auto backend = backend_of<PerCopy>(gpu);
    auto stager = std::make_shared<Stager<PerCopy, Packed>>(*backend);
    auto shapes = std::make_shared<std::vector<TensorShape>>();
    for (const TensorArg& arg : args) shapes->push_back({arg.bytes, arg.direction});
    auto state = std::make_shared<std::uint64_t>(0);
    auto step = [backend, stager, shapes, state, stream, args](bool check) -> Status {
        Result<HostFrame> frame = stager->frame(*shapes);
        if (!frame) return frame.status();
        const std::uint64_t n = (*state)++;
        for (std::size_t i = 0; i < frame->size(); ++i) {
            const std::span<std::byte> host = frame->host(i);
            if (args[i].direction == Direction::Out) continue;
            if (n == 0) std::memcpy(host.data(), args[i].data, host.size());
            std::memcpy(host.data(), &n, std::min(sizeof n, host.size()));
        }
        Result<StagedRun> run = stager->bind(*frame, stream);
        if (!run) return run.status();
        if (check) {
            if (Status s = wait_for(*backend, stream); !s) return s;
            for (std::size_t i = 0; i < frame->size(); ++i) {
                if (args[i].direction == Direction::Out) continue;
                Result<std::vector<std::byte>> on_device =
                    device_bytes(*backend, run->device_args()[i].data, args[i].bytes);
                if (!on_device) return on_device.status();
                if (std::memcmp(on_device->data(), frame->host(i).data(), args[i].bytes) != 0) {
                    return mismatch("device bytes", i);
                }
            }
        }
        Result<Completion> done = stager->finish(std::move(*run), stream);
        if (!done) return done.status();
        if (Status waited = done->wait(); !waited) return waited;
        for (std::size_t i = 0; check && i < frame->size(); ++i) {
            const std::span<const std::byte> out = frame->host(i);
            if (args[i].direction == Direction::Out &&
                std::any_of(out.begin(), out.end(), [](std::byte b) { return b != std::byte{0}; })) {
                return mismatch("zeroed Out bytes", i);
            }
        }
        volatile std::byte first = frame->host(frame->size() - 1)[0];
        (void)first;
        return {};
    };
    return {std::move(label), [step] { return step(false); }, [stager] { return stager_copies(stager->stats()); },
            [stager] { return stager_bytes(stager->stats()); }, [step] { return step(true); }};
}

// MapSmall, stream-ordered on 1 slot: bind, finish, wait, as the stream-ordered rows. The
// args at most Limit bytes lie in the stager's pinned mirror, mapped for the device: nothing
// uploads or copies them back, and a kernel would read and write them there over the link as
// it runs. No kernel runs in this section, so those bytes do not move here: the checked step
// records them (Way::mapped) for the report. Every step must have been mapped (map_failures:
// the device could not map, and the slot copies as PackSmall does). The checked step: after
// the bind each mapped In/InOut arg's bytes are in the mirror where its device arg points (what
// the kernel would read), each other In/InOut arg's on the device; after the wait the InOut
// host bytes are unchanged and the Out args are zero (the host zeroes mapped ones).
template <class Strategy>
Way mapped_way(std::string label, CudaBackend& gpu, CudaBackend::Stream stream, std::span<const TensorArg> args) {
    auto backend = backend_of<PerCopy>(gpu);
    auto stager = std::make_shared<Stager<PerCopy, Strategy>>(*backend);
    auto mapped = std::make_shared<MappedBytes>();
    const auto all_mapped = [stager]() -> Status {
        const StagerStats& stats = stager->stats();
        if (stats.mapped_runs == stats.runs) return {};
        return Status(Errc::not_supported, "a run was not mapped (map_failures " + std::to_string(stats.map_failures) +
                                               "): the device did not map the pinned mirror");
    };
    auto check = [backend, stager, mapped, all_mapped, stream, args]() -> Status {
        for (const TensorArg& arg : args) {
            if (arg.direction == Direction::Out) std::memset(arg.data, 0xEE, arg.bytes);
        }
        Result<StagedRun> run = stager->bind(args, stream);
        if (!run) return run.status();
        if (Status waited = wait_for(*backend, stream); !waited) return waited;
        const auto* mirror_device = static_cast<const std::byte*>(stager->strategy().mirror_device());
        const std::size_t mirror_bytes = stager->strategy().mirror_capacity();
        *mapped = {};
        for (std::size_t i = 0; i < args.size(); ++i) {
            const auto* device = static_cast<const std::byte*>(run->device_args()[i].data);
            const bool in_mirror = mirror_device != nullptr && device >= mirror_device &&
                                   device + args[i].bytes <= mirror_device + mirror_bytes;
            if (in_mirror) {
                if (uploads(args[i].direction)) mapped->read += args[i].bytes;
                if (copies_back(args[i].direction)) mapped->written += args[i].bytes;
            }
            if (args[i].direction == Direction::Out) continue;
            if (in_mirror) {
                const std::byte* host = stager->strategy().mirror() + (device - mirror_device);
                if (std::memcmp(host, args[i].data, args[i].bytes) != 0) return mismatch("mapped mirror bytes", i);
                continue;
            }
            Result<std::vector<std::byte>> on_device = device_bytes(*backend, device, args[i].bytes);
            if (!on_device) return on_device.status();
            if (std::memcmp(on_device->data(), args[i].data, args[i].bytes) != 0) return mismatch("device bytes", i);
        }
        if (mapped->read + mapped->written == 0) {
            return Status(Errc::not_supported, "no arg was mapped: the device did not map the pinned mirror");
        }
        std::vector<std::vector<std::byte>> in_out;
        for (const TensorArg& arg : args) {
            const auto* at = static_cast<const std::byte*>(arg.data);
            const bool keep = arg.direction == Direction::InOut;
            in_out.emplace_back(keep ? at : nullptr, keep ? at + arg.bytes : nullptr);
        }
        Result<Completion> done = stager->finish(std::move(*run), stream);
        if (!done) return done.status();
        if (Status waited = done->wait(); !waited) return waited;
        for (std::size_t i = 0; i < args.size(); ++i) {
            const auto* at = static_cast<const std::byte*>(args[i].data);
            if (args[i].direction == Direction::InOut && std::memcmp(at, in_out[i].data(), args[i].bytes) != 0) {
                return mismatch("host bytes after the copy-back", i);
            }
            if (args[i].direction == Direction::Out &&
                std::any_of(at, at + args[i].bytes, [](std::byte b) { return b != std::byte{0}; })) {
                return mismatch("zeroed Out bytes", i);
            }
        }
        return all_mapped();
    };
    Way way{std::move(label),
            [backend, stager, all_mapped, stream, args]() -> Status {
                Result<StagedRun> run = stager->bind(args, stream);
                if (!run) return run.status();
                Result<Completion> done = stager->finish(std::move(*run), stream);
                if (!done) return done.status();
                if (Status waited = done->wait(); !waited) return waited;
                return all_mapped();
            },
            [stager] { return stager_copies(stager->stats()); }, [stager] { return stager_bytes(stager->stats()); },
            check};
    way.mapped = mapped;
    return way;
}

// Device memory, a pinned packed buffer and an event for the raw ways, freed with it.
struct RawTarget {
    CudaBackend& gpu;
    CudaBackend::Stream stream;
    CudaBackend::Event event{};
    std::byte* device = nullptr;
    std::byte* packed = nullptr;  // pinned, laid out In | InOut | Out at 1024, as a frame
    std::vector<std::size_t> offsets;
    std::size_t total = 0;
    // The packed copies: [0, upload_end) up, [copy_back_begin, copy_back_end) back.
    std::size_t upload_end = 0, copy_back_begin = 0, copy_back_end = 0;

    RawTarget(CudaBackend& g, CudaBackend::Stream s, std::span<const TensorArg> args) : gpu(g), stream(s) {
        offsets.resize(args.size());
        for (const Direction group : {Direction::In, Direction::InOut, Direction::Out}) {
            if (group == Direction::InOut) copy_back_begin = total;
            for (std::size_t i = 0; i < args.size(); ++i) {
                if (args[i].direction != group) continue;
                offsets[i] = total;
                total += align_up(args[i].bytes, 1024);
                if (group != Direction::Out) upload_end = offsets[i] + args[i].bytes;
                if (group != Direction::In) copy_back_end = offsets[i] + args[i].bytes;
            }
        }
        copy_back_begin = std::min(copy_back_begin, copy_back_end);
        Result<void*> d = gpu.device_malloc(total);
        if (!d) fail("raw: device_malloc", d.status());
        device = static_cast<std::byte*>(*d);
        Result<void*> p = gpu.pinned_malloc(total);
        if (!p) fail("raw: pinned_malloc", p.status());
        packed = static_cast<std::byte*>(*p);
        for (std::size_t i = 0; i < args.size(); ++i) std::memcpy(packed + offsets[i], args[i].data, args[i].bytes);
        Result<CudaBackend::Event> e = gpu.create_event();
        if (!e) fail("raw: create_event", e.status());
        event = *e;
    }
    RawTarget(const RawTarget&) = delete;
    RawTarget& operator=(const RawTarget&) = delete;
    ~RawTarget() {
        (void)gpu.destroy_event(event);
        (void)gpu.pinned_free(packed);
        (void)gpu.device_free(device);
    }
    Status wait() {
        if (Status s = gpu.record_event(event, stream); !s) return s;
        return gpu.synchronize_event(event);
    }
};

// What one raw way moved so far.
struct Counted {
    std::uint64_t copies = 0, bytes = 0;
    void add(std::size_t n) {
        ++copies;
        bytes += n;
    }
};

// The checked step of a raw way: its In/InOut bytes (of the packed buffer, or of the args) are
// on the device after the step and unchanged on the host (InOut ones came back).
Way raw_way(std::string label, const std::function<Status(RawTarget&, Counted&)>& step,
            const std::shared_ptr<RawTarget>& raw, std::span<const TensorArg> args, bool packed = false) {
    auto counted = std::make_shared<Counted>();
    auto check = [raw, counted, step, args, packed]() -> Status {
        const auto host_of = [&](std::size_t i) {
            return packed ? raw->packed + raw->offsets[i] : static_cast<const std::byte*>(args[i].data);
        };
        std::vector<std::vector<std::byte>> before;
        for (std::size_t i = 0; i < args.size(); ++i) {
            before.emplace_back(host_of(i), host_of(i) + (args[i].direction == Direction::Out ? 0 : args[i].bytes));
        }
        if (Status s = step(*raw, *counted); !s) return s;
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i].direction == Direction::Out) continue;
            Result<std::vector<std::byte>> on_device =
                device_bytes(raw->gpu, raw->device + raw->offsets[i], args[i].bytes);
            if (!on_device) return on_device.status();
            if (std::memcmp(on_device->data(), before[i].data(), args[i].bytes) != 0)
                return mismatch("device bytes", i);
            if (std::memcmp(host_of(i), before[i].data(), args[i].bytes) != 0) return mismatch("host bytes", i);
        }
        return {};
    };
    return {std::move(label), [raw, counted, step] { return step(*raw, *counted); },
            [counted] { return counted->copies; }, [counted] { return counted->bytes; }, check};
}

// The arrays of a raw batch each way: In/InOut args to their places in the device buffer, and
// InOut/Out args back.
struct RawBatch {
    struct Side {
        std::vector<void*> dsts;
        std::vector<const void*> srcs;
        std::vector<std::size_t> sizes;
        std::size_t bytes = 0;
    };
    Side up, down;
    RawBatch(std::span<const TensorArg> args, RawTarget& raw) {
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i].direction != Direction::Out) {
                up.dsts.push_back(raw.device + raw.offsets[i]);
                up.srcs.push_back(args[i].data);
                up.sizes.push_back(args[i].bytes);
                up.bytes += args[i].bytes;
            }
            if (args[i].direction != Direction::In) {
                down.dsts.push_back(args[i].data);
                down.srcs.push_back(raw.device + raw.offsets[i]);
                down.sizes.push_back(args[i].bytes);
                down.bytes += args[i].bytes;
            }
        }
    }
};

// Per tensor, to or from the tensor's place in the device buffer: In and InOut up, then InOut
// and Out back.
template <class Up, class Down>
Status per_tensor(std::span<const TensorArg> args, RawTarget& raw, Counted& counted, Up up, Down down) {
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (args[i].direction == Direction::Out) continue;
        if (Status s = up(raw.device + raw.offsets[i], args[i].data, args[i].bytes); !s) return s;
        counted.add(args[i].bytes);
    }
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (args[i].direction == Direction::In) continue;
        if (Status s = down(args[i].data, raw.device + raw.offsets[i], args[i].bytes); !s) return s;
        counted.add(args[i].bytes);
    }
    return {};
}

std::vector<Way> raw_ways(const std::shared_ptr<RawTarget>& raw, std::span<const TensorArg> args) {
    std::vector<Way> ways;
    ways.push_back(raw_way(
        "raw: cudaMemcpy per tensor",
        [args](RawTarget& r, Counted& c) {
            return per_tensor(
                args, r, c, [&r](void* d, const void* h, std::size_t n) { return r.gpu.copy_to_device(d, h, n); },
                [&r](void* h, const void* d, std::size_t n) { return r.gpu.copy_from_device(h, d, n); });
        },
        raw, args));
    ways.push_back(raw_way(
        "raw: cudaMemcpyAsync per tensor + 1 wait",
        [args](RawTarget& r, Counted& c) {
            Status enqueued = per_tensor(
                args, r, c,
                [&r](void* d, const void* h, std::size_t n) { return r.gpu.copy_to_device_async(d, h, n, r.stream); },
                [&r](void* h, const void* d, std::size_t n) {
                    return r.gpu.copy_from_device_async(h, d, n, r.stream);
                });
            return enqueued ? r.wait() : enqueued;
        },
        raw, args));
    ways.push_back(raw_way(
        "raw: packed, 1 H2D + 1 D2H async + 1 wait",
        [](RawTarget& r, Counted& c) -> Status {
            if (Status s = r.gpu.copy_to_device_async(r.device, r.packed, r.upload_end, r.stream); !s) return s;
            c.add(r.upload_end);
            const std::size_t back = r.copy_back_end - r.copy_back_begin;
            if (Status s = r.gpu.copy_from_device_async(r.packed + r.copy_back_begin, r.device + r.copy_back_begin,
                                                        back, r.stream);
                !s) {
                return s;
            }
            c.add(back);
            return r.wait();
        },
        raw, args, true));
    // One cudaMemcpyBatchAsync each way (the In/InOut tensors up, the InOut/Out ones back), from
    // and to the args, then one wait.
    auto batch = std::make_shared<RawBatch>(args, *raw);
    Way batched = raw_way(
        "raw: 1 batch H2D + 1 batch D2H + 1 wait",
        [batch](RawTarget& r, Counted& c) -> Status {
            for (const bool up : {true, false}) {
                RawBatch::Side& side = up ? batch->up : batch->down;
                Status s = up ? r.gpu.copy_to_device_batch(side.dsts.data(), side.srcs.data(), side.sizes.data(),
                                                           side.dsts.size(), r.stream)
                              : r.gpu.copy_from_device_batch(side.dsts.data(), side.srcs.data(), side.sizes.data(),
                                                             side.dsts.size(), r.stream);
                if (!s) return s;
                ++c.copies;
                c.bytes += side.bytes;
            }
            return r.wait();
        },
        raw, args);
    batched.available = raw->gpu.batch_copy_limit(raw->stream) >= 2;
    ways.push_back(std::move(batched));
    return ways;
}

// The order all_ways() lists them in.
enum : std::size_t {
    way_synchronous,
    way_synchronous_batch,
    way_stream,
    way_stream_two,
    way_stream_batch,
    way_stream_batch_two,
    way_packed,
    way_packed_batch,
    way_packed_all,
    way_mapped,
    way_mapped_all,
    way_frame,
    way_raw_memcpy,
    way_raw_async,
    way_raw_packed,
    way_raw_batch,
    way_count
};

std::vector<Way> all_ways(CudaBackend& gpu, CudaBackend::Stream stream, std::span<const TensorArg> args,
                          const std::shared_ptr<RawTarget>& raw) {
    const bool batches = gpu.batch_copy_limit(stream) >= 2;
    std::vector<Way> ways;
    ways.push_back(synchronous_way<PerCopy, PerTensor>("synchronous, per copy", gpu, stream, args));
    ways.push_back(synchronous_way<CudaBackend, PerTensor>("synchronous, batch", gpu, stream, args));
    ways.push_back(stream_way<PerCopy, PerTensor>("stream-ordered, per copy, 1 slot", gpu, stream, args));
    ways.push_back(stream_way<PerCopy, PerTensor>("stream-ordered, per copy, 2 slots", gpu, stream, args, 2));
    ways.push_back(stream_way<CudaBackend, PerTensor>("stream-ordered, batch, 1 slot", gpu, stream, args));
    ways.push_back(stream_way<CudaBackend, PerTensor>("stream-ordered, batch, 2 slots", gpu, stream, args, 2));
    ways.push_back(stream_way<PerCopy, Packed>("PackSmall<16384>, per copy", gpu, stream, args));
    ways.push_back(stream_way<CudaBackend, Packed>("PackSmall<16384>, batch", gpu, stream, args));
    ways.push_back(
        stream_way<PerCopy, PackedAll>("PackSmall<" + std::to_string(all_five_limit) + ">", gpu, stream, args));
    ways.push_back(mapped_way<Mapped>("MapSmall<16384> (no kernel: see below)", gpu, stream, args));
    ways.push_back(mapped_way<MappedAll>("MapSmall<" + std::to_string(all_five_limit) + "> (no kernel: see below)", gpu,
                                         stream, args));
    ways.push_back(frame_way("in-place frame", gpu, stream, args));
    for (Way& way : raw_ways(raw, args)) ways.push_back(std::move(way));
    for (const std::size_t w : {way_synchronous_batch, way_stream_batch, way_stream_batch_two, way_packed_batch}) {
        ways[w].available = batches;
    }
    for (const std::size_t w : {way_mapped, way_mapped_all}) ways[w].available = gpu.maps_host_memory();
    if (ways.size() != way_count) std::abort();
    return ways;
}

// The pinned copy rate each way, bytes per microsecond: one 64 MiB copy on `stream` and a
// wait, median of 5 (after one not counted). What the MapSmall rows' mapped bytes are timed at:
// a kernel's loads and stores of mapped memory cross the same link, with no call's latency.
struct PinnedRate {
    double up = 0, down = 0;  // bytes per microsecond (MB/s / 1e0: GB/s = value / 1e3)
};
PinnedRate pinned_rate(CudaBackend& gpu, CudaBackend::Stream stream) {
    constexpr std::size_t bytes = std::size_t{64} << 20;
    Result<void*> device = gpu.device_malloc(bytes);
    if (!device) fail("device_malloc for the pinned rate", device.status());
    Result<void*> host = gpu.pinned_malloc(bytes);
    if (!host) fail("pinned_malloc for the pinned rate", host.status());
    std::memset(*host, 0x5A, bytes);
    PinnedRate rate;
    for (const bool up : {true, false}) {
        std::vector<double> us;
        for (int i = 0; i < 6; ++i) {
            const auto start = Clock::now();
            Status s = up ? gpu.copy_to_device_async(*device, *host, bytes, stream)
                          : gpu.copy_from_device_async(*host, *device, bytes, stream);
            if (s) s = wait_for(gpu, stream);
            if (!s) fail("the pinned rate's copy", s);
            if (i > 0) us.push_back(us_since(start));
        }
        (up ? rate.up : rate.down) = static_cast<double>(bytes) / percentile(us, 0.5);
    }
    (void)gpu.pinned_free(*host);
    (void)gpu.device_free(*device);
    return rate;
}

// The microseconds `m`'s mapped bytes take at `rate`.
double mapped_us(const MappedBytes& m, const PinnedRate& rate) {
    return static_cast<double>(m.read) / rate.up + static_cast<double>(m.written) / rate.down;
}

void section_one(CudaBackend& gpu, const Options& options) {
    PinnedHostPool<CudaBackend> pool(gpu);
    qwen3::PinnedStorage storage(pool);
    const qwen3::Inputs set = qwen3::generate(storage, options.set_scale);
    if (!set.ok()) fail("generating the Qwen3 set", storage.status());
    // The small decode step: the set's tensors that do not scale — hidden_states (163840),
    // block_table (2048), slot_mapping (128), seq_lens (64) in, output (163840) out.
    std::vector<TensorArg> small;
    for (const std::string_view name : {"hidden_states", "block_table", "slot_mapping", "seq_lens", "output"}) {
        const auto at = std::find(set.names.begin(), set.names.end(), name) - set.names.begin();
        small.push_back(set.args[static_cast<std::size_t>(at)]);
    }
    Result<CudaBackend::Stream> stream = gpu.create_stream();
    if (!stream) fail("create_stream", stream.status());

    std::vector<Measured> small_results, set_results;
    std::vector<std::string> labels;
    {
        auto raw = std::make_shared<RawTarget>(gpu, *stream, small);
        std::vector<Way> ways = all_ways(gpu, *stream, small, raw);
        for (const Way& way : ways) labels.push_back(way.label);
        small_results = measure(ways, std::max(options.steps / 10, 10), options.steps);
    }
    {
        auto raw = std::make_shared<RawTarget>(gpu, *stream, set.args);
        std::vector<Way> ways = all_ways(gpu, *stream, set.args, raw);
        set_results = measure(ways, std::max(options.set_steps / 10, 5), options.set_steps);
    }
    const PinnedRate rate = gpu.maps_host_memory() ? pinned_rate(gpu, *stream) : PinnedRate{};
    (void)gpu.destroy_stream(*stream);

    double in_mb = 0, in_out_mb = 0, out_mb = 0;
    for (const TensorArg& a : set.args) {
        const double mb = static_cast<double>(a.bytes) / 1e6;
        (a.direction == Direction::In ? in_mb : a.direction == Direction::InOut ? in_out_mb : out_mb) += mb;
    }
    std::printf(
        "\n1. One decode step, pinned host memory: copies, bytes moved and microseconds per step\n"
        "   (median and 90th percentile of the measured steps, taken in rounds over all ways after a warm-up)\n"
        "   small step: 4 In tensors of 163840, 2048, 128, 64 bytes and one 163840-byte Out tensor, %d steps\n"
        "   Qwen3 set:  19 tensors at scale %g, %.1f MB (In %.1f, InOut %.1f, Out %.2f), %d steps\n\n",
        options.steps, options.set_scale, static_cast<double>(set.total_bytes) / 1e6, in_mb, in_out_mb, out_mb,
        options.set_steps);
    std::printf("%-44s | %-37s | %-41s\n", "", "small step", "Qwen3 set");
    std::printf("%-44s | %6s %8s %10s %9s | %6s %9s %12s %10s\n", "way of staging", "copies", "KiB", "us median",
                "us p90", "copies", "MB", "us median", "us p90");
    for (std::size_t w = 0; w < labels.size(); ++w) {
        const Measured& a = small_results[w];
        const Measured& b = set_results[w];
        if (a.median_us == 0 || b.median_us == 0) {
            const bool mapped = w == way_mapped || w == way_mapped_all;
            std::printf("%-44s | %-37s | %-41s\n", labels[w].c_str(),
                        mapped ? "n/a (the device maps no host memory)" : "n/a (no cudaMemcpyBatchAsync)", "n/a");
            continue;
        }
        std::printf("%-44s | %6.1f %8.1f %10.1f %9.1f | %6.1f %9.2f %12.1f %10.1f\n", labels[w].c_str(), a.copies,
                    a.bytes / 1024, a.median_us, a.p90_us, b.copies, b.bytes / 1e6, b.median_us, b.p90_us);
    }
    std::printf(
        "(each way's bytes were checked in one step before its warm-up: the uploads on the device,\n"
        " InOut bytes back unchanged, Out args zeroed)\n");
    const auto ratio = [&](const char* what, std::size_t way, std::size_t limit) {
        if (small_results[way].median_us == 0 || small_results[limit].median_us == 0) {
            std::printf("%-66s n/a\n", what);
            return;
        }
        std::printf("%-66s small step %5.2fx   Qwen3 set %5.2fx\n", what,
                    small_results[way].median_us / small_results[limit].median_us,
                    set_results[way].median_us / set_results[limit].median_us);
    };
    std::printf("\nmedians against the raw limits:\n");
    ratio("in-place frame / raw packed (goal: at most 1.10x)", way_frame, way_raw_packed);
    ratio("stream-ordered batch, 1 slot / raw packed", way_stream_batch, way_raw_packed);
    ratio("stream-ordered batch, 1 slot / raw 1 batch each way", way_stream_batch, way_raw_batch);
    ratio("raw 1 batch each way / raw cudaMemcpyAsync per tensor", way_raw_batch, way_raw_async);
    ratio("stream-ordered per copy, 1 slot / raw cudaMemcpyAsync per tensor", way_stream, way_raw_async);
    ratio("synchronous per copy / raw cudaMemcpy per tensor", way_synchronous, way_raw_memcpy);

    if (!gpu.maps_host_memory()) {
        std::printf("\nMapSmall rows: n/a, the device maps no host memory (CudaBackend::maps_host_memory)\n");
        return;
    }
    std::printf(
        "\nMapSmall rows: no kernel runs, so their times above leave out the bytes a kernel reads and writes\n"
        "in the mapped mirror over the link as it runs. Per step, and timed at the pinned copy rates measured\n"
        "here (one 64 MiB copy each way, median of 5: %.2f GB/s up, %.2f GB/s back) with no call's latency\n"
        "(an estimate: a kernel's loads and stores of mapped memory need not reach a copy's rate):\n",
        rate.up / 1e3, rate.down / 1e3);
    for (const std::size_t w : {way_mapped, way_mapped_all}) {
        const MappedBytes& a = small_results[w].mapped;
        const MappedBytes& b = set_results[w].mapped;
        std::printf("  %-17s small step: %.1f KiB read, %.1f KiB written, %.2f us; Qwen3 set: %.1f, %.1f, %.2f us\n",
                    labels[w].substr(0, labels[w].find(' ')).c_str(), static_cast<double>(a.read) / 1024,
                    static_cast<double>(a.written) / 1024, mapped_us(a, rate), static_cast<double>(b.read) / 1024,
                    static_cast<double>(b.written) / 1024, mapped_us(b, rate));
    }
    const auto with_mapped = [&](const char* what, std::size_t way, std::size_t limit) {
        const auto of = [&](const std::vector<Measured>& r) {
            return (r[way].median_us + mapped_us(r[way].mapped, rate)) / r[limit].median_us;
        };
        std::printf("%-66s small step %5.2fx   Qwen3 set %5.2fx\n", what, of(small_results), of(set_results));
    };
    with_mapped("MapSmall<262144> + mapped bytes / raw packed (goal: below 1.00x)", way_mapped_all, way_raw_packed);
    with_mapped("MapSmall<16384> + mapped bytes / raw packed", way_mapped, way_raw_packed);
}

// ---- sections 2-4 (synchronous staging of a larger set) -------------------------------------

struct StepTimes {
    double bind_ms, finish_ms, step_ms, mallocs_per_step;
    std::uint64_t up, down;
};

template <class Strategy>
StepTimes decode(CudaBackend& gpu, std::span<const TensorArg> args, int steps) {
    Stager<CudaBackend, Strategy> stager(gpu);
    std::vector<double> bind, finish, step;
    std::uint64_t mallocs_after_first = 0;
    for (int i = 0; i < steps; ++i) {
        const auto t0 = Clock::now();
        Result<StagedRun> run = stager.bind(args);  // returns once the uploads are on the device
        if (!run) fail("bind", run.status());
        const double b = us_since(t0) / 1e3;
        const auto t1 = Clock::now();
        if (Status s = stager.finish(std::move(*run)); !s) fail("finish", s);
        const double f = us_since(t1) / 1e3;
        if (i == 0) {
            mallocs_after_first = stager.stats().device_mallocs;
            continue;
        }
        bind.push_back(b);
        finish.push_back(f);
        step.push_back(b + f);
    }
    const StagerStats& s = stager.stats();
    return {percentile(bind, 0.5),
            percentile(finish, 0.5),
            percentile(step, 0.5),
            static_cast<double>(s.device_mallocs - mallocs_after_first) / std::max(steps - 1, 1),
            s.bytes_to_device / s.runs,
            s.bytes_from_device / s.runs};
}

void sections_two_to_four(CudaBackend& gpu, const Options& options) {
    PinnedHostPool<CudaBackend> pool(gpu);
    qwen3::PinnedStorage storage(pool);
    const auto generated = Clock::now();
    const qwen3::Inputs pinned = qwen3::generate(storage, options.scale);
    if (!pinned.ok()) fail("generating the Qwen3 set", storage.status());
    // The same bytes in pageable memory.
    std::vector<std::unique_ptr<std::byte[]>> pageable_blocks;
    std::vector<TensorArg> pageable;
    for (const TensorArg& arg : pinned.args) {
        pageable_blocks.push_back(std::make_unique_for_overwrite<std::byte[]>(arg.bytes));
        std::memcpy(pageable_blocks.back().get(), arg.data, arg.bytes);
        pageable.push_back({pageable_blocks.back().get(), arg.bytes, arg.direction});
    }
    std::printf(
        "\nQwen3 set at scale %g for sections 2 and 3: %.2f GB (prepared in %.1f s), %d steps each, "
        "synchronous staging, medians after the first step\n",
        options.scale, static_cast<double>(pinned.total_bytes) / 1e9, us_since(generated) / 1e6, options.scale_steps);

    std::printf("\n2. decode steady state (pinned inputs)\n%-16s %12s %22s\n", "strategy", "ms/step",
                "device mallocs/step");
    const StepTimes retained = decode<RetainedBump<>>(gpu, pinned.args, options.scale_steps);
    const StepTimes per_tensor = decode<PerTensorMalloc<>>(gpu, pinned.args, options.scale_steps);
    std::printf("%-16s %12.2f %22.1f\n%-16s %12.2f %22.1f\nRetainedBump speed-up %.2fx\n", "RetainedBump",
                retained.step_ms, retained.mallocs_per_step, "PerTensorMalloc", per_tensor.step_ms,
                per_tensor.mallocs_per_step, per_tensor.step_ms / retained.step_ms);

    std::printf("\n3. copy throughput, RetainedBump (GB/s; bind = uploads, finish = copy-backs)\n%-10s %10s %10s\n",
                "host", "H2D", "D2H");
    const StepTimes paged = decode<RetainedBump<>>(gpu, pageable, options.scale_steps);
    for (const auto& [label, t] : {std::pair{"pinned", retained}, std::pair{"pageable", paged}}) {
        std::printf("%-10s %10.2f %10.2f\n", label, static_cast<double>(t.up) / (t.bind_ms * 1e6),
                    static_cast<double>(t.down) / (t.finish_ms * 1e6));
    }

    std::printf("\n4. pinned allocation of 64 MiB (microseconds, median of 20)\n");
    PinnedHostPool<CudaBackend, DirectPinned> direct(gpu);
    std::vector<double> direct_us, cached_us;
    for (int i = 0; i < 20; ++i) {
        auto t = Clock::now();
        {
            auto b = direct.allocate(64 << 20);
            if (!b) fail("cudaHostAlloc of 64 MiB", b.status());
        }
        direct_us.push_back(us_since(t));
        { auto warm = pool.allocate(64 << 20); }
        t = Clock::now();
        { auto b = pool.allocate(64 << 20); }
        cached_us.push_back(us_since(t));
    }
    std::printf("%-44s %10.1f\n%-44s %10.1f\n", "cudaHostAlloc + cudaFreeHost (DirectPinned)",
                percentile(direct_us, 0.5), "PinnedHostPool cache hit (CachingPinned)", percentile(cached_us, 0.5));
}

// ---- section 5: one large pageable arg, directly and through the pageable ring -------------

// One way of staging the large arg: from pageable memory directly (the driver stages it), or
// through a PageableRing with `threads` copy threads besides the caller, or from pinned memory.
struct RingWay {
    std::string label;
    bool pinned = false;
    std::optional<std::size_t> threads;  // the ring's copy threads; none: no ring
};

// GB/s of one synchronous bind + finish of `arg` (an In arg: the upload; an Out arg: the
// copy-back), median over the steps after the first (which allocates the device buffer and
// makes the ring and its threads).
double ring_way_gbps(CudaBackend& gpu, const TensorArg& arg, const RingWay& way, int steps) {
    Stager<CudaBackend> stager(gpu);
    if (way.threads) {
        if (Status set = stager.set_pageable_ring(PageableRing{.threads = *way.threads}); !set) {
            fail("set_pageable_ring", set);
        }
    }
    std::vector<double> us;
    for (int i = 0; i < steps; ++i) {
        const auto start = Clock::now();
        Result<StagedRun> run = stager.bind(std::span(&arg, 1));
        if (!run) fail(way.label + ": bind", run.status());
        if (Status s = stager.finish(std::move(*run)); !s) fail(way.label + ": finish", s);
        if (i > 0) us.push_back(us_since(start));
    }
    if (way.threads && (stager.stats().ring_uploads + stager.stats().ring_copy_backs) == 0) {
        fail(way.label, Status(Errc::invalid_argument, "the ring staged nothing"));
    }
    if (Status released = stager.release(); !released) fail(way.label + ": release", released);
    return static_cast<double>(arg.bytes) / (percentile(us, 0.5) * 1e3);
}

void section_five(CudaBackend& gpu, const Options& options) {
    std::vector<std::size_t> sizes_mib;
    for (const std::size_t mib : {std::size_t{64}, std::size_t{256}, std::size_t{1024}}) {
        if (mib <= options.ring_max_mib) sizes_mib.push_back(mib);
    }
    if (sizes_mib.empty()) sizes_mib.push_back(options.ring_max_mib);
    std::vector<RingWay> ways{{"pageable, direct", false, std::nullopt}};
    for (const std::size_t threads : {0, 1, 2, 4, 8}) {
        ways.push_back({"pageable, ring, " + std::to_string(threads) + " threads", false, threads});
    }
    ways.push_back({"pinned, direct (reference)", true, std::nullopt});
    const PageableRing defaults;
    std::printf(
        "\n5. one large arg from pageable memory, directly and through the pageable ring (GB/s of one\n"
        "   synchronous bind + finish: up = one In arg, back = one Out arg; median of %d steps after the first)\n"
        "   ring: PageableRing defaults (threshold %zu MiB, %zu chunks of %zu MiB), N copy threads besides the "
        "caller\n\n",
        options.ring_steps - 1, defaults.threshold >> 20, defaults.chunks, defaults.chunk_bytes >> 20);
    std::printf("%-32s", "way");
    for (const std::size_t mib : sizes_mib) std::printf(" | %5zu MiB up %7s", mib, "back");
    std::printf("\n");
    // rates[way][size][0: up, 1: back]
    std::vector<std::vector<std::pair<double, double>>> rates(ways.size());
    for (const std::size_t mib : sizes_mib) {
        const std::size_t bytes = mib << 20;
        auto pageable = std::make_unique_for_overwrite<std::byte[]>(bytes);
        std::memset(pageable.get(), 0x5A, bytes);
        Result<void*> pinned = gpu.pinned_malloc(bytes);
        if (!pinned) fail("pinned_malloc of the section 5 reference", pinned.status());
        std::memset(*pinned, 0x5A, bytes);
        for (std::size_t w = 0; w < ways.size(); ++w) {
            double up = 0, back = 0;
            for (const Direction direction : {Direction::In, Direction::Out}) {
                TensorArg arg{ways[w].pinned ? *pinned : pageable.get(), bytes, direction};
                arg.memory = ways[w].pinned ? HostMemory::pinned : HostMemory::pageable;
                (direction == Direction::In ? up : back) = ring_way_gbps(gpu, arg, ways[w], options.ring_steps);
            }
            rates[w].emplace_back(up, back);
        }
        (void)gpu.pinned_free(*pinned);
    }
    for (std::size_t w = 0; w < ways.size(); ++w) {
        std::printf("%-32s", ways[w].label.c_str());
        for (const auto& [up, back] : rates[w]) std::printf(" | %12.2f %7.2f", up, back);
        std::printf("\n");
    }
    const auto at = std::find(sizes_mib.begin(), sizes_mib.end(), std::size_t{1024});
    if (at == sizes_mib.end()) {
        std::printf(
            "\ngoal (a 1 GiB pageable upload through the ring at 20 GB/s or more on an H200): not measured "
            "(--ring-max-mib below 1024)\n");
        return;
    }
    const auto size = static_cast<std::size_t>(at - sizes_mib.begin());
    std::size_t best = 1;
    for (std::size_t w = 1; w + 1 < ways.size(); ++w) {
        if (rates[w][size].first > rates[best][size].first) best = w;
    }
    const double best_up = rates[best][size].first;
    std::printf(
        "\ngoal: a 1 GiB pageable upload through the ring at 20 GB/s or more on an H200: %.2f GB/s (%s; "
        "direct %.2f GB/s, %.2fx): %s\n",
        best_up, ways[best].label.c_str(), rates[0][size].first, best_up / rates[0][size].first,
        best_up >= 20 ? "met" : "not met");
}

}  // namespace

// The tensors of section 1, one line each: "<set> <In|InOut|Out> <bytes>" (no GPU needed).
int list_sets(const Options& options) {
    qwen3::PageableStorage storage;
    const qwen3::Inputs set = qwen3::generate(storage, options.set_scale);
    if (!set.ok()) fail("generating the Qwen3 set", Status(Errc::invalid_argument, "bad scale"));
    const auto direction = [](Direction d) {
        return d == Direction::In ? "In" : d == Direction::InOut ? "InOut" : "Out";
    };
    for (std::size_t i = 0; i < set.args.size(); ++i) {
        for (const std::string_view name : {"hidden_states", "block_table", "slot_mapping", "seq_lens", "output"}) {
            if (set.names[i] == name)
                std::printf("small %s %zu\n", direction(set.args[i].direction), set.args[i].bytes);
        }
    }
    for (const TensorArg& arg : set.args) std::printf("qwen3 %s %zu\n", direction(arg.direction), arg.bytes);
    return 0;
}

int main(int argc, char** argv) {
    const Options options = parse(argc, argv);
    if (options.list_sets) return list_sets(options);
    const Runtime runtime = find_runtime();
    if (runtime.name.empty()) {
        std::printf(
            "no GPU: cannot load the CUDA runtime (libcudart.so.13, .12, .so, $DEVSTAGE_CUDART_LIBRARY, or "
            "a copy next to this program)\n");
        return 77;
    }
    Result<CudaBackend> gpu = CudaBackend::create(0, runtime.name);
    if (!gpu) {
        std::printf("no GPU: %s\n", gpu.status().message().c_str());
        return 77;
    }
    const auto start = Clock::now();
    char date[64] = {};
    const std::time_t now = std::time(nullptr);
    (void)std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    std::printf("devstage gpu_bench, %s\n", date);
    print_device(runtime, gpu->device_id());
    if (gpu->batch_runtime_version() > 0) {
        std::printf("cudaMemcpyBatchAsync: resolved, in the form of CUDA %s\n",
                    cuda_version(gpu->batch_runtime_version()).c_str());
    } else {
        std::printf("cudaMemcpyBatchAsync: not in this runtime (the batch rows are n/a)\n");
    }
    if (!options.ring_only) {
        section_one(*gpu, options);
        sections_two_to_four(*gpu, options);
    }
    section_five(*gpu, options);
    std::printf("\ntotal %.1f s\n", us_since(start) / 1e6);
    return 0;
}
