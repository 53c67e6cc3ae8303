/*
 * The C side of benches/c_abi.rs: times N calls through the C ABI on a loaded
 * one-operator model and prints the median and p99 in nanoseconds.
 *
 *   c_abi MODEL.neff sync|async N
 *
 * sync: one nrt_execute per sample. async: one nrta_execute_schedule, then
 * nrta_is_completed polled until the request has completed, per sample.
 */

#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nrt/nrt.h>
#include <nrt/nrt_async.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        NRT_STATUS status_ = (call);                                                         \
        if (status_ != NRT_SUCCESS) {                                                        \
            fprintf(stderr, "%s failed with status %d\n", #call, (int)status_);              \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.neff sync|async N\n", argv[0]);
        return 2;
    }
    int async = strcmp(argv[2], "async") == 0;
    size_t samples = strtoull(argv[3], NULL, 10);
    FILE *file = fopen(argv[1], "rb");
    if (!file) return 1;
    fseek(file, 0, SEEK_END);
    size_t size = (size_t)ftell(file);
    fseek(file, 0, SEEK_SET);
    void *neff = malloc(size);
    if (fread(neff, 1, size, file) != size) return 1;
    fclose(file);

    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    nrt_model_t *model;
    CHECK(nrt_load(neff, size, 0, -1, &model));
    nrt_tensor_t *x, *y;
    nrt_tensor_set_t *inputs, *outputs;
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 4, "x", &x));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 4, "y", &y));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input0", x));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output0", y));

    uint64_t *times = malloc(samples * sizeof *times);
    for (size_t i = 0; i < samples + 1000; i++) {
        uint64_t start = now_ns();
        if (async) {
            nrta_seq_t seq;
            bool done = false;
            CHECK(nrta_execute_schedule(model, inputs, outputs, 0, NULL, &seq));
            while (!done) CHECK(nrta_is_completed(seq, &done));
        } else {
            CHECK(nrt_execute(model, inputs, outputs));
        }
        uint64_t elapsed = now_ns() - start;
        if (i >= 1000) times[i - 1000] = elapsed; /* the first 1,000 warm up */
    }
    qsort(times, samples, sizeof *times, compare);
    printf("%llu %llu\n", (unsigned long long)times[samples / 2], (unsigned long long)times[samples * 99 / 100]);
    free(times);
    nrt_tensor_free(&x);
    nrt_tensor_free(&y);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    CHECK(nrt_unload(model));
    nrt_close();
    free(neff);
    return 0;
}
