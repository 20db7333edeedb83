// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: the longer errors a pinned pool's core returns or reports, each naming what was
/// asked, the sizes and the backend, kept here so that the steps read as what they do. Built on
/// noexcept paths: a message that cannot be built for want of host memory is empty (the Errc
/// still tells).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/status.hpp"

namespace devstage::detail::pinned_messages {

/// record() of a pointer that is no live allocation.
inline Status not_live(const void* pointer, const std::string& name) noexcept {
    return Status(Errc::unknown_pointer,
                  message_or_empty("pinned pool record: ", pointer, " is not a live allocation of this pool (backend '",
                                   name, "')"));
}

/// record() of a stream that `backend` refused, or whose event could not be had or recorded.
inline Status refused(std::string_view backend, const void* backend_address, const void* pointer,
                      const Status& cause) noexcept {
    return Status(cause.code(), message_or_empty("pinned pool record: the stream was refused by backend '", backend,
                                                 "' (", backend_address, "), the backend named for the stream: ",
                                                 cause.message(), "; nothing was recorded for ", pointer));
}

/// release() or deallocate() of a pointer that is no live allocation (of that grant).
inline Status unknown_pointer(const char* what, const void* pointer, const std::string& name) noexcept {
    return Status(Errc::unknown_pointer,
                  message_or_empty("pinned pool ", what, ": ", pointer,
                                   " is not a live allocation of this pool (backend '", name, "')"));
}

/// release() of a container's memory, or a container's deallocation of other memory.
inline Status wrong_holder(bool of_container, const void* pointer, const std::string& name) noexcept {
    if (of_container) {
        return Status(Errc::invalid_argument,
                      message_or_empty("pinned pool release: ", pointer,
                                       " belongs to a container (PinnedAllocator, PinnedMemoryResource or "
                                       "RegionAllocator), whose deallocation alone gives it back (backend '",
                                       name, "')"));
    }
    return Status(
        Errc::unknown_pointer,
        message_or_empty("pinned pool deallocate: ", pointer,
                         " is a buffer's or raw allocation of this pool, not a container's (backend '", name, "')"));
}

/// A region id that is not (or no longer) the pool's.
inline Status unknown_region(std::uint64_t id) noexcept {
    return Status(Errc::unknown_pointer,
                  message_or_empty("pinned region ", id, " is not a region of this pool (its handle was dropped)"));
}

/// create_region() of `bytes` failed for `cause`.
inline Status region_failure(std::size_t bytes, const std::string& name, const Status& cause) noexcept {
    return Status(cause.code(), message_or_empty("pinned pool create_region: ", bytes, " bytes on backend '", name,
                                                 "' failed: ", cause.message()));
}

/// What finalize() found still live.
inline Status finalized_live(std::uint64_t held, std::uint64_t held_bytes, const std::string& name) noexcept {
    return Status(Errc::leaked, message_or_empty("pinned pool finalize: ", held, " allocation(s) still live, ",
                                                 held_bytes, " bytes, on backend '", name,
                                                 "'; they stay valid and go back to the backend when released"));
}

/// What the pool's destruction found still live: raw allocations (freed) and what buffers and
/// containers hold.
inline Status destroyed_live(std::uint64_t raw, std::uint64_t raw_bytes, std::uint64_t held, std::uint64_t held_bytes,
                             const std::string& name) noexcept {
    return Status(Errc::leaked,
                  message_or_empty("pinned pool destroyed: ", held + raw, " allocation(s) still live, ",
                                   held_bytes + raw_bytes, " bytes, on backend '", name, "': ", raw, " raw (",
                                   raw_bytes, " bytes) freed, since nothing can release them now; ", held,
                                   " held by buffers or containers (", held_bytes,
                                   " bytes) stay valid and go back to the backend when released"));
}

/// Blocks the core's destruction leaves allocated: their recorded work could not be waited for.
inline Status destroyed_retiring(std::uint64_t blocks, std::uint64_t bytes, const std::string& name) noexcept {
    return Status(Errc::leaked, message_or_empty("pinned pool destroyed: ", blocks, " block(s), ", bytes,
                                                 " bytes, given back with recorded work that could not be waited for "
                                                 "stay allocated on backend '",
                                                 name, "'"));
}

/// What a teardown found still held.
inline Status torn_down_held(std::uint64_t unpinned, std::uint64_t revoked, std::uint64_t revoked_bytes,
                             const std::string& name) noexcept {
    return Status(Errc::leaked, message_or_empty("pinned pool: backend '", name, "' was torn down while ",
                                                 revoked + unpinned, " allocation(s) were still held: ", unpinned,
                                                 " unpinned in place (valid, pageable memory until given back), ",
                                                 revoked, " (", revoked_bytes,
                                                 " bytes) freed before the device went: their holders must not use "
                                                 "them"));
}

}  // namespace devstage::detail::pinned_messages
