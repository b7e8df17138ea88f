/* stats.h — the cost summary of a plan (`meshc --stats`) and the memory
 * limit check.
 *
 * Per pipeline stage (the ranks of a stage do the same work): bytes of
 * params, gradients and optimizer state after tp/ep splits and ZeRO
 * sharding, with the standard mixed-precision accounting (bf16/fp16 params
 * and gradients, fp32 master weights and Adam moments: 2 + 2 + 12 bytes a
 * param; fp32: 4 + 4 + 8); activations kept for backward at the peak of the
 * schedule; FLOPs per step; bytes and calls of every collective type on
 * every axis, from the rank programs; the schedule's bubble.
 */
#ifndef MESH_STATS_H
#define MESH_STATS_H

#include <stdio.h> /* FILE */

#include "ranks.h"
#include "sched.h"
#include "shard.h"

typedef struct stats_stage {
    long long params, grads, optim;  /* bytes per rank */
    long long activations;           /* bytes per rank at the schedule's peak */
    long long workspace, comm;       /* temporaries and gradients; the largest collective */
    long long act_per_micro;         /* bytes one micro-batch keeps for backward, all chunks of the stage */
    int peak_inflight;               /* (micro-batch, chunk) units whose activations are alive at once */
    long long total;
    double flops;                    /* per rank per step */
    long long n_params;              /* elements per rank */
} stats_stage;

typedef struct stats {
    int pp;
    stats_stage *stage;
    double bubble;
} stats;

int stats_build(stats *out, const shard_prog *p, const sched *sc);
void stats_free(stats *s);
void stats_stack_costs(const shard_prog *p, double *pre, double *layer, double *post);
void stats_print(const stats *s, const shard_prog *p, const sched *sc, const rank_progs *r, FILE *out);

#endif
