// SPDX-License-Identifier: Apache-2.0
// A runtime's platform callbacks (devstage_callbacks) as a backend. devstage keeps the live
// allocations itself, so a free of a pointer the runtime never handed out is refused here and
// never reaches the runtime; without stream callbacks, streams are immediate.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "any_backend.hpp"
#include "devstage/detail/transfer/zero_block.hpp"
#include "devstage/detail/util/message.hpp"

namespace devstage::capi {
namespace {

// The allocations of one kind (device or pinned) that the runtime handed out and devstage has
// not freed yet, with their sizes.
class Allocations {
public:
    /// False when no host memory is left to remember it.
    bool add(void* pointer, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        try {
            live_.emplace(pointer, bytes);
            return true;
        } catch (...) {
            return false;
        }
    }
    /// True when `pointer` was live (it is forgotten now).
    bool remove(void* pointer) noexcept {
        std::lock_guard lock(mutex_);
        return live_.erase(pointer) > 0;
    }
    std::unordered_map<void*, std::size_t> take() noexcept {
        std::lock_guard lock(mutex_);
        return std::exchange(live_, {});
    }

private:
    std::mutex mutex_;
    std::unordered_map<void*, std::size_t> live_;
};

// Stream and event handles devstage made itself (a backend without stream callbacks): live
// ones are known, so a destroyed or made-up handle is refused.
class ImmediateHandles {
public:
    Result<void*> make() noexcept {
        std::lock_guard lock(mutex_);
        void* handle = reinterpret_cast<void*>(++last_);  // NOLINT(performance-no-int-to-ptr): a handle only
        try {
            live_.insert(handle);
        } catch (...) {
            return Status(Errc::out_of_memory, "host memory exhausted recording a stream or event handle");
        }
        return handle;
    }
    bool live(void* handle) const noexcept {
        std::lock_guard lock(mutex_);
        return live_.count(handle) > 0;
    }
    bool remove(void* handle) noexcept {
        std::lock_guard lock(mutex_);
        return live_.erase(handle) > 0;
    }

private:
    mutable std::mutex mutex_;
    std::uintptr_t last_ = 0;
    std::unordered_set<void*> live_;
};

class CallbackBackend final : public AnyBackend {
public:
    CallbackBackend(const devstage_callbacks& callbacks, std::string name)
        : c_(callbacks), name_(std::move(name)), streams_(callbacks.create_stream != nullptr) {}

    std::string_view name() const noexcept override { return name_; }
    bool has_pinned() const noexcept override { return c_.pinned_malloc != nullptr; }
    bool has_streams() const noexcept override { return streams_; }
    int kind() const noexcept override { return DEVSTAGE_BACKEND_CALLBACKS; }

    Result<void*> device_malloc(std::size_t bytes) noexcept override {
        return allocate(c_.device_malloc, c_.device_free, device_, bytes, "device_malloc");
    }
    Status device_free(void* pointer) noexcept override {
        return release(c_.device_free, device_, pointer, "device_free", "device_malloc");
    }
    Status copy_to_device(void* dst, const void* src, std::size_t bytes) noexcept override {
        return copy("copy_to_device", dst, src, bytes, [&] { return c_.copy_to_device(c_.context, dst, src, bytes); });
    }
    Status copy_from_device(void* dst, const void* src, std::size_t bytes) noexcept override {
        return copy("copy_from_device", dst, src, bytes,
                    [&] { return c_.copy_from_device(c_.context, dst, src, bytes); });
    }
    Result<void*> pinned_malloc(std::size_t bytes) noexcept override {
        if (!has_pinned()) return no_pinned("pinned_malloc");
        return allocate(c_.pinned_malloc, c_.pinned_free, pinned_, bytes, "pinned_malloc");
    }
    Status pinned_free(void* pointer) noexcept override {
        if (!has_pinned()) return no_pinned("pinned_free");
        return release(c_.pinned_free, pinned_, pointer, "pinned_free", "pinned_malloc");
    }

    Result<Stream> create_stream() noexcept override {
        Result<void*> handle =
            made("create_stream", c_.create_stream, c_.destroy_stream, immediate_streams_, runtime_streams_);
        if (!handle) return handle.status();
        return Stream{*handle};
    }
    Status destroy_stream(Stream stream) noexcept override {
        return destroyed("destroy_stream", "stream", c_.destroy_stream, immediate_streams_, runtime_streams_,
                         stream.handle);
    }
    Status copy_to_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept override {
        if (!streams_) {
            return immediate_copy("copy_to_device_async", stream, [&] { return copy_to_device(dst, src, bytes); });
        }
        return copy("copy_to_device_async", dst, src, bytes,
                    [&] { return c_.copy_to_device_async(c_.context, dst, src, bytes, stream.handle); });
    }
    Status copy_from_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept override {
        if (!streams_) {
            return immediate_copy("copy_from_device_async", stream, [&] { return copy_from_device(dst, src, bytes); });
        }
        return copy("copy_from_device_async", dst, src, bytes,
                    [&] { return c_.copy_from_device_async(c_.context, dst, src, bytes, stream.handle); });
    }
    Result<Event> create_event() noexcept override {
        Result<void*> handle =
            made("create_event", c_.create_event, c_.destroy_event, immediate_events_, runtime_events_);
        if (!handle) return handle.status();
        return Event{*handle};
    }
    Status destroy_event(Event event) noexcept override {
        return destroyed("destroy_event", "event", c_.destroy_event, immediate_events_, runtime_events_, event.handle);
    }
    Status record_event(Event event, Stream stream) noexcept override {
        if (streams_) return called(c_.record_event(c_.context, event.handle, stream.handle), "record_event");
        if (Status s = known_event("record_event", event); !s) return s;
        return known_stream("record_event", stream);
    }
    Result<bool> event_ready(Event event) noexcept override {
        if (!streams_) {
            if (Status s = known_event("event_ready", event); !s) return s;
            return true;
        }
        int ready = 0;
        if (Status s = called(c_.event_ready(c_.context, event.handle, &ready), "event_ready"); !s) return s;
        return ready != 0;
    }
    Status synchronize_event(Event event) noexcept override {
        if (streams_) return called(c_.synchronize_event(c_.context, event.handle), "synchronize_event");
        return known_event("synchronize_event", event);
    }
    Status stream_wait_event(Stream stream, Event event) noexcept override {
        if (streams_) return called(c_.stream_wait_event(c_.context, stream.handle, event.handle), "stream_wait_event");
        if (Status s = known_stream("stream_wait_event", stream); !s) return s;
        return known_event("stream_wait_event", event);
    }
    // The runtime's memset where it is ordered with the stream (an async one, or a synchronous
    // one on immediate streams); else zeros uploaded on the stream, which only zeroes.
    Status device_memset_async(void* dst, int value, std::size_t bytes, Stream stream) noexcept override {
        if (streams_ && c_.device_memset_async != nullptr) {
            if (bytes == 0) return {};
            return called(c_.device_memset_async(c_.context, dst, value, bytes, stream.handle), "device_memset_async",
                          dst, nullptr, bytes);
        }
        if (!streams_ && c_.device_memset != nullptr) {
            if (Status s = known_stream("device_memset_async", stream); !s || bytes == 0) return s;
            return called(c_.device_memset(c_.context, dst, value, bytes), "device_memset", dst, nullptr, bytes);
        }
        if (value != 0) {
            return Status(Errc::not_supported,
                          detail::message("backend '", name_, "': device_memset_async of ", bytes, " bytes to ", value,
                                          ": no memset callback, and only zeros can be uploaded instead"));
        }
        std::uint64_t uploads = 0;
        return detail::upload_zeros(*this, dst, bytes, stream, uploads);
    }

    // No batch callbacks: the stagers copy one by one.
    std::size_t batch_copy_limit(Stream /*stream*/) const noexcept override { return 0; }
    Status copy_to_device_batch(void* const* /*dsts*/, const void* const* /*srcs*/, const std::size_t* /*sizes*/,
                                std::size_t count, Stream /*stream*/) noexcept override {
        return no_batches(count);
    }
    Status copy_from_device_batch(void* const* /*dsts*/, const void* const* /*srcs*/, const std::size_t* /*sizes*/,
                                  std::size_t count, Stream /*stream*/) noexcept override {
        return no_batches(count);
    }

    // The runtime's streams are taken as they are (devstage cannot tell them); devstage's own
    // immediate ones must be live. Neither has a default stream devstage knows of.
    Result<Stream> adopt_stream(void* native) noexcept override {
        if (native == nullptr) {
            return Status(Errc::not_supported,
                          detail::message("backend '", name_, "' #", number(),
                                          ": no default stream to adopt (devstage cannot know the runtime's)"));
        }
        if (!streams_) {
            if (Status s = known_stream("adopt_stream", Stream{native}); !s) return s;
        }
        return Stream{native};
    }
    Status launch_host_function(Stream stream, HostFunction function, void* user) noexcept override {
        if (function == nullptr) {
            return Status(Errc::invalid_argument, detail::message("backend '", name_, "': a null host function"));
        }
        if (!streams_) {
            if (Status s = known_stream("launch_host_function", stream); !s) return s;
            function(user);  // an immediate stream: its earlier work is done
            return {};
        }
        if (c_.launch_host_function == nullptr) {
            return Status(Errc::not_supported,
                          detail::message("backend '", name_, "': no launch_host_function callback"));
        }
        return called(c_.launch_host_function(c_.context, stream.handle, function, user), "launch_host_function");
    }
    Status host_register(void* host, std::size_t bytes) noexcept override {
        if (c_.host_register == nullptr) return no_register("host_register");
        if (host == nullptr || bytes == 0) {
            return Status(Errc::invalid_argument,
                          detail::message("backend '", name_, "': host_register of ", bytes, " bytes at ",
                                          static_cast<const void*>(host), ": nothing to pin"));
        }
        return called(c_.host_register(c_.context, host, bytes), "host_register", host, nullptr, bytes);
    }
    Status host_unregister(void* host) noexcept override {
        if (c_.host_unregister == nullptr) return no_register("host_unregister");
        const int result = c_.host_unregister(c_.context, host);
        if (result == 0) return {};
        return Status(Errc::backend_failure,
                      detail::message("backend '", name_, "': host_unregister of ", static_cast<const void*>(host),
                                      " failed: the callback returned ", result));
    }
    // Without streams nothing runs asynchronously: there is nothing to wait for.
    Status synchronize() noexcept override {
        if (!streams_) return {};
        if (c_.synchronize == nullptr) {
            return Status(Errc::not_supported, detail::message("backend '", name_, "': no synchronize callback"));
        }
        return called(c_.synchronize(c_.context), "synchronize");
    }

    // Frees what was never freed through the callbacks (events and streams first: their work
    // may use the memory), and says so.
    Status close() noexcept override {
        std::size_t device_count = 0, device_bytes = 0, pinned_count = 0, pinned_bytes = 0;
        std::size_t event_count = 0, stream_count = 0;
        for (const auto& [event, unused] : runtime_events_.take()) {
            (void)c_.destroy_event(c_.context, event);
            ++event_count;
        }
        for (const auto& [stream, unused] : runtime_streams_.take()) {
            (void)c_.destroy_stream(c_.context, stream);
            ++stream_count;
        }
        for (const auto& [pointer, bytes] : device_.take()) {
            c_.device_free(c_.context, pointer);
            ++device_count;
            device_bytes += bytes;
        }
        for (const auto& [pointer, bytes] : pinned_.take()) {
            c_.pinned_free(c_.context, pointer);
            ++pinned_count;
            pinned_bytes += bytes;
        }
        if (device_count + pinned_count + event_count + stream_count == 0) return {};
        const std::string handles = event_count + stream_count == 0
                                        ? std::string()
                                        : detail::message(", and ", stream_count, " stream(s) and ", event_count,
                                                          " event(s) never destroyed (devstage destroyed them now)");
        return Status(Errc::leaked,
                      detail::message("backend '", name_, "' destroyed with ", device_count, " device allocation(s) (",
                                      device_bytes, " bytes) and ", pinned_count, " pinned allocation(s) (",
                                      pinned_bytes, " bytes) never freed; devstage freed them now", handles));
    }

private:
    using Malloc = void* (*)(void*, std::size_t);
    using Free = void (*)(void*, void*);

    Result<void*> allocate(Malloc malloc, Free free, Allocations& live, std::size_t bytes, const char* what) noexcept {
        void* pointer = malloc(c_.context, bytes);
        if (pointer == nullptr) {
            return Status(Errc::out_of_memory, detail::message("backend '", name_, "': ", what, " of ", bytes,
                                                               " bytes returned NULL (out of memory)"));
        }
        if (!live.add(pointer, bytes)) {
            free(c_.context, pointer);
            return Status(Errc::out_of_memory,
                          detail::message("backend '", name_, "': ", what, ": host memory exhausted recording ", bytes,
                                          " bytes at ", static_cast<const void*>(pointer)));
        }
        return pointer;
    }
    Status release(Free free, Allocations& live, void* pointer, const char* what, const char* source) noexcept {
        if (!live.remove(pointer)) {
            return Status(Errc::unknown_pointer,
                          detail::message("backend '", name_, "': ", what, " of ", static_cast<const void*>(pointer),
                                          ", which ", source,
                                          " did not return or which was freed already (double free); the "
                                          "runtime's free was not called"));
        }
        free(c_.context, pointer);
        return {};
    }

    // A copy through `callback()`: nothing for zero bytes, refused with a null pointer.
    template <class Callback>
    Status copy(const char* what, const void* dst, const void* src, std::size_t bytes,
                Callback&& callback) const noexcept {
        if (bytes == 0) return {};
        if (dst == nullptr || src == nullptr) {
            return Status(Errc::invalid_argument,
                          detail::message("backend '", name_, "': ", what, " of ", bytes, " bytes with a null ",
                                          dst == nullptr ? "destination" : "source"));
        }
        return called(callback(), what, dst, src, bytes);
    }
    Status called(int result, const char* what) const noexcept {
        if (result == 0) return {};
        return Status(Errc::backend_failure,
                      detail::message("backend '", name_, "': ", what, " failed: the callback returned ", result));
    }
    Status called(int result, const char* what, const void* dst, const void* src, std::size_t bytes) const noexcept {
        if (result == 0) return {};
        return Status(Errc::backend_failure,
                      detail::message("backend '", name_, "': ", what, " of ", bytes, " bytes to ", dst, " from ", src,
                                      " failed: the callback returned ", result));
    }
    // A new stream or event: the runtime's, or an immediate one of devstage's.
    // The runtime's are kept until destroyed, for close().
    Result<void*> made(const char* what, int (*create)(void*, void**), int (*destroy)(void*, void*),
                       ImmediateHandles& immediate, Allocations& runtime) noexcept {
        if (!streams_) return immediate.make();
        void* handle = nullptr;
        if (Status s = called(create(c_.context, &handle), what); !s) return s;
        if (!runtime.add(handle, 0)) {
            (void)destroy(c_.context, handle);
            return Status(Errc::out_of_memory,
                          detail::message("backend '", name_, "': ", what, ": host memory exhausted recording it"));
        }
        return handle;
    }
    Status destroyed(const char* what, const char* kind, int (*destroy)(void*, void*), ImmediateHandles& immediate,
                     Allocations& runtime, void* handle) noexcept {
        if (!streams_) return immediate.remove(handle) ? Status() : unknown(what, kind, handle);
        (void)runtime.remove(handle);
        return called(destroy(c_.context, handle), what);
    }
    template <class Copy>
    Status immediate_copy(const char* what, Stream stream, Copy&& copy) noexcept {
        if (Status s = known_stream(what, stream); !s) return s;
        return copy();
    }
    Status known_stream(const char* what, Stream stream) const noexcept {
        return immediate_streams_.live(stream.handle) ? Status() : unknown(what, "stream", stream.handle);
    }
    Status known_event(const char* what, Event event) const noexcept {
        return immediate_events_.live(event.handle) ? Status() : unknown(what, "event", event.handle);
    }
    Status unknown(const char* what, const char* kind, const void* handle) const noexcept {
        return Status(Errc::invalid_argument, detail::message("backend '", name_, "': ", what, ": ", kind, " ", handle,
                                                              " is not live (never created, or destroyed)"));
    }
    Status no_batches(std::size_t count) const noexcept {
        return Status(Errc::not_supported,
                      detail::message("backend '", name_, "': a batch of ", count, " copies: no batch callbacks"));
    }
    Status no_register(const char* what) const noexcept {
        return Status(Errc::not_supported, detail::message("backend '", name_, "': ", what,
                                                           ": no host_register and host_unregister callbacks"));
    }
    Status no_pinned(const char* what) const noexcept {
        return Status(Errc::not_supported, detail::message("backend '", name_, "': ", what,
                                                           ": no pinned host memory (the callbacks have no "
                                                           "pinned_malloc and pinned_free)"));
    }

    devstage_callbacks c_;
    std::string name_;
    bool streams_;
    Allocations device_, pinned_;
    ImmediateHandles immediate_streams_, immediate_events_;
    Allocations runtime_streams_, runtime_events_;  // the runtime's, until destroyed
};

// The names of the callbacks of `group` that are null, ", "-separated.
template <std::size_t N>
std::string missing(const std::pair<const char*, bool> (&group)[N]) {
    std::string names;
    for (const auto& [name, present] : group) {
        if (present) continue;
        if (!names.empty()) names += ", ";
        names += name;
    }
    return names;
}
template <std::size_t N>
bool none(const std::pair<const char*, bool> (&group)[N]) {
    for (const auto& entry : group) {
        if (entry.second) return false;
    }
    return true;
}

}  // namespace

Result<BackendPtr> make_callback_backend(const devstage_callbacks& c) {
    const std::pair<const char*, bool> required[] = {{"device_malloc", c.device_malloc != nullptr},
                                                     {"device_free", c.device_free != nullptr},
                                                     {"copy_to_device", c.copy_to_device != nullptr},
                                                     {"copy_from_device", c.copy_from_device != nullptr}};
    const std::pair<const char*, bool> pinned[] = {{"pinned_malloc", c.pinned_malloc != nullptr},
                                                   {"pinned_free", c.pinned_free != nullptr}};
    const std::pair<const char*, bool> streams[] = {{"create_stream", c.create_stream != nullptr},
                                                    {"destroy_stream", c.destroy_stream != nullptr},
                                                    {"copy_to_device_async", c.copy_to_device_async != nullptr},
                                                    {"copy_from_device_async", c.copy_from_device_async != nullptr},
                                                    {"create_event", c.create_event != nullptr},
                                                    {"destroy_event", c.destroy_event != nullptr},
                                                    {"record_event", c.record_event != nullptr},
                                                    {"event_ready", c.event_ready != nullptr},
                                                    {"synchronize_event", c.synchronize_event != nullptr},
                                                    {"stream_wait_event", c.stream_wait_event != nullptr}};
    const std::string name = c.name != nullptr ? c.name : "callbacks";
    const std::string lacking = missing(required);
    if (!lacking.empty()) {
        return Status(Errc::invalid_argument,
                      "devstage_backend_create_callbacks: backend '" + name + "' lacks required callbacks: " + lacking);
    }
    if (!none(pinned) && !missing(pinned).empty()) {
        return Status(Errc::invalid_argument,
                      "devstage_backend_create_callbacks: backend '" + name +
                          "': pinned memory needs both pinned_malloc and pinned_free; missing " + missing(pinned));
    }
    if (none(streams) && c.device_memset_async != nullptr) {
        return Status(Errc::invalid_argument, "devstage_backend_create_callbacks: backend '" + name +
                                                  "': device_memset_async needs the stream callbacks");
    }
    if (none(streams) && c.launch_host_function != nullptr) {
        return Status(Errc::invalid_argument, "devstage_backend_create_callbacks: backend '" + name +
                                                  "': launch_host_function needs the stream callbacks");
    }
    const std::pair<const char*, bool> host_memory[] = {{"host_register", c.host_register != nullptr},
                                                        {"host_unregister", c.host_unregister != nullptr}};
    if (!none(host_memory) && !missing(host_memory).empty()) {
        return Status(Errc::invalid_argument,
                      "devstage_backend_create_callbacks: backend '" + name +
                          "': pinning in place needs both host_register and host_unregister; missing " +
                          missing(host_memory));
    }
    if (!none(streams) && !missing(streams).empty()) {
        return Status(Errc::invalid_argument, "devstage_backend_create_callbacks: backend '" + name +
                                                  "': streams need all ten stream and event callbacks; missing " +
                                                  missing(streams));
    }
    return share(new CallbackBackend(c, name));
}

}  // namespace devstage::capi
