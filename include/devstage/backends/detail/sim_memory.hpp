// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the device and pinned allocations of a SimBackend. Device memory is mmap'd per
// allocation and not pre-faulted (a fresh allocation costs page faults, as on a device) and is
// accounted against SimConfig::device_capacity; pinned memory is mmap'd, pre-faulted and
// mlock'd. Not thread-safe: the SimBackend calls it under its mutex, which also guards the
// SimStats it counts into.

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
#include "devstage/backends/detail/host_registry.hpp"
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
        pinned_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.info.mapped); });
        registered_.for_each([this](void* base, const HostRegistry::Range& range) { unlock(base, range); });
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

    /// When mlock is refused (RLIMIT_MEMLOCK) or SimConfig::lock_pinned is false the allocation
    /// still succeeds, unlocked.
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        if (bytes == 0) return fail(Errc::invalid_argument, message("sim pinned_malloc: 0 bytes requested"));
        const auto mapped = round_to_page(bytes);
        if (!mapped) {
            return fail(Errc::out_of_memory,
                        message("sim pinned_malloc: ", bytes, " bytes requested exceed the address space"));
        }
        void* base =
            ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (base == MAP_FAILED) {
            return fail(Errc::out_of_memory, message("sim pinned_malloc: mmap of ", *mapped, " bytes failed for ",
                                                     bytes, " bytes requested"));
        }
        const bool locked = config_.lock_pinned && ::mlock(base, *mapped) == 0;
        if (!without_bad_alloc([&] { pinned_.insert(base, bytes, PinnedInfo{*mapped, locked}); })) {
            ::munmap(base, *mapped);
            return fail(Errc::out_of_memory, message("sim pinned_malloc: host memory exhausted recording ", bytes,
                                                     " bytes of pinned memory"));
        }
        if (!locked) ++stats_.pinned_lock_failures;
        ++stats_.pinned_mallocs;
        stats_.live_pinned_bytes += bytes;
        return base;
    }

    /// Precondition: no stream work is pending.
    Status pinned_free(void* pointer) noexcept {
        const auto entry = pinned_.erase(pointer);
        if (!entry) {
            return fail(Errc::unknown_pointer, message("sim pinned_free: ", static_cast<const void*>(pointer),
                                                       " is not a live pinned allocation"));
        }
        ::munmap(pointer, entry->info.mapped);  // also unlocks
        ++stats_.pinned_frees;
        stats_.live_pinned_bytes -= entry->bytes;
        return {};
    }

    /// True when [pointer, pointer + bytes) lies in one device allocation.
    bool device_contains(const void* pointer, std::size_t bytes) const noexcept {
        return device_.contains(pointer, bytes);
    }
    /// True when [pointer, pointer + bytes) lies in one pinned allocation or registered range.
    bool pinned_contains(const void* pointer, std::size_t bytes) const noexcept {
        return pinned_.contains(pointer, bytes) || registered_.contains(pointer, bytes);
    }
    /// The bytes of the pinned allocation starting at `base`; 0 when there is none.
    std::size_t pinned_size(const void* base) const noexcept {
        const auto* entry = pinned_.at(base);
        return entry == nullptr ? 0 : entry->bytes;
    }
    /// True when `pointer` lies in a pinned allocation or registered range that is really
    /// page-locked.
    bool pinned_locked(const void* pointer) const noexcept {
        const auto* entry = pinned_.containing(pointer, 1);
        if (entry != nullptr) return entry->info.locked;
        const HostRegistry::Range* range = registered_.containing(pointer, 1);
        return range != nullptr && range->locked;
    }

    /// Pins existing host memory in place: mlock'd where allowed (SimConfig::lock_pinned, and
    /// RLIMIT_MEMLOCK), counted as pinned either way. Not inside a pinned allocation (already
    /// pinned), nor overlapping a registered range.
    Status host_register(void* host, std::size_t bytes) noexcept {
        constexpr std::string_view what = "sim host_register";
        if (Status checked = registered_.check(what, host, bytes); !checked)
            return fail(checked.code(), checked.message());
        bool pinned = false;
        pinned_.for_each([&](void* base, const auto& entry) {
            const auto at = reinterpret_cast<std::uintptr_t>(host), start = reinterpret_cast<std::uintptr_t>(base);
            pinned = pinned || (start < at + bytes && at < start + entry.bytes);
        });
        if (pinned) {
            return fail(Errc::invalid_argument, message(what, ": ", bytes, " bytes at ", static_cast<const void*>(host),
                                                        " lie in pinned memory of this backend, pinned already"));
        }
        const bool locked = config_.lock_pinned && ::mlock(host, bytes) == 0;
        if (!registered_.insert(host, bytes, locked)) {
            unlock(host, HostRegistry::Range{bytes, locked});
            return fail(Errc::out_of_memory, message(what, ": host memory exhausted recording ", bytes, " bytes"));
        }
        if (!locked) ++stats_.pinned_lock_failures;
        return {};
    }

    /// Unpins a range host_register pinned (starting at `host`).
    Status host_unregister(void* host) noexcept {
        Result<HostRegistry::Range> range = registered_.erase("sim host_unregister", host);
        if (!range) return fail(range.status().code(), range.status().message());
        unlock(host, *range);
        return {};
    }

private:
    struct PinnedInfo {
        std::size_t mapped;
        bool locked;
    };

    static std::optional<std::size_t> round_to_page(std::size_t bytes) noexcept {
        static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return round_up(bytes, page);
    }

    // munlock of the pages of a registered range that no other registered range uses.
    void unlock(const void* host, const HostRegistry::Range& range) const noexcept {
        if (!range.locked) return;
        static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
        if (const auto pages = registered_.own_pages(host, range.bytes, page)) {
            ::munlock(reinterpret_cast<const void*>(pages->first),  // NOLINT(performance-no-int-to-ptr)
                      pages->second - pages->first);
        }
    }

    Status fail(Errc code, std::string text) noexcept {
        ++stats_.failed_calls;
        return Status(code, std::move(text));
    }

    const SimConfig& config_;
    SimStats& stats_;
    AddressMap<std::size_t> device_;  // info: mapped bytes
    AddressMap<PinnedInfo> pinned_;
    HostRegistry registered_;
};

}  // namespace devstage::detail
