// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the live allocations of a backend by address, with range look-ups. Used by the
// simulator and the mock to validate every pointer and copy they are given, with the guard
// their noexcept bookkeeping puts around host allocations.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <new>
#include <optional>

namespace devstage::detail {

/// Runs `f` (bookkeeping that allocates host memory: a map insert, a queue push) and returns
/// false when it threw std::bad_alloc, so a noexcept caller can release what it took and
/// report out_of_memory instead of terminating. Without exceptions a failed allocation
/// terminates inside `f`, as everywhere in such a program.
template <class F>
bool without_bad_alloc(F&& f) noexcept {
#if defined(__cpp_exceptions)
    try {
        f();
        return true;
    } catch (const std::bad_alloc&) {
        return false;
    }
#else
    f();
    return true;
#endif
}

template <class Info>
class AddressMap {
public:
    struct Entry {
        std::size_t bytes;
        Info info;
    };

    void insert(const void* base, std::size_t bytes, Info info) { map_.emplace(base, Entry{bytes, info}); }

    /// The allocation starting exactly at `base`, removed; nullopt when there is none.
    std::optional<Entry> erase(const void* base) {
        const auto found = map_.find(base);
        if (found == map_.end()) return std::nullopt;
        Entry entry = found->second;
        map_.erase(found);
        return entry;
    }

    const Entry* at(const void* base) const {
        const auto found = map_.find(base);
        return found == map_.end() ? nullptr : &found->second;
    }
    /// The allocation starting exactly at `base`, to update in place (no host allocation).
    Entry* at(const void* base) {
        const auto found = map_.find(base);
        return found == map_.end() ? nullptr : &found->second;
    }

    /// True when [pointer, pointer + bytes) lies inside one allocation.
    bool contains(const void* pointer, std::size_t bytes) const { return containing(pointer, bytes) != nullptr; }

    /// The allocation holding all of [pointer, pointer + bytes), or null.
    const Entry* containing(const void* pointer, std::size_t bytes) const {
        const auto found = find_containing(pointer, bytes);
        return found == map_.end() ? nullptr : &found->second;
    }

    /// The start of the allocation holding all of [pointer, pointer + bytes), or null.
    void* base_of(const void* pointer, std::size_t bytes) const {
        const auto found = find_containing(pointer, bytes);
        return found == map_.end() ? nullptr : const_cast<void*>(found->first);
    }

    /// True when [pointer, pointer + bytes) overlaps an allocation (the allocations are disjoint).
    bool overlaps(const void* pointer, std::size_t bytes) const {
        if (bytes == 0) return false;
        // NOLINTNEXTLINE(performance-no-int-to-ptr): a key to compare, never dereferenced
        auto next = map_.upper_bound(reinterpret_cast<const void*>(key(pointer) + (bytes - 1)));
        if (next == map_.begin()) return false;
        const auto candidate = std::prev(next);
        return key(candidate->first) + candidate->second.bytes > key(pointer);
    }

    std::size_t size() const noexcept { return map_.size(); }
    bool empty() const noexcept { return map_.empty(); }
    template <class F>
    void for_each(F&& f) const {
        for (const auto& [base, entry] : map_) f(const_cast<void*>(base), entry);
    }
    void clear() noexcept { map_.clear(); }

private:
    auto find_containing(const void* pointer, std::size_t bytes) const {
        auto next = map_.upper_bound(pointer);
        if (next == map_.begin()) return map_.end();
        const auto candidate = std::prev(next);
        const std::uintptr_t offset = key(pointer) - key(candidate->first);
        if (offset > candidate->second.bytes || bytes > candidate->second.bytes - offset) return map_.end();
        return candidate;
    }

    static std::uintptr_t key(const void* pointer) noexcept { return reinterpret_cast<std::uintptr_t>(pointer); }
    std::map<const void*, Entry, std::less<>> map_;  // std::less orders any pointers
};

}  // namespace devstage::detail
