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

/** Starts recording every core's system and device trace as NEURON_RT_INSPECT_*
 *  configure it; nrt_inspect_stop() writes it to an NTFF file in
 *  NEURON_RT_INSPECT_OUTPUT_DIR (default ./output), named as neuron-profile inspect
 *  names its files. */
NRT_STATUS nrt_inspect_begin(void);
NRT_STATUS nrt_inspect_stop(void);

#ifdef __cplusplus
}
#endif
