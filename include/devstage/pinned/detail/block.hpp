// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the vocabulary the parts of a pinned pool's core share — a block of pinned memory
/// and where it came from (PinnedBlock), the recorded stream work on it (PinnedUse) and a
/// released block with that work (PinnedEntry), the first failure of a run of frees and waits
/// (Tally) — and the error sink they report to (PinnedSink).

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/detail/stream_types.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// How a block came from the backend, which says how it goes back.
enum class BlockSource : std::uint8_t {
    malloc,    ///< pinned_malloc; back with pinned_free
    mapped,    ///< mapped by the pool and host_register'ed in chunks; back unregistered and unmapped
    slice,     ///< part of a region the pool made; back to that region
    unpinned,  ///< mapped by the pool and unpinned when its backend was torn down; back unmapped
};

/// A block as the pool holds it.
struct PinnedBlock {
    void* base = nullptr;      ///< what pinned_malloc returned, the mapping, or the slice
    std::size_t capacity = 0;  ///< its bytes (a mapping: its length, whole pages)
    int node = -1;             ///< >= 0: bound to that NUMA node
    BlockSource source = BlockSource::malloc;
    std::size_t chunk = 0;     ///< mapped: the bytes of each registration (the last may be shorter)
    std::uint64_t region = 0;  ///< the region it is (malloc, mapped) or lies in (slice); 0: none
    bool exact = false;        ///< pinned at the size asked for (page-rounded), not a size class
};

/// A stream whose enqueued work uses a block, the backend the stream belongs to (events are
/// made, recorded, queried and destroyed on it), and the event the pool holds for it: taken
/// when record() checked the stream with one, or when the block was given back.
template <class B>
struct PinnedUse {
    using Stream = typename PinnedStreamTypes<B>::Stream;
    using Event = typename PinnedStreamTypes<B>::Event;
    B* backend = nullptr;
    Stream stream{};
    Event event{};
    bool holds_event = false;  ///< `event` is the pool's, taken for this use
    bool recorded = false;     ///< `event` was recorded on `stream` at the release
};

/// A released block the pool keeps (for reuse, or until it may be freed), with the events of
/// its recorded work not known to have completed.
template <class B>
struct PinnedEntry {
    PinnedBlock block;
    std::vector<PinnedUse<B>> uses;
    /// An event could not be recorded or queried: no event tells when the work ends, so only a
    /// wait (trim, finalize, the destruction) settles the block.
    bool unknown = false;

    bool pending() const noexcept { return !uses.empty() || unknown; }
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

/// The error sink of a pool's core, replaceable at any time. Thread-safe.
class PinnedSink {
public:
    void set(ErrorSink sink) noexcept {
        std::lock_guard lock(mutex_);
        sink_ = sink;
    }
    void report(const Status& status) const noexcept {
        ErrorSink sink;
        {
            std::lock_guard lock(mutex_);
            sink = sink_;
        }
        sink(status);
    }

private:
    mutable std::mutex mutex_;
    ErrorSink sink_;
};

}  // namespace devstage::detail
