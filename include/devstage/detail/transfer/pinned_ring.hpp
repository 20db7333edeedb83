// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the pinned ring of a Stager's pageable args (see devstage/pageable.hpp): pinned
// chunks filled and emptied by host threads while the copy engine drains the previous chunk,
// an event per chunk guarding its reuse.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/host_copy.hpp"
#include "devstage/pageable.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// The ring of one Stager: pinned chunks and their events, created at first use.
/// B: a PinnedHostBackend; A: its stream view (B, or SynchronousAdapter<B>). `pool`, when not
/// null, is the engine's and is not owned: it must outlive the ring (and so the Stager);
/// when null the ring starts and owns its own.
template <class B, class A>
class PinnedRing {
public:
    using Stream = typename A::Stream;
    using Event = typename A::Event;

    PinnedRing(const PageableRing& config, HostCopyPool* pool) noexcept : config_(config), pool_(pool) {}
    PinnedRing(const PinnedRing&) = delete;
    PinnedRing& operator=(const PinnedRing&) = delete;
    ~PinnedRing() = default;  // the owner releases or forgets first

    const PageableRing& config() const noexcept { return config_; }
    /// Chunks held: none before the first use and after a full release.
    std::size_t chunks() const noexcept { return chunks_.size(); }

    /// Copies `bytes` from pageable `src` to device `dst`, enqueued on `stream` chunk by chunk;
    /// returns once the last chunk is enqueued (earlier chunks' events gate their reuse).
    Status upload(B& backend, A& async, void* dst, const void* src, std::size_t bytes, Stream stream,
                  StagerStats& stats) noexcept {
        if (Status ready = ensure(backend, async, stats); !ready) return ready;
        for (std::size_t done = 0; done < bytes;) {
            const std::size_t length = std::min(config_.chunk_bytes, bytes - done);
            Chunk& chunk = take();
            if (Status free = settle(async, chunk, stats); !free) return free;
            pool_->copy(chunk.data, static_cast<const std::byte*>(src) + done, length);
            if (Status copied =
                    async.copy_to_device_async(static_cast<std::byte*>(dst) + done, chunk.data, length, stream);
                !copied) {
                return copied;
            }
            Status recorded = mark(async, chunk, stream);
            ++stats.ring_chunks;
            if (!recorded) return recorded;
            done += length;
        }
        return {};
    }

    /// Copies `bytes` from device `src` to pageable `dst`: each chunk is enqueued on `stream`
    /// (after the work already there) and copied out by the host once it arrived, up to
    /// `chunks` of them in flight; returns when every byte is in `dst`.
    Status download(B& backend, A& async, void* dst, const void* src, std::size_t bytes, Stream stream,
                    StagerStats& stats) noexcept {
        if (Status ready = ensure(backend, async, stats); !ready) return ready;
        std::vector<InFlight>& window = window_;
        window.clear();
        std::size_t issued = 0, first = 0;
        Status failure;
        auto* out = static_cast<std::byte*>(dst);
        for (;;) {
            while (failure.ok() && issued < bytes && window.size() - first < chunks_.size()) {
                const std::size_t length = std::min(config_.chunk_bytes, bytes - issued);
                Chunk& chunk = take();
                if (Status free = settle(async, chunk, stats); !free) {
                    failure = free;
                    break;
                }
                Status copied = async.copy_from_device_async(chunk.data, static_cast<const std::byte*>(src) + issued,
                                                             length, stream);
                if (copied) {
                    copied = mark(async, chunk, stream);
                    ++stats.ring_chunks;
                }
                if (!copied) {
                    failure = copied;
                    break;
                }
                if (!push(window, InFlight{&chunk, issued, length}, failure)) break;
                issued += length;
            }
            if (first == window.size()) break;
            const InFlight next = window[first++];
            Status arrived = settle(async, *next.chunk, stats);
            if (!arrived && failure.ok()) failure = arrived;
            if (failure.ok()) pool_->copy(out + next.offset, next.chunk->data, next.length);
        }
        return failure;
    }

    /// Blocks until no chunk is in use, then frees the chunks and their events. A chunk whose
    /// copy cannot be waited for is kept (the failure is returned; a later release retries).
    Status release(B& backend, A& async, StagerStats& stats) noexcept {
        Status first;
        std::size_t kept = 0;
        for (Chunk& chunk : chunks_) {
            Status waited = settle(async, chunk, stats);
            if (chunk.pending) {
                if (first.ok()) {
                    first =
                        Status(waited.code(),
                               message("pageable ring: a ", config_.chunk_bytes,
                                       "-byte chunk whose copy could not be waited for is kept: ", waited.message()));
                }
                chunks_[kept++] = chunk;
                continue;
            }
            Status destroyed = async.destroy_event(chunk.event);
            Status freed = backend.pinned_free(chunk.data);
            stats.ring_bytes -= config_.chunk_bytes;
            for (Status* status : {&waited, &destroyed, &freed}) {
                if (first.ok() && !status->ok()) first = std::move(*status);
            }
        }
        chunks_.resize(kept);
        next_ = 0;
        return first;
    }

    /// Forgets the chunks without calling the backend (after a device reset).
    void forget(StagerStats& stats) noexcept {
        stats.ring_bytes -= chunks_.size() * config_.chunk_bytes;
        chunks_.clear();
        next_ = 0;
    }

private:
    struct Chunk {
        std::byte* data = nullptr;
        Event event{};
        Stream stream{};        // where its last copy was enqueued
        bool pending = false;   // a copy may still use it
        bool unmarked = false;  // ... and recording its event after that copy failed
    };
    struct InFlight {
        Chunk* chunk;
        std::size_t offset, length;
    };

    // Creates the chunks (and, unless the engine supplied one, the thread pool) at first use.
    Status ensure(B& backend, A& async, StagerStats& stats) noexcept {
        if (!chunks_.empty()) return {};
        if (config_.chunks == 0 || config_.chunk_bytes == 0) {
            return Status(Errc::invalid_argument, message("pageable ring: ", config_.chunks, " chunk(s) of ",
                                                          config_.chunk_bytes, " bytes cannot stage anything"));
        }
        if (pool_ == nullptr && !start_pool()) {
            return Status(Errc::out_of_memory,
                          "pageable ring: host memory for the copy threads could not be allocated");
        }
        if (!reserve(config_.chunks)) {
            return Status(Errc::out_of_memory, "pageable ring: host memory for the chunk list could not be allocated");
        }
        for (std::size_t i = 0; i < config_.chunks; ++i) {
            Result<void*> data = backend.pinned_malloc(config_.chunk_bytes);
            Result<Event> event = data ? async.create_event() : Result<Event>(data.status());
            if (!data || !event) {
                if (data) (void)backend.pinned_free(*data);
                const Status cause = data ? event.status() : data.status();
                (void)release(backend, async, stats);
                return Status(cause.code(), message("pageable ring: chunk ", i, " of ", config_.chunk_bytes,
                                                    " bytes from backend '", backend.name(), "': ", cause.message()));
            }
            chunks_.push_back(Chunk{static_cast<std::byte*>(*data), *event, Stream{}, false, false});
            stats.ring_bytes += config_.chunk_bytes;
        }
        return {};
    }

    bool start_pool() noexcept {
#if defined(__cpp_exceptions)
        try {
            own_pool_ = std::make_unique<HostCopyPool>(config_.threads);
        } catch (...) {
            return false;
        }
#else
        own_pool_ = std::make_unique<HostCopyPool>(config_.threads);
#endif
        pool_ = own_pool_.get();
        return true;
    }

    Chunk& take() noexcept {
        Chunk& chunk = chunks_[next_];
        next_ = (next_ + 1) % chunks_.size();
        return chunk;
    }

    // After a copy using `chunk` was enqueued on `stream`: records the chunk's event there. The
    // chunk is in use either way; when the record fails, settle records it again first.
    Status mark(A& async, Chunk& chunk, Stream stream) noexcept {
        chunk.pending = true;
        chunk.stream = stream;
        Status recorded = async.record_event(chunk.event, stream);
        chunk.unmarked = !recorded.ok();
        return recorded;
    }

    // Waits until `chunk`'s last copy completed. When its event cannot be waited for, waits for
    // the whole device (synchronize(), where the backend has it); the chunk stays in use
    // unless that succeeded.
    Status settle(A& async, Chunk& chunk, StagerStats& stats) noexcept {
        if (!chunk.pending) return {};
        ++stats.ring_waits;
        Status waited;
        if (chunk.unmarked) {
            waited = async.record_event(chunk.event, chunk.stream);
            if (waited.ok()) chunk.unmarked = false;
        }
        if (waited.ok()) waited = async.synchronize_event(chunk.event);
        if (waited.ok()) {
            chunk.pending = false;
            return waited;
        }
        if constexpr (SynchronizingBackend<A>) {
            if (async.synchronize().ok()) chunk.pending = chunk.unmarked = false;
        }
        return waited;
    }

    bool reserve(std::size_t count) noexcept {
#if defined(__cpp_exceptions)
        try {
            chunks_.reserve(count);
        } catch (...) {
            return false;
        }
#else
        chunks_.reserve(count);
#endif
        return true;
    }

    template <class T>
    static bool push(std::vector<T>& items, const T& item, Status& failure) noexcept {
#if defined(__cpp_exceptions)
        try {
            items.push_back(item);
        } catch (...) {
            failure = Status(Errc::out_of_memory, "pageable ring: host memory exhausted tracking chunks");
            return false;
        }
#else
        (void)failure;
        items.push_back(item);
#endif
        return true;
    }

    PageableRing config_;
    HostCopyPool* pool_;
    std::unique_ptr<HostCopyPool> own_pool_;
    std::vector<Chunk> chunks_;
    std::vector<InFlight> window_;  // the chunks of a download in flight, in order
    std::size_t next_ = 0;
};

}  // namespace devstage::detail
