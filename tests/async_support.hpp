// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for tests of stream-ordered backends: a host function that holds a stream until the
// test lets it go, RAII device and host memory, stream and event makers.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/status.hpp"

namespace devstage::test {

/// A host function that holds its stream until the test opens the gate. A backend that runs
/// host functions on the test's own thread (the mock does, at the call or when the host
/// synchronizes) cannot be held: there the function returns at once and ran_inline() says so.
class StreamGate {
public:
    static void hold(void* gate) { static_cast<StreamGate*>(gate)->arrive(); }

    void open() {
        std::lock_guard lock(mutex_);
        open_ = true;
        changed_.notify_all();
    }
    /// Blocks until the host function started (on another thread; at once when it ran inline).
    void wait_entered() {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [this] { return runs_ > 0; });
    }
    bool ran_inline() const {
        std::lock_guard lock(mutex_);
        return ran_inline_;
    }
    int runs() const {
        std::lock_guard lock(mutex_);
        return runs_;
    }

private:
    void arrive() {
        std::unique_lock lock(mutex_);
        ++runs_;
        changed_.notify_all();
        if (std::this_thread::get_id() == test_thread_) {
            ran_inline_ = true;
            return;
        }
        changed_.wait(lock, [this] { return open_; });
    }

    const std::thread::id test_thread_ = std::this_thread::get_id();
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    bool open_ = false;
    bool ran_inline_ = false;
    int runs_ = 0;
};

/// A host function that takes a while (yielding), then sets its flag: a host that does not
/// wait for it would likely still see the flag clear.
inline void set_flag_slowly(void* flag) {
    for (int i = 0; i < 2000; ++i) std::this_thread::yield();
    static_cast<std::atomic<bool>*>(flag)->store(true);
}

/// Device memory freed on destruction.
template <class B>
class DeviceBytes {
public:
    DeviceBytes(B& backend, std::size_t bytes) : backend_(backend) {
        Result<void*> allocated = backend.device_malloc(bytes);
        REQUIRE(allocated.ok());
        pointer_ = static_cast<std::byte*>(*allocated);
    }
    DeviceBytes(const DeviceBytes&) = delete;
    DeviceBytes& operator=(const DeviceBytes&) = delete;
    ~DeviceBytes() { CHECK(backend_.device_free(pointer_).ok()); }
    std::byte* get() const { return pointer_; }

private:
    B& backend_;
    std::byte* pointer_ = nullptr;
};

/// Host memory, from the backend's pinned memory when `pinned` (and it has some), else
/// pageable; zero-filled.
template <class B>
class HostBytes {
public:
    HostBytes(B& backend, std::size_t bytes, bool pinned) : backend_(backend), bytes_(bytes) {
        if constexpr (PinnedHostBackend<B>) {
            if (pinned) {
                Result<void*> allocated = backend.pinned_malloc(bytes);
                REQUIRE(allocated.ok());
                pinned_ = static_cast<std::byte*>(*allocated);
                std::fill(pinned_, pinned_ + bytes, std::byte{0});
            }
        }
        if (pinned_ == nullptr) pageable_.resize(bytes);
    }
    HostBytes(const HostBytes&) = delete;
    HostBytes& operator=(const HostBytes&) = delete;
    ~HostBytes() {
        if constexpr (PinnedHostBackend<B>) {
            if (pinned_ != nullptr) CHECK(backend_.pinned_free(pinned_).ok());
        }
    }
    std::byte* get() { return pinned_ != nullptr ? pinned_ : pageable_.data(); }
    void fill(const std::vector<std::byte>& bytes) { std::copy(bytes.begin(), bytes.end(), get()); }
    std::vector<std::byte> bytes() { return std::vector<std::byte>(get(), get() + bytes_); }

private:
    B& backend_;
    std::size_t bytes_;
    std::byte* pinned_ = nullptr;
    std::vector<std::byte> pageable_;
};

/// Pageable host memory, and pinned memory too when the backend has it.
template <class B>
std::vector<bool> host_kinds() {
    if constexpr (PinnedHostBackend<B>) {
        return {false, true};
    } else {
        return {false};
    }
}

template <class B>
typename B::Stream make_stream(B& backend) {
    Result<typename B::Stream> stream = backend.create_stream();
    REQUIRE(stream.ok());
    return *stream;
}
template <class B>
typename B::Event make_event(B& backend) {
    Result<typename B::Event> event = backend.create_event();
    REQUIRE(event.ok());
    return *event;
}

}  // namespace devstage::test
