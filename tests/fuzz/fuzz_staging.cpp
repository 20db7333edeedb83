// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: random sequences of a Stager's operations over MockBackend — binds and
// finishes, synchronous or on one of several streams; Completion wait / ready / detach / drop;
// pipeline slots and bind_slot; frames; reserve; detach / adopt; drop, release and abandon —
// with random arg lists (an In arg may read the bytes of another arg of the same run) and
// injected faults (at the call of any backend operation — batches of copies, memsets, maps and
// unmaps included — and when an enqueued copy, memset or batch runs), for each strategy
// (packing and mapping ones included), with batched copies or without, over the eager mock and
// the deferred one (enqueued work runs only when the host synchronizes, in an adversarial order).
// A stand-in kernel, run in stream order as a host function (or before a synchronous finish),
// computes each run's outputs from all of its inputs.
//
// After every step: every device and pinned allocation is accounted for (the stager's, the
// caller's, or forgotten by abandon), the stager holds no more than its slots, live leases and
// deferred frees explain, the mock saw no misuse (nothing freed or synchronously touched while
// pending work uses it), and every error carries a message. Once a run's finish or Completion
// returned ok its outputs equal a reference model (its inputs are never written; its outputs are
// untouched when the execution failed); with no fault injected every valid call succeeds. At the
// end the stager runs clean runs again, holds nothing after release(), and once destroyed leaves
// nothing behind but what abandon forgot.
//
// Input: byte 0 picks the strategy (bits 0-2) and the mock's batch limit (bits 3-4), byte 1 the
// mock and stager set-up, then one operation per byte followed by its operands.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/devstage.hpp"
#include "fuzz_support.hpp"

namespace {
using namespace devstage;

constexpr std::size_t stream_count = 3;
constexpr std::size_t sizes[] = {0, 1, 63, 64, 1023, 1024, 1025, 4096, 16384, 16385, 70000};
constexpr std::size_t size_count = std::size(sizes);

class Input {
public:
    Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
    bool empty() const { return at_ >= size_; }
    std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }

private:
    const std::uint8_t* data_;
    std::size_t size_;
    std::size_t at_ = 0;
};

std::vector<std::byte> pattern(std::size_t bytes, std::uint8_t seed) {
    std::vector<std::byte> out(bytes);
    std::uint32_t x = seed * 2654435761u + 1;
    for (std::byte& b : out) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b = static_cast<std::byte>(x);
    }
    return out;
}

// The stand-in kernel's function over host copies of a run's args: every staged Out/InOut arg is
// rewritten from the bytes of every In/InOut arg (staged or Device), so each output depends on
// every upload. `data[i]` holds arg i's bytes (empty for Out args, which are not read).
void compute(std::vector<std::vector<std::byte>>& data, std::span<const TensorArg> args,
             const std::vector<bool>& staged, std::uint8_t value) {
    std::uint8_t mix = 0;
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (args[i].direction == Direction::Out) continue;
        for (std::byte b : data[i]) mix = static_cast<std::uint8_t>(mix * 31 + static_cast<std::uint8_t>(b));
    }
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (!staged[i] || args[i].direction == Direction::In) continue;
        data[i].resize(args[i].bytes);
        for (std::size_t b = 0; b < data[i].size(); ++b) {
            const unsigned old = args[i].direction == Direction::Out ? 0u : static_cast<unsigned>(data[i][b]);
            data[i][b] = static_cast<std::byte>(old ^ static_cast<std::uint8_t>(mix + value + i + b));
        }
    }
}

// The kernel on the device. Device code makes no runtime calls: it reads and writes the mock's
// device memory (host memory underneath, as a mapped mirror is) directly, so a fault injected
// into a backend call never reaches it, and every run it executes computes its outputs. It runs
// as a host function in stream order, or directly before a synchronous finish. Memory freed
// under it is a heap use-after-free, which the sanitizer reports.
struct Kernel {
    std::vector<TensorArg> device;
    std::vector<bool> staged;
    std::uint8_t value = 0;

    static void launch(void* self) { static_cast<Kernel*>(self)->run(); }

    void run() {
        std::vector<std::vector<std::byte>> data(device.size());
        for (std::size_t i = 0; i < device.size(); ++i) {
            if (device[i].bytes == 0 || device[i].direction == Direction::Out) continue;
            const auto* at = static_cast<const std::byte*>(device[i].data);
            data[i].assign(at, at + device[i].bytes);
        }
        compute(data, device, staged, value);
        for (std::size_t i = 0; i < device.size(); ++i) {
            if (!staged[i] || device[i].direction == Direction::In) continue;
            std::memcpy(device[i].data, data[i].data(), data[i].size());
        }
    }
};

// One run: its host memory, what it held before the run and what it must hold after.
struct Record {
    std::vector<std::vector<std::byte>> host;  // the run's host memory (a frame's is the mirror)
    std::vector<TensorArg> args;
    std::vector<bool> staged;
    std::vector<std::vector<std::byte>> before, after;
    std::optional<HostFrame> frame;
    const std::byte* mirror = nullptr;  // where the frame was handed out
    std::size_t slot = 0;
    std::uint64_t epoch = 0;  // of the slot's mirror, when the host memory is a frame
    Kernel kernel;
    bool streamed = false;
    std::size_t stream = 0;
    bool launched = false;
    Status launch_status;
    bool execution_ok = true;
    bool inert = false;      // dropped by release or abandon while live
    bool abandoned = false;  // an abandon came while its results were still on the way
    bool detached = false;
    bool in_place = false;     // a mapped frame: its kernel writes its tensors where they lie
    bool maybe_bound = false;  // a frame whose bind failed: it may or may not still be bindable
    // Per arg: the earlier arg of this run whose bytes an In arg reads (it has none of its own).
    std::vector<std::optional<std::size_t>> alias_of;

    std::span<const std::byte> bytes(std::size_t i) const {
        if (frame) {
            const std::span<std::byte> in_frame = frame->host(i);
            return {in_frame.data(), in_frame.size()};
        }
        if (i < alias_of.size() && alias_of[i]) return host[*alias_of[i]];
        return host[i];
    }
    bool holds(std::size_t i, const std::vector<std::byte>& expected) const {
        const std::span<const std::byte> now = bytes(i);
        return std::equal(now.begin(), now.end(), expected.begin(), expected.end());
    }
    // The model's outputs, from the bytes before the run (a Device arg's: its device contents).
    void model() {
        after = before;
        compute(after, args, staged, kernel.value);
    }
};

bool uses_mock_memory(const TensorArg& arg) {
    return arg.placement == Placement::Device && arg.bytes > 0;
}

template <class Strategy>
class Harness {
public:
    using StagerT = Stager<MockBackend, Strategy>;
    // A strategy with a mirror; the stager packs (and hands out frames) when its pack limit,
    // chosen at run time, is above 0.
    static constexpr bool mirrored = requires(StagerT & s, std::span<const TensorShape> shapes) { s.frame(shapes); };
    bool packs() const noexcept {
        if constexpr (mirrored) {
            return stager->pack_limit() > 0;
        } else {
            return false;
        }
    }
    static constexpr bool retained = requires(StagerT & s) { s.detach(std::size_t{0}); };

    Harness(std::uint8_t config, std::size_t batch_limit, Strategy strategy)
        : mock(mock_config(config, batch_limit)), slots_(1 + ((config >> 1) & 3) % 3), limited_((config & 0x10) != 0) {
        for (MockBackend::Stream& stream : streams) {
            Result<MockBackend::Stream> created = mock.create_stream();
            EXPECT(created.ok());
            stream = *created;
        }
        stager.emplace(mock, std::move(strategy), slots_);
        stager->set_error_sink(&fuzz::quiet);
        epochs_.assign(slots_, 0);
    }
    Harness(const Harness&) = delete;
    Harness& operator=(const Harness&) = delete;

    ~Harness() {
        clear_faults();
        pending.clear();
        live.clear();
        stager.reset();
        scan_journal();
        // What the stager held is back with the mock; what abandon forgot and frees the mock
        // refused remain.
        EXPECT(static_cast<std::int64_t>(mock.live_device_allocations()) == expected_device() + kept_device_);
        EXPECT(mock.live_pinned_allocations() == abandoned_pinned_ + refused_pinned_ + refused_unmaps_ + kept_pinned_);
        EXPECT(mock.live_events() <= refused_events_ + 2 * slots_ * abandons_);
        EXPECT(abandons_ > 0 || mock.live_events() == refused_events_);
        // Destroying the streams runs their pending work (a forgotten run's, too): into memory
        // that is still live.
        for (MockBackend::Stream stream : streams) EXPECT(mock.destroy_stream(stream).ok());
        EXPECT(mock.misuses() == 0);
        for (void* p : external) (void)mock.device_free(p);
        for (void* p : spare) (void)mock.device_free(p);
        for (const RetainedBuffer& buffer : detached) (void)mock.device_free(buffer.allocation);
    }

    void step(Input& in) {
        switch (in.byte() % 16) {
            case 0:
            case 1:
                bind(in);
                break;
            case 2:
            case 3:
                finish(in);
                break;
            case 4:
                complete(in);
                break;
            case 5:
                drop(in);
                break;
            case 6:
                frame(in);
                break;
            case 7:
                bind_frame(in);
                break;
            case 8:
                release();
                break;
            case 9:
                abandon();
                break;
            case 10:
                reserve(in);
                break;
            case 11:
                arm(in, false);
                break;
            case 12:
                arm(in, true);
                break;
            case 13:
                clear_faults();
                break;
            case 14:
                host(in);
                break;
            default:
                buffers(in);
                break;
        }
        check();
    }

    // Winds everything down as an engine would, then runs clean runs. With `keep_alive` the
    // stager is destroyed under live runs and pending completions instead.
    void end(bool keep_alive) {
        clear_faults();
        if (keep_alive) {
            // Work that cannot be waited for (a sticky failure) keeps its memory past the
            // stager's destruction, and the destructor says so to the error sink.
            const std::int64_t held = stager_held();
            const std::uint64_t mirrors = mirrors_held();
            bool unwaited = false;
            auto watch = [&unwaited](const Status& status) noexcept {
                unwaited = unwaited || status.message().find("could not be waited for") != std::string_view::npos;
            };
            stager->set_error_sink(ErrorSink::to(watch));
            stager.reset();
            scan_journal();
            kept_device_ = static_cast<std::int64_t>(mock.live_device_allocations()) - expected_device();
            kept_pinned_ = mock.live_pinned_allocations() - (abandoned_pinned_ + refused_pinned_ + refused_unmaps_);
            EXPECT(kept_device_ >= 0 && kept_device_ <= held && (unwaited || kept_device_ == 0));
            EXPECT(kept_pinned_ <= mirrors && (unwaited || kept_pinned_ == 0));
            for (const Pending& p : pending) EXPECT(!p.done.pending());
            for (const Live& l : live) EXPECT(!l.run.live());
            return;
        }
        for (Pending& p : pending) {
            const Status waited = p.done.wait();
            if (p.done.pending()) {
                // Still not known complete: dropping the Completion reports to the sink and
                // leaves the slot to release(), below.
                EXPECT(!waited.ok() && !fault_free());
                continue;
            }
            verify(*p.record, waited, true);
        }
        pending.clear();
        while (!live.empty()) drop_at(live.size() - 1);
        for (Record* r : framed) r->frame.reset();  // unbound frames given back: release() refuses under one
        framed.clear();
        Status released = stager->release();
        if (!released) {
            // Work whose wait failed keeps its slot's memory; once the failures are forgotten
            // (every run was waited for) a second release() waits for it and frees it.
            EXPECT(!released.message().empty());
            released_all(released);
            mock.clear_failures();
            released = stager->release();
            EXPECT(released.ok());
        }
        released_all(released);
        // A detached run's outputs arrive once its slot is settled: release() settled them all.
        if (fault_free()) {
            for (const auto& r : records) {
                if (r->detached && !r->abandoned && !r->frame) verify(*r, Status(), true);
            }
        }
        check();
        mock.clear_failures();  // every run was waited for: what failed was reported
        clean_runs();
        check();
    }

private:
    struct Live {
        StagedRun run;
        Record* record;
    };
    struct Pending {
        Completion done;
        Record* record;
        bool holds = false;  // a frame's run: its Completion holds the slot until destroyed or detached
    };

    static MockConfig mock_config(std::uint8_t config, std::size_t batch_limit) {
        MockConfig mock{.offset = (config & 0x08) != 0 ? MockBackend::device_alignment : 0,
                        .sink = &fuzz::quiet,
                        .deferred_async = (config & 0x01) != 0,
                        .not_ready_polls = static_cast<std::uint32_t>((config >> 5) % 4),
                        .batch_copy_limit = batch_limit};
        if ((config & 0x10) != 0) mock.device_capacity = 300000;
        return mock;
    }

    // ---- operations ---------------------------------------------------------------------

    void bind(Input& in) {
        const std::uint8_t how = in.byte();
        const bool streamed = (how & 1) != 0;
        const bool chosen = ((how >> 1) & 3) == 0;
        const bool launch_now = ((how >> 3) & 1) != 0;
        const std::size_t slot = in.byte() % (slots_ + 1);
        const std::size_t stream = in.byte() % stream_count;
        Record& r = new_record();
        bool null = false, alias = false;
        make_args(in, r, null, alias);
        const bool any_free = free_slots() > 0;
        const bool taken = chosen && slot < slots_ && slot_taken(slot);
        const std::span<const TensorArg> args = r.args;
        Result<StagedRun> bound =
            chosen ? (streamed ? stager->bind_slot(slot, args, streams[stream]) : stager->bind_slot(slot, args))
                   : (streamed ? stager->bind(args, streams[stream]) : stager->bind(args));
        if (!bound) {
            EXPECT(!bound.status().message().empty());
            bump_all();
            for (std::size_t i = 0; i < r.args.size(); ++i) {
                if (r.staged[i]) EXPECT(r.holds(i, r.before[i]));  // a failed bind writes no caller memory
            }
            if (fault_free()) {
                Errc expected = Errc::ok;
                if (chosen && slot >= slots_) {
                    expected = Errc::invalid_argument;
                } else if (taken || (!chosen && !any_free)) {
                    expected = Errc::busy;
                } else if (null) {
                    expected = Errc::invalid_argument;
                } else if (alias) {
                    expected = Errc::busy;
                }
                EXPECT(bound.status().code() == expected);
            }
            return;
        }
        EXPECT(!null && !alias && !taken && !(chosen && slot >= slots_));
        EXPECT(!chosen || bound->slot() == slot);
        start(r, std::move(*bound), streamed, stream);
        bump(r.slot);
        if (launch_now) launch(r, live.back().run);
    }

    void finish(Input& in) {
        const std::uint8_t pick = in.byte();
        const std::uint8_t how = in.byte();
        if (live.empty()) return;
        const std::size_t index = pick % live.size();
        const bool streamed = (how & 1) != 0;
        const std::size_t stream = ((how >> 1) & 3) % stream_count;
        const bool execution_ok = ((how >> 3) & 3) != 0;
        const bool launch_anyway = ((how >> 5) & 1) != 0;
        const bool host_sync = ((how >> 6) & 1) != 0;
        Live& entry = live[index];
        Record& r = *entry.record;
        if (!entry.run.live()) {  // dropped by release or abandon: left untouched
            if (streamed) {
                Result<Completion> done = stager->finish(std::move(entry.run), streams[stream]);
                EXPECT(!done.ok() && done.status().code() == Errc::invalid_argument);
            } else {
                const Status finished = stager->finish(std::move(entry.run));
                EXPECT(finished.code() == Errc::invalid_argument && !finished.message().empty());
            }
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
            return;
        }
        if (execution_ok || launch_anyway) launch(r, entry.run);
        const Status execution =
            execution_ok ? r.launch_status : Status(Errc::backend_failure, "fuzz kernel: declared failed");
        r.execution_ok = execution.ok();
        if (!streamed && r.streamed && r.launched && host_sync) {
            // A synchronous finish needs the kernel done: wait for the whole device.
            if (Status synced = mock.synchronize(); !synced) EXPECT(!synced.message().empty());
        }
        if (streamed) {
            Result<Completion> done = stager->finish(std::move(entry.run), streams[stream], execution);
            if (done) {
                pending.push_back(Pending{std::move(*done), &r, r.frame.has_value()});
            } else {
                verify(r, done.status(), true);  // an error at the call: after what was enqueued completed
            }
        } else {
            verify(r, stager->finish(std::move(entry.run), execution), true);
        }
        EXPECT(!entry.run.live());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
    }

    void complete(Input& in) {
        const std::uint8_t pick = in.byte();
        const std::uint8_t how = in.byte();
        if (pending.empty()) return;
        const std::size_t index = pick % pending.size();
        Pending& p = pending[index];
        Record& r = *p.record;
        // A wait that fails while the work is not known complete leaves the Completion pending:
        // the run's host memory is still devstage's, so nothing of it is checked yet.
        auto still_pending = [&](const Status& waited) {
            if (!p.done.pending()) return false;
            EXPECT(!waited.ok() && !waited.message().empty() && !fault_free());
            return true;
        };
        switch (how % 6) {
            case 0:
            case 1: {
                const Status waited = p.done.wait();
                if (still_pending(waited)) return;
                verify(r, waited, true);
                EXPECT(p.done.wait().code() == waited.code());
                break;
            }
            case 2: {
                Result<bool> ready = p.done.ready();
                if (!ready) {
                    EXPECT(!ready.status().message().empty());
                    return;
                }
                if (!*ready) {
                    EXPECT(p.done.pending());
                    return;
                }
                const Status waited = p.done.wait();
                if (still_pending(waited)) return;
                verify(r, waited, true);
                break;
            }
            case 3: {  // poll until ready, as an engine that never blocks
                bool done = false;
                for (int polls = 0; polls < 16 && !done; ++polls) {
                    Result<bool> ready = p.done.ready();
                    if (!ready) EXPECT(!ready.status().message().empty());
                    done = ready.ok() && *ready;
                }
                if (!done) {
                    EXPECT(!fault_free());  // the deferred mock answers "not ready" at most 3 times
                    return;
                }
                const Status waited = p.done.wait();
                if (still_pending(waited)) return;
                verify(r, waited, true);
                break;
            }
            case 4:
                p.done.detach();
                EXPECT(!p.done.pending());
                r.detached = true;
                p.holds = false;
                break;
            default:
                // Dropped: the destructor waits, so the outputs are in place; the result went to
                // the sink, and without faults (and abandon) it was ok.
                pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(index));
                if (fault_free() && !r.abandoned) verify(r, Status(), true);
                return;
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(index));
    }

    void drop(Input& in) {
        const std::uint8_t pick = in.byte();
        if (!live.empty()) drop_at(pick % live.size());
    }

    void drop_at(std::size_t index) {
        Record& r = *live[index].record;
        const bool was_live = live[index].run.live();
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));  // releases without copying back
        if (!was_live || !readable(r)) return;
        for (std::size_t i = 0; i < r.args.size(); ++i) {
            if (r.staged[i]) EXPECT(r.holds(i, r.before[i]));
        }
    }

    void frame(Input& in) {
        if constexpr (mirrored) {
            if (!packs()) {
                const TensorShape shape{64, Direction::In};
                EXPECT(stager->frame(std::span(&shape, 1)).status().code() == Errc::not_supported);
                return;
            }
            std::vector<TensorShape> shapes(in.byte() % 7);
            for (TensorShape& shape : shapes) {
                shape.bytes = sizes[in.byte() % size_count];
                shape.direction = static_cast<Direction>(in.byte() % 3);
            }
            const bool any_free = free_slots() > 0;
            Result<HostFrame> made = stager->frame(shapes);
            if (!made) {
                EXPECT(!made.status().message().empty());
                bump_all();
                if (shapes.empty()) {
                    EXPECT(made.status().code() == Errc::invalid_argument);
                } else if (fault_free()) {
                    EXPECT(!any_free && made.status().code() == Errc::busy);
                }
                return;
            }
            EXPECT(any_free && !shapes.empty() && made->size() == shapes.size());
            unframed(made->slot(), nullptr);
            Record& r = new_record();
            r.frame.emplace(std::move(*made));
            r.slot = r.frame->slot();
            r.mirror = stager->strategy(r.slot).mirror();
            bump(r.slot);
            const std::uint8_t seed = in.byte();
            for (std::size_t i = 0; i < shapes.size(); ++i) {
                const std::span<std::byte> host = r.frame->host(i);
                EXPECT(host.size() == shapes[i].bytes);
                if (shapes[i].direction != Direction::Out) {
                    const std::vector<std::byte> bytes = pattern(host.size(), static_cast<std::uint8_t>(seed + i));
                    std::copy(bytes.begin(), bytes.end(), host.begin());
                }
                r.args.push_back(r.frame->args()[i]);
                r.staged.push_back(shapes[i].bytes > 0);
                r.before.emplace_back(host.begin(), host.end());
            }
            r.kernel.value = in.byte();
            r.model();
            framed.push_back(&r);
        } else {
            reserve(in);
        }
    }

    // A frame's bind may zero its Out views in place (the packed Out group is zeroed in the
    // mirror, docs/staging.md): from then on the frame holds zeros where it held the engine's
    // bytes, and a run dropped without finish leaves them so.
    void zeroed_in_place(Record& r) {
        for (std::size_t i = 0; i < r.args.size(); ++i) {
            if (!r.staged[i] || r.args[i].direction != Direction::Out || r.holds(i, r.before[i])) continue;
            const std::span<const std::byte> now = r.bytes(i);
            EXPECT(std::all_of(now.begin(), now.end(), [](std::byte b) { return b == std::byte{0}; }));
            r.before[i].assign(now.begin(), now.end());
        }
    }

    void bind_frame(Input& in) {
        if constexpr (mirrored) {
            if (!packs()) return;
            const std::uint8_t how = in.byte();
            const bool streamed = (how & 1) != 0;
            const std::size_t stream = ((how >> 1) & 3) % stream_count;
            const std::size_t variant = ((how >> 3) & 7) % 6;
            const bool launch_now = ((how >> 6) & 1) != 0;
            const std::uint8_t pick = in.byte();
            if (framed.empty() || variant == 5) {
                if (stale.empty()) return;
                const HostFrame& old = *stale[pick % stale.size()];
                Result<StagedRun> bound = streamed ? stager->bind(old, streams[stream]) : stager->bind(old);
                EXPECT(!bound.ok() && bound.status().code() == Errc::invalid_argument &&
                       !bound.status().message().empty());
                return;
            }
            const std::size_t index = pick % framed.size();
            Record& r = *framed[index];
            if (r.maybe_bound && variant >= 3) return;  // used up or not: its args may be plain args now
            // Nothing may move the mirror under an unbound frame; if something did, its bytes are lost.
            const bool moved = stager->strategy(r.slot).mirror() != r.mirror;
            std::vector<TensorArg> copy(r.args.begin(), r.args.end());
            const std::size_t other = (r.slot + 1 + pick / 16) % (slots_ + 1);
            Result<StagedRun> bound = Status(Errc::invalid_argument, "not bound");
            bool misuse = false;
            const Stream s = streams[stream];
            switch (variant) {
                case 0:
                    bound = streamed ? stager->bind(*r.frame, s) : stager->bind(*r.frame);
                    break;
                case 1:
                    bound = streamed ? stager->bind(r.frame->args(), s) : stager->bind(r.frame->args());
                    break;
                case 2:
                    bound = streamed ? stager->bind_slot(r.slot, r.frame->args(), s)
                                     : stager->bind_slot(r.slot, r.frame->args());
                    break;
                case 3:  // a copy of the frame's args: they point into the frame, but are not its own
                    if (std::none_of(copy.begin(), copy.end(), [](const TensorArg& a) { return a.bytes > 0; })) return;
                    misuse = true;
                    bound = streamed ? stager->bind(copy, s) : stager->bind(copy);
                    break;
                default:  // the frame's args on another slot
                    if (other == r.slot) return;
                    misuse = true;
                    bound = streamed ? stager->bind_slot(other, r.frame->args(), s)
                                     : stager->bind_slot(other, r.frame->args());
                    break;
            }
            if (misuse) {
                EXPECT(!bound.ok() && bound.status().code() == Errc::invalid_argument &&
                       !bound.status().message().empty());
                return;
            }
            zeroed_in_place(r);
            if (!bound) {
                EXPECT(!bound.status().message().empty());
                if (fault_free() && !moved) fuzz::violated("a fresh frame failed to bind with no fault injected");
                // A bind that failed after its uploads were enqueued used the frame up; one that
                // failed before did not.
                if (r.maybe_bound && bound.status().code() == Errc::invalid_argument) {
                    stale.push_back(&*r.frame);
                    framed.erase(framed.begin() + static_cast<std::ptrdiff_t>(index));
                } else {
                    r.maybe_bound = true;
                }
                return;
            }
            EXPECT(bound->slot() == r.slot);
            framed.erase(framed.begin() + static_cast<std::ptrdiff_t>(index));
            stale.push_back(&*r.frame);
            r.epoch = moved ? ~std::uint64_t{0} : epochs_[r.slot];
            start(r, std::move(*bound), streamed, stream);
            if (launch_now) launch(r, live.back().run);
        } else {
            bind(in);
        }
    }

    void release() {
        // release() refuses while a frame is unbound or held by its run's Completion, and then
        // changes nothing.
        const bool frames =
            !framed.empty() || std::any_of(pending.begin(), pending.end(), [](const Pending& p) { return p.holds; });
        const std::size_t live_before = stager->live_runs();
        const Status released = stager->release();
        if (!released) EXPECT(!released.message().empty());
        if (frames) {
            EXPECT(released.code() == Errc::busy && stager->live_runs() == live_before);
            return;
        }
        released_all(released);
        if (fault_free()) EXPECT(released.ok());
    }

    // After release(): live runs inert, frames dropped, every pending run settled. A release()
    // that succeeded holds nothing; one that failed may keep the memory of slots whose pending
    // work could not be waited for (check() still accounts for it).
    void released_all(const Status& released) {
        for (Live& l : live) {
            EXPECT(!l.run.live());
            l.record->inert = true;
        }
        drop_frames();
        unhold();
        bump_all();
        EXPECT(stager->live_runs() == 0);
        if (!released) return;
        for (const Pending& p : pending) EXPECT(!p.done.pending());
        for (std::size_t slot = 0; slot < slots_; ++slot) {
            EXPECT(stager->strategy(slot).capacity() == 0);
            if constexpr (mirrored) EXPECT(stager->strategy(slot).mirror() == nullptr);
        }
        EXPECT(stager_held() == 0);
        deferred_base_ = stager->stats().deferred_frees;
    }

    void abandon() {
        std::vector<bool> watched;
        for (const Pending& p : pending) watched.push_back(p.done.pending());
        abandoned_device_ += stager_held();
        abandoned_pinned_ += mirrors_held();
        ++abandons_;
        stager->abandon();
        for (Live& l : live) {
            EXPECT(!l.run.live());
            l.record->inert = true;
        }
        drop_frames();
        unhold();
        for (const auto& r : records) r->abandoned = true;
        for (std::size_t i = 0; i < pending.size(); ++i) {
            EXPECT(!pending[i].done.pending());
            if (watched[i]) EXPECT(pending[i].done.wait().code() == Errc::backend_failure);
        }
        bump_all();
        EXPECT(stager_held() == 0 && mirrors_held() == 0);
        deferred_base_ = stager->stats().deferred_frees;
    }

    void reserve(Input& in) {
        const std::size_t bytes = sizes[in.byte() % size_count] * (1 + in.byte() % 8);
        if constexpr (!retained) {
            return;  // reserve() is for retained strategies only (it does not compile otherwise)
        } else {
            reserve(bytes);
        }
    }
    void reserve(std::size_t bytes) {
        // A live run, an unbound frame or a held frame run uses a slot's memory: reserve() is
        // busy then. (A frame whose bind failed may or may not have been used up.)
        const bool live_runs = stager->live_runs() > 0;
        const bool surely_framed =
            std::any_of(framed.begin(), framed.end(), [](const Record* r) { return !r->maybe_bound; });
        const bool held = std::any_of(pending.begin(), pending.end(), [](const Pending& p) { return p.holds; });
        const bool maybe_in_use = live_runs || !framed.empty() || held;
        const Status reserved = stager->reserve(bytes);
        bump_all();
        if (!reserved) {
            EXPECT(!reserved.message().empty());
            if (fault_free()) EXPECT(maybe_in_use && reserved.code() == Errc::busy);
            return;
        }
        EXPECT(!live_runs && !surely_framed && !held);
        drop_frames();  // the frames left were used up by their failed binds
        for (std::size_t slot = 0; slot < slots_; ++slot) {
            if constexpr (retained) EXPECT(stager->strategy(slot).capacity() >= bytes);
            if constexpr (mirrored) {
                if (packs()) EXPECT(stager->strategy(slot).mirror_capacity() >= bytes);
            }
        }
    }

    void arm(Input& in, bool when_run) {
        static constexpr MockOp at_call[] = {MockOp::device_malloc,
                                             MockOp::device_free,
                                             MockOp::pinned_malloc,
                                             MockOp::pinned_free,
                                             MockOp::create_stream,
                                             MockOp::destroy_stream,
                                             MockOp::create_event,
                                             MockOp::destroy_event,
                                             MockOp::record_event,
                                             MockOp::event_ready,
                                             MockOp::synchronize_event,
                                             MockOp::stream_wait_event,
                                             MockOp::launch_host_func,
                                             MockOp::copy_to_device_async,
                                             MockOp::copy_from_device_async,
                                             MockOp::copy_to_device_batch,
                                             MockOp::copy_from_device_batch,
                                             MockOp::device_memset_async,
                                             MockOp::device_memset,
                                             MockOp::map_host,
                                             MockOp::unmap_host,
                                             MockOp::copy_to_device,
                                             MockOp::copy_from_device,
                                             MockOp::synchronize};
        static constexpr MockOp enqueued[] = {MockOp::copy_to_device_async, MockOp::copy_from_device_async,
                                              MockOp::copy_to_device_batch, MockOp::copy_from_device_batch,
                                              MockOp::device_memset_async};
        const MockOp op =
            when_run ? enqueued[in.byte() % std::size(enqueued)] : at_call[in.byte() % std::size(at_call)];
        const std::uint64_t k = mock.calls(op) + 1 + in.byte() % 4;
        const Errc code = in.byte() % 2 != 0 ? Errc::out_of_memory : Errc::backend_failure;
        auto& armed = when_run ? run_faults_ : call_faults_;
        retire(armed[index(op)], op);
        armed[index(op)] = k;
        if (when_run) {
            mock.fail_when_run(op, k, code);
        } else {
            mock.fail_call(op, k, code);
        }
    }

    void clear_faults() {
        for (std::size_t op = 0; op < mock_op_count; ++op) {
            retire(call_faults_[op], static_cast<MockOp>(op));
            retire(run_faults_[op], static_cast<MockOp>(op));
        }
        mock.clear_faults();
    }

    // What the host does between stager calls: synchronize the device, launch a kernel, poll.
    void host(Input& in) {
        switch (in.byte() % 3) {
            case 0:
                if (Status synced = mock.synchronize(); !synced) EXPECT(!synced.message().empty());
                break;
            case 1: {
                const std::uint8_t pick = in.byte();
                if (!live.empty()) launch(*live[pick % live.size()].record, live[pick % live.size()].run);
                break;
            }
            default:
                for (Pending& p : pending) {
                    Result<bool> ready = p.done.ready();
                    if (!ready) EXPECT(!ready.status().message().empty());
                }
                break;
        }
    }

    // Retained buffers handed out and taken back (detach / adopt), and freed by their new owner.
    void buffers(Input& in) {
        if constexpr (retained) {
            const std::uint8_t how = in.byte() % 4;
            const std::size_t slot = in.byte() % (slots_ + 1);
            const bool in_range = slot < slots_;
            const bool taken = in_range && slot_taken(slot);
            if (how == 0) {
                Result<RetainedBuffer> buffer = stager->detach(slot);
                if (!buffer) {
                    EXPECT(!buffer.status().message().empty());
                    if (fault_free()) {
                        EXPECT(buffer.status().code() == (in_range ? Errc::busy : Errc::invalid_argument) &&
                               (!in_range || taken));
                    }
                    return;
                }
                EXPECT(in_range && !taken && stager->strategy(slot).capacity() == 0);
                unframed(slot, nullptr);
                if (buffer->allocation != nullptr) detached.push_back(*buffer);
                bump(slot);
                return;
            }
            if (how == 3) {  // the new owner frees a detached buffer: nothing pending may still use it
                const std::uint8_t choice = in.byte();
                if (detached.empty()) return;
                const std::size_t pick = choice % detached.size();
                if (mock.device_free(detached[pick].allocation)) {
                    detached.erase(detached.begin() + static_cast<std::ptrdiff_t>(pick));
                    ++harness_freed_;
                } else {
                    ++harness_refused_;
                }
                return;
            }
            const bool fresh = how == 2 || detached.empty();
            void* allocation = nullptr;
            std::size_t bytes = 0;
            std::size_t pick = 0;
            if (fresh) {
                bytes = sizes[1 + in.byte() % (size_count - 1)] + 2048;
                Result<void*> made = mock.device_malloc(bytes);
                if (!made) return;
                allocation = *made;
                spare.push_back(allocation);
            } else {
                pick = in.byte() % detached.size();
                const RetainedBuffer& buffer = detached[pick];
                allocation = buffer.allocation;
                bytes = buffer.bytes + static_cast<std::size_t>(static_cast<std::byte*>(buffer.base) -
                                                                static_cast<std::byte*>(buffer.allocation));
            }
            const bool empty = in_range && stager->strategy(slot).capacity() == 0;
            const Status adopted = stager->adopt(slot, allocation, bytes);
            if (!adopted) {
                EXPECT(!adopted.message().empty());
                if (fault_free()) {
                    EXPECT(adopted.code() == (in_range ? Errc::busy : Errc::invalid_argument) &&
                           (!in_range || taken || !empty));
                }
                return;
            }
            EXPECT(in_range && !taken && empty && stager->strategy(slot).capacity() > 0);
            unframed(slot, nullptr);
            if (fresh) {
                spare.pop_back();
                ++adopted_fresh_;
            } else {
                detached.erase(detached.begin() + static_cast<std::ptrdiff_t>(pick));
            }
            bump(slot);
        } else {
            bind(in);
        }
    }

    // ---- runs ---------------------------------------------------------------------------

    Record& new_record() {
        records.push_back(std::make_unique<Record>());
        return *records.back();
    }

    void make_args(Input& in, Record& r, bool& null, bool& alias) {
        const std::size_t count = in.byte() % 9;
        for (std::size_t i = 0; i < count; ++i) {
            const std::uint8_t shape = in.byte();
            std::size_t bytes = sizes[shape % size_count];
            if (shape >= 0x80) bytes += in.byte();  // a size between the table's
            const auto direction = static_cast<Direction>(in.byte() % 3);
            const std::uint8_t seed = in.byte();
            const std::uint8_t kind = in.byte() % 16;
            r.host.push_back(pattern(bytes, seed));
            TensorArg arg{r.host.back().empty() ? nullptr : r.host.back().data(), bytes, direction};
            r.before.push_back(r.host.back());
            if (kind == 0 && bytes > 0) {  // invalid: a null host pointer with bytes
                arg.data = nullptr;
                null = true;
            } else if (kind == 1 && bytes > 0) {  // caller-owned device memory, passed through
                Result<void*> device = mock.device_malloc(bytes);
                if (device) {
                    external.push_back(*device);
                    // The caller's own memset may fail (a fault injected into it): the arg
                    // stays a host arg then.
                    if (mock.device_memset(*device, seed, bytes)) {
                        arg = TensorArg{*device, bytes, direction, Placement::Device};
                        r.before.back().assign(bytes, static_cast<std::byte>(seed));
                    }
                }
            } else if (kind == 2) {  // host memory a live run will still copy back into
                if (const TensorArg* shared = copied_back_by_live_run(seed)) {
                    arg = TensorArg{shared->data, shared->bytes, direction};
                    alias = true;
                }
            } else if (kind == 3 && !r.args.empty()) {  // an In over the bytes of an earlier arg
                const std::size_t j = seed % r.args.size();
                if (r.staged[j] && !r.alias_of[j]) {
                    arg = TensorArg{r.args[j].data, r.args[j].bytes, Direction::In};
                    r.before.back() = r.before[j];
                    r.host.back().clear();
                    r.alias_of.resize(r.args.size() + 1);
                    r.alias_of.back() = j;
                }
            }
            r.alias_of.resize(r.args.size() + 1);
            r.args.push_back(arg);
            r.staged.push_back(arg.placement == Placement::Host && arg.bytes > 0 && arg.data != nullptr);
        }
        r.kernel.value = in.byte();
        r.model();
    }

    const TensorArg* copied_back_by_live_run(std::uint8_t pick) const {
        std::vector<const TensorArg*> candidates;
        for (const Live& l : live) {
            if (!l.run.live() || l.record->frame) continue;
            for (std::size_t i = 0; i < l.record->args.size(); ++i) {
                if (l.record->staged[i] && l.record->args[i].direction != Direction::In) {
                    candidates.push_back(&l.record->args[i]);
                }
            }
        }
        return candidates.empty() ? nullptr : candidates[pick % candidates.size()];
    }

    void start(Record& r, StagedRun run, bool streamed, std::size_t stream) {
        unframed(run.slot(), &r);
        r.slot = run.slot();
        r.streamed = streamed;
        r.stream = stream;
        const std::span<const TensorArg> device = run.device_args();
        EXPECT(device.size() == r.args.size());
        for (std::size_t i = 0; i < device.size(); ++i) {
            if (r.staged[i]) {
                EXPECT(device[i].placement == Placement::Device && device[i].bytes == r.args[i].bytes);
                EXPECT(reinterpret_cast<std::uintptr_t>(device[i].data) % Strategy::alignment == 0);
                // Device memory, or (MapSmall) the slot's mirror mapped for the device.
                const bool mapped = mapped_mirror(device[i].data, device[i].bytes);
                EXPECT(mock.is_device(device[i].data, device[i].bytes) || mapped);
                if (r.frame && mapped) r.in_place = true;
            } else if (uses_mock_memory(r.args[i])) {
                EXPECT(device[i].data == r.args[i].data);
            } else {
                EXPECT(device[i].data == nullptr);
            }
        }
        r.kernel.device.assign(device.begin(), device.end());
        r.kernel.staged = r.staged;
        live.push_back(Live{std::move(run), &r});
    }

    void launch(Record& r, const StagedRun& run) {
        if (r.launched || !run.live()) return;
        r.launched = true;
        if (r.streamed) {  // in stream order, after the uploads
            r.launch_status = mock.launch_host_func(streams[r.stream], &Kernel::launch, &r.kernel);
            if (!r.launch_status) EXPECT(!r.launch_status.message().empty());
        } else {  // the uploads are done: the kernel runs now
            r.kernel.run();
        }
    }

    // Checks a run's host memory against the model once its result is known.
    void verify(const Record& r, const Status& result, bool strict) {
        if (!result.ok()) EXPECT(!result.message().empty());
        if (strict && fault_free() && !r.inert && !r.abandoned) EXPECT(result.ok());
        if (!readable(r)) return;
        for (std::size_t i = 0; i < r.args.size(); ++i) {
            if (!r.staged[i]) continue;
            if (r.args[i].direction == Direction::In) {
                // Inputs are never written (one over another arg's bytes is that arg's).
                if (i >= r.alias_of.size() || !r.alias_of[i]) EXPECT(r.holds(i, r.before[i]));
            } else if (!r.execution_ok && r.in_place && r.launched) {
                continue;  // a mapped frame holds what its kernel wrote in place before it failed
            } else if (result.ok()) {
                EXPECT(r.holds(i, r.execution_ok ? r.after[i] : r.before[i]));
            } else if (!r.execution_ok) {
                EXPECT(r.holds(i, r.before[i]));  // nothing is copied back after a failed execution
            }
        }
    }

    bool readable(const Record& r) const { return !r.frame || epochs_[r.slot] == r.epoch; }

    // True when [p, p + bytes) lies in a slot's mirror mapped for the device.
    bool mapped_mirror(const void* p, std::size_t bytes) const {
        if constexpr (mirrored) {
            for (std::size_t slot = 0; slot < slots_; ++slot) {
                const auto* mirror = stager->strategy(slot).mirror();
                if (mirror == nullptr || stager->strategy(slot).mirror_device() == nullptr) continue;
                const auto* at = static_cast<const std::byte*>(p);
                if (at >= mirror && at + bytes <= mirror + stager->strategy(slot).mirror_capacity()) return true;
            }
        }
        (void)p, (void)bytes;
        return false;
    }

    // The stager holds no frame on `slot` (but `bound`'s own): one whose bind failed was used up.
    void unframed(std::size_t slot, const Record* bound) {
        for (std::size_t i = 0; i < framed.size();) {
            Record* r = framed[i];
            if (r == bound || r->slot != slot) {
                ++i;
                continue;
            }
            EXPECT(r->maybe_bound);
            stale.push_back(&*r->frame);
            framed.erase(framed.begin() + static_cast<std::ptrdiff_t>(i));
        }
    }

    void drop_frames() {
        for (Record* r : framed) stale.push_back(&*r->frame);
        framed.clear();
    }

    void clean_runs() {
        Result<MockBackend::Stream> fresh = mock.create_stream();
        EXPECT(fresh.ok());
        for (int streamed = 0; streamed < 2; ++streamed) {
            Record& r = new_record();
            for (const auto& [bytes, direction] :
                 {std::pair{3000, Direction::In}, std::pair{100, Direction::Out}, std::pair{20000, Direction::InOut},
                  std::pair{64, Direction::InOut}}) {
                r.host.push_back(pattern(static_cast<std::size_t>(bytes), static_cast<std::uint8_t>(bytes)));
                r.before.push_back(r.host.back());
                r.args.push_back(TensorArg{r.host.back().data(), static_cast<std::size_t>(bytes), direction});
                r.staged.push_back(true);
            }
            r.kernel.value = 7;
            r.model();
            Result<StagedRun> bound = streamed != 0 ? stager->bind(r.args, *fresh) : stager->bind(r.args);
            if (!bound && limited_ && bound.status().code() == Errc::out_of_memory) continue;  // abandon kept memory
            EXPECT(bound.ok());
            run_clean(r, std::move(*bound), streamed != 0, *fresh);
        }
        if constexpr (mirrored) clean_frame(*fresh);
        EXPECT(mock.destroy_stream(*fresh).ok());
    }

    // A frame's run on `fresh`, when the stager packs.
    void clean_frame(MockBackend::Stream fresh) requires mirrored {
        if (packs()) {
            const TensorShape shapes[] = {
                {5000, Direction::In}, {64, Direction::InOut}, {0, Direction::In}, {300, Direction::Out}};
            Result<HostFrame> made = stager->frame(shapes);
            if (!made && limited_ && made.status().code() == Errc::out_of_memory) return;
            EXPECT(made.ok());
            Record& r = new_record();
            r.frame.emplace(std::move(*made));
            for (std::size_t i = 0; i < std::size(shapes); ++i) {
                const std::span<std::byte> host = r.frame->host(i);
                if (shapes[i].direction != Direction::Out) std::fill(host.begin(), host.end(), std::byte{0x3C});
                r.args.push_back(r.frame->args()[i]);
                r.staged.push_back(shapes[i].bytes > 0);
                r.before.emplace_back(host.begin(), host.end());
            }
            r.kernel.value = 9;
            r.model();
            Result<StagedRun> bound = stager->bind(*r.frame, fresh);
            EXPECT(bound.ok());
            r.epoch = epochs_[bound->slot()];
            run_clean(r, std::move(*bound), true, fresh);
        }
    }

    void run_clean(Record& r, StagedRun run, bool streamed, MockBackend::Stream stream) {
        r.slot = run.slot();
        r.kernel.device.assign(run.device_args().begin(), run.device_args().end());
        r.kernel.staged = r.staged;
        if (streamed) {
            EXPECT(mock.launch_host_func(stream, &Kernel::launch, &r.kernel).ok());
            Result<Completion> done = stager->finish(std::move(run), stream);
            EXPECT(done.ok());
            verify(r, done->wait(), false);
            EXPECT(done->wait().ok());
        } else {
            r.kernel.run();
            const Status finished = stager->finish(std::move(run));
            verify(r, finished, false);
            EXPECT(finished.ok());
        }
    }

    // ---- bookkeeping --------------------------------------------------------------------

    bool slot_taken(std::size_t slot) const {
        for (const Live& l : live) {
            if (l.run.live() && l.run.slot() == slot) return true;
        }
        if (std::any_of(pending.begin(), pending.end(),
                        [slot](const Pending& p) { return p.holds && p.record->slot == slot; }))
            return true;
        return std::any_of(framed.begin(), framed.end(),
                           [slot](const Record* r) { return r->slot == slot && !r->maybe_bound; });
    }
    // release() and abandon() end every hold: the Completions stay, holding nothing.
    void unhold() {
        for (Pending& p : pending) p.holds = false;
    }
    std::size_t free_slots() const {
        std::size_t n = 0;
        for (std::size_t slot = 0; slot < slots_; ++slot) n += !slot_taken(slot);
        return n;
    }

    // Pinned mirrors may move or be overwritten: a frame's bytes are only compared while the
    // epoch of its slot is the one it was written or bound in.
    void bump(std::size_t slot) { ++epochs_[slot]; }
    void bump_all() {
        for (std::uint64_t& epoch : epochs_) ++epoch;
    }

    static constexpr std::size_t index(MockOp op) { return static_cast<std::size_t>(op); }
    // An armed fault is retired (replaced or cleared); it counts as fired if its call came.
    void retire(std::optional<std::uint64_t>& fault, MockOp op) {
        if (fault && *fault <= mock.calls(op)) ++retired_fired_;
        fault.reset();
    }
    std::uint64_t faults_fired() const {
        std::uint64_t fired = retired_fired_;
        for (std::size_t op = 0; op < mock_op_count; ++op) {
            const std::uint64_t calls = mock.calls(static_cast<MockOp>(op));
            fired += call_faults_[op] && *call_faults_[op] <= calls;
            fired += run_faults_[op] && *run_faults_[op] <= calls;
        }
        return fired;
    }
    // No fault injected so far and memory to spare: every valid call must succeed.
    bool fault_free() const { return !limited_ && faults_fired() == 0; }

    void scan_journal() {
        for (const MockCall& call : mock.journal()) {
            if (call.result == Errc::ok) continue;
            refused_device_ += call.op == MockOp::device_free;
            refused_pinned_ += call.op == MockOp::pinned_free;
            refused_events_ += call.op == MockOp::destroy_event;
            refused_unmaps_ += call.op == MockOp::unmap_host;  // the mirror stays allocated
        }
        mock.clear_journal();
    }
    std::int64_t stager_refused() const {
        return static_cast<std::int64_t>(refused_device_) - static_cast<std::int64_t>(harness_refused_);
    }

    // Device allocations the stager holds now, by its own counters and what changed hands.
    // The device allocations live once the stager is gone: the harness's own, and what abandon
    // forgot and frees the mock refused.
    std::int64_t expected_device() const {
        return static_cast<std::int64_t>(external.size() + spare.size() + detached.size()) + abandoned_device_ +
               stager_refused();
    }
    std::int64_t stager_held() const {
        const StagerStats& stats = stager->stats();
        return static_cast<std::int64_t>(stats.device_mallocs) - static_cast<std::int64_t>(stats.device_frees) +
               adopted_fresh_ - static_cast<std::int64_t>(detached.size()) - harness_freed_ - abandoned_device_;
    }
    std::uint64_t mirrors_held() const {
        std::uint64_t n = 0;
        if constexpr (mirrored) {
            for (std::size_t slot = 0; slot < slots_; ++slot) n += stager->strategy(slot).mirror() != nullptr;
        }
        return n;
    }

    void check() {
        scan_journal();
        EXPECT(mock.misuses() == 0);
        const StagerStats& stats = stager->stats();
        const std::int64_t counted =
            static_cast<std::int64_t>(stats.device_mallocs) - static_cast<std::int64_t>(stats.device_frees);
        // Every live device allocation is the caller's or one the stager counted (and did not free,
        // or freed and the mock refused).
        EXPECT(static_cast<std::int64_t>(mock.live_device_allocations()) ==
               static_cast<std::int64_t>(external.size() + spare.size()) + counted + adopted_fresh_ - harness_freed_ +
                   stager_refused());
        // The stager holds no more than its slots' buffers, its live runs' Free leases and the
        // frees it deferred since everything was last released.
        std::int64_t explained = static_cast<std::int64_t>(stats.deferred_frees - deferred_base_);
        for (std::size_t slot = 0; slot < slots_; ++slot) explained += stager->strategy(slot).capacity() > 0;
        for (const Live& l : live) {
            if (!l.run.live()) continue;
            for (const TensorLease& lease : l.run.leases()) {
                explained += lease.release_kind == ReleaseKind::Free && lease.allocation != nullptr;
            }
        }
        const std::int64_t held = stager_held();
        EXPECT(held >= 0 && held <= explained);
        EXPECT(mock.live_pinned_allocations() ==
               mirrors_held() + abandoned_pinned_ + refused_pinned_ + refused_unmaps_);
        EXPECT(stager->live_runs() == static_cast<std::size_t>(std::count_if(
                                          live.begin(), live.end(), [](const Live& l) { return l.run.live(); })));
    }

    using Stream = MockBackend::Stream;

    MockBackend mock;
    std::array<Stream, stream_count> streams{};
    std::vector<std::unique_ptr<Record>> records;  // kept to the end: pending work may still use them
    std::vector<void*> external;                   // caller-owned device memory of Device args
    std::vector<void*> spare;                      // caller-owned device memory not adopted
    std::vector<RetainedBuffer> detached;          // retained buffers handed to the caller
    std::size_t slots_;
    bool limited_;
    std::optional<StagerT> stager;
    std::vector<Live> live;
    std::vector<Pending> pending;
    std::vector<Record*> framed;          // unbound frames
    std::vector<const HostFrame*> stale;  // frames bound or dropped: binding them again is an error
    std::vector<std::uint64_t> epochs_;

    std::array<std::optional<std::uint64_t>, mock_op_count> call_faults_{};
    std::array<std::optional<std::uint64_t>, mock_op_count> run_faults_{};
    std::uint64_t retired_fired_ = 0;

    std::uint64_t refused_device_ = 0;  // device_free calls the mock refused (the stager's and ours)
    std::uint64_t refused_pinned_ = 0;
    std::uint64_t refused_events_ = 0;
    std::uint64_t refused_unmaps_ = 0;   // mirrors whose unmap failed: they stay allocated
    std::uint64_t harness_refused_ = 0;  // of those, ours
    std::int64_t harness_freed_ = 0;     // detached buffers we freed
    std::int64_t adopted_fresh_ = 0;     // our allocations the stager adopted
    std::int64_t abandoned_device_ = 0;  // allocations the stager forgot by abandon
    std::uint64_t abandoned_pinned_ = 0;
    std::int64_t kept_device_ = 0;  // what a stager destroyed under unwaitable work kept
    std::uint64_t kept_pinned_ = 0;
    std::uint64_t abandons_ = 0;
    std::uint64_t deferred_base_ = 0;  // deferred_frees when everything was last released
};

template <class Strategy>
void drive(std::uint8_t config, std::size_t batch_limit, Input& in, Strategy strategy = {}) {
    Harness<Strategy> harness(config, batch_limit, std::move(strategy));
    for (int steps = 0; !in.empty() && steps < 96; ++steps) harness.step(in);
    harness.end((config & 0x80) != 0);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    const std::uint8_t config = data[1];
    static constexpr std::size_t batch_limits[] = {0, 2, 3, 64};
    const std::size_t batches = batch_limits[(data[0] >> 3) & 3];
    Input in(data + 2, size - 2);
    switch (data[0] % 8) {
        case 0:
            drive<RetainedBump<>>(config, batches, in);
            break;
        case 1:
            drive<RetainedBump<GeometricGrowth<3, 2>>>(config, batches, in,
                                                       RetainedBump<GeometricGrowth<3, 2>>({}, GrowOrder::free_first));
            break;
        case 2:
            drive<PerTensorMalloc<>>(config, batches, in);
            break;
        case 3:
            drive<RetainedBump<ExactGrowth, 1024, PackSmall<1024>>>(config, batches, in);
            break;
        case 4:
            drive<RetainedBump<ExactGrowth, 1024, PackSmall<>>>(config, batches, in);
            break;
        case 5:
            drive<RetainedBump<GranularGrowth<4096>, 64, PackSmall<4096>>>(config, batches, in);
            break;
        case 6:
            drive<RetainedBump<ExactGrowth, 1024, MapSmall<1024>>>(config, batches, in);
            break;
        default:
            drive<RetainedBump<GeometricGrowth<3, 2>, 64, MapSmall<4096>>>(config, batches, in);
            break;
    }
    return 0;
}
