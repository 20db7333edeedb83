// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedNumaArenas, NUMA placement in a pinned pool's core — the node each device is
/// served from (configured, or found with nearest_numa_node and kept), the nodes the kernel
/// refused to bind to, and the memory of a node's block: mapped, bound with mbind and touched
/// (the block source then pins it in place). A node's blocks form its arena: the cache hands a
/// block only to an allocation for the same node. Thread-safe (its own mutex, a leaf lock).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class PinnedNumaArenas {
public:
    PinnedNumaArenas(NumaPlacement numa, const PinnedSink& sink) : numa_(std::move(numa)), sink_(&sink) {}
    PinnedNumaArenas(const PinnedNumaArenas&) = delete;
    PinnedNumaArenas& operator=(const PinnedNumaArenas&) = delete;

    bool enabled() const noexcept { return numa_.enabled; }

    /// The node `device`'s allocations come from: -1 (the backend's pinned_malloc memory)
    /// without NUMA placement, for a device with no known node, or when its node refused.
    int node_for(const B& device) noexcept {
        if (!numa_.enabled) return -1;
        {
            std::lock_guard lock(mutex_);
            if (const int* known = find(device)) return refused(*known) ? -1 : *known;
        }
        Result<int> found = nearest_numa_node(device, numa_.sysfs_root);
        if (!found) {
            sink_->report(Status(found.status().code(),
                                 message_or_empty("pinned pool: the NUMA node of a device of backend '", device.name(),
                                                  "' is unknown: ", found.status().message(),
                                                  "; it is served from the backend's pinned memory (set_numa_node() "
                                                  "configures it)")));
        }
        const int node = found ? *found : -1;
        std::lock_guard lock(mutex_);
        if (find(device) == nullptr) (void)try_host_allocation([&] { nodes_.emplace_back(&device, node); });
        return refused(node) ? -1 : node;
    }

    /// Serves `device` from `node` (-1: the backend's pinned_malloc memory) from now on.
    Status set_node(const B& device, int node) noexcept {
        if (!numa_.enabled) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool set_numa_node: the pool was made without NUMA placement "
                                           "(NumaPlacement{.enabled = true}); nothing changed"));
        }
        if (node < -1 || node >= max_numa_nodes) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool set_numa_node: node ", node, " is not -1 or a node below ",
                                           max_numa_nodes, "; nothing changed"));
        }
        std::lock_guard lock(mutex_);
        if (int* known = find(device)) {
            *known = node;
            return {};
        }
        if (!try_host_allocation([&] { nodes_.emplace_back(&device, node); })) {
            return Status(Errc::out_of_memory, "pinned pool set_numa_node: host memory exhausted; nothing changed");
        }
        return {};
    }

    /// `capacity` bytes (whole pages) mapped, bound to `node` and touched, ready to be pinned
    /// in place. A node the kernel does not bind to is reported once, remembered, and answered
    /// not_supported: the caller falls back to pinned_malloc. `backend_name` is for the report.
    Result<void*> map(std::size_t capacity, int node, const std::string& backend_name) noexcept {
        Result<void*> memory = numa_map(capacity, node);
        if (memory || memory.status().code() != Errc::invalid_argument) return memory;
        bool first = false;
        {
            std::lock_guard lock(mutex_);
            fallbacks_.fetch_add(1, std::memory_order_relaxed);
            if (!refused(node)) first = try_host_allocation([&] { refused_.push_back(node); });
        }
        if (first) {
            sink_->report(Status(
                Errc::invalid_argument,
                message_or_empty("pinned pool: NUMA node ", node, " refused: ", memory.status().message(),
                                 "; its devices are served from backend '", backend_name, "''s pinned_malloc memory")));
        }
        return Status(Errc::not_supported, "numa: node refused");
    }

    void count_block() noexcept { blocks_.fetch_add(1, std::memory_order_relaxed); }
    std::uint64_t blocks() const noexcept { return blocks_.load(std::memory_order_relaxed); }
    std::uint64_t fallbacks() const noexcept { return fallbacks_.load(std::memory_order_relaxed); }

private:
    /// Precondition: mutex_ held.
    int* find(const B& device) noexcept {
        for (auto& [backend, node] : nodes_) {
            if (backend == &device) return &node;
        }
        return nullptr;
    }
    /// Precondition: mutex_ held.
    bool refused(int node) const noexcept {
        for (const int r : refused_) {
            if (r == node) return true;
        }
        return false;
    }

    NumaPlacement numa_;
    const PinnedSink* sink_;
    std::mutex mutex_;
    std::vector<std::pair<const B*, int>> nodes_;  ///< devices seen or configured, and their node
    std::vector<int> refused_;                     ///< nodes mbind refused
    std::atomic<std::uint64_t> blocks_{0}, fallbacks_{0};
};

}  // namespace devstage::detail
