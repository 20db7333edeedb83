// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the first layer of a pinned pool's core (PinnedCoreState): the backend and its
/// name, the mutex, the counters (PinnedStats) and the error sink, with the backend's frees and
/// the tally of a run of frees and waits. The layers above — the recorded stream work and the
/// events (events.hpp), the registry of live allocations (registry.hpp), the cached and retiring
/// blocks (block_cache.hpp) — each add one part, and PinnedPoolCore (pinned/core.hpp) puts them
/// together. Every layer works under this mutex.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/pinned/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The state every layer of a PinnedPoolCore<B, Cache> shares. Thread-safe.
template <PinnedHostBackend B>
class PinnedCoreState : public PinnedCore {
public:
    explicit PinnedCoreState(B& backend) : backend_(&backend), name_(backend.name()) {}
    PinnedCoreState(const PinnedCoreState&) = delete;
    PinnedCoreState& operator=(const PinnedCoreState&) = delete;

    PinnedStats stats() const noexcept override {
        std::lock_guard lock(mutex_);
        return stats_;
    }

    void report(const Status& status) noexcept override {
        ErrorSink sink;
        {
            std::lock_guard lock(mutex_);
            sink = sink_;
        }
        sink(status);
    }

    void set_sink(ErrorSink sink) noexcept {
        std::lock_guard lock(mutex_);
        sink_ = sink;
    }
    B& backend() const noexcept { return *backend_; }

protected:
    static constexpr bool streams = AsyncBackend<B>;
    using Lock = std::unique_lock<std::mutex>;

    /// A block as the backend gave it.
    struct Block {
        void* base = nullptr;      ///< what pinned_malloc returned and pinned_free gets
        std::size_t capacity = 0;  ///< its bytes
        int node = -1;             ///< >= 0: mapped on that NUMA node and host_register'ed
    };

    /// The first failure of a run of frees and waits, and how many failed.
    struct Tally {
        Status first;
        std::size_t failures = 0, total = 0;
        void add(Status status) noexcept {
            ++total;
            if (status.ok()) return;
            ++failures;
            if (first.ok()) first = std::move(status);
        }
        Status status(const char* what, const std::string& backend) const noexcept {
            if (failures > 1) {
                return Status(first.code(), message_or_empty("pinned pool ", what, ": ", failures, " of ", total,
                                                             " frees and waits failed on backend '", backend,
                                                             "'; first: ", first.message()));
            }
            return first;
        }
    };

    void count_wait() noexcept {
        std::lock_guard lock(mutex_);
        ++stats_.host_waits;
    }

    Status free_block(const Block& block) noexcept {
        Status status;
        if constexpr (HostRegisterBackend<B>) {
            if (block.node >= 0) {
                status = backend_->host_unregister(block.base);
                if (status) numa_unmap(block.base, block.capacity);
            } else {
                status = backend_->pinned_free(block.base);
            }
        } else {
            status = backend_->pinned_free(block.base);
        }
        {
            std::lock_guard lock(mutex_);
            ++stats_.backend_frees;
        }
        if (!status) {
            return Status(status.code(),
                          message_or_empty("pinned pool: pinned_free of ", block.capacity, " bytes failed on backend '",
                                           name_, "': ", status.message()));
        }
        return status;
    }

    B* backend_;
    std::string name_;  ///< the backend's name, for messages that may come after the backend is gone
    mutable std::mutex mutex_;
    PinnedStats stats_;
    ErrorSink sink_;
};

}  // namespace devstage::detail
