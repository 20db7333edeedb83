// SPDX-License-Identifier: Apache-2.0
// A C++17 program using devstage through its C interface (the C++20 headers are out of reach of
// a C++17 runtime): handles owned by std::unique_ptr, a synchronous run and a run on a stream
// over the simulator. Built in the build tree and against an installed devstage.
#include <devstage/c/devstage.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#if __cplusplus != 201703L
#error "this consumer checks the C interface from C++17"
#endif

namespace {

void check(devstage_status status, const char* what) {
    if (status == DEVSTAGE_OK) return;
    std::fprintf(stderr, "%s: %s: %s\n", what, devstage_status_name(status), devstage_last_message());
    std::exit(1);
}

struct BackendDeleter {
    void operator()(devstage_backend* b) const { check(devstage_backend_destroy(b), "devstage_backend_destroy"); }
};
struct StagerDeleter {
    void operator()(devstage_stager* s) const { check(devstage_stager_destroy(s), "devstage_stager_destroy"); }
};
using Backend = std::unique_ptr<devstage_backend, BackendDeleter>;
using Stager = std::unique_ptr<devstage_stager, StagerDeleter>;

// in -> out doubled, through the backend's copies (the simulator's device memory is host memory
// behind device pointers, but a kernel of a real device would run there).
void kernel(devstage_backend* backend, void* const* device, std::size_t n) {
    std::vector<int> values(n);
    check(devstage_copy_from_device(backend, values.data(), device[0], n * sizeof(int)), "read");
    for (int& v : values) v *= 2;
    check(devstage_copy_to_device(backend, device[1], values.data(), n * sizeof(int)), "write");
}

bool run(devstage_backend* backend, devstage_stager* stager, devstage_stream stream, bool on_stream) {
    std::vector<int> in(4096), out(4096, -1);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i);
    const devstage_tensor_arg args[] = {{in.data(), in.size() * sizeof(int), DEVSTAGE_IN, DEVSTAGE_HOST},
                                        {out.data(), out.size() * sizeof(int), DEVSTAGE_OUT, DEVSTAGE_HOST}};
    devstage_run* bound = nullptr;
    void* device[2] = {};
    if (on_stream) {
        check(devstage_bind_on(stager, args, 2, stream, &bound), "devstage_bind_on");
        check(devstage_stream_synchronize(backend, stream), "devstage_stream_synchronize");
    } else {
        check(devstage_bind(stager, args, 2, &bound), "devstage_bind");
    }
    check(devstage_run_device_args(bound, device, 2), "devstage_run_device_args");
    kernel(backend, device, in.size());
    if (on_stream) {
        devstage_completion* done = nullptr;
        check(devstage_finish_on(stager, bound, stream, DEVSTAGE_OK, &done), "devstage_finish_on");
        check(devstage_completion_destroy(done), "devstage_completion_destroy");  // waits
    } else {
        check(devstage_finish(stager, bound, DEVSTAGE_OK), "devstage_finish");
    }
    for (std::size_t i = 0; i < in.size(); ++i) {
        if (out[i] != 2 * in[i]) return false;
    }
    return true;
}

}  // namespace

int main() {
    devstage_backend* made = nullptr;
    check(devstage_backend_create_sim(0, &made), "devstage_backend_create_sim");
    Backend backend(made);
    devstage_stager* stager_made = nullptr;
    devstage_stager_config config{};
    config.pipeline_slots = 2;
    check(devstage_stager_create(backend.get(), &config, &stager_made), "devstage_stager_create");
    Stager stager(stager_made);
    devstage_stream stream = nullptr;
    check(devstage_stream_create(backend.get(), &stream), "devstage_stream_create");
    const bool ok = run(backend.get(), stager.get(), stream, false) && run(backend.get(), stager.get(), stream, true);
    check(devstage_stream_destroy(backend.get(), stream), "devstage_stream_destroy");
    if (!ok) {
        std::fprintf(stderr, "c++17 consumer: wrong output\n");
        return 1;
    }
    std::printf("c++17 consumer: a synchronous run and a run on a stream passed\n");
    return 0;
}
