// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: what the SimBackends of one simulated host (SimHost) share. Their pinned memory —
// allocated, or pinned in place — is one registry: every device's copies see it as pinned, and
// any device of the host may free it (portable pinned memory). Their streams and events are
// registered with the device they belong to, so that a stream or event of another device is
// named as such. Ids are unique in the process, so a stream of another simulated host is never
// taken for one of this host. Thread-safe: a leaf lock, taken after the backend's and the
// streams' locks.

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
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

class SimHostState {
public:
    SimHostState() noexcept = default;
    SimHostState(const SimHostState&) = delete;
    SimHostState& operator=(const SimHostState&) = delete;
    /// Unmaps the pinned memory still allocated and unlocks what is still pinned in place.
    ~SimHostState() {
        pinned_.for_each([](void* base, const auto& entry) { ::munmap(base, entry.info.mapped); });
        registered_.for_each([this](void* base, const HostRegistry::Range& range) { unlock(base, range); });
    }

    // ---- pinned memory; `stats` are the calling backend's (its lock held) ------------------

    /// mmap'd and pre-faulted; mlock'd when `lock` (a refused mlock leaves it unlocked).
    Result<void*> pinned_malloc(std::size_t bytes, bool lock, SimStats& stats) noexcept {
        if (bytes == 0) return fail(stats, Errc::invalid_argument, message("sim pinned_malloc: 0 bytes requested"));
        const auto mapped = round_to_page(bytes);
        if (!mapped) {
            return fail(stats, Errc::out_of_memory,
                        message("sim pinned_malloc: ", bytes, " bytes requested exceed the address space"));
        }
        void* base =
            ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (base == MAP_FAILED) {
            return fail(
                stats, Errc::out_of_memory,
                message("sim pinned_malloc: mmap of ", *mapped, " bytes failed for ", bytes, " bytes requested"));
        }
        const bool locked = lock && ::mlock(base, *mapped) == 0;
        std::lock_guard guard(mutex_);
        if (!without_bad_alloc([&] { pinned_.insert(base, bytes, PinnedInfo{*mapped, locked}); })) {
            ::munmap(base, *mapped);
            return fail(
                stats, Errc::out_of_memory,
                message("sim pinned_malloc: host memory exhausted recording ", bytes, " bytes of pinned memory"));
        }
        if (!locked) ++stats.pinned_lock_failures;
        ++stats.pinned_mallocs;
        live_pinned_bytes_ += bytes;
        return base;
    }

    /// Precondition: no stream work of the calling device is pending.
    Status pinned_free(void* pointer, SimStats& stats) noexcept {
        std::lock_guard guard(mutex_);
        const auto entry = pinned_.erase(pointer);
        if (!entry) {
            return fail(stats, Errc::unknown_pointer,
                        message("sim pinned_free: ", static_cast<const void*>(pointer),
                                " is not a live pinned allocation of this host"));
        }
        ::munmap(pointer, entry->info.mapped);  // also unlocks
        ++stats.pinned_frees;
        live_pinned_bytes_ -= entry->bytes;
        return {};
    }

    /// True when [pointer, pointer + bytes) lies in one pinned allocation or registered range.
    bool pinned_contains(const void* pointer, std::size_t bytes) const noexcept {
        std::lock_guard guard(mutex_);
        return pinned_.contains(pointer, bytes) || registered_.contains(pointer, bytes);
    }
    /// The bytes of the pinned allocation starting at `base`; 0 when there is none.
    std::size_t pinned_size(const void* base) const noexcept {
        std::lock_guard guard(mutex_);
        const auto* entry = pinned_.at(base);
        return entry == nullptr ? 0 : entry->bytes;
    }
    /// True when `pointer` lies in pinned memory that is really page-locked.
    bool pinned_locked(const void* pointer) const noexcept {
        std::lock_guard guard(mutex_);
        const auto* entry = pinned_.containing(pointer, 1);
        if (entry != nullptr) return entry->info.locked;
        const HostRegistry::Range* range = registered_.containing(pointer, 1);
        return range != nullptr && range->locked;
    }
    /// Bytes of pinned allocations live on this host, whichever device allocated them.
    std::uint64_t live_pinned_bytes() const noexcept {
        std::lock_guard guard(mutex_);
        return live_pinned_bytes_;
    }

    /// Pins existing host memory in place: mlock'd when `lock` and allowed, counted as pinned
    /// either way. Not inside a pinned allocation (already pinned), nor overlapping a
    /// registered range.
    Status host_register(void* host, std::size_t bytes, bool lock, SimStats& stats) noexcept {
        constexpr std::string_view what = "sim host_register";
        std::lock_guard guard(mutex_);
        if (Status checked = registered_.check(what, host, bytes); !checked) {
            return fail(stats, checked.code(), checked.message());
        }
        bool pinned = false;
        pinned_.for_each([&](void* base, const auto& entry) {
            const auto at = reinterpret_cast<std::uintptr_t>(host), start = reinterpret_cast<std::uintptr_t>(base);
            pinned = pinned || (start < at + bytes && at < start + entry.bytes);
        });
        if (pinned) {
            return fail(stats, Errc::invalid_argument,
                        message(what, ": ", bytes, " bytes at ", static_cast<const void*>(host),
                                " lie in pinned memory of this host, pinned already"));
        }
        const bool locked = lock && ::mlock(host, bytes) == 0;
        if (!registered_.insert(host, bytes, locked)) {
            unlock(host, HostRegistry::Range{bytes, locked});
            return fail(stats, Errc::out_of_memory,
                        message(what, ": host memory exhausted recording ", bytes, " bytes"));
        }
        if (!locked) ++stats.pinned_lock_failures;
        return {};
    }

    /// Unpins a range host_register pinned (starting at `host`).
    Status host_unregister(void* host, SimStats& stats) noexcept {
        std::lock_guard guard(mutex_);
        Result<HostRegistry::Range> range = registered_.erase("sim host_unregister", host);
        if (!range) return fail(stats, range.status().code(), range.status().message());
        unlock(host, *range);
        return {};
    }

    // ---- streams and events: ids unique in the process, registered with their device -------

    enum class Kind : std::uint8_t { stream, event };

    /// A fresh id, never handed out before in this process (0 is never one).
    static std::uint32_t next_id() noexcept {
        static std::atomic<std::uint32_t> last{0};
        return last.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    /// Records that `id` is a live stream or event of `device`; false when out of memory.
    bool enroll(Kind kind, std::uint32_t id, int device) noexcept {
        std::lock_guard guard(mutex_);
        return without_bad_alloc([&] { owners(kind)[id] = device; });
    }
    void withdraw(Kind kind, std::uint32_t id) noexcept {
        std::lock_guard guard(mutex_);
        owners(kind).erase(id);
    }
    /// The device a live stream or event of this host belongs to.
    std::optional<int> owner(Kind kind, std::uint32_t id) const noexcept {
        std::lock_guard guard(mutex_);
        const auto& map = kind == Kind::stream ? streams_ : events_;
        const auto found = map.find(id);
        if (found == map.end()) return std::nullopt;
        return found->second;
    }

private:
    struct PinnedInfo {
        std::size_t mapped;
        bool locked;
    };

    std::map<std::uint32_t, int>& owners(Kind kind) noexcept { return kind == Kind::stream ? streams_ : events_; }

    static std::optional<std::size_t> round_to_page(std::size_t bytes) noexcept {
        static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return round_up(bytes, page);
    }

    // mutex_ held. munlock of the pages of a registered range that no other registered range uses.
    void unlock(const void* host, const HostRegistry::Range& range) const noexcept {
        if (!range.locked) return;
        static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
        if (const auto pages = registered_.own_pages(host, range.bytes, page)) {
            ::munlock(reinterpret_cast<const void*>(pages->first),  // NOLINT(performance-no-int-to-ptr)
                      pages->second - pages->first);
        }
    }

    static Status fail(SimStats& stats, Errc code, std::string text) noexcept {
        ++stats.failed_calls;
        return Status(code, std::move(text));
    }

    mutable std::mutex mutex_;
    AddressMap<PinnedInfo> pinned_;
    HostRegistry registered_;
    std::uint64_t live_pinned_bytes_ = 0;
    std::map<std::uint32_t, int> streams_, events_;  // live ids and their device
};

}  // namespace devstage::detail
