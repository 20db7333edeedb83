// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Error reporting for devstage: Errc, Status and Result<T>. Nothing in devstage throws;
/// every fallible call returns one of these.

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace devstage {

/// The kind of a failure. `ok` is success.
enum class Errc : std::uint8_t {
    ok,
    out_of_memory,      ///< the backend (or a byte cap) could not provide the bytes asked for
    invalid_argument,   ///< the caller passed something the contract forbids
    busy,               ///< the object is in use by a live run
    backend_failure,    ///< the backend reported an error that is not out-of-memory
    unknown_pointer,    ///< a pointer that was never handed out, or was already released
    not_supported,      ///< the backend lacks an optional capability
    library_not_found,  ///< a runtime library or one of its symbols could not be loaded
    leaked,             ///< memory still allocated when its owner went away (reports only)
};

/// Stable lower-case name of an Errc, for messages and logs.
constexpr std::string_view to_string(Errc code) noexcept {
    switch (code) {
        case Errc::ok:
            return "ok";
        case Errc::out_of_memory:
            return "out_of_memory";
        case Errc::invalid_argument:
            return "invalid_argument";
        case Errc::busy:
            return "busy";
        case Errc::backend_failure:
            return "backend_failure";
        case Errc::unknown_pointer:
            return "unknown_pointer";
        case Errc::not_supported:
            return "not_supported";
        case Errc::library_not_found:
            return "library_not_found";
        case Errc::leaked:
            return "leaked";
    }
    return "unknown";
}

/// Outcome of an operation: ok, or an Errc with a message naming the operation, the sizes
/// involved and the backend. `if (Status s = f(); !s) log(s.message());`
class [[nodiscard]] Status {
public:
    Status() noexcept = default;
    /// An error. Contract: `code != Errc::ok` (an ok code makes an ok Status, message dropped).
    Status(Errc code, std::string message) noexcept
        : code_(code), message_(code == Errc::ok ? std::string() : std::move(message)) {}

    bool ok() const noexcept { return code_ == Errc::ok; }
    Errc code() const noexcept { return code_; }
    const std::string& message() const noexcept { return message_; }
    explicit operator bool() const noexcept { return ok(); }

private:
    Errc code_ = Errc::ok;
    std::string message_;
};

/// A T, or the non-ok Status that explains why there is none.
/// `Result<void*> r = backend.device_malloc(n); if (!r) return r.status();`
template <class T>
class [[nodiscard]] Result {
    static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "Result<Status> is meaningless");

public:
    Result(T value) noexcept(std::is_nothrow_move_constructible_v<T>)  // NOLINT(google-explicit-constructor)
        : state_(std::in_place_index<0>, std::move(value)) {}
    /// Contract: `status` is not ok; an ok Status becomes backend_failure so that a Result
    /// never claims a value it does not hold.
    Result(Status status) noexcept  // NOLINT(google-explicit-constructor)
        : state_(std::in_place_index<1>,
                 status.ok() ? Status(Errc::backend_failure, "Result built from an ok Status without a value")
                             : std::move(status)) {}

    bool ok() const noexcept { return state_.index() == 0; }
    explicit operator bool() const noexcept { return ok(); }

    /// Precondition: ok().
    T& value() & noexcept { return *std::get_if<0>(&state_); }
    const T& value() const& noexcept { return *std::get_if<0>(&state_); }
    T&& value() && noexcept { return std::move(*std::get_if<0>(&state_)); }
    T& operator*() & noexcept { return value(); }
    const T& operator*() const& noexcept { return value(); }
    T&& operator*() && noexcept { return std::move(*this).value(); }
    T* operator->() noexcept { return std::get_if<0>(&state_); }
    const T* operator->() const noexcept { return std::get_if<0>(&state_); }

    /// The error, or an ok Status when a value is held.
    Status status() const noexcept {
        if (const Status* s = std::get_if<1>(&state_)) return *s;
        return Status();
    }

private:
    std::variant<T, Status> state_;
};

/// The default error sink: `devstage: <errc>: <message>` on stderr.
inline void stderr_error_sink(const Status& status) noexcept {
    const std::string_view code = to_string(status.code());
    (void)std::fprintf(stderr, "devstage: %.*s: %s\n", static_cast<int>(code.size()), code.data(),
                       status.message().c_str());
}

/// Where cleanup paths that cannot return a Status (destructors, dropped runs) report
/// failures. Replaceable per object; the default writes one line to stderr. Made from a plain
/// function, from a function plus a context pointer, or from a callable object the caller
/// keeps alive:
/// `stager.set_error_sink(devstage::ErrorSink::to(my_logger));` (my_logger(status) is called)
class ErrorSink {
public:
    using Function = void (*)(const Status& status) noexcept;
    using ContextFunction = void (*)(void* context, const Status& status) noexcept;

    /// Reports to stderr.
    ErrorSink() noexcept = default;
    /// Reports to `function`; a null function reports to stderr.
    ErrorSink(Function function) noexcept  // NOLINT(google-explicit-constructor): any plain sink converts
        : plain_(function != nullptr ? function : &stderr_error_sink) {}
    /// Reports to `function(context, status)`; a null function reports to stderr.
    ErrorSink(ContextFunction function, void* context) noexcept
        : with_context_(function), context_(context), plain_(function != nullptr ? nullptr : &stderr_error_sink) {}

    /// Reports to `callable(status)`. `callable` must outlive every object the sink is given to,
    /// and must not throw (a throw from a report terminates, as from any noexcept function).
    template <class F>
    requires std::is_invocable_v<F&, const Status&>
    static ErrorSink to(F& callable) noexcept {
        return ErrorSink([](void* context, const Status& status) noexcept { (*static_cast<F*>(context))(status); },
                         static_cast<void*>(&callable));
    }

    void operator()(const Status& status) const noexcept {
        if (plain_ != nullptr) {
            plain_(status);
        } else {
            with_context_(context_, status);
        }
    }

private:
    ContextFunction with_context_ = nullptr;
    void* context_ = nullptr;
    Function plain_ = &stderr_error_sink;
};

}  // namespace devstage
