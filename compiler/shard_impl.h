/* shard_impl.h — the walk state shared by shard.c (forward) and
 * autodiff.c (backward). Internal to the compiler. */
#ifndef MESH_SHARD_IMPL_H
#define MESH_SHARD_IMPL_H

#include <string.h> /* memset */

#include "shard.h"

enum { DP = 0, TP = 1, PP = 2, EP = 3 }; /* mesh axes, in shard_pl order */

/* Replicated over every axis. */
static inline shard_pl shard__rep(void) {
    shard_pl x;
    memset(&x, 0, sizeof x);
    for (int a = 0; a < SHARD_AXES; a++) x.dim[a] = -1;
    return x;
}

static inline int shard__same_tp(shard_pl a, shard_pl b) {
    return a.kind[TP] == b.kind[TP] && (a.kind[TP] != PL_SPLIT || a.dim[TP] == b.dim[TP]);
}

/* x with its tp placement replaced. */
static inline shard_pl shard__with_tp(shard_pl x, int kind, int dim) {
    x.kind[TP] = (signed char)kind;
    x.dim[TP] = (signed char)(kind == PL_SPLIT ? dim : -1);
    return x;
}

static inline int64_t shard__numel(const g_node *n) {
    int64_t e = 1;
    for (int i = 0; i < n->rank; i++) e *= n->dims[i];
    return e;
}

/* A conversion of one tensor: version v of it (v >= 1) was made from
 * version v-1 by `kind`; the forward step is steps[step]. */
typedef struct shard_version {
    int tensor, prev;      /* prev: index of the previous version, -1 for the produced one */
    shard_step_kind kind;
    shard_pl from, to;
    int step;
} shard_version;

/* A consumer reading input k of `node`: tensor `tensor` at version `ver`
 * (-1: as produced) with placement `pl`. */
typedef struct shard_use {
    int node, k, tensor, ver;
    shard_pl pl;
} shard_use;

typedef struct shard_walk {
    shard_prog *p;
    shard_pl *cur;         /* per tensor: placement of its current version */
    int *last_ver;         /* per tensor: its current version, -1 as produced */
    shard_pl *param_pl;    /* per node: a param's placement (annotations or automatic) */
    shard_version *vers;
    int n_vers, cap_vers;
    shard_use *uses;
    int n_uses, cap_uses;
    int region;            /* innermost region being walked, -1 outside */
    shard_pl *entry_pl;    /* per region x GRAPH_MAX_CARRY: a carried tensor's placement on entry */
    int sp;                /* sequence parallelism is on */
} shard_walk;

int shard__walk_init(shard_walk *w, shard_prog *p);
void shard__walk_free(shard_walk *w);
int shard__version(shard_walk *w, int t, shard_step_kind kind, shard_pl from, shard_pl to);
int shard__record_use(shard_walk *w, int node, int k, int t, shard_pl pl);
int shard__has_seq(const shard_walk *w, int t);
/* Tensor `src`'s tp placement mapped onto `dst`'s dimensions (aligned from
 * the right, as broadcasting is), on top of dst's current placement. */
shard_pl shard__align(const shard_walk *w, int src, int dst);
int shard__enter_regions(shard_walk *w, int id, int (*resolve)(shard_walk *, int, const char *));
int shard__leave_regions(shard_walk *w, int id, int (*convert)(shard_walk *, int, shard_pl, const char *));
void shard__batch_axes(const shard_walk *w, int id, shard_pl *o);
int shard__moe_dispatch(shard_walk *w, int id, int combine);
int shard__vocab_parallel_ce(shard_walk *w, int id);
int shard__backward_walk(shard_walk *w);
int shard__grad_sync(shard_walk *w, int *has);           /* takes `has` */
int shard__zero3_gather(shard_walk *w, int param, int backward);
int shard__tied_across_stack(const graph *g, int t);
int64_t shard__dp_group(const shard_prog *p, int param); /* ranks its gradient is summed over */
int64_t shard__local_numel(const shard_prog *p, int t);  /* elements per rank after tp/ep splits */

#endif
