// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Packing policies of RetainedBump: NoPacking (one copy per staged arg) and PackSmall<Limit>
/// (args of at most Limit bytes gathered in a pinned host mirror and moved with one copy each
/// way), and the mirror itself.

#include <concepts>
#include <cstddef>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/detail/message.hpp"
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
        : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}
    PinnedMirror(const PinnedMirror&) = delete;
    PinnedMirror& operator=(const PinnedMirror&) = delete;
    PinnedMirror& operator=(PinnedMirror&&) = delete;
    ~PinnedMirror() = default;  // the owner releases or abandons first

    /// Makes the mirror hold at least `required` bytes, taking `target` (>= required) when it
    /// grows, `required` if `target` cannot be had. Precondition: no pending work reads or
    /// writes the mirror (the Stager waits for a packed slot before it binds it again).
    template <Backend B>
    Status ensure(B& backend, std::size_t target, std::size_t required, StagerStats& stats) noexcept {
        static_assert(PinnedHostBackend<B>,
                      "PackSmall needs a PinnedHostBackend: the packed mirror is page-locked host memory "
                      "(pinned_malloc/pinned_free), which is what lets one copy each way move a run's small args");
        if (required <= capacity_) return {};
        if (Status freed = release(backend, stats); !freed) return freed;
        Result<void*> grown = backend.pinned_malloc(target);
        if (!grown && target > required) {
            target = required;
            grown = backend.pinned_malloc(target);
        }
        if (!grown) {
            const Status& cause = grown.status();
            return Status(cause.code(), message("packed mirror grow failed: required ", required,
                                                " bytes of pinned host memory from backend '", backend.name(),
                                                "': ", cause.message()));
        }
        data_ = static_cast<std::byte*>(*grown);
        capacity_ = target;
        stats.mirror_bytes += target;
        return {};
    }

    /// Gives the mirror back to the backend; it is empty afterwards even if the free failed.
    template <Backend B>
    Status release(B& backend, StagerStats& stats) noexcept {
        if (data_ == nullptr) return {};
        Status status;
        if constexpr (PinnedHostBackend<B>) status = backend.pinned_free(data_);
        stats.mirror_bytes -= capacity_;
        data_ = nullptr;
        capacity_ = 0;
        if (!status) {
            return Status(status.code(),
                          message("packed mirror free failed on backend '", backend.name(), "': ", status.message()));
        }
        return status;
    }

    void abandon(StagerStats& stats) noexcept {
        stats.mirror_bytes -= capacity_;
        data_ = nullptr;
        capacity_ = 0;
    }

    std::byte* data() const noexcept { return data_; }
    std::size_t capacity() const noexcept { return capacity_; }

private:
    std::byte* data_ = nullptr;
    std::size_t capacity_ = 0;
};

}  // namespace detail
}  // namespace devstage
