/* shard.h — placements and collective insertion (forward), and the
 * backward program with the duals of every conversion (autodiff.c).
 *
 * Every tensor has, per mesh axis, a placement: replicated, split along
 * one dimension, or partial (a pending sum over the axis). Params start
 * from their annotations (or the automatic layout: a token embedding is
 * split by vocabulary over tp, expert weights by expert over ep); each op
 * has a rule for the placements it consumes and produces. Where a consumer
 * needs another placement than its producer gives, a conversion step is
 * inserted: partial -> replicated is an all-reduce, partial -> split a
 * reduce-scatter, split -> replicated an all-gather, replicated -> split a
 * local slice (no communication), split(i) -> split(j) an all-to-all.
 *
 * Placements over tp are derived this way. Over dp and ep the activations
 * are split along the batch (dense data parallelism spans dp x ep), params
 * are replicated over dp (ZeRO shards them later), experts split over ep,
 * and each moe routes tokens with an all-to-all over ep and back.
 */
#ifndef MESH_SHARD_H
#define MESH_SHARD_H

#include <stdint.h> /* int64_t */
#include <stdio.h>  /* FILE */

#include "frontend.h"
#include "graph.h"

enum { SHARD_AXES = 4 }; /* dp, tp, pp, ep (pp never splits a tensor) */

typedef enum shard_kind { PL_REP, PL_SPLIT, PL_PARTIAL } shard_kind;

typedef struct shard_pl {
    signed char kind[SHARD_AXES];
    signed char dim[SHARD_AXES]; /* PL_SPLIT: the dimension */
} shard_pl;

typedef enum shard_step_kind {
    STEP_COMPUTE,        /* forward of a graph node, or backward of it */
    STEP_ALL_REDUCE,
    STEP_REDUCE_SCATTER,
    STEP_ALL_GATHER,
    STEP_ALL_TO_ALL,
    STEP_SLICE           /* replicated -> split: local, no communication */
} shard_step_kind;

typedef struct shard_step {
    shard_step_kind kind;
    int backward;        /* 0 forward, 1 backward (per micro-batch); 2 gradient sync, 3 after the
                            optimizer (once per step) */
    int node;            /* graph node computed, or whose tensor (or gradient) is converted */
    int axis;            /* collectives: the mesh axis */
    int dim;             /* reduce-scatter/all-gather/slice/all-to-all: the dimension */
    int64_t elems;       /* elements of the whole tensor over the axis group (per data-parallel rank) */
    int region;          /* innermost repeat region, -1 if none */
    const char *why;     /* a short reason, printed by --dump=placements */
    int recompute;       /* backward: a forward step run again (recompute = full) */
    int bucket;          /* gradient sync: consecutive steps of one bucket (>= 1) are one collective;
                            0 none */
} shard_step;

typedef struct shard_prog {
    const graph *g;
    fe_setup setup;
    shard_pl *pl;        /* per node: placement it is produced with */
    int *is_act;         /* per node: an activation (depends on an input) */
    shard_step *steps;   /* forward program, then backward program */
    int n_steps, cap_steps;
    int n_forward;       /* steps[0 .. n_forward) are forward */
    char error[512];     /* why shard_build failed */
    int error_node;      /* the node at fault, -1 if none */
} shard_prog;

/* Derives placements and the forward program, then the backward program.
 * Returns 0, or -1 with prog->error (a placement an op cannot accept). */
int shard_build(const graph *g, const fe_setup *setup, shard_prog *prog);
void shard_free(shard_prog *p);

/* Collectives per step, by kind and axis: counts[kind][axis] and element
 * totals, one layer-stack iteration counted once (`per_layer`) or all of
 * them (`per_step`: a whole micro-batch forward + backward). */
typedef struct shard_counts {
    int64_t n[6][SHARD_AXES];
    int64_t elems[6][SHARD_AXES];
} shard_counts;
void shard_count(const shard_prog *p, int backward, int in_stack_only, shard_counts *out);

/* --dump=placements: the forward and backward programs with every
 * tensor's placement and every conversion. */
void shard_dump(const shard_prog *p, FILE *out);
const char *shard_step_name(shard_step_kind k);

/* internal, shared by shard.c and autodiff.c */
int shard__push(shard_prog *p, shard_step s);
int shard__backward(shard_prog *p);

#endif
