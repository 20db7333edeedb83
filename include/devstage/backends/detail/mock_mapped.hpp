// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: MockBackend's mapped host memory and kernels — map_host and unmap_host, kernels that
// say what they touch, and the host's own reads and writes checked against pending work — and
// the checks of its asynchronous copies and batches (assembled by backends/mock.hpp).

#include <cstdint>
#include <mutex>
#include <span>

#include "devstage/backends/detail/mock_backend.hpp"

namespace devstage {

inline Result<void*> MockBackend::map_host(void* host, std::size_t bytes) noexcept {
    constexpr MockOp op = MockOp::map_host;
    std::lock_guard lock(mutex_);
    if (Status injected = recorder_.begin(op); !injected) return recorder_.finish(op, host, bytes, std::move(injected));
    const auto refuse = [&](const std::string& why) {
        return recorder_.finish(
            op, host, bytes,
            recorder_.misuse(Errc::invalid_argument, detail::message("mock map_host: ", bytes, " bytes at ",
                                                                     static_cast<const void*>(host), " ", why)));
    };
    if (host == nullptr || bytes == 0) return refuse("(a null pointer or no bytes)");
    if (reinterpret_cast<std::uintptr_t>(host) % host_map_alignment != 0) {
        return refuse(detail::message("are not aligned to ", host_map_alignment, " bytes"));
    }
    if (!pinned_.contains(host, bytes)) return refuse("do not lie in one pinned allocation of this mock");
    if (mapped_.overlaps(host, bytes)) return refuse("overlap memory already mapped");
    if (!detail::without_bad_alloc([&] { mapped_.insert(host, bytes, 0); })) {
        return recorder_.finish(op, host, bytes,
                                Status(Errc::out_of_memory, "mock map_host: host memory exhausted recording it"));
    }
    (void)recorder_.finish(op, host, bytes, {});
    return host;
}

inline Status MockBackend::unmap_host(void* host) noexcept {
    constexpr MockOp op = MockOp::unmap_host;
    std::lock_guard lock(mutex_);
    if (Status injected = recorder_.begin(op); !injected) return recorder_.finish(op, host, 0, std::move(injected));
    const auto* mapping = mapped_.at(host);
    if (mapping == nullptr) {
        return recorder_.finish(
            op, host, 0,
            recorder_.misuse(Errc::unknown_pointer, detail::message("mock unmap_host: ", static_cast<const void*>(host),
                                                                    " is not the start of a mapping")));
    }
    const std::size_t bytes = mapping->bytes;
    if (Status clear = engine_.used_by_pending(op, host, bytes, Side::host); !clear) {
        return recorder_.finish(op, host, bytes, std::move(clear));
    }
    (void)mapped_.erase(host);
    return recorder_.finish(op, host, bytes, {});
}

inline Status MockBackend::launch_kernel(Stream stream, HostFunction function, void* user_data,
                                         std::span<const KernelAccess> accesses) noexcept {
    std::unique_lock lock(mutex_);
    return streams_.launch_kernel(lock, stream.id, function, user_data, accesses, [&](const KernelAccess& access) {
        if (access.bytes == 0 || device_.contains(access.device, access.bytes) ||
            mapped_.contains(access.device, access.bytes)) {
            return Status();
        }
        return recorder_.misuse(Errc::invalid_argument,
                                detail::message("mock launch_kernel: the kernel ", access.writes ? "writes " : "reads ",
                                                access.bytes, " bytes at ", access.device,
                                                ", neither inside one device allocation nor inside one mapping"));
    });
}

inline Status MockBackend::check_host_access(const void* host, std::size_t bytes, bool writes) noexcept {
    std::lock_guard lock(mutex_);
    return engine_.host_access_hazard(host, bytes, writes);
}

inline Status MockBackend::check_copy(MockOp op, const void* device, const void* dst, const void* src,
                                      std::size_t bytes) noexcept {
    if (!device_.contains(device, bytes)) {
        const bool mapped = mapped_.overlaps(device, bytes);
        return recorder_.misuse(Errc::invalid_argument,
                                detail::message("mock ", to_string(op), ": ", bytes, " bytes at device address ",
                                                device, " run outside every device allocation",
                                                mapped ? " (they are mapped host memory, which a kernel reads in "
                                                         "place: never a copy's device side)"
                                                       : ""));
    }
    if (dst == nullptr || (src == nullptr && op != MockOp::device_memset_async)) {
        return recorder_.misuse(Errc::invalid_argument, detail::message("mock ", to_string(op), ": null host pointer"));
    }
    return {};
}

inline Status MockBackend::enqueue_batch(MockOp op, MockOp kind, void* const* dsts, const void* const* srcs,
                                         const std::size_t* sizes, std::size_t count, Stream stream) noexcept {
    std::unique_lock lock(mutex_);
    if (count == 0 || count > config_.batch_copy_limit || dsts == nullptr || srcs == nullptr || sizes == nullptr) {
        (void)recorder_.begin(op);
        return recorder_.finish(op, nullptr, 0,
                                recorder_.misuse(Errc::invalid_argument,
                                                 detail::message("mock ", to_string(op), ": a batch of ", count,
                                                                 " copies (null arrays, none, or above the limit of ",
                                                                 config_.batch_copy_limit, ")")),
                                stream.id);
    }
    const bool to_device = kind == MockOp::copy_to_device_async;
    auto copy_at = [&](std::size_t i) {
        const void* device = to_device ? dsts[i] : srcs[i];
        const void* host = to_device ? srcs[i] : dsts[i];
        return detail::MockStreams::Copy{dsts[i], srcs[i], sizes[i], device, host};
    };
    return streams_.enqueue_batch(lock, op, kind, stream.id, count, copy_at,
                                  [&](const detail::MockStreams::Copy& copy) {
                                      Status checked = check_copy(kind, copy.device, copy.dst, copy.src, copy.bytes);
                                      if (!checked) return checked;
                                      return engine_.host_hazard(kind, stream.id, copy.host, copy.bytes);
                                  });
}

}  // namespace devstage
