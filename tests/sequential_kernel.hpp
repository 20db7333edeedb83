// SPDX-License-Identifier: Apache-2.0
#pragma once
// The random-program checker's kernel: what a step computes from its inputs (the device runs it
// on device memory, the model on its own copies), and the bytes the engine writes itself.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "devstage/tensor.hpp"

namespace sequential {

using devstage::Direction;

// ---- the kernel ------------------------------------------------------------------------------

/// One arg as a kernel sees it.
struct View {
    std::byte* data;
    std::size_t bytes;
    Direction direction;
};

inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xFF51AFD7ED558CCDull;
    return h ^ (h >> 29);
}

/// Whether a kernel of step `step` writes byte `b` of an output of `bytes`: every byte, or
/// (`partial`) all but the last quarter and every 7th byte — a kernel that stops early.
inline bool writes_byte(std::uint32_t step, bool partial, std::size_t b, std::size_t bytes) noexcept {
    return !partial || (b < bytes - bytes / 4 && b % 7 != step % 7);
}

/// The kernel of step `step`: reads every input byte (In, InOut), then writes every output
/// byte (Out: from the inputs and the step; InOut: its old value plus a non-zero increment
/// that depends on the inputs and the step) — with `partial`, only those writes_byte() names.
/// The device runs it on device memory, the model on its own copies.
inline void compute(std::uint32_t step, std::span<const View> views, bool partial = false) noexcept {
    std::uint64_t h = mix(0x5EC0E1CEull, step);
    for (std::size_t i = 0; i < views.size(); ++i) {
        const View& v = views[i];
        if (!devstage::uploads(v.direction)) continue;
        h = mix(h, i + 1);
        std::size_t b = 0;
        for (; b + 8 <= v.bytes; b += 8) {
            std::uint64_t word;
            std::memcpy(&word, v.data + b, 8);
            h = mix(h, word);
        }
        for (; b < v.bytes; ++b) h = mix(h, static_cast<std::uint64_t>(v.data[b]));
    }
    for (std::size_t j = 0; j < views.size(); ++j) {
        const View& v = views[j];
        if (!devstage::copies_back(v.direction)) continue;
        std::uint64_t g = mix(h, 0x100 + j);
        for (std::size_t b = 0; b < v.bytes; ++b) {
            if (b % 8 == 0) g = mix(g, b);
            const auto value = static_cast<std::uint8_t>(g >> (8 * (b % 8)));
            if (!writes_byte(step, partial, b, v.bytes)) continue;
            if (v.direction == Direction::InOut) {
                v.data[b] = static_cast<std::byte>(static_cast<std::uint8_t>(v.data[b]) + (value | 1u));
            } else {
                v.data[b] = static_cast<std::byte>(value);
            }
        }
    }
}

/// The bytes the engine writes itself (initial contents, new inputs): a function of `tag`.
inline void pattern(std::uint64_t tag, std::byte* data, std::size_t bytes) noexcept {
    std::uint64_t g = mix(0xFEEDull, tag);
    for (std::size_t b = 0; b < bytes; ++b) {
        if (b % 8 == 0) g = mix(g, b);
        data[b] = static_cast<std::byte>(g >> (8 * (b % 8)));
    }
}

inline const std::uint8_t* as_u8(const std::byte* p) noexcept {
    return reinterpret_cast<const std::uint8_t*>(p);
}

inline const char* direction_name(Direction d) noexcept {
    return d == Direction::In ? "In" : d == Direction::Out ? "Out" : "InOut";
}

}  // namespace sequential
