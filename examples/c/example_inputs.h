/*
 * What the C examples share: reading a NEFF file, filling a model's inputs with a
 * fixed pattern (so their outputs can be compared with the Rust API's), and failing
 * loudly on any status but NRT_SUCCESS.
 */

#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nrt/nrt.h>
#include <nrt/nrt_experimental.h>

#define CHECK(call)                                                                                   \
    do {                                                                                              \
        NRT_STATUS status_ = (call);                                                                  \
        if (status_ != NRT_SUCCESS) {                                                                 \
            fprintf(stderr, "%s:%d: %s failed with status %d\n", __FILE__, __LINE__, #call, (int)status_); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

/* The whole file at `path`, malloc'd; its size in *size. Exits on failure. */
static void *read_file(const char *path, size_t *size) {
    FILE *file = fopen(path, "rb");
    if (!file) {
        perror(path);
        exit(1);
    }
    fseek(file, 0, SEEK_END);
    long length = ftell(file);
    fseek(file, 0, SEEK_SET);
    void *bytes = malloc(length > 0 ? (size_t)length : 1);
    if (!bytes || fread(bytes, 1, (size_t)length, file) != (size_t)length) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    fclose(file);
    *size = (size_t)length;
    return bytes;
}

/* Element k of input `input`: small multiples of 1/128, exact in float32. */
static float input_value(size_t input, size_t k) {
    return (float)((int)((k * 7 + input * 13) % 101) - 50) / 128.0f;
}

/* Writes the input pattern into `tensor` for input number `input` described by `info`
 * (float32 inputs get the pattern, other types zeros). */
static void fill_input(nrt_tensor_t *tensor, size_t input, const nrt_tensor_info_t *info) {
    unsigned char *bytes = calloc(info->size ? info->size : 1, 1);
    if (info->dtype == NRT_DTYPE_FLOAT32) {
        float *values = (float *)bytes;
        for (size_t k = 0; k < info->size / sizeof(float); k++) values[k] = input_value(input, k);
    }
    CHECK(nrt_tensor_write(tensor, bytes, 0, info->size));
    free(bytes);
}
