// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: device allocation shared by the strategies — counted, checked against the
// backend's promised alignment, and over-allocated when the caller needs more alignment.

#include <cstddef>
#include <string>
#include <string_view>

#include "devstage/backend.hpp"
#include "devstage/detail/util/align.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

struct AlignedAllocation {
    void* allocation = nullptr;  ///< what device_free gets
    void* base = nullptr;        ///< `allocation` aligned up to the wanted alignment
    std::size_t allocated = 0;   ///< bytes asked of the backend
};

/// Allocates at least `usable` bytes whose start is aligned to `Alignment`.
/// `what` names the caller in messages. Counts the malloc (and any free) in `stats`.
template <std::size_t Alignment, Backend B>
Result<AlignedAllocation> allocate_aligned(B& backend, std::size_t usable, std::string_view what,
                                           StagerStats& stats) noexcept {
    constexpr std::size_t slack = alignment_slack(B::device_alignment, Alignment);
    const auto total = add(usable, slack);
    if (!total || *total == 0) {
        return Status(Errc::invalid_argument, message(what, ": cannot allocate ", usable, " bytes plus ", slack,
                                                      " bytes of alignment slack from backend '", backend.name(), "'"));
    }
    Result<void*> pointer = backend.device_malloc(*total);
    if (!pointer) {
        const Status& cause = pointer.status();
        return Status(cause.code(),
                      message(what, " failed: required ", *total, " bytes (", usable, " + ", slack,
                              " alignment slack) from backend '", backend.name(), "': ", cause.message()));
    }
    ++stats.device_mallocs;
    if (*pointer == nullptr || !is_aligned(*pointer, B::device_alignment)) {
        std::string refused =
            message(what, ": backend '", backend.name(), "' returned ", static_cast<const void*>(*pointer), " for ",
                    *total, " bytes, not aligned to its device_alignment ", B::device_alignment);
        if (*pointer != nullptr) {
            ++stats.device_frees;
            if (Status freed = backend.device_free(*pointer); !freed) {
                ++stats.free_failures;
                refused += message("; freeing it failed too: ", freed.message());
            }
        }
        return Status(Errc::backend_failure, refused);
    }
    return AlignedAllocation{*pointer, align_pointer(*pointer, Alignment), *total};
}

/// Allocates at least `usable` bytes whose start is aligned to `Alignment`, asking for exactly
/// `usable` first: real devices align far better than they promise, so the slack of
/// allocate_aligned is only paid (free, then allocate with slack; StagerStats::alignment_retries)
/// when the exact allocation comes back misaligned. `slack_first`: the backend misaligned
/// before, so the slack is asked for at once.
template <std::size_t Alignment, Backend B>
Result<AlignedAllocation> allocate_exact_first(B& backend, std::size_t usable, std::string_view what,
                                               StagerStats& stats, bool slack_first = false) noexcept {
    if constexpr (alignment_slack(B::device_alignment, Alignment) == 0) {
        return allocate_aligned<Alignment>(backend, usable, what, stats);
    } else {
        if (slack_first) return allocate_aligned<Alignment>(backend, usable, what, stats);
        Result<AlignedAllocation> exact = allocate_aligned<1>(backend, usable, what, stats);
        if (!exact || is_aligned(exact->allocation, Alignment)) {
            if (exact) exact->base = exact->allocation;
            return exact;
        }
        ++stats.alignment_retries;
        ++stats.device_frees;
        if (Status freed = backend.device_free(exact->allocation); !freed) {
            ++stats.free_failures;
            return Status(freed.code(), message(what, ": freeing a misaligned allocation of ", usable,
                                                " bytes failed on backend '", backend.name(), "': ", freed.message()));
        }
        return allocate_aligned<Alignment>(backend, usable, what, stats);
    }
}

}  // namespace devstage::detail
