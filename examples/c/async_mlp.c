/*
 * The Neuron async API's usage pattern, whole: one error tracker, requests scheduled
 * on the compute execution unit until it answers NRT_QUEUE_FULL, completion polled
 * with nrta_get_sequence, failures read from the tracker, outputs read back.
 *
 *   async_mlp MODEL.neff [REQUESTS] [OUTPUTS.bin]
 *
 * Runs REQUESTS (default 64) executions of the model, each with its own output
 * tensors (a ring of SLOTS output sets, reused once their request has completed), and
 * prints what happened. With OUTPUTS.bin, writes the last request's outputs there,
 * concatenated in the model's order.
 */

#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <time.h>

#include <nrt/nrt.h>
#include <nrt/nrt_async.h>
#include <nrt/nrt_experimental.h>

#include "example_inputs.h"

/* Output sets in the ring: more than the compute unit's queue holds by default (8). */
#define SLOTS 32

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.neff [REQUESTS] [OUTPUTS.bin]\n", argv[0]);
        return 2;
    }
    uint64_t requests = argc > 2 ? strtoull(argv[2], NULL, 10) : 64;
    if (requests == 0) requests = 1;

    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    size_t neff_size;
    void *neff = read_file(argv[1], &neff_size);
    nrt_model_t *model;
    CHECK(nrt_load(neff, neff_size, -1, -1, &model));
    free(neff);
    nrt_model_info_t model_info;
    size_t written;
    CHECK(nrt_get_model_info(model, &model_info, sizeof model_info, &written));
    uint32_t vnc = model_info.vnc;

    /* Inputs are the same for every request: one set. Outputs: one set per slot. */
    nrt_tensor_info_array_t *info;
    CHECK(nrt_get_model_tensor_info(model, &info));
    nrt_tensor_set_t *inputs;
    CHECK(nrt_allocate_tensor_set(&inputs));
    nrt_tensor_set_t *outputs[SLOTS];
    nrt_tensor_t *output_tensors[SLOTS][16];
    nrt_dtype_t output_types[16];
    size_t input_count = 0, output_count = 0;
    nrt_tensor_t *input_tensors[16];
    for (int slot = 0; slot < SLOTS; slot++) CHECK(nrt_allocate_tensor_set(&outputs[slot]));
    for (uint64_t i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *t = &info->tensor_array[i];
        if (t->usage == NRT_TENSOR_USAGE_INPUT && input_count < 16) {
            nrt_tensor_t *tensor;
            CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, (int)vnc, t->size, t->name, &tensor));
            fill_input(tensor, input_count, t);
            CHECK(nrt_add_tensor_to_tensor_set(inputs, t->name, tensor));
            input_tensors[input_count++] = tensor;
        } else if (t->usage == NRT_TENSOR_USAGE_OUTPUT && output_count < 16) {
            for (int slot = 0; slot < SLOTS; slot++) {
                CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, (int)vnc, t->size, t->name,
                                          &output_tensors[slot][output_count]));
                CHECK(nrt_add_tensor_to_tensor_set(outputs[slot], t->name, output_tensors[slot][output_count]));
            }
            output_types[output_count++] = t->dtype;
        }
    }

    nrta_error_tracker_t *tracker;
    CHECK(nrta_error_tracker_create(vnc, &tracker));

    /* Schedule until the queue is full (or every request is out), then wait for at
     * least one completion, and again. */
    struct timespec started, finished;
    clock_gettime(CLOCK_MONOTONIC, &started);
    uint64_t scheduled = 0, completed = 0, queue_full = 0, first_number = 0;
    while (completed < requests) {
        while (scheduled < requests && scheduled - completed < SLOTS) {
            nrta_seq_t seq;
            NRT_STATUS status = nrta_execute_schedule(model, inputs, outputs[scheduled % SLOTS], 0, tracker, &seq);
            if (status == NRT_QUEUE_FULL) {
                queue_full++;
                break;
            }
            CHECK(status);
            if (scheduled == 0) first_number = NRTA_SEQ_GET_SEQ_NUM(seq);
            scheduled++;
        }
        for (;;) {
            nrta_seq_t last;
            CHECK(nrta_get_sequence(vnc, NRTA_XU_COMPUTE, 0, &last));
            uint64_t number = NRTA_SEQ_GET_SEQ_NUM(last);
            uint64_t done = number >= first_number ? number - first_number + 1 : 0;
            if (done > completed) {
                completed = done;
                break;
            }
            struct timespec pause = {0, 20000};
            nanosleep(&pause, NULL);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &finished);
    double seconds = (double)(finished.tv_sec - started.tv_sec) + (double)(finished.tv_nsec - started.tv_nsec) / 1e9;

    const nrta_error_t *errors;
    size_t error_count;
    CHECK(nrta_error_tracker_get_list(tracker, &errors, &error_count));
    for (size_t i = 0; i < error_count; i++) {
        fprintf(stderr, "request %#llx failed with status %llu\n", (unsigned long long)errors[i].seq_id,
                (unsigned long long)errors[i].error_code);
    }
    printf("%llu requests on vnc %u in %.3f s (%.1f per second); the queue was full %llu times; %zu failed\n",
           (unsigned long long)requests, vnc, seconds, (double)requests / seconds, (unsigned long long)queue_full,
           error_count);

    /* The last request's outputs. */
    FILE *out = argc > 3 ? fopen(argv[3], "wb") : NULL;
    if (argc > 3 && !out) {
        perror(argv[3]);
        return 1;
    }
    for (size_t o = 0; o < output_count; o++) {
        nrt_tensor_t *tensor = output_tensors[(requests - 1) % SLOTS][o];
        size_t size = nrt_tensor_get_size(tensor);
        float *values = malloc(size ? size : 1);
        CHECK(nrt_tensor_read(tensor, values, 0, size));
        printf("output %zu: %zu bytes", o, size);
        if (output_types[o] == NRT_DTYPE_FLOAT32) {
            printf(", first values");
            for (size_t k = 0; k < 3 && k < size / sizeof(float); k++) printf(" %g", values[k]);
        }
        printf("\n");
        if (out && fwrite(values, 1, size, out) != size) {
            perror(argv[3]);
            return 1;
        }
        free(values);
    }
    if (out) fclose(out);

    nrta_error_tracker_destroy(tracker);
    for (int slot = 0; slot < SLOTS; slot++) {
        for (size_t o = 0; o < output_count; o++) nrt_tensor_free(&output_tensors[slot][o]);
        nrt_destroy_tensor_set(&outputs[slot]);
    }
    for (size_t i = 0; i < input_count; i++) nrt_tensor_free(&input_tensors[i]);
    nrt_destroy_tensor_set(&inputs);
    CHECK(nrt_free_model_tensor_info(info));
    CHECK(nrt_unload(model));
    nrt_close();
    return error_count == 0 ? 0 : 1;
}
