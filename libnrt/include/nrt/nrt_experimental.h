/*
 * neuron-virt libnrt: model introspection and less common calls.
 */

#pragma once

#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"
#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nrt_tensor_usage {
    NRT_TENSOR_USAGE_INPUT = 0,
    NRT_TENSOR_USAGE_OUTPUT,
} nrt_tensor_usage_t;

#define NRT_TENSOR_NAME_MAX 256

typedef struct nrt_tensor_info {
    char name[NRT_TENSOR_NAME_MAX];     /* NUL-terminated, as bound in tensor sets */
    nrt_tensor_usage_t usage;
    size_t size;                        /* bytes */
    nrt_dtype_t dtype;
    uint32_t *shape;                    /* ndim dimensions, outermost first */
    uint32_t ndim;
} nrt_tensor_info_t;

typedef struct nrt_tensor_info_array {
    uint64_t tensor_count;
    nrt_tensor_info_t tensor_array[];   /* inputs first, then outputs */
} nrt_tensor_info_array_t;

typedef void (*NRT_ASYNC_EXEC_STATUS_CALLBACK)(void *params, uint32_t model_id, uint32_t vnc, uint64_t job_id,
                                               NRT_STATUS status);

/** The model's inputs and outputs; free the array with nrt_free_model_tensor_info(). */
NRT_STATUS nrt_get_model_tensor_info(nrt_model_t *model, nrt_tensor_info_array_t **tensor_info);

/** Threads that may usefully call nrt_execute() on the model at once: 1 (a core runs
 *  one execution at a time). */
NRT_STATUS nrt_get_model_instance_count(nrt_model_t *model, uint32_t *instance_count);

NRT_STATUS nrt_free_model_tensor_info(nrt_tensor_info_array_t *tensor_info);

/** Starts recording the system and device trace of every core (trace_mem is accepted
 *  and changes nothing); nrt_trace_stop() writes it to an NTFF file. */
NRT_STATUS nrt_trace_start(bool trace_mem);
NRT_STATUS nrt_trace_stop(const char *filename);

/** Not supported (no NCCL network plugin): NULL, with the reason in err_msg. */
void *nrt_get_libnccl_net(int *err, char *err_msg, size_t err_msg_size);

typedef struct nrt_ucode_img {
    uint8_t *bin;
    size_t size;
} nrt_ucode_img;

typedef struct nrt_ucode_info {
    nrt_ucode_img iram;
    nrt_ucode_img dram;
} nrt_ucode_info;

/** Not supported (virtual engines run no microcode): NRT_INVALID. */
NRT_STATUS nrt_set_pool_eng_ucode(const nrt_ucode_info *ucode_info);

/** Copies `size` bytes to memory obtained from nrt_tensor_get_va(). */
NRT_STATUS nrt_memcpy_to_device(void *dest, const void *src, size_t size);

/** Not supported (use nrta_* requests and error trackers): NRT_INVALID. */
NRT_STATUS nrt_register_async_exec_callback(NRT_ASYNC_EXEC_STATUS_CALLBACK callback, void *params);

/** Returns once every rank of the global communicator (nrt_build_global_comm(), which
 *  this joins if needed) has called it; NRT_EXEC_HW_ERR_COLLECTIVES when a rank does not
 *  within NEURON_RT_EXEC_TIMEOUT, NRT_NETWORK_PROXY_FAILURE when a rank's process is gone. */
NRT_STATUS nrt_barrier(int32_t vnc, uint32_t g_device_id, uint32_t g_device_count);
/** Gathers each rank's `rank_input_size` bytes at `input` into `output` (rank_input_size *
 *  g_device_count bytes, in rank order) on every rank of the global communicator. */
NRT_STATUS nrt_all_gather(int32_t vnc, uint32_t g_device_id, uint32_t g_device_count, uint32_t rank_input_size,
                          void *input, void *output);


typedef struct nrt_model_info {
    uint32_t vnc;
} nrt_model_info_t;

/** The model's NeuronCore; writes min(info_size_in, sizeof) bytes, the count in *info_size_out. */
NRT_STATUS nrt_get_model_info(const nrt_model_t *model, nrt_model_info_t *info, size_t info_size_in,
                              size_t *info_size_out);

#ifdef __cplusplus
}
#endif
