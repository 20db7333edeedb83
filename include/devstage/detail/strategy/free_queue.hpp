// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the FreeQueue through which a strategy gives back device memory that pending stream
// work of its slot may still touch (devstage::FreeQueue, named in the StagingStrategy concept).

#include <new>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// Device memory a strategy gives back goes through here: freed at once when no stream work
/// of the slot is pending, else queued and freed by the Stager once the slot's pending work
/// completed (StagerStats::deferred_frees). `queue.free(old_buffer)`
template <Backend B>
class FreeQueue {
public:
    using Settle = Status (*)(void* context) noexcept;

    /// A queue with nothing pending: every free is immediate. For a strategy used on its own.
    FreeQueue(B& backend, StagerStats& stats, ErrorSink sink = {}) noexcept
        : backend_(&backend), stats_(&stats), sink_(sink) {}
    /// A queue of a slot with pending work: frees go to `deferred` until `settle(context)`
    /// (which blocks until the work completed and frees them) is called.
    FreeQueue(B& backend, StagerStats& stats, ErrorSink sink, std::vector<void*>& deferred, Settle settle,
              void* context) noexcept
        : backend_(&backend), stats_(&stats), sink_(sink), deferred_(&deferred), settle_(settle), context_(context) {}

    /// True when pending work may still touch memory this queue is given.
    bool pending() const noexcept { return deferred_ != nullptr; }

    /// Gives `allocation` (what device_malloc returned) back to the backend, now or once the
    /// pending work completed. A failure is returned and counted (free_failures); the pointer
    /// is then the backend's to account for. Should there be neither host memory to remember
    /// the allocation nor a way to wait for the pending work, it stays allocated (counted in
    /// free_failures, reported to the error sink): freeing it could pull memory from under
    /// that work.
    Status free(void* allocation) noexcept {
        if (allocation == nullptr) return {};
        if (deferred_ != nullptr) {
            if (push(allocation)) {
                ++stats_->deferred_frees;
                return {};
            }
            if (deferred_ != nullptr) {
                ++stats_->free_failures;
                sink_(Status(
                    Errc::out_of_memory,
                    message("device_free of ", static_cast<const void*>(allocation), " on backend '", backend_->name(),
                            "' skipped: no host memory to defer it and its pending work could not "
                            "be waited for; it stays allocated")));
                return {};
            }
        }
        ++stats_->device_frees;
        Status status = backend_->device_free(allocation);
        if (!status) {
            ++stats_->free_failures;
            return Status(status.code(), message("device_free of ", static_cast<const void*>(allocation),
                                                 " failed on backend '", backend_->name(), "': ", status.message()));
        }
        return status;
    }

    /// Blocks until the pending work completed and frees what was queued; afterwards every
    /// free is immediate. For a strategy that must free before it allocates (GrowOrder::free_first).
    Status settle() noexcept {
        if (deferred_ == nullptr) return {};
        Status status = settle_(context_);
        if (status.ok()) deferred_ = nullptr;  // else the work may still run: frees stay deferred
        return status;
    }

    /// Reports a failure no caller will see (the run it happened in still succeeds).
    void report(const Status& status) const noexcept { sink_(status); }

private:
    bool push(void* allocation) noexcept {
#if defined(__cpp_exceptions)
        try {
            deferred_->push_back(allocation);
        } catch (const std::bad_alloc&) {
            // No host memory to remember it: wait for the work instead, then free now (the
            // caller sees deferred_ still set when that wait failed).
            (void)settle();
            return false;
        }
#else
        deferred_->push_back(allocation);
#endif
        return true;
    }

    B* backend_;
    StagerStats* stats_;
    ErrorSink sink_;
    std::vector<void*>* deferred_ = nullptr;
    Settle settle_ = nullptr;
    void* context_ = nullptr;
};

}  // namespace devstage::detail
