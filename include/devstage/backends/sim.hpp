// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// SimBackend: an accelerator simulated in host memory, the default backend of the examples
/// and benchmarks. Device memory is mmap'd per allocation (a fresh allocation costs page
/// faults, as on a device), capacity is configurable (out-of-memory is reproducible), pinned
/// memory is really page-locked, and copies from pageable memory go through a bounded bounce
/// buffer in chunks, as drivers do — so pinned vs pageable is measurable without a device.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>

#include "devstage/backend.hpp"
#include "devstage/detail/address_map.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// Construction options of a SimBackend. `SimBackend sim(SimConfig{.device_capacity = 1 << 20});`
struct SimConfig {
    std::size_t device_capacity = std::size_t{64} << 30;     ///< bytes device_malloc may hand out
    std::size_t bounce_buffer_bytes = std::size_t{2} << 20;  ///< chunk size of pageable copies
    bool lock_pinned = true;  ///< mlock pinned allocations (refusal is tolerated and reported)
};

/// Counters of a SimBackend since construction.
struct SimStats {
    std::uint64_t device_mallocs = 0, device_frees = 0;
    std::uint64_t pinned_mallocs = 0, pinned_frees = 0;
    std::uint64_t pinned_lock_failures = 0;  ///< pinned allocations left unlocked (mlock refused)
    std::uint64_t copies_to_device = 0, copies_from_device = 0, memsets = 0, synchronizes = 0;
    std::uint64_t bytes_to_device = 0, bytes_from_device = 0;
    std::uint64_t bounced_bytes = 0;  ///< bytes that went through the bounce buffer (pageable)
    std::uint64_t direct_bytes = 0;   ///< bytes copied directly (from or to pinned memory)
    std::uint64_t failed_calls = 0;
    std::uint64_t live_device_bytes = 0, peak_device_bytes = 0, live_pinned_bytes = 0;
    std::uint64_t vmm_reservations = 0;  ///< live reserved address ranges
    std::uint64_t vmm_chunks = 0;        ///< live physical chunks
    std::uint64_t vmm_mapped_bytes = 0;  ///< bytes mapped into reservations now
};

/// The simulated accelerator. Thread-safe. `SimBackend sim; Stager<SimBackend> stager(sim);`
class SimBackend {
public:
    static constexpr std::size_t device_alignment = 256;

    SimBackend() noexcept : SimBackend(SimConfig{}) {}
    explicit SimBackend(SimConfig config) noexcept : config_(config) {
        config_.bounce_buffer_bytes = std::max<std::size_t>(config_.bounce_buffer_bytes, 4096);
    }
    SimBackend(const SimBackend&) = delete;
    SimBackend& operator=(const SimBackend&) = delete;
    /// Unmaps whatever is still allocated.
    ~SimBackend() {
        device_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.info); });
        reservations_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.bytes); });
        pinned_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.info.mapped); });
        if (bounce_ != nullptr) ::munmap(bounce_, config_.bounce_buffer_bytes);
    }

    std::string_view name() const noexcept { return "sim"; }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0) return fail(Errc::invalid_argument, detail::message("sim device_malloc: 0 bytes requested"));
        if (bytes > config_.device_capacity - stats_.live_device_bytes) {
            return fail(Errc::out_of_memory,
                        detail::message("sim device_malloc: ", bytes, " bytes requested, ", stats_.live_device_bytes,
                                        " of ", config_.device_capacity, " bytes in use"));
        }
        const std::size_t mapped = round_to_page(bytes);
        void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory, detail::message("sim device_malloc: mmap of ", mapped, " bytes failed"));
        }
        device_.insert(base, bytes, mapped);
        ++stats_.device_mallocs;
        stats_.live_device_bytes += bytes;
        stats_.peak_device_bytes = std::max(stats_.peak_device_bytes, stats_.live_device_bytes);
        return base;
    }

    Status device_free(void* pointer) noexcept {
        std::lock_guard lock(mutex_);
        const auto entry = device_.erase(pointer);
        if (!entry) {
            return fail(Errc::unknown_pointer, detail::message("sim device_free: ", static_cast<const void*>(pointer),
                                                               " is not a live device allocation"));
        }
        ::munmap(pointer, entry->info);
        ++stats_.device_frees;
        stats_.live_device_bytes -= entry->bytes;
        return {};
    }

    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        return copy(device_dst, host_src, bytes, host_src, device_dst, "copy_to_device");
    }

    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        return copy(host_dst, device_src, bytes, host_dst, device_src, "copy_from_device");
    }

    Status device_memset(void* device_dst, int value, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes > 0 && !is_device(device_dst, bytes)) {
            return fail(Errc::invalid_argument,
                        detail::message("sim device_memset: ", bytes, " bytes at ",
                                        static_cast<const void*>(device_dst), " are not inside one device allocation"));
        }
        if (bytes > 0) std::memset(device_dst, value, bytes);
        ++stats_.memsets;
        return {};
    }

    /// Copies are synchronous in the simulator; this only counts.
    Status synchronize() noexcept {
        std::lock_guard lock(mutex_);
        ++stats_.synchronizes;
        return {};
    }

    /// Page-locked host memory: mmap'd, pre-faulted and mlock'd. When mlock is refused
    /// (RLIMIT_MEMLOCK) the allocation still succeeds, unlocked; pinned_locked() tells.
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0) return fail(Errc::invalid_argument, detail::message("sim pinned_malloc: 0 bytes requested"));
        const std::size_t mapped = round_to_page(bytes);
        void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory, detail::message("sim pinned_malloc: mmap of ", mapped, " bytes failed"));
        }
        const bool locked = config_.lock_pinned && ::mlock(base, mapped) == 0;
        if (!locked) ++stats_.pinned_lock_failures;
        pinned_.insert(base, bytes, PinnedInfo{mapped, locked});
        ++stats_.pinned_mallocs;
        stats_.live_pinned_bytes += bytes;
        return base;
    }

    Status pinned_free(void* pointer) noexcept {
        std::lock_guard lock(mutex_);
        const auto entry = pinned_.erase(pointer);
        if (!entry) {
            return fail(Errc::unknown_pointer, detail::message("sim pinned_free: ", static_cast<const void*>(pointer),
                                                               " is not a live pinned allocation"));
        }
        ::munmap(pointer, entry->info.mapped);  // also unlocks
        ++stats_.pinned_frees;
        stats_.live_pinned_bytes -= entry->bytes;
        return {};
    }

    // ---- virtual memory: in-place growth -------------------------------------------------
    // A reservation is an mmap(PROT_NONE) range; a physical chunk is capacity accounting until
    // mapped, when its pages become an anonymous MAP_FIXED mapping inside the range. Chunks
    // map contiguously from the start of a reservation and unmap from its end.
    using PhysicalHandle = std::uint64_t;

    std::size_t vmm_granularity() const noexcept { return std::size_t{64} << 10; }

    Result<void*> vmm_reserve(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0 || bytes % vmm_granularity() != 0) {
            return fail(Errc::invalid_argument,
                        detail::message("sim vmm_reserve: ", bytes,
                                        " bytes is not a positive multiple of the granularity ", vmm_granularity()));
        }
        void* base = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory,
                        detail::message("sim vmm_reserve: ", bytes, " bytes of address space refused"));
        }
        reservations_.insert(base, bytes, 0);
        ++stats_.vmm_reservations;
        return base;
    }

    Status vmm_release(void* base) noexcept {
        std::lock_guard lock(mutex_);
        const auto* reservation = reservations_.at(base);
        if (reservation == nullptr || reservation->info != 0) {
            return fail(reservation == nullptr ? Errc::unknown_pointer : Errc::busy,
                        detail::message("sim vmm_release: ", static_cast<const void*>(base),
                                        reservation == nullptr ? " is not a reservation" : " still has mapped chunks"));
        }
        ::munmap(base, reservation->bytes);
        (void)reservations_.erase(base);
        --stats_.vmm_reservations;
        return {};
    }

    Result<PhysicalHandle> vmm_create(std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (bytes == 0 || bytes % vmm_granularity() != 0) {
            return fail(
                Errc::invalid_argument,
                detail::message("sim vmm_create: ", bytes, " bytes is not a positive multiple of the granularity"));
        }
        if (bytes > config_.device_capacity - stats_.live_device_bytes) {
            return fail(Errc::out_of_memory,
                        detail::message("sim vmm_create: ", bytes, " bytes requested, ", stats_.live_device_bytes,
                                        " of ", config_.device_capacity, " bytes in use"));
        }
        const PhysicalHandle handle = ++next_handle_;
        chunks_.emplace(handle, Chunk{bytes, nullptr});
        stats_.live_device_bytes += bytes;
        stats_.peak_device_bytes = std::max(stats_.peak_device_bytes, stats_.live_device_bytes);
        ++stats_.vmm_chunks;
        return handle;
    }

    Status vmm_free(PhysicalHandle handle) noexcept {
        std::lock_guard lock(mutex_);
        const auto found = chunks_.find(handle);
        if (found == chunks_.end() || found->second.mapped_at != nullptr) {
            return fail(found == chunks_.end() ? Errc::unknown_pointer : Errc::busy,
                        detail::message("sim vmm_free: chunk ", handle,
                                        found == chunks_.end() ? " is unknown" : " is still mapped"));
        }
        stats_.live_device_bytes -= found->second.bytes;
        chunks_.erase(found);
        --stats_.vmm_chunks;
        return {};
    }

    Status vmm_map(void* address, std::size_t bytes, PhysicalHandle handle) noexcept {
        std::lock_guard lock(mutex_);
        const auto chunk = chunks_.find(handle);
        const auto* reservation = reservations_.containing(address, bytes);
        if (chunk == chunks_.end() || chunk->second.mapped_at != nullptr || chunk->second.bytes != bytes ||
            reservation == nullptr) {
            return fail(Errc::invalid_argument, detail::message("sim vmm_map: chunk ", handle, " of ", bytes,
                                                                " bytes cannot be mapped at ", address));
        }
        void* base = reservations_.base_of(address, bytes);
        if (static_cast<std::byte*>(base) + reservation->info != address) {
            return fail(Errc::not_supported, detail::message("sim vmm_map: ", address,
                                                             " is not the end of the mapped part of its reservation"));
        }
        if (::mmap(address, bytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
            MAP_FAILED) {
            return fail(Errc::out_of_memory, detail::message("sim vmm_map: mapping ", bytes, " bytes failed"));
        }
        chunk->second.mapped_at = address;
        set_mapped(base, reservation->info + bytes);
        stats_.vmm_mapped_bytes += bytes;
        return {};
    }

    Status vmm_unmap(void* address, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        const auto* reservation = reservations_.containing(address, bytes);
        void* base = reservations_.base_of(address, bytes);
        if (reservation == nullptr ||
            static_cast<std::byte*>(address) + bytes != static_cast<std::byte*>(base) + reservation->info) {
            return fail(Errc::invalid_argument, detail::message("sim vmm_unmap: ", bytes, " bytes at ", address,
                                                                " are not the last mapped chunk of a reservation"));
        }
        for (auto& [handle, chunk] : chunks_) {
            if (chunk.mapped_at == address) chunk.mapped_at = nullptr;
        }
        if (::mmap(address, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) ==
            MAP_FAILED) {
            return fail(Errc::backend_failure, detail::message("sim vmm_unmap: remapping ", bytes, " bytes failed"));
        }
        set_mapped(base, reservation->info - bytes);
        stats_.vmm_mapped_bytes -= bytes;
        return {};
    }

    /// True when `pointer` lies in one of this backend's pinned allocations.
    bool is_pinned(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        return pinned_.contains(pointer, 1);
    }
    /// True when `pointer` lies in a pinned allocation that is really page-locked.
    bool pinned_locked(const void* pointer) const noexcept {
        std::lock_guard lock(mutex_);
        const auto* entry = pinned_.containing(pointer, 1);
        return entry != nullptr && entry->info.locked;
    }

    SimStats stats() const noexcept {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    const SimConfig& config() const noexcept { return config_; }

private:
    struct PinnedInfo {
        std::size_t mapped;
        bool locked;
    };
    struct Chunk {
        std::size_t bytes;
        void* mapped_at;
    };

    // The mapped prefix of a reservation is what copies may touch.
    void set_mapped(void* base, std::size_t mapped) {
        const auto entry = reservations_.erase(base);
        reservations_.insert(base, entry->bytes, mapped);
        (void)vmm_mapped_.erase(base);
        if (mapped > 0) vmm_mapped_.insert(base, mapped, 0);
    }
    bool is_device(const void* pointer, std::size_t bytes) const noexcept {
        return device_.contains(pointer, bytes) || vmm_mapped_.contains(pointer, bytes);
    }

    static std::size_t round_to_page(std::size_t bytes) noexcept {
        static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return (bytes + page - 1) / page * page;
    }

    Status fail(Errc code, std::string message) noexcept {
        ++stats_.failed_calls;
        return Status(code, std::move(message));
    }

    // `host` is the host side of the copy, `device` the device side.
    Status copy(void* dst, const void* src, std::size_t bytes, const void* host, const void* device,
                std::string_view what) noexcept {
        std::unique_lock lock(mutex_);
        const bool to_device = device == dst;
        if (bytes == 0) return {};
        if (!is_device(device, bytes)) {
            return fail(Errc::invalid_argument, detail::message("sim ", what, ": ", bytes, " bytes at device address ",
                                                                device, " are not inside one device allocation"));
        }
        if (host == nullptr) return fail(Errc::invalid_argument, detail::message("sim ", what, ": null host pointer"));
        ++(to_device ? stats_.copies_to_device : stats_.copies_from_device);
        (to_device ? stats_.bytes_to_device : stats_.bytes_from_device) += bytes;
        if (pinned_.contains(host, bytes)) {
            stats_.direct_bytes += bytes;
            lock.unlock();
            std::memcpy(dst, src, bytes);
            return {};
        }
        // Pageable host memory: the driver cannot DMA from it, so it stages it through its own
        // page-locked bounce buffer one chunk at a time.
        stats_.bounced_bytes += bytes;
        if (bounce_ == nullptr) {
            void* bounce = ::mmap(nullptr, config_.bounce_buffer_bytes, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            if (bounce == MAP_FAILED) {
                return fail(Errc::out_of_memory, detail::message("sim ", what, ": bounce buffer of ",
                                                                 config_.bounce_buffer_bytes, " bytes unavailable"));
            }
            (void)::mlock(bounce, config_.bounce_buffer_bytes);
            bounce_ = static_cast<std::byte*>(bounce);
        }
        std::lock_guard bounce_lock(bounce_mutex_);
        lock.unlock();
        auto* out = static_cast<std::byte*>(dst);
        const auto* in = static_cast<const std::byte*>(src);
        for (std::size_t done = 0; done < bytes;) {
            const std::size_t chunk = std::min(config_.bounce_buffer_bytes, bytes - done);
            std::memcpy(bounce_, in + done, chunk);
            std::memcpy(out + done, bounce_, chunk);
            done += chunk;
        }
        return {};
    }

    SimConfig config_;
    mutable std::mutex mutex_;
    std::mutex bounce_mutex_;
    detail::AddressMap<std::size_t> device_;  // info: mapped bytes
    detail::AddressMap<PinnedInfo> pinned_;
    detail::AddressMap<std::size_t> reservations_;  // info: bytes mapped from the start
    detail::AddressMap<int> vmm_mapped_;            // the mapped prefix of each reservation
    std::map<PhysicalHandle, Chunk> chunks_;
    PhysicalHandle next_handle_ = 0;
    std::byte* bounce_ = nullptr;
    SimStats stats_;
};

static_assert(Backend<SimBackend>);
static_assert(PinnedHostBackend<SimBackend>);
static_assert(MemsetBackend<SimBackend>);
static_assert(SynchronizingBackend<SimBackend>);
static_assert(VirtualMemoryBackend<SimBackend>);

}  // namespace devstage
