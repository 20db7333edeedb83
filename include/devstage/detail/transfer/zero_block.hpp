// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: device memory set to zero where the backend cannot set it itself — zeros uploaded
// from one block in static storage, chunk by chunk. The Stager zeroes Out args this way on a
// backend without a device memset; the C interface's callback backend serves its
// device_memset_async this way when the runtime gave no memset callback.

#include <cstddef>
#include <cstdint>

#include "devstage/status.hpp"

namespace devstage::detail {

/// The zeros uploaded: one block in static storage (zero-initialized, so it costs no memory
/// until read, and shared by every user in the program). Pending uploads may read it at any
/// time: it is never freed.
inline constexpr std::size_t zero_block_bytes = std::size_t{1} << 20;
alignas(4096) inline std::byte zero_block[zero_block_bytes]{};

/// Sets `bytes` of device memory at `dst` to zero with uploads of the zero block enqueued on
/// `stream` (`async.copy_to_device_async`), at most zero_block_bytes each; `uploads` counts those
/// that were enqueued. Returns the first failure; the uploads enqueued before it stay enqueued.
template <class A, class Stream>
Status upload_zeros(A& async, void* dst, std::size_t bytes, Stream stream, std::uint64_t& uploads) noexcept {
    for (std::size_t done = 0; done < bytes;) {
        const std::size_t chunk = bytes - done < zero_block_bytes ? bytes - done : zero_block_bytes;
        Status copied = async.copy_to_device_async(static_cast<std::byte*>(dst) + done, zero_block, chunk, stream);
        if (!copied) return copied;
        ++uploads;
        done += chunk;
    }
    return {};
}

}  // namespace devstage::detail
