// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Packing policies of RetainedBump: NoPacking (one copy per staged arg), PackSmall<Limit>
/// (args of at most Limit bytes gathered in a pinned host mirror and moved with one copy each
/// way) and MapSmall<Limit> (the same mirror mapped for the device, read and written by the
/// kernel in place: no copy), and the mirror itself.

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

/// As PackSmall<Limit>, with the mirror mapped for the device where the backend maps pinned
/// host memory (MappedHostBackend): the kernel reads and writes a run's small args in the
/// mirror, in place — no upload, no copy back; Out args are zeroed by the host. Where the
/// backend cannot map (no such capability, or map_host refused for a slot's mirror), the slot
/// stages as PackSmall<Limit> does. `RetainedBump<ExactGrowth, 1024, MapSmall<>>`
template <std::size_t Limit = 16384>
struct MapSmall {
    static_assert(Limit > 0, "MapSmall<0> maps nothing: use NoPacking");
    static constexpr std::size_t limit = Limit;
    static constexpr bool map = true;
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
          allocated_(std::exchange(other.allocated_, 0)),
          device_(std::exchange(other.device_, nullptr)) {}
    PinnedMirror(const PinnedMirror&) = delete;
    PinnedMirror& operator=(const PinnedMirror&) = delete;
    PinnedMirror& operator=(PinnedMirror&&) = delete;
    ~PinnedMirror() = default;  // the owner releases or abandons first

    /// Makes the mirror hold at least `required` bytes from a base aligned to `alignment` (as
    /// the device slices are), taking `target` (>= required) when it grows, `required` if
    /// `target` cannot be had. The exact size is asked for first and over-allocated only when
    /// the pointer comes back misaligned (StagerStats::mirror_alignment_retries), or at once
    /// when `slack_first`. `keep`: the old mirror is freed only once the new one
    /// exists, so a failure keeps it. `map`: a new mirror is mapped for the device where the
    /// backend can (MappedHostBackend; its device address must be aligned as the mirror is,
    /// else it is unmapped again): device() then gives its device address. A map refused is
    /// counted (StagerStats::map_failures) and leaves the mirror unmapped, not an error.
    /// Precondition: no pending work reads or writes the mirror (the Stager waits for a packed
    /// slot before it binds it again).
    template <Backend B>
    Status ensure(B& backend, std::size_t target, std::size_t required, std::size_t alignment, StagerStats& stats,
                  bool keep = false, bool slack_first = false, bool map = false) noexcept {
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
        if (map) map_for_device(backend, alignment, stats);
        return {};
    }

    /// Gives the mirror back to the backend (unmapped first); it is empty afterwards even if
    /// a call failed. A mirror whose unmap fails is not freed (the backend may still map it):
    /// it stays allocated, and the failure is returned.
    template <Backend B>
    Status release(B& backend, StagerStats& stats) noexcept {
        if (allocation_ == nullptr) return {};
        Status status;
        if constexpr (MappedHostBackend<B>) {
            if (device_ != nullptr) {
                status = backend.unmap_host(data_);
                stats.mapped_bytes -= capacity_;
                device_ = nullptr;
                if (!status) {
                    status = Status(status.code(), message("packed mirror unmap failed on backend '", backend.name(),
                                                           "': ", status.message(), "; the mirror (", allocated_,
                                                           " bytes) stays allocated"));
                }
            }
        }
        if constexpr (PinnedHostBackend<B>) {
            if (status.ok()) {
                status = backend.pinned_free(allocation_);
                if (!status) {
                    status = Status(status.code(), message("packed mirror free failed on backend '", backend.name(),
                                                           "': ", status.message()));
                }
            }
        }
        stats.mirror_bytes -= allocated_;
        allocation_ = data_ = nullptr;
        capacity_ = allocated_ = 0;
        return status;
    }

    void abandon(StagerStats& stats) noexcept {
        stats.mirror_bytes -= allocated_;
        if (device_ != nullptr) stats.mapped_bytes -= capacity_;
        allocation_ = data_ = nullptr;
        device_ = nullptr;
        capacity_ = allocated_ = 0;
    }

    std::byte* data() const noexcept { return data_; }
    std::size_t capacity() const noexcept { return capacity_; }
    /// The device address of data() where the mirror is mapped (MapSmall), else null.
    void* device() const noexcept { return device_; }

private:
    template <Backend B>
    void map_for_device(B& backend, std::size_t alignment, StagerStats& stats) noexcept {
        if constexpr (MappedHostBackend<B>) {
            Result<void*> device = backend.map_host(data_, capacity_);
            if (device && reinterpret_cast<std::uintptr_t>(*device) % alignment != 0) {
                (void)backend.unmap_host(data_);  // device slices would be misaligned: copy instead
                device = Status(Errc::backend_failure, "misaligned");
            }
            if (!device) {
                ++stats.map_failures;
                return;
            }
            device_ = *device;
            ++stats.host_maps;
            stats.mapped_bytes += capacity_;
        } else {
            (void)backend;
            (void)alignment;
            (void)stats;
        }
    }

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
    void* device_ = nullptr;  // mapped: the device address of data_
};

}  // namespace detail
}  // namespace devstage

#endif  // DEVSTAGE_CXX20
