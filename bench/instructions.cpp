// SPDX-License-Identifier: Apache-2.0
// CPU cost of staging, counted in instructions (deterministic, unlike a clock): bind+finish of
// a run of mixed tensors over a backend whose copies do nothing, beside a bare prefix sum of
// the same aligned sizes. Run under valgrind's callgrind with --toggle-collect='*measure_*'
// (bench/instructions.sh does, and divides by runs x tensors).
//
//   instructions MODE [tensors (default 1000)] [runs (default 10)]
//   MODE: retained | packed | mapped | per-tensor | prefix-sum
//         stream-retained | stream-packed | stream-mapped: a pipelined decode loop on two slots
//         over a backend with streams whose copies do nothing and whose events are always
//         complete; each step binds on its own slot's host buffers (nothing shared), finishes on
//         the stream and drops the previous step's Completion (instructions.sh reports these per
//         step)
//   "mapped": RetainedBump with MapSmall<16384> over the same backends with map_host (the
//   device address is the host address): the args of at most 16 KiB in the mapped mirror,
//   gathered and unpacked by the host, the larger ones copied
//   A "-zeroed" suffix zeroes Out args (OutputPolicy::zero); without it, kernel_writes_all.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "devstage/devstage.hpp"

namespace {
using namespace devstage;

// Device and pinned memory from the host allocator; copies that do nothing.
class NullCopyBackend {
public:
    static constexpr std::size_t device_alignment = 256;
    std::string_view name() const noexcept { return "null-copy"; }
    Result<void*> device_malloc(std::size_t n) noexcept { return allocate(n); }
    Status device_free(void* p) noexcept {
        std::free(p);
        return {};
    }
    Result<void*> pinned_malloc(std::size_t n) noexcept { return allocate(n); }
    Status pinned_free(void* p) noexcept {
        std::free(p);
        return {};
    }
    Status copy_to_device(void*, const void*, std::size_t) noexcept { return {}; }
    Status copy_from_device(void*, const void*, std::size_t) noexcept { return {}; }

private:
    static Result<void*> allocate(std::size_t n) noexcept {
        void* p =
            std::aligned_alloc(device_alignment, (n + device_alignment - 1) / device_alignment * device_alignment);
        if (p == nullptr) return Status(Errc::out_of_memory, "null-copy: out of memory");
        return p;
    }
};

// NullCopyBackend with streams and events: copies do nothing, every event is complete.
class NullAsyncBackend : public NullCopyBackend {
public:
    struct Stream {
        int id = 0;
        friend bool operator==(Stream, Stream) = default;
    };
    struct Event {
        int id = 0;
    };
    Result<Stream> create_stream() noexcept { return Stream{1}; }
    Status destroy_stream(Stream) noexcept { return {}; }
    Status copy_to_device_async(void*, const void*, std::size_t, Stream) noexcept { return {}; }
    Status copy_from_device_async(void*, const void*, std::size_t, Stream) noexcept { return {}; }
    Result<Event> create_event() noexcept { return Event{1}; }
    Status destroy_event(Event) noexcept { return {}; }
    Status record_event(Event, Stream) noexcept { return {}; }
    Result<bool> event_ready(Event) noexcept { return true; }
    Status synchronize_event(Event) noexcept { return {}; }
    Status stream_wait_event(Stream, Event) noexcept { return {}; }
};

// The null backends with mapped pinned memory: a mapping's device address is its host address.
template <class Base>
class NullMapped : public Base {
public:
    static constexpr std::size_t host_map_alignment = 1;
    Result<void*> map_host(void* host, std::size_t) noexcept { return host; }
    Status unmap_host(void*) noexcept { return {}; }
};
static_assert(MappedHostBackend<NullMapped<NullCopyBackend>> && MappedHostBackend<NullMapped<NullAsyncBackend>>);

std::vector<TensorArg> make_args(std::size_t count, std::vector<std::byte>& host) {
    host.assign(std::size_t{70} << 10, std::byte{1});
    std::vector<TensorArg> args;
    for (std::size_t i = 0; i < count; ++i) {
        args.push_back(TensorArg{host.data(), 512 + (i * 7919) % 65536, static_cast<Direction>(i % 3)});
    }
    return args;
}

using Mapped = RetainedBump<ExactGrowth, 1024, MapSmall<>>;

template <class S>
[[gnu::noinline]] void measure_bind_finish(S& stager, const std::vector<TensorArg>& args, int runs) {
    for (int r = 0; r < runs; ++r) {
        auto run = stager.bind(args);
        if (!run || !stager.finish(std::move(*run))) std::abort();
    }
}

[[gnu::noinline]] void measure_prefix_sum(const std::vector<TensorArg>& args, std::vector<std::size_t>& offsets,
                                          int runs) {
    for (int r = 0; r < runs; ++r) {
        std::size_t end = 0;
        for (std::size_t i = 0; i < args.size(); ++i) {
            offsets[i] = end;
            end += (args[i].bytes + 1023) & ~std::size_t{1023};
        }
        asm volatile("" : : "r"(offsets.data()), "r"(end) : "memory");
    }
}

// Two pipelined steps in flight at a time, each on its own host buffers.
template <class S>
void stream_loop(S& stager, std::vector<TensorArg> (&args)[2], NullAsyncBackend::Stream stream, int runs) {
    Completion previous;
    for (int r = 0; r < runs; ++r) {
        auto run = stager.bind(args[r % 2], stream);
        if (!run) std::abort();
        auto done = stager.finish(std::move(*run), stream);
        if (!done) std::abort();
        previous = std::move(*done);
    }
}
template <class S>
[[gnu::noinline]] void measure_stream_steps(S& stager, std::vector<TensorArg> (&args)[2],
                                            NullAsyncBackend::Stream stream, int runs) {
    stream_loop(stager, args, stream, runs);
}

template <class Strategy, class B = NullAsyncBackend>
int stream_steps(std::size_t tensors, int runs, OutputPolicy outputs) {
    // Decode-step sizes: 256 B to 4 KiB, each slot's args on its own host buffer.
    std::vector<std::byte> host[2];
    std::vector<TensorArg> args[2];
    for (int s = 0; s < 2; ++s) {
        host[s].assign(tensors << 12, std::byte{1});
        for (std::size_t i = 0; i < tensors; ++i) {
            args[s].push_back(
                TensorArg{host[s].data() + (i << 12), 256 + (i * 997) % 3841, static_cast<Direction>(i % 3)});
        }
    }
    B backend;
    Stager<B, Strategy> stager(backend, Strategy{}, 2);
    stager.set_output_policy(outputs);
    const NullAsyncBackend::Stream stream{1};
    stream_loop(stager, args, stream, 2);  // outside the collection: a first step on each slot grows it
    measure_stream_steps(stager, args, stream, runs);
    // A mapping backend: every run mapped (else this counted the copying path).
    if (MappedHostBackend<B> && stager.stats().mapped_runs != stager.stats().runs) return 1;
    return 0;
}

template <class Strategy, class B = NullCopyBackend>
int stage(const std::vector<TensorArg>& args, int runs, OutputPolicy outputs) {
    B backend;
    Stager<B, Strategy> stager(backend);
    stager.set_output_policy(outputs);
    auto first = stager.bind(args);  // outside the collection: the first run grows
    if (!first || !stager.finish(std::move(*first))) return 1;
    measure_bind_finish(stager, args, runs);
    if (MappedHostBackend<B> && stager.stats().mapped_runs != stager.stats().runs) return 1;
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    std::string_view mode = argc > 1 ? argv[1] : "retained";
    const std::size_t tensors = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1000;
    const int runs = argc > 3 ? std::atoi(argv[3]) : 10;
    std::vector<std::byte> host;
    const std::vector<TensorArg> args = make_args(tensors, host);
    // "-zeroed": Out args zeroed (OutputPolicy::zero, here by uploads of zeros: the null backends
    // have no memset); without it the no-zeroing path (kernel_writes_all).
    constexpr std::string_view zeroed = "-zeroed";
    OutputPolicy outputs = OutputPolicy::kernel_writes_all;
    if (mode.size() > zeroed.size() && mode.substr(mode.size() - zeroed.size()) == zeroed) {
        outputs = OutputPolicy::zero;
        mode.remove_suffix(zeroed.size());
    }
    if (mode == "retained") return stage<RetainedBump<>>(args, runs, outputs);
    if (mode == "packed") return stage<RetainedBump<ExactGrowth, 1024, PackSmall<>>>(args, runs, outputs);
    if (mode == "mapped") return stage<Mapped, NullMapped<NullCopyBackend>>(args, runs, outputs);
    if (mode == "per-tensor") return stage<PerTensorMalloc<>>(args, runs, outputs);
    if (mode == "stream-retained") return stream_steps<RetainedBump<>>(tensors, runs, outputs);
    if (mode == "stream-packed") {
        return stream_steps<RetainedBump<ExactGrowth, 1024, PackSmall<>>>(tensors, runs, outputs);
    }
    if (mode == "stream-mapped") return stream_steps<Mapped, NullMapped<NullAsyncBackend>>(tensors, runs, outputs);
    if (mode == "prefix-sum") {
        std::vector<std::size_t> offsets(args.size());
        measure_prefix_sum(args, offsets, runs);
        return 0;
    }
    std::fprintf(stderr,
                 "usage: instructions retained|packed|mapped|per-tensor|prefix-sum|stream-retained|stream-packed|"
                 "stream-mapped[-zeroed] [tensors] [runs]\n");
    return 2;
}
