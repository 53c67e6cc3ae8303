/*
 * neuron-virt libnrt: asynchronous requests (nrta_*).
 *
 * Each NeuronCore has execution units (XUs): tensor read, tensor write, tensor op,
 * compute and collectives, each running its requests in order from a bounded queue
 * (the compute unit holds NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS, default 8, in
 * flight). Scheduling returns at once with the request's sequence id, or
 * NRT_QUEUE_FULL. A request that fails still completes; an error tracker passed when
 * scheduling it records its sequence id and status. After a degrading fault, every
 * later request on that core's unit is refused with NRT_EXEC_UNIT_UNRECOVERABLE.
 */

#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    NRTA_XU_TENSOR_READ = 0,
    NRTA_XU_TENSOR_WRITE,
    NRTA_XU_TENSOR_OP,
    NRTA_XU_COMPUTE,
    NRTA_XU_COLLECTIVES,
    NRTA_XU_TYPE_NUM
} nrta_xu_t;

/* A sequence id: the top 16 bits name the execution unit, the low 48 bits count its
 * requests from 1, in order. */
typedef uint64_t nrta_seq_t;
typedef uint16_t nrta_xu_id_t;

#define NRTA_SEQ_NUM_MAX      ((1ull << 48) - 1)
#define NRTA_SEQ_NUM_MASK     NRTA_SEQ_NUM_MAX
#define NRTA_SEQ_GET_SEQ_NUM(seq_id)  (seq_id & NRTA_SEQ_NUM_MASK)
#define NRTA_SEQ_GET_XU_ID(seq_id)    (seq_id >> 48)

typedef struct nrta_error {
    nrta_seq_t seq_id;
    uint64_t error_code; /* an NRT_STATUS */
} nrta_error_t;
#ifdef __cplusplus
static_assert(sizeof(nrta_error_t) == 16, "nrta_error_t must be of size 16");
#else
_Static_assert(sizeof(nrta_error_t) == 16, "nrta_error_t must be of size 16");
#endif

typedef struct nrta_error_tracker nrta_error_tracker_t;

/** Schedules a write of `size` bytes from `buf` into the tensor at `offset`, on the
 *  tensor-write unit of the tensor's core (vnc 0 for host tensors). `buf` must stay
 *  valid until the request completes. `queue` must be 0; `err` may be NULL. */
NRT_STATUS nrta_tensor_write(nrt_tensor_t *tensor, const void *buf, uint64_t offset, uint64_t size, int queue,
                             nrta_error_tracker_t *err, nrta_seq_t *req_sequence);

/** Schedules a read of `size` bytes of the tensor from `offset` into `buf`, on the
 *  tensor-read unit; `buf` is filled when the request completes. */
NRT_STATUS nrta_tensor_read(void *buf, nrt_tensor_t *tensor, uint64_t offset, uint64_t size, int queue,
                            nrta_error_tracker_t *err, nrta_seq_t *req_sequence);

/** Schedules a copy between two tensors of the same core, on its tensor-op unit. */
NRT_STATUS nrta_tensor_copy(nrt_tensor_t *src, uint64_t src_offset, nrt_tensor_t *dst, uint64_t dst_offset,
                            uint64_t size, int queue, nrta_error_tracker_t *err, nrta_seq_t *req_sequence);

/** Schedules an execution of `model` on its core's compute unit. The tensor sets are
 *  taken as they are now; their tensors are read and written when it runs. */
NRT_STATUS nrta_execute_schedule(nrt_model_t *model, const nrt_tensor_set_t *input, nrt_tensor_set_t *output,
                                 int queue, nrta_error_tracker_t *err, nrta_seq_t *req_sequence);

/** Not supported yet (host-driven collectives; collectives inside a NEFF work): NRT_INVALID. */
NRT_STATUS nrta_cc_prepare(nrt_cc_comm_t *comm, nrt_tensor_list_t *input, nrt_tensor_list_t *output,
                           nrt_dtype_t dtype, nrt_op_type_t op, nrt_cc_op_type_t cc_op, nrt_cc_context_t **cc_ctx);
NRT_STATUS nrta_cc_schedule(nrt_cc_context_t **cc_ctx, int queue, nrta_error_tracker_t *err,
                            nrta_seq_t *req_sequence);

/** Whether request `seq` has completed (successfully or not); NRT_INVALID for a
 *  sequence id that was never scheduled. */
NRT_STATUS nrta_is_completed(nrta_seq_t seq, bool *is_completed);

/** The last completed request of unit `xu` of NeuronCore `lnc` (the unit's id with
 *  sequence number 0 when none has completed yet). */
NRT_STATUS nrta_get_sequence(uint32_t lnc, nrta_xu_t xu, int queue, nrta_seq_t *seq);

/** A non-blocking file descriptor (an eventfd) that becomes readable (poll(2)) when
 *  request `seq` completes; close(2) it when done. While the request is pending, a
 *  thread of the library waits for it. */
NRT_STATUS nrta_get_completion_handle(nrta_seq_t seq, int *fd);

/** An error tracker for the requests of NeuronCore `lnc_idx`. */
NRT_STATUS nrta_error_tracker_create(uint32_t lnc_idx, nrta_error_tracker_t **error_tracker);

/** Destroys a tracker (NULL: nothing); the list it last returned becomes invalid. */
void nrta_error_tracker_destroy(nrta_error_tracker_t *error_tracker);

/** The failures the tracker saw since the last call, in completion order. The list
 *  stays valid until the next call with this tracker or its destruction, so call it
 *  from one thread at a time per tracker. Each failure is also logged, once. */
NRT_STATUS nrta_error_tracker_get_list(nrta_error_tracker_t *error_tracker, const nrta_error_t **list,
                                       size_t *error_count);

#ifdef __cplusplus
}
#endif
