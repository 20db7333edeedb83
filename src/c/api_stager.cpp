// SPDX-License-Identifier: Apache-2.0
// The stager entry points of the C interface: stagers, runs, completions, frames and stats.
// Runs, completions and frames name the stager that made them, so one given to another stager
// (or outliving its own) is refused before the C++ stager sees it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "any_stager.hpp"
#include "devstage/c/devstage.h"
#include "devstage/detail/util/message.hpp"
#include "handles.hpp"

using namespace devstage::capi;  // the entry points' helpers
using devstage::Errc;
using devstage::Result;
using devstage::Status;

// Every StagerStats counter has its field in devstage_stager_stats (all are uint64_t).
static_assert(sizeof(devstage_stager_stats) == sizeof(devstage::StagerStats),
              "devstage_stager_stats must carry every StagerStats counter: append the new ones");

namespace {

Status invalid(const char* function, std::size_t index, const char* field, int value, const char* allowed) {
    return Status(Errc::invalid_argument, devstage::detail::message(function, ": arg ", index, " has ", field, " ",
                                                                    value, ", which is not ", allowed));
}

// invalid_argument when `count` elements of `size` bytes cannot be an array in memory.
Status countable(const char* function, const char* what, std::size_t count, std::size_t size) {
    if (count <= PTRDIFF_MAX / size) return {};
    return Status(Errc::invalid_argument,
                  devstage::detail::message(function, ": ", what, " count ", count, " cannot be the size of an array"));
}

// invalid_argument: `what` (a run, frame or completion) belongs to another stager.
devstage_status not_this_stager(const char* function, const char* what) {
    return report(Status(Errc::invalid_argument,
                         devstage::detail::message(function, ": the ", what,
                                                   " belongs to another stager (or to one that was destroyed)")));
}

// The C args as TensorArgs, in the stager's reusable storage.
Result<std::span<const devstage::TensorArg>> converted(const char* function, StagerState& stager,
                                                       const devstage_tensor_arg* args, std::size_t count) {
    if (Status sized = countable(function, "args", count, sizeof(devstage_tensor_arg)); !sized) return sized;
    stager.args.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
        const devstage_tensor_arg& arg = args[i];
        if (arg.direction != DEVSTAGE_IN && arg.direction != DEVSTAGE_OUT && arg.direction != DEVSTAGE_IN_OUT) {
            return invalid(function, i, "direction", arg.direction, "DEVSTAGE_IN, DEVSTAGE_OUT or DEVSTAGE_IN_OUT");
        }
        if (arg.placement != DEVSTAGE_HOST && arg.placement != DEVSTAGE_DEVICE) {
            return invalid(function, i, "placement", arg.placement, "DEVSTAGE_HOST or DEVSTAGE_DEVICE");
        }
        stager.args[i] = devstage::TensorArg{arg.data, arg.bytes, static_cast<devstage::Direction>(arg.direction),
                                             static_cast<devstage::Placement>(arg.placement)};
    }
    return std::span<const devstage::TensorArg>(stager.args);
}

// Ok while a frame's memory is its own: the HostFrame becomes inert when its slot is taken
// again once its run ended, or the stager releases, reserves or abandons.
Status frame_memory(const char* function, const FrameState& frame) {
    if (frame.frame->live()) return {};
    return Status(Errc::invalid_argument,
                  devstage::detail::message(function,
                                            ": the frame's memory was given back (its slot was taken by a later frame "
                                            "or bind once its run ended, or the stager was released, reserved or "
                                            "abandoned)"));
}

// Hands a bound run to the caller as a handle; a run with no handle ends (without copy-backs).
devstage_status run_handed_out(const char* function, const StagerState& stager, Result<devstage::StagedRun> bound,
                               devstage_run** run) {
    if (!bound) return report(bound.status());
    devstage_run* handle = hand_out(std::make_unique<RunState>(RunState{stager.self, std::move(*bound)}));
    if (handle == nullptr) return no_handle(function, HandleKind::run);
    *run = handle;
    return report(Status());
}

// Runs `operation(state)` on a stager handle that must be live.
template <class Operation>
devstage_status on_stager(const char* function, const devstage_stager* stager, Operation&& operation) noexcept {
    return guarded(function, [&] {
        StagerState* state = find<StagerState>(stager);
        if (state == nullptr) return bad_handle<StagerState>(function, stager);
        return operation(*state);
    });
}

// The stream of `handle` when it belongs to `stager`'s backend, else null after reporting.
StreamState* stager_stream(const char* function, devstage_stream handle, const StagerState& stager,
                           devstage_status& failed) noexcept {
    return checked_stream(function, handle, *stager.backend, "a stager of ", failed);
}

// Binds `args` (converted) with `bind(stager, span, stream)`; `stream` null: synchronously.
template <class Bind>
devstage_status bind_args(const char* function, devstage_stager* stager, const devstage_tensor_arg* args,
                          std::size_t count, const devstage_stream* stream, devstage_run** run, Bind&& bind) {
    return guarded(function, [&] {
        if (run == nullptr) return null_argument(function, "run");
        *run = nullptr;
        StagerState* state = find<StagerState>(stager);
        if (state == nullptr) return bad_handle<StagerState>(function, stager);
        if (args == nullptr && count > 0) {
            return report(Status(Errc::invalid_argument,
                                 devstage::detail::message(function, ": args is NULL with count ", count)));
        }
        AnyStager::Stream native{};
        if (stream != nullptr) {
            devstage_status failed = DEVSTAGE_OK;
            StreamState* s = stager_stream(function, *stream, *state, failed);
            if (s == nullptr) return failed;
            native = s->native;
        }
        Result<std::span<const devstage::TensorArg>> converted_args = converted(function, *state, args, count);
        if (!converted_args) return report(converted_args.status());
        return run_handed_out(function, *state, bind(*state->stager, *converted_args, native), run);
    });
}

// Binds a frame with `bind(stager, frame, stream)`; `stream` null: synchronously.
template <class Bind>
devstage_status bind_frame(const char* function, devstage_stager* stager, const devstage_frame* frame,
                           const devstage_stream* stream, devstage_run** run, Bind&& bind) {
    return guarded(function, [&] {
        if (run == nullptr) return null_argument(function, "run");
        *run = nullptr;
        StagerState* state = find<StagerState>(stager);
        if (state == nullptr) return bad_handle<StagerState>(function, stager);
        FrameState* f = find<FrameState>(frame);
        if (f == nullptr) return bad_handle<FrameState>(function, frame);
        if (f->stager != state->self) return not_this_stager(function, "frame");
        AnyStager::Stream native{};
        if (stream != nullptr) {
            devstage_status failed = DEVSTAGE_OK;
            StreamState* s = stager_stream(function, *stream, *state, failed);
            if (s == nullptr) return failed;
            native = s->native;
        }
        return run_handed_out(function, *state, bind(*state->stager, *f->frame, native), run);
    });
}

}  // namespace

extern "C" {

devstage_status devstage_stager_create(devstage_backend* backend, const devstage_stager_config* config,
                                       devstage_stager** out) {
    return guarded("devstage_stager_create", [&] {
        return created<StagerState>("devstage_stager_create", backend, out, [&](StagerState& state) {
            Result<std::unique_ptr<AnyStager>> made = make_stager(*state.backend, config);
            if (!made) return made.status();
            if (!(*made)->status()) return (*made)->status();
            state.stager = std::move(*made);
            state.stager->set_error_sink(state.sink.sink());
            return Status();
        });
    });
}

devstage_status devstage_stager_destroy(devstage_stager* stager) {
    return destroyed<StagerState>("devstage_stager_destroy", stager, &StagerState::stager);
}

devstage_status devstage_stager_set_error_sink(devstage_stager* stager, devstage_error_sink sink, void* context) {
    return on_stager("devstage_stager_set_error_sink", stager, [&](StagerState& s) {
        s.sink.function = sink;  // the stager reports through s.sink, installed at creation
        s.sink.context = context;
        return report(Status());
    });
}

devstage_status devstage_stager_release(devstage_stager* stager) {
    return on_stager("devstage_stager_release", stager, [&](StagerState& s) { return report(s.stager->release()); });
}

devstage_status devstage_stager_abandon(devstage_stager* stager) {
    return on_stager("devstage_stager_abandon", stager, [&](StagerState& s) {
        s.stager->abandon();
        return report(Status());
    });
}

devstage_status devstage_stager_reserve(devstage_stager* stager, size_t bytes) {
    return on_stager("devstage_stager_reserve", stager,
                     [&](StagerState& s) { return report(s.stager->reserve(bytes)); });
}

devstage_status devstage_bind(devstage_stager* stager, const devstage_tensor_arg* args, size_t count,
                              devstage_run** run) {
    return bind_args("devstage_bind", stager, args, count, nullptr, run,
                     [](AnyStager& s, std::span<const devstage::TensorArg> a, AnyStager::Stream) { return s.bind(a); });
}

devstage_status devstage_bind_on(devstage_stager* stager, const devstage_tensor_arg* args, size_t count,
                                 devstage_stream stream, devstage_run** run) {
    return bind_args(
        "devstage_bind_on", stager, args, count, &stream, run,
        [](AnyStager& s, std::span<const devstage::TensorArg> a, AnyStager::Stream on) { return s.bind(a, on); });
}

devstage_status devstage_bind_frame(devstage_stager* stager, const devstage_frame* frame, devstage_run** run) {
    return bind_frame("devstage_bind_frame", stager, frame, nullptr, run,
                      [](AnyStager& s, const devstage::HostFrame& f, AnyStager::Stream) { return s.bind(f); });
}

devstage_status devstage_bind_frame_on(devstage_stager* stager, const devstage_frame* frame, devstage_stream stream,
                                       devstage_run** run) {
    return bind_frame("devstage_bind_frame_on", stager, frame, &stream, run,
                      [](AnyStager& s, const devstage::HostFrame& f, AnyStager::Stream on) { return s.bind(f, on); });
}

devstage_status devstage_run_device_args(const devstage_run* run, void** device_args, size_t count) {
    return guarded("devstage_run_device_args", [&] {
        const RunState* r = find<RunState>(run);
        if (r == nullptr) return bad_handle<RunState>("devstage_run_device_args", run);
        if (!r->run.live()) {
            return report(
                Status(Errc::invalid_argument,
                       "devstage_run_device_args: the run is not live (its stager released or destroyed it)"));
        }
        const auto args = r->run.device_args();
        if (count != args.size()) {
            return report(Status(Errc::invalid_argument,
                                 devstage::detail::message("devstage_run_device_args: count ", count,
                                                           ", but the run was bound with ", args.size(), " args")));
        }
        if (device_args == nullptr && count > 0) return null_argument("devstage_run_device_args", "device_args");
        for (std::size_t i = 0; i < count; ++i) device_args[i] = args[i].data;
        return report(Status());
    });
}

devstage_status devstage_run_slot(const devstage_run* run, size_t* slot) {
    return guarded("devstage_run_slot", [&] {
        const RunState* r = find<RunState>(run);
        if (r == nullptr) return bad_handle<RunState>("devstage_run_slot", run);
        if (slot == nullptr) return null_argument("devstage_run_slot", "slot");
        *slot = r->run.slot();
        return report(Status());
    });
}

devstage_status devstage_order_after_uploads(devstage_stager* stager, const devstage_run* run, devstage_stream stream) {
    return on_stager("devstage_order_after_uploads", stager, [&](StagerState& s) {
        const RunState* r = find<RunState>(run);
        if (r == nullptr) return bad_handle<RunState>("devstage_order_after_uploads", run);
        if (r->stager != s.self) return not_this_stager("devstage_order_after_uploads", "run");
        devstage_status failed = DEVSTAGE_OK;
        StreamState* on = stager_stream("devstage_order_after_uploads", stream, s, failed);
        if (on == nullptr) return failed;
        return report(s.stager->order_after_uploads(r->run, on->native));
    });
}

devstage_status devstage_finish(devstage_stager* stager, devstage_run* run, devstage_status execution) {
    return on_stager("devstage_finish", stager, [&](StagerState& s) {
        RunState* r = find<RunState>(run);
        if (r == nullptr) return bad_handle<RunState>("devstage_finish", run);
        if (r->stager != s.self) return not_this_stager("devstage_finish", "run");
        const Status finished = s.stager->finish(std::move(r->run), execution_status(execution));
        if (!r->run.live()) take_back(run, r);  // a finish that was not refused ends the run
        return report(finished);
    });
}

devstage_status devstage_finish_on(devstage_stager* stager, devstage_run* run, devstage_stream stream,
                                   devstage_status execution, devstage_completion** completion) {
    return guarded("devstage_finish_on", [&] {
        if (completion == nullptr) return null_argument("devstage_finish_on", "completion");
        *completion = nullptr;
        StagerState* s = find<StagerState>(stager);
        if (s == nullptr) return bad_handle<StagerState>("devstage_finish_on", stager);
        RunState* r = find<RunState>(run);
        if (r == nullptr) return bad_handle<RunState>("devstage_finish_on", run);
        if (r->stager != s->self) return not_this_stager("devstage_finish_on", "run");
        devstage_status failed = DEVSTAGE_OK;
        StreamState* on = stager_stream("devstage_finish_on", stream, *s, failed);
        if (on == nullptr) return failed;  // the run is left as it was
        // The state exists before the run ends, so running out of host memory loses no completion.
        auto state = std::make_unique<CompletionState>();
        state->stager = s->self;
        Result<devstage::Completion> done =
            s->stager->finish(std::move(r->run), on->native, execution_status(execution));
        if (!done && r->run.live()) return report(done.status());  // refused: the run is left as it was
        take_back(run, r);
        if (!done) return report(done.status());
        state->completion = std::move(*done);
        devstage_completion* handle = hand_out(std::move(state));
        if (handle == nullptr) return no_handle("devstage_finish_on", HandleKind::completion);
        *completion = handle;
        return report(Status());
    });
}

devstage_status devstage_run_destroy(devstage_run* run) {
    return guarded("devstage_run_destroy", [&] {
        if (run == nullptr) return report(Status());
        RunState* r = find<RunState>(run);
        if (r == nullptr) return bad_handle<RunState>("devstage_run_destroy", run);
        take_back(run, r);  // an unfinished run releases its memory without copying back
        return report(Status());
    });
}

devstage_status devstage_completion_wait(devstage_completion* completion) {
    return guarded("devstage_completion_wait", [&] {
        CompletionState* c = find<CompletionState>(completion);
        if (c == nullptr) return bad_handle<CompletionState>("devstage_completion_wait", completion);
        const Status waited = c->completion.wait();
        c->waited = !c->completion.pending();  // a wait that ended it: its result was given
        return report(waited);
    });
}

devstage_status devstage_completion_ready(devstage_completion* completion, int* ready) {
    return guarded("devstage_completion_ready", [&] {
        CompletionState* c = find<CompletionState>(completion);
        if (c == nullptr) return bad_handle<CompletionState>("devstage_completion_ready", completion);
        if (ready == nullptr) return null_argument("devstage_completion_ready", "ready");
        Result<bool> answer = c->completion.ready();
        if (!answer) return report(answer.status());
        *ready = *answer ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_completion_pending(const devstage_completion* completion, int* pending) {
    return guarded("devstage_completion_pending", [&] {
        const CompletionState* c = find<CompletionState>(completion);
        if (c == nullptr) return bad_handle<CompletionState>("devstage_completion_pending", completion);
        if (pending == nullptr) return null_argument("devstage_completion_pending", "pending");
        *pending = c->completion.pending() ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_completion_destroy(devstage_completion* completion) {
    return guarded("devstage_completion_destroy", [&] {
        if (completion == nullptr) return report(Status());
        CompletionState* c = find<CompletionState>(completion);
        if (c == nullptr) return bad_handle<CompletionState>("devstage_completion_destroy", completion);
        // Waits unless a wait already ended it; while the work stays pending (the wait failed),
        // the handle is kept: its run's host memory is still devstage's.
        Status waited;
        if (!c->waited) {
            waited = c->completion.wait();
            if (c->completion.pending()) {
                return report(Status(waited.code(),
                                     "devstage_completion_destroy: the run's work could not be waited for, so the "
                                     "completion is kept (its host memory may still be written): " +
                                         waited.message()));
            }
        }
        take_back(completion, c);
        return report(waited);
    });
}

devstage_status devstage_frame_create(devstage_stager* stager, const devstage_tensor_shape* shapes, size_t count,
                                      devstage_frame** frame) {
    return guarded("devstage_frame_create", [&] {
        if (frame == nullptr) return null_argument("devstage_frame_create", "frame");
        *frame = nullptr;
        StagerState* s = find<StagerState>(stager);
        if (s == nullptr) return bad_handle<StagerState>("devstage_frame_create", stager);
        if (shapes == nullptr && count > 0) return null_argument("devstage_frame_create", "shapes");
        if (Status sized = countable("devstage_frame_create", "shapes", count, sizeof(devstage_tensor_shape)); !sized) {
            return report(sized);
        }
        s->shapes.resize(count);
        for (std::size_t i = 0; i < count; ++i) {
            const devstage_tensor_shape& shape = shapes[i];
            if (shape.direction != DEVSTAGE_IN && shape.direction != DEVSTAGE_OUT &&
                shape.direction != DEVSTAGE_IN_OUT) {
                return report(invalid("devstage_frame_create", i, "direction", shape.direction,
                                      "DEVSTAGE_IN, DEVSTAGE_OUT or DEVSTAGE_IN_OUT"));
            }
            s->shapes[i] =
                devstage::TensorShape{shape.bytes, static_cast<devstage::Direction>(shape.direction), shape.device};
        }
        // The state exists before the frame, so running out of host memory strands no slot.
        auto state = std::make_unique<FrameState>();
        state->stager = s->self;
        Result<devstage::HostFrame> made = s->stager->frame(s->shapes);
        if (!made) return report(made.status());
        state->frame.emplace(std::move(*made));
        state->tensors = state->frame->size();
        devstage_frame* handle = hand_out(std::move(state));
        if (handle == nullptr) return no_handle("devstage_frame_create", HandleKind::frame);
        *frame = handle;
        return report(Status());
    });
}

devstage_status devstage_frame_host(const devstage_frame* frame, size_t i, void** data, size_t* bytes) {
    return guarded("devstage_frame_host", [&] {
        const FrameState* f = find<FrameState>(frame);
        if (f == nullptr) return bad_handle<FrameState>("devstage_frame_host", frame);
        if (data == nullptr) return null_argument("devstage_frame_host", "data");
        if (bytes == nullptr) return null_argument("devstage_frame_host", "bytes");
        *data = nullptr;
        *bytes = 0;
        if (i >= f->tensors) {
            return report(
                Status(Errc::invalid_argument, devstage::detail::message("devstage_frame_host: tensor ", i,
                                                                         " of a frame of ", f->tensors, " tensors")));
        }
        if (find<StagerState>(handle_from<devstage_stager*>(f->stager)) == nullptr) {
            return report(Status(Errc::invalid_argument,
                                 "devstage_frame_host: the frame's stager was destroyed, and its memory with it"));
        }
        if (Status own = frame_memory("devstage_frame_host", *f); !own) return report(own);
        const auto host = f->frame->host(i);
        *data = host.data();
        *bytes = host.size();
        return report(Status());
    });
}

devstage_status devstage_frame_hosts(const devstage_frame* frame, void** data, size_t* bytes, size_t count) {
    return guarded("devstage_frame_hosts", [&] {
        const FrameState* f = find<FrameState>(frame);
        if (f == nullptr) return bad_handle<FrameState>("devstage_frame_hosts", frame);
        if (count != f->tensors) {
            return report(Status(Errc::invalid_argument,
                                 devstage::detail::message("devstage_frame_hosts: count ", count,
                                                           ", but the frame has ", f->tensors, " tensors")));
        }
        if (data == nullptr) return null_argument("devstage_frame_hosts", "data");
        for (std::size_t i = 0; i < count; ++i) data[i] = nullptr;
        if (bytes != nullptr) {
            for (std::size_t i = 0; i < count; ++i) bytes[i] = 0;
        }
        if (find<StagerState>(handle_from<devstage_stager*>(f->stager)) == nullptr) {
            return report(Status(Errc::invalid_argument,
                                 "devstage_frame_hosts: the frame's stager was destroyed, and its memory with it"));
        }
        if (Status own = frame_memory("devstage_frame_hosts", *f); !own) return report(own);
        for (std::size_t i = 0; i < count; ++i) {
            const auto host = f->frame->host(i);
            data[i] = host.data();
            if (bytes != nullptr) bytes[i] = host.size();
        }
        return report(Status());
    });
}

devstage_status devstage_frame_slot(const devstage_frame* frame, size_t* slot) {
    return guarded("devstage_frame_slot", [&] {
        const FrameState* f = find<FrameState>(frame);
        if (f == nullptr) return bad_handle<FrameState>("devstage_frame_slot", frame);
        if (slot == nullptr) return null_argument("devstage_frame_slot", "slot");
        *slot = f->frame->slot();
        return report(Status());
    });
}

devstage_status devstage_frame_destroy(devstage_frame* frame) {
    return guarded("devstage_frame_destroy", [&] {
        if (frame == nullptr) return report(Status());
        FrameState* f = find<FrameState>(frame);
        if (f == nullptr) return bad_handle<FrameState>("devstage_frame_destroy", frame);
        take_back(frame, f);
        return report(Status());
    });
}

devstage_status devstage_stager_stats_get(const devstage_stager* stager, devstage_stager_stats* stats) {
    return on_stager("devstage_stager_stats_get", stager, [&](const StagerState& state) {
        if (stats == nullptr) return null_argument("devstage_stager_stats_get", "stats");
        const devstage::StagerStats& s = state.stager->stats();
        *stats = devstage_stager_stats{s.runs,
                                       s.regrows,
                                       s.grow_failures,
                                       s.grows_allocate_first,
                                       s.grows_free_first,
                                       s.grows_exact_fallback,
                                       s.alignment_retries,
                                       s.mirror_alignment_retries,
                                       s.address_changes,
                                       s.device_mallocs,
                                       s.device_frees,
                                       s.free_failures,
                                       s.deferred_frees,
                                       s.retained_bytes,
                                       s.mirror_bytes,
                                       s.high_water_bytes,
                                       s.bytes_to_device,
                                       s.bytes_from_device,
                                       s.uploads,
                                       s.copy_backs,
                                       s.async_uploads,
                                       s.async_copy_backs,
                                       s.packed_args,
                                       s.mirror_copy_bytes,
                                       s.host_waits,
                                       s.hazard_stream_waits,
                                       s.hazard_settles,
                                       s.uploads_skipped,
                                       s.copy_backs_skipped,
                                       s.zeroing_calls,
                                       s.zeroed_bytes,
                                       s.zero_uploads,
                                       s.batched_uploads,
                                       s.batched_copy_backs,
                                       s.batched_copies,
                                       s.ring_uploads,
                                       s.ring_copy_backs,
                                       s.ring_chunks,
                                       s.ring_waits,
                                       s.ring_bytes,
                                       s.mapped_runs,
                                       s.host_maps,
                                       s.map_failures,
                                       s.mapped_bytes,
                                       s.host_zeroed_bytes};
        return report(Status());
    });
}

}  // extern "C"
