// SPDX-License-Identifier: Apache-2.0
// The handle table of the C interface (handle_table.hpp): handing out and taking back entries,
// and what a handle that is not live was.

#include "handle_table.hpp"

#include <cinttypes>
#include <cstdio>
#include <new>

namespace devstage::capi {

constinit HandleTable handles;

const char* kind_name(HandleKind kind) noexcept {
    switch (kind) {
        case HandleKind::backend:
            return "backend";
        case HandleKind::stager:
            return "stager";
        case HandleKind::run:
            return "run";
        case HandleKind::frame:
            return "frame";
        case HandleKind::completion:
            return "completion";
        case HandleKind::stream:
            return "stream";
        case HandleKind::event:
            return "event";
        case HandleKind::pool:
            return "pinned pool";
        case HandleKind::region:
            return "pinned region";
    }
    return "unknown";
}

bool HandleTable::take_index(std::uint32_t& index) noexcept {
    for (;;) {
        if (free_count_ > reuse_after) {
            index = free_head_;
            free_head_ = meta(index).next_free;
            --free_count_;
        } else {
            if (next_unused_ == segment_count * segment_size) {
                if (free_count_ == 0) return false;
                index = free_head_;  // every index handed out once: reuse sooner
                free_head_ = meta(index).next_free;
                --free_count_;
            } else {
                index = next_unused_;
                std::atomic<Segment*>& segment = segments_[index >> segment_bits];
                if (segment.load(std::memory_order_relaxed) == nullptr) {
                    auto* made = new (std::nothrow) Segment;
                    if (made == nullptr) return false;
                    segment.store(made, std::memory_order_release);
                }
                ++next_unused_;
            }
        }
        // An entry whose generation would wrap to 0 is retired: its handles stay unique.
        if (meta(index).generation.load(std::memory_order_relaxed) != UINT32_MAX) return true;
    }
}

std::uint64_t HandleTable::insert(HandleKind kind, void* object) noexcept {
    std::lock_guard lock(mutex_);
    std::uint32_t index = 0;
    if (!take_index(index)) return 0;
    Entry& entry = at(index);
    const std::uint32_t generation = meta(index).generation.load(std::memory_order_relaxed) + 1;
    meta(index).generation.store(generation, std::memory_order_relaxed);
    const std::uint64_t handle = (std::uint64_t{generation} << 32) | (std::uint64_t{index} << 8) | tag(kind);
    entry.object.store(object, std::memory_order_relaxed);
    entry.key.store(handle, std::memory_order_release);
    ++live_;
    return handle;
}

void HandleTable::erase(std::uint64_t handle) noexcept {
    std::lock_guard lock(mutex_);
    const auto index = static_cast<std::uint32_t>(handle >> 8) & 0xFFFFFF;
    Entry& entry = at(index);
    if (entry.key.load(std::memory_order_relaxed) != handle) return;
    entry.key.store(0, std::memory_order_release);  // the object pointer stays: never null once set
    meta(index).next_free = 0;
    if (free_count_ == 0) {
        free_head_ = index;
    } else {
        meta(free_tail_).next_free = index;
    }
    free_tail_ = index;
    ++free_count_;
    --live_;
}

std::size_t HandleTable::live() const noexcept {
    std::lock_guard lock(mutex_);
    return live_;
}

std::string HandleTable::why_not(const char* function, std::uint64_t handle, HandleKind kind) const {
    char value[24];
    std::snprintf(value, sizeof value, "0x%" PRIx64, handle);
    const std::string wanted = kind_name(kind);
    const std::string prefix = std::string(function) + ": ";
    if ((handle & 0xF0) != 0xD0 || (handle & 0x0F) == 0 ||
        (handle & 0x0F) > static_cast<unsigned>(HandleKind::region)) {
        return prefix + value + " is not a " + wanted + " handle (devstage never handed it out)";
    }
    const auto given = static_cast<HandleKind>(handle & 0x0F);
    if (given != kind) {
        const std::string other = kind_name(given);
        const auto a = [](const std::string& noun) { return noun[0] == 'e' ? "an " : "a "; };
        return prefix + a(other) + other + " handle was given where " + a(wanted) + wanted + " handle is needed";
    }
    const auto index = static_cast<std::uint32_t>(handle >> 8) & 0xFFFFFF;
    const auto generation = static_cast<std::uint32_t>(handle >> 32);
    const Segment* segment = segments_[index >> segment_bits].load(std::memory_order_acquire);
    const std::uint32_t issued =
        segment != nullptr ? segment->meta[index & (segment_size - 1)].generation.load(std::memory_order_relaxed) : 0;
    if (generation == 0 || generation > issued) {
        return prefix + value + " is not a " + wanted + " handle (devstage never handed it out)";
    }
    const char* gone = kind == HandleKind::run ? " was finished or destroyed" : " was destroyed";
    return prefix + wanted + " handle " + value + gone;
}

}  // namespace devstage::capi
