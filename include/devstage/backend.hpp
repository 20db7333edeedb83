// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The Backend concept: what devstage needs from an accelerator runtime, its stream-ordered
/// refinement AsyncBackend, and the optional capabilities it uses when present. Each required
/// operation is its own named concept so a type that misses one is rejected with a diagnostic
/// naming that operation.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <bit>
#include <concepts>
#include <cstddef>
#include <span>
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

/// `B::Stream` and `B::Event`: distinct, trivially copyable, default-constructible handle
/// types; streams compare with `==`. Wrapping the runtime's raw handles in types of their own makes a swapped
/// argument a compile error.
template <class B>
concept stream_and_event_types = requires {
    typename B::Stream;
    typename B::Event;
    requires !std::same_as<typename B::Stream, typename B::Event>;
    requires std::is_trivially_copyable_v<typename B::Stream>;
    requires std::is_trivially_copyable_v<typename B::Event>;
    requires std::default_initializable<typename B::Stream>;
    requires std::default_initializable<typename B::Event>;
    requires std::equality_comparable<typename B::Stream>;
};

/// `b.create_stream()` noexcept -> Result<B::Stream>.
template <class B>
concept create_stream = requires(B& b) {
    { b.create_stream() }
    noexcept->std::same_as<Result<typename B::Stream>>;
};

/// `b.destroy_stream(s)` noexcept -> Status.
template <class B>
concept destroy_stream = requires(B& b, typename B::Stream s) {
    { b.destroy_stream(s) }
    noexcept->std::same_as<Status>;
};

/// `b.copy_to_device_async(device_dst, host_src, n, s)` noexcept -> Status: enqueued on `s`.
template <class B>
concept copy_to_device_async = requires(B& b, void* dst, const void* src, std::size_t n, typename B::Stream s) {
    { b.copy_to_device_async(dst, src, n, s) }
    noexcept->std::same_as<Status>;
};

/// `b.copy_from_device_async(host_dst, device_src, n, s)` noexcept -> Status: enqueued on `s`.
template <class B>
concept copy_from_device_async = requires(B& b, void* dst, const void* src, std::size_t n, typename B::Stream s) {
    { b.copy_from_device_async(dst, src, n, s) }
    noexcept->std::same_as<Status>;
};

/// `b.create_event()` noexcept -> Result<B::Event>; an event never recorded is ready.
template <class B>
concept create_event = requires(B& b) {
    { b.create_event() }
    noexcept->std::same_as<Result<typename B::Event>>;
};

/// `b.destroy_event(e)` noexcept -> Status.
template <class B>
concept destroy_event = requires(B& b, typename B::Event e) {
    { b.destroy_event(e) }
    noexcept->std::same_as<Status>;
};

/// `b.record_event(e, s)` noexcept -> Status: `e` completes when `s` reaches this point.
template <class B>
concept record_event = requires(B& b, typename B::Event e, typename B::Stream s) {
    { b.record_event(e, s) }
    noexcept->std::same_as<Status>;
};

/// `b.event_ready(e)` noexcept -> Result<bool>: a query that never blocks.
template <class B>
concept event_ready = requires(B& b, typename B::Event e) {
    { b.event_ready(e) }
    noexcept->std::same_as<Result<bool>>;
};

/// `b.synchronize_event(e)` noexcept -> Status: the host blocks until `e` completed.
template <class B>
concept synchronize_event = requires(B& b, typename B::Event e) {
    { b.synchronize_event(e) }
    noexcept->std::same_as<Status>;
};

/// `b.stream_wait_event(s, e)` noexcept -> Status: work enqueued on `s` afterwards waits for
/// `e`; the host does not block.
template <class B>
concept stream_wait_event = requires(B& b, typename B::Stream s, typename B::Event e) {
    { b.stream_wait_event(s, e) }
    noexcept->std::same_as<Status>;
};

/// `cb.batch_copy_limit(s)` noexcept -> std::size_t: the most copies one batch call on stream
/// `s` takes; 0 when there is none — the runtime loaded lacks the call, or refuses `s` — and the
/// Stager makes one call per copy.
template <class B>
concept batch_copy_limit = requires(const B& cb, typename B::Stream s) {
    { cb.batch_copy_limit(s) }
    noexcept->std::same_as<std::size_t>;
};

/// `b.copy_to_device_batch(device_dsts, host_srcs, sizes, count, s)` noexcept -> Status: enqueues
/// `count` host-to-device copies on `s` in one call.
template <class B>
concept copy_to_device_batch = requires(B& b, void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                        std::size_t count, typename B::Stream s) {
    { b.copy_to_device_batch(dsts, srcs, sizes, count, s) }
    noexcept->std::same_as<Status>;
};

/// `b.copy_from_device_batch(host_dsts, device_srcs, sizes, count, s)` noexcept -> Status:
/// enqueues `count` device-to-host copies on `s` in one call.
template <class B>
concept copy_from_device_batch = requires(B& b, void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                          std::size_t count, typename B::Stream s) {
    { b.copy_from_device_batch(dsts, srcs, sizes, count, s) }
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

/// A Backend with streams and events: copies are enqueued on a stream and complete in stream
/// order; events mark a point of a stream, for the host to query or wait on, or for another
/// stream to wait on. `static_assert(devstage::AsyncBackend<MyBackend>);`
template <class B>
concept AsyncBackend =
    Backend<B> && backend_requires::stream_and_event_types<B> && backend_requires::create_stream<B> &&
    backend_requires::destroy_stream<B> && backend_requires::copy_to_device_async<B> &&
    backend_requires::copy_from_device_async<B> && backend_requires::create_event<B> &&
    backend_requires::destroy_event<B> && backend_requires::record_event<B> && backend_requires::event_ready<B> &&
    backend_requires::synchronize_event<B> && backend_requires::stream_wait_event<B>;

/// A host function run in stream order: `fn(user_data)` once all earlier work on the stream
/// completed; later work on the stream waits for it to return.
using HostFunction = void (*)(void* user_data);

/// Optional: `b.launch_host_func(s, fn, user_data)` noexcept -> Status enqueues a HostFunction
/// on stream `s` (cudaLaunchHostFunc). Tests and examples use it as a stand-in kernel.
template <class B>
concept HostFunctionBackend = AsyncBackend<B> && requires(B& b, typename B::Stream s, HostFunction fn, void* data) {
    { b.launch_host_func(s, fn, data) }
    noexcept->std::same_as<Status>;
};

/// Optional: `cb.is_pinned(p)` noexcept -> bool: whether host pointer `p` lies in page-locked
/// memory the backend's copies use directly. The pageable ring (Stager::set_pageable_ring)
/// asks it about large args whose TensorArg does not say.
template <class B>
concept PinnedQueryBackend = Backend<B> && requires(const B& cb, const void* p) {
    { cb.is_pinned(p) }
    noexcept->std::convertible_to<bool>;
};

/// Optional: `b.device_memset(dst, value, n)` noexcept -> Status.
template <class B>
concept MemsetBackend = Backend<B> && requires(B& b, void* dst, int value, std::size_t n) {
    { b.device_memset(dst, value, n) }
    noexcept->std::same_as<Status>;
};

/// Optional: `b.device_memset_async(dst, value, n, s)` noexcept -> Status enqueues setting `n`
/// bytes of device memory at `dst` to `value` on stream `s` (cudaMemsetAsync,
/// aclrtMemsetAsync). The Stager zeroes Out args with it (OutputPolicy::zero); a backend
/// without it gets zeros uploaded instead.
template <class B>
concept AsyncMemsetBackend = AsyncBackend<B> &&
    requires(B& b, void* dst, int value, std::size_t n, typename B::Stream s) {
    { b.device_memset_async(dst, value, n, s) }
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

/// Optional: copies submitted in batches (cudaMemcpyBatchAsync, aclrtMemcpyBatchAsync). One
/// call enqueues `count` copies of one direction on a stream: the batch as a whole is in stream
/// order, the copies inside it in no particular order (their ranges never overlap). Each of
/// `count` (1 to batch_copy_limit(s)) copies moves `sizes[i]` > 0 bytes from `srcs[i]` to
/// `dsts[i]`; the arrays are read during the call only. A call that fails may have enqueued
/// some of the copies: the caller waits for the stream before it reuses their memory. The
/// Stager batches the direct copies of a run, one call per direction (see docs/staging.md).
/// `static_assert(devstage::BatchCopyBackend<MyBackend>);`
template <class B>
concept BatchCopyBackend = AsyncBackend<B> && backend_requires::batch_copy_limit<B> &&
    backend_requires::copy_to_device_batch<B> && backend_requires::copy_from_device_batch<B>;

/// Optional: existing host memory pinned in place. `b.host_register(p, n)` noexcept -> Status
/// page-locks [p, p + n) for the backend's copies (cudaHostRegister), so copies from and to it
/// are direct and asynchronous; `b.host_unregister(p)` noexcept -> Status undoes it for the
/// range registered at `p`. A null pointer, zero bytes, a range registered twice or overlapping
/// a registered one is invalid_argument; unregistering a pointer never registered is an error.
template <class B>
concept HostRegisterBackend = Backend<B> && requires(B& b, void* p, std::size_t n) {
    { b.host_register(p, n) }
    noexcept->std::same_as<Status>;
    { b.host_unregister(p) }
    noexcept->std::same_as<Status>;
};

// ---- mapped host memory ------------------------------------------------------------------------

namespace backend_requires {

/// `B::host_map_alignment`: a static constexpr power of two; map_host takes host pointers
/// aligned to it (4096 for CANN's aclrtHostRegister, 1 where any address maps).
template <class B>
concept host_map_alignment = requires {
    requires std::has_single_bit(std::integral_constant<std::size_t, B::host_map_alignment>::value);
};

/// `b.map_host(host, n)` noexcept -> Result<void*>: maps `n` bytes of page-locked host memory
/// at `host` (from pinned_malloc) into the device's address space and returns the device
/// address of `host`. The device address is for kernels only: never a copy's or a memset's.
template <class B>
concept map_host = requires(B& b, void* host, std::size_t n) {
    { b.map_host(host, n) }
    noexcept->std::same_as<Result<void*>>;
};

/// `b.unmap_host(host)` noexcept -> Status: undoes map_host(host, n); the memory stays pinned.
template <class B>
concept unmap_host = requires(B& b, void* host) {
    { b.unmap_host(host) }
    noexcept->std::same_as<Status>;
};

}  // namespace backend_requires

/// Optional: page-locked host memory mapped for device access, so that a kernel reads and
/// writes it in place over the link, with no copy (CUDA's mapped pinned memory, CANN's
/// aclrtHostRegister with ACL_HOST_REGISTER_MAPPED). A Stager whose strategy maps
/// (RetainedBump with MapSmall) puts its small args there. map_host may still refuse at run
/// time (a device that cannot map): the Stager then copies as PackSmall does.
/// `static_assert(devstage::MappedHostBackend<MyBackend>);`
template <class B>
concept MappedHostBackend = PinnedHostBackend<B> && backend_requires::host_map_alignment<B> &&
    backend_requires::map_host<B> && backend_requires::unmap_host<B>;

/// Optional: `cb.streams_immediate()` noexcept -> bool: true when the backend's streams are
/// immediate at run time — every operation enqueued on one has completed when its call returns,
/// and its events are always complete — as for a backend over a runtime without streams (the C
/// interface's callbacks without stream callbacks). The Stager then treats them as it treats
/// SynchronousAdapter's stream: no work is left pending, the host never waits on an event, no
/// copy counts as asynchronous.
template <class B>
concept ImmediateStreamsQuery = AsyncBackend<B> && requires(const B& cb) {
    { cb.streams_immediate() }
    noexcept->std::convertible_to<bool>;
};

/// Optional: `b.check_stream(s)` noexcept -> Status: ok when `s` is a stream this backend's
/// device may use; invalid_argument saying why not otherwise (a stream of another device, or of
/// another simulated host). The Stager checks the stream of every bind, finish and
/// order_after_uploads with it before anything is enqueued, so a foreign stream is refused even
/// where a call would enqueue nothing (or where the runtime would run the work on another
/// device).
template <class B>
concept StreamCheckBackend = AsyncBackend<B> && requires(B& b, typename B::Stream s) {
    { b.check_stream(s) }
    noexcept->std::same_as<Status>;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
