// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: what each C handle stands for (a state object, an entry of the handle
// table), how an entry point finds it — checked: NULL, destroyed, used up, of another kind — and
// how every entry point reports: a devstage_status returned, its message kept per thread for
// devstage_last_message(), and no exception let through.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
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
#include "handle_table.hpp"

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
static_assert(sizeof(void*) == sizeof(std::uint64_t), "devstage_c's handles are 64-bit values");

/// Keeps `status`'s message as this thread's last message (cleared when ok); its code.
devstage_status report(const Status& status) noexcept;
/// report() of an error made of `code` and `message`.
devstage_status fail(Errc code, std::string message) noexcept;
/// invalid_argument: "<function>: <what> is NULL".
devstage_status null_argument(const char* function, const char* what) noexcept;

/// Runs an entry point's body, which returns a devstage_status (through report or fail). A
/// std::bad_alloc of the library's own bookkeeping becomes DEVSTAGE_OUT_OF_MEMORY, a
/// std::length_error (a size no container holds) DEVSTAGE_INVALID_ARGUMENT; nothing else is
/// thrown by what the bodies call (devstage itself never throws, and the bodies check the counts
/// they are given before sizing anything by them).
template <class Body>
devstage_status guarded(const char* function, Body&& body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return fail(Errc::out_of_memory, std::string(function) + ": host memory exhausted");
    } catch (const std::length_error&) {  // a size no container can hold: the caller's, checked before
        return fail(Errc::invalid_argument, std::string(function) + ": a size or count too large to hold");
    } catch (...) {
        return fail(Errc::backend_failure, std::string(function) + ": unexpected exception");
    }
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

// ---- the state behind each kind of handle -----------------------------------------------------

struct BackendState {
    BackendPtr backend;
    std::atomic<std::size_t> streams{0};  // live stream and event handles made through this one:
    std::atomic<std::size_t> events{0};   // they need it to be destroyed, so it outlives them
};

struct StagerState {
    std::uint64_t self = 0;  // its own handle: what its runs, frames and completions name
    BackendPtr backend;      // outlives the stager
    Sink sink;
    std::unique_ptr<AnyStager> stager;
    std::vector<TensorArg> args;      // the last bind's, converted; reused
    std::vector<TensorShape> shapes;  // the last frame's, converted; reused
};

struct RunState {
    std::uint64_t stager;  // the handle of the stager that bound it
    StagedRun run;
};

struct CompletionState {
    std::uint64_t stager;
    Completion completion;
    bool waited = false;  // a wait returned its final result (it is no longer pending)
};

struct FrameState {
    std::uint64_t stager;
    std::optional<HostFrame> frame;  // set once made
    std::size_t tensors = 0;         // its shapes' count (an inert HostFrame has none)
};

struct PoolState {
    BackendPtr backend;  // outlives the pool
    Sink sink;
    // The other backends whose streams the pool recorded uses on (a device each): kept alive
    // while the pool may still query their events.
    std::mutex peers_mutex;
    std::vector<BackendPtr> peers;
    std::unique_ptr<PinnedPool> pool;
};

struct StreamState {
    BackendState* owner;  // the backend handle it was made through (live while the stream is)
    AnyBackend::Stream native;
    bool owned;  // made by devstage_stream_create: destroyed with the handle
};

struct EventState {
    BackendState* owner;
    AnyBackend::Event native;
};

/// The C handle type and the kind of each state.
template <class State>
struct HandleOf;
template <>
struct HandleOf<BackendState> {
    using type = devstage_backend*;
    static constexpr HandleKind kind = HandleKind::backend;
};
template <>
struct HandleOf<StagerState> {
    using type = devstage_stager*;
    static constexpr HandleKind kind = HandleKind::stager;
};
template <>
struct HandleOf<RunState> {
    using type = devstage_run*;
    static constexpr HandleKind kind = HandleKind::run;
};
template <>
struct HandleOf<CompletionState> {
    using type = devstage_completion*;
    static constexpr HandleKind kind = HandleKind::completion;
};
template <>
struct HandleOf<FrameState> {
    using type = devstage_frame*;
    static constexpr HandleKind kind = HandleKind::frame;
};
template <>
struct HandleOf<PoolState> {
    using type = devstage_pinned_pool*;
    static constexpr HandleKind kind = HandleKind::pool;
};
template <>
struct HandleOf<StreamState> {
    using type = devstage_stream;
    static constexpr HandleKind kind = HandleKind::stream;
};
template <>
struct HandleOf<EventState> {
    using type = devstage_event;
    static constexpr HandleKind kind = HandleKind::event;
};

/// A handle's value, and back.
inline std::uint64_t value_of(const void* handle) noexcept {
    return reinterpret_cast<std::uintptr_t>(handle);
}
template <class Handle>
Handle handle_from(std::uint64_t value) noexcept {
    return reinterpret_cast<Handle>(static_cast<std::uintptr_t>(value));  // NOLINT(performance-no-int-to-ptr)
}

/// The state of `handle` when it is a live handle of State's kind, else null.
template <class State>
State* find(const void* handle) noexcept {
    return static_cast<State*>(handles.find(value_of(handle), HandleOf<State>::kind));
}

/// The failure of a `handle` find() refused: "<function>: <role> is NULL", or why it is not a
/// live handle of State's kind (invalid_argument either way).
template <class State>
devstage_status bad_handle(const char* function, const void* handle, const char* role = nullptr) noexcept {
    const HandleKind kind = HandleOf<State>::kind;
    if (handle == nullptr) return null_argument(function, role != nullptr ? role : kind_name(kind));
    try {
        return fail(Errc::invalid_argument, handles.why_not(function, value_of(handle), kind));
    } catch (...) {
        return fail(Errc::invalid_argument, std::string());
    }
}

/// Hands `state` out as a new handle (its owner now); null when the table has no room, and
/// then `state` is destroyed.
template <class State>
typename HandleOf<State>::type hand_out(std::unique_ptr<State> state) noexcept {
    const std::uint64_t value = handles.insert(HandleOf<State>::kind, state.get());
    if (value == 0) return nullptr;
    (void)state.release();
    return handle_from<typename HandleOf<State>::type>(value);
}

/// out_of_memory: no handle could be made.
devstage_status no_handle(const char* function, HandleKind kind) noexcept;

/// Takes `handle` (live) back and destroys its state.
template <class State>
void take_back(const void* handle, State* state) noexcept {
    handles.erase(value_of(handle));
    delete state;
}

/// "backend 'sim' #2": a backend in a message.
std::string backend_label(const AnyBackend& backend);

/// invalid_argument when `stream` (or event) was made through another backend than `backend`:
/// "<function>: a stream of backend 'sim' #2 given to <whose> backend 'sim' #1". Ok otherwise.
devstage_status foreign(const char* function, const char* what, const AnyBackend& its, const AnyBackend& backend,
                        const char* whose) noexcept;

/// The stream `handle` names, checked: live, and of `backend` (whose: "a stager of", "").
/// Null after reporting why not.
StreamState* checked_stream(const char* function, devstage_stream handle, const AnyBackend& backend, const char* whose,
                            devstage_status& failed) noexcept;

/// Makes the state of a stager or pool over `backend` and hands it out: `*out` is NULL until
/// `build(state)` returned ok; on failure nothing is left.
template <class State, class Build>
devstage_status created(const char* function, devstage_backend* backend, typename HandleOf<State>::type* out,
                        Build&& build) {
    if (out == nullptr) return null_argument(function, "out");
    *out = nullptr;
    BackendState* b = find<BackendState>(backend);
    if (b == nullptr) return bad_handle<BackendState>(function, backend);
    auto state = std::make_unique<State>();
    state->backend = b->backend;
    if (Status built = build(*state); !built) return report(built);
    State* made = state.get();
    typename HandleOf<State>::type handle = hand_out(std::move(state));
    if (handle == nullptr) return no_handle(function, HandleOf<State>::kind);
    if constexpr (std::is_same_v<State, StagerState>) made->self = value_of(handle);
    *out = handle;
    return report(Status());
}

/// Destroys a stager or pool handle: the object it holds first, then the handle; returns the
/// first report the object made while it was destroyed (given to the sink as well).
template <class State, class Handle, class Object>
devstage_status destroyed(const char* function, Handle handle, std::unique_ptr<Object> State::*object) noexcept {
    return guarded(function, [&] {
        if (handle == nullptr) return report(Status());
        State* state = find<State>(handle);
        if (state == nullptr) return bad_handle<State>(function, handle);
        handles.erase(value_of(handle));
        state->sink.capturing = true;
        (state->*object).reset();
        Status first = std::move(state->sink.first);
        delete state;
        return report(first);
    });
}

}  // namespace devstage::capi
