/* SPDX-License-Identifier: Apache-2.0 */
/* What a checked handle costs a call, counted by callgrind (handle_instructions.sh): the same
 * number of calls of an entry point that looks up no handle (devstage_run_destroy(NULL): the
 * guard and the report of an ok status) and of one that looks up a run (devstage_run_slot:
 * the same, the look-up, and a read of the slot). Each measure_* function makes `calls` calls.
 * Usage: handle_instructions MODE CALLS, MODE one of baseline, run_slot, stats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devstage/c/devstage.h"

__attribute__((noinline)) static devstage_status measure_baseline(size_t calls) {
    devstage_status status = DEVSTAGE_OK;
    size_t i;
    for (i = 0; i < calls; ++i) status |= devstage_run_destroy(NULL);
    return status;
}

__attribute__((noinline)) static devstage_status measure_run_slot(const devstage_run* run, size_t calls) {
    devstage_status status = DEVSTAGE_OK;
    size_t slot = 0, i;
    for (i = 0; i < calls; ++i) status |= devstage_run_slot(run, &slot);
    return status;
}

__attribute__((noinline)) static devstage_status measure_stats(const devstage_stager* stager, size_t calls) {
    devstage_status status = DEVSTAGE_OK;
    devstage_stager_stats stats;
    size_t i;
    for (i = 0; i < calls; ++i) status |= devstage_stager_stats_get(stager, &stats);
    return status;
}

int main(int argc, char** argv) {
    devstage_backend* backend = NULL;
    devstage_stager* stager = NULL;
    devstage_run* run = NULL;
    unsigned char host[64] = {0};
    devstage_tensor_arg arg;
    devstage_status status;
    size_t calls;
    if (argc != 3) {
        fprintf(stderr, "usage: %s baseline|run_slot|stats CALLS\n", argv[0]);
        return 2;
    }
    calls = (size_t)strtoull(argv[2], NULL, 10);
    if (devstage_backend_create_sim(0, &backend) != DEVSTAGE_OK ||
        devstage_stager_create(backend, NULL, &stager) != DEVSTAGE_OK) {
        fprintf(stderr, "%s\n", devstage_last_message());
        return 1;
    }
    arg.data = host;
    arg.bytes = sizeof host;
    arg.direction = DEVSTAGE_IN;
    arg.placement = DEVSTAGE_HOST;
    if (devstage_bind(stager, &arg, 1, &run) != DEVSTAGE_OK) return 1;
    if (strcmp(argv[1], "baseline") == 0) {
        status = measure_baseline(calls);
    } else if (strcmp(argv[1], "run_slot") == 0) {
        status = measure_run_slot(run, calls);
    } else {
        status = measure_stats(stager, calls);
    }
    if (devstage_finish(stager, run, DEVSTAGE_OK) != DEVSTAGE_OK) return 1;
    devstage_stager_destroy(stager);
    devstage_backend_destroy(backend);
    return status == DEVSTAGE_OK ? 0 : 1;
}
