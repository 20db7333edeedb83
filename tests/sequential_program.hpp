// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sequential equivalence, checked from outside: a random engine program (binds, frames,
// kernels, finishes, waits, polls, destroys and detaches, bind_slot, reserve and release) is
// run against a Stager on a stream-ordered backend — or a backend without streams, seen
// through SynchronousAdapter — and every host buffer is compared byte for byte with a pure
// host model of the same program run one call at a time, synchronously, in call order.
//
// The engine here is a well-behaved one: it orders its own kernels on its own streams (a kernel
// runs on the bind stream, or on the finish stream after waiting for the bind stream; kernels
// that share caller-owned device memory wait for each other across streams), it reads or
// writes a host buffer with its own code only when no run in flight writes it (reads) or uses
// it (writes), it hands a frame back (destroys or detaches its Completion) only when no run in
// flight uses the frame's memory, it never reads a frame's memory after handing it back, and
// before release() it waits for its kernels that run on a stream the stager was not told of.
// Everything else is the stager's job. A refusal (busy) is allowed only where the contract
// allows one — every slot held by a live run or a frame, a chosen slot held, host memory a live
// run will still copy back, reserve() while a run is live or a frame unbound or held — and the
// refused step is then skipped by the model too. Every other error is a failure, but for the
// failures the engine injected. Calls with no host conflict and no injected fault must not wait
// on the host (StagerStats::host_waits).
//
// Injected faults (Config::call_faults, Config::wait_faults): around one stager call at a time
// the backend (Faulty<B>, sequential_faults.hpp) fails an operation at its n-th call, or every
// wait. What the model holds the stager to — the contract, and where the docs are silent, the
// rules written here:
// - A call that fails because of an injected fault returns that failure (its code, a message
//   naming it); a bind, frame() or bind_slot that fails takes nothing (no run, no slot held; an
//   unbound frame stays bindable) and writes no host memory the engine owns; the next calls
//   work as if nothing had failed. A call may also absorb a fault (a map_host refused: the slot
//   copies; a failed query: the host waits instead; a failed grow retried free-first) and
//   succeed: then its results are exact.
// - A stream-ordered finish that fails at the call ends the run: once it returned, the run's
//   host memory is the engine's again (a frame is handed back at once), its copied-back bytes
//   are undefined, and nothing writes them later — no later settle of the slot (a release(), a
//   bind or frame() that takes it) delivers its packed or mapped outputs. When the finish could
//   not wait for what it had enqueued (every wait failing, reported to the error sink), the
//   engine waits for its streams before it touches that memory (async.md: the device may still
//   complete the direct copy-backs). So does a bind, frame's bind or synchronous step that
//   fails while it cannot wait for the uploads it enqueued: the engine waits for the device
//   (synchronize() where the backend has it, else its own streams) before it writes the run's
//   inputs again.
// - A wait, poll or Completion destructor that fails: the Completion is either resolved — the
//   faults are the calls', not the work's, so every output was delivered and is exact — or
//   still pending(), its host memory devstage's until a later wait (made with no fault) succeeds.
//   A destructor that reported to the error sink leaves the run as a detached one.
// - release() that fails (a fault) still ended the live runs (no copy-back) and drops nothing
//   it could not wait for; the engine's next release() succeeds and settles every run.
// - Every injected failure of a free or an unmap is returned by the call, reported to the
//   error sink, or returned by a later wait; what it left with the backend is the backend's
//   (Faulty gives it back at the end), and nothing else leaks: at the end every device and
//   pinned allocation, mapping, event and stream the stager made is given back.
// - Args of one run may share host bytes (Config::aliasing): every upload reads the host bytes
//   as the bind found them; a copied-back arg overwrites In args of the same run; where two
//   copied-back args of one run overlap, the bytes on which they differ are undefined (the order
//   of a run's copy-backs is not part of the contract).
// - reserve(bytes) that succeeded: later binds and frames whose plan fits in `bytes` never move
//   a slot's address (StagerStats::address_changes), until a release().
// - bind_slot(k): invalid_argument when k is out of range; busy when slot k holds a live run, an
//   unbound frame or a held frame; else the run is on slot k.
// Behaviours the library does not give yet are expected only when Config::expect says so
// (sequential_config.hpp); otherwise the engine avoids the programs that need them.
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
#include <type_traits>
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
#include "sequential_config.hpp"
#include "sequential_faults.hpp"
#include "sequential_kernel.hpp"
#include "sequential_steps.hpp"

#include <csignal>

#include <sys/wait.h>
#include <unistd.h>

namespace sequential {

using devstage::Completion;
using devstage::Errc;
using devstage::HostFrame;
using devstage::OutputPolicy;
using devstage::Placement;
using devstage::Result;
using devstage::StagedRun;
using devstage::Status;
using devstage::TensorArg;
using devstage::TensorShape;

using Bump = devstage::RetainedBump<devstage::ExactGrowth, alignment, devstage::NoPacking>;
using Packed = devstage::RetainedBump<devstage::GeometricGrowth<3, 2>, alignment, devstage::PackSmall<pack_limit>>;
/// PackSmall's layout in a mirror mapped for the device: on every backend here (they all map)
/// the kernels read and write the small args and frames in place.
using Mapped = devstage::RetainedBump<devstage::GeometricGrowth<3, 2>, alignment, devstage::MapSmall<pack_limit>>;
using PerTensor = devstage::PerTensorMalloc<alignment>;

/// The backend of configuration `config`, failing on request.
template <class Base>
std::unique_ptr<Faulty<Base>> make_backend(const Config& config, devstage::ErrorSink sink) {
    if constexpr (std::is_base_of_v<devstage::MockBackend, Base> || std::is_same_v<Base, StreamlessMock>) {
        devstage::MockConfig mock;
        mock.offset = config.mock_offset;
        mock.journal = false;
        mock.deferred_async = config.backend != BackendKind::eager_mock && config.backend != BackendKind::streamless;
        mock.not_ready_polls = config.not_ready_polls;
        mock.batch_copy_limit = config.batch_limit;
        mock.sink = sink;
        return std::make_unique<Faulty<Base>>(mock);
    } else if constexpr (std::is_same_v<Base, devstage::SimBackend>) {
        devstage::SimConfig sim;
        sim.lock_pinned = false;
        sim.bounce_buffer_bytes = 4096;
        sim.batch_copy_limit = config.batch_limit;
        return std::make_unique<Faulty<Base>>(sim);
    } else {
        (void)sink;
        return std::make_unique<Faulty<Base>>(config.batch_limit);
    }
}

/// The stager calls a fault plan may be armed around.
enum class Call : std::uint8_t { bind, frame, bind_frame, order, finish, wait, poll, destroy, drop, reserve, release };

/// Runs one program against Stager<Faulty<Base>, S> and checks it against the model.
template <class Base, class S>
class Runner {
public:
    using B = Faulty<Base>;
    /// The engine's view of the streams: the backend's own, or SynchronousAdapter's immediate ones.
    using A = devstage::stream_backend_t<B>;
    using Stream = typename A::Stream;
    using Event = typename A::Event;
    static constexpr bool packs = devstage::detail::pack_limit_of<S>() > 0;
    static constexpr bool retained = S::lease_kind == devstage::ReleaseKind::BufferNoop;
    static constexpr bool streams = devstage::AsyncBackend<B>;

    Runner(const Config& config, Report& report)
        : config_(config),
          report_(report),
          backend_(make_backend<Base>(config, devstage::ErrorSink(&Runner::leaked, this))) {
        report_.config = config;
        if constexpr (!streams) adapter_.emplace(*backend_);
    }
    Runner(const Runner&) = delete;
    Runner& operator=(const Runner&) = delete;
    ~Runner() { teardown(); }

    /// Destroys the stager, frees the buffers, streams and events and what injected faults left
    /// with the backend, and checks that nothing else is left (also done by the destructor).
    void teardown() {
        if (!backend_) return;
        choices_ = nullptr;
        forced_.clear();
        backend_->disarm();
        for (Step& step : steps_) {
            step.done.reset();
            step.run.reset();
        }
        destroy_stager();
        if (!streams_.empty()) drain_streams();
        for (std::size_t i = 0; i < streams_.size(); ++i) {
            (void)engine().destroy_event(kernel_events_[i]);
            (void)engine().destroy_event(bind_events_[i]);
            (void)engine().destroy_stream(streams_[i]);
        }
        for (HostBuffer& buffer : host_) {
            if (buffer.pinned) (void)pinned_free(buffer.data);
        }
        for (DeviceBuffer& buffer : device_) (void)backend_->device_free(buffer.data);
        if (Status given = backend_->give_back(); !given && ok()) {
            fail("giving back what injected faults left with the backend failed: " + given.message());
        }
        if (ok()) {
            const auto leak = [this](const char* what, std::int64_t count) {
                if (count != 0) fail("at teardown " + std::to_string(count) + " " + what + " of the stager are left");
            };
            leak("device allocation(s)", static_cast<std::int64_t>(backend_->live_device()));
            leak("pinned allocation(s)", static_cast<std::int64_t>(backend_->live_pinned()));
            leak("mapping(s)", static_cast<std::int64_t>(backend_->live_mappings()));
            leak("event(s)", backend_->live_events());
            leak("stream(s)", backend_->live_streams());
        }
        if (misuses() != 0 && ok()) fail("the backend counted misuse(s) at teardown: " + first_misuse());
        report_.tally.faults = backend_->total_fired();
        for (std::size_t op = 0; op < fault_op_count; ++op) {
            report_.tally.fault_ops[op] = backend_->total_fired(static_cast<FaultOp>(op));
        }
        adapter_.reset();
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
            Result<Stream> stream = engine().create_stream();
            Result<Event> after_kernel = engine().create_event();
            Result<Event> after_bind = engine().create_event();
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

    /// The stager's destruction (at teardown) runs under `plan`: its events and stream.
    void fault_destruction(const FaultPlan& plan) { destruction_plan_ = plan; }

    /// The next stager call runs under `plan` (then under the random engine's, if any).
    void fault_next(const FaultPlan& plan) { forced_.push_back(plan); }
    /// Every stager call from now on runs under `plan` (a sweep), until conclude().
    void fault_every_call(const FaultPlan& plan) { every_ = plan; }

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

    /// Binds the frame of step `id` (taken by begin_step). False when it failed (an injected
    /// fault: the frame stays unbound, to be bound again) or the program stopped.
    bool bind_frame(int id) {
        if (!running()) return false;
        Step& step = steps_[static_cast<std::size_t>(id)];
        const std::uint64_t waits = stats().host_waits;
        const Stream stream = streams_[step.spec.bind_stream];
        log() << "s" << id << " bind frame" << (step.spec.bind_object ? "" : " args") << " on stream "
              << step.spec.bind_stream;
        Faulted<Result<StagedRun>> bound = faulted(Call::bind_frame, true, [&] {
            return step.spec.bind_object ? stager_->bind(*step.frame, stream)
                                         : stager_->bind(step.frame->args(), stream);
        });
        Result<StagedRun>& run = bound.result;
        if (!run) {
            log() << " -> " << run.status().message() << "\n";
            if (!injected(bound, run.status())) {
                fail("s" + std::to_string(id) + ": binding a frame failed: " + run.status().message());
                step.phase = Phase::refused;
                return false;
            }
            ++step.failed_binds;  // the frame stays unbound: bound again later
            if (bound.unwaited) wait_for_device();
            return false;
        }
        log() << " -> slot " << run->slot() << "\n";
        if (run->slot() != step.slot) {
            fail("s" + std::to_string(id) + ": the frame of slot " + std::to_string(step.slot) + " was bound on slot " +
                 std::to_string(run->slot()));
        }
        if (!bound.fired && !unsettled_ && stats().host_waits != waits) {
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
        check_reserved(step, "binding a frame");
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
        if (step.spec.kernel_on_finish && step.spec.finish_stream != step.spec.bind_stream && !step.spec.synchronous) {
            on = step.spec.finish_stream;
            if (id % 2 == 1) {  // odd steps let the stager order the kernel after the uploads
                Faulted<Status> ordered =
                    faulted(Call::order, false, [&] { return stager_->order_after_uploads(*step.run, streams_[on]); });
                if (!ordered.result) {
                    log() << "s" << id << " order_after_uploads onto stream " << on << " -> "
                          << ordered.result.message() << "\n";
                    if (!injected(ordered, ordered.result)) {
                        fail("stager order_after_uploads failed: " + ordered.result.message());
                        return;
                    }
                    if (!step.run->live())
                        fail("s" + std::to_string(id) + ": a failed order_after_uploads ended the run");
                    // The run stays live; nothing that reads it is launched there: it is
                    // finished as a failed execution (docs/async.md).
                    step.kernel = true;
                    step.kernel_skipped = true;
                    return;
                }
            } else {
                const Event after_bind = bind_events_[step.spec.bind_stream];
                expect_ok(engine().record_event(after_bind, streams_[step.spec.bind_stream]), "engine record_event");
                expect_ok(engine().stream_wait_event(streams_[on], after_bind), "engine stream_wait_event");
                step.foreign_kernel = true;  // on a stream the stager does not know
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
                        expect_ok(engine().stream_wait_event(streams_[on], kernel_events_[other]),
                                  "engine stream_wait_event");
                    }
                }
                touched[on] = true;
            }
        }
        Status launched;
        if constexpr (devstage::KernelAccessBackend<B>) {
            launched = backend_->launch_kernel(streams_[on], &Job::run, job.get(), accesses);
        } else if constexpr (devstage::HostFunctionBackend<B>) {
            launched = backend_->launch_host_func(streams_[on], &Job::run, job.get());
        } else {
            Job::run(job.get());  // no streams: the kernel runs at its launch
        }
        expect_ok(launched, "launching the kernel");
        expect_ok(engine().record_event(kernel_events_[on], streams_[on]), "engine record_event");
        jobs_.push_back(std::move(job));
        step.kernel = true;
        step.kernel_stream = on;
        // A synchronous run's kernel runs on an engine stream the stager was not told of.
        if (step.spec.synchronous) step.foreign_kernel = true;
        log() << "s" << id << " kernel on stream " << on << (step.spec.partial ? " (leaves bytes unwritten)" : "")
              << "\n";
        model_kernel(step);
    }

    /// Finishes step `id` on its finish stream (execution failed: no copy-back). False when the
    /// finish failed (an injected fault: the run ended) or the program stopped.
    bool finish(int id, bool execution_ok = true) {
        if (!running()) return false;
        Step& step = steps_[static_cast<std::size_t>(id)];
        if (!step.run) {
            fail("s" + std::to_string(id) + ": the script finishes a step that is not bound");
            return false;
        }
        if (step.kernel_skipped) execution_ok = false;
        if (step.spec.synchronous) return finish_synchronously(step, execution_ok);
        const bool conflict = conflicts(step);
        const std::uint64_t waits = stats().host_waits;
        const Status execution = execution_ok ? Status() : Status(Errc::backend_failure, "the kernel failed");
        Faulted<Result<Completion>> finished = faulted(Call::finish, true, [&] {
            return stager_->finish(std::move(*step.run), streams_[step.spec.finish_stream], execution);
        });
        Result<Completion>& done = finished.result;
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
            if (!injected(finished, done.status())) {
                fail("s" + std::to_string(id) + ": finish failed: " + done.status().message());
                step.phase = Phase::dropped;
                return false;
            }
            failed_finish(step);
            if (finished.unwaited) wait_for_device();
            return false;
        }
        log() << "\n";
        if (!finished.fired && !unsettled_ && !conflict && stats().host_waits != waits) {
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
        log() << "s" << id << " dropped\n";
        Faulted<bool> dropped = faulted(Call::drop, false, [&] {
            step.run.reset();
            return true;
        });
        if (dropped.unwaited) unsettled_ = true;
        step.phase = Phase::dropped;
    }

    /// Ends with step `id`'s Completion.
    void end(int id, End how) {
        if (!running()) return;
        Step& step = steps_[static_cast<std::size_t>(id)];
        static const char* const names[] = {"wait", "ready", "destroy", "detach"};
        log() << "s" << id << " " << names[static_cast<int>(how)];
        switch (how) {
            case End::wait: {
                Faulted<Status> waited = faulted(Call::wait, true, [&] { return step.done->wait(); });
                log() << (waited.result ? "\n" : " -> " + waited.result.message() + "\n");
                if (!waited.result && !allowed_wait_failure(step, waited)) {
                    fail("s" + std::to_string(id) + ": wait() failed: " + waited.result.message());
                    break;
                }
                if (step.done->pending()) {
                    if (waited.result) fail("s" + std::to_string(id) + ": wait() returned ok, the Completion pending");
                    wait_again(step);
                    break;
                }
                completed(step);
                break;
            }
            case End::poll: {
                Faulted<Result<bool>> polled = faulted(Call::poll, true, [&] { return step.done->ready(); });
                Result<bool>& ready = polled.result;
                if (!ready) {
                    log() << " -> " << ready.status().message() << "\n";
                    if (!injected(polled, ready.status()) && !allowed_wait_failure(step, polled, ready.status())) {
                        fail("s" + std::to_string(id) + ": ready() failed: " + ready.status().message());
                    }
                    break;
                }
                log() << " -> " << (*ready ? "true" : "false") << "\n";
                if (*ready) {
                    read_result(step);  // the run's own result is wait()'s
                    completed(step);
                }
                break;
            }
            case End::destroy: {
                read_result(step);
                const std::size_t sunk_before = sunk_.size();
                Faulted<bool> destroyed = faulted(Call::destroy, true, [&] {
                    step.done.reset();
                    return true;
                });
                step.released = true;
                log() << "\n";
                if (destroyed.fired > 0 && sunk_.size() > sunk_before) {
                    step.detached = true;  // may not be settled: its outputs arrive when the slot is
                } else {
                    completed(step);
                }
                break;
            }
            case End::detach:
                read_result(step);
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
        if (!step.done->pending()) {  // resolved already: there is nothing to wait for
            end(id, destroy ? End::destroy : End::wait);
            return;
        }
        const bool stuck = config_.wait_faults == WaitFaults::stuck;
        log() << "s" << id << (destroy ? " destroy" : " wait") << " with a failing wait"
              << (stuck ? " (left pending)" : " (recovered by synchronize())");
        const std::size_t sunk_before = sunk_.size();
        FaultPlan plan;
        if (stuck) {
            plan.stuck = true;
        } else {
            plan.op = FaultOp::synchronize_event;
        }
        forced_.push_front(plan);
        Faulted<Status> waited = faulted(Call::wait, true, [&] {
            if (destroy) {
                step.done.reset();
                step.released = true;
                return Status();
            }
            return step.done->wait();
        });
        log() << (waited.result ? "\n" : " -> " + waited.result.message() + "\n");
        const bool reported = sunk_.size() > sunk_before;
        if (!waited.result && !allowed_wait_failure(step, waited)) {
            fail("s" + std::to_string(id) +
                 ": a failed wait returned a failure no fault explains: " + waited.result.message());
            return;
        }
        if (!stuck) {
            if (!destroy && step.done->pending()) {
                fail("s" + std::to_string(id) +
                     ": a failed wait synchronize() recovered from left the Completion pending: " +
                     waited.result.message());
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
        if (waited.result) {  // nothing was left to wait for
            completed(step);
            return;
        }
        if (!step.done->pending()) {
            fail("s" + std::to_string(id) +
                 ": a failed wait whose work stays pending left the Completion not pending "
                 "(its host memory handed back early): " +
                 waited.result.message());
        }
        wait_again(step);
    }

    /// Switches the output policy; the next bind follows it.
    void switch_policy() {
        if (!running()) return;
        policy_ = policy_ == OutputPolicy::zero ? OutputPolicy::kernel_writes_all : OutputPolicy::zero;
        stager_->set_output_policy(policy_);
        log() << "output policy " << (policy_ == OutputPolicy::zero ? "zero" : "kernel_writes_all") << "\n";
        if (stager_->output_policy() != policy_) fail("output_policy() does not answer the policy just set");
    }

    /// reserve(bytes) between steps (retained strategies): busy while a run is live or a frame
    /// unbound or held; afterwards binds that fit move no address.
    void reserve(std::size_t bytes) {
        if (!running()) return;
        if constexpr (retained) {
            const bool in_use = std::any_of(steps_.begin(), steps_.end(),
                                            [](const Step& s) { return s.phase == Phase::bound || holds_slot(s); });
            log() << "reserve " << bytes;
            Faulted<Status> reserved = faulted(Call::reserve, true, [&] { return stager_->reserve(bytes); });
            ++report_.tally.reserves;
            log() << (reserved.result ? "\n" : " -> " + reserved.result.message() + "\n");
            if (in_use) {
                if (reserved.result.code() != Errc::busy) {
                    fail("reserve() while a run is live or a frame unbound or held answered '" +
                         (reserved.result ? std::string("ok") : reserved.result.message()) + "', not busy");
                }
                return;
            }
            if (!reserved.result) {
                reserved_.reset();  // some slots may have grown
                if (!injected(reserved, reserved.result)) fail("reserve() failed: " + reserved.result.message());
                return;
            }
            reserved_ = bytes;
            address_changes_ = stats().address_changes;
        } else {
            (void)bytes;
        }
    }

    /// release() between steps: ends the live runs (no copy-back), waits for every run in
    /// flight and gives the memory back. Refused (busy, nothing changed) while a frame is
    /// unbound or held by its run's Completion.
    void release() {
        if (!running()) return;
        const bool frames_held =
            std::any_of(steps_.begin(), steps_.end(), [](const Step& s) { return frame_holds_slot(s); });
        wait_for_foreign_kernels();
        log() << "release";
        Faulted<Status> released = faulted(Call::release, true, [&] { return stager_->release(); });
        ++report_.tally.releases;
        log() << (released.result ? "\n" : " -> " + released.result.message() + "\n");
        if (frames_held) {
            if (released.result.code() != Errc::busy) {
                fail("release() while a frame is unbound or held answered '" +
                     (released.result ? std::string("ok") : released.result.message()) + "', not busy");
                return;
            }
            for (const Step& step : steps_) {
                if (step.phase == Phase::bound && !step.run->live()) {
                    fail("release() refused (busy) but ended the live run of s" + std::to_string(step.id));
                }
            }
            return;
        }
        if (!released.result && !injected(released, released.result)) {
            fail("release() failed: " + released.result.message());
            return;
        }
        for (Step& step : steps_) {
            if (step.phase != Phase::bound) continue;
            if (step.run->live()) fail("release() left the run of s" + std::to_string(step.id) + " live");
            step.run.reset();
            step.phase = Phase::dropped;
        }
        reserved_.reset();
        if (!released.result) {
            // What could not be waited for is kept: the engine releases again, with no fault.
            const Status again = stager_->release();
            log() << "release again" << (again ? "\n" : " -> " + again.message() + "\n");
            if (!again) {
                fail("release() after a failed one failed: " + again.message());
                return;
            }
        }
        unsettled_ = false;
        // Every run in flight was waited for: its outputs are in host memory.
        for (Step& step : steps_) {
            if (step.phase == Phase::finished && !step.complete) {
                if (step.done && step.done->pending()) {
                    fail("s" + std::to_string(step.id) + ": its Completion is pending after release()");
                }
                completed(step);
            }
        }
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
        const std::uint32_t kind = choices.below(4);
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
        } else if (kind == 2) {
            const std::size_t slot = config_.slots + choices.below(3);
            const TensorArg none[] = {{nullptr, 0, Direction::In}};
            Result<StagedRun> run = stager_->bind_slot(slot, none, stream);
            expect(run.status(), "bind_slot on a slot out of range", false);
            if (run) step_run_leak(std::move(*run));
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
    /// the order `choices` gives), releases the stager and compares every host buffer. No fault
    /// is injected from here on.
    void conclude(Choices& choices) {
        choices_ = nullptr;
        every_.reset();
        if (!running()) return;
        if (config_.call_faults && choices.chance(1, 4)) {  // the stager's destruction fails to give back
            destruction_plan_.op = choices.chance(1, 2) ? FaultOp::destroy_event : FaultOp::destroy_stream;
            destruction_plan_.nth = 1 + choices.below(2);
            destruction_plan_.persistent = choices.chance(1, 2);
        }
        log() << "-- the end: finish what is open, wait for everything, release the stager\n";
        for (Step& step : steps_) {
            if (step.phase == Phase::framed) {
                if (!bind_frame(step.id)) {
                    if (running() && step.failed_binds > 0) {
                        fail("s" + std::to_string(step.id) + ": the frame a failed bind left did not bind again");
                    }
                    step.phase = Phase::refused;
                }
            }
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
                 std::to_string(expected_sinks_) + " expected" + (sunk_.empty() ? "" : ": " + sunk_.back()));
        }
        if (owed_reports_ > 0) {
            fail(std::to_string(owed_reports_) +
                 " call(s) whose injected failure to give memory back was neither returned nor reported (the "
                 "memory leaks unseen), the last under: " +
                 owed_what_);
        }
        report_.stats = stats();
        Tally& tally = report_.tally;
        tally.programs = 1;
        tally.binds = report_.stats.runs;
        tally.mapped_runs = report_.stats.mapped_runs;
        tally.map_failures = report_.stats.map_failures;
        tally.batched_copies = report_.stats.batched_copies;
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
        choices_ = &choices;
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
    // failed: a stream-ordered finish that failed at the call (the run ended; its memory the
    // engine's). dropped: ended without finish (or by release()).
    enum class Phase : std::uint8_t { framed, bound, finished, dropped, refused, failed };

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
        bool kernel_skipped = false;  // order_after_uploads failed: no kernel, a failed execution
        bool foreign_kernel = false;  // on a stream ordered by the engine's own event
        unsigned kernel_stream = 0;
        bool execution_ok = true;
        bool complete = false;  // known complete: waited, ready, destroyed
        bool released = false;  // its Completion destroyed or detached: a frame is handed back
        bool detached = false;
        bool in_place = false;       // a frame whose kernel uses its tensors where they lie (a mapped mirror)
        bool wait_may_fail = false;  // resolved with an injected failure (its own or another step's)
        unsigned failed_binds = 0;   // a frame's binds that failed (injected)
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

    // ---- faults around one stager call -----------------------------------------------------------

    // A call's result, and what the plan armed around it did.
    template <class R>
    struct Faulted {
        R result;
        FaultPlan plan;
        unsigned fired = 0;
        bool unwaited = false;  // the call left work it could not wait for (reported or returned)
    };

    // Runs `call` (a stager call of kind `kind`) under the next plan, and checks what the
    // injected faults may explain: reports to the error sink, failures to give memory back.
    template <class F>
    auto faulted(Call kind, bool sticky, F&& call) -> Faulted<decltype(call())> {
        using R = decltype(call());
        Faulted<R> out{call_default<R>(), {}, 0};
        out.plan = next_plan(kind, sticky);
        const std::size_t sunk_before = sunk_.size();
        if (out.plan.any()) {
            log() << "   (fault: " << out.plan.describe() << ")\n";
            backend_->arm(out.plan);
        }
        out.result = call();
        if (out.plan.any()) {
            out.fired = backend_->fired();
            const unsigned gave_back = backend_->fired_gives_back();
            backend_->disarm();
            if (out.fired > 0) log() << "   (failed: " << backend_->fired_log() << ")\n";
            if (out.fired > 0) {
                ++faulted_calls_;
                for (Step& step : steps_) {
                    if (step.phase == Phase::finished && !step.complete) step.wait_may_fail = true;
                }
            }
            // Several failures may come back as one (the first error of a settle, say).
            if (gave_back > 0 && sunk_.size() == sunk_before && succeeded(out.result)) {
                ++owed_reports_;
                owed_what_ = out.plan.describe();
            }
        }
        const auto unwaited = [](const std::string& message) {
            return message.find("could not be waited for") != std::string::npos;
        };
        if constexpr (!std::is_same_v<R, bool>) {
            if constexpr (std::is_same_v<R, Status>) {
                out.unwaited = unwaited(out.result.message());
            } else {
                out.unwaited = !out.result.ok() && unwaited(out.result.status().message());
            }
        }
        for (std::size_t i = sunk_before; i < sunk_.size(); ++i) {
            out.unwaited = out.unwaited || unwaited(sunk_[i]);
            if (out.fired > 0 && explained(sunk_[i])) {
                ++expected_sinks_;
            } else {
                note("the error sink got a report no injected fault explains: " + sunk_[i]);
                ++expected_sinks_;
            }
        }
        return out;
    }
    template <class R>
    static R call_default() {
        if constexpr (std::is_same_v<R, bool>) {
            return false;
        } else if constexpr (std::is_same_v<R, Status>) {
            return Status();
        } else {
            return R(Status(Errc::invalid_argument, "not called"));
        }
    }
    template <class R>
    static bool succeeded(const R& result) {
        if constexpr (std::is_same_v<R, bool>) {
            return result;
        } else {
            return result.ok();
        }
    }
    static bool explained(const std::string& message) {
        return message.find("injected") != std::string::npos ||
               message.find("could not be waited for") != std::string::npos;
    }
    // True when `failure` is what the faults of `call` explain (its code, and a message that
    // names the injected failure); counts it.
    template <class R>
    bool injected(const Faulted<R>& call, const Status& failure) {
        if (call.fired == 0 || failure.code() == Errc::busy || !explained(failure.message())) return false;
        if (failure.code() != call.plan.code && failure.code() != Errc::backend_failure) return false;
        ++report_.tally.failed_calls;
        return true;
    }
    // A failed wait of `step` is allowed when faults of this call explain it, or when an
    // earlier injected failure resolved its slot.
    template <class R>
    bool allowed_wait_failure(Step& step, const Faulted<R>& call, const Status& failure) {
        if (injected(call, failure)) {
            step.wait_may_fail = true;
            return true;
        }
        if (step.wait_may_fail && explained(failure.message())) {
            if (owed_reports_ > 0) --owed_reports_;  // a failed free, returned by a later wait
            return true;
        }
        return false;
    }
    bool allowed_wait_failure(Step& step, const Faulted<Status>& call) {
        return allowed_wait_failure(step, call, call.result);
    }
    // The result of a Completion known complete (wait() returns it without waiting), read
    // before the engine destroys or detaches it, or after ready() answered true.
    void read_result(Step& step) {
        if (!step.done || step.done->pending()) return;
        const Status result = step.done->wait();
        if (result) return;
        log() << "   (s" << step.id << "'s result: " << result.message() << ")\n";
        if (step.wait_may_fail && explained(result.message())) {
            if (owed_reports_ > 0) --owed_reports_;
            return;
        }
        note("s" + std::to_string(step.id) +
             ": its Completion resolved with a failure no fault explains: " + result.message());
    }

    // A Completion a failed wait left pending: the engine waits again, with no fault.
    void wait_again(Step& step) {
        const Status again = step.done->wait();
        log() << "s" << step.id << " wait again" << (again ? "\n" : " -> " + again.message() + "\n");
        if (!again && !(step.wait_may_fail && explained(again.message()))) {
            fail("s" + std::to_string(step.id) + ": the wait after a failed one failed: " + again.message());
            return;
        }
        if (step.done->pending()) {
            fail("s" + std::to_string(step.id) + ": a wait with no fault left the Completion pending");
            return;
        }
        completed(step);
    }

    // The plan for the next stager call of kind `kind`: a forced one (fault_next), else at
    // random when call faults are on, else none.
    FaultPlan next_plan(Call kind, bool sticky) {
        if (!forced_.empty()) {
            FaultPlan plan = forced_.front();
            forced_.pop_front();
            return plan;
        }
        if (every_) return *every_;
        FaultPlan plan;
        if (choices_ == nullptr || !config_.call_faults) return plan;
        Choices& c = *choices_;
        if (!c.chance(1, 4)) return plan;
        if (first_synchronous_ && c.chance(1, 2)) {  // the stager makes its own stream now
            plan.op = FaultOp::create_stream;
            return plan;
        }
        if (sticky && c.chance(1, 5)) {  // every wait fails, alone or with another fault
            plan.stuck = true;
            if (c.chance(1, 2)) return plan;
        }
        std::vector<FaultOp> menu;
        const auto offer = [&](std::initializer_list<FaultOp> ops) {
            for (FaultOp op : ops) {
                if (has_fault_op<B>(op) && allowed(kind, op)) menu.push_back(op);
            }
        };
        using F = FaultOp;
        switch (kind) {
            case Call::bind:
            case Call::bind_frame:
                offer({F::device_malloc, F::device_free, F::pinned_malloc, F::pinned_free, F::map_host, F::unmap_host,
                       F::copy_to_device_async, F::copy_to_device_batch, F::device_memset_async, F::copy_to_device,
                       F::device_memset, F::record_event, F::event_ready, F::synchronize_event, F::stream_wait_event,
                       F::create_event, F::create_stream, F::synchronize});
                break;
            case Call::frame:
                offer({F::device_malloc, F::device_free, F::pinned_malloc, F::pinned_free, F::map_host, F::unmap_host,
                       F::record_event, F::event_ready, F::synchronize_event, F::create_event});
                break;
            case Call::order:
                offer({F::record_event, F::stream_wait_event});
                break;
            case Call::finish:
                offer({F::copy_from_device_async, F::copy_from_device_batch, F::copy_from_device, F::record_event,
                       F::stream_wait_event, F::device_free, F::synchronize_event, F::create_stream, F::synchronize});
                break;
            case Call::wait:
            case Call::poll:
            case Call::destroy:
                offer({F::record_event, F::synchronize_event, F::event_ready, F::device_free, F::synchronize});
                break;
            case Call::drop:
                offer({F::record_event, F::stream_wait_event, F::synchronize_event, F::device_free});
                break;
            case Call::reserve:
                offer({F::device_malloc, F::device_free, F::pinned_malloc, F::pinned_free, F::map_host, F::unmap_host,
                       F::synchronize_event, F::record_event});
                break;
            case Call::release:
                offer({F::device_free, F::pinned_free, F::unmap_host, F::synchronize_event, F::record_event});
                break;
        }
        if (c.chance(1, 8)) {  // now and then any operation at all
            for (std::size_t op = 0; op < fault_op_count; ++op) {
                const auto any = static_cast<FaultOp>(op);
                if (has_fault_op<B>(any) && allowed(kind, any)) menu.push_back(any);
            }
        }
        if (menu.empty()) return plan;
        plan.op = menu[c.below(static_cast<std::uint32_t>(menu.size()))];
        plan.nth = c.chance(1, 2) ? 1 : 2 + c.below(3);
        plan.persistent = c.chance(1, 4);
        plan.code = *plan.op == FaultOp::device_malloc || *plan.op == FaultOp::pinned_malloc ? Errc::out_of_memory
                                                                                             : Errc::backend_failure;
        return plan;
    }
    // Whether `op` may fail in a call of `kind`: not where the library does not give yet what
    // the contract asks (sequential_config.hpp), unless that is expected.
    bool allowed(Call kind, FaultOp op) const noexcept {
        const bool joins = kind == Call::finish || kind == Call::drop || kind == Call::release;
        if ((config_.expect & expect_failed_joins_without_synchronize) == 0 && !devstage::SynchronizingBackend<B> &&
            joins && (op == FaultOp::record_event || op == FaultOp::stream_wait_event)) {
            return false;
        }
        return true;
    }

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
    // A frame unbound, or bound and its run's Completion still held: release() refuses under it.
    // (A bound frame's live run is ended by release() like any other.)
    static bool frame_holds_slot(const Step& step) noexcept {
        return step.spec.frame && step.phase != Phase::bound && holds_slot(step);
    }
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
    bool slot_held(std::size_t slot) const noexcept {
        return std::any_of(steps_.begin(), steps_.end(),
                           [slot](const Step& s) { return holds_slot(s) && s.slot == slot; });
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
    // True when two args of `step` share host bytes.
    bool aliased(const Step& step) {
        const std::vector<Use> mine = uses(step);
        for (std::size_t i = 0; i < mine.size(); ++i) {
            for (std::size_t j = i + 1; j < mine.size(); ++j) {
                if (overlap(mine[i], mine[j])) return true;
            }
        }
        return false;
    }

    // The bytes a plan of `step` takes from a slot at most (every staged tensor aligned).
    std::size_t plan_bytes(const Step& step) const noexcept {
        std::size_t bytes = 0;
        for (const ArgSpec& arg : step.spec.args) {
            if (arg.where == Where::device || arg.bytes == 0) continue;
            bytes += (arg.bytes + alignment - 1) / alignment * alignment;
        }
        return bytes;
    }
    // After reserve(bytes) succeeded: a bind or frame that fits moved no slot's address.
    void check_reserved(const Step& step, const char* what) {
        if (!reserved_) return;
        if (plan_bytes(step) <= *reserved_ && stats().address_changes != address_changes_) {
            note("s" + std::to_string(step.id) + ": " + what + " of " + std::to_string(plan_bytes(step)) +
                 " bytes moved a slot's address after reserve(" + std::to_string(*reserved_) + ")");
        }
        address_changes_ = stats().address_changes;
        if (plan_bytes(step) > *reserved_) reserved_.reset();  // it may have grown past the reservation
    }

    // ---- beginning a step ---------------------------------------------------------------------

    int begin_plain(Step& step) {
        std::ostringstream what;
        what << "s" << step.id << (step.spec.synchronous ? " bind synchronously [" : " bind [");
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
        what << "]";
        if (step.spec.slot) what << " on slot " << *step.spec.slot;
        if (!step.spec.synchronous) {
            what << " on stream " << step.spec.bind_stream << ", finish on " << step.spec.finish_stream
                 << (step.spec.kernel_on_finish && step.spec.finish_stream != step.spec.bind_stream ? ", kernel there"
                                                                                                    : "");
        }
        log() << what.str();
        const std::size_t held = held_slots();
        const bool idle = busy_slots() < config_.slots;
        const bool conflict = conflicts(step);
        const std::optional<std::string> live = live_overlap(step);
        const std::uint64_t waits = stats().host_waits;
        const std::optional<std::size_t> chosen = step.spec.slot;
        const bool out_of_range = chosen && *chosen >= config_.slots;
        const bool chosen_held = chosen && !out_of_range && slot_held(*chosen);
        first_synchronous_ = step.spec.synchronous && !synchronous_yet_;
        Faulted<Result<StagedRun>> bound = faulted(Call::bind, true, [&] {
            const Stream stream = streams_[step.spec.bind_stream];
            if (step.spec.synchronous)
                return chosen ? stager_->bind_slot(*chosen, step.args) : stager_->bind(step.args);
            return chosen ? stager_->bind_slot(*chosen, step.args, stream) : stager_->bind(step.args, stream);
        });
        first_synchronous_ = false;
        Result<StagedRun>& run = bound.result;
        if (step.spec.synchronous && run) synchronous_yet_ = true;
        if (!run) {
            log() << " -> " << run.status().message() << "\n";
            step.phase = Phase::refused;
            check_reserved(step, "a failed bind");
            const Errc code = run.status().code();
            if (out_of_range) {
                if (code != Errc::invalid_argument) {
                    fail("s" + std::to_string(step.id) + ": bind_slot out of range answered '" +
                         run.status().message() + "', not invalid_argument");
                }
            } else if (code == Errc::busy) {
                if (chosen ? !chosen_held && !live : held < config_.slots && !live) {
                    fail("s" + std::to_string(step.id) + ": bind refused (busy) without cause: " +
                         (chosen ? "slot " + std::to_string(*chosen) + " is not held"
                                 : std::to_string(held) + " of " + std::to_string(config_.slots) + " slot(s) held") +
                         ", and no live run copies back its host memory: " + run.status().message());
                }
            } else if (!injected(bound, run.status())) {
                fail("s" + std::to_string(step.id) + ": bind failed: " + run.status().message());
            }
            if (bound.unwaited) wait_for_device();
            return -1;
        }
        log() << " -> slot " << run->slot() << "\n";
        step.slot = run->slot();
        if (out_of_range) fail("s" + std::to_string(step.id) + ": bind_slot out of range succeeded");
        if (chosen_held || (chosen && run->slot() != *chosen)) {
            fail("s" + std::to_string(step.id) + ": bind_slot(" + std::to_string(*chosen) + ") bound on slot " +
                 std::to_string(run->slot()) + (chosen_held ? ", a slot held by a live run or a frame" : ""));
            step.run.emplace(std::move(*run));
            step.phase = Phase::bound;
            return -1;
        }
        if (!check_slot_taken(step, held, chosen ? "bind_slot" : "bind")) {
            step.run.emplace(std::move(*run));
            step.phase = Phase::bound;
            return -1;
        }
        // A packed bind_slot reuses the slot it is given: when its run may be pending the host
        // waits for it, as the contract says.
        const bool chosen_pending = chosen && std::any_of(steps_.begin(), steps_.end(), [&](const Step& s) {
                                        return s.id != step.id && in_flight(s) && s.slot == *chosen;
                                    });
        if (!bound.fired && !unsettled_ && !step.spec.synchronous && !conflict &&
            (!packs || (chosen ? !chosen_pending : idle)) && stats().host_waits != waits) {
            note("s" + std::to_string(step.id) + ": bind waited on the host (" +
                 std::to_string(stats().host_waits - waits) + " host wait(s)) though no run in flight shares its " +
                 "host memory" + (packs ? " and a slot was idle" : ""));
        }
        check_device_args(step, *run);
        step.run.emplace(std::move(*run));
        step.phase = Phase::bound;
        if (chosen) ++report_.tally.bind_slots;
        if (step.spec.synchronous) ++report_.tally.sync_steps;
        if (aliased(step)) ++report_.tally.aliased_runs;
        check_reserved(step, "a bind");
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
        Faulted<Result<HostFrame>> made = faulted(Call::frame, true, [&]() -> Result<HostFrame> {
            if constexpr (packs) {
                return stager_->frame(shapes);
            } else {
                return Status(Errc::not_supported, "no frames without packing");
            }
        });
        Result<HostFrame>& frame = made.result;
        if (!frame) {
            log() << " -> " << frame.status().message() << "\n";
            step.phase = Phase::refused;
            check_reserved(step, "a failed frame()");
            if (frame.status().code() == Errc::busy) {
                if (held < config_.slots) {
                    fail("s" + std::to_string(step.id) + ": frame() refused (busy) with " + std::to_string(held) +
                         " of " + std::to_string(config_.slots) + " slot(s) held: " + frame.status().message());
                }
            } else if (!injected(made, frame.status())) {
                fail("s" + std::to_string(step.id) + ": frame() failed: " + frame.status().message());
            }
            return -1;
        }
        log() << " -> slot " << frame->slot() << "\n";
        step.slot = frame->slot();
        step.frame.emplace(std::move(*frame));
        if (!check_slot_taken(step, held, "frame()")) {
            step.phase = Phase::framed;
            return -1;  // the held frame's memory may be gone: the program stops here
        }
        ++report_.tally.frames;
        if (!made.fired && !unsettled_ && idle && stats().host_waits != waits) {
            note("s" + std::to_string(step.id) + ": frame() waited on the host (" +
                 std::to_string(stats().host_waits - waits) + " host wait(s)) though a slot was idle");
        }
        check_reserved(step, "a frame");
        const HostFrame& held_frame = *step.frame;
        const std::size_t count = step.spec.args.size();
        step.tensors.resize(count);
        step.model.resize(count);
        step.unknown.resize(count);
        step.defined.assign(count, false);
        if (held_frame.size() != count) {
            fail("s" + std::to_string(step.id) + ": the frame has the wrong number of tensors");
        }
        for (std::size_t i = 0; i < count && i < held_frame.size(); ++i) {
            const std::span<std::byte> tensor = held_frame.host(i);
            const ArgSpec& arg = step.spec.args[i];
            if (arg.where == Where::device) {
                const TensorArg& passed = held_frame.args()[i];
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

    // Destroys the stager (under destruction_plan_): every failure it meets goes to the error
    // sink; what it could not give back stays with the backend (Faulty gives it back later).
    void destroy_stager() {
        if (!stager_) return;
        const std::size_t sunk_before = sunk_.size();
        const bool armed = destruction_plan_.any() && ok();
        if (armed) {
            log() << "destroy the stager   (fault: " << destruction_plan_.describe() << ")\n";
            backend_->arm(destruction_plan_);
        }
        stager_.reset();
        const unsigned fired = armed ? backend_->fired() : 0;
        backend_->disarm();
        if (fired > 0) log() << "   (failed: " << backend_->fired_log() << ")\n";
        if (!ok()) return;
        for (std::size_t i = sunk_before; i < sunk_.size(); ++i) {
            if (fired == 0 || !explained(sunk_[i])) {
                fail("destroying the stager reported what no injected fault explains: " + sunk_[i]);
            }
        }
        if (fired > 0 && sunk_.size() == sunk_before) {
            fail("destroying the stager met " + std::to_string(fired) + " injected failure(s) and reported none");
        }
    }

    // ---- synchronous steps and failed finishes --------------------------------------------------

    // A synchronous step's finish: the engine waits for its kernel, then finish(run) copies
    // back and returns once the outputs are in host memory.
    bool finish_synchronously(Step& step, bool execution_ok) {
        if (step.kernel && !step.kernel_skipped) {
            const unsigned on = step.kernel_stream;
            expect_ok(engine().record_event(kernel_events_[on], streams_[on]), "engine record_event");
            expect_ok(engine().synchronize_event(kernel_events_[on]), "engine synchronize_event");
        }
        const Status execution = execution_ok ? Status() : Status(Errc::backend_failure, "the kernel failed");
        Faulted<Status> finished =
            faulted(Call::finish, false, [&] { return stager_->finish(std::move(*step.run), execution); });
        step.run.reset();
        log() << "s" << step.id << " finish synchronously" << (execution_ok ? "" : " (execution failed)");
        if (!finished.result) {
            log() << " -> " << finished.result.message() << "\n";
            if (!injected(finished, finished.result)) {
                fail("s" + std::to_string(step.id) + ": finish failed: " + finished.result.message());
                step.phase = Phase::dropped;
                return false;
            }
            failed_finish(step);
            return false;
        }
        log() << "\n";
        step.phase = Phase::finished;
        step.execution_ok = execution_ok;
        step.finish_order = ++finishes_;
        step.released = true;
        model_finish(step);
        completed(step);
        return true;
    }

    // A finish that failed at the call ended the run: its host memory is the engine's again
    // (a frame handed back), and what it copies back is undefined.
    void failed_finish(Step& step) {
        step.phase = Phase::failed;
        step.released = true;
        step.complete = true;
        for (const ArgSpec& arg : step.spec.args) {
            if (arg.where == Where::device || arg.bytes == 0 || !devstage::copies_back(arg.direction)) continue;
            if (arg.where == Where::frame && arg.index == step.id) continue;  // handed back: never read again
            std::uint8_t* unknown = unknown_of(arg);
            std::fill(unknown, unknown + arg.bytes, std::uint8_t{1});
        }
    }

    // A call failed and could not wait for what it had enqueued: the device may still read the
    // run's inputs or complete its direct copy-backs (async.md). The engine's way out is the
    // device's: it waits for the whole device (synchronize(), where the backend has it) or for
    // its own streams before it touches that memory again. The stager's slots may still hold
    // work the model sees nothing of, until a release() settles them.
    void wait_for_device() {
        unsettled_ = true;
        log() << "engine waits for the device\n";
        if constexpr (devstage::SynchronizingBackend<A>) {
            expect_ok(engine().synchronize(), "engine synchronize");
        }
        drain_streams();
    }

    // Waits for the engine's kernels that run on a stream the stager was not told of (ordered
    // by the engine's own event), before release() ends their live runs.
    void wait_for_foreign_kernels() {
        for (const Step& step : steps_) {
            if (step.phase != Phase::bound || !step.foreign_kernel) continue;
            const unsigned on = step.kernel_stream;
            expect_ok(engine().record_event(kernel_events_[on], streams_[on]), "engine record_event");
            expect_ok(engine().synchronize_event(kernel_events_[on]), "engine synchronize_event");
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
    // (kernel_writes_all): the policy at the bind counts. Every upload reads the host bytes as
    // the bind found them.
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
    // The copy-backs into the model's host memory. Where two copied-back args of the run
    // overlap, the bytes on which they differ are undefined.
    void model_finish(Step& step) {
        if (!step.execution_ok) {
            // Nothing is copied back, but a frame used in place holds what its kernel wrote.
            if (step.in_place) model_in_place_writes(step);
            return;
        }
        const auto backs = [&](std::size_t i) {
            const ArgSpec& arg = step.spec.args[i];
            return arg.where != Where::device && devstage::copies_back(arg.direction) && arg.bytes > 0;
        };
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            const ArgSpec& arg = step.spec.args[i];
            if (!backs(i)) continue;
            std::memcpy(model_of(arg), step.staged[i].data(), arg.bytes);
            std::memcpy(unknown_of(arg), step.staged_unknown[i].data(), arg.bytes);
            if (arg.where == Where::frame && arg.offset == 0 &&
                arg.bytes ==
                    steps_[static_cast<std::size_t>(arg.index)].model[static_cast<std::size_t>(arg.tensor)].size()) {
                steps_[static_cast<std::size_t>(arg.index)].defined[static_cast<std::size_t>(arg.tensor)] = true;
            }
        }
        for (std::size_t i = 0; i < step.spec.args.size(); ++i) {
            if (!backs(i)) continue;
            for (std::size_t j = i + 1; j < step.spec.args.size(); ++j) {
                if (backs(j)) mark_disagreement(step, i, j);
            }
        }
    }
    // Copied-back args i and j of `step`: where they overlap and differ (or either is
    // undefined), the host bytes are undefined.
    void mark_disagreement(Step& step, std::size_t i, std::size_t j) {
        const ArgSpec& a = step.spec.args[i];
        const ArgSpec& b = step.spec.args[j];
        const std::byte* pa = pointer(a);
        const std::byte* pb = pointer(b);
        const std::byte* begin = std::max(pa, pb);
        const std::byte* end = std::min(pa + a.bytes, pb + b.bytes);
        for (const std::byte* at = begin; at < end; ++at) {
            const auto x = static_cast<std::size_t>(at - pa);
            const auto y = static_cast<std::size_t>(at - pb);
            if (step.staged[i][x] != step.staged[j][y] || step.staged_unknown[i][x] != 0 ||
                step.staged_unknown[j][y] != 0) {
                unknown_of(a)[x] = 1;
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
        write,
        reserve,
        release
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
        if (config_.reserve_release) {
            if (retained) add(Move::reserve, -1, 1);
            add(Move::release, -1, 1);
        }
        if (moves.empty()) return false;
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
            case Move::reserve:
                reserve(reserve_sizes[choices.below(static_cast<std::uint32_t>(std::size(reserve_sizes)))]);
                break;
            case Move::release:
                release();
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
        const unsigned count_base = 1 + choices.below(4);
        unsigned count_extra = 0;
        if (spec.frame) {
            const unsigned count = count_base;
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
        if (config_.sync_steps && choices.chance(1, 4)) spec.synchronous = true;
        if (config_.bind_slots && choices.chance(1, 3)) {
            spec.slot = choices.chance(1, 8) ? config_.slots + choices.below(2) : choices.below(config_.slots);
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
        std::optional<ArgSpec> repeat;  // the host buffer the next arg takes again (aliasing)
        for (unsigned i = 0; i < count_base + count_extra && !candidates.empty(); ++i) {
            const unsigned count = count_base + count_extra;
            const std::size_t pick = choices.below(static_cast<std::uint32_t>(candidates.size()));
            ArgSpec arg = repeat ? *repeat : candidates[pick];
            repeat.reset();
            // With aliasing a host buffer may come again in the same run (another range of it,
            // another direction), often as the very next arg; everything else comes once.
            const bool again = config_.aliasing && arg.where == Where::host && choices.chance(1, 2);
            if (again && choices.chance(1, 2)) {
                repeat = arg;
                repeat->offset = 0;
                repeat->bytes = host_[static_cast<std::size_t>(arg.index)].bytes;
                if (i + 1 == count && count < 4) ++count_extra;
            }
            if (!again) {
                candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                                [&](const ArgSpec& c) {
                                                    return c.where == arg.where && c.index == arg.index &&
                                                           c.tensor == arg.tensor;
                                                }),
                                 candidates.end());
            }
            if (arg.where == Where::device && !choices.chance(1, 2)) continue;  // device args less often
            arg.direction = random_direction(choices);
            if (arg.where == Where::frame && choices.chance(2, 3)) arg.direction = Direction::In;
            if (arg.bytes > 1 && choices.chance(again ? 2 : 1, 4)) {  // a part of the buffer
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

    A& engine() noexcept {
        if constexpr (streams) {
            return *backend_;
        } else {
            return *adapter_;
        }
    }
    Status pinned_free(void* pointer) noexcept {
        if constexpr (devstage::PinnedHostBackend<B>) {
            return backend_->pinned_free(pointer);
        } else {
            (void)pointer;
            return {};
        }
    }

    void drain_streams() {
        for (std::size_t i = 0; i < streams_.size(); ++i) {
            expect_ok(engine().record_event(kernel_events_[i], streams_[i]), "engine record_event");
            expect_ok(engine().synchronize_event(kernel_events_[i]), "engine synchronize_event");
        }
    }

    std::uint64_t misuses() const {
        if constexpr (std::is_base_of_v<devstage::MockBackend, Base> || std::is_same_v<Base, SlowBackend> ||
                      std::is_same_v<Base, StreamlessMock>) {
            return backend_->misuses();
        } else {
            return 0;
        }
    }
    std::string first_misuse() const {
        if constexpr (std::is_same_v<Base, SlowBackend>) {
            return backend_->first_misuse();
        } else if constexpr (std::is_base_of_v<devstage::MockBackend, Base> || std::is_same_v<Base, StreamlessMock>) {
            return backend_->misuse_report();
        } else {
            return "(none)";
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
    std::optional<devstage::SynchronousAdapter<B>> adapter_;  // the engine's streams, without the backend's
    std::vector<HostBuffer> host_;
    std::vector<DeviceBuffer> device_;
    std::optional<devstage::Stager<B, S>> stager_;
    std::vector<Stream> streams_;
    std::vector<Event> kernel_events_, bind_events_;
    std::deque<Step> steps_;
    std::vector<std::unique_ptr<Job>> jobs_;
    std::vector<std::string> sunk_;
    std::size_t expected_sinks_ = 0;  // reports injected faults explain
    Choices* choices_ = nullptr;      // while the random engine drives: where plans come from
    std::deque<FaultPlan> forced_;    // plans for the next calls (fault_next)
    std::optional<FaultPlan> every_;  // around every call (fault_every_call)
    FaultPlan destruction_plan_;      // around the stager's destruction
    bool synchronous_yet_ = false;    // a synchronous call succeeded: the stager has its own stream
    bool first_synchronous_ = false;  // the call now is the first synchronous one
    std::uint64_t faulted_calls_ = 0;
    std::uint64_t owed_reports_ = 0;  // failures to give back neither returned nor reported yet
    std::string owed_what_;
    // A failed call left work it could not wait for: slots may be
    // waited for where the model sees nothing in flight, until a release() settles them.
    bool unsettled_ = false;
    std::optional<std::size_t> reserved_;  // what reserve() succeeded with, until a release()
    std::uint64_t address_changes_ = 0;    // StagerStats::address_changes then
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

template <class Base, class S>
void run_typed(const Config& config, Choices& choices, Report& report, int trace_fd) {
    Runner<Base, S> runner(config, report);
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

template <class Base>
void run_on(const Config& config, Choices& choices, Report& report, int trace_fd) {
    switch (config.strategy) {
        case StrategyKind::bump:
            return run_typed<Base, Bump>(config, choices, report, trace_fd);
        case StrategyKind::packed:
            return run_typed<Base, Packed>(config, choices, report, trace_fd);
        case StrategyKind::per_tensor:
            return run_typed<Base, PerTensor>(config, choices, report, trace_fd);
        case StrategyKind::mapped:
            return run_typed<Base, Mapped>(config, choices, report, trace_fd);
    }
}

/// Runs the program `choices` gives under `config` (its trace also written to `trace_fd`).
inline Report run_program(const Config& config, Choices& choices, int trace_fd = -1) {
    Report report;
    report.config = config;
    switch (config.backend) {
        case BackendKind::mock:
        case BackendKind::eager_mock:
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
        case BackendKind::streamless:
            run_on<StreamlessMock>(config, choices, report, trace_fd);
            break;
    }
    return report;
}

/// The configuration of program `seed`: it cycles through every combination.
inline Config seed_config(std::uint64_t seed, Choices& choices, unsigned max_steps, unsigned expect = 0) {
    Config config = config_for(seed, choices, expect);
    config.max_steps = max_steps;
    return config;
}

/// Program `seed`, in this process.
inline Report run_seed(std::uint64_t seed, unsigned max_steps = 14, unsigned expect = 0) {
    Choices choices(seed);
    const Config config = seed_config(seed, choices, max_steps, expect);
    return run_program(config, choices);
}

/// Program `seed` in a child process, so that a stager that crashes (a use after free) is
/// reported with the trace so far instead of ending the suite. The tally comes back too.
inline Report run_seed_isolated(std::uint64_t seed, unsigned max_steps = 14, unsigned expect = 0) {
    int trace[2], verdict[2];
    if (::pipe(trace) != 0) return run_seed(seed, max_steps, expect);
    if (::pipe(verdict) != 0) {
        ::close(trace[0]);
        ::close(trace[1]);
        return run_seed(seed, max_steps, expect);
    }
    const pid_t child = ::fork();
    if (child < 0) {
        for (int fd : {trace[0], trace[1], verdict[0], verdict[1]}) ::close(fd);
        return run_seed(seed, max_steps, expect);
    }
    const auto write_all = [](int fd, const std::string& text) {
        for (std::size_t at = 0; at < text.size();) {
            const ssize_t wrote = ::write(fd, text.data() + at, text.size() - at);
            if (wrote <= 0) break;
            at += static_cast<std::size_t>(wrote);
        }
    };
    if (child == 0) {
        ::close(trace[0]);
        ::close(verdict[0]);
        Choices choices(seed);
        const Config config = seed_config(seed, choices, max_steps, expect);
        const Report report = run_program(config, choices, trace[1]);
        write_all(trace[1], report.trace);
        // The verdict: the tally's figures on the first line, then one failure per line.
        std::ostringstream verdict_text;
        verdict_text << report.tally.numbers() << '\n';
        for (const std::string& failure : report.failures) verdict_text << failure << '\n';
        write_all(verdict[1], verdict_text.str());
        ::_exit(0);
    }
    ::close(trace[1]);
    ::close(verdict[1]);
    Report report;
    Choices choices(seed);
    report.config = seed_config(seed, choices, max_steps, expect);
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
    const std::string verdict_text = drain(verdict[0]);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
    }
    std::size_t from = 0;
    bool figures = true;
    for (std::size_t end = verdict_text.find('\n'); end != std::string::npos; end = verdict_text.find('\n', from)) {
        const std::string line = verdict_text.substr(from, end - from);
        from = end + 1;
        if (figures) {
            figures = false;
            report.tally.read_numbers(line);
            continue;
        }
        report.failures.push_back(line);
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
