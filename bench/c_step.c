/* SPDX-License-Identifier: Apache-2.0 */
/* The decode step of bench/python_step.py in C, through the C interface: a frame of the six
 * inputs of a vLLM-style step (token ids int32 [B], positions int64 [B], block table int32 [B, M],
 * slot mapping int64 [B], temperature and top_p float32 [B]) and the logits (float32 [B, V]);
 * per step: frame, the six inputs written in place, bind on a stream, finish on it, wait, the
 * logits read (copied out), the completion and the frame handle destroyed. The logits are not
 * zeroed before the kernel (DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL): a model writes every one.
 *
 *   c_step sim|LIBCUDART B STEPS [M V]
 *
 * prints the microseconds of each step, one per line (the caller takes medians). A first step,
 * not printed, grows the stager. Exits 1 with the library's message on a failure. */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devstage/c/devstage.h"

#define INPUTS 6
#define TENSORS 7

static int failed(const char* what) {
    fprintf(stderr, "c_step: %s: %s\n", what, devstage_last_message());
    return 1;
}
#define TRY(call)                                     \
    do {                                              \
        if ((call) != DEVSTAGE_OK) return failed(#call); \
    } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int main(int argc, char** argv) {
    devstage_backend* backend;
    devstage_stager* stager;
    devstage_stream stream;
    devstage_stager_config config;
    devstage_tensor_shape shapes[TENSORS];
    size_t bytes[TENSORS];
    unsigned char* sources[INPUTS];
    float* logits;
    size_t b, m = 32, v = 512, t;
    long steps, step;
    if (argc < 4) {
        fprintf(stderr, "usage: c_step sim|LIBCUDART B STEPS [M V]\n");
        return 2;
    }
    b = (size_t)strtoul(argv[2], NULL, 10);
    steps = strtol(argv[3], NULL, 10);
    if (argc >= 6) {
        m = (size_t)strtoul(argv[4], NULL, 10);
        v = (size_t)strtoul(argv[5], NULL, 10);
    }
    if (strcmp(argv[1], "sim") == 0) {
        TRY(devstage_backend_create_sim(0, &backend));
    } else {
        TRY(devstage_backend_create_cuda(0, argv[1], &backend));
    }
    bytes[0] = b * 4;
    bytes[1] = b * 8;
    bytes[2] = b * m * 4;
    bytes[3] = b * 8;
    bytes[4] = b * 4;
    bytes[5] = b * 4;
    bytes[6] = b * v * 4;
    for (t = 0; t < TENSORS; ++t) {
        shapes[t].bytes = bytes[t];
        shapes[t].direction = t < INPUTS ? DEVSTAGE_IN : DEVSTAGE_OUT;
        shapes[t].device = NULL;
    }
    for (t = 0; t < INPUTS; ++t) {
        size_t i;
        sources[t] = malloc(bytes[t]);
        if (sources[t] == NULL) return 1;
        for (i = 0; i < bytes[t]; ++i) sources[t][i] = (unsigned char)(i * 7 + t);
    }
    logits = malloc(bytes[6]);
    if (logits == NULL) return 1;
    memset(&config, 0, sizeof config);
    config.pack_limit = DEVSTAGE_PACK_LIMIT_16K;
    config.pipeline_slots = 2;
    config.output_policy = DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL; /* a model writes every logit */
    TRY(devstage_stager_create(backend, &config, &stager));
    TRY(devstage_stream_create(backend, &stream));
    for (step = -1; step < steps; ++step) {
        devstage_frame* frame;
        devstage_run* run;
        devstage_completion* done;
        void* host[TENSORS];
        const double start = now_us();
        TRY(devstage_frame_create(stager, shapes, TENSORS, &frame));
        TRY(devstage_frame_hosts(frame, host, NULL, TENSORS));
        for (t = 0; t < INPUTS; ++t) memcpy(host[t], sources[t], bytes[t]);
        TRY(devstage_bind_frame_on(stager, frame, stream, &run));
        TRY(devstage_finish_on(stager, run, stream, DEVSTAGE_OK, &done));
        TRY(devstage_completion_wait(done));
        memcpy(logits, host[6], bytes[6]);
        TRY(devstage_completion_destroy(done));
        TRY(devstage_frame_destroy(frame));
        if (step >= 0) printf("%.3f\n", now_us() - start);
    }
    TRY(devstage_stream_destroy(backend, stream));
    TRY(devstage_stager_destroy(stager));
    TRY(devstage_backend_destroy(backend));
    for (t = 0; t < INPUTS; ++t) free(sources[t]);
    free(logits);
    return 0;
}
