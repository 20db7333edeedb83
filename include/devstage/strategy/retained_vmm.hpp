// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// RetainedVmm: a retained buffer that grows in place. It reserves one device address range
/// once and maps more physical memory at the end of it when a run needs more: the base address
/// never changes, nothing is freed or copied on growth, and a grow that fails leaves the
/// buffer already mapped intact. Needs a VirtualMemoryBackend.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/lease.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"

namespace devstage {

/// Temporary-buffer strategy with in-place growth. `Stager<SimBackend, RetainedVmm<>> s(sim);`
/// `reserve_bytes` bounds the buffer (rounded up to the backend's granularity); a plan that
/// needs more is out_of_memory ("reservation exhausted"). Leases are ReleaseKind::BufferNoop.
/// Copying copies the configuration, not the mapping; moving transfers it.
template <std::size_t Alignment = 1024>
class RetainedVmm {
    static_assert(Alignment > 0 && (Alignment & (Alignment - 1)) == 0, "Alignment must be a power of two");

public:
    static constexpr std::size_t alignment = Alignment;
    static constexpr ReleaseKind lease_kind = ReleaseKind::BufferNoop;

    RetainedVmm() noexcept = default;
    explicit RetainedVmm(std::size_t reserve_bytes) noexcept : reserve_bytes_(reserve_bytes) {}
    RetainedVmm(const RetainedVmm& other) noexcept : reserve_bytes_(other.reserve_bytes_) {}
    RetainedVmm(RetainedVmm&& other) noexcept
        : reserve_bytes_(other.reserve_bytes_),
          base_(std::exchange(other.base_, nullptr)),
          reserved_(std::exchange(other.reserved_, 0)),
          mapped_(std::exchange(other.mapped_, 0)),
          chunks_(std::move(other.chunks_)) {}
    RetainedVmm& operator=(const RetainedVmm&) = delete;
    RetainedVmm& operator=(RetainedVmm&&) = delete;
    ~RetainedVmm() = default;  // the owner releases or abandons first

    template <VirtualMemoryBackend B>
    Status prepare(B& backend, const Requirement& need, StagerStats& stats, FreeQueue<B>& /*queue*/) noexcept {
        const std::size_t required = need.device_bytes;
        if (required <= mapped_) return {};
        const std::size_t granularity = backend.vmm_granularity();
        if (granularity == 0) {
            return fail(stats, Status(Errc::not_supported, detail::message("vmm: backend '", backend.name(),
                                                                           "' offers no virtual memory here")));
        }
        if (base_ == nullptr) {
            const auto reserve = detail::round_up(reserve_bytes_, granularity);
            if (!reserve) return fail(stats, Status(Errc::invalid_argument, "vmm reservation size overflows"));
            Result<void*> base = backend.vmm_reserve(*reserve);
            if (!base) return fail(stats, base.status());
            if (!detail::is_aligned(*base, Alignment)) {
                (void)backend.vmm_release(*base);
                return fail(stats, Status(Errc::backend_failure,
                                          detail::message("vmm reservation at ", static_cast<const void*>(*base),
                                                          " is not aligned to ", Alignment)));
            }
            base_ = *base;
            reserved_ = *reserve;
        }
        const auto target = detail::round_up(required, granularity);
        if (!target || *target > reserved_) {
            return fail(stats, Status(Errc::out_of_memory, detail::message("vmm reservation exhausted: plan requires ",
                                                                           required, " bytes, reserved ", reserved_,
                                                                           " on backend '", backend.name(), "'")));
        }
        const std::size_t grow = *target - mapped_;
        auto handle = backend.vmm_create(grow);
        if (!handle) {
            return fail(stats, Status(handle.status().code(),
                                      detail::message("vmm grow failed: ", grow, " more bytes (mapped ", mapped_,
                                                      ", plan requires ", required, ") from backend '", backend.name(),
                                                      "': ", handle.status().message())));
        }
        ++stats.device_mallocs;
        void* at = static_cast<std::byte*>(base_) + mapped_;
        if (Status mapped = backend.vmm_map(at, grow, *handle); !mapped) {
            ++stats.device_frees;
            if (Status freed = backend.vmm_free(*handle); !freed) {
                ++stats.free_failures;
                return fail(stats,
                            Status(mapped.code(), detail::message(mapped.message(), "; freeing the unmapped chunk of ",
                                                                  grow, " bytes failed too: ", freed.message())));
            }
            return fail(stats, mapped);
        }
        chunks_.push_back(Chunk{to_bits(*handle), mapped_, grow, false});
        mapped_ += grow;
        ++stats.regrows;
        stats.retained_bytes += grow;
        return {};
    }

    /// Unmaps and frees every chunk (last first), then releases the reservation. The first
    /// failure stops it: what is still mapped (or reserved) stays recorded, so a later release
    /// retries from there; nothing is forgotten.
    template <VirtualMemoryBackend B>
    Status release_retained(B& backend, StagerStats& stats) noexcept {
        while (!chunks_.empty()) {
            Chunk& chunk = chunks_.back();
            if (!chunk.unmapped) {
                if (Status unmapped = backend.vmm_unmap(static_cast<std::byte*>(base_) + chunk.offset, chunk.bytes);
                    !unmapped) {
                    return stop(stats, unmapped, "unmapping");
                }
                chunk.unmapped = true;
                stats.retained_bytes -= chunk.bytes;
                mapped_ -= chunk.bytes;
            }
            ++stats.device_frees;
            if (Status freed = backend.vmm_free(from_bits<typename B::PhysicalHandle>(chunk.handle)); !freed) {
                return stop(stats, freed, "freeing");
            }
            chunks_.pop_back();
        }
        if (base_ != nullptr) {
            if (Status released = backend.vmm_release(base_); !released) return stop(stats, released, "releasing");
        }
        base_ = nullptr;
        reserved_ = 0;
        mapped_ = 0;
        return {};
    }

    void abandon(StagerStats& stats) noexcept {
        stats.retained_bytes -= mapped_;
        chunks_.clear();
        base_ = nullptr;
        reserved_ = mapped_ = 0;
    }

    /// Mapped bytes from the base.
    std::size_t capacity() const noexcept { return mapped_; }
    void* base() const noexcept { return base_; }
    std::size_t reserved() const noexcept { return reserved_; }

private:
    // A backend's PhysicalHandle is an integer or a pointer; chunks store its bits.
    template <class H>
    static std::uintptr_t to_bits(H handle) noexcept {
        if constexpr (std::is_pointer_v<H>) {
            return reinterpret_cast<std::uintptr_t>(handle);
        } else {
            return static_cast<std::uintptr_t>(handle);
        }
    }
    template <class H>
    static H from_bits(std::uintptr_t bits) noexcept {
        if constexpr (std::is_pointer_v<H>) {
            return reinterpret_cast<H>(bits);
        } else {
            return static_cast<H>(bits);
        }
    }

    struct Chunk {
        std::uintptr_t handle;
        std::size_t offset;
        std::size_t bytes;
        bool unmapped = false;  // unmapped, but its physical memory not yet freed
    };

    static Status fail(StagerStats& stats, Status status) noexcept {
        ++stats.grow_failures;
        return status;
    }

    Status stop(StagerStats& stats, const Status& cause, const char* what) const noexcept {
        ++stats.free_failures;
        return Status(cause.code(),
                      detail::message("vmm release stopped ", what, " (", chunks_.size(), " chunk(s), ", mapped_,
                                      " bytes still mapped; release again to retry): ", cause.message()));
    }

    std::size_t reserve_bytes_ = std::size_t{64} << 30;
    void* base_ = nullptr;
    std::size_t reserved_ = 0;
    std::size_t mapped_ = 0;
    std::vector<Chunk> chunks_;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
