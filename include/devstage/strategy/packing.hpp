// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Packing policies of RetainedBump: NoPacking (one copy per staged arg) and PackSmall<Limit>
/// (args of at most Limit bytes gathered in a pinned host mirror and moved with one copy each
/// way), and the mirror itself.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage {

/// One copy per staged arg. `RetainedBump<ExactGrowth, 1024, NoPacking>` (the default)
struct NoPacking {
    static constexpr std::size_t limit = 0;
};

/// Staged args of at most `Limit` bytes are laid out together, In then InOut then Out, in a
/// retained pinned host mirror with the device buffer's offsets, so one copy uploads them all
/// and one copy brings the outputs back; larger args are copied directly from and to the
/// caller's memory. Needs a PinnedHostBackend. `RetainedBump<ExactGrowth, 1024, PackSmall<>>`
template <std::size_t Limit = 16384>
struct PackSmall {
    static_assert(Limit > 0, "PackSmall<0> packs nothing: use NoPacking");
    static constexpr std::size_t limit = Limit;
};

/// A packing policy: `P::limit`, the largest arg packed (0: none).
template <class P>
concept PackingPolicy = requires {
    { P::limit } -> std::convertible_to<std::size_t>;
};

namespace detail {

/// The pinned host mirror of a packed retained buffer: byte i of the mirror is byte i of the
/// device buffer. Grown like the device buffer (no data kept), never shrunk. Owned by its
/// strategy, which releases or abandons it with the device buffer.
class PinnedMirror {
public:
    PinnedMirror() noexcept = default;
    PinnedMirror(PinnedMirror&& other) noexcept
        : allocation_(std::exchange(other.allocation_, nullptr)),
          data_(std::exchange(other.data_, nullptr)),
          capacity_(std::exchange(other.capacity_, 0)),
          allocated_(std::exchange(other.allocated_, 0)) {}
    PinnedMirror(const PinnedMirror&) = delete;
    PinnedMirror& operator=(const PinnedMirror&) = delete;
    PinnedMirror& operator=(PinnedMirror&&) = delete;
    ~PinnedMirror() = default;  // the owner releases or abandons first

    /// Makes the mirror hold at least `required` bytes from a base aligned to `alignment` (as
    /// the device slices are), taking `target` (>= required) when it grows, `required` if
    /// `target` cannot be had. The exact size is asked for first and over-allocated only when
    /// the pointer comes back misaligned (StagerStats::mirror_alignment_retries), or at once
    /// when `slack_first`. `keep`: the old mirror is freed only once the new one
    /// exists, so a failure keeps it. Precondition: no pending work reads or writes the mirror
    /// (the Stager waits for a packed slot before it binds it again).
    template <Backend B>
    Status ensure(B& backend, std::size_t target, std::size_t required, std::size_t alignment, StagerStats& stats,
                  bool keep = false, bool slack_first = false) noexcept {
        static_assert(PinnedHostBackend<B>,
                      "PackSmall needs a PinnedHostBackend: the packed mirror is page-locked host memory "
                      "(pinned_malloc/pinned_free), which is what lets one copy each way move a run's small args");
        if (required <= capacity_) return {};
        if (!keep) {
            if (Status freed = release(backend, stats); !freed) return freed;
        }
        Status cause;
        bool grown = allocate(backend, target, alignment, slack_first, stats, cause);
        if (!grown && target > required) {
            target = required;
            grown = allocate(backend, target, alignment, slack_first, stats, cause);
        }
        if (!grown) {
            return Status(cause.code(), message("packed mirror grow failed: required ", required,
                                                " bytes of pinned host memory from backend '", backend.name(),
                                                "': ", cause.message()));
        }
        return {};
    }

    /// Gives the mirror back to the backend; it is empty afterwards even if the free failed.
    template <Backend B>
    Status release(B& backend, StagerStats& stats) noexcept {
        if (allocation_ == nullptr) return {};
        Status status;
        if constexpr (PinnedHostBackend<B>) status = backend.pinned_free(allocation_);
        stats.mirror_bytes -= allocated_;
        allocation_ = data_ = nullptr;
        capacity_ = allocated_ = 0;
        if (!status) {
            return Status(status.code(),
                          message("packed mirror free failed on backend '", backend.name(), "': ", status.message()));
        }
        return status;
    }

    void abandon(StagerStats& stats) noexcept {
        stats.mirror_bytes -= allocated_;
        allocation_ = data_ = nullptr;
        capacity_ = allocated_ = 0;
    }

    std::byte* data() const noexcept { return data_; }
    std::size_t capacity() const noexcept { return capacity_; }

private:
    // Takes `bytes` from an `alignment`-aligned base: exactly first, with slack when misaligned
    // (or at once, `slack_first`). On success a mirror still held (grown with keep) is freed and
    // replaced.
    template <Backend B>
    bool allocate(B& backend, std::size_t bytes, std::size_t alignment, bool slack_first, StagerStats& stats,
                  Status& cause) noexcept {
        const std::size_t with_slack = bytes + alignment - 1;
        if (with_slack < bytes) {
            cause = Status(Errc::invalid_argument, "mirror size overflows");
            return false;
        }
        std::size_t allocated = slack_first ? with_slack : bytes;
        Result<void*> got = backend.pinned_malloc(allocated);
        if (got && !slack_first && reinterpret_cast<std::uintptr_t>(*got) % alignment != 0) {
            if constexpr (PinnedHostBackend<B>) (void)backend.pinned_free(*got);
            ++stats.mirror_alignment_retries;
            allocated = with_slack;
            got = backend.pinned_malloc(allocated);
        }
        if (!got) {
            cause = got.status();
            return false;
        }
        if (allocation_ != nullptr) (void)release(backend, stats);  // the new mirror stands either way
        allocation_ = *got;
        const auto at = reinterpret_cast<std::uintptr_t>(allocation_);
        data_ = static_cast<std::byte*>(allocation_) + ((alignment - at % alignment) % alignment);
        capacity_ = bytes;
        allocated_ = allocated;
        stats.mirror_bytes += allocated;
        return true;
    }

    void* allocation_ = nullptr;  // what pinned_free gets
    std::byte* data_ = nullptr;   // aligned
    std::size_t capacity_ = 0;
    std::size_t allocated_ = 0;
};

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
