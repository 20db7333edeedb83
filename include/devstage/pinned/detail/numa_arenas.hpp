// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: NUMA placement in a pinned pool's core (PinnedNumaArenas, its sixth layer): the
/// node each device is served from (configured, or found with nearest_numa_node and kept), the
/// nodes the kernel refused to bind to, and the backend allocation of a node's block — mapped,
/// bound with mbind, touched, then pinned with host_register. A node's blocks form its arena:
/// the cache hands a block only to an allocation for the same node.

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/forget.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <PinnedHostBackend B, class Cache>
class PinnedNumaArenas : public PinnedForget<B, Cache> {
    using Base = PinnedForget<B, Cache>;

public:
    PinnedNumaArenas(B& backend, Cache cache, NumaPlacement numa)
        : Base(backend, std::move(cache)), numa_(std::move(numa)) {}
    using Base::report;

    /// The node `device`'s allocations come from: -1 (the backend's pinned_malloc memory)
    /// without NUMA placement, for a device with no known node, or when its node refused.
    int node_for(const B& device) noexcept {
        if (!numa_.enabled) return -1;
        {
            std::lock_guard lock(this->mutex_);
            if (const int* known = find(device)) return refused(*known) ? -1 : *known;
        }
        Result<int> found = nearest_numa_node(device, numa_.sysfs_root);
        if (!found) {
            report(Status(found.status().code(),
                          message_or_empty("pinned pool: the NUMA node of a device of backend '", device.name(),
                                           "' is unknown: ", found.status().message(),
                                           "; it is served from the backend's pinned memory (set_numa_node() "
                                           "configures it)")));
        }
        const int node = found ? *found : -1;
        std::lock_guard lock(this->mutex_);
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
        std::lock_guard lock(this->mutex_);
        if (int* known = find(device)) {
            *known = node;
            return {};
        }
        if (!try_host_allocation([&] { nodes_.emplace_back(&device, node); })) {
            return Status(Errc::out_of_memory, "pinned pool set_numa_node: host memory exhausted; nothing changed");
        }
        return {};
    }

    bool numa_enabled() const noexcept { return numa_.enabled; }

protected:
    /// A block of `capacity` bytes on `node`: mapped, bound, touched, pinned in place. A node the
    /// kernel does not bind to is reported once, remembered, and answered not_supported: the
    /// caller falls back to pinned_malloc.
    Result<void*> numa_block(std::size_t capacity, int node) noexcept {
        if constexpr (HostRegisterBackend<B>) {
            Result<void*> memory = numa_map(capacity, node);
            if (!memory && memory.status().code() == Errc::invalid_argument) {
                bool first = false;
                {
                    std::lock_guard lock(this->mutex_);
                    ++this->stats_.numa_fallbacks;
                    if (!refused(node)) {
                        first = try_host_allocation([&] { refused_.push_back(node); });
                    }
                }
                if (first) {
                    report(Status(Errc::invalid_argument, message_or_empty("pinned pool: NUMA node ", node,
                                                                           " refused: ", memory.status().message(),
                                                                           "; its devices are served from backend '",
                                                                           this->name_, "''s pinned_malloc memory")));
                }
                return Status(Errc::not_supported, "numa: node refused");
            }
            if (!memory) return memory;
            if (Status pinned = this->backend_->host_register(*memory, capacity); !pinned) {
                numa_unmap(*memory, capacity);
                return Status(pinned.code(),
                              message_or_empty("host_register of the ", capacity, "-byte block bound to NUMA node ",
                                               node, " failed: ", pinned.message()));
            }
            std::lock_guard lock(this->mutex_);
            ++this->stats_.numa_blocks;
            return memory;
        } else {
            return Status(Errc::not_supported, "numa: the backend cannot pin memory in place");
        }
    }

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
    std::vector<std::pair<const B*, int>> nodes_;  ///< devices seen or configured, and their node
    std::vector<int> refused_;                     ///< nodes mbind refused
};

}  // namespace devstage::detail
