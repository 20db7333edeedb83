// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the pinned host mirror of a retained buffer (packed and mapped staging): byte i of
// the mirror is byte i of the device buffer's packed region. Grown like the device buffer (no
// data kept), never shrunk; mapped for the device where asked and the backend can. Owned by its
// strategy, which releases or abandons it with the device buffer.

#include <cstddef>
#include <cstdint>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class PinnedMirror {
public:
    PinnedMirror() noexcept = default;
    PinnedMirror(PinnedMirror&& other) noexcept : block_(std::exchange(other.block_, {})) {}
    PinnedMirror(const PinnedMirror&) = delete;
    PinnedMirror& operator=(const PinnedMirror&) = delete;
    PinnedMirror& operator=(PinnedMirror&&) = delete;
    ~PinnedMirror() = default;  // the owner releases or abandons first

    /// Makes the mirror hold at least `required` bytes from a base aligned to `alignment` (as
    /// the device slices are), taking `target` (>= required) when it grows, `required` if
    /// `target` cannot be had. The exact size is asked for first and over-allocated only when
    /// the pointer comes back misaligned (StagerStats::mirror_alignment_retries), or at once
    /// when `slack_first`. `keep`: the old mirror is given back only once the new one exists,
    /// so a failure keeps it; when the old one cannot be unmapped, the new one is given back
    /// instead and the slot keeps the old one (mapped and counted), the failure returned.
    /// `map`: a new mirror is mapped for the device where the backend can (MappedHostBackend; its
    /// device address must be aligned as the mirror is, else it is unmapped again): device()
    /// then gives its device address. A map refused is counted (StagerStats::map_failures) and
    /// leaves the mirror unmapped, not an error. Precondition: no pending work reads or writes
    /// the mirror (the Stager waits for a packed slot before it binds it again).
    template <Backend B>
    Status ensure(B& backend, std::size_t target, std::size_t required, std::size_t alignment, StagerStats& stats,
                  bool keep = false, bool slack_first = false, bool map = false) noexcept {
        static_assert(PinnedHostBackend<B>,
                      "PackSmall needs a PinnedHostBackend: the packed mirror is page-locked host memory "
                      "(pinned_malloc/pinned_free), which is what lets one copy each way move a run's small args");
        if (required <= block_.capacity) return {};
        if (!keep) {
            if (Status freed = give_back(backend, block_, stats); !freed) return freed;
            block_ = {};
        }
        Result<Block> grown = obtain(backend, target, alignment, slack_first, stats);
        if (!grown && target > required) grown = obtain(backend, required, alignment, slack_first, stats);
        if (!grown) {
            return Status(grown.status().code(), message("packed mirror grow failed: required ", required,
                                                         " bytes of pinned host memory from backend '", backend.name(),
                                                         "': ", grown.status().message()));
        }
        if (block_.allocation != nullptr) {  // kept until now: the new one stands only if the old one goes
            if (Status freed = give_back(backend, block_, stats); !freed) {
                Block fresh = *grown;
                (void)give_back(backend, fresh, stats);  // never mapped: a plain free
                return freed;
            }
        }
        block_ = *grown;
        if (map) map_for_device(backend, alignment, stats);
        return {};
    }

    /// Gives the mirror back to the backend (unmapped first). A mirror whose unmap fails is not
    /// freed (the backend may still map it): it stays allocated, mapped and counted, and the
    /// failure is returned; a later release tries again. A free that fails is returned, and the
    /// memory is the backend's to account for: the mirror is empty afterwards.
    template <Backend B>
    Status release(B& backend, StagerStats& stats) noexcept {
        return give_back(backend, block_, stats);
    }

    void abandon(StagerStats& stats) noexcept {
        stats.mirror_bytes -= block_.allocated;
        if (block_.device != nullptr) stats.mapped_bytes -= block_.capacity;
        block_ = {};
    }

    std::byte* data() const noexcept { return block_.data; }
    std::size_t capacity() const noexcept { return block_.capacity; }
    /// The device address of data() where the mirror is mapped, else null.
    void* device() const noexcept { return block_.device; }

private:
    struct Block {
        void* allocation = nullptr;  // what pinned_free gets
        std::byte* data = nullptr;   // aligned
        std::size_t capacity = 0;
        std::size_t allocated = 0;
        void* device = nullptr;  // mapped: the device address of data
    };

    // Unmaps (where mapped) and frees `block`, taking it off the counters. An unmap that fails
    // leaves the block as it is (allocated, mapped, counted); a free that fails still takes it
    // off (the backend's to account for). Nothing to do for an empty block.
    template <Backend B>
    static Status give_back(B& backend, Block& block, StagerStats& stats) noexcept {
        if (block.allocation == nullptr) return {};
        if constexpr (MappedHostBackend<B>) {
            if (block.device != nullptr) {
                if (Status unmapped = backend.unmap_host(block.data); !unmapped) {
                    return Status(unmapped.code(), message("packed mirror unmap failed on backend '", backend.name(),
                                                           "': ", unmapped.message(), "; the mirror (", block.allocated,
                                                           " bytes) stays allocated"));
                }
                stats.mapped_bytes -= block.capacity;
                block.device = nullptr;
            }
        }
        Status status;
        if constexpr (PinnedHostBackend<B>) {
            if (Status freed = backend.pinned_free(block.allocation); !freed) {
                status = Status(freed.code(), message("packed mirror free failed on backend '", backend.name(),
                                                      "': ", freed.message()));
            }
        }
        stats.mirror_bytes -= block.allocated;
        block = {};
        return status;
    }

    template <Backend B>
    void map_for_device(B& backend, std::size_t alignment, StagerStats& stats) noexcept {
        if constexpr (MappedHostBackend<B>) {
            Result<void*> device = backend.map_host(block_.data, block_.capacity);
            if (device && reinterpret_cast<std::uintptr_t>(*device) % alignment != 0) {
                (void)backend.unmap_host(block_.data);  // device slices would be misaligned: copy instead
                device = Status(Errc::backend_failure, "misaligned");
            }
            if (!device) {
                ++stats.map_failures;
                return;
            }
            block_.device = *device;
            ++stats.host_maps;
            stats.mapped_bytes += block_.capacity;
        } else {
            (void)backend;
            (void)alignment;
            (void)stats;
        }
    }

    // `bytes` from an `alignment`-aligned base: exactly first, with slack when misaligned (or
    // at once, `slack_first`). Counted in mirror_bytes.
    template <Backend B>
    static Result<Block> obtain(B& backend, std::size_t bytes, std::size_t alignment, bool slack_first,
                                StagerStats& stats) noexcept {
        const std::size_t with_slack = bytes + alignment - 1;
        if (with_slack < bytes) return Status(Errc::invalid_argument, "mirror size overflows");
        std::size_t allocated = slack_first ? with_slack : bytes;
        Result<void*> got = backend.pinned_malloc(allocated);
        if (got && !slack_first && reinterpret_cast<std::uintptr_t>(*got) % alignment != 0) {
            (void)backend.pinned_free(*got);
            ++stats.mirror_alignment_retries;
            allocated = with_slack;
            got = backend.pinned_malloc(allocated);
        }
        if (!got) return got.status();
        const auto at = reinterpret_cast<std::uintptr_t>(*got);
        Block block{*got, static_cast<std::byte*>(*got) + ((alignment - at % alignment) % alignment), bytes, allocated,
                    nullptr};
        stats.mirror_bytes += allocated;
        return block;
    }

    Block block_;
};

}  // namespace devstage::detail
