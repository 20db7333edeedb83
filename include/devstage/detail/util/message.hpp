// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: builds error messages from pieces without iostreams or exceptions.

#include <charconv>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

namespace devstage::detail {

inline void append_piece(std::string& out, std::string_view piece) {
    out.append(piece);
}
inline void append_piece(std::string& out, const char* piece) {
    out.append(piece);
}
inline void append_piece(std::string& out, const std::string& piece) {
    out.append(piece);
}
inline void append_piece(std::string& out, const void* pointer) {
    char buffer[2 + 2 * sizeof(void*)] = {'0', 'x'};
    auto [end, ec] = std::to_chars(buffer + 2, buffer + sizeof buffer, reinterpret_cast<std::uintptr_t>(pointer), 16);
    (void)ec;
    out.append(buffer, end);
}
template <std::integral I>
requires(!std::same_as<I, char> && !std::same_as<I, bool>) void append_piece(std::string& out, I value) {
    char buffer[24];
    auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
    (void)ec;
    out.append(buffer, end);
}

/// Concatenates strings, pointers (hex) and integers (decimal) into one message. Used on
/// failure paths of noexcept functions: when no host memory is left for the text, the message
/// is empty (the Errc still tells) rather than a throw.
template <class... Pieces>
std::string message(const Pieces&... pieces) noexcept {
    std::string out;
#if defined(__cpp_exceptions)
    try {
        out.reserve(96);
        (append_piece(out, pieces), ...);
    } catch (...) {
        return std::string();
    }
#else
    out.reserve(96);
    (append_piece(out, pieces), ...);
#endif
    return out;
}

}  // namespace devstage::detail
