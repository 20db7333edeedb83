// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The limits pinned memory must fit in (Linux), checked before anything is pinned: pinned
/// memory cannot be reclaimed, so pinning past the cgroup's memory limit gets the container
/// killed, and pinning through mlock (or for RDMA registration) past RLIMIT_MEMLOCK is refused.
/// The cgroup's limit is the tightest one on the process's cgroup path: cgroup v2 `memory.max`,
/// or cgroup v1 `memory.limit_in_bytes` where the memory controller is a v1 hierarchy.
/// RLIMIT_MEMLOCK does not bind a process with CAP_IPC_LOCK. The roots read are parameters
/// (PinLimits), so tests read a fake tree.
/// `if (Status s = check_pin_request(bytes, pinned_now, PinLimits{}, true); !s) return s;`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <sys/resource.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "devstage/detail/util/message.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// Where the limits are read, and which apply. A pool option (PinnedPoolOptions::limits).
/// `PinLimits{.cgroup_root = fake_root + "/cgroup", .proc_root = fake_root + "/proc"}`
struct PinLimits {
    bool check = true;                           ///< false: no limit is checked
    std::string cgroup_root = "/sys/fs/cgroup";  ///< where the cgroup hierarchies are mounted
    std::string proc_root = "/proc";             ///< <proc_root>/self/cgroup and /self/status are read
    /// The memory is meant for RDMA registration, which counts against RLIMIT_MEMLOCK: that
    /// limit applies whatever the backend pins with.
    bool rdma = false;
};

/// One limit on pinned memory: its bytes and where it was read ("RLIMIT_MEMLOCK", or a
/// cgroup file's path).
struct PinLimit {
    std::uint64_t bytes = 0;
    std::string source;
};

namespace detail {
// "max" and v1's "no limit" (PAGE_COUNTER_MAX pages) both mean none.
inline std::optional<std::uint64_t> parse_limit(std::string_view text) noexcept {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    if (text == "max") return std::nullopt;
    std::uint64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
    if (value >= (std::uint64_t{1} << 62)) return std::nullopt;
    return value;
}

// The value of `key:` in <proc_root>/self/status, in bytes for kB fields; nullopt if absent.
inline std::optional<std::uint64_t> status_field(const std::string& proc_root, std::string_view key,
                                                 bool hexadecimal = false) noexcept {
    std::optional<std::uint64_t> found;
    (void)try_host_allocation([&] {
        std::ifstream in(proc_root + "/self/status");
        std::string line;
        while (std::getline(in, line)) {
            if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
            std::string_view value(line);
            value.remove_prefix(key.size() + 1);
            while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
            std::uint64_t number = 0;
            const auto [end, error] =
                std::from_chars(value.data(), value.data() + value.size(), number, hexadecimal ? 16 : 10);
            if (error != std::errc{}) return;
            const std::string_view unit(end, static_cast<std::size_t>(value.data() + value.size() - end));
            found = unit.find("kB") != std::string_view::npos ? number * 1024 : number;
            return;
        }
    });
    return found;
}

// The cgroup path of the memory controller from /proc/self/cgroup: v1's memory line when there
// is one (then `v1` is set), else v2's "0::" line.
inline std::optional<std::string> memory_cgroup(const std::string& proc_root, bool& v1) {
    std::ifstream in(proc_root + "/self/cgroup");
    std::string line;
    std::optional<std::string> unified;
    while (std::getline(in, line)) {
        const std::size_t first = line.find(':');
        const std::size_t second = first == std::string::npos ? first : line.find(':', first + 1);
        if (second == std::string::npos) continue;
        const std::string controllers = line.substr(first + 1, second - first - 1);
        const std::string path = line.substr(second + 1);
        if (line.compare(0, first, "0") == 0 && controllers.empty()) {
            unified = path;
            continue;
        }
        std::istringstream list(controllers);
        std::string controller;
        while (std::getline(list, controller, ',')) {
            if (controller == "memory") {
                v1 = true;
                return path;
            }
        }
    }
    return unified;
}
}  // namespace detail

/// The tightest cgroup memory limit on the process's cgroup path (the path and each ancestor):
/// v2 `<cgroup_root>/<path>/memory.max`, or v1 `<cgroup_root>/memory/<path>/memory.limit_in_bytes`
/// when /proc/self/cgroup names a v1 memory controller. nullopt: no limit (none set, or no
/// cgroup information).
inline Result<std::optional<PinLimit>> cgroup_memory_limit(const PinLimits& limits = {}) noexcept {
    std::optional<PinLimit> tightest;
    const bool read = detail::try_host_allocation([&] {
        bool v1 = false;
        const std::optional<std::string> path = detail::memory_cgroup(limits.proc_root, v1);
        if (!path) return;
        const std::string base = v1 ? limits.cgroup_root + "/memory" : limits.cgroup_root;
        const char* file = v1 ? "/memory.limit_in_bytes" : "/memory.max";
        std::string directory = *path;
        while (!directory.empty() && directory.back() == '/') directory.pop_back();
        for (;;) {
            const std::string at = base + directory + file;
            const Result<std::string> text = detail::read_sysfs(at);
            if (text) {
                const std::optional<std::uint64_t> value = detail::parse_limit(*text);
                if (value && (!tightest || *value < tightest->bytes)) tightest = PinLimit{*value, at};
            }
            if (directory.empty()) break;
            const std::size_t slash = directory.rfind('/');
            directory.erase(slash == std::string::npos ? 0 : slash);
        }
    });
    if (!read) return Status(Errc::out_of_memory, "pin limits: host memory exhausted reading the cgroup's limit");
    return tightest;
}

/// RLIMIT_MEMLOCK (its soft limit) where it binds: nullopt when it is unlimited, or when the
/// process has CAP_IPC_LOCK (read from <proc_root>/self/status), which lifts it.
inline std::optional<PinLimit> memlock_limit(const PinLimits& limits = {}) noexcept {
    rlimit limit{};
    if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
    constexpr unsigned cap_ipc_lock = 14;
    if (const std::optional<std::uint64_t> caps = detail::status_field(limits.proc_root, "CapEff", true);
        caps && ((*caps >> cap_ipc_lock) & 1U) != 0) {
        return std::nullopt;
    }
    PinLimit out;
    out.bytes = limit.rlim_cur;
    (void)detail::try_host_allocation([&] { out.source = "RLIMIT_MEMLOCK"; });
    return out;
}

/// The process's locked and pinned memory as the kernel counts it (VmLck + VmPin of
/// <proc_root>/self/status); 0 where it does not say.
inline std::uint64_t process_pinned_bytes(const PinLimits& limits = {}) noexcept {
    return detail::status_field(limits.proc_root, "VmLck").value_or(0) +
           detail::status_field(limits.proc_root, "VmPin").value_or(0);
}

/// Ok when pinning `bytes` more fits every limit that applies: the cgroup's memory limit
/// always, RLIMIT_MEMLOCK when `memlock` (the backend pins with mlock) or `limits.rdma`.
/// `pinned` is what the caller has pinned already; the process's own count (VmLck + VmPin) is
/// used when larger. Out of memory otherwise: one message naming the limit and where it was
/// read, the bytes asked for and what is pinned already.
inline Status check_pin_request(std::size_t bytes, std::uint64_t pinned, const PinLimits& limits,
                                bool memlock) noexcept {
    if (!limits.check) return {};
    const std::uint64_t process = process_pinned_bytes(limits);
    const std::uint64_t already = pinned > process ? pinned : process;
    const auto refuse = [&](const PinLimit& limit, const char* what) {
        return Status(Errc::out_of_memory,
                      detail::message_or_empty("pinned pool: pinning ", bytes, " bytes would pass ", what, " of ",
                                               limit.bytes, " bytes (", limit.source, "): ", already,
                                               " bytes are pinned already (", pinned, " by this pool, ", process,
                                               " locked or pinned by the process); nothing was pinned"));
    };
    Result<std::optional<PinLimit>> cgroup = cgroup_memory_limit(limits);
    if (!cgroup) return cgroup.status();
    if (*cgroup && (bytes > (*cgroup)->bytes || already > (*cgroup)->bytes - bytes)) {
        return refuse(**cgroup, "the cgroup's memory limit");
    }
    if (memlock || limits.rdma) {
        if (const std::optional<PinLimit> lock = memlock_limit(limits);
            lock && (bytes > lock->bytes || already > lock->bytes - bytes)) {
            return refuse(*lock, limits.rdma ? "RLIMIT_MEMLOCK (memory for RDMA registration)" : "RLIMIT_MEMLOCK");
        }
    }
    return {};
}

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
