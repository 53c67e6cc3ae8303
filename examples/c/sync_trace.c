/*
 * Synchronous execution with the system trace fetched in the same process:
 *
 *   sync_trace MODEL.neff [EXECUTIONS] [EVENTS.json]
 *
 * Starts a system trace capture, loads the model, runs it EXECUTIONS times (default 3)
 * with nrt_execute, then fetches the captured events as JSON, prints how many of each
 * type there were, and (with EVENTS.json) saves the JSON. A second fetch shows that
 * events are returned once.
 */

#include <stdint.h>

#include <nrt/nrt.h>
#include <nrt/nrt_experimental.h>
#include <nrt/nrt_sys_trace.h>

#include "example_inputs.h"

/* Occurrences of `needle` in `text`. */
static size_t count(const char *text, const char *needle) {
    size_t found = 0;
    for (const char *at = strstr(text, needle); at; at = strstr(at + 1, needle)) found++;
    return found;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.neff [EXECUTIONS] [EVENTS.json]\n", argv[0]);
        return 2;
    }
    int executions = argc > 2 ? atoi(argv[2]) : 3;
    if (executions < 1) executions = 1;

    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    nrt_sys_trace_config_t *config;
    CHECK(nrt_sys_trace_config_allocate(&config));
    CHECK(nrt_sys_trace_start(config));

    size_t neff_size;
    void *neff = read_file(argv[1], &neff_size);
    nrt_model_t *model;
    CHECK(nrt_load(neff, neff_size, -1, -1, &model));
    free(neff);

    nrt_tensor_info_array_t *info;
    CHECK(nrt_get_model_tensor_info(model, &info));
    nrt_tensor_set_t *inputs, *outputs;
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    nrt_tensor_t *tensors[32];
    size_t input_count = 0;
    for (uint64_t i = 0; i < info->tensor_count && i < 32; i++) {
        const nrt_tensor_info_t *t = &info->tensor_array[i];
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, t->size, t->name, &tensors[i]));
        if (t->usage == NRT_TENSOR_USAGE_INPUT) {
            fill_input(tensors[i], input_count++, t);
            CHECK(nrt_add_tensor_to_tensor_set(inputs, t->name, tensors[i]));
        } else {
            CHECK(nrt_add_tensor_to_tensor_set(outputs, t->name, tensors[i]));
        }
    }
    for (int e = 0; e < executions; e++) CHECK(nrt_execute(model, inputs, outputs));

    char *events;
    size_t size;
    CHECK(nrt_sys_trace_fetch_events(&events, &size, NULL));
    const char *types[] = {"nrt_load", "nrt_tensor_allocate", "nrt_tensor_write", "nrt_execute", "nc_exec_running",
                           "timestamp_sync_point"};
    printf("fetched %zu bytes of events\n", size);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char needle[64];
        snprintf(needle, sizeof needle, "\"event_type\":\"%s\"", types[t]);
        printf("  %-22s %zu\n", types[t], count(events, needle));
    }
    if (argc > 3) {
        FILE *out = fopen(argv[3], "wb");
        if (!out || fwrite(events, 1, size, out) != size) {
            perror(argv[3]);
            return 1;
        }
        fclose(out);
    }
    nrt_sys_trace_buffer_free(events);

    CHECK(nrt_sys_trace_fetch_events(&events, &size, NULL));
    printf("a second fetch returns %zu events\n", count(events, "\"event_type\""));
    nrt_sys_trace_buffer_free(events);

    CHECK(nrt_sys_trace_stop());
    nrt_sys_trace_config_free(config);
    for (uint64_t i = 0; i < info->tensor_count && i < 32; i++) nrt_tensor_free(&tensors[i]);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    CHECK(nrt_free_model_tensor_info(info));
    CHECK(nrt_unload(model));
    nrt_close();
    return 0;
}
