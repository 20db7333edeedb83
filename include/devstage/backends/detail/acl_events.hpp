// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The event records of AscendBackend (private): each ACL event with whether it was ever
/// recorded, listed so that the ones never destroyed go with the backend.

#include <atomic>
#include <mutex>
#include <utility>

#include "devstage/backends/ascend_abi.hpp"

namespace devstage::detail {
/// An ACL event and whether a record of it was ever enqueued: ACL reports an event never
/// recorded as not ready, where devstage's contract says it is ready. The backend links every
/// record it made into a list, so the ones never destroyed are freed with the backend.
struct AclEvent {
    acl::aclrtEvent handle = nullptr;
    std::atomic<bool> recorded{false};
    AclEvent* previous = nullptr;
    AclEvent* next = nullptr;
};

/// The AclEvent records a backend made and has not destroyed yet. Thread-safe.
class AclEventList {
public:
    AclEventList() = default;
    /// Takes `other`'s records (moving a backend another thread uses is not allowed anyway).
    AclEventList(AclEventList&& other) noexcept : head_(std::exchange(other.head_, nullptr)) {}
    AclEventList& operator=(AclEventList&&) = delete;
    AclEventList(const AclEventList&) = delete;
    AclEventList& operator=(const AclEventList&) = delete;
    ~AclEventList() {
        destroy_all([](acl::aclrtEvent) {});
    }

    void link(AclEvent* event) noexcept {
        const std::lock_guard lock(mutex_);
        event->next = head_;
        if (head_ != nullptr) head_->previous = event;
        head_ = event;
    }
    void unlink(AclEvent* event) noexcept {
        const std::lock_guard lock(mutex_);
        if (event->previous != nullptr) event->previous->next = event->next;
        if (event->next != nullptr) event->next->previous = event->previous;
        if (head_ == event) head_ = event->next;
        event->previous = event->next = nullptr;
    }
    /// Frees every record still listed after calling `destroy` with its ACL event.
    template <class F>
    void destroy_all(F destroy) noexcept {
        for (AclEvent* event = take_all(); event != nullptr;) {
            AclEvent* next = event->next;
            destroy(event->handle);
            delete event;
            event = next;
        }
    }

private:
    AclEvent* take_all() noexcept {
        const std::lock_guard lock(mutex_);
        return std::exchange(head_, nullptr);
    }

    std::mutex mutex_;
    AclEvent* head_ = nullptr;
};
}  // namespace devstage::detail
