// SPDX-License-Identifier: Apache-2.0
// A test stand-in for libcudart (and, in the same library, the libcuda virtual-memory entry
// points): the C ABI subset CudaBackend uses, with the prototypes, values and error codes of
// cuda_runtime_api.h, driver_types.h and cuda.h, over host memory. Loaded as both the runtime
// and the driver, so device memory mapped through the driver is seen by the runtime's copies.
//
// It models two devices with a per-thread current device; allocations tagged with their
// device and a per-device capacity; the primary context made current on a thread by
// cudaSetDevice or by a runtime call that needs it (driver calls without one fail with
// CUDA_ERROR_INVALID_CONTEXT); streams and events tagged with their device and creation flags
// (a record on another device's stream is refused); virtual memory with reservations,
// physical chunks and mappings that are accessible only after cuMemSetAccess.
// Streams are immediate: enqueued work runs inside the call, host functions too (on the
// calling thread); the legacy default stream (0, cudaStreamLegacy) is a stream of the current
// device; a CUDA call from inside a host function is refused with
// cudaErrorNotPermitted, as CUDA documents it may be. A copy with a null pointer is
// cudaErrorInvalidValue. cudaEventQuery answers cudaErrorNotReady as often as a test asks.
// cudaPointerGetAttributes answers from the allocations: cudaHostAlloc and cudaHostRegister
// memory is host (page-locked), cudaMalloc and mapped memory device, any other address
// unregistered. cudaHostRegister refuses a range overlapping a registered one or a
// cudaHostAlloc allocation (cudaErrorHostMemoryAlreadyRegistered); cudaHostUnregister a
// pointer that starts no registered range (cudaErrorHostMemoryNotRegistered). Its devices can
// map host memory and share the host's address space (cudaDeviceGetAttribute), so
// cudaHostGetDevicePointer gives a cudaHostAlloc pointer's own address; cuda_shim_set_can_map(0)
// turns both attributes off. It keeps the flags cudaHostAlloc and cudaHostRegister were given
// (cuda_shim_host_flags); cudaDevAttrHostNumaId answers -1 (no NUMA) and cudaDeviceGetPCIBusId
// a fixed address per device until a test sets them.
// cudaDeviceReset resets the current device: it frees that device's allocations, streams and
// events, and refuses (cudaErrorIllegalState, counted in cuda_shim_reset_violations) when
// pinned host memory made with that device current — cudaHostAlloc, cudaHostRegister — is
// still allocated or registered: such memory must go back before the reset.
// cuda_shim_set_sticky_error(code) models a fault of the device, sticky as CUDA's: every wait
// (cudaDeviceSynchronize, cudaEventSynchronize, cudaEventQuery) answers `code` until the reset.
// Test control: the cuda_shim_* functions.
//
// cudaMemcpyBatchAsync copies in order, each copy checked as cudaMemcpyAsync checks it, and
// refuses the legacy default stream; cudaRuntimeGetVersion answers 13000 and the batch call has
// the CUDA 13 form.
//
// Built with CUDA_SHIM_NO_EVENT_QUERY it lacks cudaEventQuery; with CUDA_SHIM_NO_DRIVER it
// lacks every driver entry point; with CUDA_SHIM_NO_BATCH cudaMemcpyBatchAsync and
// cudaRuntimeGetVersion; with CUDA_SHIM_RUNTIME_12080 it is a 12.8 runtime: cudaRuntimeGetVersion
// answers 12080 and cudaMemcpyBatchAsync takes failIdx before the stream.
#include <sys/mman.h>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

using cudaError_t = int;
using cudaStream_t = void*;
using cudaEvent_t = void*;
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;

namespace {
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorInvalidValue = 1;
constexpr cudaError_t cudaErrorMemoryAllocation = 2;
constexpr cudaError_t cudaErrorInvalidMemcpyDirection = 21;
constexpr cudaError_t cudaErrorInvalidDevice = 101;
constexpr cudaError_t cudaErrorInvalidResourceHandle = 400;
constexpr cudaError_t cudaErrorHostMemoryAlreadyRegistered = 712;
constexpr cudaError_t cudaErrorHostMemoryNotRegistered = 713;
constexpr cudaError_t cudaErrorNotReady = 600;
constexpr cudaError_t cudaErrorNotPermitted = 800;
constexpr cudaError_t cudaErrorIllegalState = 401;
[[maybe_unused]] constexpr CUresult CUDA_SUCCESS = 0;
[[maybe_unused]] constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
[[maybe_unused]] constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
[[maybe_unused]] constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
[[maybe_unused]] constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
[[maybe_unused]] constexpr CUresult CUDA_ERROR_NOT_PERMITTED = 800;
constexpr int device_count = 2;
[[maybe_unused]] constexpr std::size_t granularity = std::size_t{2} << 20;

struct Allocation {
    std::size_t bytes;
    int device;          // -1: host (cudaHostAlloc)
    unsigned flags = 0;  // cudaHostAlloc's
    int owner = -1;      // host memory: the device current when it was made
};
struct Stream {
    int device;
    unsigned flags;
};
struct Event {
    int device;
    unsigned flags;
    bool recorded = false;
};
struct Physical {
    std::size_t bytes;
    int device;
    int mappings = 0;
    bool released = false;  // cuMemRelease while mapped: freed at the last unmap
};
struct Mapping {
    std::size_t bytes;
    CUmemGenericAllocationHandle handle;
    bool accessible = false;
};

// CUmemLocation, CUmemAllocationProp, CUmemAccessDesc as in cuda.h.
struct MemLocation {
    int type;
    int id;
};
struct MemAllocationProp {
    int type;
    int requestedHandleTypes;
    MemLocation location;
    void* win32HandleMetaData;
    unsigned char allocFlags[8];
};
struct MemAccessDesc {
    MemLocation location;
    int flags;
};
static_assert(sizeof(MemAllocationProp) == 32 && sizeof(MemAccessDesc) == 12);

std::mutex mutex;
std::size_t capacity[device_count] = {std::size_t{1} << 34, std::size_t{1} << 34};
std::size_t used[device_count] = {};
std::map<std::uintptr_t, Allocation> allocations;
std::map<std::uintptr_t, std::size_t> registered;     // cudaHostRegister ranges
std::map<std::uintptr_t, unsigned> registered_flags;  // their cudaHostRegister flags
std::map<std::uintptr_t, int> registered_owner;       // the device current at their cudaHostRegister
std::size_t reset_violations = 0;                     // resets that found pinned memory still there
int sticky_error = 0;                                 // a device fault: every wait answers it until cudaDeviceReset
std::string last_violation;
int host_numa_id[device_count] = {-1, -1};  // cudaDevAttrHostNumaId
std::string pci_bus_id[device_count] = {"0000:17:00.0", "0000:65:00.0"};
std::map<void*, Stream*> streams;
std::map<void*, Event*> events;
std::map<std::uintptr_t, std::size_t> reservations;
std::map<std::uintptr_t, Mapping> mappings;
std::map<CUmemGenericAllocationHandle, Physical> physicals;
[[maybe_unused]] CUmemGenericAllocationHandle next_handle = 0;
int vmm_supported = 1;
int can_map = 1;
int not_ready_answers = 0;
unsigned last_wait_flags = ~0U;
std::size_t fail_batch_at = SIZE_MAX;
int fail_batch_code = 0;
std::string fail_function;
int fail_countdown = 0;
int fail_code = 0;
thread_local int current_device = 0;
thread_local bool context_current = false;
thread_local bool in_host_function = false;  // a host function must not call CUDA

// What a test left allocated goes when the library does, as a process's contexts are torn
// down at exit.
struct Teardown {
    Teardown() = default;
    Teardown(const Teardown&) = delete;
    Teardown& operator=(const Teardown&) = delete;
    ~Teardown() {
        for (const auto& [address, allocation] : allocations) std::free(reinterpret_cast<void*>(address));
        for (const auto& [handle, stream] : streams) delete stream;
        for (const auto& [handle, event] : events) delete event;
    }
} teardown;

bool injected(const char* function, int& code) {
    if (fail_function != function || fail_countdown <= 0) return false;
    if (--fail_countdown > 0) return false;
    fail_function.clear();
    code = fail_code;
    return true;
}

// A runtime call that needs a context makes the current device's primary context current.
void touch() {
    context_current = true;
}

// True when [address, address + bytes) lies in mapped chunks that all grant access.
bool in_accessible_mappings(std::uintptr_t address, std::size_t bytes) {
    auto it = mappings.upper_bound(address);
    if (it == mappings.begin()) return false;
    --it;
    std::uintptr_t at = address;
    const std::uintptr_t end = address + bytes;
    while (it != mappings.end() && it->first <= at && at < it->first + it->second.bytes) {
        if (!it->second.accessible) return false;
        at = it->first + it->second.bytes;
        if (at >= end) return true;
        ++it;
    }
    return false;
}

// Whether [pointer, pointer + bytes) lies inside one allocation of the wanted kind (device
// memory: a cudaMalloc allocation or accessible mapped chunks).
bool inside(const void* pointer, std::size_t bytes, bool device) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    if (device && in_accessible_mappings(address, bytes)) return true;
    auto next = allocations.upper_bound(address);
    if (next == allocations.begin()) return false;
    --next;
    const Allocation& a = next->second;
    if ((a.device >= 0) != device) return false;
    return address - next->first <= a.bytes && bytes <= a.bytes - (address - next->first);
}

// The device of a stream: a created one's, or the current device for the legacy default stream
// (0, or cudaStreamLegacy); -1 for an unknown stream.
int device_of_stream(cudaStream_t stream) {
    if (stream == nullptr || reinterpret_cast<std::uintptr_t>(stream) == 1) return current_device;
    const auto found = streams.find(stream);
    return found == streams.end() ? -1 : found->second->device;
}

cudaError_t copy(void* dst, const void* src, std::size_t count, int kind) {
    if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
    if (kind != 1 && kind != 2) return cudaErrorInvalidMemcpyDirection;
    if (!inside(kind == 1 ? dst : src, count, true)) return cudaErrorInvalidValue;
    std::memcpy(dst, src, count);
    return cudaSuccess;
}

// True when [pointer, pointer + size) is exactly a run of whole, adjacent mappings.
[[maybe_unused]] bool whole_mappings(std::uintptr_t pointer, std::size_t size) {
    const std::uintptr_t end = pointer + size;
    std::uintptr_t at = pointer;
    for (auto it = mappings.find(pointer); at < end; ++it) {
        if (it == mappings.end() || it->first != at || at + it->second.bytes > end) return false;
        at += it->second.bytes;
    }
    return size > 0;
}

[[maybe_unused]] bool valid_prop(const MemAllocationProp* prop) {
    return prop != nullptr && prop->type == 1 && prop->requestedHandleTypes == 0 && prop->location.type == 1 &&
           prop->location.id >= 0 && prop->location.id < device_count && prop->win32HandleMetaData == nullptr;
}
}  // namespace

extern "C" {

// ---- test control ---------------------------------------------------------------------------
void cuda_shim_set_capacity(int device, std::size_t bytes) {
    std::lock_guard lock(mutex);
    capacity[device] = bytes;
}
/// The n-th next call of `function` fails with `code`.
void cuda_shim_fail(const char* function, int n, int code) {
    std::lock_guard lock(mutex);
    fail_function = function;
    fail_countdown = n;
    fail_code = code;
}
/// The next cudaMemcpyBatchAsync refuses its copy `index` with `code` (the copies before it are
/// made).
void cuda_shim_fail_batch_at(std::size_t index, int code) {
    std::lock_guard lock(mutex);
    fail_batch_at = index;
    fail_batch_code = code;
}
/// The next `n` cudaEventQuery calls of recorded events answer cudaErrorNotReady.
void cuda_shim_event_not_ready(int n) {
    std::lock_guard lock(mutex);
    not_ready_answers = n;
}
/// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED of every device.
void cuda_shim_set_vmm_supported(int supported) {
    std::lock_guard lock(mutex);
    vmm_supported = supported;
}
/// cudaDevAttrCanMapHostMemory and cudaDevAttrUnifiedAddressing of every device.
void cuda_shim_set_can_map(int supported) {
    std::lock_guard lock(mutex);
    can_map = supported;
}
/// The device an allocation was made on; -1 for host memory, -2 when unknown.
int cuda_shim_device_of(const void* pointer) {
    std::lock_guard lock(mutex);
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    return found == allocations.end() ? -2 : found->second.device;
}
/// The flags cudaHostAlloc or cudaHostRegister was given for the memory starting at `pointer`;
/// ~0 when neither allocated or registered memory there.
unsigned cuda_shim_host_flags(const void* pointer) {
    std::lock_guard lock(mutex);
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    if (const auto found = registered_flags.find(address); found != registered_flags.end()) return found->second;
    const auto found = allocations.find(address);
    return found == allocations.end() || found->second.device >= 0 ? ~0U : found->second.flags;
}
/// cudaDevAttrHostNumaId of `device` (-1, no NUMA, until set) and its cudaDeviceGetPCIBusId.
void cuda_shim_set_host_numa(int device, int node) {
    std::lock_guard lock(mutex);
    host_numa_id[device] = node;
}
void cuda_shim_set_pci_bus_id(int device, const char* bus_id) {
    std::lock_guard lock(mutex);
    pci_bus_id[device] = bus_id;
}
/// The device and creation flags of a stream or an event; -1 when unknown.
int cuda_shim_stream_info(void* stream, unsigned* flags) {
    std::lock_guard lock(mutex);
    const auto found = streams.find(stream);
    if (found == streams.end()) return -1;
    *flags = found->second->flags;
    return found->second->device;
}
int cuda_shim_event_info(void* event, unsigned* flags) {
    std::lock_guard lock(mutex);
    const auto found = events.find(event);
    if (found == events.end()) return -1;
    *flags = found->second->flags;
    return found->second->device;
}
/// The flags of the last cudaStreamWaitEvent.
unsigned cuda_shim_last_wait_flags() {
    std::lock_guard lock(mutex);
    return last_wait_flags;
}
/// A sticky fault: every wait answers `code` until cudaDeviceReset (0: none).
void cuda_shim_set_sticky_error(int code) {
    std::lock_guard lock(mutex);
    sticky_error = code;
}
/// Resets (cudaDeviceReset) that found pinned host memory of their device still allocated or
/// registered, and what the last one found.
std::size_t cuda_shim_reset_violations() {
    std::lock_guard lock(mutex);
    return reset_violations;
}
const char* cuda_shim_last_violation() {
    std::lock_guard lock(mutex);
    return last_violation.c_str();
}
/// Pinned host memory made with `device` current: cudaHostAlloc allocations (kind 0) or
/// cudaHostRegister ranges (1) still live.
std::size_t cuda_shim_live_pinned(int device, int kind) {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    if (kind == 0) {
        for (const auto& [address, a] : allocations) n += a.device < 0 && a.owner == device;
    } else {
        for (const auto& [address, owner] : registered_owner) n += owner == device;
    }
    return n;
}
/// Live objects: 0 streams, 1 events, 2 reservations, 3 mappings, 4 physical chunks.
std::size_t cuda_shim_live(int kind) {
    std::lock_guard lock(mutex);
    switch (kind) {
        case 0:
            return streams.size();
        case 1:
            return events.size();
        case 2:
            return reservations.size();
        case 3:
            return mappings.size();
        default:
            return physicals.size();
    }
}

// ---- the runtime subset ---------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
    if (in_host_function) return cudaErrorNotPermitted;
    *count = device_count;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    if (in_host_function) return cudaErrorNotPermitted;
    *device = current_device;
    return cudaSuccess;
}
// As since CUDA 12: makes the device's primary context current, even if it already was.
cudaError_t cudaSetDevice(int device) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaSetDevice", code)) return code;
    if (device < 0 || device >= device_count) return cudaErrorInvalidDevice;
    current_device = device;
    touch();
    return cudaSuccess;
}
// Resets the current device: its allocations, streams and events go. Pinned host memory made
// with it current that is still allocated or registered is a violation: counted, described and
// refused with cudaErrorIllegalState (the reset is done all the same).
cudaError_t cudaDeviceReset() {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaDeviceReset", code)) return code;
    const int device = current_device;
    sticky_error = 0;
    std::size_t host = 0, ranges = 0;
    for (auto it = allocations.begin(); it != allocations.end();) {
        if (it->second.device == device) {
            used[device] -= it->second.bytes;
            std::free(reinterpret_cast<void*>(it->first));
            it = allocations.erase(it);
            continue;
        }
        host += it->second.device < 0 && it->second.owner == device;
        ++it;
    }
    for (const auto& [address, owner] : registered_owner) ranges += owner == device;
    for (auto it = streams.begin(); it != streams.end();) {
        if (it->second->device != device) {
            ++it;
            continue;
        }
        delete it->second;
        it = streams.erase(it);
    }
    for (auto it = events.begin(); it != events.end();) {
        if (it->second->device != device) {
            ++it;
            continue;
        }
        delete it->second;
        it = events.erase(it);
    }
    if (host + ranges == 0) return cudaSuccess;
    ++reset_violations;
    last_violation = "cudaDeviceReset of device " + std::to_string(device) + ": " + std::to_string(host) +
                     " cudaHostAlloc allocation(s) and " + std::to_string(ranges) +
                     " cudaHostRegister range(s) made on it are still there";
    return cudaErrorIllegalState;
}
cudaError_t cudaMalloc(void** pointer, std::size_t size) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaMalloc", code)) return code;
    touch();
    if (size == 0) {
        *pointer = nullptr;
        return cudaSuccess;
    }
    const int device = current_device;
    if (size > capacity[device] - used[device]) return cudaErrorMemoryAllocation;
    void* memory = std::aligned_alloc(256, (size + 255) / 256 * 256);
    if (memory == nullptr) return cudaErrorMemoryAllocation;
    allocations[reinterpret_cast<std::uintptr_t>(memory)] = Allocation{size, device};
    used[device] += size;
    *pointer = memory;
    return cudaSuccess;
}
cudaError_t cudaFree(void* pointer) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaFree", code)) return code;
    touch();
    if (pointer == nullptr) return cudaSuccess;
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == allocations.end() || found->second.device < 0) return cudaErrorInvalidValue;
    used[found->second.device] -= found->second.bytes;
    allocations.erase(found);
    std::free(pointer);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** pointer, std::size_t size, unsigned flags) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaHostAlloc", code)) return code;
    touch();
    if (flags > 0xF) return cudaErrorInvalidValue;
    void* memory = std::aligned_alloc(256, (size + 255) / 256 * 256 + 256);
    if (memory == nullptr) return cudaErrorMemoryAllocation;
    allocations[reinterpret_cast<std::uintptr_t>(memory)] = Allocation{size, -1, flags, current_device};
    *pointer = memory;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, int attribute, int device) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    if (value == nullptr || device < 0 || device >= device_count) return cudaErrorInvalidValue;
    if (attribute == 134) {  // cudaDevAttrHostNumaId
        *value = host_numa_id[device];
        return cudaSuccess;
    }
    *value = attribute == 19 || attribute == 41 ? can_map : 0;  // CanMapHostMemory, UnifiedAddressing
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int length, int device) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaDeviceGetPCIBusId", code)) return code;
    if (bus_id == nullptr || length <= 0) return cudaErrorInvalidValue;
    if (device < 0 || device >= device_count) return cudaErrorInvalidDevice;
    const std::string& id = pci_bus_id[device];
    const std::size_t n = std::min(id.size(), static_cast<std::size_t>(length) - 1);
    std::memcpy(bus_id, id.data(), n);
    bus_id[n] = '\0';
    return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned flags) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaHostGetDevicePointer", code)) return code;
    touch();
    if (device == nullptr || flags != 0 || can_map == 0 || !inside(host, 1, false)) return cudaErrorInvalidValue;
    *device = host;  // unified addressing: the host address
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* pointer) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    touch();
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == allocations.end() || found->second.device >= 0) return cudaErrorInvalidValue;
    allocations.erase(found);
    std::free(pointer);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void* pointer, std::size_t size, unsigned flags) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaHostRegister", code)) return code;
    touch();
    if (pointer == nullptr || size == 0 || flags > 0xF) return cudaErrorInvalidValue;
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    const auto overlaps = [&](const auto& ranges, auto bytes_of) {  // bytes_of: 0 for what cannot overlap
        auto it = ranges.upper_bound(address);
        if (it != ranges.begin()) --it;
        for (; it != ranges.end() && it->first < address + size; ++it) {
            if (it->first + bytes_of(it->second) > address && bytes_of(it->second) > 0) return true;
        }
        return false;
    };
    if (overlaps(registered, [](std::size_t bytes) { return bytes; }) ||
        overlaps(allocations, [](const Allocation& a) { return a.device < 0 ? a.bytes : std::size_t{0}; })) {
        return cudaErrorHostMemoryAlreadyRegistered;
    }
    registered[address] = size;
    registered_flags[address] = flags;
    registered_owner[address] = current_device;
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* pointer) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaHostUnregister", code)) return code;
    touch();
    if (registered.erase(reinterpret_cast<std::uintptr_t>(pointer)) == 0) return cudaErrorHostMemoryNotRegistered;
    registered_flags.erase(reinterpret_cast<std::uintptr_t>(pointer));
    registered_owner.erase(reinterpret_cast<std::uintptr_t>(pointer));
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t count, int kind) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaMemcpy", code)) return code;
    touch();
    return copy(dst, src, count, kind);
}
cudaError_t cudaMemset(void* pointer, int value, std::size_t count) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    touch();
    if (!inside(pointer, count, true)) return cudaErrorInvalidValue;
    std::memset(pointer, value, count);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaDeviceSynchronize", code)) return code;
    touch();
    return sticky_error;
}
const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorInvalidMemcpyDirection:
            return "invalid copy direction for memcpy";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorNotReady:
            return "device not ready";
        case cudaErrorNotPermitted:
            return "operation not permitted";
        case 700:
            return "an illegal memory access was encountered";
        default:
            return "unrecognized error code";
    }
}

// ---- streams and events (immediate) ---------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaStreamCreateWithFlags", code)) return code;
    touch();
    if (flags > 1) return cudaErrorInvalidValue;
    auto* created = new Stream{current_device, flags};
    streams[created] = created;
    *stream = created;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaStreamDestroy", code)) return code;
    const auto found = streams.find(stream);
    if (found == streams.end()) return cudaErrorInvalidResourceHandle;
    delete found->second;
    streams.erase(found);
    return cudaSuccess;
}
#ifndef CUDA_SHIM_NO_BATCH  // a runtime before 12.8 has neither
// As since CUDA 12.8: the device a stream was created on (the default streams: the current one).
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaStreamGetDevice", code)) return code;
    if (device == nullptr) return cudaErrorInvalidValue;
    if (reinterpret_cast<std::uintptr_t>(stream) <= 2) {
        *device = current_device;
        return cudaSuccess;
    }
    const auto found = streams.find(stream);
    if (found == streams.end()) return cudaErrorInvalidResourceHandle;
    *device = found->second->device;
    return cudaSuccess;
}
#endif
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t count, int kind, cudaStream_t stream) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaMemcpyAsync", code)) return code;
    touch();
    if (stream != nullptr && streams.count(stream) == 0) return cudaErrorInvalidResourceHandle;
    return copy(dst, src, count, kind);
}
#ifndef CUDA_SHIM_NO_BATCH
#ifdef CUDA_SHIM_RUNTIME_12080
constexpr int runtime_version = 12080;
#else
constexpr int runtime_version = 13000;
#endif
cudaError_t cudaRuntimeGetVersion(int* version) {
    if (version == nullptr) return cudaErrorInvalidValue;
    *version = runtime_version;
    return cudaSuccess;
}
// cudaMemLocation and cudaMemcpyAttributes, as driver_types.h declares them.
struct ShimMemLocation {
    int type;
    int id;
};
struct ShimMemcpyAttributes {
    int srcAccessOrder;  // Invalid 0, Stream 1, DuringApiCall 2, Any 3
    ShimMemLocation srcLocHint;
    ShimMemLocation dstLocHint;
    unsigned flags;
};
static_assert(sizeof(ShimMemcpyAttributes) == 24);

// The direction of each copy comes from where its pointers lie (device memory on one side).
static cudaError_t batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                         ShimMemcpyAttributes* attrs, std::size_t* attrsIdxs, std::size_t numAttrs,
                         std::size_t* failIdx, cudaStream_t stream) {
    if (failIdx != nullptr) *failIdx = SIZE_MAX;
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaMemcpyBatchAsync", code)) return code;
    touch();
    if (stream == nullptr || stream == reinterpret_cast<cudaStream_t>(0x1)) return cudaErrorInvalidValue;
    if (streams.count(stream) == 0) return cudaErrorInvalidResourceHandle;
    if (dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr || attrsIdxs == nullptr ||
        count == 0 || numAttrs == 0 || numAttrs > count || attrsIdxs[0] != 0) {
        return cudaErrorInvalidValue;
    }
    for (std::size_t k = 0; k < numAttrs; ++k) {
        if ((k > 0 && attrsIdxs[k] <= attrsIdxs[k - 1]) || attrsIdxs[k] >= count) return cudaErrorInvalidValue;
        if (attrs[k].srcAccessOrder < 1 || attrs[k].srcAccessOrder > 3 || attrs[k].flags > 1) {
            return cudaErrorInvalidValue;
        }
    }
    for (std::size_t i = 0; i < count; ++i) {
        const bool to_device = inside(dsts[i], sizes[i], true);
        cudaError_t copied = i == fail_batch_at ? fail_batch_code : copy(dsts[i], srcs[i], sizes[i], to_device ? 1 : 2);
        if (i == fail_batch_at) fail_batch_at = SIZE_MAX;
        if (copied != cudaSuccess) {
            if (failIdx != nullptr) *failIdx = i;
            return copied;
        }
    }
    return cudaSuccess;
}
#ifdef CUDA_SHIM_RUNTIME_12080
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                 std::size_t count, ShimMemcpyAttributes* attrs, std::size_t* attrsIdxs,
                                 std::size_t numAttrs, std::size_t* failIdx, cudaStream_t stream) {
    return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream);
}
#else
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                 std::size_t count, ShimMemcpyAttributes* attrs, std::size_t* attrsIdxs,
                                 std::size_t numAttrs, cudaStream_t stream) {
    return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, nullptr, stream);
}
#endif
#endif  // CUDA_SHIM_NO_BATCH
cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t count, cudaStream_t stream) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaMemsetAsync", code)) return code;
    touch();
    if (stream != nullptr && streams.count(stream) == 0) return cudaErrorInvalidResourceHandle;
    if (!inside(pointer, count, true)) return cudaErrorInvalidValue;
    std::memset(pointer, value, count);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaEventCreateWithFlags", code)) return code;
    touch();
    if (flags > 0xF) return cudaErrorInvalidValue;
    auto* created = new Event{current_device, flags};
    events[created] = created;
    *event = created;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaEventDestroy", code)) return code;
    const auto found = events.find(event);
    if (found == events.end()) return cudaErrorInvalidResourceHandle;
    delete found->second;
    events.erase(found);
    return cudaSuccess;
}
// The event and the stream must be on the same device.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaEventRecord", code)) return code;
    touch();
    const auto found = events.find(event);
    const int device = device_of_stream(stream);
    if (found == events.end() || device < 0) return cudaErrorInvalidResourceHandle;
    if (found->second->device != device) return cudaErrorInvalidResourceHandle;
    found->second->recorded = true;
    return cudaSuccess;
}
#ifndef CUDA_SHIM_NO_EVENT_QUERY
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaEventQuery", code)) return code;
    if (sticky_error != 0) return sticky_error;
    const auto found = events.find(event);
    if (found == events.end()) return cudaErrorInvalidResourceHandle;
    if (found->second->recorded && not_ready_answers > 0) {
        --not_ready_answers;
        return cudaErrorNotReady;
    }
    return cudaSuccess;
}
#endif
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaEventSynchronize", code)) return code;
    if (sticky_error != 0) return sticky_error;
    if (events.count(event) == 0) return cudaErrorInvalidResourceHandle;
    not_ready_answers = 0;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaStreamWaitEvent", code)) return code;
    if (device_of_stream(stream) < 0 || events.count(event) == 0) return cudaErrorInvalidResourceHandle;
    last_wait_flags = flags;
    return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, void (*function)(void*), void* user_data) {
    if (in_host_function) return cudaErrorNotPermitted;
    {
        std::lock_guard lock(mutex);
        int code;
        if (injected("cudaLaunchHostFunc", code)) return code;
        if (device_of_stream(stream) < 0 || function == nullptr) return cudaErrorInvalidResourceHandle;
    }
    in_host_function = true;
    function(user_data);
    in_host_function = false;
    return cudaSuccess;
}
// cudaPointerAttributes, the part that CUDA 12 and 13 share (CUDA 13 adds reserved space after
// it, which this runtime leaves alone as a CUDA 12 runtime would).
struct PointerAttributes {
    int type;  // 0 unregistered, 1 host, 2 device
    int device;
    void* devicePointer;
    void* hostPointer;
};
cudaError_t cudaPointerGetAttributes(PointerAttributes* attributes, const void* pointer) {
    if (in_host_function) return cudaErrorNotPermitted;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cudaPointerGetAttributes", code)) return code;
    if (attributes == nullptr) return cudaErrorInvalidValue;
    touch();
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    *attributes = PointerAttributes{0, -2, nullptr, nullptr};  // unregistered: pageable host memory
    if (in_accessible_mappings(address, 1)) {
        *attributes = PointerAttributes{2, current_device, const_cast<void*>(pointer), nullptr};
        return cudaSuccess;
    }
    void* const at = const_cast<void*>(pointer);
    if (auto range = registered.upper_bound(address); range != registered.begin()) {
        --range;
        if (address - range->first < range->second) {
            *attributes = PointerAttributes{1, current_device, at, at};
            return cudaSuccess;
        }
    }
    auto next = allocations.upper_bound(address);
    if (next == allocations.begin()) return cudaSuccess;
    --next;
    if (address - next->first >= next->second.bytes) return cudaSuccess;
    const int device = next->second.device;
    *attributes = device < 0 ? PointerAttributes{1, current_device, at, at} : PointerAttributes{2, device, at, nullptr};
    return cudaSuccess;
}

// ---- the driver's virtual memory ------------------------------------------------------------
#ifndef CUDA_SHIM_NO_DRIVER
CUresult cuGetErrorString(CUresult error, const char** text) {
    switch (error) {
        case CUDA_SUCCESS:
            *text = "no error";
            break;
        case CUDA_ERROR_INVALID_VALUE:
            *text = "invalid argument";
            break;
        case CUDA_ERROR_OUT_OF_MEMORY:
            *text = "out of memory";
            break;
        case CUDA_ERROR_INVALID_DEVICE:
            *text = "invalid device ordinal";
            break;
        case CUDA_ERROR_INVALID_CONTEXT:
            *text = "invalid device context";
            break;
        case CUDA_ERROR_NOT_PERMITTED:
            *text = "operation not permitted";
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    if (device < 0 || device >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *value = attribute == 102 ? vmm_supported : 0;
    return CUDA_SUCCESS;
}
CUresult cuMemGetAllocationGranularity(std::size_t* result, const MemAllocationProp* prop, int option) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    if (!valid_prop(prop) || (option != 0 && option != 1)) return CUDA_ERROR_INVALID_VALUE;
    *result = granularity;
    return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr* pointer, std::size_t size, std::size_t alignment, CUdeviceptr address,
                             unsigned long long flags) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cuMemAddressReserve", code)) return code;
    if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0 || size % granularity != 0 || (alignment & (alignment - 1)) != 0 || address != 0 || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    void* raw = ::mmap(nullptr, size + granularity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const auto start = (reinterpret_cast<std::uintptr_t>(raw) + granularity - 1) & ~(granularity - 1);
    reservations[start] = size;
    *pointer = start;
    return CUDA_SUCCESS;
}
// The whole reservation, with nothing mapped in it.
CUresult cuMemAddressFree(CUdeviceptr pointer, std::size_t size) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
    const auto found = reservations.find(pointer);
    if (found == reservations.end() || found->second != size) return CUDA_ERROR_INVALID_VALUE;
    const auto mapped = mappings.lower_bound(pointer);
    if (mapped != mappings.end() && mapped->first < pointer + size) return CUDA_ERROR_INVALID_VALUE;
    reservations.erase(found);  // the address range stays reserved: never reused in a test run
    return CUDA_SUCCESS;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size, const MemAllocationProp* prop,
                     unsigned long long flags) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cuMemCreate", code)) return code;
    if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!valid_prop(prop) || size == 0 || size % granularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const int device = prop->location.id;
    if (size > capacity[device] - used[device]) return CUDA_ERROR_OUT_OF_MEMORY;
    used[device] += size;
    *handle = ++next_handle;
    physicals[*handle] = Physical{size, device};
    return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
    const auto found = physicals.find(handle);
    if (found == physicals.end() || found->second.released) return CUDA_ERROR_INVALID_VALUE;
    if (found->second.mappings > 0) {
        found->second.released = true;
        return CUDA_SUCCESS;
    }
    used[found->second.device] -= found->second.bytes;
    physicals.erase(found);
    return CUDA_SUCCESS;
}
// Inside one reservation, over nothing mapped yet; mapped without access until cuMemSetAccess.
CUresult cuMemMap(CUdeviceptr pointer, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cuMemMap", code)) return code;
    if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
    const auto physical = physicals.find(handle);
    if (physical == physicals.end() || physical->second.released || offset != 0 || flags != 0 || size == 0 ||
        size > physical->second.bytes || size % granularity != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    auto reservation = reservations.upper_bound(pointer);
    if (reservation == reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
    --reservation;
    if (pointer + size > reservation->first + reservation->second) return CUDA_ERROR_INVALID_VALUE;
    const auto after = mappings.lower_bound(pointer);
    if (after != mappings.end() && after->first < pointer + size) return CUDA_ERROR_INVALID_VALUE;
    if (after != mappings.begin()) {
        const auto before = std::prev(after);
        if (before->first + before->second.bytes > pointer) return CUDA_ERROR_INVALID_VALUE;
    }
    mappings[pointer] = Mapping{size, handle};
    ++physical->second.mappings;
    return CUDA_SUCCESS;
}
// [pointer, pointer + size) must be fully mapped; only device read-write access is modelled.
CUresult cuMemSetAccess(CUdeviceptr pointer, std::size_t size, const MemAccessDesc* desc, std::size_t count) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    int code;
    if (injected("cuMemSetAccess", code)) return code;
    if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (desc == nullptr || count != 1 || desc->location.type != 1 || desc->location.id < 0 ||
        desc->location.id >= device_count || desc->flags != 3) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!whole_mappings(pointer, size)) return CUDA_ERROR_INVALID_VALUE;
    for (auto it = mappings.find(pointer); it != mappings.end() && it->first < pointer + size; ++it) {
        if (!it->second.accessible) {
            if (::mmap(reinterpret_cast<void*>(it->first), it->second.bytes, PROT_READ | PROT_WRITE,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        it->second.accessible = true;
    }
    return CUDA_SUCCESS;
}
// Whole mappings only.
CUresult cuMemUnmap(CUdeviceptr pointer, std::size_t size) {
    if (in_host_function) return CUDA_ERROR_NOT_PERMITTED;
    std::lock_guard lock(mutex);
    if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!whole_mappings(pointer, size)) return CUDA_ERROR_INVALID_VALUE;
    for (auto it = mappings.find(pointer); it != mappings.end() && it->first < pointer + size;) {
        ::mmap(reinterpret_cast<void*>(it->first), it->second.bytes, PROT_NONE,
               MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        const auto physical = physicals.find(it->second.handle);
        if (--physical->second.mappings == 0 && physical->second.released) {
            used[physical->second.device] -= physical->second.bytes;
            physicals.erase(physical);
        }
        it = mappings.erase(it);
    }
    return CUDA_SUCCESS;
}
#endif  // CUDA_SHIM_NO_DRIVER

}  // extern "C"
