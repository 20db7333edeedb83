// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// MockBackend: a backend for tests — ours and our users'. Plain host memory behind device
/// pointers (data round-trips can be checked), a journal of every call, per-operation
/// counters, fault injection, configurable returned alignment (including adversarial
/// offsets), and detection of double free, unknown pointers, out-of-bounds copies and leaks.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/address_map.hpp"
#include "devstage/detail/message.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// The operations a MockBackend journals and counts.
enum class MockOp : std::uint8_t {
    device_malloc,
    device_free,
    copy_to_device,
    copy_from_device,
    pinned_malloc,
    pinned_free,
    device_memset,
    synchronize,
};
inline constexpr std::size_t mock_op_count = 8;

constexpr std::string_view to_string(MockOp op) noexcept {
    constexpr std::array<std::string_view, mock_op_count> names{"device_malloc",    "device_free",   "copy_to_device",
                                                                "copy_from_device", "pinned_malloc", "pinned_free",
                                                                "device_memset",    "synchronize"};
    return names[static_cast<std::size_t>(op)];
}

/// One journaled call: what, on which pointer (the result, for allocations), how many bytes,
/// and how it ended.
struct MockCall {
    MockOp op;
    const void* pointer;
    std::size_t bytes;
    Errc result;
};

/// Construction options of a MockBackend. `MockBackend mock(MockConfig::adversarial());`
struct MockConfig {
    /// Returned pointers are a 4096-aligned block plus this offset. The default 0 gives
    /// page alignment; `device_alignment` (64) gives pointers aligned to exactly 64 and not
    /// 128; an offset that is not a multiple of 64 breaks the backend's own promise, to test
    /// that callers check it.
    std::size_t offset = 0;
    std::size_t device_capacity = std::numeric_limits<std::size_t>::max();
    bool journal = true;
    ErrorSink sink{};  ///< where the leak report goes on destruction

    static MockConfig adversarial() noexcept { return MockConfig{.offset = 64}; }
};

/// The test backend. Thread-safe. `MockBackend mock; mock.fail_call(MockOp::device_malloc, 2);`
class MockBackend {
public:
    static constexpr std::size_t device_alignment = 64;

    MockBackend() noexcept : MockBackend(MockConfig{}) {}
    explicit MockBackend(MockConfig config) noexcept : config_(config) {}
    MockBackend(const MockBackend&) = delete;
    MockBackend& operator=(const MockBackend&) = delete;
    /// Reports allocations never freed to the sink, then frees them.
    ~MockBackend() {
        const std::string leaks = leak_report();
        if (!leaks.empty()) config_.sink(Status(Errc::leaked, leaks));
        const auto free_block = [](void*, const auto& entry) { std::free(entry.info); };
        device_.for_each(free_block);
        pinned_.for_each(free_block);
    }

    std::string_view name() const noexcept { return "mock"; }

    Result<void*> device_malloc(std::size_t bytes) noexcept { return allocate(MockOp::device_malloc, device_, bytes); }
    Status device_free(void* pointer) noexcept { return deallocate(MockOp::device_free, device_, pointer); }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept { return allocate(MockOp::pinned_malloc, pinned_, bytes); }
    Status pinned_free(void* pointer) noexcept { return deallocate(MockOp::pinned_free, pinned_, pointer); }

    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        return transfer(MockOp::copy_to_device, device_dst, device_dst, host_src, bytes);
    }
    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        return transfer(MockOp::copy_from_device, device_src, host_dst, device_src, bytes);
    }
    Status device_memset(void* device_dst, int value, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (Status injected = begin(MockOp::device_memset); !injected)
            return finish(MockOp::device_memset, device_dst, bytes, std::move(injected));
        if (bytes > 0 && !device_.contains(device_dst, bytes)) {
            return finish(MockOp::device_memset, device_dst, bytes,
                          misuse(Errc::invalid_argument, detail::message("mock device_memset: ", bytes, " bytes at ",
                                                                         static_cast<const void*>(device_dst),
                                                                         " run outside every device allocation")));
        }
        if (bytes > 0) std::memset(device_dst, value, bytes);
        return finish(MockOp::device_memset, device_dst, bytes, {});
    }
    Status synchronize() noexcept {
        std::lock_guard lock(mutex_);
        Status injected = begin(MockOp::synchronize);
        return finish(MockOp::synchronize, nullptr, 0, std::move(injected));
    }

    /// Where the leak report goes on destruction.
    void set_error_sink(ErrorSink sink) noexcept {
        std::lock_guard lock(mutex_);
        config_.sink = sink;
    }

    // ---- fault injection --------------------------------------------------------------
    /// Makes the k-th call (1-based, counted from construction) of `op` fail with `code`.
    void fail_call(MockOp op, std::uint64_t k, Errc code = Errc::backend_failure) noexcept {
        std::lock_guard lock(mutex_);
        faults_[index(op)] = Fault{k, k, code};
    }
    /// Makes the k-th call of `op` and every later one fail with `code`.
    void fail_from(MockOp op, std::uint64_t k, Errc code = Errc::backend_failure) noexcept {
        std::lock_guard lock(mutex_);
        faults_[index(op)] = Fault{k, std::numeric_limits<std::uint64_t>::max(), code};
    }
    void clear_faults() noexcept {
        std::lock_guard lock(mutex_);
        faults_ = {};
    }

    // ---- observation ------------------------------------------------------------------
    /// Calls of `op` so far, failed ones included.
    std::uint64_t calls(MockOp op) const noexcept {
        std::lock_guard lock(mutex_);
        return calls_[index(op)];
    }
    /// Calls of every operation so far.
    std::uint64_t total_calls() const noexcept {
        std::lock_guard lock(mutex_);
        std::uint64_t total = 0;
        for (std::uint64_t n : calls_) total += n;
        return total;
    }
    std::vector<MockCall> journal() const {
        std::lock_guard lock(mutex_);
        return journal_;
    }
    void clear_journal() noexcept {
        std::lock_guard lock(mutex_);
        journal_.clear();
    }
    std::size_t live_device_allocations() const noexcept {
        std::lock_guard lock(mutex_);
        return device_.size();
    }
    std::size_t live_device_bytes() const noexcept {
        std::lock_guard lock(mutex_);
        return device_bytes_;
    }
    std::size_t live_pinned_allocations() const noexcept {
        std::lock_guard lock(mutex_);
        return pinned_.size();
    }
    /// True when [pointer, pointer + bytes) lies in one live device allocation.
    bool is_device(const void* pointer, std::size_t bytes = 1) const noexcept {
        std::lock_guard lock(mutex_);
        return device_.contains(pointer, bytes);
    }
    /// Misuses detected so far: double frees, unknown pointers, out-of-bounds copies.
    std::uint64_t misuses() const noexcept {
        std::lock_guard lock(mutex_);
        return misuses_;
    }
    /// One line per allocation never freed; empty when there is none.
    std::string leak_report() const {
        std::lock_guard lock(mutex_);
        std::string report;
        const auto describe = [&report](std::string_view kind, const auto& map) {
            map.for_each([&](void* base, const auto& entry) {
                (void)base;
                report += detail::message("mock: leaked ", kind, " allocation of ", entry.bytes, " bytes\n");
            });
        };
        describe("device", device_);
        describe("pinned", pinned_);
        if (!report.empty()) report.pop_back();
        return report;
    }

private:
    struct Fault {
        std::uint64_t first = 0, last = 0;  // 0: none
        Errc code = Errc::backend_failure;
    };
    using Blocks = detail::AddressMap<void*>;  // info: the block to std::free

    static constexpr std::size_t index(MockOp op) noexcept { return static_cast<std::size_t>(op); }

    // Counts the call; returns the injected failure if this call is one.
    Status begin(MockOp op) noexcept {
        const std::uint64_t n = ++calls_[index(op)];
        const Fault& fault = faults_[index(op)];
        if (fault.first != 0 && n >= fault.first && n <= fault.last) {
            return Status(fault.code, detail::message("mock ", to_string(op), ": injected failure of call ", n));
        }
        return {};
    }
    Status finish(MockOp op, const void* pointer, std::size_t bytes, Status status) {
        if (config_.journal) journal_.push_back(MockCall{op, pointer, bytes, status.code()});
        return status;
    }
    Status misuse(Errc code, std::string message) noexcept {
        ++misuses_;
        return Status(code, std::move(message));
    }

    Result<void*> allocate(MockOp op, Blocks& blocks, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (Status injected = begin(op); !injected) return finish(op, nullptr, bytes, std::move(injected));
        if (bytes == 0) {
            return finish(
                op, nullptr, 0,
                misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": 0 bytes requested")));
        }
        if (op == MockOp::device_malloc && bytes > config_.device_capacity - device_bytes_) {
            return finish(op, nullptr, bytes,
                          Status(Errc::out_of_memory,
                                 detail::message("mock device_malloc: ", bytes, " bytes requested, ", device_bytes_,
                                                 " of ", config_.device_capacity, " bytes in use")));
        }
        constexpr std::size_t block_alignment = 4096;
        const std::size_t padded = (bytes + config_.offset + block_alignment) / block_alignment * block_alignment;
        void* block = std::aligned_alloc(block_alignment, padded);
        if (block == nullptr) {
            return finish(op, nullptr, bytes,
                          Status(Errc::out_of_memory, detail::message("mock ", to_string(op), ": host allocation of ",
                                                                      padded, " bytes failed")));
        }
        std::memset(block, 0xA5, padded);  // stale-looking bytes, never zeros
        void* pointer = static_cast<std::byte*>(block) + config_.offset;
        blocks.insert(pointer, bytes, block);
        freed_.erase(pointer);
        if (op == MockOp::device_malloc) device_bytes_ += bytes;
        (void)finish(op, pointer, bytes, {});
        return pointer;
    }

    Status deallocate(MockOp op, Blocks& blocks, void* pointer) noexcept {
        std::lock_guard lock(mutex_);
        if (Status injected = begin(op); !injected) return finish(op, pointer, 0, std::move(injected));
        const auto entry = blocks.erase(pointer);
        if (!entry) {
            const bool twice = freed_.count(pointer) != 0;
            return finish(op, pointer, 0,
                          misuse(Errc::unknown_pointer, detail::message("mock ", to_string(op), ": ",
                                                                        twice ? "double free of " : "unknown pointer ",
                                                                        static_cast<const void*>(pointer))));
        }
        std::free(entry->info);
        freed_.insert(pointer);
        if (op == MockOp::device_free) device_bytes_ -= entry->bytes;
        return finish(op, pointer, entry->bytes, {});
    }

    Status transfer(MockOp op, const void* device, void* dst, const void* src, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (Status injected = begin(op); !injected) return finish(op, device, bytes, std::move(injected));
        if (bytes == 0) return finish(op, device, 0, {});
        if (!device_.contains(device, bytes)) {
            return finish(op, device, bytes,
                          misuse(Errc::invalid_argument,
                                 detail::message("mock ", to_string(op), ": ", bytes, " bytes at device address ",
                                                 device, " run outside every device allocation")));
        }
        if (dst == nullptr || src == nullptr) {
            return finish(
                op, device, bytes,
                misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": null host pointer")));
        }
        std::memcpy(dst, src, bytes);
        return finish(op, device, bytes, {});
    }

    MockConfig config_;
    mutable std::mutex mutex_;
    Blocks device_;
    Blocks pinned_;
    std::set<const void*> freed_;
    std::size_t device_bytes_ = 0;
    std::array<std::uint64_t, mock_op_count> calls_{};
    std::array<Fault, mock_op_count> faults_{};
    std::vector<MockCall> journal_;
    std::uint64_t misuses_ = 0;
};

static_assert(Backend<MockBackend>);
static_assert(PinnedHostBackend<MockBackend>);
static_assert(MemsetBackend<MockBackend>);
static_assert(SynchronizingBackend<MockBackend>);

}  // namespace devstage
