// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: RangeAllocator, first-fit sub-allocation of the bytes [0, size) of a region:
/// aligned ranges handed out and given back, neighbouring free ranges merged. It knows offsets
/// only, never memory. Not thread-safe (its owner's lock guards it); never throws: a give-back
/// that would need host memory reports it.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

#include "devstage/detail/util/align.hpp"
#include "devstage/pinned/detail/host_memory.hpp"

namespace devstage::detail {

class RangeAllocator {
public:
    /// `base_address` is where offset 0 lies, so that alignment is of addresses, not offsets.
    RangeAllocator(std::size_t size, std::uintptr_t base_address) : size_(size), base_(base_address) {
        if (size > 0) free_.emplace(0, size);
    }

    /// The offset of `bytes` (> 0) free bytes whose address is aligned to `alignment` (a power
    /// of two), the first that fits; nullopt when none does (or no host memory to split one).
    std::optional<std::size_t> allocate(std::size_t bytes, std::size_t alignment) noexcept {
        if (bytes == 0) return std::nullopt;
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            const auto [offset, length] = *it;
            const std::optional<std::size_t> aligned = align_up(base_ + offset, alignment);
            if (!aligned) continue;
            const std::size_t start = *aligned - base_;
            const std::size_t skip = start - offset;
            if (skip > length || bytes > length - skip) continue;
            const std::size_t tail = length - skip - bytes;
            // The split pieces are made before the range leaves, so a failure changes nothing.
            bool split = true;
            if (skip > 0 && tail > 0) {
                split = try_host_allocation([&] { free_.emplace(start + bytes, tail); });
                if (split) it->second = skip;
            } else if (skip > 0) {
                it->second = skip;
            } else if (tail > 0) {
                split = try_host_allocation([&] { free_.emplace(start + bytes, tail); });
                if (split) free_.erase(it);
            } else {
                free_.erase(it);
            }
            if (!split) return std::nullopt;
            used_ += bytes;
            ++live_;
            return start;
        }
        return std::nullopt;
    }

    /// Gives back `bytes` at `offset` (a range allocate() handed out), merged with its free
    /// neighbours; false when the host has no memory to record it (the range is then lost).
    bool deallocate(std::size_t offset, std::size_t bytes) noexcept {
        used_ -= bytes;
        --live_;
        std::size_t start = offset, length = bytes;
        auto next = free_.lower_bound(offset);
        if (next != free_.begin()) {
            const auto before = std::prev(next);
            if (before->first + before->second == offset) {
                start = before->first;
                length += before->second;
                free_.erase(before);
            }
        }
        if (next != free_.end() && next->first == offset + bytes) {
            length += next->second;
            next = free_.erase(next);
        }
        return try_host_allocation([&] { free_.emplace_hint(next, start, length); });
    }

    std::size_t size() const noexcept { return size_; }
    std::size_t used() const noexcept { return used_; }
    std::size_t live() const noexcept { return live_; }
    /// The largest free range.
    std::size_t largest_free() const noexcept {
        std::size_t largest = 0;
        for (const auto& [offset, length] : free_) largest = length > largest ? length : largest;
        return largest;
    }

private:
    std::size_t size_;
    std::uintptr_t base_;
    std::map<std::size_t, std::size_t> free_;  ///< offset -> length, disjoint and not adjacent
    std::size_t used_ = 0, live_ = 0;
};

}  // namespace devstage::detail
