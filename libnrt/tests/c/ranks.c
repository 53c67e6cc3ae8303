/*
 * One process of a job of several, as an MPI or torchrun program is: started by the
 * launcher, it takes its place from the launcher's variables and runs CORES ranks, one
 * thread per rank. Run by tests/c_api.rs under mpirun:
 *
 *   NEURON_RT_ROOT_COMM_ID=127.0.0.1:PORT mpirun -np P ranks ALLREDUCE.neff CORES
 *
 * ALLREDUCE.neff sums an f32[N] over every rank (replica_groups={}). Rank g of the job
 * is core (g mod CORES) of process (g / CORES). Each rank loads the program with
 * nrt_load_collectives (global device id g of P x CORES), executes it three times on
 * input g + 1 and checks the sum; then joins the global communicator
 * (nrt_build_global_comm), passes nrt_barrier, and checks nrt_all_gather. Prints
 * "rank <g> ok" per rank; the first failure prints what differed and exits with 1.
 */

#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nrt/nrt.h>
#include <nrt/nrt_experimental.h>
#include <nrt/nrt_status.h>

#include "job.h"

static void *neff;
static size_t neff_size;
static uint32_t world, cores;

static void *run_rank(void *arg) {
    const struct rank *r = arg;
    nrt_model_t *model = load_rank(r, neff, neff_size, world);
    nrt_tensor_info_array_t *info;
    OK(nrt_get_model_tensor_info(model, &info));
    size_t bytes = info->tensor_array[0].size, n = bytes / sizeof(float);
    OK(nrt_free_model_tensor_info(info));
    float *x = malloc(bytes), *y = malloc(bytes);
    for (size_t i = 0; i < n; i++) x[i] = (float)(r->global + 1);
    nrt_tensor_t *in, *out;
    nrt_tensor_set_t *inputs, *outputs;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, r->vnc, bytes, "x", &in));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, r->vnc, bytes, "y", &out));
    OK(nrt_tensor_write(in, x, 0, bytes));
    OK(nrt_allocate_tensor_set(&inputs));
    OK(nrt_allocate_tensor_set(&outputs));
    OK(nrt_add_tensor_to_tensor_set(inputs, "input0", in));
    OK(nrt_add_tensor_to_tensor_set(outputs, "output0", out));
    float expected = (float)world * (float)(world + 1) / 2.0f;
    for (int time = 0; time < 3; time++) {
        OK(nrt_execute(model, inputs, outputs));
        OK(nrt_tensor_read(out, y, 0, bytes));
        for (size_t i = 0; i < n; i++) {
            if (y[i] != expected) FAIL("rank %u, execution %d: element %zu is %g, not %g", r->global, time, i, y[i], expected);
        }
    }
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    OK(nrt_unload(model));
    free(x);
    free(y);

    OK(nrt_build_global_comm(r->vnc, r->global, world));
    OK(nrt_barrier(r->vnc, r->global, world));
    uint32_t mine[2] = {r->global, 100 + r->global};
    uint32_t *all = calloc(2 * world, sizeof(uint32_t));
    OK(nrt_all_gather(r->vnc, r->global, world, sizeof mine, mine, all));
    for (uint32_t g = 0; g < world; g++) {
        if (all[2 * g] != g || all[2 * g + 1] != 100 + g) FAIL("rank %u: gathered [%u, %u] for rank %u", r->global, all[2 * g], all[2 * g + 1], g);
    }
    free(all);
    printf("rank %u ok\n", r->global);
    fflush(stdout);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) FAIL("usage: ranks ALLREDUCE.neff CORES");
    neff = load_file(argv[1], &neff_size);
    cores = (uint32_t)strtol(argv[2], NULL, 10);
    long process = launcher("OMPI_COMM_WORLD_RANK", "RANK");
    long processes = launcher("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE");
    world = (uint32_t)processes * cores;
    run_ranks(process, cores, run_rank);
    return 0;
}
