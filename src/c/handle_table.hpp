// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: the table every C handle is an entry of. A handle's value is not an
// address: it is its entry's index, the generation the entry had when the handle was handed
// out, and a tag byte naming its kind,
//
//   bits 63..32 generation   bits 31..8 index   bits 7..4 0xD   bits 3..0 kind
//
// so a handle destroyed, used up or of another kind is recognised — an entry handed out again
// has a new generation, so an old handle never finds the new object (ABA) — and no call reads
// the memory of an object that is gone. Entries live in segments that are never freed, so a
// look-up reads only the table. Look-ups take no lock (an acquire load of the entry's key);
// handing out and taking back entries take one mutex. An index is reused only once 1024
// others are free, oldest first, so a generation wraps only after billions of handles.
// Destroying a handle while another thread still uses it is a race of the caller's, as a free
// would be.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

namespace devstage::capi {

enum class HandleKind : std::uint8_t { backend = 1, stager, run, frame, completion, stream, event, pool, region };

/// "backend", "stager", ..., "pinned pool", "pinned region".
const char* kind_name(HandleKind kind) noexcept;

class HandleTable {
public:
    static constexpr std::uint32_t segment_bits = 12;
    static constexpr std::uint32_t segment_size = std::uint32_t{1} << segment_bits;
    static constexpr std::uint32_t segment_count = std::uint32_t{1} << (24 - segment_bits);
    static constexpr std::uint32_t reuse_after = 1024;  // free entries kept before one is reused

    /// A new handle of `kind` for `object` (not null); 0 when no host memory or index is left.
    std::uint64_t insert(HandleKind kind, void* object) noexcept;

    /// Takes `handle` back (it must be live); the object is the caller's to destroy.
    void erase(std::uint64_t handle) noexcept;

    /// The object of `handle` when it is a live handle of `kind`, else null.
    void* find(std::uint64_t handle, HandleKind kind) const noexcept {
        if ((handle & 0xFF) != tag(kind)) return nullptr;
        const auto index = static_cast<std::uint32_t>(handle >> 8) & 0xFFFFFF;
        const Segment* segment = segments_[index >> segment_bits].load(std::memory_order_acquire);
        if (segment == nullptr) return nullptr;
        const Entry& entry = segment->entries[index & (segment_size - 1)];
        if (entry.key.load(std::memory_order_acquire) != handle) return nullptr;
        void* object = entry.object.load(std::memory_order_relaxed);
        if (object == nullptr) __builtin_unreachable();  // a live entry always has its object
        return object;
    }

    /// Why `handle` (not 0) is not a live handle of `kind`: "<function>: <kind> handle 0x…
    /// was destroyed", "… a completion handle was given where a stager handle is needed", …
    std::string why_not(const char* function, std::uint64_t handle, HandleKind kind) const;

    /// Live handles of every kind (for tests of what is left).
    std::size_t live() const noexcept;

    static constexpr std::uint64_t tag(HandleKind kind) noexcept { return 0xD0 | static_cast<std::uint64_t>(kind); }

private:
    // What a look-up reads, 16 bytes; the rest of an entry lies apart, in its segment's `meta`.
    struct Entry {
        std::atomic<std::uint64_t> key{0};  // the live handle; 0 while free
        std::atomic<void*> object{nullptr};
    };
    struct Meta {
        std::atomic<std::uint32_t> generation{0};  // of the last handle handed out
        std::uint32_t next_free = 0;               // the free list, under the mutex
    };
    struct Segment {
        Entry entries[segment_size];
        Meta meta[segment_size];
    };

    Segment& segment_of(std::uint32_t index) const noexcept {
        return *segments_[index >> segment_bits].load(std::memory_order_relaxed);
    }
    Entry& at(std::uint32_t index) const noexcept { return segment_of(index).entries[index & (segment_size - 1)]; }
    Meta& meta(std::uint32_t index) const noexcept { return segment_of(index).meta[index & (segment_size - 1)]; }
    bool take_index(std::uint32_t& index) noexcept;  // the mutex held

    std::array<std::atomic<Segment*>, segment_count> segments_{};
    mutable std::mutex mutex_;
    std::uint32_t next_unused_ = 0;  // entries [0, next_unused_) were handed out once
    std::uint32_t free_head_ = 0, free_tail_ = 0, free_count_ = 0;
    std::size_t live_ = 0;
};

// The table outlives every other static object: nothing of it is destroyed at exit, so a call
// made from another library's teardown still finds it.
static_assert(std::is_trivially_destructible_v<HandleTable>);
extern HandleTable handles;

}  // namespace devstage::capi
