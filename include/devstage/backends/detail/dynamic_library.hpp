// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: a dlopen'd shared library, closed when the last owner goes.

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class DynamicLibrary {
public:
    /// Opens the first of `candidates` that loads; the error names every one tried.
    static Result<DynamicLibrary> open(const std::vector<std::string>& candidates) noexcept {
        std::string tried;
        for (const std::string& path : candidates) {
            if (void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
                DynamicLibrary library;
                library.handle_ = std::shared_ptr<void>(handle, [](void* h) { ::dlclose(h); });
                library.path_ = path;
                return library;
            }
            const char* why = ::dlerror();  // NOLINT(concurrency-mt-unsafe): glibc keeps it per thread
            tried += message(tried.empty() ? "" : "; ", path, ": ", why != nullptr ? why : "not found");
        }
        return Status(Errc::library_not_found, message("cannot load ", tried));
    }

    /// Opens `explicit_path` if given, else the path in environment variable `env_var` if set,
    /// else the first of `defaults` that loads.
    static Result<DynamicLibrary> open(std::string explicit_path, const char* env_var,
                                       const std::vector<std::string>& defaults) noexcept {
        if (!explicit_path.empty()) return open(std::vector<std::string>{std::move(explicit_path)});
        // NOLINTNEXTLINE(concurrency-mt-unsafe): read once, at backend creation
        if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') {
            return open(std::vector<std::string>{env});
        }
        return open(defaults);
    }

    /// The address of `symbol`, or library_not_found naming it and the library.
    template <class F>
    Status resolve(const char* symbol, F*& out) const noexcept {
        void* address = ::dlsym(handle_.get(), symbol);
        if (address == nullptr) {
            return Status(Errc::library_not_found, message("symbol ", symbol, " not found in ", path_));
        }
        out = reinterpret_cast<F*>(address);
        return {};
    }

    const std::string& path() const noexcept { return path_; }

private:
    std::shared_ptr<void> handle_;
    std::string path_;
};

}  // namespace devstage::detail
