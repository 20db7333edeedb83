// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: what the opaque C handles hold, and how every entry point reports —
// a devstage_status returned, its message kept per thread for devstage_last_message(), and no
// exception let through.

#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "any_backend.hpp"
#include "any_stager.hpp"
#include "devstage/c/devstage.h"
#include "devstage/completion.hpp"
#include "devstage/frame.hpp"
#include "devstage/pinned.hpp"
#include "devstage/run.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::capi {

static_assert(static_cast<int>(Errc::ok) == DEVSTAGE_OK &&
              static_cast<int>(Errc::out_of_memory) == DEVSTAGE_OUT_OF_MEMORY &&
              static_cast<int>(Errc::invalid_argument) == DEVSTAGE_INVALID_ARGUMENT &&
              static_cast<int>(Errc::busy) == DEVSTAGE_BUSY &&
              static_cast<int>(Errc::backend_failure) == DEVSTAGE_BACKEND_FAILURE &&
              static_cast<int>(Errc::unknown_pointer) == DEVSTAGE_UNKNOWN_POINTER &&
              static_cast<int>(Errc::not_supported) == DEVSTAGE_NOT_SUPPORTED &&
              static_cast<int>(Errc::library_not_found) == DEVSTAGE_LIBRARY_NOT_FOUND &&
              static_cast<int>(Errc::leaked) == DEVSTAGE_LEAKED);

/// Keeps `status`'s message as this thread's last message (cleared when ok); its code.
devstage_status report(const Status& status) noexcept;
/// report() of an error made of `code` and `message`.
devstage_status fail(Errc code, std::string message) noexcept;
/// invalid_argument: "<function>: <what> is NULL".
devstage_status null_argument(const char* function, const char* what) noexcept;

/// Runs an entry point's body, which returns a devstage_status (through report or fail). A
/// std::bad_alloc of the library's own bookkeeping becomes DEVSTAGE_OUT_OF_MEMORY; nothing else
/// is thrown by what the bodies call (devstage itself never throws).
template <class Body>
devstage_status guarded(const char* function, Body&& body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return fail(Errc::out_of_memory, std::string(function) + ": host memory exhausted");
    } catch (...) {
        return fail(Errc::backend_failure, std::string(function) + ": unexpected exception");
    }
}

/// Makes the handle of an object built on `backend`: `*out` is NULL until `build(handle)`, given
/// the new handle (its backend set), returned ok; on failure nothing is left.
template <class Handle, class Build>
devstage_status created(const char* function, devstage_backend* backend, Handle** out, Build&& build);

/// Destroys a stager or pool handle: the object it holds first, then the handle; returns the
/// first report the object made while it was destroyed (given to the sink as well).
template <class Handle, class Object>
devstage_status destroyed(const char* function, Handle* handle, std::unique_ptr<Object> Handle::*object) noexcept {
    return guarded(function, [&] {
        if (handle == nullptr) return report(Status());
        handle->sink.capturing = true;
        (handle->*object).reset();
        Status first = std::move(handle->sink.first);
        delete handle;
        return report(first);
    });
}

/// A devstage_status as a Status: the caller's account of a kernel's execution.
Status execution_status(devstage_status execution);

/// Where a stager or pool reports: the caller's sink (stderr without one); while `capturing`,
/// the first report is also kept, for the destroy function to return.
struct Sink {
    devstage_error_sink function = nullptr;
    void* context = nullptr;
    bool capturing = false;
    Status first;

    static void report(void* self, const Status& status) noexcept;
    ErrorSink sink() noexcept { return ErrorSink(&Sink::report, this); }
};

using PinnedPool = PinnedHostPool<AnyBackend, CachingPinned>;

}  // namespace devstage::capi

struct devstage_backend {
    devstage::capi::BackendPtr backend;
};

struct devstage_stager {
    devstage::capi::BackendPtr backend;  // outlives the stager
    devstage::capi::Sink sink;
    std::unique_ptr<devstage::capi::AnyStager> stager;
    std::vector<devstage::TensorArg> args;      // the last bind's, converted; reused
    std::vector<devstage::TensorShape> shapes;  // the last frame's, converted; reused
};

struct devstage_run {
    devstage::StagedRun run;
};

struct devstage_completion {
    devstage::Completion completion;
    bool waited = false;
};

struct devstage_frame {
    std::optional<devstage::HostFrame> frame;  // set once made
};

struct devstage_pinned_pool {
    devstage::capi::BackendPtr backend;  // outlives the pool
    devstage::capi::Sink sink;
    std::unique_ptr<devstage::capi::PinnedPool> pool;
};

namespace devstage::capi {

template <class Handle, class Build>
devstage_status created(const char* function, devstage_backend* backend, Handle** out, Build&& build) {
    return guarded(function, [&] {
        if (out == nullptr) return null_argument(function, "out");
        *out = nullptr;
        if (backend == nullptr) return null_argument(function, "backend");
        auto handle = std::make_unique<Handle>();
        handle->backend = backend->backend;
        if (Status built = build(*handle); !built) return report(built);
        *out = handle.release();
        return report(Status());
    });
}

}  // namespace devstage::capi
