// SPDX-License-Identifier: Apache-2.0
// The library's contract suites over its C-function backend: a devstage_backend made from the
// fake device's callbacks (with deferred streams, and without stream callbacks, where devstage's
// streams are immediate), seen from C++ through the C interface alone.
#include <catch2/catch.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>

#include "devstage/backend.hpp"
#include "devstage/c/devstage.h"
#include "devstage/status.hpp"
#include "fake_device.h"
#include "support.hpp"

namespace {

devstage::Status from_c(devstage_status status) {
    if (status == DEVSTAGE_OK) return {};
    return devstage::Status(static_cast<devstage::Errc>(status), devstage_last_message());
}

/// Every operation of a devstage_backend over the fake device's callbacks, as a C++ backend.
/// `Streams`: the callbacks have streams (deferred), else devstage's streams are immediate.
template <bool Streams>
class CallbackBackend {
public:
    static constexpr std::size_t device_alignment = 256;  // the fake device's posix_memalign

    struct Stream {
        devstage_stream handle = nullptr;
        friend bool operator==(Stream, Stream) = default;
    };
    struct Event {
        devstage_event handle = nullptr;
        friend bool operator==(Event, Event) = default;
    };

    explicit CallbackBackend(std::size_t capacity = std::size_t{1} << 32)
        : device_(fake_device_create(capacity, Streams ? 1 : 0)) {
        devstage_callbacks callbacks;
        fake_device_callbacks(device_, &callbacks);
        REQUIRE(devstage_backend_create_callbacks(&callbacks, &backend_) == DEVSTAGE_OK);
    }
    CallbackBackend(const CallbackBackend&) = delete;
    CallbackBackend& operator=(const CallbackBackend&) = delete;
    ~CallbackBackend() {
        (void)devstage_backend_destroy(backend_);  // frees (and reports) what a suite abandoned
        fake_device_destroy(device_);
    }

    std::string_view name() const noexcept { return "fake"; }

    devstage::Result<void*> device_malloc(std::size_t bytes) noexcept {
        return made<void*>([&](void** out) { return devstage_device_malloc(backend_, bytes, out); });
    }
    devstage::Status device_free(void* pointer) noexcept { return from_c(devstage_device_free(backend_, pointer)); }
    devstage::Status copy_to_device(void* dst, const void* src, std::size_t bytes) noexcept {
        return from_c(devstage_copy_to_device(backend_, dst, src, bytes));
    }
    devstage::Status copy_from_device(void* dst, const void* src, std::size_t bytes) noexcept {
        return from_c(devstage_copy_from_device(backend_, dst, src, bytes));
    }
    devstage::Result<void*> pinned_malloc(std::size_t bytes) noexcept {
        return made<void*>([&](void** out) { return devstage_pinned_malloc(backend_, bytes, out); });
    }
    devstage::Status pinned_free(void* pointer) noexcept { return from_c(devstage_pinned_free(backend_, pointer)); }

    devstage::Result<Stream> create_stream() noexcept {
        return made<Stream>([&](Stream* out) { return devstage_stream_create(backend_, &out->handle); });
    }
    devstage::Status destroy_stream(Stream stream) noexcept {
        return from_c(devstage_stream_destroy(backend_, stream.handle));
    }
    devstage::Status copy_to_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept {
        return from_c(devstage_copy_to_device_async(backend_, dst, src, bytes, stream.handle));
    }
    devstage::Status copy_from_device_async(void* dst, const void* src, std::size_t bytes, Stream stream) noexcept {
        return from_c(devstage_copy_from_device_async(backend_, dst, src, bytes, stream.handle));
    }
    devstage::Result<Event> create_event() noexcept {
        return made<Event>([&](Event* out) { return devstage_event_create(backend_, &out->handle); });
    }
    devstage::Status destroy_event(Event event) noexcept {
        return from_c(devstage_event_destroy(backend_, event.handle));
    }
    devstage::Status record_event(Event event, Stream stream) noexcept {
        return from_c(devstage_event_record(backend_, event.handle, stream.handle));
    }
    devstage::Result<bool> event_ready(Event event) noexcept {
        devstage::Result<int> ready =
            made<int>([&](int* out) { return devstage_event_ready(backend_, event.handle, out); });
        if (!ready) return ready.status();
        return *ready != 0;
    }
    devstage::Status synchronize_event(Event event) noexcept {
        return from_c(devstage_event_synchronize(backend_, event.handle));
    }
    devstage::Status stream_wait_event(Stream stream, Event event) noexcept {
        return from_c(devstage_stream_wait_event(backend_, stream.handle, event.handle));
    }

private:
    // What `call(&value)` made, or its failure.
    template <class T, class Call>
    static devstage::Result<T> made(Call&& call) noexcept {
        T value{};
        if (devstage::Status s = from_c(call(&value)); !s) return s;
        return value;
    }

    fake_device* device_;
    devstage_backend* backend_ = nullptr;
};

static_assert(devstage::PinnedHostBackend<CallbackBackend<true>>);
static_assert(devstage::AsyncBackend<CallbackBackend<true>>);
static_assert(devstage::AsyncBackend<CallbackBackend<false>>);

using DeferredCallbacks = CallbackBackend<true>;
using ImmediateCallbacks = CallbackBackend<false>;

}  // namespace

template <bool Streams>
struct devstage::test::BackendFactory<CallbackBackend<Streams>> {
    static std::unique_ptr<CallbackBackend<Streams>> make(std::size_t capacity = std::size_t{1} << 32) {
        return std::make_unique<CallbackBackend<Streams>>(capacity);
    }
};

using ContractBackends = std::tuple<DeferredCallbacks, ImmediateCallbacks>;
using StagingBackends = std::tuple<DeferredCallbacks, ImmediateCallbacks>;
using PinnedBackends = std::tuple<DeferredCallbacks, ImmediateCallbacks>;
using AsyncBackends = std::tuple<DeferredCallbacks, ImmediateCallbacks>;
#include "async_contract.hpp"
#include "backend_contract.hpp"
#include "pinned_suite.hpp"
#include "staging_suite.hpp"
