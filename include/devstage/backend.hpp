// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The Backend concept: what devstage needs from an accelerator runtime, and the optional
/// capabilities it uses when present. Each required operation is its own named concept so a
/// type that misses one is rejected with a diagnostic naming that operation.

#include <bit>
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "devstage/status.hpp"

namespace devstage {

namespace backend_requires {

/// `cb.name()` noexcept, convertible to std::string_view: the backend's name in messages.
template <class B>
concept name = requires(const B& cb) {
    { cb.name() }
    noexcept->std::convertible_to<std::string_view>;
};

/// `B::device_alignment`: a static constexpr power of two, the alignment device_malloc
/// guarantees.
template <class B>
concept device_alignment = requires {
    requires std::has_single_bit(std::integral_constant<std::size_t, B::device_alignment>::value);
};

/// `b.device_malloc(n)` noexcept -> Result<void*>; never called with n == 0.
template <class B>
concept device_malloc = requires(B& b, std::size_t n) {
    { b.device_malloc(n) }
    noexcept->std::same_as<Result<void*>>;
};

/// `b.device_free(p)` noexcept -> Status.
template <class B>
concept device_free = requires(B& b, void* p) {
    { b.device_free(p) }
    noexcept->std::same_as<Status>;
};

/// `b.copy_to_device(device_dst, host_src, n)` noexcept -> Status.
template <class B>
concept copy_to_device = requires(B& b, void* dst, const void* src, std::size_t n) {
    { b.copy_to_device(dst, src, n) }
    noexcept->std::same_as<Status>;
};

/// `b.copy_from_device(host_dst, device_src, n)` noexcept -> Status.
template <class B>
concept copy_from_device = requires(B& b, void* dst, const void* src, std::size_t n) {
    { b.copy_from_device(dst, src, n) }
    noexcept->std::same_as<Status>;
};

/// `b.pinned_malloc(n)` noexcept -> Result<void*>: page-locked host memory.
template <class B>
concept pinned_malloc = requires(B& b, std::size_t n) {
    { b.pinned_malloc(n) }
    noexcept->std::same_as<Result<void*>>;
};

/// `b.pinned_free(p)` noexcept -> Status.
template <class B>
concept pinned_free = requires(B& b, void* p) {
    { b.pinned_free(p) }
    noexcept->std::same_as<Status>;
};

}  // namespace backend_requires

/// An accelerator runtime devstage can stage tensors through.
/// `static_assert(devstage::Backend<MyBackend>);`
template <class B>
concept Backend =
    backend_requires::name<B> && backend_requires::device_alignment<B> && backend_requires::device_malloc<B> &&
    backend_requires::device_free<B> && backend_requires::copy_to_device<B> && backend_requires::copy_from_device<B>;

/// A Backend that also provides page-locked host memory.
template <class B>
concept PinnedHostBackend = Backend<B> && backend_requires::pinned_malloc<B> && backend_requires::pinned_free<B>;

/// Optional: `b.device_memset(dst, value, n)` noexcept -> Status.
template <class B>
concept MemsetBackend = Backend<B> && requires(B& b, void* dst, int value, std::size_t n) {
    { b.device_memset(dst, value, n) }
    noexcept->std::same_as<Status>;
};

/// Optional: `b.synchronize()` noexcept -> Status; waits until the device is idle.
template <class B>
concept SynchronizingBackend = Backend<B> && requires(B& b) {
    { b.synchronize() }
    noexcept->std::same_as<Status>;
};

/// Optional: virtual memory, for growing a buffer in place. Reserve an address range, create
/// physical chunks of a multiple of the granularity, map them into the range and unmap them.
/// `B::PhysicalHandle` names a physical chunk. Chunks are mapped contiguously from the start of
/// a reservation and unmapped from its end.
template <class B>
concept VirtualMemoryBackend = Backend<B> &&
    requires(B& b, const B& cb, void* va, std::size_t n, typename B::PhysicalHandle handle) {
    { cb.vmm_granularity() }
    noexcept->std::same_as<std::size_t>;
    { b.vmm_reserve(n) }
    noexcept->std::same_as<Result<void*>>;
    { b.vmm_release(va) }
    noexcept->std::same_as<Status>;
    { b.vmm_create(n) }
    noexcept->std::same_as<Result<typename B::PhysicalHandle>>;
    { b.vmm_free(handle) }
    noexcept->std::same_as<Status>;
    { b.vmm_map(va, n, handle) }
    noexcept->std::same_as<Status>;
    { b.vmm_unmap(va, n) }
    noexcept->std::same_as<Status>;
};

}  // namespace devstage
