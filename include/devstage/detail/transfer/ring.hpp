// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the pageable ring's part in a run's transfers — which large leases go through the
// ring, and their chunked upload and copy-back.

#include <type_traits>

#include "devstage/backend.hpp"
#include "devstage/detail/transfer/failures.hpp"
#include "devstage/detail/transfer/pinned_ring.hpp"
#include "devstage/lease.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

/// The pageable ring of a stager over B (nothing without pinned host memory).
template <class B, class A>
using RingOf = std::conditional_t<PinnedHostBackend<B>, PinnedRing<B, A>, void>;

/// True when a large lease's host memory is pageable (see Stager::set_pageable_ring).
template <class B>
bool through_ring(const B& backend, const TensorLease& lease) noexcept {
    if (lease.host_memory == HostMemory::pinned) return false;
    if (lease.host_memory == HostMemory::pageable) return true;
    if constexpr (PinnedQueryBackend<B>) {
        return !backend.is_pinned(lease.host);
    } else {
        (void)backend;
        return true;
    }
}

template <class B, class A>
Status ring_upload(B& backend, A& async, RingOf<B, A>* ring, const TensorLease& lease, typename A::Stream stream,
                   StagerStats& stats, bool& enqueued) noexcept {
    if constexpr (PinnedHostBackend<B>) {
        Status status = ring->upload(backend, async, lease.device, lease.host, lease.bytes, stream, stats);
        enqueued = true;
        if (!status) {
            return copy_failure("bind: upload through the pageable ring", lease.bytes, status, backend.name());
        }
        ++stats.ring_uploads;
        stats.bytes_to_device += lease.bytes;
        return status;
    } else {
        (void)backend, (void)async, (void)ring, (void)lease, (void)stream, (void)stats, (void)enqueued;
        return {};
    }
}

template <class B, class A>
Status ring_copy_back(B& backend, A& async, RingOf<B, A>* ring, const TensorLease& lease, typename A::Stream stream,
                      StagerStats& stats) noexcept {
    if constexpr (PinnedHostBackend<B>) {
        Status status = ring->download(backend, async, lease.host, lease.device, lease.bytes, stream, stats);
        if (!status) {
            return copy_failure("finish: copy back through the pageable ring", lease.bytes, status, backend.name());
        }
        ++stats.ring_copy_backs;
        stats.bytes_from_device += lease.bytes;
        return status;
    } else {
        (void)backend, (void)async, (void)ring, (void)lease, (void)stream, (void)stats;
        return {};
    }
}

}  // namespace devstage::detail
