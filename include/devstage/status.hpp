// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Error reporting for devstage: Errc, Status and Result<T>. Nothing in devstage throws;
/// every fallible call returns one of these.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

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
///
/// An ok Status holds nothing but its code, so making, moving and dropping one on a hot path
/// costs a few instructions; an error keeps its message on the heap.
class [[nodiscard]] Status {
public:
    Status() noexcept = default;
    /// An error. Contract: `code != Errc::ok` (an ok code makes an ok Status, message dropped).
    Status(Errc code, std::string message) noexcept : code_(code) {
        if (code == Errc::ok) return;
#if defined(__cpp_exceptions)
        try {
            message_.reset(new std::string(std::move(message)));
        } catch (...) {  // no host memory for the message: the code still tells
        }
#else
        message_.reset(new std::string(std::move(message)));
#endif
    }
    /// An error with a literal message (no std::string is made by the caller).
    Status(Errc code, const char* message) noexcept : code_(code) {
        if (code == Errc::ok || message == nullptr) return;
#if defined(__cpp_exceptions)
        try {
            message_.reset(new std::string(message));
        } catch (...) {  // no host memory for the message: the code still tells
        }
#else
        message_.reset(new std::string(message));
#endif
    }
    Status(const Status& other) noexcept : code_(other.code_) {
        if (other.message_ == nullptr) return;
#if defined(__cpp_exceptions)
        try {
            message_.reset(new std::string(*other.message_));
        } catch (...) {
        }
#else
        message_.reset(new std::string(*other.message_));
#endif
    }
    Status(Status&& other) noexcept = default;
    Status& operator=(const Status& other) noexcept {
        if (this != &other) *this = Status(other);
        return *this;
    }
    Status& operator=(Status&& other) noexcept = default;
    ~Status() = default;

    bool ok() const noexcept {
        return code_ == Errc::ok;
    }
    Errc code() const noexcept {
        return code_;
    }
    /// Empty when ok (or when no host memory was left to keep an error's message).
    const std::string& message() const noexcept {
        return message_ != nullptr ? *message_ : empty();
    }
    explicit operator bool() const noexcept {
        return ok();
    }

private:
    static const std::string& empty() noexcept {
        static const std::string none;
        return none;
    }

    Errc code_ = Errc::ok;
    std::unique_ptr<std::string> message_;
};

/// A T, or the non-ok Status that explains why there is none.
/// `Result<void*> r = backend.device_malloc(n); if (!r) return r.status();`
template <class T>
class [[nodiscard]] Result {
    static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "Result<Status> is meaningless");

public:
    Result(T value) noexcept(std::is_nothrow_move_constructible_v<T>)  // NOLINT(google-explicit-constructor)
        : value_(std::move(value)) {}
    /// Contract: `status` is not ok; an ok Status becomes backend_failure so that a Result
    /// never claims a value it does not hold.
    Result(Status status) noexcept  // NOLINT(google-explicit-constructor)
        : status_(status.ok() ? Status(Errc::backend_failure, "Result built from an ok Status without a value")
                              : std::move(status)) {}

    bool ok() const noexcept { return value_.has_value(); }
    explicit operator bool() const noexcept { return ok(); }

    /// Precondition: ok().
    T& value() & noexcept { return *value_; }
    const T& value() const& noexcept { return *value_; }
    T&& value() && noexcept { return std::move(*value_); }
    T& operator*() & noexcept { return value(); }
    const T& operator*() const& noexcept { return value(); }
    T&& operator*() && noexcept { return std::move(*this).value(); }
    T* operator->() noexcept { return &*value_; }
    const T* operator->() const noexcept { return &*value_; }

    /// The error, or an ok Status when a value is held.
    Status status() const noexcept { return status_; }

private:
    std::optional<T> value_;
    Status status_;  // ok exactly when value_ holds a value
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

#endif  // DEVSTAGE_CXX20
