/* shard_walk.c — the bookkeeping of the placement walk: versions and uses
 * of tensors, param layouts, batch axes, repeat regions, and the
 * collectives that ops make themselves (moe's all-to-alls, vocab-parallel
 * cross-entropy). */
#include <math.h>   /* ceil */
#include <stdlib.h> /* calloc, realloc, free */
#include <string.h> /* memset */

#include "shard_impl.h"

int64_t shard__dp_group(const shard_prog *p, int param) {
    return p->pl[param].kind[EP] == PL_SPLIT ? p->setup.dp : p->setup.dp * p->setup.ep;
}

int64_t shard__local_numel(const shard_prog *p, int t) {
    int64_t e = shard__numel(&p->g->nodes[t]);
    if (p->pl[t].kind[TP] == PL_SPLIT) e /= p->setup.tp;
    if (p->pl[t].kind[EP] == PL_SPLIT) e /= p->setup.ep;
    return e;
}

/* Params: annotations first; else the token embedding is split by
 * vocabulary over tp and expert weights by expert over ep. */
static void param_layouts(shard_walk *w) {
    const graph *g = w->p->g;
    const fe_setup *s = &w->p->setup;
    for (int i = 0; i < g->n; i++) {
        const g_node *n = &g->nodes[i];
        w->param_pl[i] = shard__rep();
        if (n->op != G_PARAM) continue;
        const long long size[SHARD_AXES] = {s->dp, s->tp, s->pp, s->ep};
        for (int k = 0; k < n->n_annot; k++) {
            int a = n->annot[k].axis;
            if (n->annot[k].dim < 0 || size[a] <= 1) continue; /* an axis of one rank splits nothing */
            w->param_pl[i].kind[a] = PL_SPLIT;
            w->param_pl[i].dim[a] = (signed char)n->annot[k].dim;
        }
    }
    for (int i = 0; i < g->n; i++) {
        const g_node *n = &g->nodes[i];
        if (n->op == G_EMBED && !n->arange_ids && s->tp > 1) {
            int t = n->in[1];
            const g_node *tab = &g->nodes[t];
            int placed = 0;
            for (int k = 0; k < tab->n_annot; k++) placed |= tab->annot[k].axis == TP;
            if (tab->op == G_PARAM && !placed && tab->dims[0] % s->tp == 0) {
                w->param_pl[t].kind[TP] = PL_SPLIT;
                w->param_pl[t].dim[TP] = 0;
            }
        }
        if (n->op == G_MOE && s->ep > 1)
            for (int k = 2; k < n->n_in; k++) {
                int t = n->in[k];
                const g_node *e = &g->nodes[t];
                int placed = 0;
                for (int a = 0; a < e->n_annot; a++) placed |= e->annot[a].axis == EP;
                if (e->op == G_PARAM && !placed) {
                    w->param_pl[t].kind[EP] = PL_SPLIT;
                    w->param_pl[t].dim[EP] = 0;
                }
            }
    }
}

int shard__walk_init(shard_walk *w, shard_prog *p) {
    memset(w, 0, sizeof *w);
    w->p = p;
    const graph *g = p->g;
    int n = g->n ? g->n : 1;
    p->pl = calloc((size_t)n, sizeof *p->pl);
    p->is_act = calloc((size_t)n, sizeof *p->is_act);
    w->cur = calloc((size_t)n, sizeof *w->cur);
    w->last_ver = malloc((size_t)n * sizeof *w->last_ver);
    w->param_pl = calloc((size_t)n, sizeof *w->param_pl);
    w->entry_pl = calloc((size_t)(g->n_regions ? g->n_regions : 1) * GRAPH_MAX_CARRY, sizeof *w->entry_pl);
    if (!p->pl || !p->is_act || !w->cur || !w->last_ver || !w->param_pl || !w->entry_pl) return -1;
    for (int i = 0; i < g->n; i++) {
        w->last_ver[i] = -1;
        const g_node *x = &g->nodes[i];
        int act = x->op == G_INPUT;
        for (int k = 0; k < x->n_in; k++) act |= p->is_act[x->in[k]];
        p->is_act[i] = act && x->op != G_ARANGE;
    }
    w->region = -1;
    w->sp = p->setup.sequence_parallel && p->setup.tp > 1;
    param_layouts(w);
    return 0;
}

void shard__walk_free(shard_walk *w) {
    free(w->cur);
    free(w->last_ver);
    free(w->param_pl);
    free(w->entry_pl);
    free(w->vers);
    free(w->uses);
    memset(w, 0, sizeof *w);
}

int shard__version(shard_walk *w, int t, shard_step_kind kind, shard_pl from, shard_pl to) {
    if (w->n_vers == w->cap_vers) {
        int cap = w->cap_vers ? 2 * w->cap_vers : 64;
        shard_version *v = realloc(w->vers, (size_t)cap * sizeof *v);
        if (!v) return -1;
        w->vers = v;
        w->cap_vers = cap;
    }
    shard_version *v = &w->vers[w->n_vers];
    v->tensor = t;
    v->prev = w->last_ver[t];
    v->kind = kind;
    v->from = from;
    v->to = to;
    v->step = w->p->n_steps - 1;
    w->last_ver[t] = w->n_vers++;
    return 0;
}

int shard__record_use(shard_walk *w, int node, int k, int t, shard_pl pl) {
    if (w->n_uses == w->cap_uses) {
        int cap = w->cap_uses ? 2 * w->cap_uses : 256;
        shard_use *u = realloc(w->uses, (size_t)cap * sizeof *u);
        if (!u) return -1;
        w->uses = u;
        w->cap_uses = cap;
    }
    w->uses[w->n_uses++] = (shard_use){node, k, t, w->last_ver[t], pl};
    return 0;
}

int shard__has_seq(const shard_walk *w, int t) {
    const g_node *n = &w->p->g->nodes[t];
    return n->rank >= 3 && n->dims[0] == w->p->setup.micro_batch && n->dims[1] == w->p->setup.seq_len;
}

shard_pl shard__align(const shard_walk *w, int src, int dst) {
    const graph *g = w->p->g;
    shard_pl s = w->cur[src], o = w->cur[dst];
    o.kind[TP] = s.kind[TP];
    o.dim[TP] = -1;
    if (s.kind[TP] == PL_SPLIT) {
        int d = s.dim[TP] - (g->nodes[src].rank - g->nodes[dst].rank);
        if (d < 0) o.kind[TP] = PL_REP;
        else o.dim[TP] = (signed char)d;
    }
    return o;
}

/* Entering a repeat body: a carried tensor that is still a partial sum is
 * reduced first (every iteration must receive it the same way). */
int shard__enter_regions(shard_walk *w, int id, int (*resolve)(shard_walk *, int, const char *)) {
    const graph *g = w->p->g;
    for (int r = 0; r < g->n_regions; r++) {
        const g_region *rg = &g->regions[r];
        if (rg->first != id || rg->end <= id) continue;
        for (int k = 0; k < rg->n_carry; k++) {
            if (resolve(w, rg->carry[k].entry, "loop-carried: summed before the repeat") < 0) return -1;
            w->entry_pl[r * GRAPH_MAX_CARRY + k] = w->cur[rg->carry[k].entry];
        }
        w->region = r;
    }
    return 0;
}

/* At the end of a body, a carried tensor must be back in the placement the
 * next iteration reads it with. */
int shard__leave_regions(shard_walk *w, int id, int (*convert)(shard_walk *, int, shard_pl, const char *)) {
    const graph *g = w->p->g;
    while (w->region >= 0 && g->regions[w->region].end == id + 1) {
        const g_region *rg = &g->regions[w->region];
        for (int k = 0; k < rg->n_carry; k++)
            if (convert(w, rg->carry[k].exit, w->entry_pl[w->region * GRAPH_MAX_CARRY + k],
                        "loop-carried, back to its placement on entry") < 0)
                return -1;
        w->region = rg->parent;
    }
    return 0;
}

/* Data parallelism over dp (and ep, for dense layers): activations with a
 * batch dimension are split along it; params are replicated over dp. */
void shard__batch_axes(const shard_walk *w, int id, shard_pl *o) {
    const shard_prog *p = w->p;
    const g_node *n = &p->g->nodes[id];
    if (n->op == G_PARAM) return;
    int batch = p->is_act[id] && n->rank >= 1 && n->dims[0] == p->setup.micro_batch;
    o->kind[DP] = o->kind[EP] = (signed char)(batch ? PL_SPLIT : PL_REP);
    o->dim[DP] = o->dim[EP] = (signed char)(batch ? 0 : -1);
}

/* moe over ep: tokens go to their experts' ranks and come back, each an
 * all-to-all of the capacity buffer: experts x capacity x dim elements,
 * capacity = ceil(capacity_factor x tokens x top_k / experts). */
int shard__moe_dispatch(shard_walk *w, int id, int combine) {
    shard_prog *p = w->p;
    if (p->setup.ep <= 1) return 0;
    const g_node *n = &p->g->nodes[id];
    const g_node *x = &p->g->nodes[n->in[0]], *router = &p->g->nodes[n->in[1]];
    int64_t dim = x->dims[x->rank - 1], experts = router->dims[1];
    int64_t tokens = shard__numel(x) / dim;
    if (w->cur[n->in[0]].kind[TP] == PL_SPLIT) tokens /= p->setup.tp;
    int64_t cap = (int64_t)ceil(n->capacity * (double)tokens * (double)n->top_k / (double)experts);
    shard_step s = {0};
    s.kind = STEP_ALL_TO_ALL;
    s.node = id;
    s.axis = EP;
    s.dim = 0;
    s.elems = experts * cap * dim;
    s.region = w->region;
    s.why = combine ? "moe: results back to their tokens" : "moe: tokens to their experts";
    return shard__push(p, s) < 0 ? -1 : 0;
}

/* Cross-entropy over logits split by vocabulary: each rank reduces its
 * slice; three all-reduces of one number per token (the max, the sum of
 * exponentials, the target's logit) finish it. */
int shard__vocab_parallel_ce(shard_walk *w, int id) {
    shard_prog *p = w->p;
    const g_node *lg = &p->g->nodes[p->g->nodes[id].in[0]];
    static const char *const why[3] = {"vocab-parallel cross-entropy: max", "vocab-parallel cross-entropy: sum of exp",
                                       "vocab-parallel cross-entropy: target logit"};
    for (int i = 0; i < 3; i++) {
        shard_step s = {0};
        s.kind = STEP_ALL_REDUCE;
        s.node = id;
        s.axis = TP;
        s.dim = -1;
        s.elems = shard__numel(lg) / lg->dims[lg->rank - 1];
        s.region = w->region;
        s.why = why[i];
        if (shard__push(p, s) < 0) return -1;
    }
    return 0;
}

/* ZeRO-3: params live sharded over their data-parallel group and are
 * gathered whole before each use, in forward and again in backward (the
 * runtime prefetches one layer ahead and frees them after use). */
int shard__zero3_gather(shard_walk *w, int param, int backward) {
    shard_prog *p = w->p;
    if (p->setup.zero != 3 || shard__dp_group(p, param) <= 1) return 0;
    shard_step s = {0};
    s.kind = STEP_ALL_GATHER;
    s.backward = backward;
    s.node = param;
    s.axis = DP;
    s.dim = 0;
    s.elems = shard__local_numel(p, param);
    s.region = p->g->nodes[param].region;
    s.why = backward ? "zero 3: param gathered again for backward" : "zero 3: param gathered before use";
    return shard__push(p, s) < 0 ? -1 : 0;
}

/* Is param t used both before and after the layer stack? */
int shard__tied_across_stack(const graph *g, int t) {
    int stack = -1;
    for (int r = 0; r < g->n_regions; r++)
        if (g->regions[r].is_stack) stack = r;
    if (stack < 0) return 0;
    int before = 0, after = 0;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            if (g->nodes[i].in[k] != t) continue;
            before |= i < g->regions[stack].first;
            after |= i >= g->regions[stack].end;
        }
    return before && after;
}
