// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: SimBackend's mapped host memory — map_host and unmap_host over its pinned memory —
// and kernels that say what they touch, whose mapped accesses the link model charges as bytes
// with no per-call latency (assembled by backends/sim.hpp).

#include <cstdint>
#include <mutex>
#include <span>

#include "devstage/backends/detail/sim_backend.hpp"

namespace devstage {

inline Result<void*> SimBackend::map_host(void* host, std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    if (host == nullptr || bytes == 0 || !host_.state_->pinned_contains(host, bytes) || mapped_.overlaps(host, bytes)) {
        return fail(Errc::invalid_argument,
                    detail::message("sim map_host: ", bytes, " bytes at ", static_cast<const void*>(host),
                                    " are not inside one pinned allocation of the sim, or overlap a mapping"));
    }
    if (!detail::without_bad_alloc([&] { mapped_.insert(host, bytes, 0); })) {
        return fail(Errc::out_of_memory, "sim map_host: host memory exhausted recording the mapping");
    }
    ++stats_.host_maps;
    stats_.live_mapped_bytes += bytes;
    return host;
}

inline Status SimBackend::unmap_host(void* host) noexcept {
    if (on_worker()) return refuse("unmap_host");
    auto lock = lock_idle();
    const auto mapping = mapped_.erase(host);
    if (!mapping) {
        return fail(Errc::unknown_pointer, detail::message("sim unmap_host: ", static_cast<const void*>(host),
                                                           " is not the start of a mapping"));
    }
    stats_.live_mapped_bytes -= mapping->bytes;
    return {};
}

inline Status SimBackend::launch_kernel(Stream stream, HostFunction function, void* user_data,
                                        std::span<const KernelAccess> accesses) noexcept {
    if (on_worker()) return refuse("launch_kernel");
    std::lock_guard lock(mutex_);
    std::uint64_t read = 0, written = 0;
    for (const KernelAccess& access : accesses) {
        if (access.bytes == 0) continue;
        if (mapped_.contains(access.device, access.bytes)) {
            if (access.reads) read += access.bytes;
            if (access.writes) written += access.bytes;
        } else if (!is_device(access.device, access.bytes)) {
            return fail(Errc::invalid_argument,
                        detail::message("sim launch_kernel: ", access.bytes, " bytes at ", access.device,
                                        " are neither inside one device allocation nor inside one mapping"));
        }
    }
    if (Status launched = streams_.launch_host_func(stream.id, function, user_data); !launched) return launched;
    ++stats_.kernel_launches;
    stats_.mapped_read_bytes += read;
    stats_.mapped_write_bytes += written;
    // Bytes over the link, with no call's latency: the kernel's own loads and stores move them.
    const auto over_link = [](const SimLinkCost& cost, std::uint64_t bytes) {
        return bytes == 0 ? 0 : cost.nanoseconds(bytes) - cost.latency_ns;
    };
    add_modeled(over_link(config_.link.to_device_pinned, read) + over_link(config_.link.from_device_pinned, written));
    return {};
}

inline Status SimBackend::still_mapped(void* pointer) noexcept {
    const std::size_t bytes = host_.state_->pinned_size(pointer);
    if (bytes == 0 || !mapped_.overlaps(pointer, bytes)) return {};
    return fail(Errc::invalid_argument, detail::message("sim pinned_free: ", static_cast<const void*>(pointer),
                                                        " is still mapped for the device: unmap_host it first"));
}

}  // namespace devstage
