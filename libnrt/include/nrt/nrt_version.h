/*
 * neuron-virt libnrt: the library's version.
 */

#pragma once

#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RT_VERSION_DETAIL_LEN 128
#define GIT_HASH_LEN 64

typedef struct nrt_version {
    uint64_t rt_major;
    uint64_t rt_minor;
    uint64_t rt_patch;
    uint64_t rt_maintenance;
    char rt_detail[RT_VERSION_DETAIL_LEN];  /* NUL-terminated description of the library */
    char git_hash[GIT_HASH_LEN];            /* NUL-terminated; empty when unknown */
} nrt_version_t;

/** Fills the first `size` bytes of `*ver` with the library's version
 *  (`size` is sizeof(nrt_version_t) of the caller's header). */
NRT_STATUS nrt_get_version(nrt_version_t *ver, size_t size);

#ifdef __cplusplus
}
#endif
