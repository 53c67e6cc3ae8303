/*
 * One process of a data-parallel training job, as an MPI or torchrun program is: runs
 * CORES ranks of a jax.shard_map SGD step (gradients averaged with pmean) compiled to
 * one rank's program, for ten steps, each rank from its own thread. Run by
 * tests/c_api.rs under mpirun:
 *
 *   NEURON_RT_ROOT_COMM_ID=127.0.0.1:PORT mpirun -np P dp_step STEP.neff DIR CORES
 *
 * DIR holds the fixture's global arrays as .npy (f32, C order): input0 (w, every rank's
 * whole copy), input1 (x) and input2 (y), split by rows over the P x CORES ranks, and
 * steps.npy, w after ten steps as XLA computed it on 4 CPU devices. Rank g is core
 * (g mod CORES) of process (g / CORES). Prints "rank <g> ok" per rank; the first
 * failure prints what differed and exits with 1.
 *
 * DP_STEP_SLOW_RANK=g with DP_STEP_SLOW_MS=t makes rank g spend t ms on the host
 * before each step, as a slow data loader would; DP_STEP_STEPS=n runs n steps (then w
 * is checked against XLA's only when n is 10).
 */

#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nrt/nrt.h>
#include <nrt/nrt_experimental.h>
#include <nrt/nrt_status.h>

#include "job.h"

struct array {
    float *values;
    size_t count;
};

static float magnitude(float v) { return v < 0 ? -v : v; }

static void *neff;
static size_t neff_size;
static uint32_t world, cores;
static struct array w0, x, y, expected;

/* A .npy file of little-endian f32 in C order (format version 1). */
static struct array load_npy(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *file = fopen(path, "rb");
    if (file == NULL) FAIL("cannot open %s", path);
    unsigned char start[10];
    if (fread(start, 1, sizeof start, file) != sizeof start || memcmp(start, "\x93NUMPY\x01", 7) != 0)
        FAIL("%s is not a version 1 .npy file", path);
    size_t header_len = (size_t)start[8] | (size_t)start[9] << 8;
    char *header = calloc(header_len + 1, 1);
    if (fread(header, 1, header_len, file) != header_len) FAIL("cannot read the header of %s", path);
    if (strstr(header, "'<f4'") == NULL || strstr(header, "'fortran_order': False") == NULL)
        FAIL("%s is not little-endian f32 in C order: %s", path, header);
    free(header);
    long data_start = ftell(file);
    fseek(file, 0, SEEK_END);
    size_t bytes = (size_t)(ftell(file) - data_start);
    fseek(file, data_start, SEEK_SET);
    struct array a = {malloc(bytes), bytes / sizeof(float)};
    if (fread(a.values, 1, bytes, file) != bytes) FAIL("cannot read %s", path);
    fclose(file);
    return a;
}

/* Allocates a tensor of `bytes` on the rank's core, named `name` in `set`. */
static nrt_tensor_t *bind(const struct rank *r, nrt_tensor_set_t *set, const char *name, size_t bytes) {
    nrt_tensor_t *tensor;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, r->vnc, bytes, name, &tensor));
    OK(nrt_add_tensor_to_tensor_set(set, name, tensor));
    return tensor;
}

static void *run_rank(void *arg) {
    const struct rank *r = arg;
    nrt_model_t *model = load_rank(r, neff, neff_size, world);
    nrt_tensor_info_array_t *info;
    OK(nrt_get_model_tensor_info(model, &info));
    if (info->tensor_count != 4) FAIL("the step has %lu tensors, not 3 inputs and an output", (unsigned long)info->tensor_count);
    nrt_tensor_set_t *inputs, *outputs;
    OK(nrt_allocate_tensor_set(&inputs));
    OK(nrt_allocate_tensor_set(&outputs));
    nrt_tensor_t *tw = bind(r, inputs, info->tensor_array[0].name, info->tensor_array[0].size);
    nrt_tensor_t *tx = bind(r, inputs, info->tensor_array[1].name, info->tensor_array[1].size);
    nrt_tensor_t *ty = bind(r, inputs, info->tensor_array[2].name, info->tensor_array[2].size);
    nrt_tensor_t *tout = bind(r, outputs, info->tensor_array[3].name, info->tensor_array[3].size);
    size_t w_bytes = info->tensor_array[0].size, x_bytes = info->tensor_array[1].size, y_bytes = info->tensor_array[2].size;
    if (w_bytes != w0.count * sizeof(float) || x_bytes * world != x.count * sizeof(float) ||
        y_bytes * world != y.count * sizeof(float))
        FAIL("rank %u: the local shapes do not split the fixture's arrays over %u ranks", r->global, world);
    /* This rank's rows of x and y. */
    OK(nrt_tensor_write(tx, (const char *)x.values + r->global * x_bytes, 0, x_bytes));
    OK(nrt_tensor_write(ty, (const char *)y.values + r->global * y_bytes, 0, y_bytes));
    float *w = malloc(w_bytes);
    memcpy(w, w0.values, w_bytes);
    const char *slow_rank = getenv("DP_STEP_SLOW_RANK"), *slow_ms = getenv("DP_STEP_SLOW_MS");
    long slow = slow_rank != NULL && slow_ms != NULL && strtol(slow_rank, NULL, 10) == (long)r->global
                    ? strtol(slow_ms, NULL, 10)
                    : 0;
    const char *steps_given = getenv("DP_STEP_STEPS");
    long steps = steps_given != NULL ? strtol(steps_given, NULL, 10) : 10;
    for (long step = 0; step < steps; step++) {
        if (slow > 0) {
            struct timespec loading = {slow / 1000, (slow % 1000) * 1000000L};
            nanosleep(&loading, NULL);
        }
        OK(nrt_tensor_write(tw, w, 0, w_bytes));
        OK(nrt_execute(model, inputs, outputs));
        OK(nrt_tensor_read(tout, w, 0, w_bytes));
    }
    for (size_t i = 0; steps == 10 && i < expected.count; i++) {
        float want = expected.values[i];
        if (magnitude(w[i] - want) > 1e-5f + 1e-4f * magnitude(want))
            FAIL("rank %u: w[%zu] is %g after ten steps, XLA computed %g", r->global, i, w[i], want);
    }
    OK(nrt_free_model_tensor_info(info));
    nrt_tensor_free(&tw);
    nrt_tensor_free(&tx);
    nrt_tensor_free(&ty);
    nrt_tensor_free(&tout);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    OK(nrt_unload(model));
    free(w);
    printf("rank %u ok\n", r->global);
    fflush(stdout);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) FAIL("usage: dp_step STEP.neff DIR CORES");
    neff = load_file(argv[1], &neff_size);
    w0 = load_npy(argv[2], "input0.npy");
    x = load_npy(argv[2], "input1.npy");
    y = load_npy(argv[2], "input2.npy");
    expected = load_npy(argv[2], "steps.npy");
    cores = (uint32_t)strtol(argv[3], NULL, 10);
    long process = launcher("OMPI_COMM_WORLD_RANK", "RANK");
    world = (uint32_t)launcher("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE") * cores;
    run_ranks(process, cores, run_rank);
    return 0;
}
