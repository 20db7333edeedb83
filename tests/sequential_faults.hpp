// SPDX-License-Identifier: Apache-2.0
#pragma once
// Faults at the call of every backend operation, for the random-program checker: Faulty<B> is
// backend B whose operations fail on request. The checker arms a FaultPlan around one call of
// the Stager (the engine's own calls never fail): the plan's operation fails at its n-th call
// from then on (and, `persistent`, at every later one), and `stuck` makes every wait fail —
// synchronize_event and synchronize() both — so that work stays pending. A failed call does
// nothing, but for a batch of copies, which enqueues its first half and then fails (as a
// runtime's batch refused part way does).
//
// Faulty<B> also keeps the books the checker's leak check needs, on every backend alike: the
// device and pinned allocations, mappings, events and streams live now. Memory whose free (or
// unmap) was made to fail stays with the backend — the stager gives it up, as the contract says
// — and give_back() returns it at the end, so that anything else still live is a leak.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/status.hpp"

namespace sequential {

/// The backend operations a plan can make fail.
enum class FaultOp : std::uint8_t {
    device_malloc,
    device_free,
    copy_to_device,
    copy_from_device,
    device_memset,
    pinned_malloc,
    pinned_free,
    synchronize,
    create_stream,
    destroy_stream,
    copy_to_device_async,
    copy_from_device_async,
    device_memset_async,
    copy_to_device_batch,
    copy_from_device_batch,
    create_event,
    destroy_event,
    record_event,
    event_ready,
    synchronize_event,
    stream_wait_event,
    map_host,
    unmap_host,
};
inline constexpr std::size_t fault_op_count = 23;

inline const char* fault_op_name(FaultOp op) noexcept {
    static const char* const names[fault_op_count] = {"device_malloc",
                                                      "device_free",
                                                      "copy_to_device",
                                                      "copy_from_device",
                                                      "device_memset",
                                                      "pinned_malloc",
                                                      "pinned_free",
                                                      "synchronize",
                                                      "create_stream",
                                                      "destroy_stream",
                                                      "copy_to_device_async",
                                                      "copy_from_device_async",
                                                      "device_memset_async",
                                                      "copy_to_device_batch",
                                                      "copy_from_device_batch",
                                                      "create_event",
                                                      "destroy_event",
                                                      "record_event",
                                                      "event_ready",
                                                      "synchronize_event",
                                                      "stream_wait_event",
                                                      "map_host",
                                                      "unmap_host"};
    return names[static_cast<std::size_t>(op)];
}

/// True for the operations that give something back: their failure leaves it with the backend.
inline bool gives_back(FaultOp op) noexcept {
    return op == FaultOp::device_free || op == FaultOp::pinned_free || op == FaultOp::unmap_host ||
           op == FaultOp::destroy_event || op == FaultOp::destroy_stream;
}

/// What fails while a plan is armed.
struct FaultPlan {
    std::optional<FaultOp> op;  // the operation that fails (none: only `stuck`)
    unsigned nth = 1;           // at its nth call since the plan was armed
    bool persistent = false;    // and at every later call while armed
    bool stuck = false;         // every synchronize_event and synchronize() fails while armed
    devstage::Errc code = devstage::Errc::backend_failure;

    bool any() const noexcept { return op.has_value() || stuck; }
    std::string describe() const {
        std::string text;
        if (op) {
            text = std::string(fault_op_name(*op)) + " fails at its call " + std::to_string(nth) +
                   (persistent ? " and later" : "");
        }
        if (stuck) text += std::string(text.empty() ? "" : "; ") + "every wait fails (work left pending)";
        return text;
    }
};

/// Which operations B (as the Stager sees it) has.
template <class B>
constexpr bool has_fault_op(FaultOp op) noexcept {
    switch (op) {
        case FaultOp::device_memset:
            return devstage::MemsetBackend<B>;
        case FaultOp::pinned_malloc:
        case FaultOp::pinned_free:
            return devstage::PinnedHostBackend<B>;
        case FaultOp::synchronize:
            return devstage::SynchronizingBackend<B>;
        case FaultOp::create_stream:
        case FaultOp::destroy_stream:
        case FaultOp::copy_to_device_async:
        case FaultOp::copy_from_device_async:
        case FaultOp::create_event:
        case FaultOp::destroy_event:
        case FaultOp::record_event:
        case FaultOp::event_ready:
        case FaultOp::synchronize_event:
        case FaultOp::stream_wait_event:
            return devstage::AsyncBackend<B>;
        case FaultOp::device_memset_async:
            return devstage::AsyncMemsetBackend<B>;
        case FaultOp::copy_to_device_batch:
        case FaultOp::copy_from_device_batch:
            return devstage::BatchCopyBackend<B>;
        case FaultOp::map_host:
        case FaultOp::unmap_host:
            return devstage::MappedHostBackend<B>;
        default:
            return true;
    }
}

/// B's stream and event types, or stand-ins for a backend without streams (whose operations on
/// them Faulty<B> then does not offer).
struct NoStream {
    friend bool operator==(NoStream, NoStream) = default;
};
struct NoEvent {};
template <class B>
struct Handles {
    using Stream = NoStream;
    using Event = NoEvent;
};
template <class B>
requires requires {
    typename B::Stream;
    typename B::Event;
}
struct Handles<B> {
    using Stream = typename B::Stream;
    using Event = typename B::Event;
};

/// Backend B whose operations fail while a FaultPlan is armed, and which keeps the books of
/// what is live. `Faulty<MockBackend> mock(config); mock.arm(plan); ...; mock.disarm();`
template <class B>
class Faulty : public B {
    using FStream = typename Handles<B>::Stream;
    using FEvent = typename Handles<B>::Event;

public:
    using B::B;
    Faulty(const Faulty&) = delete;
    Faulty& operator=(const Faulty&) = delete;

    // ---- plans -------------------------------------------------------------------------------

    void arm(const FaultPlan& plan) noexcept {
        std::lock_guard lock(plan_mutex_);
        plan_ = plan;
        armed_ = plan.any();
        calls_ = 0;
        fired_ = fired_gives_back_ = 0;
        fired_log_.clear();
    }
    void disarm() noexcept {
        std::lock_guard lock(plan_mutex_);
        armed_ = false;
    }
    /// Failures injected since the plan was armed (and of them, of operations that give back).
    unsigned fired() const noexcept {
        std::lock_guard lock(plan_mutex_);
        return fired_;
    }
    unsigned fired_gives_back() const noexcept {
        std::lock_guard lock(plan_mutex_);
        return fired_gives_back_;
    }
    /// The operations that failed since the plan was armed, in order, with their call numbers.
    std::string fired_log() const {
        std::lock_guard lock(plan_mutex_);
        return fired_log_;
    }
    /// Failures injected since construction, per operation.
    std::uint64_t total_fired(FaultOp op) const noexcept {
        std::lock_guard lock(plan_mutex_);
        return total_[static_cast<std::size_t>(op)];
    }
    std::uint64_t total_fired() const noexcept {
        std::lock_guard lock(plan_mutex_);
        std::uint64_t sum = 0;
        for (std::uint64_t n : total_) sum += n;
        return sum;
    }

    // ---- the books ---------------------------------------------------------------------------

    std::size_t live_device() const noexcept {
        std::lock_guard lock(books_mutex_);
        return device_.size();
    }
    std::size_t live_pinned() const noexcept {
        std::lock_guard lock(books_mutex_);
        return pinned_.size();
    }
    std::size_t live_mappings() const noexcept {
        std::lock_guard lock(books_mutex_);
        return mapped_.size();
    }
    std::int64_t live_events() const noexcept {
        std::lock_guard lock(books_mutex_);
        return events_;
    }
    std::int64_t live_streams() const noexcept {
        std::lock_guard lock(books_mutex_);
        return streams_;
    }
    /// Memory, events and streams whose injected failure to give them back left them with the
    /// backend (counted since construction).
    std::size_t orphans() const noexcept {
        std::lock_guard lock(books_mutex_);
        return orphan_device_.size() + orphan_pinned_.size() + orphan_mapped_.size() + orphan_events_.size() +
               orphan_streams_.size();
    }
    /// Gives back what injected failures left with the backend: mappings (and the pinned block
    /// under each), then memory, events and streams. Call with no plan armed, once nothing
    /// pending uses them. Returns the first failure.
    devstage::Status give_back() noexcept {
        devstage::Status first;
        const auto note = [&first](devstage::Status status) {
            if (first.ok() && !status.ok()) first = std::move(status);
        };
        std::set<void*> mapped, device, pinned;
        Streams streams;
        Events events;
        {
            std::lock_guard lock(books_mutex_);
            mapped.swap(orphan_mapped_);
            device.swap(orphan_device_);
            pinned.swap(orphan_pinned_);
            if constexpr (devstage::AsyncBackend<B>) {
                streams.swap(orphan_streams_);
                events.swap(orphan_events_);
            }
        }
        if constexpr (devstage::MappedHostBackend<B>) {
            for (void* host : mapped) {
                note(unmap_host(host));
                // The mirror whose unmap failed was never freed: its block goes back too.
                if (void* block = pinned_block_of(host)) pinned.insert(block);
            }
        }
        for (void* pointer : device) note(device_free(pointer));
        if constexpr (devstage::PinnedHostBackend<B>) {
            for (void* pointer : pinned) note(pinned_free(pointer));
        }
        if constexpr (devstage::AsyncBackend<B>) {
            for (FEvent event : events) note(destroy_event(event));
            for (FStream stream : streams) note(destroy_stream(stream));
        }
        return first;
    }

    // ---- the operations ------------------------------------------------------------------------

    devstage::Result<void*> device_malloc(std::size_t bytes) noexcept {
        if (devstage::Status failed = fault(FaultOp::device_malloc); !failed) return failed;
        devstage::Result<void*> got = B::device_malloc(bytes);
        if (got) book(device_, *got);
        return got;
    }
    devstage::Status device_free(void* pointer) noexcept {
        if (devstage::Status failed = fault(FaultOp::device_free); !failed) {
            orphan(orphan_device_, pointer);
            return failed;
        }
        devstage::Status freed = B::device_free(pointer);
        if (freed) unbook(device_, orphan_device_, pointer);
        return freed;
    }
    devstage::Status copy_to_device(void* dst, const void* src, std::size_t bytes) noexcept {
        if (devstage::Status failed = fault(FaultOp::copy_to_device); !failed) return failed;
        return B::copy_to_device(dst, src, bytes);
    }
    devstage::Status copy_from_device(void* dst, const void* src, std::size_t bytes) noexcept {
        if (devstage::Status failed = fault(FaultOp::copy_from_device); !failed) return failed;
        return B::copy_from_device(dst, src, bytes);
    }
    devstage::Status device_memset(void* dst, int value,
                                   std::size_t bytes) noexcept requires devstage::MemsetBackend<B> {
        if (devstage::Status failed = fault(FaultOp::device_memset); !failed) return failed;
        return B::device_memset(dst, value, bytes);
    }
    devstage::Result<void*> pinned_malloc(std::size_t bytes) noexcept requires devstage::PinnedHostBackend<B> {
        if (devstage::Status failed = fault(FaultOp::pinned_malloc); !failed) return failed;
        devstage::Result<void*> got = B::pinned_malloc(bytes);
        if (got) {
            std::lock_guard lock(books_mutex_);
            pinned_[*got] = bytes;
        }
        return got;
    }
    devstage::Status pinned_free(void* pointer) noexcept requires devstage::PinnedHostBackend<B> {
        if (devstage::Status failed = fault(FaultOp::pinned_free); !failed) {
            orphan(orphan_pinned_, pointer);
            return failed;
        }
        devstage::Status freed = B::pinned_free(pointer);
        if (freed) {
            std::lock_guard lock(books_mutex_);
            pinned_.erase(pointer);
            orphan_pinned_.erase(pointer);
        }
        return freed;
    }
    devstage::Status synchronize() noexcept requires devstage::SynchronizingBackend<B> {
        if (devstage::Status failed = fault(FaultOp::synchronize); !failed) return failed;
        return B::synchronize();
    }

    devstage::Result<FStream> create_stream() noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::create_stream); !failed) return failed;
        auto created = B::create_stream();
        if (created) count(streams_, 1);
        return created;
    }
    devstage::Status destroy_stream(FStream stream) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::destroy_stream); !failed) {
            std::lock_guard lock(books_mutex_);
            orphan_streams_.push_back(stream);
            return failed;
        }
        devstage::Status destroyed = B::destroy_stream(stream);
        if (destroyed) count(streams_, -1);
        return destroyed;
    }
    devstage::Status copy_to_device_async(void* dst, const void* src, std::size_t bytes,
                                          FStream stream) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::copy_to_device_async); !failed) return failed;
        return B::copy_to_device_async(dst, src, bytes, stream);
    }
    devstage::Status copy_from_device_async(void* dst, const void* src, std::size_t bytes,
                                            FStream stream) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::copy_from_device_async); !failed) return failed;
        return B::copy_from_device_async(dst, src, bytes, stream);
    }
    devstage::Status device_memset_async(void* dst, int value, std::size_t bytes,
                                         FStream stream) noexcept requires devstage::AsyncMemsetBackend<B> {
        if (devstage::Status failed = fault(FaultOp::device_memset_async); !failed) return failed;
        return B::device_memset_async(dst, value, bytes, stream);
    }
    std::size_t batch_copy_limit(FStream stream) const noexcept requires devstage::BatchCopyBackend<B> {
        return B::batch_copy_limit(stream);
    }
    devstage::Status copy_to_device_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                          std::size_t count,
                                          FStream stream) noexcept requires devstage::BatchCopyBackend<B> {
        if (devstage::Status failed = fault(FaultOp::copy_to_device_batch); !failed) {
            return part_way(failed, count,
                            [&](std::size_t half) { return B::copy_to_device_batch(dsts, srcs, sizes, half, stream); });
        }
        return B::copy_to_device_batch(dsts, srcs, sizes, count, stream);
    }
    devstage::Status copy_from_device_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                            std::size_t count,
                                            FStream stream) noexcept requires devstage::BatchCopyBackend<B> {
        if (devstage::Status failed = fault(FaultOp::copy_from_device_batch); !failed) {
            return part_way(failed, count, [&](std::size_t half) {
                return B::copy_from_device_batch(dsts, srcs, sizes, half, stream);
            });
        }
        return B::copy_from_device_batch(dsts, srcs, sizes, count, stream);
    }

    devstage::Result<FEvent> create_event() noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::create_event); !failed) return failed;
        auto created = B::create_event();
        if (created) count(events_, 1);
        return created;
    }
    devstage::Status destroy_event(FEvent event) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::destroy_event); !failed) {
            std::lock_guard lock(books_mutex_);
            orphan_events_.push_back(event);
            return failed;
        }
        devstage::Status destroyed = B::destroy_event(event);
        if (destroyed) count(events_, -1);
        return destroyed;
    }
    devstage::Status record_event(FEvent event, FStream stream) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::record_event); !failed) return failed;
        return B::record_event(event, stream);
    }
    devstage::Result<bool> event_ready(FEvent event) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::event_ready); !failed) return failed;
        return B::event_ready(event);
    }
    devstage::Status synchronize_event(FEvent event) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::synchronize_event); !failed) return failed;
        return B::synchronize_event(event);
    }
    devstage::Status stream_wait_event(FStream stream, FEvent event) noexcept requires devstage::AsyncBackend<B> {
        if (devstage::Status failed = fault(FaultOp::stream_wait_event); !failed) return failed;
        return B::stream_wait_event(stream, event);
    }

    devstage::Result<void*> map_host(void* host, std::size_t bytes) noexcept requires devstage::MappedHostBackend<B> {
        if (devstage::Status failed = fault(FaultOp::map_host); !failed) return failed;
        devstage::Result<void*> mapped = B::map_host(host, bytes);
        if (mapped) book(mapped_, host);
        return mapped;
    }
    devstage::Status unmap_host(void* host) noexcept requires devstage::MappedHostBackend<B> {
        if (devstage::Status failed = fault(FaultOp::unmap_host); !failed) {
            orphan(orphan_mapped_, host);
            return failed;
        }
        devstage::Status unmapped = B::unmap_host(host);
        if (unmapped) unbook(mapped_, orphan_mapped_, host);
        return unmapped;
    }

private:
    // The injected failure of this call of `op`, or ok.
    devstage::Status fault(FaultOp op) noexcept {
        std::lock_guard lock(plan_mutex_);
        if (!armed_) return {};
        const bool wait = op == FaultOp::synchronize_event || op == FaultOp::synchronize;
        bool fails = plan_.stuck && wait;
        if (plan_.op == op) {
            ++calls_;
            fails = fails || calls_ == plan_.nth || (plan_.persistent && calls_ > plan_.nth);
        }
        if (!fails) return {};
        fired_log_ += std::string(fired_log_.empty() ? "" : ", ") + fault_op_name(op);
        if (plan_.op == op) fired_log_ += " #" + std::to_string(calls_);
        ++fired_;
        ++total_[static_cast<std::size_t>(op)];
        if (gives_back(op)) ++fired_gives_back_;
        const devstage::Errc code = plan_.op == op ? plan_.code : devstage::Errc::backend_failure;
        return devstage::Status(code, std::string(B::name()) + " " + fault_op_name(op) + " failed (injected)");
    }
    template <class Enqueue>
    devstage::Status part_way(const devstage::Status& failed, std::size_t count, Enqueue&& enqueue) noexcept {
        const std::size_t half = count / 2;
        if (half > 0) {
            if (devstage::Status enqueued = enqueue(half); !enqueued) return enqueued;
        }
        return devstage::Status(failed.code(), failed.message() + " after enqueuing copies 0 to " +
                                                   std::to_string(half) + " of " + std::to_string(count));
    }

    void book(std::set<void*>& live, void* pointer) noexcept {
        std::lock_guard lock(books_mutex_);
        live.insert(pointer);
    }
    void unbook(std::set<void*>& live, std::set<void*>& orphans, void* pointer) noexcept {
        std::lock_guard lock(books_mutex_);
        live.erase(pointer);
        orphans.erase(pointer);
    }
    void orphan(std::set<void*>& orphans, void* pointer) noexcept {
        std::lock_guard lock(books_mutex_);
        orphans.insert(pointer);
    }
    void count(std::int64_t& counter, std::int64_t by) noexcept {
        std::lock_guard lock(books_mutex_);
        counter += by;
    }
    // The pinned block that holds `host`, or null.
    void* pinned_block_of(const void* host) noexcept {
        std::lock_guard lock(books_mutex_);
        const auto at = reinterpret_cast<std::uintptr_t>(host);
        for (const auto& [block, bytes] : pinned_) {
            const auto begin = reinterpret_cast<std::uintptr_t>(block);
            if (at >= begin && at < begin + bytes) return block;
        }
        return nullptr;
    }

    mutable std::mutex plan_mutex_;
    FaultPlan plan_;
    bool armed_ = false;
    unsigned calls_ = 0;
    unsigned fired_ = 0;
    unsigned fired_gives_back_ = 0;
    std::string fired_log_;
    std::array<std::uint64_t, fault_op_count> total_{};

    mutable std::mutex books_mutex_;
    std::set<void*> device_, mapped_;
    std::map<void*, std::size_t> pinned_;
    std::int64_t events_ = 0, streams_ = 0;
    std::set<void*> orphan_device_, orphan_pinned_, orphan_mapped_;
    using Streams = std::vector<FStream>;
    using Events = std::vector<FEvent>;
    Streams orphan_streams_;
    Events orphan_events_;
};

}  // namespace sequential
