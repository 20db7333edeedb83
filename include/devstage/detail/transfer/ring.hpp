// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the pageable ring's part in a Transfers pass — which large leases go through the
// ring, and their chunked upload and copy-back (included by transfers.hpp).

#include "devstage/detail/transfer/transfers.hpp"

namespace devstage::detail {

// True when a large lease's host memory is pageable (see Stager::set_pageable_ring).
template <class B, class Strategy, class Async>
bool Transfers<B, Strategy, Async>::through_ring(const TensorLease& lease) const noexcept {
    if (lease.host_memory == HostMemory::pinned) return false;
    if (lease.host_memory == HostMemory::pageable) return true;
    if constexpr (PinnedQueryBackend<B>) {
        return !backend_.is_pinned(lease.host);
    } else {
        return true;
    }
}

template <class B, class Strategy, class Async>
Status Transfers<B, Strategy, Async>::ring_upload(const TensorLease& lease, Stream stream, bool& enqueued) noexcept {
    if constexpr (PinnedHostBackend<B>) {
        Status status = ring_->upload(backend_, async_, lease.device, lease.host, lease.bytes, stream, stats_);
        enqueued = true;
        if (!status) {
            return copy_failure("bind: upload through the pageable ring", lease.bytes, status, backend_.name());
        }
        ++stats_.ring_uploads;
        stats_.bytes_to_device += lease.bytes;
        return status;
    } else {
        (void)lease, (void)stream, (void)enqueued;
        return {};
    }
}

template <class B, class Strategy, class Async>
Status Transfers<B, Strategy, Async>::ring_copy_back(const TensorLease& lease, Stream stream) noexcept {
    if constexpr (PinnedHostBackend<B>) {
        Status status = ring_->download(backend_, async_, lease.host, lease.device, lease.bytes, stream, stats_);
        if (!status) {
            return copy_failure("finish: copy back through the pageable ring", lease.bytes, status, backend_.name());
        }
        ++stats_.ring_copy_backs;
        stats_.bytes_from_device += lease.bytes;
        return status;
    } else {
        (void)lease, (void)stream;
        return {};
    }
}

}  // namespace devstage::detail
