// SPDX-License-Identifier: Apache-2.0
// The stager entry points of the C interface: stagers, runs, completions, frames and stats.

#include <cstddef>
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

namespace {

AnyStager::Stream native(devstage_stream stream) noexcept {
    return AnyStager::Stream{static_cast<void*>(stream)};
}

Status invalid(const char* function, std::size_t index, const char* field, int value, const char* allowed) {
    return Status(Errc::invalid_argument, devstage::detail::message(function, ": arg ", index, " has ", field, " ",
                                                                    value, ", which is not ", allowed));
}

// The C args as TensorArgs, in the stager's reusable storage.
Result<std::span<const devstage::TensorArg>> converted(const char* function, devstage_stager& stager,
                                                       const devstage_tensor_arg* args, std::size_t count) {
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

// Hands a bound run to the caller as a handle.
devstage_status hand_out(Result<devstage::StagedRun> bound, devstage_run** run) {
    if (!bound) return report(bound.status());
    *run = new devstage_run{std::move(*bound)};
    return report(Status());
}

// Binds `args` (converted) with `bind(stager, span)`.
template <class Bind>
devstage_status bind_args(const char* function, devstage_stager* stager, const devstage_tensor_arg* args,
                          std::size_t count, devstage_run** run, Bind&& bind) {
    return guarded(function, [&] {
        if (run == nullptr) return null_argument(function, "run");
        *run = nullptr;
        if (stager == nullptr) return null_argument(function, "stager");
        if (args == nullptr && count > 0) {
            return report(Status(Errc::invalid_argument,
                                 devstage::detail::message(function, ": args is NULL with count ", count)));
        }
        Result<std::span<const devstage::TensorArg>> converted_args = converted(function, *stager, args, count);
        if (!converted_args) return report(converted_args.status());
        return hand_out(bind(*stager->stager, *converted_args), run);
    });
}

// Binds a frame with `bind(stager, frame)`.
template <class Bind>
devstage_status bind_frame(const char* function, devstage_stager* stager, const devstage_frame* frame,
                           devstage_run** run, Bind&& bind) {
    return guarded(function, [&] {
        if (run == nullptr) return null_argument(function, "run");
        *run = nullptr;
        if (stager == nullptr) return null_argument(function, "stager");
        if (frame == nullptr) return null_argument(function, "frame");
        return hand_out(bind(*stager->stager, *frame->frame), run);
    });
}

// A finish consumes the run handle, except a run of another stager, which it leaves live.
void consume(devstage_run* run, const Status& finished) noexcept {
    if (finished.code() == Errc::invalid_argument && run->run.live()) return;
    delete run;
}

}  // namespace

extern "C" {

devstage_status devstage_stager_create(devstage_backend* backend, const devstage_stager_config* config,
                                       devstage_stager** out) {
    return created("devstage_stager_create", backend, out, [&](devstage_stager& handle) {
        Result<std::unique_ptr<AnyStager>> made = make_stager(*handle.backend, config);
        if (!made) return made.status();
        if (!(*made)->status()) return (*made)->status();
        handle.stager = std::move(*made);
        handle.stager->set_error_sink(handle.sink.sink());
        return Status();
    });
}

devstage_status devstage_stager_destroy(devstage_stager* stager) {
    return destroyed("devstage_stager_destroy", stager, &devstage_stager::stager);
}

devstage_status devstage_stager_set_error_sink(devstage_stager* stager, devstage_error_sink sink, void* context) {
    return guarded("devstage_stager_set_error_sink", [&] {
        if (stager == nullptr) return null_argument("devstage_stager_set_error_sink", "stager");
        stager->sink.function = sink;  // the stager reports through stager->sink, installed at creation
        stager->sink.context = context;
        return report(Status());
    });
}

devstage_status devstage_stager_release(devstage_stager* stager) {
    return guarded("devstage_stager_release", [&] {
        if (stager == nullptr) return null_argument("devstage_stager_release", "stager");
        return report(stager->stager->release());
    });
}

devstage_status devstage_stager_reserve(devstage_stager* stager, size_t bytes) {
    return guarded("devstage_stager_reserve", [&] {
        if (stager == nullptr) return null_argument("devstage_stager_reserve", "stager");
        return report(stager->stager->reserve(bytes));
    });
}

devstage_status devstage_bind(devstage_stager* stager, const devstage_tensor_arg* args, size_t count,
                              devstage_run** run) {
    return bind_args("devstage_bind", stager, args, count, run,
                     [](AnyStager& s, std::span<const devstage::TensorArg> a) { return s.bind(a); });
}

devstage_status devstage_bind_on(devstage_stager* stager, const devstage_tensor_arg* args, size_t count,
                                 devstage_stream stream, devstage_run** run) {
    return bind_args("devstage_bind_on", stager, args, count, run,
                     [&](AnyStager& s, std::span<const devstage::TensorArg> a) { return s.bind(a, native(stream)); });
}

devstage_status devstage_bind_frame(devstage_stager* stager, const devstage_frame* frame, devstage_run** run) {
    return bind_frame("devstage_bind_frame", stager, frame, run,
                      [](AnyStager& s, const devstage::HostFrame& f) { return s.bind(f); });
}

devstage_status devstage_bind_frame_on(devstage_stager* stager, const devstage_frame* frame, devstage_stream stream,
                                       devstage_run** run) {
    return bind_frame("devstage_bind_frame_on", stager, frame, run,
                      [&](AnyStager& s, const devstage::HostFrame& f) { return s.bind(f, native(stream)); });
}

devstage_status devstage_run_device_args(const devstage_run* run, void** device_args, size_t count) {
    return guarded("devstage_run_device_args", [&] {
        if (run == nullptr) return null_argument("devstage_run_device_args", "run");
        if (!run->run.live()) {
            return report(
                Status(Errc::invalid_argument,
                       "devstage_run_device_args: the run is not live (its stager released or destroyed it)"));
        }
        const auto args = run->run.device_args();
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
        if (run == nullptr) return null_argument("devstage_run_slot", "run");
        if (slot == nullptr) return null_argument("devstage_run_slot", "slot");
        *slot = run->run.slot();
        return report(Status());
    });
}

devstage_status devstage_finish(devstage_stager* stager, devstage_run* run, devstage_status execution) {
    return guarded("devstage_finish", [&] {
        if (stager == nullptr) return null_argument("devstage_finish", "stager");
        if (run == nullptr) return null_argument("devstage_finish", "run");
        const Status finished = stager->stager->finish(std::move(run->run), execution_status(execution));
        consume(run, finished);
        return report(finished);
    });
}

devstage_status devstage_finish_on(devstage_stager* stager, devstage_run* run, devstage_stream stream,
                                   devstage_status execution, devstage_completion** completion) {
    return guarded("devstage_finish_on", [&] {
        if (completion == nullptr) return null_argument("devstage_finish_on", "completion");
        *completion = nullptr;
        if (stager == nullptr) return null_argument("devstage_finish_on", "stager");
        if (run == nullptr) return null_argument("devstage_finish_on", "run");
        // The handle exists before the run ends, so running out of host memory loses no completion.
        auto handle = std::make_unique<devstage_completion>();
        Result<devstage::Completion> done =
            stager->stager->finish(std::move(run->run), native(stream), execution_status(execution));
        consume(run, done.status());
        if (!done) return report(done.status());
        handle->completion = std::move(*done);
        *completion = handle.release();
        return report(Status());
    });
}

devstage_status devstage_run_destroy(devstage_run* run) {
    return guarded("devstage_run_destroy", [&] {
        delete run;  // an unfinished run releases its memory without copying back
        return report(Status());
    });
}

devstage_status devstage_completion_wait(devstage_completion* completion) {
    return guarded("devstage_completion_wait", [&] {
        if (completion == nullptr) return null_argument("devstage_completion_wait", "completion");
        completion->waited = true;
        return report(completion->completion.wait());
    });
}

devstage_status devstage_completion_ready(devstage_completion* completion, int* ready) {
    return guarded("devstage_completion_ready", [&] {
        if (completion == nullptr) return null_argument("devstage_completion_ready", "completion");
        if (ready == nullptr) return null_argument("devstage_completion_ready", "ready");
        Result<bool> answer = completion->completion.ready();
        if (!answer) return report(answer.status());
        *ready = *answer ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_completion_destroy(devstage_completion* completion) {
    return guarded("devstage_completion_destroy", [&] {
        if (completion == nullptr) return report(Status());
        const Status waited = completion->waited ? Status() : completion->completion.wait();
        delete completion;
        return report(waited);
    });
}

devstage_status devstage_frame_create(devstage_stager* stager, const devstage_tensor_shape* shapes, size_t count,
                                      devstage_frame** frame) {
    return guarded("devstage_frame_create", [&] {
        if (frame == nullptr) return null_argument("devstage_frame_create", "frame");
        *frame = nullptr;
        if (stager == nullptr) return null_argument("devstage_frame_create", "stager");
        if (shapes == nullptr && count > 0) return null_argument("devstage_frame_create", "shapes");
        stager->shapes.resize(count);
        for (std::size_t i = 0; i < count; ++i) {
            const devstage_tensor_shape& shape = shapes[i];
            if (shape.direction != DEVSTAGE_IN && shape.direction != DEVSTAGE_OUT &&
                shape.direction != DEVSTAGE_IN_OUT) {
                return report(invalid("devstage_frame_create", i, "direction", shape.direction,
                                      "DEVSTAGE_IN, DEVSTAGE_OUT or DEVSTAGE_IN_OUT"));
            }
            stager->shapes[i] =
                devstage::TensorShape{shape.bytes, static_cast<devstage::Direction>(shape.direction), shape.device};
        }
        // The handle exists before the frame, so running out of host memory strands no slot.
        auto handle = std::make_unique<devstage_frame>();
        Result<devstage::HostFrame> made = stager->stager->frame(stager->shapes);
        if (!made) return report(made.status());
        handle->frame.emplace(*made);
        *frame = handle.release();
        return report(Status());
    });
}

devstage_status devstage_frame_host(const devstage_frame* frame, size_t i, void** data, size_t* bytes) {
    return guarded("devstage_frame_host", [&] {
        if (frame == nullptr) return null_argument("devstage_frame_host", "frame");
        if (data == nullptr) return null_argument("devstage_frame_host", "data");
        if (bytes == nullptr) return null_argument("devstage_frame_host", "bytes");
        *data = nullptr;
        *bytes = 0;
        if (i >= frame->frame->size()) {
            return report(Status(Errc::invalid_argument,
                                 devstage::detail::message("devstage_frame_host: tensor ", i, " of a frame of ",
                                                           frame->frame->size(), " tensors")));
        }
        const auto host = frame->frame->host(i);
        *data = host.data();
        *bytes = host.size();
        return report(Status());
    });
}

devstage_status devstage_frame_destroy(devstage_frame* frame) {
    return guarded("devstage_frame_destroy", [&] {
        delete frame;
        return report(Status());
    });
}

devstage_status devstage_stager_stats_get(const devstage_stager* stager, devstage_stager_stats* stats) {
    return guarded("devstage_stager_stats_get", [&] {
        if (stager == nullptr) return null_argument("devstage_stager_stats_get", "stager");
        if (stats == nullptr) return null_argument("devstage_stager_stats_get", "stats");
        const devstage::StagerStats& s = stager->stager->stats();
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
                                       s.zero_uploads};
        return report(Status());
    });
}

}  // extern "C"
