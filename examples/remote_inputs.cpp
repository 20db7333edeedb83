// SPDX-License-Identifier: Apache-2.0
// Remote inputs: a producer process writes each decode step's inputs straight into a consumer
// process's frames with UCX one-sided puts (ucp_put_nbx); the consumer binds the frames on the
// simulator, runs the step and checks every output byte against the same step computed on the
// host.
//
// The consumer registers its frames' memory once: region hooks map each pinned region with
// ucp_mem_map when it is added and unmap it when it is removed, and each region's packed remote
// key goes to the producer over a loopback TCP socket. A frame's tensors are then named as
// (region, offset, bytes), which the producer turns into a remote address. Where the frames lie:
//   --memory region  a region of a pinned pool (create_region), the stager's mirrors carved out
//                    of it (StagerOptions::mirror_source): one registration for every frame;
//                    the pool's hooks and describe();
//   --memory stager  the stager's own mirrors: its hooks map each one, and a mirror that grows is
//                    removed and its successor added while the producer writes.
// With two pipeline slots the writes for step k + 1 land while step k runs; a frame belongs to
// the engine from frame() until its Completion, so sequential equivalence holds.
//
//   remote_inputs [--steps N] [--transport tcp|sm] [--memory region|stager]
//
// --transport tcp sets UCX_TLS=tcp on the loopback interface; sm, UCX's shared-memory
// transports. A machine where UCX cannot start prints why and exits with 77 (a skipped test).

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"
#include "devstage/pinned/mirror_source.hpp"
#include "loopback_channel.hpp"
#include "ucx_link.hpp"

namespace {

using devstage::Errc;
using devstage::Result;
using devstage::Status;

// ---- the step -----------------------------------------------------------------------------

constexpr std::size_t vocab = 256;
constexpr std::size_t blocks_per_sequence = 32;
// The batch of each step: it grows now and then, so the frames' mirrors grow and their regions
// are removed and added again while the producer writes.
constexpr std::array<std::size_t, 6> batches{4, 8, 8, 16, 64, 32};

std::size_t batch_of(std::size_t step) {
    return batches[std::min(step / 3, batches.size() - 1)];
}

enum Tensor : std::size_t { tokens, positions, block_table, temperatures, logits, tensor_count };

std::array<devstage::TensorShape, tensor_count> shapes_of(std::size_t batch) {
    return {{{batch * 4, devstage::Direction::In},
             {batch * 4, devstage::Direction::In},
             {batch * blocks_per_sequence * 4, devstage::Direction::In},
             {batch * 4, devstage::Direction::In},
             {batch * vocab * 4, devstage::Direction::Out}}};
}

// Step `step`'s input `tensor` as the producer writes it (the consumer makes the same for its
// reference).
std::vector<std::byte> input(std::size_t step, std::size_t tensor, std::size_t batch) {
    const std::size_t count = tensor == block_table ? batch * blocks_per_sequence : batch;
    std::vector<std::byte> bytes(count * 4);
    for (std::size_t i = 0; i < count; ++i) {
        std::uint32_t word = 0;
        if (tensor == temperatures) {
            const float t = 0.5F + static_cast<float>(i) * 0.01F + static_cast<float>(step) * 0.001F;
            std::memcpy(&word, &t, 4);
        } else {
            word = static_cast<std::uint32_t>((step * 2654435761U + i * 40503U + tensor * 977U) % 151936U);
        }
        std::memcpy(bytes.data() + i * 4, &word, 4);
    }
    return bytes;
}

// The step's arithmetic, on the device's copies by the kernel and on the host's by the
// reference: every logit reads every input of its sequence.
void compute(std::span<const std::byte* const, 4> in, std::byte* out, std::size_t batch) {
    for (std::size_t b = 0; b < batch; ++b) {
        std::int32_t token = 0, position = 0;
        float temperature = 0;
        std::memcpy(&token, in[tokens] + b * 4, 4);
        std::memcpy(&position, in[positions] + b * 4, 4);
        std::memcpy(&temperature, in[temperatures] + b * 4, 4);
        std::uint32_t table = 0;
        for (std::size_t j = 0; j < blocks_per_sequence; ++j) {
            std::uint32_t block = 0;
            std::memcpy(&block, in[block_table] + (b * blocks_per_sequence + j) * 4, 4);
            table = table * 31 + block;
        }
        for (std::size_t v = 0; v < vocab; ++v) {
            const float logit = static_cast<float>((static_cast<std::uint32_t>(token) ^ table) % 1021U) * 0.25F +
                                static_cast<float>(position % 4093) * 0.5F + temperature * static_cast<float>(v);
            std::memcpy(out + (b * vocab + v) * 4, &logit, 4);
        }
    }
}

// ---- messages ------------------------------------------------------------------------------

enum class Kind : std::uint8_t { address, region, forget, step, written, done };

class Writer {
public:
    explicit Writer(Kind kind) : bytes_{static_cast<std::byte>(kind)} {}
    template <class T>
    Writer& put(const T& value) {
        const auto* begin = reinterpret_cast<const std::byte*>(&value);
        bytes_.insert(bytes_.end(), begin, begin + sizeof value);
        return *this;
    }
    Writer& put_bytes(std::span<const std::byte> data) {
        put(static_cast<std::uint64_t>(data.size()));
        bytes_.insert(bytes_.end(), data.begin(), data.end());
        return *this;
    }
    std::span<const std::byte> bytes() const { return bytes_; }
    std::vector<std::byte> take() { return std::move(bytes_); }

private:
    std::vector<std::byte> bytes_;
};

class Reader {
public:
    explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
    template <class T>
    T get() {
        T value{};
        if (bytes_.size() < sizeof value) {
            ok_ = false;
            return value;
        }
        std::memcpy(&value, bytes_.data(), sizeof value);
        bytes_ = bytes_.subspan(sizeof value);
        return value;
    }
    std::vector<std::byte> get_bytes() {
        const auto size = get<std::uint64_t>();
        if (!ok_ || bytes_.size() < size) {
            ok_ = false;
            return {};
        }
        std::vector<std::byte> data(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(size));
        bytes_ = bytes_.subspan(size);
        return data;
    }
    bool ok() const { return ok_; }

private:
    std::span<const std::byte> bytes_;
    bool ok_ = true;
};

Status malformed(const char* what) {
    return Status(Errc::invalid_argument, std::string("remote inputs: a malformed ") + what + " message");
}

// ---- the producer ----------------------------------------------------------------------------

// Connects to the consumer, then writes each step's inputs where the consumer's step message
// says, into the regions whose remote keys it was sent.
Status produce(std::uint16_t port, std::size_t& puts) {
    Result<loopback::Channel> channel = loopback::Channel::connect(port);
    if (!channel) return channel.status();
    Result<ucx::Peer> peer = ucx::Peer::create();
    if (!peer) return peer.status();
    Result<std::vector<std::byte>> hello = channel->receive();
    if (!hello) return hello.status();
    Reader address(*hello);
    if (address.get<Kind>() != Kind::address) return malformed("address");
    Result<ucx::Endpoint> endpoint = ucx::Endpoint::connect(*peer, address.get_bytes());
    if (!endpoint) return endpoint.status();
    struct Remote {
        std::uint64_t base = 0;
        std::size_t bytes = 0;
        std::size_t key = 0;
    };
    std::map<std::uint64_t, Remote> regions;  // by region id
    for (;;) {
        Result<std::vector<std::byte>> message = channel->receive([&] { peer->progress(); });
        if (!message) return message.status();
        Reader in(*message);
        switch (in.get<Kind>()) {
            case Kind::region: {
                const auto id = in.get<std::uint64_t>();
                const auto base = in.get<std::uint64_t>();
                const auto bytes = in.get<std::uint64_t>();
                const std::vector<std::byte> key = in.get_bytes();
                if (!in.ok()) return malformed("region");
                Result<std::size_t> unpacked = endpoint->add_key(key);
                if (!unpacked) return unpacked.status();
                regions[id] = Remote{base, static_cast<std::size_t>(bytes), *unpacked};
                break;
            }
            case Kind::forget:
                regions.erase(in.get<std::uint64_t>());
                break;
            case Kind::step: {
                const auto step = in.get<std::uint64_t>();
                const auto batch = in.get<std::uint64_t>();
                for (std::size_t tensor = 0; tensor < logits; ++tensor) {
                    const auto region = in.get<std::uint64_t>();
                    const auto offset = in.get<std::uint64_t>();
                    const auto bytes = in.get<std::uint64_t>();
                    if (!in.ok()) return malformed("step");
                    const auto found = regions.find(region);
                    const std::vector<std::byte> data = input(step, tensor, batch);
                    if (found == regions.end() || offset + bytes > found->second.bytes || bytes != data.size()) {
                        return Status(Errc::invalid_argument, "remote inputs: step " + std::to_string(step) +
                                                                  " names memory outside the regions it was sent");
                    }
                    if (Status put =
                            endpoint->put(data.data(), data.size(), found->second.base + offset, found->second.key);
                        !put) {
                        return put;
                    }
                    ++puts;
                }
                // Every put is complete at the consumer before it hears that the step is written.
                if (Status flushed = endpoint->flush(); !flushed) return flushed;
                if (Status sent = channel->send(Writer(Kind::written).put(step).bytes()); !sent) return sent;
                break;
            }
            case Kind::done:
                return {};
            default:
                return malformed("producer's");
        }
    }
}

// ---- the consumer ----------------------------------------------------------------------------

using Packed = devstage::RetainedBump<devstage::ExactGrowth, 1024, devstage::PackSmall<>>;
using Stager = devstage::Stager<devstage::SimBackend, Packed>;
using Pool = devstage::PinnedHostPool<devstage::SimBackend>;

// Where a frame tensor lies, as (region, offset, bytes): the pool's describe() or the stager's.
using Describe = std::function<std::optional<devstage::RegionSlice>(const void*)>;

// Its pinned regions mapped for the producer: mapped when the stager adds one, unmapped when it
// removes one. The messages for the producer wait in an outbox until the stager call returns.
class Registrations {
public:
    explicit Registrations(const ucx::Peer& peer) : peer_(&peer) {}

    devstage::RegionHooks hooks() {
        return {.added = [this](const devstage::PinnedRegion& region) { return add(region); },
                .removing = [this](const devstage::PinnedRegion& region) { remove(region); }};
    }
    Status send_pending(loopback::Channel& channel) {
        for (const std::vector<std::byte>& message : outbox_) {
            if (Status sent = channel.send(message); !sent) return sent;
        }
        outbox_.clear();
        return {};
    }
    std::size_t added() const { return added_; }
    std::size_t removed() const { return removed_; }

private:
    Status add(const devstage::PinnedRegion& region) {
        if (region.kind != devstage::RegionKind::pinned_host) return {};  // the producer writes host memory only
        Result<ucx::MappedMemory> mapped = ucx::MappedMemory::map(*peer_, region.base, region.bytes);
        if (!mapped) return mapped.status();  // the stager's grow fails, and it stays usable
        outbox_.push_back(Writer(Kind::region)
                              .put(region.id)
                              .put(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(region.base)))
                              .put(static_cast<std::uint64_t>(region.bytes))
                              .put_bytes(mapped->key())
                              .take());
        mapped_.emplace(region.id, std::move(*mapped));
        ++added_;
        return {};
    }
    void remove(const devstage::PinnedRegion& region) {
        if (mapped_.erase(region.id) == 0) return;  // unmapped before the stager frees it
        ++removed_;
        outbox_.push_back(Writer(Kind::forget).put(region.id).take());
    }

    const ucx::Peer* peer_;
    std::map<std::uint64_t, ucx::MappedMemory> mapped_;
    std::vector<std::vector<std::byte>> outbox_;
    std::size_t added_ = 0, removed_ = 0;
};

// The kernel stand-in of one slot: compute() on the run's device args, launched with what it
// reads and writes (the simulator checks and charges it). Launched gated, it starts computing
// once the gate opens, so the consumer can keep a step in flight while the next step's inputs
// are written.
class Kernel {
public:
    explicit Kernel(devstage::SimBackend& backend) : backend_(&backend) {}

    Status launch(devstage::SimBackend::Stream stream, std::span<const devstage::TensorArg> args, std::size_t batch,
                  bool gated) {
        batch_ = batch;
        open_.store(!gated);
        for (std::size_t i = 0; i < tensor_count; ++i) {
            args_[i] = args[i];
            accesses_[i] = devstage::KernelAccess{args[i].data, args[i].bytes, i != logits, i == logits};
        }
        return backend_->launch_kernel(stream, &Kernel::on_stream, this, accesses_);
    }
    void open() {
        open_.store(true);
        open_.notify_all();
    }

private:
    static void on_stream(void* self) noexcept {
        auto* kernel = static_cast<Kernel*>(self);
        kernel->open_.wait(false);
        const std::array<const std::byte*, 4> in{static_cast<const std::byte*>(kernel->args_[tokens].data),
                                                 static_cast<const std::byte*>(kernel->args_[positions].data),
                                                 static_cast<const std::byte*>(kernel->args_[block_table].data),
                                                 static_cast<const std::byte*>(kernel->args_[temperatures].data)};
        compute(in, static_cast<std::byte*>(kernel->args_[logits].data), kernel->batch_);
    }

    devstage::SimBackend* backend_;
    std::array<devstage::TensorArg, tensor_count> args_{};
    std::array<devstage::KernelAccess, tensor_count> accesses_{};
    std::size_t batch_ = 0;
    std::atomic<bool> open_{true};
};

// What a consumer's run counted.
struct Counts {
    std::size_t steps = 0, gated = 0, overlapped = 0;
};

// The step's logits as the host computes them from the inputs the producer writes.
std::vector<std::byte> reference(std::size_t step, std::size_t batch) {
    std::array<std::vector<std::byte>, 4> in;
    std::array<const std::byte*, 4> pointers{};
    for (std::size_t tensor = 0; tensor < 4; ++tensor) {
        in[tensor] = input(step, tensor, batch);
        pointers[tensor] = in[tensor].data();
    }
    std::vector<std::byte> out(batch * vocab * 4);
    compute(pointers, out.data(), batch);
    return out;
}

// A frame for step `step`, its tensors named to the producer as (region, offset, bytes).
Result<devstage::HostFrame> request(Stager& stager, const Describe& describe, Registrations& registrations,
                                    loopback::Channel& channel, std::size_t step) {
    const std::size_t batch = batch_of(step);
    const auto shapes = shapes_of(batch);
    Result<devstage::HostFrame> frame = stager.frame(shapes);  // a mirror that grows: its regions change
    if (!frame) return frame.status();
    if (Status sent = registrations.send_pending(channel); !sent) return sent;
    Writer message(Kind::step);
    message.put(static_cast<std::uint64_t>(step)).put(static_cast<std::uint64_t>(batch));
    for (std::size_t tensor = 0; tensor < logits; ++tensor) {
        const std::optional<devstage::RegionSlice> slice = describe(frame->host(tensor).data());
        if (!slice || slice->bytes < frame->host(tensor).size()) {
            return Status(Errc::invalid_argument, "remote inputs: a frame tensor lies in no region");
        }
        message.put(slice->region)
            .put(static_cast<std::uint64_t>(slice->offset))
            .put(static_cast<std::uint64_t>(frame->host(tensor).size()));
    }
    if (Status sent = channel.send(message.bytes()); !sent) return sent;
    return frame;
}

// Receives the producer's word that step `step` is written, progressing UCX meanwhile.
Status written(loopback::Channel& channel, const ucx::Peer& peer, std::size_t step) {
    Result<std::vector<std::byte>> message = channel.receive([&] { peer.progress(); });
    if (!message) return message.status();
    Reader in(*message);
    if (in.get<Kind>() != Kind::written || in.get<std::uint64_t>() != step || !in.ok()) return malformed("written");
    return {};
}

// The consumer's steps. Step k is bound, launched and finished; then the frame of step k + 1 is
// asked for on the other slot and written by the producer; then step k completes and is
// checked. Once the other slot has held a batch as big as step k + 1's, its frame needs no grow
// (a grow frees device memory, which waits for the device, as cudaFree does): step k's kernel
// is then launched gated, and the inputs of step k + 1 are written while step k is in flight.
Status run_steps(Stager& stager, const Describe& describe, devstage::SimBackend& backend, loopback::Channel& channel,
                 const ucx::Peer& peer, std::size_t steps, Counts& counts, Registrations& registrations) {
    Result<devstage::SimBackend::Stream> stream = backend.create_stream();
    if (!stream) return stream.status();
    std::array<Kernel, 2> kernels{Kernel(backend), Kernel(backend)};
    std::array<std::size_t, 2> largest{0, 0};  // the largest batch each slot held
    Status failure;
    Result<devstage::HostFrame> next = request(stager, describe, registrations, channel, 0);
    if (next) failure = written(channel, peer, 0);
    for (std::size_t step = 0; step < steps && failure.ok(); ++step) {
        if (!next) {
            failure = next.status();
            break;
        }
        devstage::HostFrame frame = std::move(*next);
        const std::size_t batch = batch_of(step);
        Result<devstage::StagedRun> run = stager.bind(frame, *stream);
        if (!run) {
            failure = run.status();
            break;
        }
        const std::size_t slot = run->slot();
        largest[slot] = std::max(largest[slot], batch);
        const bool gated = step + 1 < steps && batch_of(step + 1) <= largest[1 - slot];
        Kernel& kernel = kernels[slot];
        if (failure = kernel.launch(*stream, run->device_args(), batch, gated); !failure) break;
        counts.gated += gated ? 1 : 0;
        Result<devstage::Completion> done = stager.finish(std::move(*run), *stream);
        if (!done) {
            kernel.open();
            failure = done.status();
            break;
        }
        if (step + 1 < steps) {
            next = request(stager, describe, registrations, channel, step + 1);
            if (next) failure = written(channel, peer, step + 1);
            // A gated step k is still in flight now (an ungated one may be too, or not: not counted).
            const Result<bool> ran = done->ready();
            if (gated && ran && !*ran) ++counts.overlapped;  // step k + 1 was written while step k was in flight
        }
        kernel.open();
        if (!failure) break;
        if (failure = done->wait(); !failure) break;
        const std::vector<std::byte> expected = reference(step, batch);
        const std::span<const std::byte> got = frame.host(logits);
        if (got.size() != expected.size() || std::memcmp(got.data(), expected.data(), got.size()) != 0) {
            failure = Status(Errc::invalid_argument,
                             "remote inputs: step " + std::to_string(step) + "'s logits differ from the host's");
            break;
        }
        ++counts.steps;
    }
    (void)channel.send(Writer(Kind::done).bytes());
    if (Status released = stager.release(); !released && failure.ok()) failure = released;
    (void)backend.destroy_stream(*stream);
    return failure;
}

// The consumer: its frames in a pool's region registered once, or in the stager's own mirrors
// registered as each is made.
Status consume(loopback::Channel& channel, const ucx::Peer& peer, std::size_t steps, bool region_memory, Counts& counts,
               Registrations& registrations) {
    devstage::SimBackend backend;
    if (!region_memory) {
        Stager stager(backend, Packed{}, devstage::StagerOptions{.pipeline_slots = 2});
        if (Status hooked = stager.set_region_hooks(registrations.hooks()); !hooked) return hooked;
        const Describe describe = [&stager](const void* p) { return stager.describe(p); };
        return run_steps(stager, describe, backend, channel, peer, steps, counts, registrations);
    }
    Pool pool(backend);
    if (Status hooked = pool.set_region_hooks(registrations.hooks()); !hooked) return hooked;
    Result<devstage::PinnedRegionHandle> region = pool.create_region(std::size_t{16} << 20);
    if (!region) return region.status();
    if (Status ready = region->wait(); !ready) return ready;
    Stager stager(
        backend, Packed{},
        devstage::StagerOptions{.pipeline_slots = 2, .mirror_source = devstage::mirror_source(region->allocator())});
    const Describe describe = [&pool](const void* p) { return pool.describe(p); };
    return run_steps(stager, describe, backend, channel, peer, steps, counts, registrations);
}

struct Options {
    std::size_t steps = 48;
    std::string transport = "tcp";
    bool region_memory = true;
};

std::optional<Options> parse(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (i + 1 >= argc) return std::nullopt;
        const std::string_view value = argv[++i];
        if (flag == "--steps") {
            char* end = nullptr;
            const unsigned long long steps = std::strtoull(argv[i], &end, 10);
            if (*end != '\0' || steps == 0) return std::nullopt;
            options.steps = steps;
        } else if (flag == "--transport" && (value == "tcp" || value == "sm")) {
            options.transport = value;
        } else if (flag == "--memory" && (value == "region" || value == "stager")) {
            options.region_memory = value == "region";
        } else {
            return std::nullopt;
        }
    }
    return options;
}

}  // namespace

int main(int argc, char** argv) {
    const std::optional<Options> options = parse(argc, argv);
    if (!options) {
        std::fprintf(stderr, "usage: remote_inputs [--steps N] [--transport tcp|sm] [--memory region|stager]\n");
        return 2;
    }
    if (options->transport == "tcp") {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
    } else {
        setenv("UCX_TLS", "sm,self", 1);
    }
    Result<loopback::Channel> listening = loopback::Channel::listen();
    if (!listening) {
        std::fprintf(stderr, "remote_inputs: %s\n", listening.status().message().c_str());
        return 1;
    }
    std::fflush(stdout);
    const pid_t producer = fork();
    if (producer < 0) {
        std::perror("remote_inputs: fork");
        return 1;
    }
    if (producer == 0) {  // UCX starts after the fork, in each process
        std::size_t puts = 0;
        const Status produced = produce(listening->port(), puts);
        if (!produced) std::fprintf(stderr, "remote_inputs producer: %s\n", produced.message().c_str());
        std::_Exit(produced.ok() ? 0 : 1);
    }
    Result<loopback::Channel> channel = listening->accept();
    Result<ucx::Peer> peer = channel ? ucx::Peer::create() : Result<ucx::Peer>(channel.status());
    Result<std::vector<std::byte>> address = peer ? peer->address() : Result<std::vector<std::byte>>(peer.status());
    if (!address) {
        // UCX cannot start here: say why, and skip.
        std::printf("remote_inputs: skipped: UCX over %s cannot start: %s\n", options->transport.c_str(),
                    address.status().message().c_str());
        if (channel) loopback::Channel closed = std::move(*channel);  // the producer sees it close, and stops
        int ignored = 0;
        (void)waitpid(producer, &ignored, 0);
        return 77;
    }
    Status sent = channel->send(Writer(Kind::address).put_bytes(*address).bytes());
    Counts counts;
    Registrations registrations(*peer);
    Status consumed =
        sent.ok() ? consume(*channel, *peer, options->steps, options->region_memory, counts, registrations) : sent;
    int status = 0;
    if (waitpid(producer, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (consumed.ok()) consumed = Status(Errc::backend_failure, "remote_inputs: the producer failed");
    }
    if (!consumed) {
        std::fprintf(stderr, "remote_inputs: %s\n", consumed.message().c_str());
        return 1;
    }
    std::printf(
        "remote_inputs over UCX %s, frames in %s: %zu steps written by the producer straight into the consumer's "
        "frames and checked bitwise; %zu written while the step before was in flight (of %zu gated); region "
        "maps %zu, unmaps %zu\n",
        options->transport.c_str(), options->region_memory ? "a pool's region" : "the stager's mirrors", counts.steps,
        counts.overlapped, counts.gated, registrations.added(), registrations.removed());
    // Every gated step was still in flight when the next one was written. A pool's region is
    // mapped once; the stager's mirrors grew, so their regions came and went.
    const bool registered = options->region_memory ? registrations.added() == 1 && registrations.removed() == 1
                                                   : registrations.removed() > 0;
    const bool whole = counts.steps == options->steps && counts.overlapped == counts.gated &&
                       (options->steps < 16 || (counts.gated > 0 && registered));
    return whole ? 0 : 1;
}
