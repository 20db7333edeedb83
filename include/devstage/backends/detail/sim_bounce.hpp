// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the bounce buffer of a SimBackend. A driver cannot DMA from pageable memory, so it
// stages such a copy through a page-locked buffer of its own, one chunk at a time; the sim
// does the same, for its synchronous copies and on its stream workers alike.

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>

namespace devstage::detail {

class SimBounceBuffer {
public:
    /// A buffer of `bytes`, mapped by the first map().
    explicit SimBounceBuffer(std::size_t bytes) noexcept : bytes_(bytes) {}
    SimBounceBuffer(const SimBounceBuffer&) = delete;
    SimBounceBuffer& operator=(const SimBounceBuffer&) = delete;
    ~SimBounceBuffer() {
        if (buffer_ != nullptr) ::munmap(buffer_, bytes_);
    }

    std::size_t size() const noexcept { return bytes_; }

    /// Maps, pre-faults and locks the buffer (a refused mlock is ignored) unless that is done;
    /// false when the memory cannot be had. The caller serializes the calls: the SimBackend
    /// makes them under its mutex.
    bool map() noexcept {
        if (buffer_ != nullptr) return true;
        void* buffer =
            ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (buffer == MAP_FAILED) return false;
        (void)::mlock(buffer, bytes_);
        buffer_ = static_cast<std::byte*>(buffer);
        return true;
    }

    /// Copies `bytes` from `src` to `dst` through the buffer, a chunk at a time; one copy at a
    /// time goes through it. Precondition: map() succeeded.
    void copy(void* dst, const void* src, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        auto* out = static_cast<std::byte*>(dst);
        const auto* in = static_cast<const std::byte*>(src);
        for (std::size_t done = 0; done < bytes;) {
            const std::size_t chunk = std::min(bytes_, bytes - done);
            std::memcpy(buffer_, in + done, chunk);
            std::memcpy(out + done, buffer_, chunk);
            done += chunk;
        }
    }

private:
    std::size_t bytes_;
    std::mutex mutex_;  // one copy at a time uses the buffer
    std::byte* buffer_ = nullptr;
};

}  // namespace devstage::detail
