// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// NUMA placement of pinned host memory (Linux): which host node is nearest a device — from
/// the runtime where it says (a backend's host_numa_node()), else from sysfs by the device's PCI
/// address (a backend's pci_bus_id()) — the online nodes, and binding memory to a node with
/// mbind before its first touch, checked with get_mempolicy. Raw system calls: libnuma is not
/// needed. The sysfs root is a parameter, so tests read a fake topology.
/// `Result<int> node = nearest_numa_node(gpu);  // -1: no NUMA placement for it`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "devstage/detail/util/message.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// Optional: the runtime's answer to "which host NUMA node is nearest this device"
/// (`b.host_numa_node()` -> Result<int>, -1 when the system has no NUMA). CudaBackend:
/// cudaDevAttrHostNumaId.
template <class B>
concept NumaNodeQuery = requires(const B& cb) {
    { cb.host_numa_node() }
    noexcept->std::same_as<Result<int>>;
};

/// Optional: the device's PCI address (`b.pci_bus_id()` -> Result<std::string>,
/// "dddd:bb:dd.f"), for sysfs. CudaBackend: cudaDeviceGetPCIBusId.
template <class B>
concept PciAddressQuery = requires(const B& cb) {
    { cb.pci_bus_id() }
    noexcept->std::same_as<Result<std::string>>;
};

/// A pool option (PinnedHostPool's constructor): one arena per NUMA node, each device served
/// from its nearest node (allocate_near). Needs a HostRegisterBackend: a node's blocks are
/// mapped, bound and touched, then pinned in place. `sysfs_root` is where the topology is read.
struct NumaPlacement {
    bool enabled = false;
    std::string sysfs_root = "/sys";
};

/// The most nodes the calls below handle (the bit mask given to mbind and get_mempolicy).
inline constexpr int max_numa_nodes = 1024;

namespace detail {
inline Result<std::string> read_sysfs(const std::string& path) noexcept {
    std::string text;
    bool read = false;
    if (!try_host_allocation([&] {
            std::ifstream in(path);
            if (!in) return;
            std::getline(in, text);
            read = !in.bad();
        })) {
        return Status(Errc::out_of_memory, "numa: host memory exhausted reading sysfs");
    }
    if (!read) return Status(Errc::not_supported, message("numa: cannot read ", path));
    return text;
}

// The whole of `text` (surrounding blanks aside) as a decimal int, or nothing.
inline std::optional<int> parse_int(std::string_view text) noexcept {
    const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    while (!text.empty() && blank(text.front())) text.remove_prefix(1);
    while (!text.empty() && blank(text.back())) text.remove_suffix(1);
    int value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
    return value;
}

// strerror's text for `error`, thread-safe (strerror_r, of either signature).
inline const char* error_text(int rc, const char* buffer) noexcept {
    return rc == 0 ? buffer : "unknown error";
}
inline const char* error_text(const char* text, const char* /*buffer*/) noexcept {
    return text;
}
inline std::string errno_text(int error) {
    char buffer[128] = {};
    return error_text(::strerror_r(error, buffer, sizeof buffer), buffer);
}
}  // namespace detail

/// The online nodes, from `<sysfs_root>/devices/system/node/online` ("0", "0-1,4"). A file
/// that is missing is not_supported (no NUMA information); one that does not parse,
/// invalid_argument, quoting it.
inline Result<std::vector<int>> numa_online_nodes(const std::string& sysfs_root = "/sys") noexcept {
    const std::string path = sysfs_root + "/devices/system/node/online";
    Result<std::string> text = detail::read_sysfs(path);
    if (!text) return text.status();
    std::vector<int> nodes;
    std::istringstream in(*text);
    std::string range;
    const auto bad = [&] {
        return Status(Errc::invalid_argument,
                      detail::message("numa: ", path, ": '", *text, "' is not a list of nodes"));
    };
    while (std::getline(in, range, ',')) {
        const std::size_t dash = range.find('-');
        const std::optional<int> first = detail::parse_int(std::string_view(range).substr(0, dash));
        const std::optional<int> last =
            dash == std::string::npos ? first : detail::parse_int(std::string_view(range).substr(dash + 1));
        if (!first || !last || *first < 0 || *last < *first || *last >= max_numa_nodes) return bad();
        for (int node = *first; node <= *last; ++node) nodes.push_back(node);
    }
    if (nodes.empty()) return bad();
    return nodes;
}

namespace detail {
/// A PCI address as sysfs names it ("dddd:bb:dd.f", lowercase, the domain in at least 4 hex
/// digits): the domain in 4 to 8 hex digits (leading zeros past 4 dropped, as 8-digit domains
/// some tools print), the bus and device in 2, the function one digit 0-7, nothing else — so
/// no path component ("..", "/") ever reaches a sysfs path. nullopt when malformed.
inline std::optional<std::string> sysfs_pci_address(std::string_view address) noexcept {
    const auto hex = [](std::string_view digits) {
        for (const char c : digits) {
            if (std::isxdigit(static_cast<unsigned char>(c)) == 0) return false;
        }
        return true;
    };
    const std::size_t first = address.find(':');
    if (first == std::string_view::npos) return std::nullopt;
    std::string_view domain = address.substr(0, first);
    const std::string_view rest = address.substr(first + 1);
    // rest: "bb:dd.f"
    if (domain.size() < 4 || domain.size() > 8 || !hex(domain) || rest.size() != 7 || rest[2] != ':' ||
        rest[5] != '.' || !hex(rest.substr(0, 2)) || !hex(rest.substr(3, 2)) || rest[6] < '0' || rest[6] > '7') {
        return std::nullopt;
    }
    while (domain.size() > 4 && domain.front() == '0') domain.remove_prefix(1);
    std::string out;
    if (!try_host_allocation([&] { out.append(domain).append(":").append(rest); })) {
        return std::nullopt;
    }
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}
}  // namespace detail

/// The NUMA node of a PCI device, from `<sysfs_root>/bus/pci/devices/<address>/numa_node`; -1
/// when the kernel knows none (one node, or firmware that does not say). `pci_address` is
/// "dddd:bb:dd.f" in either case (sysfs is lowercase; a domain of up to 8 digits is shortened
/// to sysfs's 4 when its leading digits are zeros). An address of any other form — path
/// components included — is invalid_argument, quoting it; a device missing from sysfs is
/// not_supported, naming the path; a malformed file, invalid_argument.
inline Result<int> numa_node_of_pci(std::string_view pci_address, const std::string& sysfs_root = "/sys") noexcept {
    const std::optional<std::string> address = detail::sysfs_pci_address(pci_address);
    if (!address) {
        return Status(Errc::invalid_argument,
                      detail::message("numa: '", pci_address, "' is not a PCI address (dddd:bb:dd.f)"));
    }
    const std::string path = sysfs_root + "/bus/pci/devices/" + *address + "/numa_node";
    Result<std::string> text = detail::read_sysfs(path);
    if (!text) return text.status();
    const std::optional<int> node = detail::parse_int(*text);
    if (!node || *node < -1 || *node >= max_numa_nodes) {
        return Status(Errc::invalid_argument, detail::message("numa: ", path, ": '", *text, "' is not a node number"));
    }
    return *node;
}

/// The host node nearest `device`: its host_numa_node() where that says (>= 0), else sysfs by
/// its pci_bus_id(), else -1 (a backend with neither query has no placement but the one
/// configured explicitly: PinnedHostPool::set_numa_node).
template <class B>
Result<int> nearest_numa_node(const B& device, const std::string& sysfs_root = "/sys") noexcept {
    if constexpr (NumaNodeQuery<B>) {
        Result<int> node = device.host_numa_node();
        if (node && *node >= 0) return node;
    }
    if constexpr (PciAddressQuery<B>) {
        Result<std::string> address = device.pci_bus_id();
        if (!address) return address.status();
        return numa_node_of_pci(*address, sysfs_root);
    }
    return -1;
}

/// Binds the pages of [memory, memory + bytes) (page-aligned) to `node` (MPOL_BIND), before
/// they are first touched: pages faulted in later come from that node only. A node the kernel
/// does not have is invalid_argument, with the errno text.
inline Status numa_bind(void* memory, std::size_t bytes, int node) noexcept {
    if (node < 0 || node >= max_numa_nodes) {
        return Status(Errc::invalid_argument, detail::message("numa: node ", node, " is out of range"));
    }
    unsigned long mask[max_numa_nodes / (8 * sizeof(unsigned long))] = {};
    mask[node / (8 * sizeof(unsigned long))] = 1UL << (node % (8 * sizeof(unsigned long)));
    constexpr int mpol_bind = 2;
    // The kernel reads maxnode - 1 bits.
    if (syscall(SYS_mbind, memory, bytes, mpol_bind, mask, max_numa_nodes + 1, 0U) != 0) {
        const int error = errno;
        return Status(error == EINVAL || error == EFAULT ? Errc::invalid_argument : Errc::backend_failure,
                      detail::message("numa: mbind of ", bytes, " bytes at ", static_cast<const void*>(memory),
                                      " to node ", node, " failed: ", detail::errno_text(error)));
    }
    return {};
}

/// The node the memory policy of the page at `memory` binds it to (get_mempolicy with
/// MPOL_F_ADDR): a node when the policy is MPOL_BIND or MPOL_PREFERRED to one node, -1 for the
/// default policy (or a policy of several nodes).
inline Result<int> numa_policy_node(const void* memory) noexcept {
    int mode = 0;
    unsigned long mask[max_numa_nodes / (8 * sizeof(unsigned long))] = {};
    constexpr unsigned long mpol_f_addr = 1UL << 1;
    if (syscall(SYS_get_mempolicy, &mode, mask, max_numa_nodes, memory, mpol_f_addr) != 0) {
        const int error = errno;
        return Status(Errc::invalid_argument,
                      detail::message("numa: get_mempolicy at ", memory, " failed: ", detail::errno_text(error)));
    }
    int node = -1;
    for (int i = 0; i < max_numa_nodes; ++i) {
        if ((mask[i / (8 * sizeof(unsigned long))] >> (i % (8 * sizeof(unsigned long))) & 1UL) == 0) continue;
        if (node >= 0) return -1;  // several nodes
        node = i;
    }
    constexpr int mpol_preferred = 1, mpol_bind = 2;
    return mode == mpol_bind || mode == mpol_preferred ? node : -1;
}

namespace detail {
/// Anonymous memory for a NUMA-placed pinned block: mapped, bound to `node`, then each page
/// touched (faulted in on that node) before the caller pins it. The length is `bytes` rounded
/// up to pages; numa_unmap() takes the same `bytes`.
inline Result<void*> numa_map(std::size_t bytes, int node) noexcept {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t length = (bytes + page - 1) / page * page;
    void* memory = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        return Status(Errc::out_of_memory, message("numa: mmap of ", length, " bytes failed: ", errno_text(errno)));
    }
    if (Status bound = numa_bind(memory, length, node); !bound) {
        munmap(memory, length);
        return bound;
    }
    for (std::size_t at = 0; at < length; at += page) static_cast<volatile char*>(memory)[at] = 0;
    return memory;
}
inline void numa_unmap(void* memory, std::size_t bytes) noexcept {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    munmap(memory, (bytes + page - 1) / page * page);
}
}  // namespace detail

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
