// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared test helpers: backend factories, byte patterns, device read-back, byte comparison.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/plan.hpp"
#include "devstage/stats.hpp"
#include "devstage/strategy/concept.hpp"

namespace devstage::test {

/// A MockBackend whose pointers are aligned to exactly its device_alignment (64) and not more.
class AdversarialMock : public MockBackend {
public:
    AdversarialMock() noexcept : MockBackend(MockConfig::adversarial()) {}
    explicit AdversarialMock(MockConfig config) noexcept : MockBackend(config) {}
};

/// A MockBackend whose enqueued work runs only when the host synchronizes, in an adversarial
/// order across streams (MockConfig::deferred_async).
class DeferredMock : public MockBackend {
public:
    DeferredMock() noexcept : MockBackend(MockConfig{.deferred_async = true}) {}
    explicit DeferredMock(MockConfig config) noexcept : MockBackend(deferred(config)) {}

private:
    static MockConfig deferred(MockConfig config) noexcept {
        config.deferred_async = true;
        return config;
    }
};

/// A MockBackend that takes batches of up to `limit` copies (MockConfig::batch_copy_limit);
/// deferred when `Deferred`.
template <std::size_t Limit, bool Deferred = false>
class BatchingMock : public MockBackend {
public:
    static constexpr std::size_t limit = Limit;
    BatchingMock() noexcept : BatchingMock(MockConfig{}) {}
    explicit BatchingMock(MockConfig config) noexcept : MockBackend(batching(config)) {}

private:
    static MockConfig batching(MockConfig config) noexcept {
        config.batch_copy_limit = Limit;
        config.deferred_async = Deferred;
        return config;
    }
};

/// A SimBackend that takes batches of up to `Limit` copies (SimConfig::batch_copy_limit).
template <std::size_t Limit>
class BatchingSim : public SimBackend {
public:
    BatchingSim() noexcept : BatchingSim(SimConfig{}) {}
    explicit BatchingSim(SimConfig config) noexcept : SimBackend(batching(config)) {}

private:
    static SimConfig batching(SimConfig config) noexcept {
        config.batch_copy_limit = Limit;
        return config;
    }
};

/// How tests make a backend with a device capacity. Specialize for other backends.
template <class B>
struct BackendFactory {
    static std::unique_ptr<B> make() { return std::make_unique<B>(); }
};
template <>
struct BackendFactory<SimBackend> {
    static std::unique_ptr<SimBackend> make(std::size_t capacity = std::size_t{1} << 32) {
        return std::make_unique<SimBackend>(SimConfig{.device_capacity = capacity});
    }
};
template <>
struct BackendFactory<MockBackend> {
    static std::unique_ptr<MockBackend> make(std::size_t capacity = std::size_t{1} << 32) {
        return std::make_unique<MockBackend>(MockConfig{.device_capacity = capacity});
    }
};
template <>
struct BackendFactory<AdversarialMock> {
    static std::unique_ptr<AdversarialMock> make(std::size_t capacity = std::size_t{1} << 32) {
        MockConfig config = MockConfig::adversarial();
        config.device_capacity = capacity;
        return std::make_unique<AdversarialMock>(config);
    }
};

template <std::size_t Limit, bool Deferred>
struct BackendFactory<BatchingMock<Limit, Deferred>> {
    static std::unique_ptr<BatchingMock<Limit, Deferred>> make(std::size_t capacity = std::size_t{1} << 32) {
        return std::make_unique<BatchingMock<Limit, Deferred>>(MockConfig{.device_capacity = capacity});
    }
};
template <std::size_t Limit>
struct BackendFactory<BatchingSim<Limit>> {
    static std::unique_ptr<BatchingSim<Limit>> make(std::size_t capacity = std::size_t{1} << 32) {
        return std::make_unique<BatchingSim<Limit>>(SimConfig{.device_capacity = capacity});
    }
};
template <>
struct BackendFactory<DeferredMock> {
    static std::unique_ptr<DeferredMock> make(std::size_t capacity = std::size_t{1} << 32) {
        return std::make_unique<DeferredMock>(MockConfig{.device_capacity = capacity});
    }
};

/// A backend's synchronous operations only: the Stager sees it through SynchronousAdapter.
template <class Inner>
class SyncOnly {
public:
    static constexpr std::size_t device_alignment = Inner::device_alignment;
    std::string_view name() const noexcept { return inner_.name(); }
    Result<void*> device_malloc(std::size_t n) noexcept { return inner_.device_malloc(n); }
    Status device_free(void* p) noexcept { return inner_.device_free(p); }
    Status copy_to_device(void* d, const void* s, std::size_t n) noexcept { return inner_.copy_to_device(d, s, n); }
    Status copy_from_device(void* d, const void* s, std::size_t n) noexcept { return inner_.copy_from_device(d, s, n); }
    Result<void*> pinned_malloc(std::size_t n) noexcept { return inner_.pinned_malloc(n); }
    Status pinned_free(void* p) noexcept { return inner_.pinned_free(p); }
    Inner& inner() noexcept { return inner_; }

private:
    Inner inner_;
};

/// An ErrorSink that drops what it is told, for tests that provoke reports on purpose.
inline void quiet_sink(const Status&) noexcept {}

template <class B>
std::unique_ptr<B> make_backend() {
    return BackendFactory<B>::make();
}
template <class B>
std::unique_ptr<B> make_backend(std::size_t capacity) {
    return BackendFactory<B>::make(capacity);
}

/// Bytes that differ at every position and between seeds.
inline std::vector<std::byte> pattern(std::size_t bytes, std::uint32_t seed) {
    std::vector<std::byte> out(bytes);
    std::uint32_t x = seed * 2654435761u + 1;
    for (auto& b : out) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b = static_cast<std::byte>(x);
    }
    return out;
}

/// Runs a strategy's prepare for a plan, as a Stager with no pending work would.
template <class S, Backend B>
Status prepare_for(S& strategy, B& backend, const StagingPlan& plan, StagerStats& stats) {
    FreeQueue<B> queue(backend, stats, ErrorSink(&quiet_sink));
    return strategy.prepare(backend, Requirement{plan.required_bytes(), plan.layout().packed_bytes}, stats, queue);
}

template <Backend B>
std::vector<std::byte> read_device(B& backend, const void* device, std::size_t bytes) {
    std::vector<std::byte> out(bytes);
    if (bytes > 0 && !backend.copy_from_device(out.data(), device, bytes)) out.clear();
    return out;
}

}  // namespace devstage::test

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <span>
#include <string>

#include "devstage/tensor.hpp"

namespace devstage::test {

/// The outcome of comparing bytes: `CHECK(same_bytes(actual, expected))`. Catch2 prints the
/// sizes and the first differing index, never the bytes themselves (a CHECK on two
/// `std::vector<std::byte>` would turn each into text, megabytes of it under `-s`).
class BytesComparison {
public:
    BytesComparison(bool equal, std::string description) : equal_(equal), description_(std::move(description)) {}
    explicit operator bool() const noexcept { return equal_; }
    const std::string& description() const noexcept { return description_; }
    friend std::ostream& operator<<(std::ostream& out, const BytesComparison& comparison) {
        return out << comparison.description_;
    }

private:
    bool equal_;
    std::string description_;
};

namespace detail {
inline std::string hex_byte(std::byte b) {
    char text[5];
    std::snprintf(text, sizeof text, "0x%02x", static_cast<unsigned>(b));
    return text;
}
}  // namespace detail

/// Equal when both hold the same bytes; otherwise says how the sizes and the first difference look.
inline BytesComparison same_bytes(std::span<const std::byte> actual, std::span<const std::byte> expected) {
    const auto [a, e] = std::mismatch(actual.begin(), actual.end(), expected.begin(), expected.end());
    const std::string sizes = std::to_string(actual.size()) + " bytes, expected " + std::to_string(expected.size());
    if (a == actual.end() && e == expected.end()) return {true, "the same " + std::to_string(actual.size()) + " bytes"};
    const auto index = static_cast<std::size_t>(a - actual.begin());
    std::string first = "first difference at index " + std::to_string(index) + ": ";
    if (a == actual.end()) {
        first += "actual ends, expected " + detail::hex_byte(*e);
    } else if (e == expected.end()) {
        first += detail::hex_byte(*a) + ", expected ends";
    } else {
        first += detail::hex_byte(*a) + ", expected " + detail::hex_byte(*e);
    }
    return {false, sizes + "; " + first};
}

/// The same for lists of buffers (HostRun::buffers): the first buffer that differs, and how.
inline BytesComparison same_bytes(const std::vector<std::vector<std::byte>>& actual,
                                  const std::vector<std::vector<std::byte>>& expected) {
    if (actual.size() != expected.size()) {
        return {false, std::to_string(actual.size()) + " buffers, expected " + std::to_string(expected.size())};
    }
    for (std::size_t i = 0; i < actual.size(); ++i) {
        if (BytesComparison buffer = same_bytes(actual[i], expected[i]); !buffer) {
            return {false, "buffer " + std::to_string(i) + ": " + buffer.description()};
        }
    }
    return {true, "the same " + std::to_string(actual.size()) + " buffers"};
}

/// Host tensors for one run: owned buffers plus the TensorArg list that points at them.
struct HostRun {
    std::vector<std::vector<std::byte>> buffers;
    std::vector<TensorArg> args;

    void add(std::size_t bytes, Direction direction, std::uint32_t seed) {
        buffers.push_back(pattern(bytes, seed));
        args.push_back(TensorArg{nullptr, bytes, direction, Placement::Host});
        relink();
    }
    void add_device(void* device, std::size_t bytes) {
        buffers.emplace_back();
        args.push_back(TensorArg{device, bytes, Direction::InOut, Placement::Device});
    }
    void relink() {
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i].placement == Placement::Host) args[i].data = buffers[i].empty() ? nullptr : buffers[i].data();
        }
    }
};

/// A decode-like run: 4 In args (one of them large), one InOut, one Out.
inline HostRun decode_like_run() {
    HostRun host;
    host.add(40000, Direction::In, 1);
    host.add(2048, Direction::In, 2);
    host.add(128, Direction::In, 3);
    host.add(64, Direction::In, 4);
    host.add(3000, Direction::InOut, 5);
    host.add(40000, Direction::Out, 6);
    return host;
}

/// A stand-in kernel run through the backend's own copies: every non-In arg with bytes is
/// rewritten on the device from the bytes of all args, so results depend on every upload.
template <Backend B>
Status fake_kernel(B& backend, std::span<const TensorArg> device_args, std::span<const TensorArg> host_args) {
    std::uint8_t mix = 0;
    std::vector<std::byte> bytes;
    for (std::size_t i = 0; i < device_args.size(); ++i) {
        if (device_args[i].bytes == 0 || host_args[i].direction == Direction::Out) continue;
        bytes.resize(device_args[i].bytes);
        if (Status s = backend.copy_from_device(bytes.data(), device_args[i].data, bytes.size()); !s) return s;
        for (std::byte b : bytes) mix = static_cast<std::uint8_t>(mix * 31 + static_cast<std::uint8_t>(b));
    }
    for (std::size_t i = 0; i < device_args.size(); ++i) {
        if (device_args[i].bytes == 0 || host_args[i].direction == Direction::In) continue;
        bytes.resize(device_args[i].bytes);
        if (Status s = backend.copy_from_device(bytes.data(), device_args[i].data, bytes.size()); !s) return s;
        for (std::size_t b = 0; b < bytes.size(); ++b) {
            const auto old =
                host_args[i].direction == Direction::Out ? std::uint8_t{0} : static_cast<std::uint8_t>(bytes[b]);
            bytes[b] = static_cast<std::byte>(old ^ static_cast<std::uint8_t>(mix + i + b));
        }
        if (Status s = backend.copy_to_device(device_args[i].data, bytes.data(), bytes.size()); !s) return s;
    }
    return {};
}

}  // namespace devstage::test
