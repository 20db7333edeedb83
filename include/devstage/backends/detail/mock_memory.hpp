// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: MockBackend's allocation, free and synchronous copy — checked against its blocks,
// its pending work and its injected faults, and journaled (assembled by backends/mock.hpp).

#include <cstdint>
#include <cstring>
#include <mutex>

#include "devstage/backends/detail/mock_backend.hpp"

namespace devstage {

inline Result<void*> MockBackend::allocate(MockOp op, Blocks& blocks, std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    if (Status injected = recorder_.begin(op); !injected) {
        return recorder_.finish(op, nullptr, bytes, std::move(injected));
    }
    if (bytes == 0) {
        return recorder_.finish(
            op, nullptr, 0,
            recorder_.misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": 0 bytes requested")));
    }
    if (op == MockOp::device_malloc && bytes > config_.device_capacity - device_bytes_) {
        return recorder_.finish(op, nullptr, bytes,
                                Status(Errc::out_of_memory, detail::message("mock device_malloc: ", bytes,
                                                                            " bytes requested, ", device_bytes_, " of ",
                                                                            config_.device_capacity, " bytes in use")));
    }
    constexpr std::size_t block_alignment = 4096;
    const auto with_offset = detail::add(bytes, config_.offset);
    const auto over = with_offset ? detail::add(*with_offset, block_alignment) : std::nullopt;
    if (!over) {
        return recorder_.finish(
            op, nullptr, bytes,
            Status(Errc::out_of_memory,
                   detail::message("mock ", to_string(op), ": ", bytes, " bytes requested exceed the address space")));
    }
    const std::size_t padded = *over / block_alignment * block_alignment;
    void* block = std::aligned_alloc(block_alignment, padded);
    if (block == nullptr) {
        return recorder_.finish(
            op, nullptr, bytes,
            Status(Errc::out_of_memory,
                   detail::message("mock ", to_string(op), ": host allocation of ", padded, " bytes failed")));
    }
    std::memset(block, 0xA5, padded);  // stale-looking bytes, never zeros
    void* pointer = static_cast<std::byte*>(block) + config_.offset;
    if (!detail::without_bad_alloc([&] { blocks.insert(pointer, bytes, block); })) {
        std::free(block);
        return recorder_.finish(
            op, nullptr, bytes,
            Status(Errc::out_of_memory,
                   detail::message("mock ", to_string(op), ": host memory exhausted recording ", bytes, " bytes")));
    }
    freed_.erase(pointer);
    if (op == MockOp::device_malloc) device_bytes_ += bytes;
    (void)recorder_.finish(op, pointer, bytes, {});
    return pointer;
}

inline Status MockBackend::deallocate(MockOp op, Blocks& blocks, void* pointer) noexcept {
    std::lock_guard lock(mutex_);
    if (Status injected = recorder_.begin(op); !injected) {
        return recorder_.finish(op, pointer, 0, std::move(injected));
    }
    if (const auto* live = blocks.at(pointer); live != nullptr) {
        if (op == MockOp::pinned_free && mapped_.overlaps(pointer, live->bytes)) {
            return recorder_.finish(
                op, pointer, live->bytes,
                recorder_.misuse(Errc::invalid_argument,
                                 detail::message("mock pinned_free: ", static_cast<const void*>(pointer),
                                                 " is still mapped for the device: unmap_host it first")));
        }
        const Side side = op == MockOp::device_free ? Side::device : Side::host;
        if (Status clear = engine_.used_by_pending(op, pointer, live->bytes, side); !clear) {
            return recorder_.finish(op, pointer, live->bytes, std::move(clear));
        }
    }
    const auto entry = blocks.erase(pointer);
    if (!entry) {
        const bool twice = freed_.count(pointer) != 0;
        return recorder_.finish(
            op, pointer, 0,
            recorder_.misuse(Errc::unknown_pointer, detail::message("mock ", to_string(op), ": ",
                                                                    twice ? "double free of " : "unknown pointer ",
                                                                    static_cast<const void*>(pointer))));
    }
    std::free(entry->info);
    // Without room to remember the pointer, a later double free reads as an unknown pointer.
    (void)detail::without_bad_alloc([&] { freed_.insert(pointer); });
    if (op == MockOp::device_free) device_bytes_ -= entry->bytes;
    return recorder_.finish(op, pointer, entry->bytes, {});
}

inline Status MockBackend::transfer(MockOp op, const void* device, void* dst, const void* src,
                                    std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    if (Status injected = recorder_.begin(op); !injected) {
        return recorder_.finish(op, device, bytes, std::move(injected));
    }
    if (bytes == 0) return recorder_.finish(op, device, 0, {});
    if (Status checked = check_copy(op, device, dst, src, bytes); !checked) {
        return recorder_.finish(op, device, bytes, std::move(checked));
    }
    if (Status clear = engine_.not_pending(op, device, bytes, Side::device); !clear) {
        return recorder_.finish(op, device, bytes, std::move(clear));
    }
    const void* host = op == MockOp::copy_to_device ? src : dst;
    if (Status clear = engine_.host_hazard(op, std::nullopt, host, bytes); !clear) {
        return recorder_.finish(op, device, bytes, std::move(clear));
    }
    std::memcpy(dst, src, bytes);
    return recorder_.finish(op, device, bytes, {});
}

inline Status MockBackend::host_register(void* host, std::size_t bytes) noexcept {
    constexpr MockOp op = MockOp::host_register;
    std::lock_guard lock(mutex_);
    if (Status injected = recorder_.begin(op); !injected) return recorder_.finish(op, host, bytes, std::move(injected));
    if (Status checked = registered_.check("mock host_register", host, bytes); !checked) {
        return recorder_.finish(op, host, bytes, recorder_.misuse(checked.code(), checked.message()));
    }
    bool pinned = false;
    pinned_.for_each([&](void* base, const auto& entry) {
        const auto at = reinterpret_cast<std::uintptr_t>(host), start = reinterpret_cast<std::uintptr_t>(base);
        pinned = pinned || (start < at + bytes && at < start + entry.bytes);
    });
    if (pinned) {
        return recorder_.finish(
            op, host, bytes,
            recorder_.misuse(Errc::invalid_argument,
                             detail::message("mock host_register: ", bytes, " bytes at ",
                                             static_cast<const void*>(host), " lie in pinned memory of this backend")));
    }
    if (!registered_.insert(host, bytes, true)) {
        return recorder_.finish(op, host, bytes,
                                Status(Errc::out_of_memory, detail::message("mock host_register: host memory exhausted "
                                                                            "recording ",
                                                                            bytes, " bytes")));
    }
    return recorder_.finish(op, host, bytes, {});
}

inline Status MockBackend::host_unregister(void* host) noexcept {
    constexpr MockOp op = MockOp::host_unregister;
    std::lock_guard lock(mutex_);
    if (Status injected = recorder_.begin(op); !injected) return recorder_.finish(op, host, 0, std::move(injected));
    if (const detail::HostRegistry::Range* range = registered_.containing(host, 1); range != nullptr) {
        if (Status clear = engine_.used_by_pending(op, host, range->bytes, Side::host); !clear) {
            return recorder_.finish(op, host, range->bytes, std::move(clear));
        }
    }
    Result<detail::HostRegistry::Range> range = registered_.erase("mock host_unregister", host);
    if (!range) return recorder_.finish(op, host, 0, recorder_.misuse(range.status().code(), range.status().message()));
    return recorder_.finish(op, host, range->bytes, {});
}

}  // namespace devstage
