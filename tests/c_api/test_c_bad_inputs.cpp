// SPDX-License-Identifier: Apache-2.0
// Bad input to every function of devstage/c/devstage.h, from a table: NULL, destroyed,
// made-up and wrong-kind handles, a stream or event of another backend, SIZE_MAX counts and
// sizes that overflow. Each is a clear error — the code the contract names, a message naming
// the call — that leaves its outputs NULL and takes nothing: the objects the calls were given
// work afterwards, and the fake device and the library's handle count show nothing left
// (valgrind and ASan check the rest in CI). A check reads the header and fails when a function
// has no row.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "c_support.hpp"
#include "devstage/c/devstage.h"
#include "fake_device.h"

using namespace devstage::c_test;  // NOLINT(google-build-using-namespace): the shared helpers

namespace {

// Everything a row may hand a function: live objects, and dead handles of every kind.
struct World {
    World() {
        C_OK(devstage_backend_create_sim(std::size_t{1} << 30, &backend));
        C_OK(devstage_backend_create_sim(0, &other_backend));
        devstage_stager_config config{};
        config.pack_limit = DEVSTAGE_PACK_LIMIT_4K;
        config.pipeline_slots = 2;
        C_OK(devstage_stager_create(backend, &config, &stager));
        C_OK(devstage_stager_create(backend, &config, &other_stager));
        C_OK(devstage_stager_create(backend, nullptr, &plain_stager));
        C_OK(devstage_stager_create(backend, &config, &frame_stager));
        C_OK(devstage_stream_create(backend, &stream));
        C_OK(devstage_stream_create(other_backend, &other_stream));
        C_OK(devstage_event_create(backend, &event));
        C_OK(devstage_event_create(other_backend, &other_event));
        C_OK(devstage_pinned_pool_create(backend, 1 << 20, &pool));
        C_OK(devstage_device_malloc(backend, 4096, &device));
        C_OK(devstage_pinned_pool_allocate(pool, 4096, &pinned));
        const devstage_tensor_arg args[] = {arg(host.data(), host.size(), DEVSTAGE_IN_OUT)};
        C_OK(devstage_bind_on(stager, args, 1, stream, &run));
        devstage_run* finished = nullptr;
        const devstage_tensor_arg others[] = {arg(completed.data(), completed.size(), DEVSTAGE_IN_OUT)};
        C_OK(devstage_bind_on(stager, others, 1, stream, &finished));
        C_OK(devstage_finish_on(stager, finished, stream, DEVSTAGE_OK, &completion));
        const devstage_tensor_shape shapes[] = {{64, DEVSTAGE_IN, nullptr}};
        C_OK(devstage_frame_create(other_stager, shapes, 1, &frame));
        // Dead handles: made, then destroyed or used up.
        C_OK(devstage_backend_create_sim(0, &dead_backend));
        C_OK(devstage_stager_create(backend, nullptr, &dead_stager));
        C_OK(devstage_bind(dead_stager, args, 1, &dead_run));
        C_OK(devstage_finish(dead_stager, dead_run, DEVSTAGE_OK));
        devstage_run* to_complete = nullptr;
        C_OK(devstage_bind_on(dead_stager, args, 1, stream, &to_complete));
        C_OK(devstage_finish_on(dead_stager, to_complete, stream, DEVSTAGE_OK, &dead_completion));
        C_OK(devstage_completion_destroy(dead_completion));
        C_OK(devstage_stager_destroy(dead_stager));
        C_OK(devstage_frame_create(other_stager, shapes, 1, &dead_frame));
        C_OK(devstage_frame_destroy(dead_frame));
        C_OK(devstage_stream_create(backend, &dead_stream));
        C_OK(devstage_stream_destroy(backend, dead_stream));
        C_OK(devstage_event_create(backend, &dead_event));
        C_OK(devstage_event_destroy(backend, dead_event));
        C_OK(devstage_pinned_pool_create(backend, 0, &dead_pool));
        C_OK(devstage_pinned_pool_destroy(dead_pool));
        C_OK(devstage_backend_destroy(dead_backend));
    }
    World(const World&) = delete;
    World& operator=(const World&) = delete;
    // The objects still work after every refusal: a full run on the live run, then all goes.
    ~World() {
        CHECK(devstage_completion_wait(completion) == DEVSTAGE_OK);
        CHECK(devstage_completion_destroy(completion) == DEVSTAGE_OK);
        devstage_completion* done = nullptr;
        CHECK(devstage_finish_on(stager, run, stream, DEVSTAGE_OK, &done) == DEVSTAGE_OK);
        CHECK(devstage_completion_destroy(done) == DEVSTAGE_OK);
        CHECK(devstage_frame_destroy(frame) == DEVSTAGE_OK);
        CHECK(devstage_pinned_pool_free(pool, pinned) == DEVSTAGE_OK);
        CHECK(devstage_pinned_pool_destroy(pool) == DEVSTAGE_OK);
        CHECK(devstage_device_free(backend, device) == DEVSTAGE_OK);
        CHECK(devstage_stager_destroy(stager) == DEVSTAGE_OK);
        CHECK(devstage_stager_destroy(other_stager) == DEVSTAGE_OK);
        CHECK(devstage_stager_destroy(plain_stager) == DEVSTAGE_OK);
        CHECK(devstage_stager_destroy(frame_stager) == DEVSTAGE_OK);
        CHECK(devstage_event_destroy(backend, event) == DEVSTAGE_OK);
        CHECK(devstage_event_destroy(other_backend, other_event) == DEVSTAGE_OK);
        CHECK(devstage_stream_destroy(backend, stream) == DEVSTAGE_OK);
        CHECK(devstage_stream_destroy(other_backend, other_stream) == DEVSTAGE_OK);
        CHECK(devstage_backend_destroy(backend) == DEVSTAGE_OK);
        CHECK(devstage_backend_destroy(other_backend) == DEVSTAGE_OK);
    }

    std::vector<unsigned char> host = std::vector<unsigned char>(64, 7);
    std::vector<unsigned char> completed = std::vector<unsigned char>(64, 9);
    devstage_backend* backend = nullptr;
    devstage_backend* other_backend = nullptr;
    devstage_stager* stager = nullptr;
    devstage_stager* other_stager = nullptr;  // packing, both slots held by frames
    devstage_stager* plain_stager = nullptr;
    devstage_stager* frame_stager = nullptr;  // packing, free slots
    devstage_stream stream = nullptr;
    devstage_stream other_stream = nullptr;
    devstage_event event = nullptr;
    devstage_event other_event = nullptr;
    devstage_pinned_pool* pool = nullptr;
    devstage_run* run = nullptr;
    devstage_completion* completion = nullptr;
    devstage_frame* frame = nullptr;  // of other_stager
    void* device = nullptr;
    void* pinned = nullptr;
    devstage_backend* dead_backend = nullptr;
    devstage_stager* dead_stager = nullptr;
    devstage_run* dead_run = nullptr;
    devstage_completion* dead_completion = nullptr;
    devstage_frame* dead_frame = nullptr;
    devstage_stream dead_stream = nullptr;
    devstage_event dead_event = nullptr;
    devstage_pinned_pool* dead_pool = nullptr;
};

// A handle of the wrong kind, as another kind's pointer.
template <class To, class From>
To as(From handle) {
    return reinterpret_cast<To>(handle);
}

struct Row {
    const char* function;
    const char* input;  // what is bad about it
    devstage_status expected;
    const char* says;  // a part of the message
    std::function<devstage_status(World&)> call;
    std::function<bool(World&)> outputs_cleared = [](World&) { return true; };
};

// Out-parameters the rows write, reset before each row to a value no call leaves.
struct Outs {
    devstage_backend* backend;
    devstage_stager* stager;
    devstage_run* run;
    devstage_completion* completion;
    devstage_frame* frame;
    devstage_pinned_pool* pool;
    devstage_stream stream;
    devstage_event event;
    void* pointer;
    void reset() {
        backend = as<devstage_backend*>(std::uintptr_t{1});
        stager = as<devstage_stager*>(std::uintptr_t{1});
        run = as<devstage_run*>(std::uintptr_t{1});
        completion = as<devstage_completion*>(std::uintptr_t{1});
        frame = as<devstage_frame*>(std::uintptr_t{1});
        pool = as<devstage_pinned_pool*>(std::uintptr_t{1});
        stream = as<devstage_stream>(std::uintptr_t{1});
        event = as<devstage_event>(std::uintptr_t{1});
        pointer = as<void*>(std::uintptr_t{1});
    }
};
Outs outs;

constexpr devstage_status bad = DEVSTAGE_INVALID_ARGUMENT;

// One valid arg, for the rows whose count is what is wrong.
const devstage_tensor_arg* one_arg() {
    static unsigned char data[8];
    static const devstage_tensor_arg one{data, sizeof data, DEVSTAGE_IN, DEVSTAGE_HOST};
    return &one;
}
const std::size_t huge = SIZE_MAX;

std::vector<Row> rows() {
    std::vector<Row> r;
    const auto add = [&](
                         const char* function, const char* input, devstage_status expected, const char* says,
                         std::function<devstage_status(World&)> call,
                         std::function<bool(World&)> cleared = [](World&) { return true; }) {
        r.push_back(Row{function, input, expected, says, std::move(call), std::move(cleared)});
    };
    const auto run_cleared = [](World&) { return outs.run == nullptr; };
    const auto completion_cleared = [](World&) { return outs.completion == nullptr; };
    const auto pointer_cleared = [](World&) { return outs.pointer == nullptr; };
    static const devstage_callbacks no_callbacks{};

    // ---- backends
    add("devstage_backend_create_sim", "NULL out", bad, "out is NULL",
        [](World&) { return devstage_backend_create_sim(0, nullptr); });
    add("devstage_backend_create_sim_device", "NULL out", bad, "out is NULL",
        [](World& w) { return devstage_backend_create_sim_device(1, 0, w.backend, nullptr); });
    add(
        "devstage_backend_create_sim_device", "a negative device", bad, "device -1",
        [](World&) { return devstage_backend_create_sim_device(-1, 0, nullptr, &outs.backend); },
        [](World&) { return outs.backend == nullptr; });
    add(
        "devstage_backend_create_sim_device", "a destroyed host_of", bad, "was destroyed",
        [](World& w) { return devstage_backend_create_sim_device(1, 0, w.dead_backend, &outs.backend); },
        [](World&) { return outs.backend == nullptr; });
    add("devstage_backend_create_cuda", "NULL out", bad, "out is NULL",
        [](World&) { return devstage_backend_create_cuda(0, nullptr, nullptr); });
    add(
        "devstage_backend_create_cuda", "a library that is not there", DEVSTAGE_LIBRARY_NOT_FOUND, "/nonexistent",
        [](World&) { return devstage_backend_create_cuda(0, "/nonexistent/libcudart.so", &outs.backend); },
        [](World&) { return outs.backend == nullptr; });
    add("devstage_backend_create_ascend", "NULL out", bad, "out is NULL",
        [](World&) { return devstage_backend_create_ascend(0, nullptr, nullptr); });
    add(
        "devstage_backend_create_ascend", "a library that is not there", DEVSTAGE_LIBRARY_NOT_FOUND, "/nonexistent",
        [](World&) { return devstage_backend_create_ascend(0, "/nonexistent/libascendcl.so", &outs.backend); },
        [](World&) { return outs.backend == nullptr; });
    add(
        "devstage_backend_create_callbacks", "NULL callbacks", bad, "callbacks is NULL",
        [](World&) { return devstage_backend_create_callbacks(nullptr, &outs.backend); },
        [](World&) { return outs.backend == nullptr; });
    add(
        "devstage_backend_create_callbacks", "no callbacks", bad, "lacks required callbacks",
        [](World&) { return devstage_backend_create_callbacks(&no_callbacks, &outs.backend); },
        [](World&) { return outs.backend == nullptr; });
    add("devstage_backend_create_callbacks", "NULL out", bad, "out is NULL",
        [](World&) { return devstage_backend_create_callbacks(&no_callbacks, nullptr); });
    add("devstage_backend_destroy", "a destroyed backend", bad, "was destroyed",
        [](World& w) { return devstage_backend_destroy(w.dead_backend); });
    add("devstage_backend_destroy", "a stager", bad, "a stager handle was given where a backend handle is needed",
        [](World& w) { return devstage_backend_destroy(as<devstage_backend*>(w.stager)); });
    add("devstage_backend_destroy", "a backend with live streams", DEVSTAGE_BUSY, "destroy them first",
        [](World& w) { return devstage_backend_destroy(w.backend); });
    add("devstage_backend_get_info", "NULL backend", bad, "backend is NULL", [](World&) {
        devstage_backend_info info{};
        return devstage_backend_get_info(nullptr, &info);
    });
    add("devstage_backend_get_info", "NULL info", bad, "info is NULL",
        [](World& w) { return devstage_backend_get_info(w.backend, nullptr); });
    add("devstage_backend_device", "a destroyed backend", bad, "was destroyed", [](World& w) {
        int kind = 0, device = 0;
        return devstage_backend_device(w.dead_backend, &kind, &device);
    });
    add("devstage_backend_device", "NULL device", bad, "device is NULL", [](World& w) {
        int kind = 0;
        return devstage_backend_device(w.backend, &kind, nullptr);
    });
    add("devstage_backend_synchronize", "a stream", bad, "a stream handle was given where a backend handle",
        [](World& w) { return devstage_backend_synchronize(as<devstage_backend*>(w.stream)); });
    add("devstage_device_malloc", "NULL out", bad, "NULL",
        [](World& w) { return devstage_device_malloc(w.backend, 64, nullptr); });
    add(
        "devstage_device_malloc", "0 bytes", bad, "0 bytes",
        [](World& w) { return devstage_device_malloc(w.backend, 0, &outs.pointer); }, pointer_cleared);
    add(
        "devstage_device_malloc", "SIZE_MAX bytes", DEVSTAGE_OUT_OF_MEMORY, "bytes requested",
        [](World& w) { return devstage_device_malloc(w.backend, huge, &outs.pointer); }, pointer_cleared);
    add("devstage_device_malloc", "a destroyed backend", bad, "was destroyed",
        [](World& w) { return devstage_device_malloc(w.dead_backend, 64, &outs.pointer); });
    add("devstage_device_free", "a pointer never allocated", DEVSTAGE_UNKNOWN_POINTER, "not a live device allocation",
        [](World& w) { return devstage_device_free(w.backend, w.host.data()); });
    add("devstage_device_free", "NULL backend", bad, "backend is NULL",
        [](World& w) { return devstage_device_free(nullptr, w.device); });
    add("devstage_copy_to_device", "SIZE_MAX bytes", bad, "not inside one device allocation",
        [](World& w) { return devstage_copy_to_device(w.backend, w.device, w.host.data(), huge); });
    add("devstage_copy_to_device", "a destroyed backend", bad, "was destroyed",
        [](World& w) { return devstage_copy_to_device(w.dead_backend, w.device, w.host.data(), 8); });
    add("devstage_copy_from_device", "a size past the allocation", bad, "not inside one device allocation",
        [](World& w) { return devstage_copy_from_device(w.backend, w.host.data(), w.device, 4097); });
    add("devstage_copy_from_device", "a pool", bad, "a pinned pool handle was given where a backend handle",
        [](World& w) { return devstage_copy_from_device(as<devstage_backend*>(w.pool), w.host.data(), w.device, 8); });
    add(
        "devstage_pinned_malloc", "0 bytes", bad, "0 bytes",
        [](World& w) { return devstage_pinned_malloc(w.backend, 0, &outs.pointer); }, pointer_cleared);
    add(
        "devstage_pinned_malloc", "SIZE_MAX bytes", DEVSTAGE_OUT_OF_MEMORY, "exceed the address space",
        [](World& w) { return devstage_pinned_malloc(w.backend, huge, &outs.pointer); }, pointer_cleared);
    add("devstage_pinned_free", "a pointer never allocated", DEVSTAGE_UNKNOWN_POINTER, "not a live pinned allocation",
        [](World& w) { return devstage_pinned_free(w.backend, w.host.data()); });

    // ---- streams and events
    add("devstage_stream_create", "NULL stream", bad, "stream is NULL",
        [](World& w) { return devstage_stream_create(w.backend, nullptr); });
    add("devstage_stream_create", "a destroyed backend", bad, "was destroyed",
        [](World& w) { return devstage_stream_create(w.dead_backend, &outs.stream); });
    add("devstage_stream_destroy", "a destroyed stream", bad, "stream handle 0x",
        [](World& w) { return devstage_stream_destroy(w.backend, w.dead_stream); });
    add("devstage_stream_destroy", "another backend's stream", bad, "a stream of backend 'sim' #",
        [](World& w) { return devstage_stream_destroy(w.backend, w.other_stream); });
    add("devstage_stream_destroy", "an event", bad, "an event handle was given where a stream handle is needed",
        [](World& w) { return devstage_stream_destroy(w.backend, as<devstage_stream>(w.event)); });
    add(
        "devstage_stream_adopt", "NULL on the simulator", DEVSTAGE_NOT_SUPPORTED, "no default stream",
        [](World& w) { return devstage_stream_adopt(w.backend, nullptr, &outs.stream); },
        [](World&) { return outs.stream == nullptr; });
    add(
        "devstage_stream_adopt", "not a stream of the simulator", bad, "is not one of its live streams",
        [](World& w) { return devstage_stream_adopt(w.backend, w.host.data(), &outs.stream); },
        [](World&) { return outs.stream == nullptr; });
    add("devstage_stream_adopt", "NULL out", bad, "stream is NULL",
        [](World& w) { return devstage_stream_adopt(w.backend, nullptr, nullptr); });
    add("devstage_stream_native", "a destroyed stream", bad, "was destroyed",
        [](World& w) { return devstage_stream_native(w.dead_stream, &outs.pointer); });
    add("devstage_stream_native", "NULL native", bad, "native is NULL",
        [](World& w) { return devstage_stream_native(w.stream, nullptr); });
    add("devstage_stream_synchronize", "NULL stream", bad, "stream is NULL",
        [](World& w) { return devstage_stream_synchronize(w.backend, nullptr); });
    add("devstage_stream_synchronize", "another backend's stream", bad, " given to backend 'sim' #",
        [](World& w) { return devstage_stream_synchronize(w.backend, w.other_stream); });
    add("devstage_copy_to_device_async", "a destroyed stream", bad, "was destroyed",
        [](World& w) { return devstage_copy_to_device_async(w.backend, w.device, w.host.data(), 8, w.dead_stream); });
    add("devstage_copy_to_device_async", "SIZE_MAX bytes", bad, "not inside one device allocation",
        [](World& w) { return devstage_copy_to_device_async(w.backend, w.device, w.host.data(), huge, w.stream); });
    add("devstage_copy_from_device_async", "another backend's stream", bad, "a stream of backend", [](World& w) {
        return devstage_copy_from_device_async(w.backend, w.host.data(), w.device, 8, w.other_stream);
    });
    add("devstage_event_create", "NULL event", bad, "event is NULL",
        [](World& w) { return devstage_event_create(w.backend, nullptr); });
    add("devstage_event_destroy", "a destroyed event", bad, "event handle 0x",
        [](World& w) { return devstage_event_destroy(w.backend, w.dead_event); });
    add("devstage_event_destroy", "another backend's event", bad, "an event of backend 'sim' #",
        [](World& w) { return devstage_event_destroy(w.backend, w.other_event); });
    add("devstage_event_record", "another backend's stream", bad, "a stream of backend",
        [](World& w) { return devstage_event_record(w.backend, w.event, w.other_stream); });
    add("devstage_event_record", "a stream as the event", bad, "a stream handle was given where an event handle",
        [](World& w) { return devstage_event_record(w.backend, as<devstage_event>(w.stream), w.stream); });
    add("devstage_event_ready", "NULL ready", bad, "ready is NULL",
        [](World& w) { return devstage_event_ready(w.backend, w.event, nullptr); });
    add("devstage_event_ready", "a destroyed event", bad, "was destroyed", [](World& w) {
        int ready = 0;
        return devstage_event_ready(w.backend, w.dead_event, &ready);
    });
    add("devstage_event_synchronize", "another backend's event", bad, "an event of backend",
        [](World& w) { return devstage_event_synchronize(w.backend, w.other_event); });
    add("devstage_stream_wait_event", "a destroyed stream", bad, "was destroyed",
        [](World& w) { return devstage_stream_wait_event(w.backend, w.dead_stream, w.event); });
    add("devstage_stream_wait_event", "another backend's event", bad, "an event of backend",
        [](World& w) { return devstage_stream_wait_event(w.backend, w.stream, w.other_event); });
    add("devstage_launch_host_function", "NULL fn", bad, "fn is NULL",
        [](World& w) { return devstage_launch_host_function(w.backend, w.stream, nullptr, nullptr); });
    add("devstage_launch_host_function", "another backend's stream", bad, "a stream of backend", [](World& w) {
        return devstage_launch_host_function(
            w.backend, w.other_stream, [](void*) {}, nullptr);
    });
    add("devstage_host_register", "NULL host", bad, "a null pointer",
        [](World& w) { return devstage_host_register(w.backend, nullptr, 64); });
    add("devstage_host_register", "SIZE_MAX bytes", bad, "run past the end of the address space",
        [](World& w) { return devstage_host_register(w.backend, w.host.data(), huge); });
    add("devstage_host_register", "the backend's own pinned memory", bad, "pinned already",
        [](World& w) { return devstage_host_register(w.backend, w.pinned, 64); });
    add("devstage_host_unregister", "never registered", DEVSTAGE_UNKNOWN_POINTER, "was never registered",
        [](World& w) { return devstage_host_unregister(w.backend, w.host.data()); });
    add("devstage_host_unregister", "a destroyed backend", bad, "was destroyed",
        [](World& w) { return devstage_host_unregister(w.dead_backend, w.host.data()); });

    // ---- stagers
    add(
        "devstage_stager_create", "a destroyed backend", bad, "was destroyed",
        [](World& w) { return devstage_stager_create(w.dead_backend, nullptr, &outs.stager); },
        [](World&) { return outs.stager == nullptr; });
    add(
        "devstage_stager_create", "SIZE_MAX slots", bad, "pipeline slots asked for",
        [](World& w) {
            devstage_stager_config config{};
            config.pipeline_slots = huge;
            return devstage_stager_create(w.backend, &config, &outs.stager);
        },
        [](World&) { return outs.stager == nullptr; });
    add("devstage_stager_create", "NULL out", bad, "out is NULL",
        [](World& w) { return devstage_stager_create(w.backend, nullptr, nullptr); });
    add("devstage_stager_destroy", "a destroyed stager", bad, "was destroyed",
        [](World& w) { return devstage_stager_destroy(w.dead_stager); });
    add("devstage_stager_destroy", "a run", bad, "a run handle was given where a stager handle is needed",
        [](World& w) { return devstage_stager_destroy(as<devstage_stager*>(w.run)); });
    add("devstage_stager_set_error_sink", "a destroyed stager", bad, "was destroyed",
        [](World& w) { return devstage_stager_set_error_sink(w.dead_stager, nullptr, nullptr); });
    add("devstage_stager_release", "a frame", bad, "a frame handle was given where a stager handle is needed",
        [](World& w) { return devstage_stager_release(as<devstage_stager*>(w.frame)); });
    add("devstage_stager_abandon", "NULL stager", bad, "stager is NULL",
        [](World&) { return devstage_stager_abandon(nullptr); });
    add("devstage_stager_reserve", "a destroyed stager", bad, "was destroyed",
        [](World& w) { return devstage_stager_reserve(w.dead_stager, 64); });
    add("devstage_stager_reserve", "while a run is live", DEVSTAGE_BUSY, "",
        [](World& w) { return devstage_stager_reserve(w.stager, 64); });
    add(
        "devstage_bind", "SIZE_MAX args", bad, "cannot be the size of an array",
        [](World& w) { return devstage_bind(w.plain_stager, one_arg(), huge, &outs.run); }, run_cleared);
    add(
        "devstage_bind", "NULL args with a count", bad, "args is NULL with count 2",
        [](World& w) { return devstage_bind(w.plain_stager, nullptr, 2, &outs.run); }, run_cleared);
    add(
        "devstage_bind", "a destroyed stager", bad, "was destroyed",
        [](World& w) { return devstage_bind(w.dead_stager, nullptr, 0, &outs.run); }, run_cleared);
    add(
        "devstage_bind", "an arg of SIZE_MAX bytes", bad, "",
        [](World& w) {
            const devstage_tensor_arg args[] = {arg(w.host.data(), huge, DEVSTAGE_IN)};
            return devstage_bind(w.plain_stager, args, 1, &outs.run);
        },
        run_cleared);
    add(
        "devstage_bind", "args whose sizes overflow", bad, "",
        [](World& w) {
            const devstage_tensor_arg args[] = {arg(w.host.data(), huge / 2, DEVSTAGE_IN),
                                                arg(w.host.data(), huge / 2, DEVSTAGE_IN)};
            return devstage_bind(w.plain_stager, args, 2, &outs.run);
        },
        run_cleared);
    add("devstage_bind", "NULL run", bad, "run is NULL",
        [](World& w) { return devstage_bind(w.plain_stager, nullptr, 0, nullptr); });
    add(
        "devstage_bind_on", "another backend's stream", bad, " given to a stager of backend 'sim' #",
        [](World& w) { return devstage_bind_on(w.plain_stager, nullptr, 0, w.other_stream, &outs.run); }, run_cleared);
    add(
        "devstage_bind_on", "a destroyed stream", bad, "was destroyed",
        [](World& w) { return devstage_bind_on(w.plain_stager, nullptr, 0, w.dead_stream, &outs.run); }, run_cleared);
    add(
        "devstage_bind_on", "SIZE_MAX args", bad, "cannot be the size of an array",
        [](World& w) { return devstage_bind_on(w.plain_stager, one_arg(), huge, w.stream, &outs.run); }, run_cleared);
    add("devstage_run_device_args", "a used-up run", bad, "was finished or destroyed", [](World& w) {
        void* device[1];
        return devstage_run_device_args(w.dead_run, device, 1);
    });
    add("devstage_run_device_args", "SIZE_MAX count", bad, "but the run was bound with 1 args",
        [](World& w) { return devstage_run_device_args(w.run, nullptr, huge); });
    add("devstage_run_slot", "a completion", bad, "a completion handle was given where a run handle is needed",
        [](World& w) {
            std::size_t slot = 0;
            return devstage_run_slot(as<devstage_run*>(w.completion), &slot);
        });
    add("devstage_run_slot", "NULL slot", bad, "slot is NULL",
        [](World& w) { return devstage_run_slot(w.run, nullptr); });
    add("devstage_order_after_uploads", "another stager's run", bad, "belongs to another stager",
        [](World& w) { return devstage_order_after_uploads(w.other_stager, w.run, w.stream); });
    add("devstage_order_after_uploads", "another backend's stream", bad, "a stream of backend",
        [](World& w) { return devstage_order_after_uploads(w.stager, w.run, w.other_stream); });
    add("devstage_order_after_uploads", "a used-up run", bad, "was finished or destroyed",
        [](World& w) { return devstage_order_after_uploads(w.stager, w.dead_run, w.stream); });
    add("devstage_finish", "a used-up run", bad, "was finished or destroyed",
        [](World& w) { return devstage_finish(w.stager, w.dead_run, DEVSTAGE_OK); });
    add("devstage_finish", "another stager's run", bad, "belongs to another stager",
        [](World& w) { return devstage_finish(w.other_stager, w.run, DEVSTAGE_OK); });
    add("devstage_finish", "a destroyed stager", bad, "was destroyed",
        [](World& w) { return devstage_finish(w.dead_stager, w.run, DEVSTAGE_OK); });
    add(
        "devstage_finish_on", "another backend's stream", bad, "a stream of backend",
        [](World& w) { return devstage_finish_on(w.stager, w.run, w.other_stream, DEVSTAGE_OK, &outs.completion); },
        completion_cleared);
    add(
        "devstage_finish_on", "a stream as the run", bad, "a stream handle was given where a run handle",
        [](World& w) {
            return devstage_finish_on(w.stager, as<devstage_run*>(w.stream), w.stream, DEVSTAGE_OK, &outs.completion);
        },
        completion_cleared);
    add("devstage_finish_on", "NULL completion", bad, "completion is NULL",
        [](World& w) { return devstage_finish_on(w.stager, w.run, w.stream, DEVSTAGE_OK, nullptr); });
    add("devstage_run_destroy", "a used-up run", bad, "was finished or destroyed",
        [](World& w) { return devstage_run_destroy(w.dead_run); });
    add("devstage_completion_wait", "a destroyed completion", bad, "was destroyed",
        [](World& w) { return devstage_completion_wait(w.dead_completion); });
    add("devstage_completion_ready", "NULL ready", bad, "ready is NULL",
        [](World& w) { return devstage_completion_ready(w.completion, nullptr); });
    add("devstage_completion_pending", "a run", bad, "a run handle was given where a completion handle", [](World& w) {
        int pending = 0;
        return devstage_completion_pending(as<devstage_completion*>(w.run), &pending);
    });
    add("devstage_completion_pending", "NULL pending", bad, "pending is NULL",
        [](World& w) { return devstage_completion_pending(w.completion, nullptr); });
    add("devstage_completion_destroy", "a destroyed completion", bad, "was destroyed",
        [](World& w) { return devstage_completion_destroy(w.dead_completion); });
    add(
        "devstage_frame_create", "SIZE_MAX shapes", bad, "cannot be the size of an array",
        [](World& w) {
            static const devstage_tensor_shape shape{64, DEVSTAGE_IN, nullptr};
            return devstage_frame_create(w.frame_stager, &shape, huge, &outs.frame);
        },
        [](World&) { return outs.frame == nullptr; });
    add(
        "devstage_frame_create", "a shape of SIZE_MAX bytes", bad, "",
        [](World& w) {
            const devstage_tensor_shape shapes[] = {{huge, DEVSTAGE_IN, nullptr}};
            return devstage_frame_create(w.frame_stager, shapes, 1, &outs.frame);
        },
        [](World&) { return outs.frame == nullptr; });
    add(
        "devstage_frame_create", "a destroyed stager", bad, "was destroyed",
        [](World& w) {
            const devstage_tensor_shape shapes[] = {{64, DEVSTAGE_IN, nullptr}};
            return devstage_frame_create(w.dead_stager, shapes, 1, &outs.frame);
        },
        [](World&) { return outs.frame == nullptr; });
    add(
        "devstage_frame_host", "SIZE_MAX index", bad, "tensor 18446744073709551615 of a frame of 1 tensors",
        [](World& w) {
            std::size_t bytes = 1;
            return devstage_frame_host(w.frame, huge, &outs.pointer, &bytes);
        },
        pointer_cleared);
    add("devstage_frame_host", "a destroyed frame", bad, "was destroyed", [](World& w) {
        std::size_t bytes = 0;
        return devstage_frame_host(w.dead_frame, 0, &outs.pointer, &bytes);
    });
    add("devstage_frame_hosts", "a count that is not the frame's", bad, "count 2, but the frame has 1 tensors",
        [](World& w) {
            void* data[2] = {};
            return devstage_frame_hosts(w.frame, data, nullptr, 2);
        });
    add("devstage_frame_hosts", "SIZE_MAX count", bad, "count 18446744073709551615, but the frame has 1 tensors",
        [](World& w) { return devstage_frame_hosts(w.frame, &outs.pointer, nullptr, huge); });
    add("devstage_frame_hosts", "NULL data", bad, "data is NULL",
        [](World& w) { return devstage_frame_hosts(w.frame, nullptr, nullptr, 1); });
    add("devstage_frame_hosts", "a destroyed frame", bad, "was destroyed",
        [](World& w) { return devstage_frame_hosts(w.dead_frame, &outs.pointer, nullptr, 1); });
    add("devstage_frame_hosts", "a run as the frame", bad, "a run handle was given where a frame handle",
        [](World& w) { return devstage_frame_hosts(as<devstage_frame*>(w.run), &outs.pointer, nullptr, 1); });
    add("devstage_frame_slot", "NULL slot", bad, "slot is NULL",
        [](World& w) { return devstage_frame_slot(w.frame, nullptr); });
    add("devstage_frame_slot", "a destroyed frame", bad, "was destroyed", [](World& w) {
        std::size_t slot = 0;
        return devstage_frame_slot(w.dead_frame, &slot);
    });
    add(
        "devstage_bind_frame", "another stager's frame", bad, "the frame belongs to another stager",
        [](World& w) { return devstage_bind_frame(w.stager, w.frame, &outs.run); }, run_cleared);
    add(
        "devstage_bind_frame", "a destroyed frame", bad, "was destroyed",
        [](World& w) { return devstage_bind_frame(w.other_stager, w.dead_frame, &outs.run); }, run_cleared);
    add(
        "devstage_bind_frame_on", "another backend's stream", bad, "a stream of backend",
        [](World& w) { return devstage_bind_frame_on(w.other_stager, w.frame, w.other_stream, &outs.run); },
        run_cleared);
    add("devstage_frame_destroy", "a destroyed frame", bad, "was destroyed",
        [](World& w) { return devstage_frame_destroy(w.dead_frame); });
    add("devstage_stager_stats_get", "NULL stats", bad, "stats is NULL",
        [](World& w) { return devstage_stager_stats_get(w.stager, nullptr); });
    add("devstage_stager_stats_get", "a destroyed stager", bad, "was destroyed", [](World& w) {
        devstage_stager_stats stats{};
        return devstage_stager_stats_get(w.dead_stager, &stats);
    });

    // ---- the pinned pool
    add(
        "devstage_pinned_pool_create", "a destroyed backend", bad, "was destroyed",
        [](World& w) { return devstage_pinned_pool_create(w.dead_backend, 0, &outs.pool); },
        [](World&) { return outs.pool == nullptr; });
    add("devstage_pinned_pool_destroy", "a destroyed pool", bad, "was destroyed",
        [](World& w) { return devstage_pinned_pool_destroy(w.dead_pool); });
    add("devstage_pinned_pool_set_error_sink", "a backend", bad, "a backend handle was given where a pinned pool",
        [](World& w) {
            return devstage_pinned_pool_set_error_sink(as<devstage_pinned_pool*>(w.backend), nullptr, nullptr);
        });
    add(
        "devstage_pinned_pool_allocate", "SIZE_MAX bytes", DEVSTAGE_OUT_OF_MEMORY, "",
        [](World& w) { return devstage_pinned_pool_allocate(w.pool, huge, &outs.pointer); }, pointer_cleared);
    add("devstage_pinned_pool_allocate", "NULL pool", bad, "pool is NULL",
        [](World&) { return devstage_pinned_pool_allocate(nullptr, 64, &outs.pointer); });
    add("devstage_pinned_pool_free", "a pointer it did not hand out", DEVSTAGE_UNKNOWN_POINTER, "",
        [](World& w) { return devstage_pinned_pool_free(w.pool, w.host.data()); });
    add("devstage_pinned_pool_record", "a destroyed stream", bad, "was destroyed",
        [](World& w) { return devstage_pinned_pool_record(w.pool, w.pinned, w.dead_stream); });
    add("devstage_pinned_pool_record", "a destroyed pool", bad, "was destroyed",
        [](World& w) { return devstage_pinned_pool_record(w.dead_pool, w.pinned, w.stream); });
    add("devstage_pinned_pool_trim", "a destroyed pool", bad, "was destroyed",
        [](World& w) { return devstage_pinned_pool_trim(w.dead_pool); });
    add("devstage_pinned_pool_stats", "NULL stats", bad, "stats is NULL",
        [](World& w) { return devstage_pinned_pool_stats(w.pool, nullptr); });

    // ---- status
    add("devstage_last_message", "(no input)", DEVSTAGE_OK, "",
        [](World&) { return devstage_last_message() != nullptr ? DEVSTAGE_OK : DEVSTAGE_BACKEND_FAILURE; });
    add("devstage_status_name", "a value outside the list", DEVSTAGE_OK, "", [](World&) {
        return std::string(devstage_status_name(-3)) == "unknown" ? DEVSTAGE_OK : DEVSTAGE_BACKEND_FAILURE;
    });
    return r;
}

// The functions the header declares.
std::set<std::string> declared() {
    std::ifstream header(DEVSTAGE_C_HEADER);
    REQUIRE(header);
    const std::string text((std::istreambuf_iterator<char>(header)), std::istreambuf_iterator<char>());
    const std::regex declaration(R"(DEVSTAGE_C_API\s+[^;(]*?\b(devstage_[a-z_]+)\s*\()");
    std::set<std::string> names;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), declaration); it != std::sregex_iterator(); ++it) {
        names.insert((*it)[1].str());
    }
    return names;
}

}  // namespace

TEST_CASE("c bad inputs: every function refuses them clearly, and takes nothing", "[c_bad_inputs]") {
    World world;
    const std::vector<Row> table = rows();
    for (const Row& row : table) {
        CAPTURE(row.function, row.input);
        outs.reset();
        const devstage_status status = row.call(world);
        INFO("message: " << last());
        CHECK(status == row.expected);
        if (row.expected != DEVSTAGE_OK) {
            CHECK_FALSE(last().empty());
            CHECK(last().find(row.says) != std::string::npos);
            CHECK(row.outputs_cleared(world));
        }
    }
    // Every function of the header has a row.
    std::set<std::string> covered;
    for (const Row& row : table) covered.insert(row.function);
    for (const std::string& name : declared()) {
        CAPTURE(name);
        CHECK(covered.count(name) == 1);
    }
    CHECK(declared().size() > 60);
}

TEST_CASE("c bad inputs: refusals on a callbacks backend leave the runtime as it was", "[c_bad_inputs]") {
    Fake fake(1);
    Stager stager = stager_of(fake.backend.get());
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(fake.backend.get(), &stream));
    std::vector<unsigned char> host(64, 1);
    const devstage_tensor_arg huge_arg[] = {arg(host.data(), SIZE_MAX, DEVSTAGE_IN)};
    devstage_run* run = nullptr;
    CHECK(devstage_bind_on(stager.get(), huge_arg, 1, stream, &run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(devstage_bind_on(stager.get(), huge_arg, SIZE_MAX, stream, &run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(run == nullptr);
    CHECK(fake_device_live_device(fake.device) == 0);
    Tensors t(100);
    C_OK(run_once(fake.backend.get(), stager.get(), t, &stream));
    CHECK(t.expected());
    stager.reset();
    C_OK(devstage_stream_destroy(fake.backend.get(), stream));
}
