// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: what the backends that load a vendor runtime at run time share — resolving a table
// of entry points, and turning a call's result code into a Status through the runtime's error
// source. Each backend keeps its own error source (codes, their text, their Errc) and its own
// way of binding a call to its device.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// One entry point of a table: the exported name and the function pointer it fills.
template <class F>
struct EntryPoint {
    const char* name;
    F** target;
};

template <class F>
EntryPoint<F> entry_point(const char* name, F*& target) noexcept {
    return {name, &target};
}

/// Resolves the entry points in order. The first one missing is library_not_found,
/// "<backend>: symbol <name> not found in <path>"; the ones before it stay resolved, so a
/// caller that wants all or nothing resolves into a scratch table and keeps it on success.
template <class... F>
Status resolve_entry_points(const DynamicLibrary& library, std::string_view backend,
                            EntryPoint<F>... entries) noexcept {
    Status missing;
    const bool all = (... && (missing = library.resolve(entries.name, *entries.target)).ok());
    if (all) return {};
    return Status(Errc::library_not_found, message(backend, ": ", missing.message()));
}

/// How a runtime's calls report failure. `E::Code` is what its calls return and `E::success`
/// the code of a call that worked; `E::code_name` introduces a code in messages ("cudaError");
/// `errc(code)` is the Errc a failure maps to and `text(code)` the runtime's own words for it,
/// or null.
template <class E>
concept ErrorSource = requires(const E& errors, typename E::Code code) {
    { E::success } -> std::convertible_to<typename E::Code>;
    { E::code_name } -> std::convertible_to<std::string_view>;
    { errors.errc(code) }
    noexcept->std::same_as<Errc>;
    { errors.text(code) }
    noexcept->std::same_as<const char*>;
};

/// Who made a call, for its failure message: the backend's name and the device it is bound to.
struct CallSite {
    std::string_view backend;
    std::int64_t device;
};

/// The Status of a failed call: "<backend> <call> failed[ for N bytes] on device D:
/// <code_name> C[ (text)]", with the Errc the error source maps the code to.
template <ErrorSource E>
Status call_failure(const E& errors, const CallSite& site, std::string_view call, typename E::Code code,
                    std::size_t bytes) noexcept {
    const char* text = errors.text(code);
    const bool has_text = text != nullptr && *text != '\0';
    return Status(errors.errc(code), message(site.backend, " ", call, " failed",
                                             bytes > 0 ? message(" for ", bytes, " bytes") : std::string(),
                                             " on device ", site.device, ": ", E::code_name, " ", code,
                                             has_text ? " (" : "", has_text ? text : "", has_text ? ")" : ""));
}

/// Calls `function(args...)`: ok when it returns `E::success`, else its call_failure. The
/// caller binds its device first.
template <ErrorSource E, class F, class... Args>
Status checked_call(const E& errors, const CallSite& site, std::string_view call, std::size_t bytes, F* function,
                    Args... args) noexcept {
    const typename E::Code code = function(args...);
    if (code == E::success) return {};
    return call_failure(errors, site, call, code, bytes);
}

}  // namespace devstage::detail
