// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Stager: stages a run's host tensors on the device through a strategy, hands back device
/// pointers and leases, and at the end of the run copies back what it must and releases
/// exactly what it owns.

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/tensor.hpp"

namespace devstage {

class StagedRun;

namespace detail {
/// What a StagedRun calls back into; implemented by every Stager.
class RunOwner {
public:
    virtual void drop_run(std::size_t slot) noexcept = 0;
    virtual void relink_run(std::size_t slot, StagedRun* handle) noexcept = 0;

protected:
    RunOwner() = default;
    RunOwner(const RunOwner&) = default;
    RunOwner& operator=(const RunOwner&) = default;
    ~RunOwner() = default;
};
}  // namespace detail

/// A live run: the device view of its args and the leases that back them. Move-only.
/// `auto run = stager.bind(args); launch(run->device_args()); (void)stager.finish(std::move(*run));`
/// Destroyed without finish, it releases its leases without copying back. Once its stager
/// finished, released or abandoned it, the handle is inert.
class StagedRun {
public:
    StagedRun(StagedRun&& other) noexcept { take(other); }
    StagedRun& operator=(StagedRun&& other) noexcept {
        if (this != &other) {
            reset();
            take(other);
        }
        return *this;
    }
    StagedRun(const StagedRun&) = delete;
    StagedRun& operator=(const StagedRun&) = delete;
    ~StagedRun() { reset(); }

    /// The args in input order: staged ones point at device memory (Placement::Device),
    /// Device args are unchanged, zero-byte args have a null pointer.
    std::span<const TensorArg> device_args() const noexcept { return device_args_; }
    /// One lease per staged arg and per Device arg with bytes, in input order.
    std::span<const TensorLease> leases() const noexcept { return leases_; }
    /// False once finished, dropped by its stager, or moved from.
    bool live() const noexcept { return owner_ != nullptr; }

private:
    template <Backend, class>
    friend class Stager;

    StagedRun(detail::RunOwner* owner, std::size_t slot, std::span<const TensorArg> device_args,
              std::span<const TensorLease> leases) noexcept
        : owner_(owner), slot_(slot), device_args_(device_args), leases_(leases) {
        owner_->relink_run(slot_, this);
    }

    void take(StagedRun& other) noexcept {
        owner_ = std::exchange(other.owner_, nullptr);
        slot_ = other.slot_;
        device_args_ = std::exchange(other.device_args_, {});
        leases_ = std::exchange(other.leases_, {});
        if (owner_ != nullptr) owner_->relink_run(slot_, this);
    }
    void reset() noexcept {
        if (detail::RunOwner* owner = std::exchange(owner_, nullptr)) owner->drop_run(slot_);
        device_args_ = {};
        leases_ = {};
    }
    void unlink() noexcept {
        owner_ = nullptr;
        device_args_ = {};
        leases_ = {};
    }

    detail::RunOwner* owner_ = nullptr;
    std::size_t slot_ = 0;
    std::span<const TensorArg> device_args_;
    std::span<const TensorLease> leases_;
};

/// Stages runs for one runner on one backend. Runs on one pipeline slot are serial: a bind
/// while every slot holds a live run fails with Errc::busy.
/// `Stager<SimBackend> stager(sim); auto run = stager.bind(args);`
///
/// The backend must outlive the stager. Not thread-safe: one runner drives it.
/// With `pipeline_slots` > 1, each slot has its own strategy instance (its own retained
/// buffer), so run k+1 can bind while run k executes; live runs never share bytes.
template <Backend B, class Strategy = RetainedBump<>>
class Stager final : private detail::RunOwner {
public:
    explicit Stager(B& backend, Strategy strategy = {}, std::size_t pipeline_slots = 1) : backend_(&backend) {
        slots_.reserve(std::max<std::size_t>(pipeline_slots, 1));
        for (std::size_t i = 1; i < pipeline_slots; ++i) slots_.emplace_back(Strategy(strategy));
        slots_.emplace_back(std::move(strategy));
    }
    Stager(const Stager&) = delete;
    Stager& operator=(const Stager&) = delete;
    ~Stager() {
        if (Status status = release(); !status) sink_(status);
    }

    /// Plans, grows if needed, takes device memory for every staged arg and uploads In/InOut
    /// args. On failure everything taken is released and the stager is ready for the next bind.
    Result<StagedRun> bind(std::span<const TensorArg> args) noexcept {
        const auto free_slot = std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.live; });
        if (free_slot == slots_.end()) {
            return Status(Errc::busy, detail::message("stager bind: all ", slots_.size(),
                                                      " pipeline slot(s) hold a live run on backend '",
                                                      backend_->name(), "'; finish one first"));
        }
        Slot& slot = *free_slot;
        if (Status planned = slot.plan.assign(args, Strategy::alignment); !planned) {
            return Status(planned.code(),
                          detail::message(planned.message(), " (stager on backend '", backend_->name(), "')"));
        }
        if (Status prepared = slot.strategy.prepare(*backend_, slot.plan, stats_); !prepared) return prepared;

        if (slot.lease_storage.size() < args.size()) slot.lease_storage.resize(args.size());
        slot.lease_count = 0;
        slot.device_args.assign(args.begin(), args.end());
        if (Status staged = stage(slot, args); !staged) {
            (void)release_leases(slot);
            return staged;
        }
        slot.live = true;
        ++stats_.runs;
        stats_.high_water_bytes = std::max<std::uint64_t>(stats_.high_water_bytes, slot.plan.required_bytes());
        const std::size_t index = static_cast<std::size_t>(free_slot - slots_.begin());
        return StagedRun(this, index, slot.device_args, slot.leases());
    }

    /// Ends a run: copies back Out/InOut args when `execution` is ok, releases every lease by
    /// its kind, and returns the first error of its own copy-backs and releases (it does not
    /// echo `execution`). A run of another stager, or one no longer live, is invalid_argument
    /// and is left untouched.
    Status finish(StagedRun&& run, const Status& execution = {}) noexcept {
        if (run.owner_ != static_cast<detail::RunOwner*>(this)) {
            return Status(Errc::invalid_argument,
                          run.owner_ == nullptr
                              ? detail::message("stager finish: the run is not live (finished, moved from, or "
                                                "dropped by release/abandon) on backend '",
                                                backend_->name(), "'")
                              : detail::message("stager finish: the run belongs to another stager (backend '",
                                                backend_->name(), "')"));
        }
        Slot& slot = slots_[run.slot_];
        Status first;
        std::uint64_t skipped = 0, copied_back = 0;
        for (const TensorLease& lease : slot.leases()) {
            if (lease.release_kind == ReleaseKind::ExternalNoop) continue;
            if (!lease.copy_back || !execution.ok()) {
                ++skipped;
                continue;
            }
            Status copied = backend_->copy_from_device(lease.host, lease.device, lease.bytes);
            if (copied) {
                copied_back += lease.bytes;
            } else if (first.ok()) {
                first = Status(copied.code(), detail::message("stager finish: copy back of ", lease.bytes,
                                                              " bytes failed on backend '", backend_->name(),
                                                              "': ", copied.message()));
            }
        }
        stats_.copy_backs_skipped += skipped;
        stats_.bytes_from_device += copied_back;
        Status released = release_leases(slot);
        if (first.ok()) first = std::move(released);
        unlink_handle(slot);
        return first;
    }

    /// Gives back all device memory now: a live run's leases first (no copy-back; its handle
    /// becomes inert), then every retained buffer. The stager stays usable.
    Status release() noexcept {
        Status first;
        for (Slot& slot : slots_) {
            if (slot.live) {
                Status dropped = end_live_run(slot);
                if (first.ok()) first = std::move(dropped);
            }
            Status freed = slot.strategy.release_retained(*backend_, stats_);
            if (first.ok()) first = std::move(freed);
        }
        return first;
    }

    /// Forgets all device memory without calling the backend, for after a device reset has
    /// invalidated it. Live run handles become inert. The stager stays usable.
    void abandon() noexcept {
        for (Slot& slot : slots_) {
            if (slot.live) {
                slot.lease_count = 0;
                unlink_handle(slot);
            }
            slot.strategy.abandon(stats_);
        }
    }

    const StagerStats& stats() const noexcept { return stats_; }
    /// The strategy instance of one pipeline slot (its retained buffer, for inspection).
    const Strategy& strategy(std::size_t slot = 0) const noexcept { return slots_[slot].strategy; }
    std::size_t pipeline_slots() const noexcept { return slots_.size(); }
    std::size_t live_runs() const noexcept {
        return static_cast<std::size_t>(
            std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.live; }));
    }
    B& backend() const noexcept { return *backend_; }
    /// Where failures with no caller to return to (a dropped run, the destructor) are reported.
    void set_error_sink(ErrorSink sink) noexcept { sink_ = sink; }

private:
    struct Slot {
        explicit Slot(Strategy s) : strategy(std::move(s)) {}
        Strategy strategy;
        StagingPlan plan;
        std::vector<TensorLease> lease_storage;  // only grows; the first lease_count are live
        std::size_t lease_count = 0;
        std::span<TensorLease> leases() noexcept { return {lease_storage.data(), lease_count}; }
        std::vector<TensorArg> device_args;
        StagedRun* handle = nullptr;
        bool live = false;
    };

    // One pass over the args: a lease per staged or Device arg, the device view, and the
    // upload of In/InOut args. On error the leases taken so far are in slot.leases(), for the
    // caller to release. Counters are summed locally and stored once: a store per tensor into
    // stats_ would chain every iteration through memory.
    Status stage(Slot& slot, std::span<const TensorArg> args) noexcept {
        std::uint64_t skipped = 0, uploaded = 0;
        Status status;
        auto planned = slot.plan.tensors().begin();
        for (std::size_t index = 0; index < args.size(); ++index) {
            const TensorArg& arg = args[index];
            TensorArg& device_arg = slot.device_args[index];
            if (arg.bytes == 0) {
                device_arg.data = nullptr;
                device_arg.placement = Placement::Device;
                continue;
            }
            if (arg.placement == Placement::Device) {
                slot.lease_storage[slot.lease_count++] =
                    TensorLease{nullptr, arg.data, arg.bytes, false, ReleaseKind::ExternalNoop};
                continue;
            }
            TensorLease& lease = slot.lease_storage[slot.lease_count];
            if (Status acquired = slot.strategy.acquire(*backend_, *planned++, arg, lease, stats_); !acquired) {
                status = std::move(acquired);
                break;
            }
            ++slot.lease_count;
            device_arg.data = lease.device;
            device_arg.placement = Placement::Device;
            if (!uploads(arg.direction)) {
                ++skipped;
                continue;
            }
            if (Status copied = backend_->copy_to_device(lease.device, lease.host, lease.bytes); !copied) {
                status = Status(copied.code(), detail::message("stager bind: upload of arg ", index, " (", lease.bytes,
                                                               " bytes) failed on backend '", backend_->name(),
                                                               "': ", copied.message()));
                break;
            }
            uploaded += lease.bytes;
        }
        stats_.uploads_skipped += skipped;
        stats_.bytes_to_device += uploaded;
        return status;
    }

    Status release_leases(Slot& slot) noexcept {
        Status first;
        for (TensorLease& lease : slot.leases()) {
            if (lease.release_kind != ReleaseKind::Free || lease.allocation == nullptr) continue;  // nothing to free
            Status released = devstage::release(*backend_, lease);
            ++stats_.device_frees;
            if (!released && first.ok()) {
                first = Status(released.code(), detail::message("stager: releasing a lease of ", lease.bytes,
                                                                " bytes failed on backend '", backend_->name(),
                                                                "': ", released.message()));
            }
        }
        slot.lease_count = 0;
        slot.live = false;
        return first;
    }

    Status end_live_run(Slot& slot) noexcept {
        for (const TensorLease& lease : slot.leases()) {
            if (lease.release_kind != ReleaseKind::ExternalNoop) ++stats_.copy_backs_skipped;
        }
        unlink_handle(slot);
        return release_leases(slot);
    }

    void unlink_handle(Slot& slot) noexcept {
        if (slot.handle != nullptr) slot.handle->unlink();
        slot.handle = nullptr;
        slot.live = false;
    }

    void drop_run(std::size_t slot) noexcept override {
        Slot& s = slots_[slot];
        s.handle = nullptr;
        if (Status status = end_live_run(s); !status) sink_(status);
    }
    void relink_run(std::size_t slot, StagedRun* handle) noexcept override { slots_[slot].handle = handle; }

    B* backend_;
    std::vector<Slot> slots_;
    StagerStats stats_;
    ErrorSink sink_;
};

}  // namespace devstage
