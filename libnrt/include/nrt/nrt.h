/*
 * neuron-virt libnrt: the Neuron runtime C API over virtual NeuronCores.
 *
 * Types, enum values, struct layouts and function signatures are those of the AWS
 * Neuron SDK's public nrt/nrt.h, so programs written against it compile and link
 * unchanged (-I libnrt/include -L target/release -lnrt). Every function is a thin
 * layer over the Rust runtime; what differs on a virtual device is said at the
 * function. Handles (nrt_model_t, nrt_tensor_t, nrt_tensor_set_t, ...) are opaque:
 * the library checks every handle it is given, so a NULL, freed or foreign handle is
 * refused with NRT_INVALID or NRT_INVALID_HANDLE and a log line, never a crash. Every
 * function may be called from several threads at once.
 *
 * NeuronCore arguments named `vnc` count from the first core this process holds
 * (NEURON_RT_VISIBLE_CORES=4-5 makes vnc 0 the instance's nc4).
 */

#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"
#include "ndl/neuron_driver_shared_tensor_batch_op.h"

#ifdef __cplusplus
extern "C" {
#endif

/** API version. */
#define NRT_MAJOR_VERSION 2
#define NRT_MINOR_VERSION 0

typedef struct nrt_model nrt_model_t;
typedef struct nrt_tensor nrt_tensor_t;
typedef struct nrt_cc_context nrt_cc_context_t;

/* Enum values never change: programs store and compare them. */
typedef enum {
    NRT_TENSOR_PLACEMENT_DEVICE,   /* device memory of a NeuronCore (vnc) */
    NRT_TENSOR_PLACEMENT_HOST,     /* host memory */
    NRT_TENSOR_PLACEMENT_VIRTUAL,  /* host memory, not mapped for DMA (here: as HOST) */
} nrt_tensor_placement_t;

typedef enum {
    NRT_FRAMEWORK_TYPE_INVALID = 0,
    NRT_FRAMEWORK_TYPE_NO_FW = 1,
    NRT_FRAMEWORK_TYPE_TENSORFLOW,
    NRT_FRAMEWORK_TYPE_PYTORCH,
    NRT_FRAMEWORK_TYPE_MXNET,
    NRT_FRAMEWORK_TYPE_PRECHECK,
} nrt_framework_type_t;

/* nrt_instance_info_t.family */
enum {
    NRT_INSTANCE_UNKNOWN    = 0,
    NRT_INSTANCE_INF1       = 1,
    NRT_INSTANCE_TRN1       = 2,
    NRT_INSTANCE_TRN1N      = 3,
    NRT_INSTANCE_INF2       = 4,
    NRT_INSTANCE_TRN2       = 5,
    NRT_INSTANCE_TRN2N      = 6,
    NRT_INSTANCE_INF2E      = 7,
    NRT_INSTANCE_TRN2P      = 8,
    NRT_INSTANCE_TRN2U      = 9,
    NRT_INSTANCE_TRN2E      = 10,
    NRT_INSTANCE_TRN2EU     = 11,
    NRT_INSTANCE_TRN2AC     = 12,
    NRT_INSTANCE_TRN2UAC    = 13,
    NRT_INSTANCE_TRN3       = 14,
    NRT_INSTANCE_TRN3PDS98  = 15
};

/* nrt_instance_info_t.size */
enum {
    NRT_INSTANCE_SIZE_1XL,
    NRT_INSTANCE_SIZE_2XL,
    NRT_INSTANCE_SIZE_4XL,
    NRT_INSTANCE_SIZE_6XL,
    NRT_INSTANCE_SIZE_8XL,
    NRT_INSTANCE_SIZE_24XL,
    NRT_INSTANCE_SIZE_32XL,
    NRT_INSTANCE_SIZE_48XL,
    NRT_INSTANCE_SIZE_3XL,
    NRT_INSTANCE_SIZE_UNKNOWN,
    NRT_INSTANCE_SIZE_NUM = NRT_INSTANCE_SIZE_UNKNOWN,
};

typedef enum nrt_op_type {
    NRT_OP_ADD     = 0x0,
    NRT_OP_FMA     = 0x1,
    NRT_OP_MAX     = 0x2,
    NRT_OP_MIN     = 0x3,
    NRT_OP_INVALID = 0xF,
} nrt_op_type_t;

typedef enum nrt_dtype {
    NRT_DTYPE_UNKNOWN  = 0x0,
    NRT_DTYPE_INVALID  = 0x0,
    NRT_DTYPE_FP8_E3   = 0xD,
    NRT_DTYPE_FP8_E4   = 0xE,
    NRT_DTYPE_FP8_E5   = 0xF,
    NRT_DTYPE_FLOAT16  = 0x7,
    NRT_DTYPE_BFLOAT16 = 0x6,
    NRT_DTYPE_FLOAT32  = 0xA,
    NRT_DTYPE_FP32R    = 0xB,
    NRT_DTYPE_UINT8    = 0x3,
    NRT_DTYPE_UINT16   = 0x5,
    NRT_DTYPE_UINT32   = 0x9,
    NRT_DTYPE_UINT64   = 0x1,
    NRT_DTYPE_INT8     = 0x2,
    NRT_DTYPE_INT16    = 0x4,
    NRT_DTYPE_INT32    = 0x8,
    NRT_DTYPE_INT64    = 0xC,
} nrt_dtype_t;

typedef enum nrt_cc_op_type {
    NRT_CC_ALLGATHER,
    NRT_CC_ALLREDUCE,
    NRT_CC_REDUCESCATTER
} nrt_cc_op_type_t;

typedef struct nrt_instance_info {
    uint32_t family;            /* NRT_INSTANCE_* of NEURON_VIRT_INSTANCE_TYPE */
    uint32_t size;              /* NRT_INSTANCE_SIZE_* */
    char arch_name[16];         /* NUL-terminated device type: "trainium", "inferentia2", "trainium2" */
    char device_revision[8];    /* NUL-terminated NeuronCore version: "v2", "v3" */
} nrt_instance_info_t;

/** Describes the (virtual) instance; fills the first `instance_info_len` bytes of `*info`.
 *  May be called before nrt_init(). */
NRT_STATUS nrt_get_instance_info(nrt_instance_info_t *info, size_t instance_info_len);

/** Starts the runtime: reads the NEURON_RT_* environment, reserves the NeuronCores it
 *  asks for (host-wide, exclusively) and creates the datastore the tools read.
 *  `framework` must not be NRT_FRAMEWORK_TYPE_INVALID; the version strings may be NULL. */
NRT_STATUS nrt_init(nrt_framework_type_t framework, const char *fw_version, const char *fal_version);

/** Unloads every model, releases the NeuronCores and closes the runtime. Later calls
 *  return NRT_CLOSED until nrt_init() starts a new runtime. */
void nrt_close(void);

/** Loads a NEFF onto NeuronCore `vnc`, or with vnc = -1 onto the held core with the
 *  fewest models (a free one when there is one). `vnc_count` is deprecated: pass -1
 *  (or 1). NRT_LOAD_NOT_ENOUGH_NC when `vnc` is not one of the process's cores. */
NRT_STATUS nrt_load(const void *neff_bytes, size_t size, int32_t vnc, int32_t vnc_count, nrt_model_t **model);

/** Loads rank `ctx_device_id` of a collectives program of `ctx_device_count` ranks.
 *  Call it once per rank, from one or several threads. Without NEURON_RT_ROOT_COMM_ID
 *  every rank is in this process, on consecutive cores: rank r on vnc (base + r),
 *  where base = vnc - ctx_device_id (vnc = -1 means base 0). With it, the ranks are
 *  spread over the job's processes (each loads the ranks it holds: the global device
 *  id and count), rank 0's process listens at that address and the others connect;
 *  the rank runs on `vnc`, or with -1 on the process's core (ctx_device_id mod the
 *  cores it holds). Their collectives exchange data once all ranks are loaded. */
NRT_STATUS nrt_load_collectives(const void *neff_bytes, size_t size, int32_t vnc, int32_t vnc_count,
                                uint32_t ctx_device_id, uint32_t ctx_device_count, nrt_model_t **model);

/** Unloads a model and releases its memory; the handle is invalid afterwards. After
 *  nrt_close() the model is already gone: NRT_CLOSED, and the handle is released. */
NRT_STATUS nrt_unload(nrt_model_t *model);

/** NeuronCores a loaded model uses (always 1 here). */
NRT_STATUS nrt_get_model_nc_count(const nrt_model_t *model, uint32_t *vnc_count);
NRT_STATUS nrt_get_model_vnc_count(const nrt_model_t *model, uint32_t *vnc_count);

/** NeuronCores of the instance. May be called before nrt_init(). */
NRT_STATUS nrt_get_total_nc_count(uint32_t *vnc_count);
NRT_STATUS nrt_get_total_vnc_count(uint32_t *vnc_count);

/** NeuronCores this process holds (after nrt_init()) or would hold (before: as
 *  NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES ask). */
NRT_STATUS nrt_get_visible_nc_count(uint32_t *vnc_count);
NRT_STATUS nrt_get_visible_vnc_count(uint32_t *vnc_count);

/** Named tensors bound to a model's inputs or outputs. */
typedef void nrt_tensor_set_t;

NRT_STATUS nrt_allocate_tensor_set(nrt_tensor_set_t **result);

/** Destroys a tensor set and sets `*tensor_set` to NULL; its tensors are not freed. */
void nrt_destroy_tensor_set(nrt_tensor_set_t **tensor_set);

/** Binds `tensor` to `tensor_name`, replacing an earlier binding of that name. */
NRT_STATUS nrt_add_tensor_to_tensor_set(nrt_tensor_set_t *tensor_set, const char *tensor_name, nrt_tensor_t *tensor);

/** The tensor bound to `tensor_name`; NRT_INVALID when there is none, NRT_INVALID_HANDLE
 *  when that tensor was freed since (the set still holds its memory). */
NRT_STATUS nrt_get_tensor_from_tensor_set(nrt_tensor_set_t *tensor_set, const char *tensor_name, nrt_tensor_t **tensor);

/** Runs a model once on its core, reading `input_set` and writing `output_set`
 *  (names as nrt_get_model_tensor_info() lists them). */
NRT_STATUS nrt_execute(nrt_model_t *model, const nrt_tensor_set_t *input_set, nrt_tensor_set_t *output_set);

/** Runs a model `repeat_count` times, one after the other, each as nrt_execute() runs it.
 *  `repeat_count` must be 1 or more: 0 or a negative count runs nothing and returns
 *  NRT_INVALID (naming the count in the log). */
NRT_STATUS nrt_execute_repeat(nrt_model_t *model, const nrt_tensor_set_t *input_set, nrt_tensor_set_t *output_set,
                              int repeat_count);

/** Joins rank `g_device_id` of the job's global communicator of `g_device_count` ranks,
 *  on NeuronCore `vnc` (-1: the process's core g_device_id mod the cores it holds).
 *  Needs NEURON_RT_ROOT_COMM_ID (rank 0's process listens there). Returns once joined;
 *  the first nrt_barrier or nrt_all_gather waits for every rank to join. */
NRT_STATUS nrt_build_global_comm(int32_t vnc, uint32_t g_device_id, uint32_t g_device_count);

/** Allocates a zero-filled tensor of `size` bytes (64-bit sizes: 4 GiB and more work)
 *  on NeuronCore `vnc`'s device memory, or on the host (vnc ignored, pass -1).
 *  `name` may be NULL. */
NRT_STATUS nrt_tensor_allocate(nrt_tensor_placement_t tensor_placement, int vnc, size_t size, const char *name,
                               nrt_tensor_t **tensor);

/** Frees a tensor and sets `*tensor` to NULL. Tensor sets and slices that still use its
 *  memory keep it alive until they go. */
void nrt_tensor_free(nrt_tensor_t **tensor);

/** Copies `size` bytes from the tensor at `offset` into `buf`; out of range, or a `buf`
 *  overlapping the tensor's own memory: NRT_INVALID. */
NRT_STATUS nrt_tensor_read(const nrt_tensor_t *tensor, void *buf, size_t offset, size_t size);

/** Copies `size` bytes from `buf` into the tensor at `offset`; out of range, or a `buf`
 *  overlapping the tensor's own memory: NRT_INVALID. */
NRT_STATUS nrt_tensor_write(nrt_tensor_t *tensor, const void *buf, size_t offset, size_t size);

/** Operations on one tensor, for the batch calls. */
typedef struct nrt_tensor_batch {
    const nrt_tensor_t *tensor;
    const nrt_tensor_batch_op_t *ops;
    uint32_t num_ops;
} nrt_tensor_batch_t;

/** Runs every read (or write) of every batch, in order; stops at the first failure.
 *  `unsafe` is accepted and changes nothing. */
NRT_STATUS nrt_tensor_read_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches, bool unsafe);
NRT_STATUS nrt_tensor_write_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches, bool unsafe);

/** Copies `size` bytes between tensors; two device tensors must be on the same core. */
NRT_STATUS nrt_tensor_copy(const nrt_tensor_t *src, size_t src_offset, nrt_tensor_t *dst, size_t dst_offset,
                           size_t size);

/** The tensor's size in bytes (0 for an invalid handle, which is logged). */
size_t nrt_tensor_get_size(const nrt_tensor_t *tensor);

/** Sets `size` bytes from `offset` to `value` (converted to unsigned char). */
NRT_STATUS nrt_tensor_memset(nrt_tensor_t *tensor, uint64_t offset, int value, size_t size);

/** A tensor with no memory yet: give it some with nrt_tensor_attach_buffer(). */
NRT_STATUS nrt_tensor_allocate_empty(const char *name, nrt_tensor_t **tensor);

/** Makes the caller's `buffer` of `size` bytes the tensor's memory (a host tensor),
 *  replacing any memory it had; tensor sets holding the tensor use the new memory,
 *  slices made before keep viewing the old. The buffer must stay valid while the
 *  tensor, or a tensor set or request holding it, exists, and must not overlap the
 *  memory of another tensor. */
NRT_STATUS nrt_tensor_attach_buffer(nrt_tensor_t *tensor, void *buffer, size_t size);

/** A tensor viewing `size` bytes of `tensor_source` from `offset` (no copy). */
NRT_STATUS nrt_tensor_allocate_slice(const nrt_tensor_t *tensor_source, size_t offset, size_t size, const char *name,
                                     nrt_tensor_t **tensor_slice);

/** The address of the tensor's memory in this process (device tensors too: virtual
 *  device memory is host memory); NULL for an invalid handle or a tensor with no
 *  memory. Accesses through it must not overlap executions that use the tensor. */
void *nrt_tensor_get_va(const nrt_tensor_t *tensor);

typedef struct nrt_tensor_device_allocation_info {
    uint64_t physical_address;
    size_t size;
    int hbm_index;
} nrt_tensor_device_allocation_info_t;

/** Not supported on virtual NeuronCores (no physical device memory): NRT_INVALID. */
NRT_STATUS nrt_tensor_get_device_allocation_info(const nrt_tensor_t *tensor,
                                                 nrt_tensor_device_allocation_info_t *alloc_info);

/** Not supported (output completion counters belong to device-driven execution): NRT_INVALID. */
NRT_STATUS nrt_tensor_check_output_completion(const nrt_tensor_t *output_tensor, int64_t timeout,
                                              uint64_t expected_completion_count);
NRT_STATUS nrt_tensor_reset_output_completion(nrt_tensor_t *output_tensor);

/** Not supported (no dma-buf on virtual devices): NRT_INVALID. */
NRT_STATUS nrt_get_dmabuf_fd(uint64_t va, uint64_t size, int *fd);

/** The host's id of a device: the same index here (NRT_INVALID beyond the device count). */
NRT_STATUS nrt_host_device_id_get(int neuron_dev, uint32_t *host_device_id);

/** Not supported (no routing ids on virtual devices): NRT_INVALID. */
NRT_STATUS nrt_host_device_id_rid_map_get(uint32_t *count, uint32_t *host_did_to_rid_map);

/** Not supported (no HBM mappings on virtual devices): NRT_INVALID. */
NRT_STATUS nrt_get_hbm_mmap_va(int device_id, int hbm_idx, void **addr, size_t *size);

typedef struct nrt_vnc_memory_stats {
    size_t bytes_used;
    size_t bytes_limit;
} nrt_vnc_memory_stats_t;

/** Device memory in use on NeuronCore `vnc` and the core's share of its device's memory.
 *  Writes min(stats_size_in, sizeof) bytes and says how many in `*stats_size_out`. */
NRT_STATUS nrt_get_vnc_memory_stats(uint32_t vnc, nrt_vnc_memory_stats_t *stats, size_t stats_size_in,
                                    size_t *stats_size_out);

/** Not supported (no EFA devices): NRT_INVALID. */
NRT_STATUS nrt_get_attached_efa_bdf(const void *va, char *efa_bdf, size_t *len);

typedef struct nrt_cc_comm {
    uint32_t *replica_group;
    uint32_t rank;
    uint32_t rank_n;
    uint32_t ctx_device_id;
    uint32_t ctx_device_count;
    uint32_t vnc;
} nrt_cc_comm_t;

typedef struct nrt_tensor_list {
    nrt_tensor_t **tensors;
    size_t num_tensors;
} nrt_tensor_list_t;

/** As nrt_build_global_comm(). */
NRT_STATUS nrt_cc_global_comm_init(uint32_t vnc, uint32_t g_device_id, uint32_t g_device_count);

#ifdef __cplusplus
}
#endif
