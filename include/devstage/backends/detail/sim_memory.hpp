// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the device allocations of a SimBackend (its pinned memory is its host's:
// sim_host_state.hpp). Device memory is mmap'd per allocation and not pre-faulted (a fresh
// allocation costs page faults, as on a device) and is accounted against
// SimConfig::device_capacity. Not thread-safe: the SimBackend calls it under its mutex, which
// also guards the SimStats it counts into.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/sim_config.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class SimMemory {
public:
    SimMemory(const SimConfig& config, SimStats& stats) noexcept : config_(config), stats_(stats) {}
    SimMemory(const SimMemory&) = delete;
    SimMemory& operator=(const SimMemory&) = delete;
    /// Unmaps whatever is still allocated.
    ~SimMemory() {
        device_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.info); });
    }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        if (bytes == 0) return fail(Errc::invalid_argument, message("sim device_malloc: 0 bytes requested"));
        if (bytes > config_.device_capacity - stats_.live_device_bytes) {
            return fail(Errc::out_of_memory,
                        message("sim device_malloc: ", bytes, " bytes requested, ", stats_.live_device_bytes, " of ",
                                config_.device_capacity, " bytes in use"));
        }
        const auto mapped = round_to_page(bytes);
        if (!mapped) {
            return fail(Errc::out_of_memory,
                        message("sim device_malloc: ", bytes, " bytes requested exceed the address space"));
        }
        void* base = ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory, message("sim device_malloc: mmap of ", *mapped, " bytes failed"));
        }
        if (!without_bad_alloc([&] { device_.insert(base, bytes, *mapped); })) {
            ::munmap(base, *mapped);
            return fail(Errc::out_of_memory, message("sim device_malloc: host memory exhausted recording ", bytes,
                                                     " bytes of device memory"));
        }
        ++stats_.device_mallocs;
        stats_.live_device_bytes += bytes;
        stats_.peak_device_bytes = std::max(stats_.peak_device_bytes, stats_.live_device_bytes);
        return base;
    }

    /// Precondition: no stream work is pending.
    Status device_free(void* pointer) noexcept {
        const auto entry = device_.erase(pointer);
        if (!entry) {
            return fail(Errc::unknown_pointer, message("sim device_free: ", static_cast<const void*>(pointer),
                                                       " is not a live device allocation"));
        }
        ::munmap(pointer, entry->info);
        ++stats_.device_frees;
        stats_.live_device_bytes -= entry->bytes;
        return {};
    }

    /// True when [pointer, pointer + bytes) lies in one device allocation.
    bool device_contains(const void* pointer, std::size_t bytes) const noexcept {
        return device_.contains(pointer, bytes);
    }

private:
    static std::optional<std::size_t> round_to_page(std::size_t bytes) noexcept {
        static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return round_up(bytes, page);
    }

    Status fail(Errc code, std::string text) noexcept {
        ++stats_.failed_calls;
        return Status(code, std::move(text));
    }

    const SimConfig& config_;
    SimStats& stats_;
    AddressMap<std::size_t> device_;  // info: mapped bytes
};

}  // namespace devstage::detail
