/*
 * What the C programs that run as processes of a job share: failing with a message,
 * checking a status, reading a file, the process's place from its launcher's variables
 * (Open MPI's, else torchrun's), and its ranks, one thread each.
 */

#pragma once

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <nrt/nrt.h>
#include <nrt/nrt_status.h>

#define FAIL(...)                                       \
    do {                                                \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                   \
        fputc('\n', stderr);                            \
        exit(1);                                        \
    } while (0)
#define OK(call)                                                           \
    do {                                                                   \
        NRT_STATUS got_ = (call);                                          \
        if (got_ != NRT_SUCCESS) FAIL("%s returned %d", #call, (int)got_); \
    } while (0)

static inline void *load_file(const char *path, size_t *size) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) FAIL("cannot open %s", path);
    fseek(file, 0, SEEK_END);
    *size = (size_t)ftell(file);
    fseek(file, 0, SEEK_SET);
    void *bytes = malloc(*size);
    if (fread(bytes, 1, *size, file) != *size) FAIL("cannot read %s", path);
    fclose(file);
    return bytes;
}

/* The launcher's variable as a number: Open MPI's `mpi`, else torchrun's `torchrun`. */
static inline long launcher(const char *mpi, const char *torchrun) {
    const char *value = getenv(mpi);
    if (value == NULL) value = getenv(torchrun);
    if (value == NULL) FAIL("neither %s nor %s is set: start this under mpirun or torchrun", mpi, torchrun);
    return strtol(value, NULL, 10);
}

/* One rank of the job: its global rank and the NeuronCore of this process it runs on. */
struct rank {
    uint32_t global;
    int vnc;
};

/* `neff` loaded as rank `r` of the job's `world` ranks (nrt_load_collectives). */
static inline nrt_model_t *load_rank(const struct rank *r, const void *neff, size_t size, uint32_t world) {
    nrt_model_t *model;
    OK(nrt_load_collectives(neff, size, r->vnc, -1, r->global, world, &model));
    return model;
}

/* Runs this process's `cores` ranks of the job (process `process` holds ranks
 * `process * cores` to `process * cores + cores - 1`, on its cores 0, 1, ...), each
 * `run(&rank)` from its own thread, between nrt_init and nrt_close. */
static inline void run_ranks(long process, uint32_t cores, void *(*run)(void *)) {
    if (cores == 0 || cores > 8) FAIL("CORES is %u: 1 to 8", cores);
    OK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    struct rank ranks[8];
    pthread_t threads[8];
    for (uint32_t k = 0; k < cores; k++) {
        ranks[k] = (struct rank){.global = (uint32_t)process * cores + k, .vnc = (int)k};
        if (pthread_create(&threads[k], NULL, run, &ranks[k]) != 0) FAIL("cannot start a thread");
    }
    for (uint32_t k = 0; k < cores; k++) pthread_join(threads[k], NULL);
    nrt_close();
}
