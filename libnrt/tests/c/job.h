/*
 * What the C programs that run as processes of a job share: failing with a message,
 * checking a status, reading a file, and the process's place from its launcher's
 * variables (Open MPI's, else torchrun's).
 */

#pragma once

#include <stdio.h>
#include <stdlib.h>

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
