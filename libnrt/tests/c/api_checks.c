/*
 * Exercises the C API the way C programs use and misuse it. Run by tests/c_api.rs:
 *
 *   api_checks ADD.neff ALLREDUCE.neff PROFILE.ntff
 *
 * ADD.neff adds two f32[4] inputs (input0 + input1 -> output0); ALLREDUCE.neff sums
 * an f32[4] over the ranks of an all-reduce. Every check prints
 * "ok <name>"; the first failure prints what differed and exits with status 1.
 */

#define _POSIX_C_SOURCE 200809L

#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nrt/nrt.h>
#include <nrt/nrt_async.h>
#include <nrt/nrt_experimental.h>
#include <nrt/nrt_profile.h>
#include <nrt/nrt_status.h>
#include <nrt/nrt_sys_trace.h>
#include <nrt/nrt_version.h>

#define EXPECT(expected, call)                                                                              \
    do {                                                                                                    \
        NRT_STATUS got_ = (call);                                                                           \
        if (got_ != (expected)) {                                                                           \
            fprintf(stderr, "%s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__, #call, (int)got_, \
                    (int)(expected), #expected);                                                            \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)
#define OK(call) EXPECT(NRT_SUCCESS, call)
#define ASSERT(condition)                                                                  \
    do {                                                                                   \
        if (!(condition)) {                                                                \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #condition); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static void *neff, *allreduce_neff;
static size_t neff_size, allreduce_size;

static void *load_file(const char *path, size_t *size) {
    FILE *file = fopen(path, "rb");
    ASSERT(file != NULL);
    fseek(file, 0, SEEK_END);
    *size = (size_t)ftell(file);
    fseek(file, 0, SEEK_SET);
    void *bytes = malloc(*size);
    ASSERT(fread(bytes, 1, *size, file) == *size);
    fclose(file);
    return bytes;
}

/* A device tensor of four floats holding `values` (NULL: zeros). */
static nrt_tensor_t *floats(int vnc, const char *name, const float *values) {
    nrt_tensor_t *tensor;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, vnc, 4 * sizeof(float), name, &tensor));
    if (values) OK(nrt_tensor_write(tensor, values, 0, 4 * sizeof(float)));
    return tensor;
}

struct bound {
    nrt_tensor_t *x, *y, *out;
    nrt_tensor_set_t *inputs, *outputs;
};

static struct bound bind_add(int vnc, float scale) {
    struct bound b;
    float x[4] = {1 * scale, 2 * scale, 3 * scale, 4 * scale};
    float y[4] = {10, 20, 30, 40};
    b.x = floats(vnc, "x", x);
    b.y = floats(vnc, "y", y);
    b.out = floats(vnc, "out", NULL);
    OK(nrt_allocate_tensor_set(&b.inputs));
    OK(nrt_allocate_tensor_set(&b.outputs));
    OK(nrt_add_tensor_to_tensor_set(b.inputs, "input0", b.x));
    OK(nrt_add_tensor_to_tensor_set(b.inputs, "input1", b.y));
    OK(nrt_add_tensor_to_tensor_set(b.outputs, "output0", b.out));
    return b;
}

static void check_sum(nrt_tensor_t *out, float scale) {
    float got[4];
    OK(nrt_tensor_read(out, got, 0, sizeof got));
    for (int i = 0; i < 4; i++) ASSERT(got[i] == (float)(i + 1) * scale + (float)(10 * (i + 1)));
}

static void unbind(struct bound *b) {
    nrt_tensor_free(&b->x);
    nrt_tensor_free(&b->y);
    nrt_tensor_free(&b->out);
    nrt_destroy_tensor_set(&b->inputs);
    nrt_destroy_tensor_set(&b->outputs);
    ASSERT(b->x == NULL && b->inputs == NULL);
}

static void before_init(void) {
    uint32_t total = 0, visible = 0;
    OK(nrt_get_total_nc_count(&total));
    OK(nrt_get_visible_vnc_count(&visible));
    ASSERT(total == 2 && visible == 2); /* trn1.2xlarge, every core */
    EXPECT(NRT_INVALID, nrt_get_total_vnc_count(NULL));
    nrt_instance_info_t info;
    OK(nrt_get_instance_info(&info, sizeof info));
    ASSERT(info.family == NRT_INSTANCE_TRN1 && info.size == NRT_INSTANCE_SIZE_2XL);
    ASSERT(strcmp(info.arch_name, "trainium") == 0 && strcmp(info.device_revision, "v2") == 0);
    nrt_version_t version;
    OK(nrt_get_version(&version, sizeof version));
    ASSERT(strstr(version.rt_detail, "libnrt") != NULL);
    nrt_model_t *model;
    EXPECT(NRT_UNINITIALIZED, nrt_load(neff, neff_size, -1, -1, &model));
    nrt_tensor_t *tensor;
    EXPECT(NRT_UNINITIALIZED, nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 16, "t", &tensor));
    EXPECT(NRT_INVALID, nrt_init(NRT_FRAMEWORK_TYPE_INVALID, "", ""));
    OK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "1.0", NULL));
    EXPECT(NRT_INVALID, nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "1.0", NULL));
    puts("ok before_init");
}

static void handles(void) {
    nrt_tensor_t *tensor;
    EXPECT(NRT_INVALID, nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 16, "t", NULL));
    EXPECT(NRT_INVALID, nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 7, 16, "t", &tensor));
    EXPECT(NRT_INVALID, nrt_tensor_allocate((nrt_tensor_placement_t)9, 0, 16, "t", &tensor));
    char buffer[16];
    EXPECT(NRT_INVALID, nrt_tensor_read(NULL, buffer, 0, 16));
    EXPECT(NRT_INVALID_HANDLE, nrt_tensor_read((nrt_tensor_t *)(uintptr_t)0x12345678, buffer, 0, 16));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 16, "t", &tensor));
    EXPECT(NRT_INVALID, nrt_tensor_read(tensor, NULL, 0, 16));
    nrt_tensor_t *stale = tensor;
    nrt_tensor_free(&tensor);
    ASSERT(tensor == NULL);
    nrt_tensor_free(&tensor); /* NULL: nothing to do */
    nrt_tensor_free(&stale);  /* double free: refused and logged */
    ASSERT(stale != NULL);
    EXPECT(NRT_INVALID_HANDLE, nrt_tensor_read(stale, buffer, 0, 16));
    ASSERT(nrt_tensor_get_size(stale) == 0);

    nrt_tensor_set_t *set, *stale_set;
    OK(nrt_allocate_tensor_set(&set));
    stale_set = set;
    nrt_destroy_tensor_set(&set);
    ASSERT(set == NULL);
    nrt_destroy_tensor_set(&stale_set); /* double free: refused and logged */
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 16, "t", &tensor));
    EXPECT(NRT_INVALID_HANDLE, nrt_add_tensor_to_tensor_set(stale_set, "input0", tensor));
    /* A tensor handle is not a tensor set handle, and the other way round. */
    EXPECT(NRT_INVALID_HANDLE, nrt_add_tensor_to_tensor_set((nrt_tensor_set_t *)tensor, "input0", tensor));
    nrt_tensor_free(&tensor);
    puts("ok handles");
}

static void tensors(void) {
    nrt_tensor_t *device, *host, *slice, *empty;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 1, 64, "device", &device));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 64, NULL, &host));
    ASSERT(nrt_tensor_get_size(device) == 64);
    unsigned char bytes[64], back[64];
    for (int i = 0; i < 64; i++) bytes[i] = (unsigned char)i;
    OK(nrt_tensor_write(device, bytes, 0, 64));
    EXPECT(NRT_INVALID, nrt_tensor_write(device, bytes, 1, 64));
    OK(nrt_tensor_memset(device, 8, 0xAB, 8));
    OK(nrt_tensor_copy(device, 0, host, 0, 64));
    OK(nrt_tensor_read(host, back, 0, 64));
    for (int i = 0; i < 64; i++) ASSERT(back[i] == ((i >= 8 && i < 16) ? 0xAB : i));
    /* A slice views its source's memory. */
    OK(nrt_tensor_allocate_slice(host, 32, 16, "slice", &slice));
    ASSERT(nrt_tensor_get_size(slice) == 16);
    OK(nrt_tensor_memset(slice, 0, 7, 16));
    OK(nrt_tensor_read(host, back, 0, 64));
    ASSERT(back[31] == 31 && back[32] == 7 && back[47] == 7 && back[48] == 48);
    EXPECT(NRT_INVALID, nrt_tensor_allocate_slice(host, 60, 16, "slice", &slice));
    /* The address of a host tensor's memory is its memory. */
    unsigned char *va = nrt_tensor_get_va(host);
    ASSERT(va != NULL && va[32] == 7);
    va[0] = 99;
    OK(nrt_tensor_read(host, back, 0, 1));
    ASSERT(back[0] == 99);
    EXPECT(NRT_INVALID, nrt_tensor_read(host, va + 8, 0, 16)); /* into its own memory */
    unsigned char *source = malloc(64);
    memset(source, 5, 64);
    OK(nrt_memcpy_to_device(va, source, 64));
    OK(nrt_tensor_read(host, back, 0, 64));
    ASSERT(back[0] == 5 && back[63] == 5);
    free(source);
    /* An empty tensor has no memory until a buffer is attached. */
    OK(nrt_tensor_allocate_empty("empty", &empty));
    ASSERT(nrt_tensor_get_size(empty) == 0);
    EXPECT(NRT_INVALID, nrt_tensor_read(empty, back, 0, 1));
    unsigned char mine[32] = {0};
    OK(nrt_tensor_attach_buffer(empty, mine, sizeof mine));
    ASSERT(nrt_tensor_get_size(empty) == 32);
    OK(nrt_tensor_write(empty, bytes, 0, 32));
    ASSERT(mine[31] == 31);
    ASSERT(nrt_tensor_get_va(empty) == mine);
    /* Batches. */
    unsigned char first[4], second[4];
    nrt_tensor_batch_op_t ops[2] = {{0, 4, first}, {28, 4, second}};
    nrt_tensor_batch_t batch = {empty, ops, 2};
    OK(nrt_tensor_read_batch(&batch, 1, false));
    ASSERT(first[3] == 3 && second[0] == 28);
    /* Device tensors on different cores are not copied between directly. */
    nrt_tensor_t *other;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 64, "other", &other));
    EXPECT(NRT_INVALID, nrt_tensor_copy(device, 0, other, 0, 64));
    nrt_tensor_free(&other);
    nrt_tensor_free(&slice);
    nrt_tensor_free(&empty);
    nrt_tensor_free(&device);
    nrt_tensor_free(&host);
    puts("ok tensors");
}

static void large_tensor(void) {
    size_t size = (size_t)5 << 30;
    nrt_tensor_t *big;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, size, "big", &big));
    ASSERT(nrt_tensor_get_size(big) == size);
    uint64_t value = 0x0123456789abcdefull, back = 0;
    size_t offset = ((size_t)9 << 29) + 8; /* beyond 4 GiB */
    OK(nrt_tensor_write(big, &value, offset, sizeof value));
    OK(nrt_tensor_read(big, &back, offset, sizeof back));
    ASSERT(back == value);
    EXPECT(NRT_INVALID, nrt_tensor_read(big, &back, size - 4, sizeof back));
    nrt_vnc_memory_stats_t stats;
    size_t written = 0;
    OK(nrt_get_vnc_memory_stats(0, &stats, sizeof stats, &written));
    ASSERT(written == sizeof stats && stats.bytes_used >= size && stats.bytes_limit == ((size_t)16 << 30));
    nrt_tensor_free(&big);
    puts("ok large_tensor");
}

static nrt_model_t *model_info_checks(void) {
    nrt_model_t *model;
    EXPECT(NRT_INVALID, nrt_load("not a neff", 10, -1, -1, &model));
    EXPECT(NRT_LOAD_NOT_ENOUGH_NC, nrt_load(neff, neff_size, 5, -1, &model));
    EXPECT(NRT_LOAD_NOT_ENOUGH_NC, nrt_load(neff, neff_size, -7, -1, &model));
    OK(nrt_load(neff, neff_size, 1, -1, &model));
    uint32_t count = 0;
    OK(nrt_get_model_nc_count(model, &count));
    ASSERT(count == 1);
    nrt_model_info_t info;
    size_t written = 0;
    OK(nrt_get_model_info(model, &info, sizeof info, &written));
    ASSERT(info.vnc == 1 && written == sizeof info);
    nrt_tensor_info_array_t *tensors;
    OK(nrt_get_model_tensor_info(model, &tensors));
    ASSERT(tensors->tensor_count == 3);
    const char *names[3] = {"input0", "input1", "output0"};
    for (int i = 0; i < 3; i++) {
        const nrt_tensor_info_t *t = &tensors->tensor_array[i];
        ASSERT(strcmp(t->name, names[i]) == 0);
        ASSERT(t->usage == (i < 2 ? NRT_TENSOR_USAGE_INPUT : NRT_TENSOR_USAGE_OUTPUT));
        ASSERT(t->size == 16 && t->dtype == NRT_DTYPE_FLOAT32 && t->ndim == 1 && t->shape[0] == 4);
    }
    OK(nrt_free_model_tensor_info(tensors));
    EXPECT(NRT_INVALID_HANDLE, nrt_free_model_tensor_info(tensors));
    EXPECT(NRT_INVALID_HANDLE, nrt_get_model_nc_count((nrt_model_t *)(uintptr_t)0x7f00, &count));
    puts("ok model_info");
    return model;
}

static void execute(nrt_model_t *model) {
    struct bound b = bind_add(1, 1.0f);
    OK(nrt_execute(model, b.inputs, b.outputs));
    check_sum(b.out, 1.0f);
    OK(nrt_execute_repeat(model, b.inputs, b.outputs, 3));
    EXPECT(NRT_INVALID, nrt_execute_repeat(model, b.inputs, b.outputs, 0));
    /* A tensor smaller than the model's input. */
    nrt_tensor_t *small;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 1, 8, "small", &small));
    OK(nrt_add_tensor_to_tensor_set(b.inputs, "input1", small));
    EXPECT(NRT_INVALID, nrt_execute(model, b.inputs, b.outputs));
    /* Replacing the binding repairs the set. */
    OK(nrt_add_tensor_to_tensor_set(b.inputs, "input1", b.y));
    nrt_tensor_t *bound;
    OK(nrt_get_tensor_from_tensor_set(b.inputs, "input1", &bound));
    ASSERT(bound == b.y);
    EXPECT(NRT_INVALID, nrt_get_tensor_from_tensor_set(b.inputs, "input7", &bound));
    OK(nrt_execute(model, b.inputs, b.outputs));
    /* A set holding a tensor over the caller's buffer sees buffers attached later. */
    nrt_tensor_t *lent;
    OK(nrt_tensor_allocate_empty("lent", &lent));
    float mine[4] = {100, 200, 300, 400};
    OK(nrt_tensor_attach_buffer(lent, mine, sizeof mine));
    OK(nrt_add_tensor_to_tensor_set(b.inputs, "input0", lent));
    OK(nrt_execute(model, b.inputs, b.outputs));
    check_sum(b.out, 100.0f);
    float others[4] = {2, 4, 6, 8};
    OK(nrt_tensor_attach_buffer(lent, others, sizeof others));
    OK(nrt_execute(model, b.inputs, b.outputs));
    check_sum(b.out, 2.0f);
    /* Freeing a tensor a set still holds keeps its memory for the set. */
    nrt_tensor_free(&lent);
    OK(nrt_execute(model, b.inputs, b.outputs));
    check_sum(b.out, 2.0f);
    EXPECT(NRT_INVALID_HANDLE, nrt_get_tensor_from_tensor_set(b.inputs, "input0", &bound));
    nrt_tensor_free(&small);
    unbind(&b);
    puts("ok execute");
}

struct worker {
    nrt_model_t *model;
    int index;
    int failures;
};

static void *run_worker(void *arg) {
    struct worker *w = arg;
    struct bound b = bind_add(1, (float)(w->index + 1));
    for (int i = 0; i < 100; i++) {
        if (nrt_execute(w->model, b.inputs, b.outputs) != NRT_SUCCESS) w->failures++;
        nrt_tensor_t *scratch;
        if (nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 256, "scratch", &scratch) != NRT_SUCCESS) w->failures++;
        nrt_tensor_free(&scratch);
    }
    check_sum(b.out, (float)(w->index + 1));
    unbind(&b);
    return NULL;
}

static void threads(nrt_model_t *model) {
    pthread_t ids[4];
    struct worker workers[4];
    for (int i = 0; i < 4; i++) {
        workers[i] = (struct worker){model, i, 0};
        ASSERT(pthread_create(&ids[i], NULL, run_worker, &workers[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        ASSERT(pthread_join(ids[i], NULL) == 0);
        ASSERT(workers[i].failures == 0);
    }
    puts("ok threads");
}

static void async_requests(nrt_model_t *model) {
    nrta_error_tracker_t *tracker;
    EXPECT(NRT_INVALID, nrta_error_tracker_create(9, &tracker));
    OK(nrta_error_tracker_create(1, &tracker));
    struct bound b = bind_add(1, 1.0f);
    float x[4] = {5, 6, 7, 8}, back[4] = {0};
    nrta_seq_t write, read, copy, run, last;
    EXPECT(NRT_INVALID, nrta_tensor_write(b.x, x, 0, (uint64_t)1 << 62, 0, tracker, &write));
    OK(nrta_tensor_write(b.x, x, 0, sizeof x, 0, tracker, &write));
    EXPECT(NRT_INVALID, nrta_tensor_write(b.x, x, 0, sizeof x, 1, tracker, &write));
    ASSERT(NRTA_SEQ_GET_XU_ID(write) == (1u << 3 | NRTA_XU_TENSOR_WRITE));
    bool done = false;
    while (!done) OK(nrta_is_completed(write, &done));
    OK(nrta_execute_schedule(model, b.inputs, b.outputs, 0, tracker, &run));
    int fd = -1;
    OK(nrta_get_completion_handle(run, &fd));
    struct pollfd pfd = {fd, POLLIN, 0};
    ASSERT(poll(&pfd, 1, 10000) == 1 && (pfd.revents & POLLIN));
    close(fd);
    OK(nrta_is_completed(run, &done));
    ASSERT(done);
    OK(nrta_get_sequence(1, NRTA_XU_COMPUTE, 0, &last));
    ASSERT(last == run);
    OK(nrta_tensor_copy(b.out, 0, b.x, 0, sizeof back, 0, NULL, &copy));
    do OK(nrta_is_completed(copy, &done)); while (!done);
    OK(nrta_tensor_read(back, b.x, 0, sizeof back, 0, tracker, &read));
    do OK(nrta_is_completed(read, &done)); while (!done);
    for (int i = 0; i < 4; i++) ASSERT(back[i] == x[i] + (float)(10 * (i + 1)));
    EXPECT(NRT_INVALID, nrta_is_completed(read + 1000, &done));
    const nrta_error_t *errors;
    size_t count = 99;
    OK(nrta_error_tracker_get_list(tracker, &errors, &count));
    ASSERT(count == 0);
    /* A request that fails still completes, and the tracker has its status. */
    nrt_tensor_t *small;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 1, 8, "small", &small));
    OK(nrt_add_tensor_to_tensor_set(b.inputs, "input1", small));
    OK(nrta_execute_schedule(model, b.inputs, b.outputs, 0, tracker, &run));
    do OK(nrta_is_completed(run, &done)); while (!done);
    OK(nrta_error_tracker_get_list(tracker, &errors, &count));
    ASSERT(count == 1 && errors[0].seq_id == run && errors[0].error_code == NRT_INVALID);
    OK(nrta_error_tracker_get_list(tracker, &errors, &count));
    ASSERT(count == 0);
    nrt_tensor_free(&small);
    nrta_error_tracker_destroy(tracker);
    EXPECT(NRT_INVALID_HANDLE, nrta_error_tracker_get_list(tracker, &errors, &count));
    nrta_error_tracker_destroy(NULL); /* like free(NULL) */
    unbind(&b);
    puts("ok async");
}

static void sys_trace(nrt_model_t *model) {
    const char **types;
    size_t count = 0;
    OK(nrt_sys_trace_get_event_types(&types, &count));
    int has_execute = 0;
    for (size_t i = 0; i < count; i++) has_execute |= strcmp(types[i], "nrt_execute") == 0;
    ASSERT(count > 10 && has_execute);
    nrt_sys_trace_free_event_types(types, count);

    nrt_sys_trace_config_t *config;
    OK(nrt_sys_trace_config_allocate(&config));
    OK(nrt_sys_trace_get_event_types(&types, &count));
    for (size_t i = 0; i < count; i++) OK(nrt_sys_trace_config_set_capture_enabled_for_event_type(config, types[i], false));
    nrt_sys_trace_free_event_types(types, count);
    OK(nrt_sys_trace_config_set_capture_enabled_for_event_type(config, "nrt_execute", true));
    EXPECT(NRT_INVALID, nrt_sys_trace_config_set_capture_enabled_for_event_type(config, "no_such_event", true));
    OK(nrt_sys_trace_config_get_enabled_event_types(config, &types, &count));
    ASSERT(count == 1 && strcmp(types[0], "nrt_execute") == 0);
    free((void *)types[0]);
    free((void *)types);
    OK(nrt_sys_trace_start(config));
    EXPECT(NRT_INVALID, nrt_sys_trace_start(config));

    struct bound b = bind_add(1, 1.0f);
    OK(nrt_execute(model, b.inputs, b.outputs));
    OK(nrt_execute(model, b.inputs, b.outputs));
    nrt_sys_trace_fetch_options_t *options;
    OK(nrt_sys_trace_fetch_options_allocate(&options));
    nrt_sys_trace_fetch_options_set_nc_idx(options, 1);
    nrt_sys_trace_fetch_options_set_max_events_per_nc(options, 3);
    char *json;
    size_t size;
    OK(nrt_sys_trace_fetch_events(&json, &size, options));
    ASSERT(strlen(json) == size && strstr(json, "\"data_version\":2") != NULL);
    size_t events = 0;
    for (const char *at = strstr(json, "\"event_type\":\"nrt_execute\""); at; at = strstr(at + 1, "\"event_type\""))
        events++;
    ASSERT(events == 3);
    nrt_sys_trace_buffer_free(json);
    OK(nrt_sys_trace_fetch_events(&json, &size, NULL));
    events = 0;
    for (const char *at = strstr(json, "\"event_type\":\"nrt_execute\""); at; at = strstr(at + 1, "\"event_type\""))
        events++;
    ASSERT(events == 1); /* two executions, a start and a stop each: 4 events, 3 fetched before */
    nrt_sys_trace_buffer_free(json);
    OK(nrt_sys_trace_fetch_events(&json, &size, NULL));
    ASSERT(strstr(json, "event_type") == NULL);
    nrt_sys_trace_buffer_free(json);
    nrt_sys_trace_fetch_options_free(options);
    OK(nrt_sys_trace_stop());
    nrt_sys_trace_config_free(config);
    unbind(&b);
    puts("ok sys_trace");
}

static void profile(nrt_model_t *model, const char *path) {
    struct bound b = bind_add(1, 1.0f);
    OK(nrt_profile_start(model, path));
    EXPECT(NRT_INVALID, nrt_profile_start(model, path));
    EXPECT(NRT_INVALID, nrt_inspect_stop()); /* a recording of another kind */
    EXPECT(NRT_INVALID, nrt_trace_stop("trace.ntff"));
    for (int i = 0; i < 3; i++) OK(nrt_execute(model, b.inputs, b.outputs));
    EXPECT(NRT_INVALID, nrt_profile_stop("some-other-file.ntff"));
    OK(nrt_profile_stop(path));
    EXPECT(NRT_INVALID, nrt_profile_stop(path));
    ASSERT(access(path, R_OK) == 0);
    /* nrt_inspect_* records everything into NEURON_RT_INSPECT_OUTPUT_DIR (./output). */
    OK(nrt_inspect_begin());
    OK(nrt_execute(model, b.inputs, b.outputs));
    OK(nrt_inspect_stop());
    EXPECT(NRT_INVALID, nrt_inspect_stop());
    ASSERT(access("output", R_OK) == 0);
    OK(nrt_trace_start(false));
    OK(nrt_execute(model, b.inputs, b.outputs));
    OK(nrt_trace_stop("trace.ntff"));
    ASSERT(access("trace.ntff", R_OK) == 0);

    /* Continuous profiling saves the latest execution of a core when asked. */
    nrt_profile_continuous_options_t *continuous;
    OK(nrt_profile_continuous_options_allocate(&continuous));
    OK(nrt_profile_continuous_options_set_output_dir(continuous, "continuous"));
    EXPECT(NRT_INVALID, nrt_profile_continuous_save(1, continuous));
    OK(nrt_profile_continuous_start(continuous));
    EXPECT(NRT_INVALID, nrt_profile_continuous_start(continuous));
    OK(nrt_execute(model, b.inputs, b.outputs));
    OK(nrt_execute(model, b.inputs, b.outputs));
    OK(nrt_profile_continuous_save(1, continuous));
    EXPECT(NRT_INVALID, nrt_profile_continuous_save(0, continuous)); /* nothing ran on vnc 0 */
    OK(nrt_profile_continuous_stop());
    EXPECT(NRT_INVALID, nrt_profile_continuous_stop());
    OK(nrt_profile_continuous_options_free(continuous));
    ASSERT(access("continuous", R_OK) == 0);

    /* nrt_inspect_begin_with_options: nothing unless enabled, then what it says. */
    nrt_inspect_config_t *inspect;
    OK(nrt_inspect_config_allocate(&inspect));
    OK(nrt_inspect_begin_with_options(inspect));
    EXPECT(NRT_INVALID, nrt_inspect_stop());
    OK(nrt_inspect_config_set_enable_inspect(inspect, true));
    OK(nrt_inspect_config_set_output_dir(inspect, "inspected"));
    OK(nrt_inspect_config_set_session_id(inspect, 7));
    OK(nrt_inspect_config_set_activity(inspect, "device_profile", false));
    EXPECT(NRT_INVALID, nrt_inspect_config_set_activity(inspect, "gpu_util", true));
    EXPECT(NRT_INVALID, nrt_inspect_config_set_enable_inspect_on_fail(inspect, true));
    const char **activities;
    size_t activity_count = 0;
    OK(nrt_inspect_config_get_enabled_activity_types(inspect, &activities, &activity_count));
    ASSERT(activity_count == 3 && strcmp(activities[0], "system_profile") == 0);
    nrt_inspect_config_free_activity_types(activities, activity_count);
    OK(nrt_inspect_begin_with_options(inspect));
    OK(nrt_execute(model, b.inputs, b.outputs));
    OK(nrt_inspect_stop());
    OK(nrt_inspect_config_free(inspect));
    ASSERT(access("inspected", R_OK) == 0);
    unbind(&b);
    puts("ok profile");
}

struct rank {
    int rank;
    float result[4];
    NRT_STATUS status;
};

/* Loads rank `rank` of the all-reduce on vnc `rank` and runs it once. */
static void *run_rank(void *arg) {
    struct rank *r = arg;
    nrt_model_t *model;
    r->status = nrt_load_collectives(allreduce_neff, allreduce_size, -1, -1, (uint32_t)r->rank, 2, &model);
    if (r->status != NRT_SUCCESS) return NULL;
    float x[4] = {1.0f + (float)r->rank, 2, 3, 4};
    nrt_tensor_t *in, *out;
    nrt_tensor_set_t *inputs, *outputs;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, r->rank, sizeof x, "x", &in));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, r->rank, sizeof x, "r", &out));
    OK(nrt_tensor_write(in, x, 0, sizeof x));
    OK(nrt_allocate_tensor_set(&inputs));
    OK(nrt_allocate_tensor_set(&outputs));
    OK(nrt_add_tensor_to_tensor_set(inputs, "input0", in));
    OK(nrt_add_tensor_to_tensor_set(outputs, "output0", out));
    r->status = nrt_execute(model, inputs, outputs);
    OK(nrt_tensor_read(out, r->result, 0, sizeof r->result));
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    OK(nrt_unload(model));
    return NULL;
}

static void collectives(void) {
    nrt_model_t *model;
    EXPECT(NRT_INVALID, nrt_load_collectives(allreduce_neff, allreduce_size, -1, -1, 2, 2, &model));
    EXPECT(NRT_LOAD_NOT_ENOUGH_NC, nrt_load_collectives(allreduce_neff, allreduce_size, -1, -1, 0, 5, &model));
    pthread_t ids[2];
    struct rank ranks[2] = {{0, {0}, NRT_FAILURE}, {1, {0}, NRT_FAILURE}};
    for (int i = 0; i < 2; i++) ASSERT(pthread_create(&ids[i], NULL, run_rank, &ranks[i]) == 0);
    for (int i = 0; i < 2; i++) ASSERT(pthread_join(ids[i], NULL) == 0);
    for (int i = 0; i < 2; i++) {
        OK(ranks[i].status);
        ASSERT(ranks[i].result[0] == 3 && ranks[i].result[1] == 4 && ranks[i].result[3] == 8);
    }
    puts("ok collectives");
}

static void unsupported(void) {
    int fd;
    EXPECT(NRT_INVALID, nrt_get_dmabuf_fd(0, 16, &fd));
    void *addr;
    size_t size;
    EXPECT(NRT_INVALID, nrt_get_hbm_mmap_va(0, 0, &addr, &size));
    /* Without NEURON_RT_ROOT_COMM_ID there is no job of processes to join. */
    EXPECT(NRT_INVALID, nrt_build_global_comm(0, 0, 2));
    EXPECT(NRT_INVALID, nrt_tensor_get_device_allocation_info(NULL, NULL));
    int err = 0;
    char message[128];
    ASSERT(nrt_get_libnccl_net(&err, message, sizeof message) == NULL && err != 0 && strlen(message) > 0);
    uint32_t host_device;
    OK(nrt_host_device_id_get(0, &host_device));
    ASSERT(host_device == 0);
    EXPECT(NRT_INVALID, nrt_host_device_id_get(3, &host_device));
    puts("ok unsupported");
}

static void degraded_core(void) {
    /* The second execution on a core hits an uncorrectable memory error. */
    setenv("NEURON_RT_FAULT_INJECT", "hbm_ue:after=1", 1);
    OK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    OK(nrt_profile_continuous_start(NULL)); /* the previous runtime's ended at its close */
    OK(nrt_profile_continuous_stop());
    nrt_model_t *model;
    OK(nrt_load(neff, neff_size, 0, -1, &model));
    struct bound b = bind_add(0, 1.0f);
    OK(nrt_execute(model, b.inputs, b.outputs));
    EXPECT(NRT_EXEC_HW_ERR_HBM_UE, nrt_execute(model, b.inputs, b.outputs));
    nrta_seq_t seq;
    EXPECT(NRT_EXEC_UNIT_UNRECOVERABLE, nrta_execute_schedule(model, b.inputs, b.outputs, 0, NULL, &seq));
    unbind(&b);
    OK(nrt_unload(model));
    EXPECT(NRT_INVALID_HANDLE, nrt_unload(model));
    nrt_close();
    unsetenv("NEURON_RT_FAULT_INJECT");
    puts("ok degraded_core");
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ADD.neff ALLREDUCE.neff PROFILE.ntff\n", argv[0]);
        return 2;
    }
    neff = load_file(argv[1], &neff_size);
    allreduce_neff = load_file(argv[2], &allreduce_size);
    before_init();
    handles();
    tensors();
    large_tensor();
    nrt_model_t *model = model_info_checks();
    execute(model);
    threads(model);
    async_requests(model);
    sys_trace(model);
    profile(model, argv[3]);
    collectives();
    unsupported();

    /* After nrt_close, calls say so; nrt_init starts a new runtime. */
    nrt_tensor_t *tensor;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 16, "kept", &tensor));
    OK(nrt_profile_continuous_start(NULL)); /* left running: nrt_close ends it */
    nrt_close();
    char buffer[16];
    EXPECT(NRT_CLOSED, nrt_tensor_read(tensor, buffer, 0, 16));
    nrt_model_t *again;
    EXPECT(NRT_CLOSED, nrt_load(neff, neff_size, -1, -1, &again));
    EXPECT(NRT_CLOSED, nrt_unload(model));
    EXPECT(NRT_INVALID_HANDLE, nrt_unload(model)); /* released by the call before */
    nrt_tensor_free(&tensor);
    puts("ok close");
    degraded_core();
    free(neff);
    free(allreduce_neff);
    puts("all checks passed");
    return 0;
}
