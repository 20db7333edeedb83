// SPDX-License-Identifier: Apache-2.0
// Status codes and messages of the C interface: the last message of each thread, the names of
// the codes, and the sinks of stagers and pools.

#include <string>
#include <string_view>
#include <utility>

#include "devstage/c/devstage.h"
#include "devstage/detail/util/message.hpp"
#include "handles.hpp"

namespace devstage::capi {
namespace {

// The message of this thread's last call; `exhausted` when no host memory was left to keep it.
thread_local std::string last_message;
thread_local bool exhausted = false;

}  // namespace

devstage_status report(const Status& status) noexcept {
    exhausted = false;
    if (status.ok()) {
        last_message.clear();
        return DEVSTAGE_OK;
    }
    try {
        last_message = status.message();
    } catch (...) {
        last_message.clear();
        exhausted = true;
    }
    return static_cast<devstage_status>(status.code());
}

devstage_status fail(Errc code, std::string message) noexcept {
    return report(Status(code, std::move(message)));
}

devstage_status null_argument(const char* function, const char* what) noexcept {
    return report(Status(Errc::invalid_argument, detail::message(function, ": ", what, " is NULL")));
}

Status execution_status(devstage_status execution) {
    if (execution == DEVSTAGE_OK) return {};
    const bool known = execution > DEVSTAGE_OK && execution <= DEVSTAGE_LEAKED;
    return Status(known ? static_cast<Errc>(execution) : Errc::backend_failure,
                  detail::message("the run's execution failed (", devstage_status_name(execution), ")"));
}

devstage_status no_handle(const char* function, HandleKind kind) noexcept {
    return report(Status(Errc::out_of_memory, detail::message(function, ": no room for another ", kind_name(kind),
                                                              " handle (host memory or handle table exhausted)")));
}

std::string backend_label(const AnyBackend& backend) {
    return detail::message("backend '", backend.name(), "' #", backend.number());
}

devstage_status foreign(const char* function, const char* what, const AnyBackend& its, const AnyBackend& backend,
                        const char* whose) noexcept {
    try {
        return fail(Errc::invalid_argument, detail::message(function, ": ", what, " of ", backend_label(its),
                                                            " given to ", whose, backend_label(backend)));
    } catch (...) {
        return fail(Errc::invalid_argument, std::string());
    }
}

StreamState* checked_stream(const char* function, devstage_stream handle, const AnyBackend& backend, const char* whose,
                            devstage_status& failed) noexcept {
    StreamState* stream = find<StreamState>(handle);
    if (stream == nullptr) {
        failed = bad_handle<StreamState>(function, handle);
        return nullptr;
    }
    if (stream->owner->backend.get() != &backend) {
        failed = foreign(function, "a stream", *stream->owner->backend, backend, whose);
        return nullptr;
    }
    return stream;
}

void Sink::report(void* self, const Status& status) noexcept {
    auto& sink = *static_cast<Sink*>(self);
    if (sink.capturing && sink.first.ok()) sink.first = status;
    if (sink.function != nullptr) {
        sink.function(sink.context, static_cast<devstage_status>(status.code()), status.message().c_str());
    } else {
        stderr_error_sink(status);
    }
}

}  // namespace devstage::capi

extern "C" {

const char* devstage_last_message(void) {
    using namespace devstage::capi;
    return exhausted ? "host memory exhausted keeping the message" : last_message.c_str();
}

const char* devstage_status_name(devstage_status status) {
    switch (status) {
        case DEVSTAGE_OK:
        case DEVSTAGE_OUT_OF_MEMORY:
        case DEVSTAGE_INVALID_ARGUMENT:
        case DEVSTAGE_BUSY:
        case DEVSTAGE_BACKEND_FAILURE:
        case DEVSTAGE_UNKNOWN_POINTER:
        case DEVSTAGE_NOT_SUPPORTED:
        case DEVSTAGE_LIBRARY_NOT_FOUND:
        case DEVSTAGE_LEAKED:
            // The names are literals: to_string's view is null-terminated.
            return devstage::to_string(static_cast<devstage::Errc>(status)).data();
    }
    return "unknown";
}

}  // extern "C"
