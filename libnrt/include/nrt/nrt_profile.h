/*
 * neuron-virt libnrt: device profiles written to NTFF files that neuron-profile view
 * and the dashboard open.
 */

#pragma once

#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Starts profiling `model`: every execution of it from now on is recorded, with its
 *  device trace (each instruction on each engine, each DMA transfer), until
 *  nrt_profile_stop(). One profile at a time; `filename` must be the one given to
 *  nrt_profile_stop(). */
NRT_STATUS nrt_profile_start(nrt_model_t *model, const char *filename);

/** Stops the profile started for `filename` and writes it there as an NTFF file. */
NRT_STATUS nrt_profile_stop(const char *filename);

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Options of continuous device profiling: where saved profiles go (default ./output). */
typedef struct nrt_profile_continuous_options nrt_profile_continuous_options_t;

NRT_STATUS nrt_profile_continuous_options_allocate(nrt_profile_continuous_options_t **options);
NRT_STATUS nrt_profile_continuous_options_free(nrt_profile_continuous_options_t *options);
NRT_STATUS nrt_profile_continuous_options_set_output_dir(nrt_profile_continuous_options_t *options,
                                                         const char *output_dir);

/** Traces every execution on the device from now on, keeping the trace in the rings
 *  until nrt_profile_continuous_save() writes one. `options` may be NULL. */
NRT_STATUS nrt_profile_continuous_start(nrt_profile_continuous_options_t *options);

/** Writes the latest completed execution of NeuronCore `vnc` that the trace rings hold
 *  to a new NTFF file in the options' output directory (NULL: ./output). Profiling
 *  goes on. */
NRT_STATUS nrt_profile_continuous_save(uint32_t vnc, nrt_profile_continuous_options_t *options);

/** Stops continuous profiling (without saving). */
NRT_STATUS nrt_profile_continuous_stop(void);

/** Starts recording every core's system and device trace as NEURON_RT_INSPECT_*
 *  configure it; nrt_inspect_stop() writes it to an NTFF file in
 *  NEURON_RT_INSPECT_OUTPUT_DIR (default ./output), named as neuron-profile inspect
 *  names its files. */
NRT_STATUS nrt_inspect_begin(void);

/** Stops the recording of nrt_inspect_begin() or nrt_inspect_begin_with_options() and
 *  writes its file. */
NRT_STATUS nrt_inspect_stop(void);

/** Options of nrt_inspect_begin_with_options(), which ignores NEURON_RT_INSPECT_*.
 *  Defaults: session 1, ./output, every core and event type, every activity, inspect
 *  disabled. */
typedef struct nrt_inspect_config nrt_inspect_config_t;

NRT_STATUS nrt_inspect_config_allocate(nrt_inspect_config_t **options);
NRT_STATUS nrt_inspect_config_set_defaults(nrt_inspect_config_t *options);
NRT_STATUS nrt_inspect_config_free(nrt_inspect_config_t *options);
/** The session id names the file: <host>-pid<pid>-session<id>.ntff. */
NRT_STATUS nrt_inspect_config_set_session_id(nrt_inspect_config_t *options, int session_id);
NRT_STATUS nrt_inspect_config_set_output_dir(nrt_inspect_config_t *options, const char *output_dir);
/** Accepted; the rings keep the size NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC gave
 *  them at nrt_init(), and the recording drains them as it goes. */
NRT_STATUS nrt_inspect_config_set_sys_trace_max_events_per_nc(nrt_inspect_config_t *options,
                                                              uint64_t sys_trace_max_events_per_nc);
/** Records, or not, NeuronCore `nc_idx` (an instance core index). */
NRT_STATUS nrt_inspect_config_set_capture_enabled_for_nc(nrt_inspect_config_t *options, uint32_t nc_idx,
                                                         bool enabled);
/** Records, or not, one system event type (as nrt_sys_trace_get_event_types() names them). */
NRT_STATUS nrt_inspect_config_set_capture_enabled_for_event_type_string(nrt_inspect_config_t *options,
                                                                        const char *event_type, bool enabled);
/** Without it, nrt_inspect_begin_with_options() records nothing. */
NRT_STATUS nrt_inspect_config_set_enable_inspect(nrt_inspect_config_t *options, bool enable_inspect);
/** Not supported through the API (NRT_INVALID for true): run the program under
 *  `neuron-profile inspect` with NEURON_RT_INSPECT_ON_FAIL=1. */
NRT_STATUS nrt_inspect_config_set_enable_inspect_on_fail(nrt_inspect_config_t *options, bool enable_inspect_on_fail);

/** Starts the recording `options` describes (NULL: the defaults, which record nothing). */
NRT_STATUS nrt_inspect_begin_with_options(nrt_inspect_config_t *options);

/** The activity types ("system_profile", "device_profile", "host_memory", "cpu_util"),
 *  malloc'd as nrt_sys_trace_get_event_types() returns event types. host_memory and
 *  cpu_util are always in the process's datastore (neuron-top, neuron-monitor show
 *  them); the NTFF file holds the system and device profiles. */
NRT_STATUS nrt_inspect_config_get_all_activity_types(const char ***activity_types, size_t *count);
NRT_STATUS nrt_inspect_config_get_enabled_activity_types(nrt_inspect_config_t *options, const char ***activity_types,
                                                         size_t *count);
void nrt_inspect_config_free_activity_types(const char **activity_types, size_t count);
/** Enables or disables an activity type, or every one with "all". */
NRT_STATUS nrt_inspect_config_set_activity(nrt_inspect_config_t *options, const char *activity_type, bool enabled);

#ifdef __cplusplus
}
#endif
