// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Completion: the end of a stream-ordered run. Its copy-backs write the caller's memory
/// asynchronously, so the outputs are valid once wait() returned ok (or ready() answered true).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <utility>

#include "devstage/status.hpp"

namespace devstage {

class Completion;

namespace detail {

/// What a Completion calls back into; implemented by every Stager. The owner keeps its
/// unsettled completions in an intrusive list (no allocation per run), so it can hand each its
/// result when the run is settled, whoever settles it, and leave none dangling when it dies.
class CompletionOwner {
public:
    /// Blocks until the run of `completion` completed and settles it; `completion` then holds
    /// its result. When its work cannot be waited for, nothing is settled: `completion` stays
    /// pending and the failure is returned.
    virtual Status settle_completion(Completion& completion) noexcept = 0;
    /// Settles the run of `completion` if it completed, without blocking.
    virtual Result<bool> poll_completion(Completion& completion) noexcept = 0;
    /// Settles slot `slot` through generation `generation` (a completion given up on: a
    /// failure then goes to the owner's error sink).
    virtual void settle_unwatched(std::size_t slot, std::uint64_t generation) noexcept = 0;
    /// The completion of run `generation` on `slot`, which held that slot (a frame's run), is
    /// destroyed or detached: the slot may be taken again.
    virtual void release_hold(std::size_t slot, std::uint64_t generation) noexcept = 0;

    /// Links `completion` to run `generation` of `slot`; `holds`: it holds the slot until it
    /// is destroyed or detached, even once resolved.
    inline void link(Completion& completion, std::size_t slot, std::uint64_t generation, bool holds) noexcept;
    /// Hands `result` to every unresolved completion of `slot` up to `generation` and unlinks
    /// those that hold nothing; returns how many there were.
    inline std::size_t resolve(std::size_t slot, std::uint64_t generation, const Status& result) noexcept;
    /// Hands `result` to every unresolved completion and unlinks all (holds end with the owner).
    inline void resolve_all(const Status& result) noexcept;

protected:
    static std::size_t slot_of(const Completion& completion) noexcept;

    CompletionOwner() = default;
    CompletionOwner(const CompletionOwner&) = delete;
    CompletionOwner& operator=(const CompletionOwner&) = delete;
    ~CompletionOwner() = default;

private:
    friend class devstage::Completion;
    Completion* head_ = nullptr;
};

}  // namespace detail

/// The pending end of a run finished on a stream. Move-only; used on the stager's thread.
/// `auto done = stager.finish(std::move(*run), stream); if (done) (void)done->wait();`
///
/// wait() blocks until the run's copy-backs (and packed outputs) reached the caller's memory
/// and reports the first failure of the run's own enqueued work as far as the backend can tell;
/// ready() never blocks; detach() gives up waiting (the stager settles the run later, reporting
/// a failure to its error sink). The destructor waits unless detached. A default-constructed
/// Completion is complete and ok. The Completion of a frame's run holds that frame (its slot's
/// mirror) for the engine until it is destroyed or detached, whether or not it was waited for.
///
/// A wait that fails without the run's work being known complete (the slot's event cannot be
/// waited for, and the backend has no synchronize() or it failed too) returns the failure and
/// leaves the Completion pending(): the run's host memory is still devstage's (the device may
/// still write its outputs), nothing is settled, and a later wait() tries again; once one
/// succeeds the outputs are delivered, packed ones included. The engine's ways out: wait()
/// again, synchronize the device and wait() again, or Stager::abandon() (the outputs are then
/// lost, and the memory the device may still write is the engine's to keep away from). A
/// destructor that cannot wait reports to the stager's error sink and leaves the slot to a
/// later wait of the stager's (release(), a bind that takes the slot): until then the run's
/// host memory is not the engine's to reuse.
class [[nodiscard]] Completion {
public:
    Completion() noexcept = default;
    Completion(Completion&& other) noexcept { take(other); }
    Completion& operator=(Completion&& other) noexcept {
        if (this != &other) {
            give_up_waiting_or_wait();
            take(other);
        }
        return *this;
    }
    Completion(const Completion&) = delete;
    Completion& operator=(const Completion&) = delete;
    ~Completion() { give_up_waiting_or_wait(); }

    /// Blocks until the run completed; its failure, or ok. Repeated calls return the same once
    /// it is complete; while a wait fails and the work stays pending, each call waits again.
    Status wait() noexcept {
        if (owner_ != nullptr && !resolved_) {
            Status failed = owner_->settle_completion(*this);
            if (owner_ != nullptr && !resolved_) return failed;  // still pending: not settled
        }
        return result_;
    }

    /// True once the run completed (its outputs are then in place); never blocks. A failed
    /// query is returned as an error; the run's own failure is then given by wait().
    Result<bool> ready() noexcept {
        if (owner_ == nullptr || resolved_) return true;
        return owner_->poll_completion(*this);
    }

    /// Stops watching the run: the destructor will not wait, and a later failure goes to the
    /// stager's error sink. The outputs still arrive, when the stager next settles the slot. A
    /// frame's run gives its frame back to the stager.
    void detach() noexcept {
        if (owner_ == nullptr) return;
        detail::CompletionOwner* owner = owner_;
        const bool holds = holds_;
        unlink();
        if (holds) owner->release_hold(slot_, generation_);
    }

    /// True while the run is watched and not yet known complete (a failed wait leaves it so).
    bool pending() const noexcept { return owner_ != nullptr && !resolved_; }

private:
    friend class detail::CompletionOwner;

    void take(Completion& other) noexcept {
        owner_ = other.owner_;
        slot_ = other.slot_;
        generation_ = other.generation_;
        resolved_ = other.resolved_;
        holds_ = other.holds_;
        result_ = std::move(other.result_);
        prev_ = other.prev_;
        next_ = other.next_;
        if (owner_ != nullptr) {
            (prev_ != nullptr ? prev_->next_ : owner_->head_) = this;
            if (next_ != nullptr) next_->prev_ = this;
        }
        other.owner_ = nullptr;
        other.prev_ = other.next_ = nullptr;
        other.resolved_ = other.holds_ = false;
        other.result_ = {};
    }

    void unlink() noexcept {
        if (owner_ == nullptr) return;
        (prev_ != nullptr ? prev_->next_ : owner_->head_) = next_;
        if (next_ != nullptr) next_->prev_ = prev_;
        owner_ = nullptr;
        prev_ = next_ = nullptr;
    }

    void give_up_waiting_or_wait() noexcept {
        if (owner_ == nullptr) return;
        detail::CompletionOwner* owner = owner_;
        const std::size_t slot = slot_;
        const std::uint64_t generation = generation_;
        const bool resolved = resolved_;
        const bool holds = holds_;
        unlink();  // nobody reads the result now: a failure goes to the sink
        if (!resolved) owner->settle_unwatched(slot, generation);
        if (holds) owner->release_hold(slot, generation);
    }

    detail::CompletionOwner* owner_ = nullptr;
    std::size_t slot_ = 0;
    std::uint64_t generation_ = 0;
    bool resolved_ = false;  // result_ is final (a holding completion stays linked)
    bool holds_ = false;     // holds its slot (a frame's run) until destroyed or detached
    Status result_;
    Completion* prev_ = nullptr;
    Completion* next_ = nullptr;
};

namespace detail {

inline std::size_t CompletionOwner::slot_of(const Completion& completion) noexcept {
    return completion.slot_;
}

inline void CompletionOwner::link(Completion& completion, std::size_t slot, std::uint64_t generation,
                                  bool holds) noexcept {
    completion.owner_ = this;
    completion.slot_ = slot;
    completion.generation_ = generation;
    completion.resolved_ = false;
    completion.holds_ = holds;
    completion.prev_ = nullptr;
    completion.next_ = head_;
    if (head_ != nullptr) head_->prev_ = &completion;
    head_ = &completion;
}

inline std::size_t CompletionOwner::resolve(std::size_t slot, std::uint64_t generation, const Status& result) noexcept {
    std::size_t resolved = 0;
    for (Completion* c = head_; c != nullptr;) {
        Completion* next = c->next_;
        if (c->slot_ == slot && c->generation_ <= generation && !c->resolved_) {
            c->result_ = result;
            c->resolved_ = true;
            if (!c->holds_) c->unlink();
            ++resolved;
        }
        c = next;
    }
    return resolved;
}

inline void CompletionOwner::resolve_all(const Status& result) noexcept {
    while (head_ != nullptr) {
        Completion* c = head_;
        if (!c->resolved_) c->result_ = result;
        c->unlink();
    }
}

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
