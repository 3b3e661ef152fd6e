/* plan.h — a plan's storage. Internal; a leaf. */
#ifndef FERRY_ENGINE_PLAN_H
#define FERRY_ENGINE_PLAN_H
#include "common.h"

struct ferry_plan {
    ferry_extent *ext;            /* ext[i].place points into places[] by index (see plan.c) */
    ferry_place *places;
    size_t n, cap, nplaces, cap_places;
    char *strings;                /* copied paths and labels, offsets stored in the pointers' place */
    size_t nstr, cap_str;
    uintptr_t last_root;          /* the last NOFOLLOW root copied (index+1), 0: none */
    void *wait_stream[FERRY_MAX_WAIT_STREAMS];   /* ferry_plan_wait_stream (streamwait.c) */
    int wait_device[FERRY_MAX_WAIT_STREAMS];
    int nwait;
    const void *memo_owner;       /* ferry_plan_memo (common.h): one format's memo, freed with the plan */
    void *memo;
    void (*memo_release)(void *);
};

#endif
