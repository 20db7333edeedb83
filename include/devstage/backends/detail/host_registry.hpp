// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the ranges of existing host memory a backend pinned in place (HostRegisterBackend's
// host_register), for the simulator and the mock: the checks a runtime makes — a null pointer,
// zero bytes, a range past the end of the address space, a range registered twice or
// overlapping one that is — each a clear error, and the look-ups that make registered memory
// count as pinned. Not thread-safe: the backend calls it under its own lock.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "devstage/backends/detail/address_map.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class HostRegistry {
public:
    /// One registered range: its bytes, and whether the backend page-locked it.
    struct Range {
        std::size_t bytes;
        bool locked;
    };

    /// Ok when [host, host + bytes) may be registered: not null, not empty, inside the address
    /// space, overlapping no registered range. `what` names the call ("sim host_register").
    Status check(std::string_view what, const void* host, std::size_t bytes) const noexcept {
        if (host == nullptr || bytes == 0) {
            return Status(Errc::invalid_argument, message(what, ": ", bytes, " bytes at ", host,
                                                          host == nullptr ? ": a null pointer" : ": nothing to pin"));
        }
        if (bytes - 1 > std::numeric_limits<std::uintptr_t>::max() - key(host)) {
            return Status(Errc::invalid_argument,
                          message(what, ": ", bytes, " bytes at ", host, " run past the end of the address space"));
        }
        const auto next = ranges_.lower_bound(host);
        if (next != ranges_.end() && next->first == host) {
            return Status(Errc::invalid_argument, message(what, ": ", host, " is registered already (",
                                                          next->second.bytes, " bytes); unregister it first"));
        }
        if (next != ranges_.end() && key(next->first) - key(host) < bytes) return overlap(what, host, bytes, *next);
        if (next != ranges_.begin()) {
            const auto before = std::prev(next);
            if (key(host) - key(before->first) < before->second.bytes) return overlap(what, host, bytes, *before);
        }
        return {};
    }

    /// Records a range check() accepted; false when no host memory is left to remember it.
    bool insert(const void* host, std::size_t bytes, bool locked) noexcept {
        return without_bad_alloc([&] { ranges_.emplace(host, Range{bytes, locked}); });
    }

    /// The range registered at exactly `host`, forgotten; unknown_pointer naming what `host` is
    /// when there is none. `what` names the call ("sim host_unregister").
    Result<Range> erase(std::string_view what, const void* host) noexcept {
        const auto found = ranges_.find(host);
        if (found == ranges_.end()) {
            const Range* inside = containing(host, 1);
            return Status(Errc::unknown_pointer,
                          message(what, ": ", host,
                                  inside != nullptr ? " lies inside a registered range but does not start one"
                                                    : " was never registered, or was unregistered already"));
        }
        const Range range = found->second;
        ranges_.erase(found);
        return range;
    }

    /// The registered range holding all of [pointer, pointer + bytes), or null.
    const Range* containing(const void* pointer, std::size_t bytes) const noexcept {
        auto next = ranges_.upper_bound(pointer);
        if (next == ranges_.begin()) return nullptr;
        const auto candidate = std::prev(next);
        const std::uintptr_t offset = key(pointer) - key(candidate->first);
        if (offset >= candidate->second.bytes || bytes > candidate->second.bytes - offset) return nullptr;
        return &candidate->second;
    }
    bool contains(const void* pointer, std::size_t bytes) const noexcept {
        return containing(pointer, bytes) != nullptr;
    }

    /// [first, last) rounded out to `page`, less the pages a registered range other than the one
    /// at `host` still uses: what can be unlocked when that range goes.
    std::optional<std::pair<std::uintptr_t, std::uintptr_t>> own_pages(const void* host, std::size_t bytes,
                                                                       std::uintptr_t page) const noexcept {
        std::uintptr_t first = key(host) / page * page;
        std::uintptr_t last = (key(host) + (bytes - 1)) / page * page + page;
        for (const auto& [base, range] : ranges_) {
            if (base == host) continue;
            const std::uintptr_t begin = key(base), end = key(base) + (range.bytes - 1);
            if (end / page * page == first) first += page;
            if (begin / page * page == last - page) last -= page;
        }
        if (first >= last) return std::nullopt;
        return std::pair{first, last};
    }

    /// A line per range never unregistered: "<backend>: leaked host registration of N bytes".
    void report_leaks(std::string& report, std::string_view backend) const {
        for (const auto& [base, range] : ranges_) {
            report += message(backend, ": leaked host registration of ", range.bytes, " bytes at ", base, "\n");
        }
    }

    std::size_t size() const noexcept { return ranges_.size(); }
    template <class F>
    void for_each(F&& f) const {
        for (const auto& [base, range] : ranges_) f(const_cast<void*>(base), range);
    }

private:
    static std::uintptr_t key(const void* pointer) noexcept { return reinterpret_cast<std::uintptr_t>(pointer); }

    static Status overlap(std::string_view what, const void* host, std::size_t bytes,
                          const std::pair<const void* const, Range>& other) {
        return Status(Errc::invalid_argument,
                      message(what, ": ", bytes, " bytes at ", host, " overlap the registered range of ",
                              other.second.bytes, " bytes at ", other.first));
    }

    std::map<const void*, Range, std::less<>> ranges_;
};

}  // namespace devstage::detail
