/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How a runtime that cannot include C++20 (a C or C++17 host runtime) replaces its per-tensor
 * copy-in with devstage, through the C interface and its own platform callbacks.
 *
 * The runtime below is a stand-in: its "device" is host memory and its kernel runs on the host,
 * but its platform layer has the shape of a real one — device_malloc / device_free / copy hooks
 * taking the runtime's context first, and page-locked host memory — and it counts every call.
 * A decode step has four small and large inputs (hidden states, block table, slot mapping,
 * sequence lengths), one output, and weights that stay on the device.
 *
 *   before: for each tensor, device_malloc + one copy; after the kernel, one copy back and a
 *           device_free per tensor — 5 mallocs, 4 uploads, 1 download, 5 frees per step;
 *   after:  the same hooks plugged unchanged into devstage_callbacks; a stager with a retained
 *           buffer (no mallocs once it has grown) and the inputs generated in place in a frame
 *           of pinned memory, uploaded with one copy; the output comes back with one.
 *
 * Both give the same output at every step (checked); the program prints the calls per step once
 * the first step has grown what devstage keeps, and exits 1 on a mismatch or a failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devstage/c/devstage.h"

/* ---- the runtime's platform layer (a stand-in) ------------------------------------------ */

typedef struct runtime {
    unsigned long mallocs, frees, uploads, downloads;
} runtime;

static void* device_malloc_ctx(void* ctx, size_t size) {
    ++((runtime*)ctx)->mallocs;
    return malloc(size);
}
static void device_free_ctx(void* ctx, void* dev_ptr) {
    ++((runtime*)ctx)->frees;
    free(dev_ptr);
}
static int copy_to_device_ctx(void* ctx, void* dev_ptr, const void* host_ptr, size_t size) {
    ++((runtime*)ctx)->uploads;
    memcpy(dev_ptr, host_ptr, size);
    return 0;
}
static int copy_from_device_ctx(void* ctx, void* host_ptr, const void* dev_ptr, size_t size) {
    ++((runtime*)ctx)->downloads;
    memcpy(host_ptr, dev_ptr, size);
    return 0;
}
static void* alloc_pinned_host_ctx(void* ctx, size_t size) {
    (void)ctx;
    return malloc(size); /* a real runtime page-locks it (aclrtMallocHost, cudaHostAlloc) */
}
static void free_pinned_host_ctx(void* ctx, void* host_ptr) {
    (void)ctx;
    free(host_ptr);
}

/* ---- the model: one decode step -------------------------------------------------------- */

enum { BATCH = 16, HIDDEN = 5120, BLOCKS = 32, INPUTS = 4, TENSORS = 6 };

/* Tensor sizes in bytes, in the order the kernel takes them: hidden states (bf16), block
 * table (int32), slot mapping (int64), sequence lengths (int32), weights (bf16, on the
 * device), output (bf16). */
static const size_t tensor_bytes[TENSORS] = {BATCH * HIDDEN * 2, BATCH* BLOCKS * 4, BATCH * 8,
                                             BATCH * 4,          HIDDEN * 2,        BATCH* HIDDEN * 2};

/* The kernel, run by the runtime on device pointers: output = hidden + weights + the row's
 * sequence length + its first block. */
static void launch(void* const* device) {
    const uint16_t* hidden = (const uint16_t*)device[0];
    const int32_t* block_table = (const int32_t*)device[1];
    const int32_t* seq_lens = (const int32_t*)device[3];
    const uint16_t* weights = (const uint16_t*)device[4];
    uint16_t* output = (uint16_t*)device[5];
    int b, i;
    for (b = 0; b < BATCH; ++b) {
        for (i = 0; i < HIDDEN; ++i) {
            output[b * HIDDEN + i] =
                (uint16_t)(hidden[b * HIDDEN + i] + weights[i] + seq_lens[b] + block_table[b * BLOCKS]);
        }
    }
}

/* Writes step `step`'s inputs into `inputs[0..INPUTS)`, where they will be staged from. */
static void generate(int step, void* const* inputs) {
    uint16_t* hidden = (uint16_t*)inputs[0];
    int32_t* block_table = (int32_t*)inputs[1];
    int64_t* slot_mapping = (int64_t*)inputs[2];
    int32_t* seq_lens = (int32_t*)inputs[3];
    int b, i;
    for (b = 0; b < BATCH; ++b) {
        for (i = 0; i < HIDDEN; ++i) hidden[b * HIDDEN + i] = (uint16_t)(b * 31 + i * 7 + step);
        for (i = 0; i < BLOCKS; ++i) block_table[b * BLOCKS + i] = b * BLOCKS + i;
        slot_mapping[b] = (int64_t)b * 128 + step;
        seq_lens[b] = 1000 + step;
    }
}

/* The calls of the steps after the first (the first grows what it keeps), per step. */
static void print_calls(const char* what, const runtime* before, const runtime* after, int steps) {
    printf("%-26s %lu mallocs %lu uploads %lu downloads %lu frees per step after the first\n", what,
           (after->mallocs - before->mallocs) / steps, (after->uploads - before->uploads) / steps,
           (after->downloads - before->downloads) / steps, (after->frees - before->frees) / steps);
}

#define TRY(call)                                                                                                     \
    do {                                                                                                              \
        devstage_status status_ = (call);                                                                             \
        if (status_ != DEVSTAGE_OK) {                                                                                 \
            fprintf(stderr, "c_engine: %s: %s: %s\n", #call, devstage_status_name(status_), devstage_last_message()); \
            return 1;                                                                                                 \
        }                                                                                                             \
    } while (0)

int main(void) {
    enum { STEPS = 8 };
    runtime rt = {0, 0, 0, 0};
    runtime start = {0, 0, 0, 0};
    static uint16_t expected[STEPS][BATCH * HIDDEN];
    void* weights = device_malloc_ctx(&rt, tensor_bytes[4]);
    void* host[INPUTS];
    devstage_callbacks callbacks;
    devstage_backend* backend;
    devstage_stager* stager;
    devstage_stager_config config;
    devstage_tensor_shape shapes[TENSORS];
    int step, t, i;
    if (weights == NULL) return 1;
    for (i = 0; i < HIDDEN; ++i) ((uint16_t*)weights)[i] = (uint16_t)(i % 251);

    /* Before: the runtime's own per-tensor copy-in. */
    for (t = 0; t < INPUTS; ++t) host[t] = malloc(tensor_bytes[t]);
    for (step = 0; step < STEPS; ++step) {
        void* device[TENSORS];
        if (step == 1) start = rt;
        generate(step, host);
        for (t = 0; t < TENSORS; ++t) {
            if (t == 4) continue;
            device[t] = device_malloc_ctx(&rt, tensor_bytes[t]);
            if (t < INPUTS) copy_to_device_ctx(&rt, device[t], host[t], tensor_bytes[t]);
        }
        device[4] = weights;
        launch(device);
        copy_from_device_ctx(&rt, expected[step], device[5], tensor_bytes[5]);
        for (t = 0; t < TENSORS; ++t) {
            if (t != 4) device_free_ctx(&rt, device[t]);
        }
    }
    print_calls("per-tensor copy-in:", &start, &rt, STEPS - 1);
    for (t = 0; t < INPUTS; ++t) free(host[t]);

    /* After: the same hooks behind devstage. */
    memset(&callbacks, 0, sizeof callbacks);
    callbacks.name = "runtime";
    callbacks.context = &rt;
    callbacks.device_malloc = device_malloc_ctx;
    callbacks.device_free = device_free_ctx;
    callbacks.copy_to_device = copy_to_device_ctx;
    callbacks.copy_from_device = copy_from_device_ctx;
    callbacks.pinned_malloc = alloc_pinned_host_ctx;
    callbacks.pinned_free = free_pinned_host_ctx;
    TRY(devstage_backend_create_callbacks(&callbacks, &backend));
    memset(&config, 0, sizeof config);
    config.pack_limit = DEVSTAGE_PACK_LIMIT_16K;              /* a frame packs its inputs into one copy */
    config.output_policy = DEVSTAGE_OUTPUT_KERNEL_WRITES_ALL; /* the kernel writes every output byte */
    TRY(devstage_stager_create(backend, &config, &stager));
    for (t = 0; t < TENSORS; ++t) {
        shapes[t].bytes = tensor_bytes[t];
        shapes[t].direction = t < INPUTS || t == 4 ? DEVSTAGE_IN : DEVSTAGE_OUT;
        shapes[t].device = t == 4 ? weights : NULL; /* the weights stay on the device */
    }
    for (step = 0; step < STEPS; ++step) {
        devstage_frame* frame;
        devstage_run* run;
        void* device[TENSORS];
        size_t bytes;
        void* out;
        if (step == 1) start = rt;
        TRY(devstage_frame_create(stager, shapes, TENSORS, &frame));
        for (t = 0; t < INPUTS; ++t) TRY(devstage_frame_host(frame, t, &host[t], &bytes));
        generate(step, host); /* written in place: no staging copy on the host */
        TRY(devstage_bind_frame(stager, frame, &run));
        TRY(devstage_run_device_args(run, device, TENSORS));
        launch(device);
        TRY(devstage_finish(stager, run, DEVSTAGE_OK));
        TRY(devstage_frame_host(frame, 5, &out, &bytes));
        if (memcmp(out, expected[step], bytes) != 0) {
            fprintf(stderr, "c_engine: step %d: devstage's output differs from the per-tensor one\n", step);
            return 1;
        }
        TRY(devstage_frame_destroy(frame));
    }
    print_calls("devstage, packed frame:", &start, &rt, STEPS - 1);
    TRY(devstage_stager_destroy(stager));
    TRY(devstage_backend_destroy(backend));
    device_free_ctx(&rt, weights);
    printf("c_engine: %d steps, outputs identical\n", STEPS);
    return 0;
}
