// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the registry of a pinned pool's live allocations (PinnedRegistry, the third layer
/// of its core): each grant by the pointer handed out, with its block, size, id, holder and the
/// streams record() named; the grant and the unlisting of an allocation, and record().

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

    /// Remembers that work enqueued on `stream`, a stream of `backend`, uses the live
    /// allocation at `pointer` (grant `id`, or whichever is there when `id` is 0), so that once
    /// given back the block is reused or freed only after that work completed. A stream already
    /// recorded (on the same backend) is not added twice. With `check`, an event of `backend` is
    /// recorded on the stream now (and again at the release): a stream the backend does not
    /// know is refused with the backend's error, and nothing is recorded.
    Status record(const void* pointer, std::uint64_t id, Stream stream, B& backend,
                  bool check) noexcept requires streams {
        {
            std::lock_guard lock(mutex_);
            Live* live = find_live(pointer, id);
            if (live == nullptr) return not_live(pointer);
            if (find_use(*live, backend, stream) != nullptr) return {};
        }
        Use use{&backend, stream, Event{}, false, false};
        if (check) {
            Result<Event> event = this->take_event(backend);
            if (!event) return refused(backend, pointer, event.status());
            if (Status recorded = backend.record_event(*event, stream); !recorded) {
                this->drop_event(backend, *event);
                return refused(backend, pointer, recorded);
            }
            use.event = *event;
            use.holds_event = true;
        }
        std::lock_guard lock(mutex_);
        Live* live = find_live(pointer, id);
        Status status;
        if (live == nullptr) {
            status = not_live(pointer);  // given back meanwhile, by another thread
        } else if (find_use(*live, backend, stream) != nullptr) {
            // recorded meanwhile, by another thread
        } else if (try_host_allocation([&] { live->uses.push_back(use); })) {
            return {};
        } else {
            status = Status(Errc::out_of_memory,
                            message_or_empty("pinned pool record: host memory exhausted remembering a stream of the ",
                                             live->requested, "-byte allocation at ", pointer, " (backend '",
                                             backend.name(), "'); nothing was recorded"));
        }
        this->recycle(use);
        return status;
    }

    /// record() of a PinnedBuffer: its memory (`data`, `bytes`, grant `id`), held from `owner`.
    Status record_buffer(const PinnedCore* owner, const void* data, std::size_t bytes, std::uint64_t id, Stream stream,
                         B& backend, bool check) noexcept requires streams {
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
        return record(data, id, stream, backend, check);
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
    void unlist(typename std::unordered_map<void*, Live>::iterator found) noexcept {
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
        unlist(found);
        return entry;
    }

    /// Precondition: mutex_ held. The live allocation at `pointer` (grant `id` unless 0).
    Live* find_live(const void* pointer, std::uint64_t id) noexcept {
        const auto found = live_.find(const_cast<void*>(pointer));
        if (found == live_.end() || (id != 0 && found->second.id != id)) return nullptr;
        return &found->second;
    }
    static const Use* find_use(const Live& live, const B& backend, Stream stream) noexcept {
        for (const Use& use : live.uses) {
            if (use.backend == &backend && use.stream == stream) return &use;
        }
        return nullptr;
    }
    Status not_live(const void* pointer) const noexcept {
        return Status(Errc::unknown_pointer,
                      message_or_empty("pinned pool record: ", pointer,
                                       " is not a live allocation of this pool (backend '", name_, "')"));
    }
    static Status refused(const B& backend, const void* pointer, const Status& cause) noexcept {
        return Status(cause.code(),
                      message_or_empty("pinned pool record: recording an event on the stream failed on backend '",
                                       backend.name(), "' (", static_cast<const void*>(&backend),
                                       "), the backend named for the stream: ", cause.message(),
                                       "; nothing was recorded for ", pointer));
    }

    std::unordered_map<void*, Live> live_;
    std::uint64_t next_id_ = 0;
};

}  // namespace devstage::detail
