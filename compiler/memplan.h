/* memplan.h — the static memory plan of every rank.
 *
 * Per pipeline stage (its ranks are alike), every buffer gets a place:
 *
 *   persistent   params, their gradients and the optimizer state, after
 *                the tp/ep splits and ZeRO's sharding over dp;
 *   slots        the activations one (micro-batch, chunk) unit keeps for its
 *                backward (what each op's backward reads: a matmul's input, a
 *                norm's input and row statistics, attention's inputs, output
 *                and log-sum-exp, ...), one slot per unit the schedule keeps
 *                in flight at once; with recompute = full only each layer's
 *                input;
 *   workspace    forward temporaries and backward gradients, placed by
 *                liveness (first fit over their live intervals) within one
 *                layer, one segment at a time; with recompute the layer's
 *                saved tensors are rebuilt here; with zero = 3 two layers'
 *                params gathered whole (the one in use, the next prefetched);
 *   comm         the largest collective's output buffer.
 *
 * Offsets are within each region; a layer-stack tensor's offset is for the
 * first layer of a chunk, later layers at `layer_stride` further on.
 */
#ifndef MESH_MEMPLAN_H
#define MESH_MEMPLAN_H

#include <stdint.h> /* int64_t */
#include <stdio.h>  /* FILE */

#include "sched.h"
#include "shard.h"

typedef enum mem_region { MEM_NONE, MEM_PERSISTENT, MEM_SLOT, MEM_WORKSPACE } mem_region;

typedef struct mem_stage {
    int64_t params, grads, optim;   /* bytes per rank */
    int64_t slot_bytes;             /* one unit's saved activations (the largest chunk's) */
    int slots;                      /* units in flight at the schedule's peak */
    int64_t layer_stride;           /* saved bytes of one layer-stack iteration */
    int64_t workspace;              /* max of forward and backward workspace */
    int64_t fwd_workspace, bwd_workspace;
    int64_t comm;                   /* largest collective output */
    int64_t total;                  /* persistent + slots x slot_bytes + workspace + comm */
} mem_stage;

typedef struct memplan {
    int pp;
    mem_stage *stage;
    mem_region *region;             /* per graph node */
    int64_t *offset;                /* per graph node: within its region (slot: within a slot) */
    int64_t *bytes;                 /* per graph node: bytes on one rank */
    signed char *part;              /* per graph node: 0 before the layer stack, 1 in it, 2 after it;
                                       a slot holds the first part, then the layers, then the last,
                                       and offsets are within the node's part */
} memplan;

int memplan_build(memplan *m, const shard_prog *p, const sched *sc);
void memplan_free(memplan *m);
/* --dump=memory */
void memplan_dump(const memplan *m, const shard_prog *p, FILE *out);

#endif
