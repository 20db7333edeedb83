// SPDX-License-Identifier: Apache-2.0
#pragma once
// Replaces the global operator new and delete so that a test can make one host allocation
// throw std::bad_alloc. Replacement functions are defined here, not inline: include this
// header in exactly one translation unit of a test executable.

#include <cstddef>
#include <cstdlib>
#include <new>

namespace devstage::test {

// The n-th operator new on this thread from now throws (0: none).
inline thread_local int new_failure_countdown = 0;

/// Makes the n-th operator new on this thread from now throw std::bad_alloc (1: the next).
inline void fail_nth_new(int n) noexcept {
    new_failure_countdown = n;
}
/// Cancels a failure not reached yet.
inline void stop_failing_new() noexcept {
    new_failure_countdown = 0;
}

inline void* allocate_or_throw(std::size_t bytes) {
    if (new_failure_countdown > 0 && --new_failure_countdown == 0) throw std::bad_alloc();
    if (void* pointer = std::malloc(bytes == 0 ? 1 : bytes)) return pointer;
    throw std::bad_alloc();
}

/// True when operator new is this header's: false where a tool replaces it (valgrind does),
/// and then a test has no host allocation it can make fail.
inline bool failing_new_active() {
    fail_nth_new(1);
    try {
        ::operator delete(::operator new(1));
    } catch (const std::bad_alloc&) {
        return true;
    }
    stop_failing_new();
    return false;
}

}  // namespace devstage::test

// Every replaceable non-aligned form, so that what these allocate is freed by these (the
// aligned forms are left to the library, which pairs them with its own). Never inlined: g++
// then takes a call of ::operator new for the standard one, and warns that its pointer reaches
// free() (-Wmismatched-new-delete, at -O1).
[[gnu::noinline]] void* operator new(std::size_t bytes) {
    return devstage::test::allocate_or_throw(bytes);
}
[[gnu::noinline]] void* operator new[](std::size_t bytes) {
    return devstage::test::allocate_or_throw(bytes);
}
[[gnu::noinline]] void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
    try {
        return devstage::test::allocate_or_throw(bytes);
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}
[[gnu::noinline]] void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
    try {
        return devstage::test::allocate_or_throw(bytes);
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}
[[gnu::noinline]] void operator delete(void* pointer) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete[](void* pointer) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete(void* pointer, std::size_t) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete[](void* pointer, std::size_t) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete(void* pointer, const std::nothrow_t&) noexcept {
    std::free(pointer);
}
[[gnu::noinline]] void operator delete[](void* pointer, const std::nothrow_t&) noexcept {
    std::free(pointer);
}
