/*
 * neuron-virt libnrt: status codes of the Neuron runtime C API.
 *
 * Every function returning NRT_STATUS returns one of these; the values are those of
 * the AWS Neuron SDK's public nrt_status.h, so programs that compare against them, or
 * print the numbers, behave the same here.
 */

#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    NRT_SUCCESS = 0,
    NRT_FAILURE = 1,                        /* non-specific failure (also: an internal error, logged) */
    NRT_INVALID = 2,                        /* invalid argument, NEFF, or input/output binding; also: not supported here */
    NRT_INVALID_HANDLE = 3,                 /* a model, tensor, tensor set or tracker handle this library does not know */
    NRT_RESOURCE = 4,                       /* out of device or host memory, threads or descriptors */
    NRT_TIMEOUT = 5,                        /* an execution ran longer than NEURON_RT_EXEC_TIMEOUT */
    NRT_HW_ERROR = 6,                       /* an (injected) hardware failure */
    NRT_QUEUE_FULL = 7,                     /* the execution unit's queue is full: wait for a completion */
    NRT_LOAD_NOT_ENOUGH_NC = 9,             /* not enough free NeuronCores to load the NEFF */
    NRT_UNSUPPORTED_NEFF_VERSION = 10,      /* the NEFF's version or features are not supported */
    NRT_FAIL_HOST_MEM_ALLOC = 11,           /* host memory allocation failed */
    NRT_UNINITIALIZED = 13,                 /* called before nrt_init() */
    NRT_CLOSED = 14,                        /* called after nrt_close() */
    NRT_QUEUE_EMPTY = 15,                   /* the queue has no data */
    NRT_EXEC_UNIT_UNRECOVERABLE = 101,      /* the execution unit is degraded; later requests on it fail too */
    NRT_EXEC_BAD_INPUT = 1002,              /* invalid execution input (a tensor set that does not match the model is NRT_INVALID, as in libnrt) */
    NRT_EXEC_COMPLETED_WITH_NUM_ERR = 1003, /* completed, but produced NaN or Inf */
    NRT_EXEC_COMPLETED_WITH_ERR = 1004,     /* completed with other errors */
    NRT_EXEC_NC_BUSY = 1005,                /* the NeuronCore is held by another model or process */
    NRT_EXEC_OOB = 1006,                    /* a gather or scatter index was out of bounds */
    NRT_COLL_PENDING = 1100,                /* a collective operation is still pending */
    NRT_EXEC_HW_ERR_COLLECTIVES = 1200,     /* stuck in a collective (missing notifications) */
    NRT_EXEC_HW_ERR_HBM_UE = 1201,          /* uncorrectable device memory error */
    NRT_EXEC_HW_ERR_NC_UE = 1202,           /* NeuronCore on-chip memory parity error */
    NRT_EXEC_HW_ERR_DMA_ABORT = 1203,       /* DMA engine unrecoverable error */
    NRT_EXEC_SW_NQ_OVERFLOW = 1204,         /* software notification queue overflow */
    NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE = 1205, /* repairable uncorrectable device memory error */
    NRT_NETWORK_PROXY_FAILURE = 1206,       /* network proxy failure */
} NRT_STATUS;

#ifdef __cplusplus
}
#endif
