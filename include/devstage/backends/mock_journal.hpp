// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What a MockBackend journals and counts: its operations (MockOp, with their names) and one
/// journaled call (MockCall). `for (const MockCall& call : mock.journal()) log(to_string(call.op));`

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

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
    create_stream,
    destroy_stream,
    copy_to_device_async,
    copy_from_device_async,
    create_event,
    destroy_event,
    record_event,
    event_ready,
    synchronize_event,
    stream_wait_event,
    launch_host_func,
    device_memset_async,
    copy_to_device_batch,
    copy_from_device_batch,
    host_register,
    host_unregister,
    map_host,
    unmap_host,
    launch_kernel,
};
inline constexpr std::size_t mock_op_count = 27;

constexpr std::string_view to_string(MockOp op) noexcept {
    constexpr std::array<std::string_view, mock_op_count> names{"device_malloc",
                                                                "device_free",
                                                                "copy_to_device",
                                                                "copy_from_device",
                                                                "pinned_malloc",
                                                                "pinned_free",
                                                                "device_memset",
                                                                "synchronize",
                                                                "create_stream",
                                                                "destroy_stream",
                                                                "copy_to_device_async",
                                                                "copy_from_device_async",
                                                                "create_event",
                                                                "destroy_event",
                                                                "record_event",
                                                                "event_ready",
                                                                "synchronize_event",
                                                                "stream_wait_event",
                                                                "launch_host_func",
                                                                "device_memset_async",
                                                                "copy_to_device_batch",
                                                                "copy_from_device_batch",
                                                                "host_register",
                                                                "host_unregister",
                                                                "map_host",
                                                                "unmap_host",
                                                                "launch_kernel"};
    return names[static_cast<std::size_t>(op)];
}

/// One journaled call: what, on which pointer (the result, for allocations; the device side,
/// for copies, of the first copy for a batch; the user data, for host functions), how many
/// bytes (a batch: all its copies), how it ended, and the
/// stream and event it named (0: none).
struct MockCall {
    MockOp op;
    const void* pointer;
    std::size_t bytes;
    Errc result;
    std::uint32_t stream = 0;
    std::uint32_t event = 0;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
