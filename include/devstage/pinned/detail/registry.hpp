// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the registry of a pinned pool's live allocations (PinnedRegistry, the third layer
/// of its core): each grant by the pointer handed out, with its block, size, id, holder and the
/// streams record() named; the grant and the forgetting of an allocation, and record().

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/events.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/interface.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The live allocations of a pool's core, keyed by the pointer handed out.
template <PinnedHostBackend B>
class PinnedRegistry : public PinnedEvents<B> {
    using Base = PinnedEvents<B>;

protected:
    using Grant = PinnedCore::Grant;
    using Base::free_block;
    using Base::mutex_;
    using Base::name_;
    using Base::stats_;
    using Base::streams;
    using typename Base::Block;
    using typename Base::Cached;
    using typename Base::Lock;
    using typename Base::Use;
    using typename Base::Uses;

public:
    using typename Base::Event;
    using typename Base::Stream;

    using Base::Base;
    using Base::report;

    /// Remembers that work enqueued on `stream` uses the live allocation at `pointer` (grant
    /// `id`, or whichever is there when `id` is 0), so that once given back the block is reused
    /// or freed only after that work completed. A stream already recorded is not added twice.
    Status record(const void* pointer, std::uint64_t id, Stream stream) noexcept requires streams {
        std::lock_guard lock(mutex_);
        const auto found = live_.find(const_cast<void*>(pointer));
        if (found == live_.end() || (id != 0 && found->second.id != id)) {
            return Status(Errc::unknown_pointer,
                          message_or_empty("pinned pool record: ", pointer,
                                           " is not a live allocation of this pool (backend '", name_, "')"));
        }
        Uses& uses = found->second.uses;
        if (std::any_of(uses.begin(), uses.end(), [&stream](const Use& use) { return use.stream == stream; })) {
            return {};
        }
        if (!try_host_allocation([&] { uses.push_back(Use{stream, Event{}, false}); })) {
            return Status(Errc::out_of_memory,
                          message_or_empty("pinned pool record: host memory exhausted remembering a stream of the ",
                                           found->second.requested, "-byte allocation at ", pointer, " (backend '",
                                           name_, "'); nothing was recorded"));
        }
        return {};
    }

    /// record() of a PinnedBuffer: its memory (`data`, `bytes`, grant `id`), held from `owner`.
    Status record_buffer(const PinnedCore* owner, const void* data, std::size_t bytes, std::uint64_t id,
                         Stream stream) noexcept requires streams {
        if (data == nullptr) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the buffer is empty (0 bytes): it holds no memory "
                                           "(backend '",
                                           name_, "')"));
        }
        if (owner != this) {
            return Status(Errc::invalid_argument,
                          message_or_empty("pinned pool record: the ", bytes, "-byte buffer at ", data,
                                           " belongs to another pool, not this one (backend '", name_, "')"));
        }
        return record(data, id, stream);
    }

    /// True when `pointer` is the start of a live allocation (detached ones included).
    bool owns(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return live_.find(const_cast<void*>(pointer)) != live_.end();
    }

protected:
    /// A granted allocation; the registry's key is the pointer handed out (base, or aligned up).
    struct Live {
        Block block;
        std::size_t requested = 0;
        std::uint64_t id = 0;
        PinnedHolder holder = PinnedHolder::raw;
        bool detached = false;  ///< outlived a finalize(): freed, not cached, when given back
        Uses uses;              ///< the streams record() named
    };

    /// Precondition: `lock` holds mutex_. Records the grant of `block` as `pointer`; when the
    /// host has no memory for the record, the block goes back to the backend.
    Result<Grant> enroll(Lock& lock, const Block& block, void* pointer, std::size_t bytes,
                         PinnedHolder holder) noexcept {
        const std::uint64_t id = next_id_ + 1;
        if (!try_host_allocation([&] { live_.emplace(pointer, Live{block, bytes, id, holder, false, {}}); })) {
            lock.unlock();
            if (Status freed = free_block(block); !freed) report(freed);
            return Status(Errc::out_of_memory,
                          message_or_empty("pinned pool allocate: host memory exhausted recording a ", block.capacity,
                                           "-byte pinned block (", bytes, " asked) from backend '", name_,
                                           "'; the block went back to the backend"));
        }
        next_id_ = id;
        ++stats_.live_allocations;
        stats_.live_bytes += bytes;
        stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
        return Grant{pointer, id};
    }

    /// Precondition: mutex_ held. Drops a live allocation from the registry and the counters.
    void forget(typename std::unordered_map<void*, Live>::iterator found) noexcept {
        const Live& live = found->second;
        --stats_.live_allocations;
        stats_.live_bytes -= live.requested;
        if (live.detached) {
            --stats_.detached_allocations;
            stats_.detached_bytes -= live.requested;
        }
        live_.erase(found);
    }

    /// A raw allocation (its block and recorded streams), out of the registry; nullopt when
    /// none is left. Adds its bytes to `bytes`. One at a time, so no host memory is needed to
    /// collect them.
    std::optional<Cached> take_raw(std::uint64_t& bytes) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = std::find_if(live_.begin(), live_.end(),
                                        [](const auto& entry) { return entry.second.holder == PinnedHolder::raw; });
        if (found == live_.end()) return std::nullopt;
        std::optional<Cached> entry(std::in_place, Cached{found->second.block, std::move(found->second.uses), false});
        bytes += found->second.requested;
        forget(found);
        return entry;
    }

    std::unordered_map<void*, Live> live_;
    std::uint64_t next_id_ = 0;
};

}  // namespace devstage::detail
