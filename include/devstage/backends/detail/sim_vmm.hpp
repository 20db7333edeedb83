// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the virtual memory of a SimBackend (in-place growth). A reservation is an
// mmap(PROT_NONE) range; a physical chunk is capacity accounting until mapped, when its pages
// become an anonymous MAP_FIXED mapping inside the range. Chunks map contiguously from the
// start of a reservation and unmap from its end. Not thread-safe: the SimBackend calls it under
// its mutex, which also guards the SimStats it counts into.

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/sim_config.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class SimVirtualMemory {
public:
    using Handle = std::uint64_t;

    static constexpr std::size_t granularity = std::size_t{64} << 10;

    SimVirtualMemory(const SimConfig& config, SimStats& stats) noexcept : config_(config), stats_(stats) {}
    SimVirtualMemory(const SimVirtualMemory&) = delete;
    SimVirtualMemory& operator=(const SimVirtualMemory&) = delete;
    /// Unmaps every reservation still alive, with what is mapped into it.
    ~SimVirtualMemory() {
        reservations_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.bytes); });
    }

    Result<void*> reserve(std::size_t bytes) noexcept {
        if (bytes == 0 || bytes % granularity != 0) {
            return fail(Errc::invalid_argument,
                        message("sim vmm_reserve: ", bytes, " bytes is not a positive multiple of the granularity ",
                                granularity));
        }
        void* base = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory, message("sim vmm_reserve: ", bytes, " bytes of address space refused"));
        }
        if (!without_bad_alloc([&] { reservations_.insert(base, bytes, 0); })) {
            ::munmap(base, bytes);
            return fail(Errc::out_of_memory,
                        message("sim vmm_reserve: host memory exhausted recording ", bytes, " bytes"));
        }
        ++stats_.vmm_reservations;
        return base;
    }

    Status release(void* base) noexcept {
        const auto* reservation = reservations_.at(base);
        if (reservation == nullptr || reservation->info != 0) {
            return fail(reservation == nullptr ? Errc::unknown_pointer : Errc::busy,
                        message("sim vmm_release: ", static_cast<const void*>(base),
                                reservation == nullptr ? " is not a reservation" : " still has mapped chunks"));
        }
        ::munmap(base, reservation->bytes);
        (void)reservations_.erase(base);
        --stats_.vmm_reservations;
        return {};
    }

    /// Accounts `bytes` of device memory against SimConfig::device_capacity.
    Result<Handle> create(std::size_t bytes) noexcept {
        if (bytes == 0 || bytes % granularity != 0) {
            return fail(Errc::invalid_argument,
                        message("sim vmm_create: ", bytes, " bytes is not a positive multiple of the granularity"));
        }
        if (bytes > config_.device_capacity - stats_.live_device_bytes) {
            return fail(Errc::out_of_memory,
                        message("sim vmm_create: ", bytes, " bytes requested, ", stats_.live_device_bytes, " of ",
                                config_.device_capacity, " bytes in use"));
        }
        const Handle handle = next_handle_ + 1;
        if (!without_bad_alloc([&] { chunks_.emplace(handle, Chunk{bytes, nullptr}); })) {
            return fail(Errc::out_of_memory,
                        message("sim vmm_create: host memory exhausted recording ", bytes, " bytes"));
        }
        next_handle_ = handle;
        stats_.live_device_bytes += bytes;
        stats_.peak_device_bytes = std::max(stats_.peak_device_bytes, stats_.live_device_bytes);
        ++stats_.vmm_chunks;
        return handle;
    }

    /// Precondition: no stream work is pending.
    Status free(Handle handle) noexcept {
        const auto found = chunks_.find(handle);
        if (found == chunks_.end() || found->second.mapped_at != nullptr) {
            return fail(
                found == chunks_.end() ? Errc::unknown_pointer : Errc::busy,
                message("sim vmm_free: chunk ", handle, found == chunks_.end() ? " is unknown" : " is still mapped"));
        }
        stats_.live_device_bytes -= found->second.bytes;
        chunks_.erase(found);
        --stats_.vmm_chunks;
        return {};
    }

    Status map(void* address, std::size_t bytes, Handle handle) noexcept {
        const auto chunk = chunks_.find(handle);
        void* base = reservations_.base_of(address, bytes);
        if (chunk == chunks_.end() || chunk->second.mapped_at != nullptr || chunk->second.bytes != bytes ||
            base == nullptr) {
            return fail(Errc::invalid_argument,
                        message("sim vmm_map: chunk ", handle, " of ", bytes, " bytes cannot be mapped at ", address));
        }
        auto* reservation = reservations_.at(base);
        if (static_cast<std::byte*>(base) + reservation->info != address) {
            return fail(Errc::not_supported,
                        message("sim vmm_map: ", address, " is not the end of the mapped part of its reservation"));
        }
        // The mapped prefix is recorded first: the one step that allocates host memory, so its
        // failure leaves everything as it was.
        const bool first = reservation->info == 0;
        if (first && !without_bad_alloc([&] { mapped_.insert(base, 0, 0); })) {
            return fail(Errc::out_of_memory, message("sim vmm_map: host memory exhausted recording ", bytes, " bytes"));
        }
        if (::mmap(address, bytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
            MAP_FAILED) {
            if (first) (void)mapped_.erase(base);
            return fail(Errc::out_of_memory, message("sim vmm_map: mapping ", bytes, " bytes failed"));
        }
        chunk->second.mapped_at = address;
        reservation->info += bytes;
        mapped_.at(base)->bytes = reservation->info;
        stats_.vmm_mapped_bytes += bytes;
        return {};
    }

    /// Precondition: no stream work is pending.
    Status unmap(void* address, std::size_t bytes) noexcept {
        void* base = reservations_.base_of(address, bytes);
        auto* reservation = base == nullptr ? nullptr : reservations_.at(base);
        if (reservation == nullptr ||
            static_cast<std::byte*>(address) + bytes != static_cast<std::byte*>(base) + reservation->info) {
            return fail(Errc::invalid_argument, message("sim vmm_unmap: ", bytes, " bytes at ", address,
                                                        " are not the last mapped chunk of a reservation"));
        }
        if (::mmap(address, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) ==
            MAP_FAILED) {
            return fail(Errc::backend_failure, message("sim vmm_unmap: remapping ", bytes, " bytes failed"));
        }
        for (auto& [id, chunk] : chunks_) {
            if (chunk.mapped_at == address) chunk.mapped_at = nullptr;
        }
        reservation->info -= bytes;
        if (reservation->info == 0) {
            (void)mapped_.erase(base);
        } else {
            mapped_.at(base)->bytes = reservation->info;
        }
        stats_.vmm_mapped_bytes -= bytes;
        return {};
    }

    /// True when [pointer, pointer + bytes) lies in the mapped part of one reservation: device
    /// memory, for copies.
    bool mapped_contains(const void* pointer, std::size_t bytes) const noexcept {
        return mapped_.contains(pointer, bytes);
    }

private:
    struct Chunk {
        std::size_t bytes;
        void* mapped_at;
    };

    Status fail(Errc code, std::string text) noexcept {
        ++stats_.failed_calls;
        return Status(code, std::move(text));
    }

    const SimConfig& config_;
    SimStats& stats_;
    AddressMap<std::size_t> reservations_;  // info: bytes mapped from the start
    AddressMap<int> mapped_;                // the mapped prefix of each reservation
    std::map<Handle, Chunk> chunks_;
    Handle next_handle_ = 0;
};

}  // namespace devstage::detail
