// SPDX-License-Identifier: Apache-2.0
// A test stand-in for libascendcl.so: the ACL C ABI subset devstage uses, with the same
// prototypes, enum values and error codes, over host memory. It models per-thread current
// contexts, allocations tagged with their device, per-device capacity, the documented rules
// (size 0 rejected, count > destMax rejected, 64-byte alignment, no context → error) and
// fault injection controlled by the tests through the shim_* functions.
#include <sys/mman.h>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

using aclError = int;
using aclrtContext = void*;

namespace {
constexpr aclError ACL_SUCCESS = 0;
constexpr aclError ACL_ERROR_INVALID_PARAM = 100000;
constexpr aclError ACL_ERROR_UNINITIALIZE = 100001;
constexpr aclError ACL_ERROR_REPEAT_INITIALIZE = 100002;
constexpr aclError ACL_ERROR_RT_PARAM_INVALID = 107000;
constexpr aclError ACL_ERROR_RT_INVALID_DEVICEID = 107001;
constexpr aclError ACL_ERROR_RT_CONTEXT_NULL = 107002;
constexpr aclError ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;
constexpr int device_count = 4;

struct Context {
    int device;
};
struct Allocation {
    std::size_t bytes;
    int device;  // -1: host (aclrtMallocHost)
};

// Virtual memory: reservations map physical chunks contiguously from their start.
[[maybe_unused]] constexpr std::size_t vmm_granularity = std::size_t{2} << 20;
struct Reservation {
    std::size_t bytes;
    std::size_t mapped;  // prefix mapped so far
    int device;
};
struct Physical {
    std::size_t bytes;
    int device;
    void* mapped_at;
};
std::map<std::uintptr_t, Reservation> reservations;
std::map<void*, Physical> physicals;

std::mutex mutex;
bool initialized = false;
int device_refs[device_count] = {};
std::size_t capacity[device_count] = {std::size_t{1} << 34, std::size_t{1} << 34, std::size_t{1} << 34,
                                      std::size_t{1} << 34};
std::size_t used[device_count] = {};
std::map<std::uintptr_t, Allocation> allocations;
thread_local Context* current = nullptr;
thread_local std::string recent_error;
std::string fail_function;
int fail_countdown = 0;
aclError fail_code = 0;

aclError fail(aclError code, std::string message) {
    recent_error = std::move(message);
    return code;
}

// Injected failure for `function`, if one is armed and due.
bool injected(const char* function, aclError& code) {
    if (fail_function != function || fail_countdown <= 0) return false;
    if (--fail_countdown > 0) return false;
    fail_function.clear();
    code = fail(fail_code, std::string("injected failure of ") + function);
    return true;
}

bool in_mapped_reservation(std::uintptr_t address, std::size_t bytes) {
    auto next = reservations.upper_bound(address);
    if (next == reservations.begin()) return false;
    --next;
    const std::uintptr_t offset = address - next->first;
    return offset <= next->second.mapped && bytes <= next->second.mapped - offset;
}

const Allocation vmm_allocation{0, 0};

const Allocation* find(const void* pointer, std::size_t bytes, bool device) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    if (device && in_mapped_reservation(address, bytes)) return &vmm_allocation;
    auto next = allocations.upper_bound(address);
    if (next == allocations.begin()) return nullptr;
    --next;
    const Allocation& a = next->second;
    if ((a.device >= 0) != device) return nullptr;
    if (address - next->first > a.bytes || bytes > a.bytes - (address - next->first)) return nullptr;
    return &a;
}
}  // namespace

extern "C" {

// ---- test control ---------------------------------------------------------------------------
void shim_set_capacity(int device, std::size_t bytes) {
    std::lock_guard lock(mutex);
    capacity[device] = bytes;
}
/// The n-th next call of `function` fails with `code`.
void shim_fail(const char* function, int n, int code) {
    std::lock_guard lock(mutex);
    fail_function = function;
    fail_countdown = n;
    fail_code = code;
}
/// The device an allocation was made on; -1 for host memory, -2 when unknown.
int shim_device_of(const void* pointer) {
    std::lock_guard lock(mutex);
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    return found == allocations.end() ? -2 : found->second.device;
}
std::size_t shim_live_allocations(int device) {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    for (const auto& [address, a] : allocations) n += a.device == device;
    return n;
}
int shim_device_refs(int device) {
    std::lock_guard lock(mutex);
    return device_refs[device];
}

// ---- the ACL subset -------------------------------------------------------------------------
aclError aclInit(const char*) {
    std::lock_guard lock(mutex);
    if (initialized) return fail(ACL_ERROR_REPEAT_INITIALIZE, "repeat initialize");
    initialized = true;
    return ACL_SUCCESS;
}
aclError aclFinalize() {
    std::lock_guard lock(mutex);
    initialized = false;
    return ACL_SUCCESS;
}
aclError aclrtSetDevice(int32_t device) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtSetDevice", code)) return code;
    if (!initialized) return fail(ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    if (device < 0 || device >= device_count) return fail(ACL_ERROR_RT_INVALID_DEVICEID, "invalid device id");
    ++device_refs[device];
    return ACL_SUCCESS;
}
aclError aclrtResetDevice(int32_t device) {
    std::lock_guard lock(mutex);
    if (device < 0 || device >= device_count || device_refs[device] == 0) {
        return fail(ACL_ERROR_RT_INVALID_DEVICEID, "device not set");
    }
    // The last reset of a device releases every allocation still on it, as a device reset does.
    if (--device_refs[device] == 0) {
        for (auto it = allocations.begin(); it != allocations.end();) {
            if (it->second.device == device) {
                std::free(reinterpret_cast<void*>(it->first));
                it = allocations.erase(it);
            } else {
                ++it;
            }
        }
        used[device] = 0;
        for (auto& [handle, physical] : physicals) {
            if (physical.device == device) used[device] += physical.bytes;
        }
    }
    return ACL_SUCCESS;
}
aclError aclrtCreateContext(aclrtContext* context, int32_t device) {
    std::lock_guard lock(mutex);
    if (device < 0 || device >= device_count || device_refs[device] == 0) {
        return fail(ACL_ERROR_RT_INVALID_DEVICEID, "device not set");
    }
    auto* created = new Context{device};
    *context = created;
    current = created;  // as ACL does: the new context becomes current
    return ACL_SUCCESS;
}
aclError aclrtDestroyContext(aclrtContext context) {
    std::lock_guard lock(mutex);
    if (context == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "null context");
    if (current == context) current = nullptr;
    delete static_cast<Context*>(context);
    return ACL_SUCCESS;
}
aclError aclrtSetCurrentContext(aclrtContext context) {
    if (context == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "null context");
    current = static_cast<Context*>(context);
    return ACL_SUCCESS;
}
aclError aclrtGetCurrentContext(aclrtContext* context) {
    *context = current;
    return current != nullptr ? ACL_SUCCESS : fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
}
aclError aclrtMalloc(void** pointer, std::size_t size, int /*policy*/) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMalloc", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, "size 0");
    const int device = current->device;
    if (size > capacity[device] - used[device]) {
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "device " + std::to_string(device) + " out of memory");
    }
    void* memory = std::aligned_alloc(64, (size + 63) / 64 * 64);
    if (memory == nullptr) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "host out of memory");
    allocations[reinterpret_cast<std::uintptr_t>(memory)] = Allocation{size, device};
    used[device] += size;
    *pointer = memory;
    return ACL_SUCCESS;
}
aclError aclrtFree(void* pointer) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtFree", code)) return code;
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == allocations.end() || found->second.device < 0)
        return fail(ACL_ERROR_INVALID_PARAM, "not a device allocation");
    used[found->second.device] -= found->second.bytes;
    allocations.erase(found);
    std::free(pointer);
    return ACL_SUCCESS;
}
aclError aclrtMallocHost(void** pointer, std::size_t size) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMallocHost", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, "size 0");
    void* memory = std::aligned_alloc(64, (size + 63) / 64 * 64);
    if (memory == nullptr) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "host out of memory");
    allocations[reinterpret_cast<std::uintptr_t>(memory)] = Allocation{size, -1};
    *pointer = memory;
    return ACL_SUCCESS;
}
aclError aclrtFreeHost(void* pointer) {
    std::lock_guard lock(mutex);
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == allocations.end() || found->second.device >= 0)
        return fail(ACL_ERROR_INVALID_PARAM, "not a host allocation");
    allocations.erase(found);
    std::free(pointer);
    return ACL_SUCCESS;
}
aclError aclrtMemcpy(void* dst, std::size_t dest_max, const void* src, std::size_t count, int kind) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMemcpy", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (dest_max == 0 || count > dest_max) return fail(ACL_ERROR_RT_PARAM_INVALID, "count exceeds destMax");
    const bool to_device = kind == 1;
    if (kind != 1 && kind != 2) return fail(ACL_ERROR_INVALID_PARAM, "unsupported memcpy kind");
    if (find(to_device ? dst : src, count, true) == nullptr) {
        return fail(ACL_ERROR_INVALID_PARAM, "device range is not inside one allocation");
    }
    std::memcpy(dst, src, count);
    return ACL_SUCCESS;
}
aclError aclrtMemset(void* pointer, std::size_t max_count, int32_t value, std::size_t count) {
    std::lock_guard lock(mutex);
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (count > max_count) return fail(ACL_ERROR_RT_PARAM_INVALID, "count exceeds maxCount");
    if (find(pointer, count, true) == nullptr)
        return fail(ACL_ERROR_INVALID_PARAM, "range is not inside one allocation");
    std::memset(pointer, value, count);
    return ACL_SUCCESS;
}
aclError aclrtSynchronizeDevice() {
    return current != nullptr ? ACL_SUCCESS : fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
}
#ifndef DEVSTAGE_SHIM_NO_VMM
struct aclrtPhysicalMemProp {
    int handleType;
    int allocationType;
    int memAttr;
    uint32_t locationId;
    int locationType;
    uint64_t reserve;
};
static_assert(sizeof(aclrtPhysicalMemProp) == 32);

aclError aclrtMemGetAllocationGranularity(const aclrtPhysicalMemProp* prop, int /*option*/, std::size_t* granularity) {
    if (prop == nullptr || granularity == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "null argument");
    *granularity = vmm_granularity;
    return ACL_SUCCESS;
}
aclError aclrtReserveMemAddress(void** virtual_pointer, std::size_t size, std::size_t alignment, void* expect,
                                uint64_t flags) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtReserveMemAddress", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (size == 0 || size % vmm_granularity != 0 || alignment != 0 || expect != nullptr || flags != 0) {
        return fail(ACL_ERROR_INVALID_PARAM,
                    "reserve: size must be a multiple of the granularity; alignment, expectPtr, flags 0");
    }
    // Over-reserve to hand out a granularity-aligned range, as the driver does.
    void* raw = ::mmap(nullptr, size + vmm_granularity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "address space exhausted");
    const auto start = (reinterpret_cast<std::uintptr_t>(raw) + vmm_granularity - 1) & ~(vmm_granularity - 1);
    reservations[start] = Reservation{size, 0, current->device};
    *virtual_pointer = reinterpret_cast<void*>(start);
    return ACL_SUCCESS;
}
aclError aclrtReleaseMemAddress(void* virtual_pointer) {
    std::lock_guard lock(mutex);
    const auto found = reservations.find(reinterpret_cast<std::uintptr_t>(virtual_pointer));
    if (found == reservations.end() || found->second.mapped != 0)
        return fail(ACL_ERROR_INVALID_PARAM, "not an unmapped reservation");
    reservations.erase(found);  // the address range itself is left reserved: it is never reused in a test run
    return ACL_SUCCESS;
}
aclError aclrtMallocPhysical(void** handle, std::size_t size, const aclrtPhysicalMemProp* prop, uint64_t flags) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMallocPhysical", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (prop == nullptr || size == 0 || size % vmm_granularity != 0 || flags != 0 || prop->locationType != 1 ||
        prop->allocationType != 0 || prop->handleType != 0) {
        return fail(ACL_ERROR_INVALID_PARAM, "malloc physical: bad size or properties");
    }
    const int device = static_cast<int>(prop->locationId);
    if (device < 0 || device >= device_count) return fail(ACL_ERROR_RT_INVALID_DEVICEID, "bad location id");
    if (size > capacity[device] - used[device]) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "device out of memory");
    used[device] += size;
    void* id = new char;
    physicals[id] = Physical{size, device, nullptr};
    *handle = id;
    return ACL_SUCCESS;
}
aclError aclrtFreePhysical(void* handle) {
    std::lock_guard lock(mutex);
    const auto found = physicals.find(handle);
    if (found == physicals.end() || found->second.mapped_at != nullptr)
        return fail(ACL_ERROR_INVALID_PARAM, "unknown or mapped handle");
    used[found->second.device] -= found->second.bytes;
    physicals.erase(found);
    delete static_cast<char*>(handle);
    return ACL_SUCCESS;
}
aclError aclrtMapMem(void* virtual_pointer, std::size_t size, std::size_t offset, void* handle, uint64_t flags) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMapMem", code)) return code;
    const auto physical = physicals.find(handle);
    if (physical == physicals.end() || physical->second.mapped_at != nullptr || physical->second.bytes != size ||
        offset != 0 || flags != 0) {
        return fail(ACL_ERROR_INVALID_PARAM, "map: unknown or mapped handle, or size differs from the physical size");
    }
    const auto address = reinterpret_cast<std::uintptr_t>(virtual_pointer);
    auto next = reservations.upper_bound(address);
    if (next == reservations.begin()) return fail(ACL_ERROR_INVALID_PARAM, "map: not in a reservation");
    --next;
    Reservation& r = next->second;
    if (address != next->first + r.mapped || r.mapped + size > r.bytes) {
        return fail(ACL_ERROR_INVALID_PARAM, "map: not at the end of the mapped part, or past the reservation");
    }
    if (::mmap(virtual_pointer, size, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
        MAP_FAILED) {
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "map failed");
    }
    r.mapped += size;
    physical->second.mapped_at = virtual_pointer;
    return ACL_SUCCESS;
}
aclError aclrtUnmapMem(void* virtual_pointer) {
    std::lock_guard lock(mutex);
    for (auto& [id, physical] : physicals) {
        if (physical.mapped_at != virtual_pointer) continue;
        const auto address = reinterpret_cast<std::uintptr_t>(virtual_pointer);
        auto next = reservations.upper_bound(address);
        --next;
        if (address + physical.bytes != next->first + next->second.mapped) {
            return fail(ACL_ERROR_INVALID_PARAM, "unmap: not the last mapped chunk");
        }
        ::mmap(virtual_pointer, physical.bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
               0);
        next->second.mapped -= physical.bytes;
        physical.mapped_at = nullptr;
        return ACL_SUCCESS;
    }
    return fail(ACL_ERROR_INVALID_PARAM, "unmap: nothing mapped there");
}
#endif  // DEVSTAGE_SHIM_NO_VMM

const char* aclGetRecentErrMsg() {
    thread_local std::string last;
    last = std::move(recent_error);
    recent_error.clear();
    return last.empty() ? nullptr : last.c_str();
}

}  // extern "C"
