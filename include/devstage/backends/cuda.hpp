// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// CudaBackend: NVIDIA GPUs through the CUDA runtime, loaded at run time with dlopen — no
/// CUDA header or library is needed to compile. Bound to one device: before each call it makes
/// that device current on the calling thread if another one is. Streams and events are the
/// runtime's; virtual memory (in-place growth) goes through the driver API, loaded too.
/// The header to include; its parts: cuda_abi.hpp (the C ABI subset it declares: cudart,
/// cudrv) and backends/detail/cuda_vmm.hpp (virtual memory through the driver).

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "devstage/backend.hpp"
#include "devstage/backends/cuda_abi.hpp"
#include "devstage/backends/detail/cuda_host_register.hpp"
#include "devstage/backends/detail/cuda_stream_check.hpp"
#include "devstage/backends/detail/cuda_vmm.hpp"
#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/backends/detail/runtime_call.hpp"
#include "devstage/backends/detail/teardown_list.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage {

/// One CUDA device through libcudart. `auto gpu = CudaBackend::create(0); if (!gpu) …`
/// Move-only. `create` fails with library_not_found when libcudart cannot be loaded, and with
/// not_supported when it loads but finds no usable device (no driver, no GPU).
class CudaBackend {
public:
    /// cudaMalloc guarantees at least 256 bytes.
    static constexpr std::size_t device_alignment = 256;
    /// The bytes a pinned pool registers with one cudaHostRegister: 1 GiB. One registration of
    /// 512 GiB fails on the R580 drivers (chunks of 64 GiB work), Linux 6.11 to 6.13 pin at
    /// most 2 GB in one call, and one long registration holds the driver's locks throughout.
    static constexpr std::size_t host_register_chunk_bytes = std::size_t{1} << 30;

    /// A CUDA stream (cudaStream_t). Streams made by create_stream are non-blocking (they do
    /// not synchronize with the legacy default stream); the caller destroys them. A stream
    /// made elsewhere can be wrapped: `CudaBackend::Stream{my_stream}`.
    struct Stream {
        cudart::cudaStream_t handle = nullptr;
        friend bool operator==(Stream, Stream) = default;
    };
    /// A CUDA event (cudaEvent_t), made without timing.
    struct Event {
        cudart::cudaEvent_t handle = nullptr;
        friend bool operator==(Event, Event) = default;
    };
    /// A physical chunk of device memory (CUmemGenericAllocationHandle).
    using PhysicalHandle = cudrv::CUmemGenericAllocationHandle;

    /// Loads the runtime (`library_path`, else $DEVSTAGE_CUDART_LIBRARY, else libcudart.so.13,
    /// libcudart.so.12, libcudart.so) and binds to `device_id`. Then loads the driver for
    /// virtual memory (`driver_library_path`, else $DEVSTAGE_CUDA_DRIVER_LIBRARY, else
    /// libcuda.so.1, libcuda.so); a driver that cannot be loaded or lacks virtual memory only
    /// turns virtual memory off (vmm_granularity() 0), never fails creation.
    static Result<CudaBackend> create(int device_id, std::string library_path = {},
                                      std::string driver_library_path = {}) noexcept {
        Result<detail::DynamicLibrary> library = detail::DynamicLibrary::open(
            std::move(library_path), "DEVSTAGE_CUDART_LIBRARY", {"libcudart.so.13", "libcudart.so.12", "libcudart.so"});
        if (!library) return Status(Errc::library_not_found, detail::message("cuda: ", library.status().message()));
        CudaBackend backend;
        backend.library_ = std::move(*library);
        backend.device_ = device_id;
        if (Status resolved = backend.resolve(); !resolved) return resolved;
        detail::resolve_cuda_batch(backend.library_, backend.batch_);
        backend.host_memory_.resolve(backend.library_);
        backend.teardown_ = std::unique_ptr<detail::TeardownList>(new (std::nothrow) detail::TeardownList);
        if (backend.teardown_ == nullptr) {
            return Status(Errc::out_of_memory, "cuda: host memory exhausted making the backend");
        }
        backend.stream_check_.resolve(backend.library_);
        int count = 0;
        if (Status s = detail::checked_call(backend.errors_, backend.site(), "cudaGetDeviceCount", 0,
                                            backend.api_.get_device_count, &count);
            !s) {
            return s;
        }
        if (device_id < 0 || device_id >= count) {
            return Status(Errc::invalid_argument,
                          detail::message("cuda: device ", device_id, " requested, ", count, " device(s) present"));
        }
        if (Status bound = backend.bind(); !bound) return bound;
        backend.probe_mapping();
        backend.vmm_.probe(std::move(driver_library_path), device_id, backend.site(), backend.api_.set_device,
                           backend.errors_);
        return backend;
    }

    CudaBackend(CudaBackend&& other) noexcept
        : library_(std::move(other.library_)),
          api_(other.api_),
          errors_(other.errors_),
          batch_(other.batch_),
          host_memory_(other.host_memory_),
          stream_check_(other.stream_check_),
          mapped_(other.mapped_),
          maps_(other.maps_),
          device_(other.device_),
          vmm_(std::move(other.vmm_)),
          teardown_(std::move(other.teardown_)) {}
    CudaBackend& operator=(CudaBackend&&) = delete;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;
    /// Runs the teardown hooks (TeardownBackend): pinned pools over this device give their
    /// memory back while the runtime is still loaded. The device is not reset (other backends of
    /// the process may use it): reset_device() does that.
    ~CudaBackend() {
        if (teardown_) teardown_->run_all();
    }

    /// The teardown hooks run (pinned pools give back and unregister their memory, destroy
    /// their events), then cudaDeviceReset: on the healthy path and after a sticky error alike,
    /// no pinned memory outlives the reset. The backend stays usable (the runtime makes a new
    /// context on the next call); not_supported when the runtime has no cudaDeviceReset.
    Status reset_device() noexcept {
        if (teardown_) teardown_->run_all();
        if (host_memory_.device_reset == nullptr) {
            return Status(Errc::not_supported,
                          detail::message("cuda reset_device: ", library_.path(), " has no cudaDeviceReset"));
        }
        return call("cudaDeviceReset", host_memory_.device_reset, 0);
    }
    /// TeardownBackend: `hook` runs before the backend goes or reset_device() resets.
    Result<std::uint64_t> add_teardown_hook(TeardownHook hook) noexcept {
        if (!teardown_) return Status(Errc::invalid_argument, "cuda add_teardown_hook: a moved-from backend");
        return teardown_->add(hook, name());
    }
    void remove_teardown_hook(std::uint64_t id) noexcept {
        if (teardown_) teardown_->remove(id);
    }

    std::string_view name() const noexcept { return "cuda"; }
    int device_id() const noexcept { return device_; }

    Result<void*> device_malloc(std::size_t bytes) noexcept {
        void* pointer = nullptr;
        if (Status s = call("cudaMalloc", api_.malloc, bytes, &pointer, bytes); !s) return s;
        return pointer;
    }
    Status device_free(void* pointer) noexcept { return call("cudaFree", api_.free, 0, pointer); }
    Status copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpy(host to device)", api_.memcpy, bytes, device_dst, host_src, bytes,
                    cudart::memcpy_host_to_device);
    }
    Status copy_from_device(void* host_dst, const void* device_src, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpy(device to host)", api_.memcpy, bytes, host_dst, device_src, bytes,
                    cudart::memcpy_device_to_host);
    }
    Status device_memset(void* device_dst, int value, std::size_t bytes) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemset", api_.memset, bytes, device_dst, value, bytes);
    }
    Status synchronize() noexcept { return call("cudaDeviceSynchronize", api_.device_synchronize, 0); }
    /// cudaHostAlloc(&p, bytes, cudaHostAllocPortable): page-locked for every device of the
    /// process, so a pool over one device's backend serves copies of every device.
    Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        void* pointer = nullptr;
        if (Status s = call("cudaHostAlloc", api_.host_alloc, bytes, &pointer, bytes, cudart::host_alloc_portable);
            !s) {
            return s;
        }
        return pointer;
    }
    Status pinned_free(void* pointer) noexcept { return call("cudaFreeHost", api_.free_host, 0, pointer); }
    /// cudaPointerGetAttributes: true when `pointer` lies in page-locked host memory — from
    /// cudaHostAlloc or cudaHostRegister, anyone's (cudaMemoryTypeHost). Pageable, managed and
    /// device memory answer false, and so does a query that fails: the pageable ring then takes
    /// the arg, which is correct, only slower.
    bool is_pinned(const void* pointer) const noexcept {
        if (!bind()) return false;
        cudart::PointerAttributes attributes;
        return api_.pointer_get_attributes(&attributes, pointer) == cudart::success &&
               attributes.type == cudart::memory_type_host;
    }

    // ---- streams and events ----------------------------------------------------------------
    // An error of earlier asynchronous work (a faulting kernel, a copy that failed) is sticky
    // in the device's context: any later call may report it, not only the one that waits.

    /// cudaStreamCreateWithFlags(cudaStreamNonBlocking).
    Result<Stream> create_stream() noexcept {
        Stream stream;
        if (Status s =
                call("cudaStreamCreateWithFlags", api_.stream_create, 0, &stream.handle, cudart::stream_non_blocking);
            !s) {
            return s;
        }
        return stream;
    }
    /// cudaStreamDestroy: returns at once; work already enqueued still completes.
    Status destroy_stream(Stream stream) noexcept {
        return call("cudaStreamDestroy", api_.stream_destroy, 0, stream.handle);
    }
    /// cudaMemcpyAsync host to device on `stream`; zero bytes are not sent. From pageable host
    /// memory the runtime stages the copy and returns only once the source was read.
    Status copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpyAsync(host to device)", api_.memcpy_async, bytes, device_dst, host_src, bytes,
                    cudart::memcpy_host_to_device, stream.handle);
    }
    /// cudaMemcpyAsync device to host on `stream`; zero bytes are not sent.
    Status copy_from_device_async(void* host_dst, const void* device_src, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemcpyAsync(device to host)", api_.memcpy_async, bytes, host_dst, device_src, bytes,
                    cudart::memcpy_device_to_host, stream.handle);
    }
    /// cudaMemsetAsync on `stream`; zero bytes are not sent.
    Status device_memset_async(void* device_dst, int value, std::size_t bytes, Stream stream) noexcept {
        if (bytes == 0) return {};
        return call("cudaMemsetAsync", api_.memset_async, bytes, device_dst, value, bytes, stream.handle);
    }
    /// cudaEventCreateWithFlags(cudaEventDisableTiming).
    Result<Event> create_event() noexcept {
        Event event;
        if (Status s =
                call("cudaEventCreateWithFlags", api_.event_create, 0, &event.handle, cudart::event_disable_timing);
            !s) {
            return s;
        }
        return event;
    }
    /// cudaEventDestroy: allowed while the event is pending; its resources go when it completes.
    Status destroy_event(Event event) noexcept { return call("cudaEventDestroy", api_.event_destroy, 0, event.handle); }
    /// cudaEventRecord(event, stream).
    Status record_event(Event event, Stream stream) noexcept {
        return call("cudaEventRecord", api_.event_record, 0, event.handle, stream.handle);
    }
    /// cudaEventQuery: true on cudaSuccess (a never-recorded event too), false on
    /// cudaErrorNotReady, an error otherwise — possibly a sticky one of earlier work.
    Result<bool> event_ready(Event event) noexcept {
        if (Status bound = bind(); !bound) return bound;
        const cudart::cudaError_t code = api_.event_query(event.handle);
        if (code == cudart::success) return true;
        if (code == cudart::error_not_ready) return false;
        return detail::call_failure(errors_, site(), "cudaEventQuery", code, 0);
    }
    /// cudaEventSynchronize: the host blocks until the event completed.
    Status synchronize_event(Event event) noexcept {
        return call("cudaEventSynchronize", api_.event_synchronize, 0, event.handle);
    }
    /// cudaStreamWaitEvent(stream, event, 0): later work on `stream` waits for `event`.
    Status stream_wait_event(Stream stream, Event event) noexcept {
        return call("cudaStreamWaitEvent", api_.stream_wait_event, 0, stream.handle, event.handle, 0U);
    }
    /// cudaLaunchHostFunc: `function(user_data)` runs on a runtime thread in stream order. It
    /// must not call CUDA.
    Status launch_host_func(Stream stream, HostFunction function, void* user_data) noexcept {
        return call("cudaLaunchHostFunc", api_.launch_host_func, 0, stream.handle, function, user_data);
    }

    /// Ok when `stream` is this device's, by cudaStreamGetDevice where the runtime has it (the
    /// default streams always are): another device's stream is invalid_argument naming both.
    Status check_stream(Stream stream) noexcept { return stream_check_.check(errors_, site(), stream.handle, device_); }

    /// cudaHostRegister(host, bytes, cudaHostRegisterPortable): pins existing host memory in
    /// place, for every device. Registered already or overlapping: invalid_argument.
    Status host_register(void* host, std::size_t bytes) noexcept {
        if (Status bound = bind(); !bound) return bound;
        return host_memory_.register_range(errors_, site(), host, bytes);
    }
    /// cudaHostUnregister; a pointer never registered is unknown_pointer.
    Status host_unregister(void* host) noexcept {
        if (Status bound = bind(); !bound) return bound;
        return host_memory_.unregister(errors_, site(), host);
    }
    /// cudaDeviceGetAttribute(cudaDevAttrHostNumaId): the host NUMA node nearest the device, -1
    /// where the system has no NUMA (NumaBackend, pinned/numa.hpp).
    Result<int> host_numa_node() const noexcept { return host_memory_.host_numa_node(errors_, site(), device_); }
    /// cudaDeviceGetPCIBusId: the device's PCI address, "dddd:bb:dd.f".
    Result<std::string> pci_bus_id() const noexcept { return host_memory_.pci_bus_id(errors_, site(), device_); }

    // ---- batches of copies: cudaMemcpyBatchAsync (CUDA 12.8 and later) ----------------------
    // Resolved when the runtime exports it; its form by cudaRuntimeGetVersion (12.8 and 12.9
    // take a failIdx argument before the stream, 13.0 does not). Every copy of a batch reads its
    // source in stream order (cudaMemcpySrcAccessOrderStream). The legacy default stream is
    // refused, as cudaMemcpyBatchAsync refuses it.

    /// No bound of devstage's own when the runtime has cudaMemcpyBatchAsync and `stream` is not
    /// the legacy default stream; else 0 (the Stager then copies one by one).
    std::size_t batch_copy_limit(Stream stream) const noexcept {
        return batch_.present() && !legacy(stream) ? std::numeric_limits<std::size_t>::max() : 0;
    }
    /// The runtime version cudaRuntimeGetVersion gave when cudaMemcpyBatchAsync was resolved
    /// (12080 and up), else 0.
    int batch_runtime_version() const noexcept { return batch_.runtime_version; }
    /// cudaMemcpyBatchAsync of `count` host-to-device copies on `stream`.
    Status copy_to_device_batch(void* const* device_dsts, const void* const* host_srcs, const std::size_t* sizes,
                                std::size_t count, Stream stream) noexcept {
        return batch("cudaMemcpyBatchAsync(host to device)", device_dsts, host_srcs, sizes, count, stream);
    }
    /// cudaMemcpyBatchAsync of `count` device-to-host copies on `stream`.
    Status copy_from_device_batch(void* const* host_dsts, const void* const* device_srcs, const std::size_t* sizes,
                                  std::size_t count, Stream stream) noexcept {
        return batch("cudaMemcpyBatchAsync(device to host)", host_dsts, device_srcs, sizes, count, stream);
    }

    // ---- mapped pinned memory: cudaHostGetDevicePointer -------------------------------------
    // On a device with unified addressing every cudaHostAlloc allocation is mapped for it, at
    // its host address, and stays mapped until cudaFreeHost: map_host asks the runtime for the
    // device address and unmap_host has nothing to undo. Memory made page-locked elsewhere maps
    // when it was registered with cudaHostRegisterMapped.

    /// Any page-locked address maps.
    static constexpr std::size_t host_map_alignment = 1;
    /// cudaHostGetDevicePointer(&device, host, 0) for page-locked memory (pinned_malloc's);
    /// not_supported, naming why, on a device that cannot map host memory or has no unified
    /// addressing (cudaDeviceGetAttribute, asked at creation).
    Result<void*> map_host(void* host, std::size_t bytes) noexcept {
        if (!maps_) {
            return Status(
                Errc::not_supported,
                detail::message("cuda: device ", device_, " does not map host memory (",
                                mapped_.present() ? "cudaDevAttrCanMapHostMemory or cudaDevAttrUnifiedAddressing is 0"
                                                  : "the runtime lacks cudaHostGetDevicePointer",
                                ")"));
        }
        void* device = nullptr;
        if (Status s = call("cudaHostGetDevicePointer", mapped_.host_get_device_pointer, bytes, &device, host, 0U);
            !s) {
            return s;
        }
        return device;
    }
    /// Nothing to undo: the allocation stays mapped until it is freed.
    Status unmap_host(void* /*host*/) noexcept { return {}; }
    /// Whether map_host maps on this device (asked at creation).
    bool maps_host_memory() const noexcept { return maps_; }

    // ---- virtual memory (in-place growth), through the driver API ---------------------------
    // Each call first makes the device's primary context — the runtime's — current with
    // cudaSetDevice. When the driver, an entry point or the device's support is missing,
    // vmm_granularity() is 0 and every vmm_ call is not_supported, saying why.

    /// The minimum granularity of physical chunks on this device; 0 when unsupported.
    std::size_t vmm_granularity() const noexcept { return vmm_.granularity(); }

    /// cuMemAddressReserve(&va, bytes, 0, 0, 0).
    Result<void*> vmm_reserve(std::size_t bytes) noexcept { return vmm_.reserve(bytes); }
    /// cuMemAddressFree(va, size reserved); `va` must be a reservation of this backend.
    Status vmm_release(void* base) noexcept { return vmm_.release(base); }
    /// cuMemCreate(&handle, bytes, {pinned, device}, 0).
    Result<PhysicalHandle> vmm_create(std::size_t bytes) noexcept { return vmm_.create(bytes); }
    /// cuMemRelease(handle).
    Status vmm_free(PhysicalHandle handle) noexcept { return vmm_.free(handle); }
    /// cuMemMap(va, bytes, 0, handle, 0), then cuMemSetAccess read-write for this device; if
    /// granting access fails the range is unmapped again.
    Status vmm_map(void* address, std::size_t bytes, PhysicalHandle handle) noexcept {
        return vmm_.map(address, bytes, handle);
    }
    /// cuMemUnmap(va, bytes).
    Status vmm_unmap(void* address, std::size_t bytes) noexcept { return vmm_.unmap(address, bytes); }

private:
    CudaBackend() = default;

    Status resolve() noexcept { return detail::resolve_cuda_runtime(library_, api_, errors_); }

    // Mapping needs the device to map host memory and to share the host's address space.
    void probe_mapping() noexcept {
        detail::resolve_cuda_mapped(library_, mapped_);
        if (!mapped_.present()) return;
        int can_map = 0, unified = 0;
        maps_ = mapped_.device_get_attribute(&can_map, cudart::device_attribute_can_map_host_memory, device_) ==
                    cudart::success &&
                mapped_.device_get_attribute(&unified, cudart::device_attribute_unified_addressing, device_) ==
                    cudart::success &&
                can_map != 0 && unified != 0;
    }

    detail::CallSite site() const noexcept { return {name(), device_}; }

    // Makes this backend's device current on the calling thread when another one is.
    Status bind() const noexcept {
        int current = -1;
        if (Status s = detail::checked_call(errors_, site(), "cudaGetDevice", 0, api_.get_device, &current); !s) {
            return s;
        }
        if (current == device_) return {};
        return detail::checked_call(errors_, site(), "cudaSetDevice", 0, api_.set_device, device_);
    }

    // Null, or cudaStreamLegacy ((cudaStream_t)0x1): the legacy default stream.
    static bool legacy(Stream stream) noexcept {
        return stream.handle == nullptr || reinterpret_cast<std::uintptr_t>(stream.handle) == 1;
    }

    // One attribute for every copy: the source is read in stream order.
    Status batch(const char* what, void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                 std::size_t count, Stream stream) noexcept {
        if (!batch_.present()) {
            return Status(Errc::not_supported, detail::message("cuda ", what, ": the runtime ", library_.path(),
                                                               " has no cudaMemcpyBatchAsync (CUDA 12.8 or later)"));
        }
        if (legacy(stream)) {
            return Status(Errc::invalid_argument,
                          detail::message("cuda ", what, ": a batch of ", count,
                                          " copies on the legacy default stream, which cudaMemcpyBatchAsync "
                                          "refuses; use a created stream"));
        }
        if (count == 0) return {};
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < count; ++i) bytes += sizes[i];
        cudart::MemcpyAttributes attributes;
        std::size_t first = 0;  // attrsIdxs: the one attribute applies from copy 0 on
        if (batch_.batch13 != nullptr) {
            return call(what, batch_.batch13, bytes, dsts, srcs, sizes, count, &attributes, &first, std::size_t{1},
                        stream.handle);
        }
        std::size_t failed_at = std::numeric_limits<std::size_t>::max();
        Status status = call(what, batch_.batch12, bytes, dsts, srcs, sizes, count, &attributes, &first, std::size_t{1},
                             &failed_at, stream.handle);
        if (!status && failed_at < count) {
            return Status(status.code(), detail::message(status.message(), " (at copy ", failed_at, " of ", count,
                                                         "; the copies before it may have been enqueued)"));
        }
        return status;
    }

    template <class F, class... Args>
    Status call(const char* what, F* function, std::size_t bytes, Args... args) noexcept {
        if (Status bound = bind(); !bound) return bound;
        return detail::checked_call(errors_, site(), what, bytes, function, args...);
    }

    detail::DynamicLibrary library_;
    detail::CudaRuntimeApi api_;
    detail::CudaRuntimeErrors errors_;
    detail::CudaBatchApi batch_;
    detail::CudaHostRegisterApi host_memory_;
    detail::CudaStreamCheckApi stream_check_;
    detail::CudaMappedApi mapped_;
    bool maps_ = false;
    int device_ = 0;
    detail::CudaVirtualMemory vmm_;
    std::unique_ptr<detail::TeardownList> teardown_;  // moves with the backend
};

static_assert(Backend<CudaBackend>);
static_assert(PinnedHostBackend<CudaBackend>);
static_assert(MemsetBackend<CudaBackend>);
static_assert(AsyncMemsetBackend<CudaBackend>);
static_assert(SynchronizingBackend<CudaBackend>);
static_assert(AsyncBackend<CudaBackend>);
static_assert(HostFunctionBackend<CudaBackend>);
static_assert(VirtualMemoryBackend<CudaBackend>);
static_assert(PinnedQueryBackend<CudaBackend>);
static_assert(BatchCopyBackend<CudaBackend>);
static_assert(HostRegisterBackend<CudaBackend>);
static_assert(MappedHostBackend<CudaBackend>);
static_assert(StreamCheckBackend<CudaBackend>);
static_assert(TeardownBackend<CudaBackend>);

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
