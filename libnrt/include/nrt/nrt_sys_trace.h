/*
 * neuron-virt libnrt: the system trace, captured in this process and fetched as JSON.
 *
 * A capture records the runtime's system events (nrt_load, nrt_execute,
 * nc_exec_running, nrt_tensor_read, ...) of the chosen cores and types, on top of
 * what NEURON_RT_INSPECT_* asks for. A fetch returns the events not fetched before as
 *   {"events":[{"event_type", "phase", "id", "nc_idx", "tracking_id", "thread_id",
 *               "data", "timestamp_ns", "nrta_seq_id"?}, ...], "data_version":2}
 * Each event is returned once. nc_idx is the NeuronCore's index on the instance, as
 * every tool shows it. The same events reach neuron-top, neuron-monitor and the
 * dashboard through the process's datastore.
 */

#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nrt_sys_trace_config nrt_sys_trace_config_t;

/** A capture configuration with the defaults: every core, every event type, and
 *  at most 1,048,576 events kept per core. The rings themselves hold
 *  NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC events per core (65,536 unless set, or
 *  NEURON_RT_INSPECT_ENABLE=1 is): fetch more often than a busy core fills them. */
NRT_STATUS nrt_sys_trace_config_allocate(nrt_sys_trace_config_t **options);
void nrt_sys_trace_config_set_defaults(nrt_sys_trace_config_t *options);
void nrt_sys_trace_config_free(nrt_sys_trace_config_t *options);

/** Events kept per core until fetched; older ones are dropped and counted. */
void nrt_sys_trace_config_set_max_events_per_nc(nrt_sys_trace_config_t *options, uint64_t max_events_per_nc);

/** Captures, or not, the events of NeuronCore `nc_idx` (an instance core index). */
void nrt_sys_trace_config_set_capture_enabled_for_nc(nrt_sys_trace_config_t *options, uint32_t nc_idx, bool enabled);

/** Captures, or not, one event type (a name nrt_sys_trace_get_event_types() lists);
 *  NRT_INVALID for an unknown name. */
NRT_STATUS nrt_sys_trace_config_set_capture_enabled_for_event_type(nrt_sys_trace_config_t *options,
                                                                   const char *event_type, bool enabled);

/** Every event type name, in a malloc'd array of malloc'd strings: free(3) each and the
 *  array, or call nrt_sys_trace_free_event_types(). */
NRT_STATUS nrt_sys_trace_get_event_types(const char ***event_types, size_t *count);
void nrt_sys_trace_free_event_types(const char **event_types, size_t count);

/** The event types `options` captures, allocated as by nrt_sys_trace_get_event_types(). */
NRT_STATUS nrt_sys_trace_config_get_enabled_event_types(nrt_sys_trace_config_t *options, const char ***event_types,
                                                        size_t *count);

/** Starts a capture (one at a time; NRT_INVALID while one runs). NULL: the defaults. */
NRT_STATUS nrt_sys_trace_start(nrt_sys_trace_config_t *options);

/** Stops the capture; what it recorded can still be fetched. */
NRT_STATUS nrt_sys_trace_stop(void);

typedef struct nrt_sys_trace_fetch_options nrt_sys_trace_fetch_options_t;
NRT_STATUS nrt_sys_trace_fetch_options_allocate(nrt_sys_trace_fetch_options_t **options);
void nrt_sys_trace_fetch_options_set_defaults(nrt_sys_trace_fetch_options_t *options);
void nrt_sys_trace_fetch_options_free(nrt_sys_trace_fetch_options_t *options);
/** At most this many events per core, the oldest first; the others stay for the next fetch. */
void nrt_sys_trace_fetch_options_set_max_events_per_nc(nrt_sys_trace_fetch_options_t *options,
                                                       uint64_t max_events_per_nc);
/** Only the events of NeuronCore `nc_idx`; the others stay for a later fetch. */
void nrt_sys_trace_fetch_options_set_nc_idx(nrt_sys_trace_fetch_options_t *options, uint64_t nc_idx);

/** The captured events not fetched before, as a NUL-terminated JSON string in a
 *  buffer the library allocates (`*written_size` bytes, without the NUL); free it
 *  with nrt_sys_trace_buffer_free(). `options` may be NULL. */
NRT_STATUS nrt_sys_trace_fetch_events(char **buffer, size_t *written_size,
                                      const nrt_sys_trace_fetch_options_t *options);
void nrt_sys_trace_buffer_free(char *buffer);

#ifdef __cplusplus
}
#endif
