// SPDX-License-Identifier: Apache-2.0
// A test stand-in for libascendcl.so: the ACL C ABI subset devstage uses, with the same
// prototypes, enum values and error codes, over host memory. It models per-thread current
// contexts, allocations tagged with their device, per-device capacity, the documented rules
// (size 0 rejected, count > destMax rejected, 64-byte alignment, no context → error) and
// fault injection controlled by the tests through the shim_* functions.
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

std::mutex mutex;
bool initialized = false;
int device_refs[device_count] = {};
std::size_t capacity[device_count] = {std::size_t{1} << 34, std::size_t{1} << 34, std::size_t{1} << 34, std::size_t{1} << 34};
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

const Allocation* find(const void* pointer, std::size_t bytes, bool device) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
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
    --device_refs[device];
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
    if (found == allocations.end() || found->second.device < 0) return fail(ACL_ERROR_INVALID_PARAM, "not a device allocation");
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
    if (found == allocations.end() || found->second.device >= 0) return fail(ACL_ERROR_INVALID_PARAM, "not a host allocation");
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
    if (find(pointer, count, true) == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "range is not inside one allocation");
    std::memset(pointer, value, count);
    return ACL_SUCCESS;
}
aclError aclrtSynchronizeDevice() {
    return current != nullptr ? ACL_SUCCESS : fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
}
const char* aclGetRecentErrMsg() {
    thread_local std::string last;
    last = std::move(recent_error);
    recent_error.clear();
    return last.empty() ? nullptr : last.c_str();
}

}  // extern "C"
