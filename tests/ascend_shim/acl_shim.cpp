// SPDX-License-Identifier: Apache-2.0
// A test stand-in for libascendcl.so: the ACL C ABI subset devstage uses, with the same
// prototypes, enum values and error codes, over host memory. It models per-thread current
// contexts, allocations tagged with their device, per-device capacity, the documented rules
// (size 0 rejected, count > destMax rejected, 64-byte alignment, no context → error) and
// fault injection controlled by the tests through the shim_* functions. A copy with a null
// pointer is refused at the call (ACL_ERROR_INVALID_PARAM), as ACL's parameter checks do.
//
// Streams are asynchronous: each has a worker thread that runs its tasks (copies, event
// records, event waits) in order. An asynchronous copy is validated when it is enqueued and
// again when it runs (its device memory may have been freed in between: the task then fails).
// A failed task makes the stream's later copies no-ops and the events recorded after it
// complete with the error; aclrtSynchronizeStream / aclrtSynchronizeEvent report it. Waiting
// on an event inherits its error. Every piece of shared state is guarded by one mutex, and
// the workers run their tasks holding it, so a free never races a copy.
// aclrtMemcpyBatchAsync enqueues one copy task per copy of the batch; built with
// DEVSTAGE_SHIM_NO_BATCH the library lacks it (built so together with DEVSTAGE_SHIM_NO_VMM).
// aclrtMallocHost memory is a shared mapping (64 bytes past a page, as ACL promises 64), so
// that aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &devPtr) can give a device
// address of its own that is not the host's: a second mapping of the same pages, which the
// device (a test's kernel) reads and writes, and which no copy or memset accepts as device
// memory. ptr must be 4 KiB aligned and lie in aclrtMallocHost memory; aclrtHostUnregister
// undoes it; aclrtFreeHost of registered memory is refused. Built with DEVSTAGE_SHIM_NO_MAP the
// library lacks both calls.
// The last aclrtResetDevice of a device refuses (ACL_ERROR_FAILURE, counted in
// shim_reset_violations) when host memory made in one of its contexts — aclrtMallocHost
// allocations, aclrtHostRegister ranges — is still allocated or registered: such memory must
// go back before the device is reset. The reset is done all the same.
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using aclError = int;
using aclrtContext = void*;
using aclrtStream = void*;
using aclrtEvent = void*;

namespace {
constexpr aclError ACL_SUCCESS = 0;
constexpr aclError ACL_ERROR_INVALID_PARAM = 100000;
constexpr aclError ACL_ERROR_UNINITIALIZE = 100001;
constexpr aclError ACL_ERROR_REPEAT_INITIALIZE = 100002;
constexpr aclError ACL_ERROR_RT_PARAM_INVALID = 107000;
constexpr aclError ACL_ERROR_RT_INVALID_DEVICEID = 107001;
constexpr aclError ACL_ERROR_RT_CONTEXT_NULL = 107002;
constexpr aclError ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;
constexpr aclError ACL_ERROR_FAILURE = 500001;
constexpr int ACL_EVENT_RECORDED_STATUS_NOT_READY = 0;
constexpr int ACL_EVENT_RECORDED_STATUS_COMPLETE = 1;
constexpr int device_count = 4;

struct Context {
    int device;
};
struct Allocation {
    std::size_t bytes;
    int device;      // -1: host (aclrtMallocHost)
    int owner = -1;  // host memory: the device of the context it was made in
};
// The shared mapping an aclrtMallocHost pointer lies in, and a registration's second mapping.
struct HostMapping {
    void* base;
    std::size_t bytes;
    int fd = -1;  // the memory file an aclrtMallocHost allocation lives in
};
struct Registration {
    std::size_t bytes;
    HostMapping alias;
    int owner = -1;  // the device of the context it was made in
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

// An event: `recorded` records were enqueued, the workers reached `completed` of them; the
// last one reached carried `error` (0: none).
struct Event {
    Context* context;
    std::uint64_t recorded = 0;
    std::uint64_t completed = 0;
    aclError error = ACL_SUCCESS;
    std::string message;
};

struct Task {
    enum class Kind { copy, memset, record, wait };
    explicit Task(Kind k) : kind(k) {}
    Kind kind;
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t count = 0;
    bool to_device = false;
    int32_t value = 0;                  // memset
    aclError fails_with = ACL_SUCCESS;  // an injected asynchronous failure
    std::shared_ptr<Event> event;
    std::uint64_t generation = 0;
};

struct Stream {
    Context* context;
    std::deque<Task> tasks;
    bool held = false;
    bool stopping = false;
    aclError error = ACL_SUCCESS;  // the first failed task's code; sticky
    std::string message;
    std::thread worker;
};

std::mutex mutex;
std::condition_variable progress;  // any task ran, any stream changed state
bool initialized = false;
int device_refs[device_count] = {};
std::size_t capacity[device_count] = {std::size_t{1} << 34, std::size_t{1} << 34, std::size_t{1} << 34,
                                      std::size_t{1} << 34};
std::size_t used[device_count] = {};
std::map<std::uintptr_t, Allocation> allocations;
std::map<std::uintptr_t, HostMapping> host_mappings;   // by aclrtMallocHost pointer
std::map<std::uintptr_t, Registration> registrations;  // by registered host pointer
std::map<void*, Stream*> streams;
std::map<void*, std::shared_ptr<Event>> events;
thread_local Context* current = nullptr;
thread_local std::string recent_error;
std::size_t reset_violations = 0;  // resets that found host memory of their device still there
std::string last_violation;
std::string fail_function;
int fail_countdown = 0;
aclError fail_code = 0;
std::string fail_async_function;
int fail_async_countdown = 0;
aclError fail_async_code = 0;
std::size_t fail_batch_at = SIZE_MAX;
aclError fail_batch_code = 0;

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

// The code an enqueued task of `function` fails with when it runs, if an asynchronous failure
// is armed and due.
aclError injected_async(const char* function) {
    if (fail_async_function != function || fail_async_countdown <= 0) return ACL_SUCCESS;
    if (--fail_async_countdown > 0) return ACL_SUCCESS;
    fail_async_function.clear();
    return fail_async_code;
}

std::optional<int> in_mapped_reservation(std::uintptr_t address, std::size_t bytes) {
    auto next = reservations.upper_bound(address);
    if (next == reservations.begin()) return std::nullopt;
    --next;
    const std::uintptr_t offset = address - next->first;
    if (offset > next->second.mapped || bytes > next->second.mapped - offset) return std::nullopt;
    return next->second.device;
}

// The device of the allocation holding [pointer, pointer + bytes) (-1: host memory), if one
// of the wanted kind does.
std::optional<int> find(const void* pointer, std::size_t bytes, bool device) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    if (device) {
        if (auto mapped = in_mapped_reservation(address, bytes)) return mapped;
    }
    auto next = allocations.upper_bound(address);
    if (next == allocations.begin()) return std::nullopt;
    --next;
    const Allocation& a = next->second;
    if ((a.device >= 0) != device) return std::nullopt;
    if (address - next->first > a.bytes || bytes > a.bytes - (address - next->first)) return std::nullopt;
    return a.device;
}

Stream* find_stream(void* handle) {
    const auto found = streams.find(handle);
    return found == streams.end() ? nullptr : found->second;
}

std::shared_ptr<Event> find_event(void* handle) {
    const auto found = events.find(handle);
    return found == events.end() ? nullptr : found->second;
}

// A stream known, and in the current context (a stream belongs to the context it was made in).
aclError check_stream(Stream* stream, const char* function) {
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (stream == nullptr) {
        return fail(ACL_ERROR_RT_PARAM_INVALID,
                    std::string(function) + ": unknown stream (the default stream is not modelled)");
    }
    if (stream->context != current) {
        return fail(ACL_ERROR_RT_PARAM_INVALID, std::string(function) + ": the stream is not in the current context");
    }
    return ACL_SUCCESS;
}

void set_error(Stream& stream, aclError code, std::string message) {
    if (stream.error != ACL_SUCCESS) return;
    stream.error = code;
    stream.message = std::move(message);
}

// Runs `task` of `stream`; the caller holds the mutex.
void run(Stream& stream, Task& task) {
    switch (task.kind) {
        case Task::Kind::copy: {
            if (stream.error != ACL_SUCCESS) return;
            if (task.fails_with != ACL_SUCCESS) {
                set_error(stream, task.fails_with, "injected asynchronous failure of aclrtMemcpyAsync");
                return;
            }
            const void* device = task.to_device ? task.dst : task.src;
            const std::optional<int> where = find(device, task.count, true);
            if (!where || *where != stream.context->device) {
                set_error(stream, ACL_ERROR_FAILURE,
                          "device memory of an aclrtMemcpyAsync was freed before the copy ran");
                return;
            }
            std::memcpy(task.dst, task.src, task.count);
            return;
        }
        case Task::Kind::memset: {
            if (stream.error != ACL_SUCCESS) return;
            if (task.fails_with != ACL_SUCCESS) {
                set_error(stream, task.fails_with, "injected asynchronous failure of aclrtMemsetAsync");
                return;
            }
            const std::optional<int> where = find(task.dst, task.count, true);
            if (!where || *where != stream.context->device) {
                set_error(stream, ACL_ERROR_FAILURE, "device memory of an aclrtMemsetAsync was freed before it ran");
                return;
            }
            std::memset(task.dst, task.value, task.count);
            return;
        }
        case Task::Kind::record:
            if (task.fails_with != ACL_SUCCESS) {
                set_error(stream, task.fails_with, "injected asynchronous failure of aclrtRecordEvent");
            }
            task.event->completed = std::max(task.event->completed, task.generation);
            task.event->error = stream.error;
            task.event->message = stream.message;
            return;
        case Task::Kind::wait:
            if (task.fails_with != ACL_SUCCESS) {
                set_error(stream, task.fails_with, "injected asynchronous failure of aclrtStreamWaitEvent");
            }
            if (task.event->error != ACL_SUCCESS) set_error(stream, task.event->error, task.event->message);
            return;
    }
}

bool runnable(const Stream& stream) {
    if (stream.held || stream.tasks.empty()) return false;
    const Task& next = stream.tasks.front();
    return next.kind != Task::Kind::wait || next.event->completed >= next.generation;
}

void work(Stream* stream) {
    std::unique_lock lock(mutex);
    for (;;) {
        progress.wait(lock, [&] { return stream->stopping || runnable(*stream); });
        if (stream->stopping) return;
        run(*stream, stream->tasks.front());
        stream->tasks.pop_front();
        progress.notify_all();
    }
}

aclError enqueue(Stream& stream, Task task) {
    stream.tasks.push_back(std::move(task));
    progress.notify_all();
    return ACL_SUCCESS;
}

// Stops and joins the workers of `doomed` (removed from `streams` already); their pending tasks
// are dropped. Called without the mutex.
void stop(const std::vector<Stream*>& doomed) {
    {
        std::lock_guard lock(mutex);
        for (Stream* stream : doomed) stream->stopping = true;
        progress.notify_all();
    }
    for (Stream* stream : doomed) {
        stream->worker.join();
        delete stream;
    }
}

// Streams a test never destroyed stop before the shim's state goes away.
struct Reaper {
    Reaper() = default;
    Reaper(const Reaper&) = delete;
    Reaper& operator=(const Reaper&) = delete;
    ~Reaper() {
        std::vector<Stream*> doomed;
        {
            std::lock_guard lock(mutex);
            for (auto& [handle, stream] : streams) doomed.push_back(stream);
            streams.clear();
        }
        stop(doomed);
    }
} reaper;
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
/// The n-th next call of `function` (aclrtMemcpyAsync, aclrtRecordEvent, aclrtStreamWaitEvent)
/// is accepted, and its task fails with `code` when the stream runs it.
void shim_fail_async(const char* function, int n, int code) {
    std::lock_guard lock(mutex);
    fail_async_function = function;
    fail_async_countdown = n;
    fail_async_code = code;
}
/// The next aclrtMemcpyBatchAsync refuses its copy `index` with `code` (setting failIndex): the
/// copies before it stay enqueued.
void shim_fail_batch_at(std::size_t index, int code) {
    std::lock_guard lock(mutex);
    fail_batch_at = index;
    fail_batch_code = code;
}
/// Holds (`hold` != 0) or releases a stream's worker: a held stream runs no further task.
/// Returns -1 for an unknown stream.
int shim_hold_stream(void* stream, int hold) {
    std::lock_guard lock(mutex);
    Stream* found = find_stream(stream);
    if (found == nullptr) return -1;
    found->held = hold != 0;
    progress.notify_all();
    return 0;
}
/// Tasks enqueued on a stream and not yet run; -1 for an unknown stream.
long shim_pending_tasks(void* stream) {
    std::lock_guard lock(mutex);
    Stream* found = find_stream(stream);
    return found == nullptr ? -1 : static_cast<long>(found->tasks.size());
}
/// The device a stream or an event was made on; -2 when unknown.
int shim_stream_device(void* stream) {
    std::lock_guard lock(mutex);
    Stream* found = find_stream(stream);
    return found == nullptr ? -2 : found->context->device;
}
int shim_event_device(void* event) {
    std::lock_guard lock(mutex);
    const std::shared_ptr<Event> found = find_event(event);
    return found == nullptr ? -2 : found->context->device;
}
/// Live streams and events of a device.
std::size_t shim_live_streams(int device) {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    for (const auto& [handle, stream] : streams) n += stream->context->device == device;
    return n;
}
std::size_t shim_live_events(int device) {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    for (const auto& [handle, event] : events) n += event->context->device == device;
    return n;
}
/// The device an allocation was made on; -1 for host memory, -2 when unknown.
int shim_device_of(const void* pointer) {
    std::lock_guard lock(mutex);
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    return found == allocations.end() ? -2 : found->second.device;
}
/// Host ranges registered with aclrtHostRegister and not yet unregistered.
std::size_t shim_live_registrations() {
    std::lock_guard lock(mutex);
    return registrations.size();
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
/// Last resets of a device that found host memory made in its contexts still allocated or
/// registered, and what the last one found.
std::size_t shim_reset_violations() {
    std::lock_guard lock(mutex);
    return reset_violations;
}
const char* shim_last_violation() {
    std::lock_guard lock(mutex);
    return last_violation.c_str();
}
/// aclrtMallocHost allocations made in a context of `device` and still live.
std::size_t shim_live_host_allocations(int device) {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    for (const auto& [address, a] : allocations) n += a.device < 0 && a.owner == device;
    return n;
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
        std::size_t host = 0, ranges = 0;
        for (const auto& [address, a] : allocations) host += a.device < 0 && a.owner == device;
        for (const auto& [address, r] : registrations) ranges += r.owner == device;
        if (host + ranges > 0) {
            ++reset_violations;
            last_violation = "aclrtResetDevice of device " + std::to_string(device) + ": " + std::to_string(host) +
                             " aclrtMallocHost allocation(s) and " + std::to_string(ranges) +
                             " aclrtHostRegister range(s) made on it are still there";
            recent_error = last_violation;
        }
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
        if (host + ranges > 0) return ACL_ERROR_FAILURE;
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
// Destroying a context destroys its streams (pending tasks dropped) and events.
aclError aclrtDestroyContext(aclrtContext context) {
    if (context == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "null context");
    std::vector<Stream*> doomed;
    {
        std::lock_guard lock(mutex);
        for (auto it = streams.begin(); it != streams.end();) {
            if (it->second->context == context) {
                doomed.push_back(it->second);
                it = streams.erase(it);
            } else {
                ++it;
            }
        }
        std::erase_if(events, [&](const auto& entry) { return entry.second->context == context; });
    }
    stop(doomed);
    std::lock_guard lock(mutex);
    if (current == context) current = nullptr;
    delete static_cast<Context*>(context);
    return ACL_SUCCESS;
}
aclError aclrtSetCurrentContext(aclrtContext context) {
    {
        std::lock_guard lock(mutex);
        aclError code;
        if (injected("aclrtSetCurrentContext", code)) return code;
    }
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
    const std::size_t span = (size + 64 + 4095) / 4096 * 4096;
    // A memory file, so that aclrtHostRegister can map the same pages a second time.
    const int fd = ::memfd_create("acl_shim_host", MFD_CLOEXEC);
    if (fd < 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "host out of memory");
    if (::ftruncate(fd, static_cast<off_t>(span)) != 0) {
        ::close(fd);
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "host out of memory");
    }
    void* base = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        ::close(fd);
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "host out of memory");
    }
    void* memory = static_cast<std::byte*>(base) + 64;
    allocations[reinterpret_cast<std::uintptr_t>(memory)] = Allocation{size, -1, current->device};
    host_mappings[reinterpret_cast<std::uintptr_t>(memory)] = HostMapping{base, span, fd};
    *pointer = memory;
    return ACL_SUCCESS;
}
aclError aclrtFreeHost(void* pointer) {
    std::lock_guard lock(mutex);
    const auto found = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == allocations.end() || found->second.device >= 0)
        return fail(ACL_ERROR_INVALID_PARAM, "not a host allocation");
    const auto at = reinterpret_cast<std::uintptr_t>(pointer);
    for (const auto& [host, registration] : registrations) {
        if (host < at + found->second.bytes && at < host + registration.bytes) {
            return fail(ACL_ERROR_INVALID_PARAM, "the host memory is still registered: aclrtHostUnregister it first");
        }
    }
    allocations.erase(found);
    const auto mapping = host_mappings.find(at);
    ::munmap(mapping->second.base, mapping->second.bytes);
    ::close(mapping->second.fd);
    host_mappings.erase(mapping);
    return ACL_SUCCESS;
}
#ifndef DEVSTAGE_SHIM_NO_MAP
aclError aclrtHostRegister(void* ptr, uint64_t size, int type, void** dev_ptr) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtHostRegister", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (dev_ptr == nullptr || size == 0 || type != 0) return fail(ACL_ERROR_INVALID_PARAM, "bad arguments");
    const auto at = reinterpret_cast<std::uintptr_t>(ptr);
    if (at % 4096 != 0) return fail(ACL_ERROR_INVALID_PARAM, "the host pointer is not 4K aligned");
    if (!find(ptr, size, false)) return fail(ACL_ERROR_INVALID_PARAM, "not inside one aclrtMallocHost allocation");
    for (const auto& [host, registration] : registrations) {
        if (host < at + size && at < host + registration.bytes) return fail(ACL_ERROR_INVALID_PARAM, "registered");
    }
    const std::size_t pages = (size + 4095) / 4096 * 4096;
    // The same pages at a second address: the allocation's memory file, mapped again.
    auto owner = host_mappings.upper_bound(at);
    if (owner == host_mappings.begin())
        return fail(ACL_ERROR_INVALID_PARAM, "not inside one aclrtMallocHost allocation");
    --owner;
    const auto base = reinterpret_cast<std::uintptr_t>(owner->second.base);
    void* alias =
        ::mmap(nullptr, pages, PROT_READ | PROT_WRITE, MAP_SHARED, owner->second.fd, static_cast<off_t>(at - base));
    if (alias == MAP_FAILED) return fail(ACL_ERROR_FAILURE, "could not map the host memory for the device");
    registrations[at] = Registration{size, HostMapping{alias, pages}, current->device};
    *dev_ptr = alias;
    return ACL_SUCCESS;
}
aclError aclrtHostUnregister(void* ptr) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtHostUnregister", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    const auto found = registrations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (found == registrations.end()) return fail(ACL_ERROR_INVALID_PARAM, "not registered");
    ::munmap(found->second.alias.base, found->second.alias.bytes);
    registrations.erase(found);
    return ACL_SUCCESS;
}
#endif
aclError aclrtMemcpy(void* dst, std::size_t dest_max, const void* src, std::size_t count, int kind) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMemcpy", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (dst == nullptr || src == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "null pointer");
    if (dest_max == 0 || count > dest_max) return fail(ACL_ERROR_RT_PARAM_INVALID, "count exceeds destMax");
    const bool to_device = kind == 1;
    if (kind != 1 && kind != 2) return fail(ACL_ERROR_INVALID_PARAM, "unsupported memcpy kind");
    if (!find(to_device ? dst : src, count, true)) {
        return fail(ACL_ERROR_INVALID_PARAM, "device range is not inside one allocation");
    }
    std::memcpy(dst, src, count);
    return ACL_SUCCESS;
}
aclError aclrtMemset(void* pointer, std::size_t max_count, int32_t value, std::size_t count) {
    std::lock_guard lock(mutex);
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (count > max_count) return fail(ACL_ERROR_RT_PARAM_INVALID, "count exceeds maxCount");
    if (!find(pointer, count, true)) return fail(ACL_ERROR_INVALID_PARAM, "range is not inside one allocation");
    std::memset(pointer, value, count);
    return ACL_SUCCESS;
}
// Waits until every stream of the current context's device drained; reports the first error
// one of them holds.
aclError aclrtSynchronizeDevice() {
    std::unique_lock lock(mutex);
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    const int device = current->device;
    progress.wait(lock, [&] {
        return std::all_of(streams.begin(), streams.end(), [&](const auto& entry) {
            return entry.second->context->device != device || entry.second->tasks.empty();
        });
    });
    for (const auto& [handle, stream] : streams) {
        if (stream->context->device == device && stream->error != ACL_SUCCESS) {
            return fail(stream->error, stream->message);
        }
    }
    return ACL_SUCCESS;
}

// ---- streams and events ---------------------------------------------------------------------
aclError aclrtCreateStream(aclrtStream* stream) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtCreateStream", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (stream == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "null stream pointer");
    auto* created = new Stream{current, {}, false, false, ACL_SUCCESS, {}, {}};
    created->worker = std::thread(work, created);
    streams[created] = created;
    *stream = created;
    return ACL_SUCCESS;
}
// ACL requires the stream's tasks to be complete (aclrtSynchronizeStream) and the stream to be
// in the current context; the shim refuses otherwise.
aclError aclrtDestroyStream(aclrtStream handle) {
    Stream* stream = nullptr;
    {
        std::lock_guard lock(mutex);
        aclError code;
        if (injected("aclrtDestroyStream", code)) return code;
        stream = find_stream(handle);
        if (aclError e = check_stream(stream, "aclrtDestroyStream"); e != ACL_SUCCESS) return e;
        if (!stream->tasks.empty()) {
            return fail(ACL_ERROR_RT_PARAM_INVALID,
                        "aclrtDestroyStream: the stream has unfinished tasks (call aclrtSynchronizeStream first)");
        }
        streams.erase(handle);
    }
    stop({stream});
    return ACL_SUCCESS;
}
aclError aclrtSynchronizeStream(aclrtStream handle) {
    std::unique_lock lock(mutex);
    aclError code;
    if (injected("aclrtSynchronizeStream", code)) return code;
    Stream* stream = find_stream(handle);
    if (aclError e = check_stream(stream, "aclrtSynchronizeStream"); e != ACL_SUCCESS) return e;
    progress.wait(lock, [&] { return stream->tasks.empty() || stream->stopping; });
    if (stream->error != ACL_SUCCESS) return fail(stream->error, stream->message);
    return ACL_SUCCESS;
}
aclError aclrtMemcpyAsync(void* dst, std::size_t dest_max, const void* src, std::size_t count, int kind,
                          aclrtStream handle) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMemcpyAsync", code)) return code;
    Stream* stream = find_stream(handle);
    if (aclError e = check_stream(stream, "aclrtMemcpyAsync"); e != ACL_SUCCESS) return e;
    if (dst == nullptr || src == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "null pointer");
    if (dest_max == 0 || count > dest_max) return fail(ACL_ERROR_RT_PARAM_INVALID, "count exceeds destMax");
    if (kind != 1 && kind != 2) return fail(ACL_ERROR_INVALID_PARAM, "unsupported memcpy kind");
    const bool to_device = kind == 1;
    const std::optional<int> where = find(to_device ? dst : src, count, true);
    if (!where) return fail(ACL_ERROR_INVALID_PARAM, "device range is not inside one allocation");
    if (*where != current->device) {
        return fail(ACL_ERROR_INVALID_PARAM, "device memory of device " + std::to_string(*where) +
                                                 " copied on a stream of device " + std::to_string(current->device));
    }
    Task task(Task::Kind::copy);
    task.dst = dst;
    task.src = src;
    task.count = count;
    task.to_device = to_device;
    task.fails_with = injected_async("aclrtMemcpyAsync");
    return enqueue(*stream, std::move(task));
}
#ifndef DEVSTAGE_SHIM_NO_BATCH
// aclrtMemLocation and aclrtMemcpyBatchAttr, as the CANN reference declares them.
struct ShimMemLocation {
    uint32_t id;
    int type;  // ACL_MEM_LOCATION_TYPE_HOST 0, _DEVICE 1
};
struct ShimMemcpyBatchAttr {
    ShimMemLocation dstLoc;
    ShimMemLocation srcLoc;
    uint8_t rsv[16];
};
static_assert(sizeof(ShimMemcpyBatchAttr) == 32);

// Checks the attributes, then each copy in order as aclrtMemcpyAsync does; the first copy
// refused stops the batch with its index in *failIndex (the copies before it stay enqueued).
aclError aclrtMemcpyBatchAsync(void** dsts, std::size_t* destMaxs, void** srcs, std::size_t* sizes,
                               std::size_t numBatches, ShimMemcpyBatchAttr* attrs, std::size_t* attrsIndexes,
                               std::size_t numAttrs, std::size_t* failIndex, aclrtStream handle) {
    std::lock_guard lock(mutex);
    if (failIndex != nullptr) *failIndex = SIZE_MAX;
    aclError code;
    if (injected("aclrtMemcpyBatchAsync", code)) return code;
    Stream* stream = find_stream(handle);
    if (aclError e = check_stream(stream, "aclrtMemcpyBatchAsync"); e != ACL_SUCCESS) return e;
    if (dsts == nullptr || destMaxs == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
        attrsIndexes == nullptr || failIndex == nullptr || numBatches == 0 || numAttrs == 0 || numAttrs > numBatches ||
        attrsIndexes[0] != 0) {
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyBatchAsync: bad arrays or counts");
    }
    for (std::size_t k = 0; k < numAttrs; ++k) {
        const ShimMemcpyBatchAttr& a = attrs[k];
        if ((k > 0 && attrsIndexes[k] <= attrsIndexes[k - 1]) || attrsIndexes[k] >= numBatches) {
            return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyBatchAsync: attrsIndexes out of order");
        }
        for (uint8_t r : a.rsv) {
            if (r != 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyBatchAsync: rsv not zero");
        }
        if ((a.dstLoc.type == 1) == (a.srcLoc.type == 1) || a.dstLoc.type > 1 || a.srcLoc.type > 1) {
            return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyBatchAsync: only host to device or device to host");
        }
    }
    const aclError when_run = injected_async("aclrtMemcpyBatchAsync");
    std::size_t k = 0;
    for (std::size_t i = 0; i < numBatches; ++i) {
        while (k + 1 < numAttrs && attrsIndexes[k + 1] <= i) ++k;
        const bool to_device = attrs[k].dstLoc.type == 1;
        const ShimMemLocation& device_loc = to_device ? attrs[k].dstLoc : attrs[k].srcLoc;
        const auto refuse = [&](aclError e, const std::string& why) {
            *failIndex = i;
            return fail(e, "aclrtMemcpyBatchAsync: copy " + std::to_string(i) + ": " + why);
        };
        if (i == fail_batch_at) {
            fail_batch_at = SIZE_MAX;
            return refuse(fail_batch_code, "injected failure");
        }
        if (dsts[i] == nullptr || srcs[i] == nullptr) return refuse(ACL_ERROR_INVALID_PARAM, "null pointer");
        if (sizes[i] == 0 || sizes[i] > destMaxs[i]) return refuse(ACL_ERROR_RT_PARAM_INVALID, "count exceeds destMax");
        const std::optional<int> where = find(to_device ? dsts[i] : srcs[i], sizes[i], true);
        if (!where) return refuse(ACL_ERROR_INVALID_PARAM, "device range is not inside one allocation");
        if (*where != current->device || device_loc.id != static_cast<uint32_t>(*where)) {
            return refuse(ACL_ERROR_INVALID_PARAM, "device memory of another device than the stream's or the attr's");
        }
        Task task(Task::Kind::copy);
        task.dst = dsts[i];
        task.src = srcs[i];
        task.count = sizes[i];
        task.to_device = to_device;
        task.fails_with = when_run;
        (void)enqueue(*stream, std::move(task));
    }
    return ACL_SUCCESS;
}
#endif  // DEVSTAGE_SHIM_NO_BATCH
aclError aclrtMemsetAsync(void* pointer, std::size_t max_count, int32_t value, std::size_t count, aclrtStream handle) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtMemsetAsync", code)) return code;
    Stream* stream = find_stream(handle);
    if (aclError e = check_stream(stream, "aclrtMemsetAsync"); e != ACL_SUCCESS) return e;
    if (pointer == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "null pointer");
    if (count > max_count) return fail(ACL_ERROR_RT_PARAM_INVALID, "count exceeds maxCount");
    const std::optional<int> where = find(pointer, count, true);
    if (!where) return fail(ACL_ERROR_INVALID_PARAM, "device range is not inside one allocation");
    if (*where != current->device) {
        return fail(ACL_ERROR_INVALID_PARAM, "device memory of device " + std::to_string(*where) +
                                                 " set on a stream of device " + std::to_string(current->device));
    }
    Task task(Task::Kind::memset);
    task.dst = pointer;
    task.count = count;
    task.value = value;
    task.fails_with = injected_async("aclrtMemsetAsync");
    return enqueue(*stream, std::move(task));
}
aclError aclrtCreateEvent(aclrtEvent* event) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtCreateEvent", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    if (event == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "null event pointer");
    auto created = std::make_shared<Event>();
    created->context = current;
    *event = created.get();
    events[created.get()] = std::move(created);
    return ACL_SUCCESS;
}
// Allowed while a record is pending: the task keeps the event alive.
aclError aclrtDestroyEvent(aclrtEvent handle) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtDestroyEvent", code)) return code;
    if (events.erase(handle) == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent: unknown event");
    return ACL_SUCCESS;
}
aclError aclrtRecordEvent(aclrtEvent handle, aclrtStream stream_handle) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtRecordEvent", code)) return code;
    Stream* stream = find_stream(stream_handle);
    if (aclError e = check_stream(stream, "aclrtRecordEvent"); e != ACL_SUCCESS) return e;
    std::shared_ptr<Event> event = find_event(handle);
    if (event == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtRecordEvent: unknown event");
    Task task(Task::Kind::record);
    task.generation = ++event->recorded;
    task.event = std::move(event);
    task.fails_with = injected_async("aclrtRecordEvent");
    return enqueue(*stream, std::move(task));
}
// As documented: NOT_READY for an event never recorded, one not reached yet, or one whose
// stream failed before it.
aclError aclrtQueryEventStatus(aclrtEvent handle, int* status) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtQueryEventStatus", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    const std::shared_ptr<Event> event = find_event(handle);
    if (event == nullptr || status == nullptr)
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: unknown event");
    const bool complete = event->recorded > 0 && event->completed >= event->recorded && event->error == ACL_SUCCESS;
    *status = complete ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return ACL_SUCCESS;
}
// An event never recorded is refused rather than waited on forever.
aclError aclrtSynchronizeEvent(aclrtEvent handle) {
    std::unique_lock lock(mutex);
    aclError code;
    if (injected("aclrtSynchronizeEvent", code)) return code;
    if (current == nullptr) return fail(ACL_ERROR_RT_CONTEXT_NULL, "no current context");
    const std::shared_ptr<Event> event = find_event(handle);
    if (event == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeEvent: unknown event");
    if (event->recorded == 0)
        return fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtSynchronizeEvent: the event was never recorded");
    const std::uint64_t target = event->recorded;
    progress.wait(lock, [&] { return event->completed >= target; });
    if (event->error != ACL_SUCCESS) return fail(event->error, event->message);
    return ACL_SUCCESS;
}
// Waits for the event's last record at the time of the call; an event never recorded is refused.
aclError aclrtStreamWaitEvent(aclrtStream stream_handle, aclrtEvent handle) {
    std::lock_guard lock(mutex);
    aclError code;
    if (injected("aclrtStreamWaitEvent", code)) return code;
    Stream* stream = find_stream(stream_handle);
    if (aclError e = check_stream(stream, "aclrtStreamWaitEvent"); e != ACL_SUCCESS) return e;
    std::shared_ptr<Event> event = find_event(handle);
    if (event == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamWaitEvent: unknown event");
    if (event->recorded == 0)
        return fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtStreamWaitEvent: the event was never recorded");
    Task task(Task::Kind::wait);
    task.generation = event->recorded;
    task.event = std::move(event);
    task.fails_with = injected_async("aclrtStreamWaitEvent");
    return enqueue(*stream, std::move(task));
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
