// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the per-arg state of one run, as the transfer passes write and read it — its leases
// and device args (storage that only grows, to the largest run), its layout, and the pack
// limit it was staged with. A Stager's slot keeps the record of its bound (or last finished)
// run; the passes know nothing else of the slot.

#include <cstddef>
#include <span>
#include <vector>

#include "devstage/detail/layout/plan_pass.hpp"
#include "devstage/detail/transfer/batch_copies.hpp"
#include "devstage/detail/util/storage.hpp"
#include "devstage/lease.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace devstage::detail {

template <class Async>
struct RunRecord {
    std::vector<TensorLease> lease_storage;  // only grows; the first lease_count are the run's
    std::size_t lease_count = 0;
    std::size_t staged = 0;                          // leases of staged args (the others are Device args)
    std::vector<TensorArg> device_args;              // only grows
    [[no_unique_address]] BatchCopies<Async> batch;  // the run's direct copies, for a BatchCopyBackend
    StagingLayout layout;
    /// Staged args of at most this many bytes moved in the mirror: 0 none, pack_everything all
    /// (a frame's run).
    std::size_t pack_limit = 0;

    std::span<TensorLease> leases() noexcept { return {lease_storage.data(), lease_count}; }
    std::span<const TensorLease> leases() const noexcept { return {lease_storage.data(), lease_count}; }
    bool frame() const noexcept { return pack_limit == pack_everything; }

    /// True when `lease` moved inside a packed copy (or lies in the mapped mirror).
    bool packed(const TensorLease& lease) const noexcept {
        return lease.release_kind == ReleaseKind::BufferNoop && lease.bytes <= pack_limit;
    }

    /// Room for a run of `count` args.
    Status size_for(std::size_t count) noexcept {
        if (Status leases = grow_storage(lease_storage, count); !leases) return leases;
        if constexpr (BatchCopies<Async>::enabled) {
            if (Status batched = batch.size_for(count); !batched) return batched;
        }
        return grow_storage(device_args, count);
    }

    /// Gives the storage back (the record describes no run afterwards).
    void drop() noexcept {
        lease_count = staged = 0;
        std::vector<TensorLease>().swap(lease_storage);
        std::vector<TensorArg>().swap(device_args);
        batch.drop();
    }

    std::size_t bytes() const noexcept {
        return lease_storage.capacity() * sizeof(TensorLease) + device_args.capacity() * sizeof(TensorArg) +
               batch.bytes();
    }
};

}  // namespace devstage::detail
