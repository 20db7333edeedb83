// SPDX-License-Identifier: Apache-2.0
// The C interface's checked handles and what came with them: a destroyed, used-up, made-up or
// wrong-kind handle of every kind is invalid_argument naming the kind, the value and the call
// (an old handle never reaches a new object: ABA); streams and events belong to their backend
// (adopted streams included, never destroyed by devstage); the backend's device, synchronize,
// host functions, host memory pinned in place, order_after_uploads, abandon, a completion's
// pending state, and every StagerStats counter.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "c_support.hpp"
#include "devstage/c/devstage.h"
#include "fake_device.h"

using namespace devstage::c_test;  // NOLINT(google-build-using-namespace): the shared helpers

namespace {

bool says(const std::string& text) {
    INFO("last message: " << last());
    return last().find(text) != std::string::npos;
}

// The value of a handle in messages, as the library writes it.
std::string hex(const void* handle) {
    char text[32];
    std::snprintf(text, sizeof text, "0x%llx",
                  static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(handle)));
    return text;
}

// A CUDA backend over the stand-in runtime, or null (with a warning) where it is not given.
devstage_backend* cuda_shim(int device = 0) {
    const char* path = std::getenv("DEVSTAGE_C_TEST_CUDART");
    if (path == nullptr) {
        WARN("DEVSTAGE_C_TEST_CUDART is not set: the CUDA part is skipped");
        return nullptr;
    }
    devstage_backend* made = nullptr;
    C_OK(devstage_backend_create_cuda(device, path, &made));
    return made;
}
devstage_backend* ascend_shim() {
    const char* path = std::getenv("DEVSTAGE_C_TEST_ACL");
    if (path == nullptr) {
        WARN("DEVSTAGE_C_TEST_ACL is not set: the Ascend part is skipped");
        return nullptr;
    }
    devstage_backend* made = nullptr;
    C_OK(devstage_backend_create_ascend(0, path, &made));
    return made;
}

// Appends `value` to the log of a host function's user data.
struct Log {
    std::vector<int> order;
    int next = 0;
};
void log_call(void* user) {
    auto* log = static_cast<Log*>(user);
    log->order.push_back(log->next++);
}

}  // namespace

TEST_CASE("c handles: a destroyed or used-up handle of every kind names its kind, value and call", "[c_handles]") {
    Backend backend = sim();
    devstage_stager_config config{};
    config.pack_limit = DEVSTAGE_PACK_LIMIT_4K;
    devstage_stager* stager = nullptr;
    C_OK(devstage_stager_create(backend.get(), &config, &stager));
    Tensors t(64);
    std::vector<devstage_tensor_arg> args = t.args();

    // A run finished twice: the second finish reads nothing of the first (valgrind-clean).
    devstage_run* run = nullptr;
    C_OK(devstage_bind(stager, args.data(), args.size(), &run));
    C_OK(devstage_finish(stager, run, DEVSTAGE_OK));
    CHECK(devstage_finish(stager, run, DEVSTAGE_OK) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_finish: run handle " + hex(run) + " was finished or destroyed");
    CHECK(devstage_run_destroy(run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("devstage_run_destroy: run handle"));
    std::size_t slot = 0;
    CHECK(devstage_run_slot(run, &slot) == DEVSTAGE_INVALID_ARGUMENT);

    // A completion destroyed.
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(backend.get(), &stream));
    C_OK(devstage_bind_on(stager, args.data(), args.size(), stream, &run));
    devstage_completion* done = nullptr;
    C_OK(devstage_finish_on(stager, run, stream, DEVSTAGE_OK, &done));
    C_OK(devstage_completion_destroy(done));
    CHECK(devstage_completion_wait(done) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_completion_wait: completion handle " + hex(done) + " was destroyed");
    CHECK(devstage_completion_destroy(done) == DEVSTAGE_INVALID_ARGUMENT);

    // A frame destroyed.
    const devstage_tensor_shape shapes[] = {{64, DEVSTAGE_IN, nullptr}};
    devstage_frame* frame = nullptr;
    C_OK(devstage_frame_create(stager, shapes, 1, &frame));
    C_OK(devstage_frame_destroy(frame));
    void* data = nullptr;
    std::size_t bytes = 0;
    CHECK(devstage_frame_host(frame, 0, &data, &bytes) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_frame_host: frame handle " + hex(frame) + " was destroyed");

    // A stream and an event destroyed.
    C_OK(devstage_stream_destroy(backend.get(), stream));
    CHECK(devstage_stream_synchronize(backend.get(), stream) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_stream_synchronize: stream handle " + hex(stream) + " was destroyed");
    devstage_event event = nullptr;
    C_OK(devstage_event_create(backend.get(), &event));
    C_OK(devstage_event_destroy(backend.get(), event));
    CHECK(devstage_event_synchronize(backend.get(), event) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("event handle " + hex(event) + " was destroyed"));

    // A stager destroyed: a bind on it is refused, not a crash.
    C_OK(devstage_stager_destroy(stager));
    CHECK(devstage_bind(stager, args.data(), args.size(), &run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(run == nullptr);
    CHECK(last() == "devstage_bind: stager handle " + hex(stager) + " was destroyed");
    CHECK(devstage_stager_destroy(stager) == DEVSTAGE_INVALID_ARGUMENT);

    // A pool and a backend destroyed.
    devstage_pinned_pool* pool = nullptr;
    C_OK(devstage_pinned_pool_create(backend.get(), 0, &pool));
    C_OK(devstage_pinned_pool_destroy(pool));
    void* host = nullptr;
    CHECK(devstage_pinned_pool_allocate(pool, 64, &host) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("pinned pool handle " + hex(pool) + " was destroyed"));
    devstage_backend* gone = backend.release();
    C_OK(devstage_backend_destroy(gone));
    CHECK(devstage_device_malloc(gone, 64, &host) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_device_malloc: backend handle " + hex(gone) + " was destroyed");
    CHECK(devstage_backend_destroy(gone) == DEVSTAGE_INVALID_ARGUMENT);
}

TEST_CASE("c handles: a handle of another kind, or a value never handed out, is refused", "[c_handles]") {
    Backend backend = sim();
    Stager stager = stager_of(backend.get());
    Tensors t(64);
    std::vector<devstage_tensor_arg> args = t.args();
    devstage_run* run = nullptr;
    CHECK(devstage_bind_on(stager.get(), args.data(), args.size(), nullptr, &run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_bind_on: stream is NULL");
    C_OK(devstage_bind(stager.get(), args.data(), args.size(), &run));
    // A completion where a stager is needed, a run where a stream is, a backend where a stager is.
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(backend.get(), &stream));
    devstage_completion* done = nullptr;
    CHECK(devstage_finish_on(stager.get(), run, reinterpret_cast<devstage_stream>(run), DEVSTAGE_OK, &done) ==
          DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_finish_on: a run handle was given where a stream handle is needed");
    CHECK(done == nullptr);
    devstage_run* refused = nullptr;
    CHECK(devstage_bind(reinterpret_cast<devstage_stager*>(backend.get()), args.data(), args.size(), &refused) ==
          DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_bind: a backend handle was given where a stager handle is needed");
    // The run is untouched by the refusals above.
    C_OK(devstage_finish_on(stager.get(), run, stream, DEVSTAGE_OK, &done));
    CHECK(devstage_bind(reinterpret_cast<devstage_stager*>(done), args.data(), args.size(), &refused) ==
          DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_bind: a completion handle was given where a stager handle is needed");
    CHECK(devstage_completion_wait(reinterpret_cast<devstage_completion*>(stream)) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_completion_wait: a stream handle was given where a completion handle is needed");
    C_OK(devstage_completion_destroy(done));
    C_OK(devstage_stream_destroy(backend.get(), stream));
    // Made-up values: an address, a small number, a value with the right tag but never issued.
    alignas(256) static unsigned char object[256];  // an address whose low byte is no handle's tag
    for (const std::uintptr_t value : {reinterpret_cast<std::uintptr_t>(&object[0]), std::uintptr_t{1},
                                       (std::uintptr_t{0x7777} << 32) | (std::uintptr_t{0x00ABCD} << 8) | 0xD2}) {
        auto* made_up = reinterpret_cast<devstage_stager*>(value);
        CHECK(devstage_stager_release(made_up) == DEVSTAGE_INVALID_ARGUMENT);
        CHECK(last() ==
              "devstage_stager_release: " + hex(made_up) + " is not a stager handle (devstage never handed it out)");
    }
}

TEST_CASE("c handles: an old handle never reaches a new object (ABA)", "[c_handles]") {
    Backend backend = sim();
    devstage_stager_config config{};
    config.pack_limit = DEVSTAGE_PACK_LIMIT_4K;
    const devstage_tensor_shape shapes[] = {{64, DEVSTAGE_IN_OUT, nullptr}};
    devstage_stager* first = nullptr;
    C_OK(devstage_stager_create(backend.get(), &config, &first));
    devstage_frame* frame = nullptr;
    C_OK(devstage_frame_create(first, shapes, 1, &frame));
    void* data = nullptr;
    std::size_t bytes = 0;
    C_OK(devstage_frame_host(frame, 0, &data, &bytes));
    C_OK(devstage_stager_destroy(first));
    // The frame's memory went with its stager: it is refused, not read.
    CHECK(devstage_frame_host(frame, 0, &data, &bytes) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("the frame's stager was destroyed"));
    // Many stagers made and destroyed: none gets the old handle's value, and none accepts the
    // old frame (whose stager object may sit at the same address as a new one).
    for (int i = 0; i < 3000; ++i) {
        devstage_stager* next = nullptr;
        C_OK(devstage_stager_create(backend.get(), &config, &next));
        CHECK(next != first);
        devstage_run* run = nullptr;
        REQUIRE(devstage_bind_frame(next, frame, &run) == DEVSTAGE_INVALID_ARGUMENT);
        CHECK(run == nullptr);
        REQUIRE(devstage_stager_release(first) == DEVSTAGE_INVALID_ARGUMENT);
        C_OK(devstage_stager_destroy(next));
    }
    CHECK(devstage_stager_release(first) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("stager handle " + hex(first) + " was destroyed"));
    devstage_stager* other = nullptr;
    C_OK(devstage_stager_create(backend.get(), &config, &other));
    devstage_run* run = nullptr;
    CHECK(devstage_bind_frame(other, frame, &run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_bind_frame: the frame belongs to another stager (or to one that was destroyed)");
    C_OK(devstage_frame_destroy(frame));
    C_OK(devstage_stager_destroy(other));
}

TEST_CASE("c handles: a frame handle never hands out memory that is another's or freed", "[c_handles]") {
    Backend backend = sim();
    devstage_stager_config config{};
    config.pack_limit = DEVSTAGE_PACK_LIMIT_4K;
    Stager stager = stager_of(backend.get(), &config);  // one slot: every frame and bind takes it
    const devstage_tensor_shape shapes[] = {{256, DEVSTAGE_IN, nullptr}, {256, DEVSTAGE_OUT, nullptr}};
    void* data = nullptr;
    std::size_t bytes = 0;
    // devstage_frame_host and devstage_frame_hosts answer alike, or refuse alike.
    const auto answers = [&](devstage_frame* frame) {
        void* all[2] = {&data, &data};
        std::size_t sizes[2] = {1, 1};
        const bool each = devstage_frame_host(frame, 1, &data, &bytes) == DEVSTAGE_OK;
        const std::string why = last();
        const bool both = devstage_frame_hosts(frame, all, sizes, 2) == DEVSTAGE_OK;
        CHECK(each == both);
        CHECK(all[1] == data);
        CHECK(sizes[1] == bytes);
        if (!each) {
            CHECK(all[0] == nullptr);
            CHECK(last().substr(std::strlen("devstage_frame_hosts")) == why.substr(std::strlen("devstage_frame_host")));
        }
        return each;
    };
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(backend.get(), &stream));
    std::vector<unsigned char> in(256, 5);
    const devstage_tensor_arg args[] = {arg(in.data(), in.size(), DEVSTAGE_IN)};

    // A synchronous finish: the outputs are read through the frame until the slot is taken again.
    devstage_frame* frame = nullptr;
    devstage_run* run = nullptr;
    C_OK(devstage_frame_create(stager.get(), shapes, 2, &frame));
    C_OK(devstage_bind_frame(stager.get(), frame, &run));
    CHECK(answers(frame));
    std::size_t frame_slot = 9, run_slot = 8;
    C_OK(devstage_frame_slot(frame, &frame_slot));
    C_OK(devstage_run_slot(run, &run_slot));
    CHECK(frame_slot == run_slot);
    C_OK(devstage_finish(stager.get(), run, DEVSTAGE_OK));
    CHECK(answers(frame));
    C_OK(devstage_bind(stager.get(), args, 1, &run));  // packed: through the same mirror
    CHECK_FALSE(answers(frame));
    CHECK(says("devstage_frame_hosts: the frame's memory was given back"));
    CHECK(data == nullptr);
    C_OK(devstage_finish(stager.get(), run, DEVSTAGE_OK));
    C_OK(devstage_frame_destroy(frame));

    // A finish on a stream: the frame answers while its completion lives and after, until the
    // next frame takes the slot.
    C_OK(devstage_frame_create(stager.get(), shapes, 2, &frame));
    C_OK(devstage_bind_frame_on(stager.get(), frame, stream, &run));
    devstage_completion* done = nullptr;
    C_OK(devstage_finish_on(stager.get(), run, stream, DEVSTAGE_OK, &done));
    CHECK(answers(frame));
    C_OK(devstage_completion_destroy(done));
    CHECK(answers(frame));
    devstage_frame* next = nullptr;
    C_OK(devstage_frame_create(stager.get(), shapes, 2, &next));
    CHECK_FALSE(answers(frame));
    CHECK(answers(next));
    C_OK(devstage_frame_destroy(frame));

    // Released, reserved or abandoned after its run ended: the memory went back, so it is refused.
    C_OK(devstage_bind_frame(stager.get(), next, &run));
    C_OK(devstage_finish(stager.get(), run, DEVSTAGE_OK));
    CHECK(answers(next));
    C_OK(devstage_stager_release(stager.get()));
    CHECK_FALSE(answers(next));
    CHECK(says("devstage_frame_hosts: the frame's memory was given back"));
    C_OK(devstage_frame_destroy(next));
    for (const bool abandon : {false, true}) {
        C_OK(devstage_frame_create(stager.get(), shapes, 2, &frame));
        C_OK(devstage_bind_frame(stager.get(), frame, &run));
        C_OK(devstage_finish(stager.get(), run, DEVSTAGE_OK));
        if (abandon) {
            C_OK(devstage_stager_abandon(stager.get()));
        } else {
            C_OK(devstage_stager_reserve(stager.get(), 1 << 20));
        }
        CHECK_FALSE(answers(frame));
        C_OK(devstage_frame_destroy(frame));
    }
    C_OK(devstage_stream_destroy(backend.get(), stream));
}

TEST_CASE("c handles: a run, frame or stream of another stager or backend is refused, naming both", "[c_handles]") {
    Backend one = sim();
    Backend two = sim();
    Stager stager = stager_of(one.get());
    Stager other = stager_of(one.get());
    devstage_stream mine = nullptr, theirs = nullptr;
    C_OK(devstage_stream_create(one.get(), &mine));
    C_OK(devstage_stream_create(two.get(), &theirs));
    Tensors t(256);
    std::vector<devstage_tensor_arg> args = t.args();
    devstage_run* run = nullptr;
    CHECK(devstage_bind_on(stager.get(), args.data(), args.size(), theirs, &run) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(run == nullptr);
    INFO(last());
    CHECK(says("devstage_bind_on: a stream of backend 'sim' #"));
    CHECK(says(" given to a stager of backend 'sim' #"));
    C_OK(devstage_bind_on(stager.get(), args.data(), args.size(), mine, &run));
    devstage_completion* done = nullptr;
    CHECK(devstage_finish_on(stager.get(), run, theirs, DEVSTAGE_OK, &done) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(devstage_order_after_uploads(stager.get(), run, theirs) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(devstage_finish_on(other.get(), run, mine, DEVSTAGE_OK, &done) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_finish_on: the run belongs to another stager (or to one that was destroyed)");
    CHECK(devstage_order_after_uploads(other.get(), run, mine) == DEVSTAGE_INVALID_ARGUMENT);
    // The backend's own operations and the pool check too.
    void* device = nullptr;
    C_OK(devstage_device_malloc(one.get(), 256, &device));
    CHECK(devstage_copy_to_device_async(one.get(), device, t.in.data(), 256, theirs) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("a stream of backend 'sim' #"));
    CHECK(says(" given to backend 'sim' #"));
    devstage_event event = nullptr;
    C_OK(devstage_event_create(two.get(), &event));
    CHECK(devstage_event_record(one.get(), event, mine) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("an event of backend 'sim' #"));
    CHECK(devstage_stream_wait_event(two.get(), theirs, event) == DEVSTAGE_OK);
    CHECK(devstage_event_destroy(one.get(), event) == DEVSTAGE_INVALID_ARGUMENT);
    C_OK(devstage_event_destroy(two.get(), event));
    devstage_pinned_pool* pool = nullptr;
    C_OK(devstage_pinned_pool_create(one.get(), 0, &pool));
    void* host = nullptr;
    C_OK(devstage_pinned_pool_allocate(pool, 64, &host));
    // A pool takes another backend's (another device's) stream: recorded with that backend.
    C_OK(devstage_pinned_pool_record(pool, host, theirs));
    C_OK(devstage_pinned_pool_record(pool, host, mine));
    C_OK(devstage_pinned_pool_free(pool, host));
    // Nothing above touched the run.
    C_OK(devstage_stream_synchronize(one.get(), mine));
    C_OK(kernel(one.get(), run, 256));
    C_OK(devstage_finish_on(stager.get(), run, mine, DEVSTAGE_OK, &done));
    C_OK(devstage_completion_wait(done));
    C_OK(devstage_completion_destroy(done));
    CHECK(t.expected());
    C_OK(devstage_device_free(one.get(), device));
    // A stream needs its backend's handle: that handle is not destroyed before it.
    CHECK(devstage_stream_destroy(two.get(), mine) == DEVSTAGE_INVALID_ARGUMENT);
    devstage_backend* two_handle = two.release();
    CHECK(devstage_backend_destroy(two_handle) == DEVSTAGE_BUSY);
    CHECK(says("1 stream(s) and 0 event(s) not destroyed yet"));
    C_OK(devstage_stream_destroy(two_handle, theirs));
    C_OK(devstage_backend_destroy(two_handle));
    // The pool kept backend two for its event: it still waits for it, then lets go.
    C_OK(devstage_pinned_pool_trim(pool));
    C_OK(devstage_pinned_pool_destroy(pool));
    stager.reset();
    C_OK(devstage_stream_destroy(one.get(), mine));
}

TEST_CASE("c handles: a refused finish leaves the run live, whatever refused it", "[c_handles]") {
    devstage_backend* zero = cuda_shim(0);
    if (zero == nullptr) return;
    devstage_backend* one = cuda_shim(1);
    devstage_stream mine = nullptr, theirs = nullptr, adopted = nullptr;
    C_OK(devstage_stream_create(zero, &mine));
    C_OK(devstage_stream_create(one, &theirs));
    void* native = nullptr;
    C_OK(devstage_stream_native(theirs, &native));
    // Device 1's stream wrapped through device 0's backend: the handle is device 0's, the stream
    // is not, and only the stager's stream check tells.
    C_OK(devstage_stream_adopt(zero, native, &adopted));
    devstage_stager* stager = nullptr;
    devstage_stager* other = nullptr;
    C_OK(devstage_stager_create(zero, nullptr, &stager));
    C_OK(devstage_stager_create(zero, nullptr, &other));
    Tensors t(512);
    std::vector<devstage_tensor_arg> args = t.args();
    devstage_run* run = nullptr;
    C_OK(devstage_bind_on(stager, args.data(), args.size(), mine, &run));
    devstage_completion* done = nullptr;
    auto* bogus = reinterpret_cast<devstage_stream>(std::uintptr_t{0x1234});
    CHECK(devstage_finish_on(stager, run, adopted, DEVSTAGE_OK, &done) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("device 1"));
    CHECK(devstage_finish_on(stager, run, bogus, DEVSTAGE_OK, &done) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(devstage_finish_on(other, run, mine, DEVSTAGE_OK, &done) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(devstage_finish(other, run, DEVSTAGE_OK) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(done == nullptr);
    // The run is as it was: its device args, a kernel, and a finish on its own stream that
    // copies back.
    C_OK(devstage_stream_synchronize(zero, mine));
    C_OK(kernel(zero, run, 512));
    C_OK(devstage_finish_on(stager, run, mine, DEVSTAGE_OK, &done));
    C_OK(devstage_completion_wait(done));
    C_OK(devstage_completion_destroy(done));
    CHECK(t.expected());
    // A finish that was not refused consumes the run, whatever it returned.
    CHECK(devstage_run_destroy(run) == DEVSTAGE_INVALID_ARGUMENT);
    C_OK(devstage_stager_destroy(other));
    C_OK(devstage_stager_destroy(stager));
    C_OK(devstage_stream_destroy(zero, adopted));
    C_OK(devstage_stream_destroy(zero, mine));
    C_OK(devstage_stream_destroy(one, theirs));
    C_OK(devstage_backend_destroy(one));
    C_OK(devstage_backend_destroy(zero));
}

TEST_CASE("c handles: streams adopted from the runtime, never destroyed by devstage", "[c_handles]") {
    Backend backend = sim();
    devstage_stream made = nullptr;
    C_OK(devstage_stream_create(backend.get(), &made));
    void* native = nullptr;
    C_OK(devstage_stream_native(made, &native));
    CHECK(native != nullptr);
    devstage_stream adopted = nullptr;
    C_OK(devstage_stream_adopt(backend.get(), native, &adopted));
    CHECK(adopted != made);
    void* same = nullptr;
    C_OK(devstage_stream_native(adopted, &same));
    CHECK(same == native);
    // A run on the adopted stream, then its handle goes: the stream it wraps stays usable.
    Stager stager = stager_of(backend.get());
    Tensors t(512);
    C_OK(run_once(backend.get(), stager.get(), t, &adopted));
    CHECK(t.expected());
    C_OK(devstage_stream_destroy(backend.get(), adopted));
    Tensors again(512);
    C_OK(run_once(backend.get(), stager.get(), again, &made));
    CHECK(again.expected());
    // The simulator has no default stream, and knows its streams.
    CHECK(devstage_stream_adopt(backend.get(), nullptr, &adopted) == DEVSTAGE_NOT_SUPPORTED);
    CHECK(adopted == nullptr);
    CHECK(devstage_stream_adopt(backend.get(), reinterpret_cast<void*>(std::uintptr_t{999}), &adopted) ==
          DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("is not one of its live streams"));
    stager.reset();
    C_OK(devstage_stream_destroy(backend.get(), made));
    CHECK(devstage_stream_adopt(backend.get(), native, &adopted) == DEVSTAGE_INVALID_ARGUMENT);  // destroyed

    // Callbacks without streams: only devstage's own immediate streams; with streams, any
    // value of the runtime's. Neither has a default stream.
    Fake immediate(0), deferred(1);
    devstage_stream own = nullptr;
    C_OK(devstage_stream_create(immediate.backend.get(), &own));
    C_OK(devstage_stream_native(own, &native));
    C_OK(devstage_stream_adopt(immediate.backend.get(), native, &adopted));
    C_OK(devstage_stream_destroy(immediate.backend.get(), adopted));
    C_OK(devstage_stream_destroy(immediate.backend.get(), own));
    CHECK(devstage_stream_adopt(immediate.backend.get(), native, &adopted) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(devstage_stream_adopt(deferred.backend.get(), nullptr, &adopted) == DEVSTAGE_NOT_SUPPORTED);
    C_OK(devstage_stream_create(deferred.backend.get(), &own));
    C_OK(devstage_stream_native(own, &native));
    C_OK(devstage_stream_adopt(deferred.backend.get(), native, &adopted));
    C_OK(devstage_stream_destroy(deferred.backend.get(), adopted));
    CHECK(fake_device_live_streams(deferred.device) == 1);  // adopting, then dropping, destroyed nothing
    C_OK(devstage_stream_destroy(deferred.backend.get(), own));
    CHECK(fake_device_live_streams(deferred.device) == 0);

    // CUDA: null is the legacy default stream.
    if (devstage_backend* cuda = cuda_shim()) {
        Backend owned(cuda);
        C_OK(devstage_stream_adopt(cuda, nullptr, &adopted));
        C_OK(devstage_stream_native(adopted, &native));
        CHECK(native == nullptr);
        Stager on_cuda = stager_of(cuda);
        Tensors legacy(256);
        C_OK(run_once(cuda, on_cuda.get(), legacy, &adopted));
        CHECK(legacy.expected());
        on_cuda.reset();
        C_OK(devstage_stream_destroy(cuda, adopted));
    }
}

TEST_CASE("c handles: which runtime and device a backend is", "[c_handles]") {
    int kind = -1, device = -1;
    Backend simulator = sim();
    C_OK(devstage_backend_device(simulator.get(), &kind, &device));
    CHECK(kind == DEVSTAGE_BACKEND_SIM);
    CHECK(device == 0);
    Fake fake(1);
    C_OK(devstage_backend_device(fake.backend.get(), &kind, &device));
    CHECK(kind == DEVSTAGE_BACKEND_CALLBACKS);
    CHECK(device == 0);
    if (devstage_backend* cuda = cuda_shim(1)) {
        Backend owned(cuda);
        C_OK(devstage_backend_device(cuda, &kind, &device));
        CHECK(kind == DEVSTAGE_BACKEND_CUDA);
        CHECK(device == 1);
    }
    if (devstage_backend* ascend = ascend_shim()) {
        Backend owned(ascend);
        C_OK(devstage_backend_device(ascend, &kind, &device));
        CHECK(kind == DEVSTAGE_BACKEND_ASCEND);
        CHECK(device == 0);
    }
    CHECK(devstage_backend_device(simulator.get(), nullptr, &device) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_backend_device: kind is NULL");
}

TEST_CASE("c handles: host functions run in stream order", "[c_handles]") {
    // The simulator: after the copy enqueued before it, before the one after it.
    Backend backend = sim();
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(backend.get(), &stream));
    Log log;
    for (int i = 0; i < 16; ++i) C_OK(devstage_launch_host_function(backend.get(), stream, log_call, &log));
    C_OK(devstage_stream_synchronize(backend.get(), stream));
    REQUIRE(log.order.size() == 16);
    CHECK(std::is_sorted(log.order.begin(), log.order.end()));
    CHECK(devstage_launch_host_function(backend.get(), stream, nullptr, &log) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(last() == "devstage_launch_host_function: fn is NULL");
    C_OK(devstage_stream_destroy(backend.get(), stream));

    // Deferred callbacks: the function runs when the stream's work runs, in order with it.
    Fake deferred(1);
    C_OK(devstage_stream_create(deferred.backend.get(), &stream));
    Log later;
    C_OK(devstage_launch_host_function(deferred.backend.get(), stream, log_call, &later));
    CHECK(later.order.empty());  // enqueued, not run
    C_OK(devstage_stream_synchronize(deferred.backend.get(), stream));
    CHECK(later.order.size() == 1);
    C_OK(devstage_stream_destroy(deferred.backend.get(), stream));
    // Without the callback: not supported; without streams: at once.
    fake_device* bare = fake_device_create(1 << 20, 1);
    devstage_callbacks callbacks;
    fake_device_callbacks(bare, &callbacks);
    callbacks.launch_host_function = nullptr;
    devstage_backend* without = nullptr;
    C_OK(devstage_backend_create_callbacks(&callbacks, &without));
    C_OK(devstage_stream_create(without, &stream));
    CHECK(devstage_launch_host_function(without, stream, log_call, &later) == DEVSTAGE_NOT_SUPPORTED);
    CHECK(says("no launch_host_function callback"));
    C_OK(devstage_stream_destroy(without, stream));
    C_OK(devstage_backend_destroy(without));
    fake_device_destroy(bare);
    Fake immediate(0);
    C_OK(devstage_stream_create(immediate.backend.get(), &stream));
    C_OK(devstage_launch_host_function(immediate.backend.get(), stream, log_call, &later));
    CHECK(later.order.size() == 2);
    C_OK(devstage_stream_destroy(immediate.backend.get(), stream));
    // A stream group without streams cannot have the callback.
    fake_device* streamless = fake_device_create(1 << 20, 0);
    fake_device_callbacks(streamless, &callbacks);
    callbacks.launch_host_function = [](void*, void*, devstage_host_function, void*) { return 0; };
    CHECK(devstage_backend_create_callbacks(&callbacks, &without) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("launch_host_function needs the stream callbacks"));
    fake_device_destroy(streamless);

    // CUDA through cudaLaunchHostFunc; Ascend has none.
    if (devstage_backend* cuda = cuda_shim()) {
        Backend owned(cuda);
        C_OK(devstage_stream_create(cuda, &stream));
        Log on_cuda;
        C_OK(devstage_launch_host_function(cuda, stream, log_call, &on_cuda));
        C_OK(devstage_stream_synchronize(cuda, stream));
        CHECK(on_cuda.order.size() == 1);
        C_OK(devstage_stream_destroy(cuda, stream));
    }
    if (devstage_backend* ascend = ascend_shim()) {
        Backend owned(ascend);
        C_OK(devstage_stream_create(ascend, &stream));
        CHECK(devstage_launch_host_function(ascend, stream, log_call, &later) == DEVSTAGE_NOT_SUPPORTED);
        CHECK(says("has no host functions"));
        C_OK(devstage_stream_destroy(ascend, stream));
    }
}

TEST_CASE("c handles: order_after_uploads orders a kernel stream after the bind", "[c_handles]") {
    Backend backend = sim();
    devstage_stream copies = nullptr, compute = nullptr;
    C_OK(devstage_stream_create(backend.get(), &copies));
    C_OK(devstage_stream_create(backend.get(), &compute));
    Stager stager = stager_of(backend.get());
    for (int step = 0; step < 8; ++step) {
        Tensors t(4096);
        std::vector<devstage_tensor_arg> args = t.args();
        devstage_run* run = nullptr;
        C_OK(devstage_bind_on(stager.get(), args.data(), args.size(), copies, &run));
        C_OK(devstage_order_after_uploads(stager.get(), run, compute));
        // The kernel, as a host function on the compute stream, reads what the bind uploaded.
        struct Kernel {
            devstage_backend* backend;
            void* device[3];
            devstage_status status;
        } k{backend.get(), {}, DEVSTAGE_BACKEND_FAILURE};
        C_OK(devstage_run_device_args(run, k.device, 3));
        C_OK(devstage_launch_host_function(
            backend.get(), compute,
            [](void* user) {
                auto* call = static_cast<Kernel*>(user);
                call->status = kernel_on(call->backend, call->device, 4096);
            },
            &k));
        devstage_completion* done = nullptr;
        C_OK(devstage_finish_on(stager.get(), run, compute, DEVSTAGE_OK, &done));
        C_OK(devstage_completion_wait(done));
        C_OK(devstage_completion_destroy(done));
        C_OK(k.status);
        CHECK(t.expected());
    }
    stager.reset();
    C_OK(devstage_stream_destroy(backend.get(), copies));
    C_OK(devstage_stream_destroy(backend.get(), compute));
}

TEST_CASE("c handles: host memory pinned in place", "[c_handles]") {
    std::vector<unsigned char> memory(3 * 4096 + 4096);
    auto* host =
        reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(memory.data()) + 4095) / 4096 * 4096);
    const auto checks = [&](devstage_backend* backend, devstage_status unknown) {
        C_OK(devstage_host_register(backend, host, 2 * 4096));
        CHECK(devstage_host_register(backend, host, 2 * 4096) != DEVSTAGE_OK);
        CHECK(devstage_host_register(backend, host + 4096, 4096) != DEVSTAGE_OK);  // overlapping
        CHECK(devstage_host_register(backend, nullptr, 64) == DEVSTAGE_INVALID_ARGUMENT);
        CHECK(devstage_host_register(backend, host + 2 * 4096, 0) == DEVSTAGE_INVALID_ARGUMENT);
        C_OK(devstage_host_register(backend, host + 2 * 4096, 4096));
        // A stager copies through registered memory as through any other.
        Stager stager = stager_of(backend);
        std::memset(host, 5, 3 * 4096);
        const devstage_tensor_arg args[] = {arg(host, 3 * 4096, DEVSTAGE_IN_OUT)};
        devstage_run* run = nullptr;
        C_OK(devstage_bind(stager.get(), args, 1, &run));
        C_OK(devstage_finish(stager.get(), run, DEVSTAGE_OK));
        CHECK(host[3 * 4096 - 1] == 5);
        C_OK(devstage_host_unregister(backend, host));
        CHECK(devstage_host_unregister(backend, host) == unknown);
        C_OK(devstage_host_unregister(backend, host + 2 * 4096));
    };
    Backend simulator = sim();
    checks(simulator.get(), DEVSTAGE_UNKNOWN_POINTER);
    CHECK(devstage_host_register(simulator.get(), host, 2 * 4096) == DEVSTAGE_OK);
    CHECK(devstage_host_register(simulator.get(), host, 4096) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("registered already"));
    C_OK(devstage_host_unregister(simulator.get(), host));
    CHECK(devstage_host_unregister(simulator.get(), host + 8) == DEVSTAGE_UNKNOWN_POINTER);
    Fake fake(1);
    checks(fake.backend.get(), DEVSTAGE_BACKEND_FAILURE);  // the callback's -22
    CHECK(fake_device_registered(fake.device) == 0);
    if (devstage_backend* cuda = cuda_shim()) {
        Backend owned(cuda);
        checks(cuda, DEVSTAGE_UNKNOWN_POINTER);
    }
    if (devstage_backend* ascend = ascend_shim()) {
        Backend owned(ascend);
        CHECK(devstage_host_register(ascend, host, 4096) == DEVSTAGE_NOT_SUPPORTED);
        CHECK(devstage_host_unregister(ascend, host) == DEVSTAGE_NOT_SUPPORTED);
    }
    // Half of the pair is refused at creation; none of it is not supported.
    fake_device* device = fake_device_create(1 << 20, 0);
    devstage_callbacks callbacks;
    fake_device_callbacks(device, &callbacks);
    callbacks.host_unregister = nullptr;
    devstage_backend* made = nullptr;
    CHECK(devstage_backend_create_callbacks(&callbacks, &made) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("needs both host_register and host_unregister; missing host_unregister"));
    callbacks.host_register = nullptr;
    C_OK(devstage_backend_create_callbacks(&callbacks, &made));
    CHECK(devstage_host_register(made, host, 64) == DEVSTAGE_NOT_SUPPORTED);
    C_OK(devstage_backend_destroy(made));
    fake_device_destroy(device);
}

TEST_CASE("c handles: the device-wide synchronize, abandon and a completion's pending state", "[c_handles]") {
    Backend simulator = sim();
    C_OK(devstage_backend_synchronize(simulator.get()));
    Fake immediate(0);
    C_OK(devstage_backend_synchronize(immediate.backend.get()));  // nothing runs asynchronously
    Fake deferred(1), unsynchronized(1, std::size_t{1} << 30, true, false);
    CHECK(devstage_backend_synchronize(unsynchronized.backend.get()) == DEVSTAGE_NOT_SUPPORTED);
    CHECK(says("no synchronize callback"));

    Stager stager = stager_of(deferred.backend.get());
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(deferred.backend.get(), &stream));
    Tensors t(128);
    std::vector<devstage_tensor_arg> args = t.args();
    devstage_run* run = nullptr;
    C_OK(devstage_bind_on(stager.get(), args.data(), args.size(), stream, &run));
    devstage_completion* done = nullptr;
    C_OK(devstage_finish_on(stager.get(), run, stream, DEVSTAGE_OK, &done));
    int pending = -1;
    C_OK(devstage_completion_pending(done, &pending));
    CHECK(pending == 1);  // deferred: nothing ran yet
    CHECK(fake_device_pending(deferred.device) > 0);
    C_OK(devstage_backend_synchronize(deferred.backend.get()));
    CHECK(fake_device_pending(deferred.device) == 0);
    C_OK(devstage_completion_wait(done));
    C_OK(devstage_completion_pending(done, &pending));
    CHECK(pending == 0);
    C_OK(devstage_completion_destroy(done));

    // Abandon: the live run becomes inert, a pending completion resolves with a failure, the
    // stager stays usable.
    C_OK(devstage_bind_on(stager.get(), args.data(), args.size(), stream, &run));
    devstage_run* live = nullptr;
    devstage_stager_config two{};
    two.pipeline_slots = 2;
    Stager slots = stager_of(deferred.backend.get(), &two);
    C_OK(devstage_bind_on(slots.get(), args.data(), args.size(), stream, &live));
    C_OK(devstage_finish_on(stager.get(), run, stream, DEVSTAGE_OK, &done));
    C_OK(devstage_stager_abandon(stager.get()));
    C_OK(devstage_completion_pending(done, &pending));
    CHECK(pending == 0);
    CHECK(devstage_completion_wait(done) == DEVSTAGE_BACKEND_FAILURE);
    CHECK(says("forgotten"));
    CHECK(devstage_completion_destroy(done) == DEVSTAGE_OK);  // waited already
    C_OK(devstage_stager_abandon(slots.get()));
    void* device[3] = {};
    CHECK(devstage_run_device_args(live, device, 3) == DEVSTAGE_INVALID_ARGUMENT);
    CHECK(says("not live"));
    C_OK(devstage_run_destroy(live));
    // What the abandoned stagers held is the device's to reclaim: synchronize, then the stagers
    // are used again.
    C_OK(devstage_backend_synchronize(deferred.backend.get()));
    Tensors after(128);
    C_OK(run_once(deferred.backend.get(), stager.get(), after, &stream));
    CHECK(after.expected());
    stager.reset();
    slots.reset();
    C_OK(devstage_stream_destroy(deferred.backend.get(), stream));
    // Abandoned buffers and events were never freed through the backend: its end frees and
    // reports them.
    CHECK(fake_device_live_events(deferred.device) > 0);
    CHECK(devstage_backend_destroy(deferred.backend.release()) == DEVSTAGE_LEAKED);
    CHECK(says("event(s) never destroyed (devstage destroyed them now)"));
}

TEST_CASE("c handles: the stats carry every StagerStats counter, batches included", "[c_handles]") {
    STATIC_REQUIRE(sizeof(devstage_stager_stats) == 45 * sizeof(std::uint64_t));
    devstage_backend* cuda = cuda_shim();
    if (cuda == nullptr) return;
    Backend owned(cuda);
    Stager stager = stager_of(cuda);
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(cuda, &stream));
    Tensors t(2048);
    C_OK(run_once(cuda, stager.get(), t, &stream));
    CHECK(t.expected());
    devstage_stager_stats stats{};
    C_OK(devstage_stager_stats_get(stager.get(), &stats));
    CHECK(stats.batched_uploads == 1);     // the In and the InOut arg in one batch call
    CHECK(stats.batched_copy_backs == 1);  // the InOut and the Out arg
    CHECK(stats.batched_copies == 4);
    CHECK(stats.ring_uploads == 0);
    CHECK(stats.ring_bytes == 0);
    stager.reset();
    C_OK(devstage_stream_destroy(cuda, stream));
}

namespace {

// A run on the fake device's deferred stream: bound, its kernel enqueued, finished; nothing ran.
devstage_completion* pending_run(Fake& fake, devstage_stager* stager, devstage_stream stream, Tensors& t) {
    std::vector<devstage_tensor_arg> args = t.args();
    devstage_run* run = nullptr;
    C_OK(devstage_bind_on(stager, args.data(), args.size(), stream, &run));
    C_OK(devstage_stream_synchronize(fake.backend.get(), stream));  // the kernel reads the uploads
    C_OK(kernel(fake.backend.get(), run, t.in.size()));
    devstage_completion* done = nullptr;
    C_OK(devstage_finish_on(stager, run, stream, DEVSTAGE_OK, &done));
    return done;
}

}  // namespace

TEST_CASE("c handles: a completion whose wait fails stays pending, and its destroy keeps it", "[c_handles]") {
    for (const bool synchronize : {false, true}) {
        CAPTURE(synchronize);
        Fake fake(1, std::size_t{1} << 30, true, synchronize);
        devstage_stager_config config{};
        config.pack_limit = DEVSTAGE_PACK_LIMIT_4K;  // packed outputs too
        Stager stager = stager_of(fake.backend.get(), &config);
        devstage_stream stream = nullptr;
        C_OK(devstage_stream_create(fake.backend.get(), &stream));
        Tensors t(3000);
        const std::vector<unsigned char> out_before = t.out, state_before = t.state;
        devstage_completion* done = pending_run(fake, stager.get(), stream, t);
        fake_device_fail(fake.device, FAKE_SYNCHRONIZE_EVENT, 1);
        if (synchronize) fake_device_fail(fake.device, FAKE_SYNCHRONIZE, 1);  // it fails too
        CHECK(devstage_completion_wait(done) == DEVSTAGE_BACKEND_FAILURE);
        CHECK(says("could not be waited for"));
        int pending = 0;
        C_OK(devstage_completion_pending(done, &pending));
        CHECK(pending == 1);
        CHECK(t.out == out_before);  // the copy-backs have not run: the memory is still devstage's
        CHECK(t.state == state_before);
        // Destroying it waits, fails the same way, and keeps the handle.
        fake_device_fail(fake.device, FAKE_SYNCHRONIZE_EVENT, 1);
        if (synchronize) fake_device_fail(fake.device, FAKE_SYNCHRONIZE, 1);
        CHECK(devstage_completion_destroy(done) == DEVSTAGE_BACKEND_FAILURE);
        CHECK(says("the completion is kept"));
        C_OK(devstage_completion_pending(done, &pending));
        CHECK(pending == 1);
        // The fault is spent: the next wait delivers every output.
        C_OK(devstage_completion_wait(done));
        C_OK(devstage_completion_pending(done, &pending));
        CHECK(pending == 0);
        CHECK(t.expected());
        C_OK(devstage_completion_destroy(done));
        CHECK(devstage_completion_pending(done, &pending) == DEVSTAGE_INVALID_ARGUMENT);  // gone now
        stager.reset();
        C_OK(devstage_stream_destroy(fake.backend.get(), stream));
    }
}

TEST_CASE("c handles: a failed wait the device-wide synchronize recovers reports and delivers", "[c_handles]") {
    Fake fake(1);  // with the synchronize callback
    devstage_stager_config config{};
    config.pack_limit = DEVSTAGE_PACK_LIMIT_4K;
    Stager stager = stager_of(fake.backend.get(), &config);
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(fake.backend.get(), &stream));
    Tensors t(3000);
    devstage_completion* done = pending_run(fake, stager.get(), stream, t);
    fake_device_fail(fake.device, FAKE_SYNCHRONIZE_EVENT, 1);
    CHECK(devstage_completion_wait(done) == DEVSTAGE_BACKEND_FAILURE);
    int pending = 1;
    C_OK(devstage_completion_pending(done, &pending));
    CHECK(pending == 0);  // the device was waited for
    CHECK(t.expected());  // packed and direct outputs alike
    CHECK(fake_device_calls(fake.device, FAKE_SYNCHRONIZE) == 1);
    CHECK(devstage_completion_destroy(done) == DEVSTAGE_OK);  // waited already
    stager.reset();
    C_OK(devstage_stream_destroy(fake.backend.get(), stream));
}

TEST_CASE("c handles: a stager destroyed with work it cannot wait for resolves its completions", "[c_handles]") {
    Fake fake(1, std::size_t{1} << 30, true, false);  // no synchronize
    devstage_stager* stager = nullptr;
    C_OK(devstage_stager_create(fake.backend.get(), nullptr, &stager));
    C_OK(devstage_stager_set_error_sink(
        stager, [](void*, devstage_status, const char*) {}, nullptr));
    devstage_stream stream = nullptr;
    C_OK(devstage_stream_create(fake.backend.get(), &stream));
    Tensors t(500);
    devstage_completion* done = pending_run(fake, stager, stream, t);
    fake_device_fail(fake.device, FAKE_SYNCHRONIZE_EVENT, 1);
    CHECK(devstage_completion_wait(done) == DEVSTAGE_BACKEND_FAILURE);
    fake_device_fail(fake.device, FAKE_SYNCHRONIZE_EVENT, 1);
    CHECK(devstage_stager_destroy(stager) == DEVSTAGE_BACKEND_FAILURE);  // its release could not wait
    int pending = 1;
    C_OK(devstage_completion_pending(done, &pending));
    CHECK(pending == 0);
    CHECK(devstage_completion_destroy(done) == DEVSTAGE_BACKEND_FAILURE);  // resolved with the failure: freed
    CHECK(says("stager destroyed"));
    CHECK(devstage_completion_destroy(done) == DEVSTAGE_INVALID_ARGUMENT);
    // The device runs what was left; the buffer the stager could not free goes with the backend.
    C_OK(devstage_stream_synchronize(fake.backend.get(), stream));
    C_OK(devstage_stream_destroy(fake.backend.get(), stream));
    CHECK(devstage_backend_destroy(fake.backend.release()) == DEVSTAGE_LEAKED);
}

TEST_CASE("c handles: callbacks without streams count no asynchronous copy and no host wait", "[c_handles]") {
    Fake fake(0);
    for (const std::size_t pack : {std::size_t{0}, DEVSTAGE_PACK_LIMIT_4K}) {
        devstage_stager_config config{};
        config.pack_limit = pack;
        config.pipeline_slots = 2;
        Stager stager = stager_of(fake.backend.get(), &config);
        devstage_stream stream = nullptr;
        C_OK(devstage_stream_create(fake.backend.get(), &stream));
        for (int step = 0; step < 3; ++step) {
            Tensors streamed(700), synchronous(5000);
            C_OK(run_once(fake.backend.get(), stager.get(), streamed, &stream));
            C_OK(run_once(fake.backend.get(), stager.get(), synchronous));
            CHECK(streamed.expected());
            CHECK(synchronous.expected());
        }
        devstage_stager_stats stats{};
        C_OK(devstage_stager_stats_get(stager.get(), &stats));
        CHECK(stats.uploads > 0);
        CHECK(stats.async_uploads == 0);  // every stream of this backend is immediate
        CHECK(stats.async_copy_backs == 0);
        CHECK(stats.host_waits == 0);
        stager.reset();
        C_OK(devstage_stream_destroy(fake.backend.get(), stream));
    }
}

TEST_CASE("c handles: a bad stream never wedges a slot; the stager's destroy frees everything", "[c_handles]") {
    for (const int streams : {0, 1}) {
        CAPTURE(streams);
        Fake fake(streams, std::size_t{1} << 30, true, false);  // no synchronize to recover with
        devstage_stager* stager = nullptr;
        C_OK(devstage_stager_create(fake.backend.get(), nullptr, &stager));
        devstage_stream stream = nullptr, destroyed = nullptr;
        C_OK(devstage_stream_create(fake.backend.get(), &stream));
        C_OK(devstage_stream_create(fake.backend.get(), &destroyed));
        C_OK(devstage_stream_destroy(fake.backend.get(), destroyed));
        auto* bogus = reinterpret_cast<devstage_stream>(std::uintptr_t{0x1234});
        // A bind that enqueues nothing is refused all the same: its stream is checked.
        devstage_run* run = nullptr;
        for (devstage_stream bad : {bogus, destroyed}) {
            CHECK(devstage_bind_on(stager, nullptr, 0, bad, &run) == DEVSTAGE_INVALID_ARGUMENT);
            CHECK(run == nullptr);
        }
        // A finish on a bad stream leaves the run as it was.
        Tensors t(2048);
        std::vector<devstage_tensor_arg> args = t.args();
        C_OK(devstage_bind_on(stager, args.data(), args.size(), stream, &run));
        devstage_completion* done = nullptr;
        for (devstage_stream bad : {bogus, destroyed}) {
            CHECK(devstage_finish_on(stager, run, bad, DEVSTAGE_OK, &done) == DEVSTAGE_INVALID_ARGUMENT);
            CHECK(done == nullptr);
        }
        C_OK(devstage_stream_synchronize(fake.backend.get(), stream));
        C_OK(kernel(fake.backend.get(), run, 2048));
        C_OK(devstage_finish_on(stager, run, stream, DEVSTAGE_OK, &done));
        C_OK(devstage_completion_wait(done));
        C_OK(devstage_completion_destroy(done));
        CHECK(t.expected());
        // The slot is as good as new: binds, a release, and a destroy that frees the buffer.
        Tensors again(100);
        C_OK(run_once(fake.backend.get(), stager, again, &stream));
        CHECK(again.expected());
        C_OK(devstage_stager_release(stager));
        C_OK(devstage_stager_destroy(stager));
        CHECK(fake_device_live_device(fake.device) == 0);
        C_OK(devstage_stream_destroy(fake.backend.get(), stream));
    }
}
