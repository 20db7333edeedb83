// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the tests of the C interface share: a REQUIRE that prints the last message, owning
// wrappers of the handles, the fake device behind callbacks, and a run of an In, an InOut and
// an Out tensor whose kernel goes through the backend's copies (any backend).
#include <catch2/catch.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "devstage/c/devstage.h"
#include "fake_device.h"

namespace devstage::c_test {

inline std::string last() {
    return devstage_last_message();
}

// REQUIRE(call == DEVSTAGE_OK), printing the message when it is not.
#define C_OK(call)                                  \
    do {                                            \
        const devstage_status c_ok_status = (call); \
        INFO(#call << ": " << last());              \
        REQUIRE(c_ok_status == DEVSTAGE_OK);        \
    } while (0)

struct BackendDeleter {
    void operator()(devstage_backend* b) const { CHECK(devstage_backend_destroy(b) == DEVSTAGE_OK); }
};
struct StagerDeleter {
    void operator()(devstage_stager* s) const { CHECK(devstage_stager_destroy(s) == DEVSTAGE_OK); }
};
struct PoolDeleter {
    void operator()(devstage_pinned_pool* p) const { CHECK(devstage_pinned_pool_destroy(p) == DEVSTAGE_OK); }
};
using Backend = std::unique_ptr<devstage_backend, BackendDeleter>;
using Stager = std::unique_ptr<devstage_stager, StagerDeleter>;
using Pool = std::unique_ptr<devstage_pinned_pool, PoolDeleter>;

inline Backend sim(std::size_t capacity = 0) {
    devstage_backend* b = nullptr;
    C_OK(devstage_backend_create_sim(capacity, &b));
    return Backend(b);
}

inline Stager stager_of(devstage_backend* backend, const devstage_stager_config* config = nullptr) {
    devstage_stager* s = nullptr;
    C_OK(devstage_stager_create(backend, config, &s));
    return Stager(s);
}

// The fake device of fake_device.h and a backend over its callbacks; the device outlives it.
struct Fake {
    explicit Fake(int streams, std::size_t capacity = std::size_t{1} << 30, bool memset = true, bool synchronize = true)
        : device(fake_device_create(capacity, streams)) {
        REQUIRE(device != nullptr);
        devstage_callbacks callbacks;
        fake_device_callbacks(device, &callbacks);
        if (!memset) {
            callbacks.device_memset = nullptr;
            callbacks.device_memset_async = nullptr;
        }
        if (!synchronize) callbacks.synchronize = nullptr;
        devstage_backend* b = nullptr;
        C_OK(devstage_backend_create_callbacks(&callbacks, &b));
        backend.reset(b);
    }
    Fake(const Fake&) = delete;
    Fake& operator=(const Fake&) = delete;
    ~Fake() {
        backend.reset();
        CHECK(fake_device_live_device(device) == 0);
        CHECK(fake_device_live_pinned(device) == 0);
        CHECK(fake_device_live_streams(device) == 0);
        CHECK(fake_device_live_events(device) == 0);
        fake_device_destroy(device);
    }
    fake_device* device;
    Backend backend;
};

inline devstage_tensor_arg arg(void* data, std::size_t bytes, devstage_direction direction,
                               devstage_placement placement = DEVSTAGE_HOST) {
    return devstage_tensor_arg{data, bytes, direction, placement};
}

// An In, an InOut and an Out tensor of `n` bytes: the kernel sets out = in + 1, state += 1.
struct Tensors {
    explicit Tensors(std::size_t n) : in(n), state(n), out(n, 0xEE) {
        for (std::size_t i = 0; i < n; ++i) {
            in[i] = static_cast<unsigned char>(i);
            state[i] = static_cast<unsigned char>(3 * i);
        }
    }
    std::vector<devstage_tensor_arg> args() {
        return {arg(in.data(), in.size(), DEVSTAGE_IN), arg(state.data(), state.size(), DEVSTAGE_IN_OUT),
                arg(out.data(), out.size(), DEVSTAGE_OUT)};
    }
    bool expected() const {
        for (std::size_t i = 0; i < in.size(); ++i) {
            if (out[i] != static_cast<unsigned char>(i + 1) || state[i] != static_cast<unsigned char>(3 * i + 1)) {
                return false;
            }
        }
        return true;
    }
    std::vector<unsigned char> in, state, out;
};

// The kernel on the device args of a run of Tensors, through the backend's copies (any
// backend: device memory is never touched).
inline devstage_status kernel_on(devstage_backend* backend, void* const* device, std::size_t n) {
    std::vector<unsigned char> in(n), state(n);
    if (devstage_status s = devstage_copy_from_device(backend, in.data(), device[0], n); s != DEVSTAGE_OK) return s;
    if (devstage_status s = devstage_copy_from_device(backend, state.data(), device[1], n); s != DEVSTAGE_OK) return s;
    for (std::size_t i = 0; i < n; ++i) {
        ++in[i];
        ++state[i];
    }
    if (devstage_status s = devstage_copy_to_device(backend, device[1], state.data(), n); s != DEVSTAGE_OK) return s;
    return devstage_copy_to_device(backend, device[2], in.data(), n);
}
inline devstage_status kernel(devstage_backend* backend, devstage_run* run, std::size_t n) {
    void* device[3];
    if (devstage_status s = devstage_run_device_args(run, device, 3); s != DEVSTAGE_OK) return s;
    return kernel_on(backend, device, n);
}

// One run: synchronous, or on `stream` when given. Returns the first failure (the run is
// finished or dropped either way).
inline devstage_status run_once(devstage_backend* backend, devstage_stager* stager, Tensors& t,
                                const devstage_stream* stream = nullptr) {
    const std::vector<devstage_tensor_arg> args = t.args();
    devstage_run* run = nullptr;
    devstage_status s = stream != nullptr ? devstage_bind_on(stager, args.data(), args.size(), *stream, &run)
                                          : devstage_bind(stager, args.data(), args.size(), &run);
    if (s != DEVSTAGE_OK) return s;
    if (stream != nullptr) s = devstage_stream_synchronize(backend, *stream);
    if (s == DEVSTAGE_OK) s = kernel(backend, run, t.in.size());
    if (stream == nullptr) {
        const devstage_status finished = devstage_finish(stager, run, s);
        return s != DEVSTAGE_OK ? s : finished;
    }
    devstage_completion* done = nullptr;
    const devstage_status finished = devstage_finish_on(stager, run, *stream, s, &done);
    if (finished != DEVSTAGE_OK) return s != DEVSTAGE_OK ? s : finished;
    const devstage_status waited = devstage_completion_wait(done);
    devstage_status destroyed = devstage_completion_destroy(done);
    // A wait that failed with the work still pending keeps the handle; the faults the tests
    // arm are for one call, so waiting again ends it.
    for (int retry = 0; retry < 4 && destroyed != DEVSTAGE_OK; ++retry) {
        int pending = 0;
        if (devstage_completion_pending(done, &pending) != DEVSTAGE_OK) break;  // destroyed already
        (void)devstage_completion_wait(done);
        destroyed = devstage_completion_destroy(done);
    }
    if (s != DEVSTAGE_OK) return s;
    return waited != DEVSTAGE_OK ? waited : destroyed;
}

}  // namespace devstage::c_test
