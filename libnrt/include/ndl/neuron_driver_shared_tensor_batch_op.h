/*
 * neuron-virt libnrt: one operation of nrt_tensor_read_batch() / nrt_tensor_write_batch(),
 * in the header the Neuron SDK keeps it in (nrt/nrt.h includes it).
 */

#ifndef NEURON_DRIVER_SHARED_TENSOR_BATCH_OP_H
#define NEURON_DRIVER_SHARED_TENSOR_BATCH_OP_H

#include <stdint.h>

typedef uint64_t nrt_tensor_batch_offset_t;
typedef uint64_t nrt_tensor_batch_size_t;

/* `size` bytes at `offset` of the batch's tensor, to or from `buffer`. */
typedef struct nrt_tensor_batch_op {
    nrt_tensor_batch_offset_t offset;
    nrt_tensor_batch_size_t size;
    void *buffer;
} nrt_tensor_batch_op_t;

#endif /* NEURON_DRIVER_SHARED_TENSOR_BATCH_OP_H */
