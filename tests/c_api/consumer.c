/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A C99 program using devstage through its C interface: built in the build tree (so the
 * sanitizer and valgrind runs cover it) and against an installed devstage (c_install_check.sh).
 * On the simulator and on the fake device's callbacks (deferred streams): a synchronous run, a
 * run on a stream, a packed frame written in place, the pinned pool, and an error's message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <devstage/c/devstage.h>

#include "fake_device.h"

#define CHECK(call)                                                                                          \
    do {                                                                                                     \
        devstage_status status_ = (call);                                                                    \
        if (status_ != DEVSTAGE_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, devstage_status_name(status_), \
                    devstage_last_message());                                                                \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#define EXPECT(condition)                                                            \
    do {                                                                             \
        if (!(condition)) {                                                          \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

enum { N = 1000 };

/* The kernel: out[i] = in[i] + 1 and state[i] *= 2, on the device, through copies. */
static void kernel(devstage_backend* backend, void* const* device) {
    static float in[N], state[N], out[N];
    int i;
    CHECK(devstage_copy_from_device(backend, in, device[0], sizeof in));
    CHECK(devstage_copy_from_device(backend, state, device[1], sizeof state));
    for (i = 0; i < N; ++i) {
        out[i] = in[i] + 1.0f;
        state[i] *= 2.0f;
    }
    CHECK(devstage_copy_to_device(backend, device[1], state, sizeof state));
    CHECK(devstage_copy_to_device(backend, device[2], out, sizeof out));
}

/* One run, synchronous or on `stream` (when not NULL), through `stager`. */
static void run_once(devstage_backend* backend, devstage_stager* stager, devstage_stream stream) {
    static float in[N], state[N], out[N];
    devstage_tensor_arg args[3];
    devstage_run* run;
    void* device[3];
    int i;
    for (i = 0; i < N; ++i) {
        in[i] = (float)i;
        state[i] = 1.0f;
        out[i] = -1.0f;
    }
    args[0].data = in, args[0].bytes = sizeof in, args[0].direction = DEVSTAGE_IN, args[0].placement = DEVSTAGE_HOST;
    args[1].data = state, args[1].bytes = sizeof state, args[1].direction = DEVSTAGE_IN_OUT;
    args[1].placement = DEVSTAGE_HOST;
    args[2].data = out, args[2].bytes = sizeof out, args[2].direction = DEVSTAGE_OUT, args[2].placement = DEVSTAGE_HOST;
    if (stream == NULL) {
        CHECK(devstage_bind(stager, args, 3, &run));
        CHECK(devstage_run_device_args(run, device, 3));
        kernel(backend, device);
        CHECK(devstage_finish(stager, run, DEVSTAGE_OK));
    } else {
        devstage_completion* done;
        CHECK(devstage_bind_on(stager, args, 3, stream, &run));
        CHECK(devstage_run_device_args(run, device, 3));
        CHECK(devstage_stream_synchronize(backend, stream)); /* the uploads are on the device */
        kernel(backend, device);
        CHECK(devstage_finish_on(stager, run, stream, DEVSTAGE_OK, &done));
        CHECK(devstage_completion_wait(done));
        CHECK(devstage_completion_destroy(done));
    }
    for (i = 0; i < N; ++i) {
        EXPECT(out[i] == (float)i + 1.0f);
        EXPECT(state[i] == 2.0f);
    }
}

/* A packed frame: the inputs written in place, one copy each way. */
static void run_frame(devstage_backend* backend) {
    devstage_stager_config config;
    devstage_stager* stager;
    devstage_tensor_shape shapes[2];
    devstage_frame* frame;
    devstage_run* run;
    devstage_stager_stats stats;
    void* device[2];
    void* host;
    size_t bytes;
    unsigned char* bytes_in;
    unsigned char copied[256];
    int i;
    memset(&config, 0, sizeof config);
    config.pack_limit = DEVSTAGE_PACK_LIMIT_16K;
    CHECK(devstage_stager_create(backend, &config, &stager));
    shapes[0].bytes = 256, shapes[0].direction = DEVSTAGE_IN, shapes[0].device = NULL;
    shapes[1].bytes = 256, shapes[1].direction = DEVSTAGE_OUT, shapes[1].device = NULL;
    CHECK(devstage_frame_create(stager, shapes, 2, &frame));
    CHECK(devstage_frame_host(frame, 0, &host, &bytes));
    EXPECT(bytes == 256);
    bytes_in = (unsigned char*)host;
    for (i = 0; i < 256; ++i) bytes_in[i] = (unsigned char)i;
    CHECK(devstage_bind_frame(stager, frame, &run));
    CHECK(devstage_run_device_args(run, device, 2));
    CHECK(devstage_copy_from_device(backend, copied, device[0], sizeof copied));
    CHECK(devstage_copy_to_device(backend, device[1], copied, sizeof copied)); /* out = in */
    CHECK(devstage_finish(stager, run, DEVSTAGE_OK));
    CHECK(devstage_frame_host(frame, 1, &host, &bytes));
    EXPECT(memcmp(host, bytes_in, 256) == 0);
    CHECK(devstage_stager_stats_get(stager, &stats));
    EXPECT(stats.copy_backs == 1 && stats.packed_args == 2); /* the output came back with one copy */
    CHECK(devstage_frame_destroy(frame));
    CHECK(devstage_stager_destroy(stager));
}

static void pinned(devstage_backend* backend) {
    devstage_pinned_pool* pool;
    devstage_pinned_stats stats;
    void* a;
    void* b;
    CHECK(devstage_pinned_pool_create(backend, (size_t)1 << 20, &pool));
    CHECK(devstage_pinned_pool_allocate(pool, 4096, &a));
    memset(a, 7, 4096);
    CHECK(devstage_pinned_pool_free(pool, a));
    CHECK(devstage_pinned_pool_allocate(pool, 4000, &b)); /* the same size class: from the cache */
    CHECK(devstage_pinned_pool_stats(pool, &stats));
    EXPECT(stats.cache_hits == 1 && stats.live_allocations == 1);
    EXPECT(devstage_pinned_pool_free(pool, (char*)b + 1) == DEVSTAGE_UNKNOWN_POINTER);
    EXPECT(strlen(devstage_last_message()) > 0);
    CHECK(devstage_pinned_pool_free(pool, b));
    CHECK(devstage_pinned_pool_destroy(pool));
}

static void exercise(devstage_backend* backend) {
    devstage_stager* stager;
    devstage_stager_config config;
    devstage_stream stream;
    int step;
    CHECK(devstage_stager_create(backend, NULL, &stager));
    for (step = 0; step < 3; ++step) run_once(backend, stager, NULL);
    CHECK(devstage_stream_create(backend, &stream));
    for (step = 0; step < 3; ++step) run_once(backend, stager, stream);
    CHECK(devstage_stager_destroy(stager));
    memset(&config, 0, sizeof config);
    config.strategy = DEVSTAGE_STRATEGY_PER_TENSOR;
    config.pipeline_slots = 2;
    CHECK(devstage_stager_create(backend, &config, &stager));
    run_once(backend, stager, stream);
    CHECK(devstage_stager_destroy(stager));
    CHECK(devstage_stream_destroy(backend, stream));
    run_frame(backend);
    pinned(backend);
}

int main(void) {
    devstage_backend* sim;
    devstage_backend* callbacks;
    devstage_callbacks table;
    devstage_stager_config config;
    devstage_stager* refused = NULL;
    fake_device* fake = fake_device_create((size_t)1 << 30, 1);
    EXPECT(fake != NULL);

    CHECK(devstage_backend_create_sim(0, &sim));
    exercise(sim);
    fake_device_callbacks(fake, &table);
    CHECK(devstage_backend_create_callbacks(&table, &callbacks));
    exercise(callbacks);

    /* Bad input: a clear error, nothing made. */
    memset(&config, 0, sizeof config);
    config.pipeline_slots = 1000;
    EXPECT(devstage_stager_create(sim, &config, &refused) == DEVSTAGE_INVALID_ARGUMENT && refused == NULL);
    EXPECT(strstr(devstage_last_message(), "1000 pipeline slots") != NULL);

    CHECK(devstage_backend_destroy(callbacks));
    CHECK(devstage_backend_destroy(sim));
    EXPECT(fake_device_live_device(fake) == 0 && fake_device_live_pinned(fake) == 0);
    EXPECT(fake_device_live_streams(fake) == 0 && fake_device_live_events(fake) == 0);
    fake_device_destroy(fake);
    printf("c consumer: sync, stream, frame and pinned runs on the simulator and on C callbacks passed\n");
    return 0;
}
