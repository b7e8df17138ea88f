/* ranks.h — every rank's program, for the static check.
 *
 * Expands the SPMD program (shard_prog) and the pipeline schedule into the
 * straight-line sequence of collectives, sends and receives that each rank
 * of the dp x tp x pp x ep mesh performs in one training step, and runs
 * verify_run over all of them: every collective entered by all members of
 * its group in the same order with the same sizes, every send received.
 *
 * Rank order (docs/language.md): tp fastest, then ep, dp, pp slowest.
 * Groups: tp (ranks differing only in tp), ep, the dense data-parallel
 * group (dp x ep) and the expert data-parallel group (dp).
 */
#ifndef MESH_RANKS_H
#define MESH_RANKS_H

#include <stddef.h> /* size_t */

#include "sched.h"
#include "shard.h"
#include "verify.h"

typedef struct rank_progs {
    int world;
    verify_op **ops;          /* per rank */
    int *n_ops, *cap_ops;
    verify_program *progs;
    verify_group *groups;
    int n_groups;
    int *group_store;         /* the members of every group */
    long long n_coll, n_p2p;  /* operations over all ranks */
} rank_progs;

/* The bytes each operation carries, as the plan lays its values out
 * (compile.c takes them from the plan: memplan_step_elem_bytes and
 * memplan_value_bytes): per step of the program, an element of its
 * collective; and what a pipeline transfer sends (the layer stack's
 * carried values' room). */
typedef struct ranks_sizes {
    const signed char *elem_bytes;
    long long act_bytes;
} ranks_sizes;

/* Builds every rank's program for one step: the schedule's units in order,
 * each expanded into its chunk's collectives, then the gradient sync.
 * Each operation carries what sizes says. Returns 0; -2
 * when the programs would exceed the check's budget (2^25 operations over
 * all ranks), with a message; -1 on other failures (out of memory, a world
 * over 2^20 ranks). */
int ranks_build(rank_progs *out, const shard_prog *p, const sched *sc, const ranks_sizes *sizes, char *err,
                size_t n);
void ranks_free(rank_progs *r);
int ranks_check(const rank_progs *r, char *msg, size_t n);

#endif
