// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: which device each stream a backend created belongs to, for a runtime that cannot be
// asked (ACL has no call that gives a stream's device). Process-wide, per backend kind; a
// stream the engine created itself is not known, and is not checked.

#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>

#include "devstage/backends/detail/address_map.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class Tag>
class StreamOwners {
public:
    /// Records that `stream` was created for `device`; forgotten (unchecked) when out of memory.
    static void enroll(const void* stream, std::int64_t device) noexcept {
        std::lock_guard lock(mutex());
        (void)without_bad_alloc([&] { owners()[stream] = device; });
    }
    static void withdraw(const void* stream) noexcept {
        std::lock_guard lock(mutex());
        owners().erase(stream);
    }
    /// Ok unless `stream` is known to belong to another device than `device`.
    static Status check(std::string_view backend, const void* stream, std::int64_t device) noexcept {
        std::lock_guard lock(mutex());
        const auto found = owners().find(stream);
        if (found == owners().end() || found->second == device) return {};
        return Status(Errc::invalid_argument,
                      message(backend, " device ", device, ": stream ", stream, " belongs to ", backend, " device ",
                              found->second, " (it was created by that device's backend)"));
    }

private:
    static std::mutex& mutex() noexcept {
        static std::mutex m;
        return m;
    }
    static std::map<const void*, std::int64_t>& owners() noexcept {
        static std::map<const void*, std::int64_t> map;
        return map;
    }
};

}  // namespace devstage::detail
