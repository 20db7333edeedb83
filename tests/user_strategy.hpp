// SPDX-License-Identifier: Apache-2.0
#pragma once
// A retained strategy written the way a user would write one, from the StagingStrategy concept
// alone (strategy/concept.hpp), not derived from RetainedBump: one device buffer per slot,
// grown to exactly what a run requires by freeing the old one first, and a pinned host mirror of
// the packed region grown the same way (never mapped). `Packing` is only the default of a
// stager's pack limit. The staging suites run over it (tests/test_user_strategy.cpp).

#include <cstddef>
#include <cstdint>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/concept.hpp"
#include "devstage/strategy/packing.hpp"

namespace devstage::test {

template <std::size_t Alignment = 1024, class Packing = NoPacking>
class FreeFirstArena {
public:
    static constexpr std::size_t alignment = Alignment;
    static constexpr ReleaseKind lease_kind = ReleaseKind::BufferNoop;
    using packing = Packing;

    FreeFirstArena() noexcept = default;
    FreeFirstArena(const FreeFirstArena& /*other*/) noexcept {}  // a copy is an empty slot
    FreeFirstArena(FreeFirstArena&& other) noexcept
        : device_(std::exchange(other.device_, {})), mirror_(std::exchange(other.mirror_, {})) {}
    FreeFirstArena& operator=(const FreeFirstArena&) = delete;
    FreeFirstArena& operator=(FreeFirstArena&&) = delete;
    ~FreeFirstArena() = default;

    template <Backend B>
    Status prepare(B& backend, const Requirement& need, StagerStats& stats, FreeQueue<B>& queue) noexcept {
        if (need.device_bytes > device_.bytes) {
            if (device_.allocation != nullptr) {
                stats.retained_bytes -= device_.allocated;
                if (Status freed = queue.free(std::exchange(device_, {}).allocation); !freed) queue.report(freed);
            }
            const std::size_t asked = need.device_bytes + Alignment;
            Result<void*> got = backend.device_malloc(asked);
            if (!got) {
                ++stats.grow_failures;
                return Status(
                    got.status().code(),
                    devstage::detail::message("retained buffer grow failed: required ", need.device_bytes,
                                              " bytes from backend '", backend.name(), "': ", got.status().message()));
            }
            ++stats.device_mallocs;
            ++stats.regrows;
            stats.retained_bytes += asked;
            device_ = Block{*got, aligned(*got), need.device_bytes, asked};
        }
        if (need.mirror_bytes > mirror_.bytes) {
            if constexpr (PinnedHostBackend<B>) {
                if (mirror_.allocation != nullptr) {
                    stats.mirror_bytes -= mirror_.allocated;
                    if (Status freed = backend.pinned_free(std::exchange(mirror_, {}).allocation); !freed) return freed;
                }
                const std::size_t asked = need.mirror_bytes + Alignment;
                Result<void*> got = backend.pinned_malloc(asked);
                if (!got) {
                    ++stats.grow_failures;
                    return got.status();
                }
                stats.mirror_bytes += asked;
                mirror_ = Block{*got, aligned(*got), need.mirror_bytes, asked};
            } else {
                return Status(Errc::not_supported, "free-first arena: a mirror needs pinned host memory");
            }
        }
        return {};
    }

    template <Backend B>
    Status release_retained(B& backend, StagerStats& stats) noexcept {
        Status first;
        if (device_.allocation != nullptr) {
            ++stats.device_frees;
            stats.retained_bytes -= device_.allocated;
            first = backend.device_free(std::exchange(device_, {}).allocation);
        }
        if constexpr (PinnedHostBackend<B>) {
            if (mirror_.allocation != nullptr) {
                stats.mirror_bytes -= mirror_.allocated;
                Status freed = backend.pinned_free(std::exchange(mirror_, {}).allocation);
                if (first.ok()) first = std::move(freed);
            }
        }
        return first;
    }

    void abandon(StagerStats& stats) noexcept {
        stats.retained_bytes -= device_.allocated;
        stats.mirror_bytes -= mirror_.allocated;
        device_ = {};
        mirror_ = {};
    }

    std::size_t capacity() const noexcept { return device_.bytes; }
    void* base() const noexcept { return device_.base; }
    std::byte* mirror() const noexcept { return static_cast<std::byte*>(mirror_.base); }
    std::size_t mirror_capacity() const noexcept { return mirror_.bytes; }
    void* mirror_device() const noexcept { return nullptr; }  // never mapped: its slots copy
    std::size_t device_need(const Requirement& need) const noexcept { return need.device_bytes; }

private:
    struct Block {
        void* allocation = nullptr;
        void* base = nullptr;
        std::size_t bytes = 0;
        std::size_t allocated = 0;
    };
    static void* aligned(void* pointer) noexcept {
        const auto at = reinterpret_cast<std::uintptr_t>(pointer);
        return static_cast<std::byte*>(pointer) + ((Alignment - at % Alignment) % Alignment);
    }

    Block device_;
    Block mirror_;
};

}  // namespace devstage::test
