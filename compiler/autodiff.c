/* autodiff.c — the backward program, derived from the forward one.
 *
 * Walks the forward compute steps in reverse. Each op's backward rule says
 * with which placement it produces the gradient of each input; gradients of
 * a tensor used several times (a residual, a tied weight) are summed. A
 * conversion in the forward program has its dual here: all-reduce <->
 * identity, reduce-scatter <-> all-gather, all-gather <-> reduce-scatter
 * (a local slice when the gradient is already whole), all-to-all <->
 * all-to-all. Where a gradient comes out partial but the tensor was whole
 * (the input of a column-parallel product), it is summed over tp: the
 * backward all-reduce of Megatron's "f" operator. Last come the gradient
 * reductions of params: over tp where a replicated param saw split inputs
 * (norm weights under sequence parallelism), and over dp.
 */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memset */

#include "shard_impl.h"

typedef struct grad {
    int has;
    shard_pl pl;
} grad;

/* Emits a backward step on the gradient of tensor t. */
static int emit(shard_walk *w, int t, shard_step_kind kind, int axis, int dim, int64_t elems, const char *why) {
    shard_step s = {0};
    s.kind = kind;
    s.backward = 1;
    s.node = t;
    s.axis = axis;
    s.dim = dim;
    s.elems = elems;
    s.region = t >= 0 ? w->p->g->nodes[t].region : -1;
    s.why = why;
    return shard__push(w->p, s) < 0 ? -1 : 0;
}

/* Converts gradient placement g of tensor t to `want` over tp. */
static int regrad(shard_walk *w, int t, shard_pl *g, shard_pl want, const char *why) {
    if (shard__same_tp(*g, want)) return 0;
    int64_t e = shard__numel(&w->p->g->nodes[t]);
    int hk = g->kind[TP], wk = want.kind[TP], rc = 0;
    if (hk == PL_PARTIAL && wk == PL_REP) rc = emit(w, t, STEP_ALL_REDUCE, TP, -1, e, why);
    else if (hk == PL_PARTIAL && wk == PL_SPLIT) rc = emit(w, t, STEP_REDUCE_SCATTER, TP, want.dim[TP], e, why);
    else if (hk == PL_SPLIT && wk == PL_REP) rc = emit(w, t, STEP_ALL_GATHER, TP, g->dim[TP], e, why);
    else if (hk == PL_REP && wk == PL_SPLIT) rc = emit(w, t, STEP_SLICE, TP, want.dim[TP], e, why);
    else if (hk == PL_SPLIT && wk == PL_SPLIT) rc = emit(w, t, STEP_ALL_TO_ALL, TP, want.dim[TP], e, why);
    else if (wk == PL_PARTIAL) return 0; /* a whole gradient is a valid partial one on one rank... kept whole */
    *g = want;
    return rc;
}

/* Adds a gradient contribution to a slot: partial contributions take the
 * placement of whole ones (a reduction), a replicated one is sliced to a
 * split one. */
static int add_grad(shard_walk *w, int t, grad *slot, shard_pl c) {
    if (!slot->has) {
        slot->has = 1;
        slot->pl = c;
        return 0;
    }
    if (shard__same_tp(slot->pl, c)) return 0;
    if (slot->pl.kind[TP] == PL_PARTIAL) return regrad(w, t, &slot->pl, c, "gradient contributions summed");
    if (c.kind[TP] == PL_PARTIAL) return regrad(w, t, &c, slot->pl, "gradient contributions summed");
    if (slot->pl.kind[TP] == PL_REP) return regrad(w, t, &slot->pl, c, "gradient contributions matched");
    return regrad(w, t, &c, slot->pl, "gradient contributions matched");
}

/* The gradient of the version a conversion came from, given the gradient
 * of the version it made: the dual of the conversion. */
static int dual(shard_walk *w, const shard_version *v, shard_pl *g) {
    int t = v->tensor;
    int64_t e = shard__numel(&w->p->g->nodes[t]);
    switch (v->kind) {
    case STEP_ALL_REDUCE: /* identity; the gradient of a partial sum is whole */
        return regrad(w, t, g, shard__with_tp(*g, PL_REP, -1), "dual of an all-reduce: gradient made whole");
    case STEP_REDUCE_SCATTER:
        if (regrad(w, t, g, v->to, "dual of a reduce-scatter") < 0) return -1;
        if (emit(w, t, STEP_ALL_GATHER, TP, v->to.dim[TP], e, "dual of a reduce-scatter") < 0) return -1;
        *g = shard__with_tp(*g, PL_REP, -1);
        return 0;
    case STEP_ALL_GATHER:
        return regrad(w, t, g, v->from, "dual of an all-gather");
    case STEP_SLICE:
        if (g->kind[TP] == PL_PARTIAL) return regrad(w, t, g, v->from, "dual of a slice");
        return regrad(w, t, g, v->from, "dual of a slice");
    case STEP_ALL_TO_ALL:
        return regrad(w, t, g, v->from, "dual of an all-to-all");
    default:
        return 0;
    }
}

/* The gradient of tensor t as produced: every version's gradient carried
 * back through its conversion's dual. */
static int collect(shard_walk *w, int t, grad *gver, grad *gt) {
    for (int v = w->last_ver[t]; v >= 0; v = w->vers[v].prev) {
        if (!gver[v].has) continue;
        shard_pl g = gver[v].pl;
        if (dual(w, &w->vers[v], &g) < 0) return -1;
        grad *to = w->vers[v].prev >= 0 ? &gver[w->vers[v].prev] : gt;
        if (add_grad(w, t, to, g) < 0) return -1;
    }
    return 0;
}

static const shard_use *find_use(const shard_walk *w, int node, int k) {
    for (int i = w->n_uses - 1; i >= 0; i--)
        if (w->uses[i].node == node && w->uses[i].k == k) return &w->uses[i];
    return NULL;
}

/* The placement an op's backward gives the gradient of input k. */
static shard_pl contribution(const shard_walk *w, int id, int k, shard_pl u, const shard_pl *uses) {
    const g_node *n = &w->p->g->nodes[id];
    int xl = n->rank >= 1 ? n->rank - 1 : 0;
    switch (n->op) {
    case G_MATMUL: {
        shard_pl wpl = uses[1], x = uses[0];
        int col = wpl.kind[TP] == PL_SPLIT && wpl.dim[TP] == 1, row = wpl.kind[TP] == PL_SPLIT && wpl.dim[TP] == 0;
        if (k == 0) return col ? shard__with_tp(u, PL_PARTIAL, -1) : u;
        if (col || row) return u;
        /* a replicated weight: its gradient sums over tokens, partial when
         * the tokens are split over tp */
        return shard__with_tp(u, x.kind[TP] == PL_SPLIT && x.dim[TP] != xl ? PL_PARTIAL : PL_REP, -1);
    }
    case G_BIAS_ADD:
    case G_LAYERNORM:
    case G_RMSNORM:
        if (k == 0) return u;
        if (u.kind[TP] == PL_SPLIT) return u; /* a split bias from a split output */
        return shard__with_tp(u, uses[0].kind[TP] == PL_SPLIT && uses[0].dim[TP] != xl ? PL_PARTIAL : PL_REP, -1);
    case G_EMBED:
        if (u.kind[TP] == PL_SPLIT) return u; /* vocab-parallel: each rank its rows */
        return shard__with_tp(u, w->p->pl[id].kind[TP] == PL_SPLIT ? PL_PARTIAL : PL_REP, -1);
    case G_MOE:
        if (k == 0) return w->p->pl[id].kind[TP] == PL_PARTIAL ? shard__with_tp(u, PL_PARTIAL, -1) : u;
        /* the router: partial when the tokens are split over tp, or when the
         * experts' hidden width is (the gates' gradients are then partial) */
        if (k == 1)
            return shard__with_tp(u, uses[0].kind[TP] == PL_SPLIT || w->p->pl[id].kind[TP] == PL_PARTIAL ? PL_PARTIAL
                                                                                                          : PL_REP, -1);
        return u;
    default:
        return u; /* pointwise, attention, rope, add, transpose, ...: as consumed */
    }
}

/* Which params received a gradient (a fresh array, freed by the caller of
 * shard__grad_sync). */
static int *gt_has(const grad *gt, int n) {
    int *has = calloc((size_t)(n > 0 ? n : 1), sizeof *has);
    for (int i = 0; has && i < n; i++) has[i] = gt[i].has;
    return has;
}

static int in_region_step(const graph *g, int r, int region) {
    for (; r >= 0; r = g->regions[r].parent)
        if (r == region) return 1;
    return 0;
}

static int in_region(const graph *g, int id, int region) {
    for (int r = g->nodes[id].region; r >= 0; r = g->regions[r].parent)
        if (r == region) return 1;
    return 0;
}

/* recompute = full: a layer keeps only its input; its backward starts by
 * running its forward again, collectives included (Megatron-LM's full
 * activation recomputation). The forward steps of the layer stack are
 * repeated at the head of the stack's backward, marked as recompute. */
static int recompute_stack(shard_walk *w, int stack) {
    shard_prog *p = w->p;
    for (int i = 0; i < p->n_forward; i++) {
        shard_step s = p->steps[i];
        if (s.region < 0 || !in_region(p->g, s.node, stack) || !in_region_step(p->g, s.region, stack)) continue;
        s.backward = 1;
        s.recompute = 1;
        if (shard__push(p, s) < 0) return -1;
    }
    return 0;
}

/* Which part of the program node id is in: 0 before the layer stack (or
 * no stack), 1 in it, 2 after it. */
static int part_of_node(const graph *g, int id, int stack) {
    if (stack < 0) return 0;
    if (in_region(g, id, stack)) return 1;
    return id < g->regions[stack].first ? 0 : 2;
}

/* The parts param t is used in, a bit each (1 << part). */
static int param_parts(const graph *g, int t, int stack) {
    int m = 0;
    for (int c = t + 1; c < g->n; c++)
        for (int k = 0; k < g->nodes[c].n_in; k++)
            if (g->nodes[c].in[k] == t) m |= 1 << part_of_node(g, c, stack);
    return m;
}

/* ZeRO-2/3: the gradient of param t, once its backward in the micro-batch
 * is done, is summed over its data-parallel group, each rank keeping (and
 * adding up over micro-batches) only its shard. */
static int emit_grad_shard(shard_walk *w, int t) {
    shard_prog *p = w->p;
    if (p->setup.zero < 2 || shard__dp_group(p, t) <= 1) return 0;
    return emit(w, t, STEP_REDUCE_SCATTER, DP, 0, shard__local_numel(p, t),
                "zero 2/3: the micro-batch's gradient summed into each rank's shard");
}

/* The params whose backward ends with `part` (0 before the layer stack: all
 * those left; 1 the stack: its layers' params; 2 after it: params used only
 * there), at the end of that part's backward: with zero >= 2 their
 * gradients reduce-scattered over dp. A weight used before and after the
 * stack (a tied embedding) is finished before it; with pp > 1 its copy on
 * the last stage is reduce-scattered after the part after too. A gradient
 * that is a partial sum over tp (norm weights under sequence parallelism,
 * a moe router with the experts split over tp) is marked (done = 2): it is
 * summed over tp once per step, in the gradient sync, after its
 * micro-batches have added up (a sum per micro-batch would add the earlier
 * ones again). */
static int finish_params(shard_walk *w, grad *gt, grad *gver, char *done, int stack, int part) {
    shard_prog *p = w->p;
    const graph *g = p->g;
    int rc = 0;
    for (int t = 0; t < g->n && rc == 0; t++) {
        if (g->nodes[t].op != G_PARAM || done[t]) continue;
        int m = param_parts(g, t, stack);
        if (part == 2 && m == 5 && p->setup.pp > 1) {
            rc = emit_grad_shard(w, t);
            continue;
        }
        if ((part == 1 && !in_region(g, t, stack)) || (part == 2 && m != 4)) continue;
        done[t] = 1;
        if (collect(w, t, gver, &gt[t]) < 0) return -1;
        if (!gt[t].has) continue;
        if (gt[t].pl.kind[TP] == PL_PARTIAL && p->pl[t].kind[TP] == PL_REP) {
            done[t] = 2;
            gt[t].pl = p->pl[t];
        }
        rc = regrad(w, t, &gt[t].pl, p->pl[t], "param gradient converted to its placement");
        if (rc == 0) rc = emit_grad_shard(w, t);
    }
    return rc;
}

static int differentiable(const shard_walk *w, int t) {
    const g_node *n = &w->p->g->nodes[t];
    return !n->is_int && n->op != G_INPUT && n->op != G_ARANGE;
}

int shard__backward_walk(shard_walk *w) {
    shard_prog *p = w->p;
    const graph *g = p->g;
    if (g->loss < 0) return 0;
    grad *gt = calloc((size_t)(g->n ? g->n : 1), sizeof *gt);
    grad *gver = calloc((size_t)(w->n_vers ? w->n_vers : 1), sizeof *gver);
    char *gathered = calloc((size_t)(g->n ? g->n : 1), 1), *done = calloc((size_t)(g->n ? g->n : 1), 1);
    int stack = -1, recomputed = 0, prev = -1;
    for (int r = 0; r < g->n_regions; r++)
        if (g->regions[r].is_stack) stack = r;
    int rc = !gt || !gver || !gathered || !done ? -1 : 0;
    if (rc == 0) {
        gt[g->loss].has = 1;
        gt[g->loss].pl = p->pl[g->loss];
    }
    for (int i = p->n_forward - 1; i >= 0 && rc == 0; i--) {
        const shard_step fs = p->steps[i];
        if (fs.kind != STEP_COMPUTE || !differentiable(w, fs.node)) continue;
        int id = fs.node;
        const g_node *n = &g->nodes[id];
        /* leaving a part: its params are done, before anything of the next
         * part (its gradient's conversions) comes between */
        int part = part_of_node(g, id, stack);
        if (prev == 2 && part < 2) rc = finish_params(w, gt, gver, done, stack, 2);
        if (rc == 0 && prev == 1 && part == 0) rc = finish_params(w, gt, gver, done, stack, 1);
        if (rc < 0) break;
        if (collect(w, id, gver, &gt[id]) < 0) { rc = -1; break; }
        if (!gt[id].has) continue;
        prev = part;
        if (!recomputed && p->setup.recompute && stack >= 0 && in_region(g, id, stack)) {
            recomputed = 1;
            if (recompute_stack(w, stack) < 0) { rc = -1; break; }
        }
        shard_pl expect = p->pl[id];
        if (expect.kind[TP] == PL_PARTIAL) expect = shard__with_tp(expect, PL_REP, -1);
        if (regrad(w, id, &gt[id].pl, expect, "partial gradient summed over tp") < 0) { rc = -1; break; }
        if (n->op == G_MOE && p->setup.ep > 1 &&
            emit(w, id, STEP_ALL_TO_ALL, EP, 0, p->steps[i + 1].elems, "dual of the moe combine") < 0) {
            rc = -1;
            break;
        }
        /* zero 3: a layer's param gathered again before its first use in
         * backward (unless the layer's recomputed forward gathered it); those
         * outside the stack stay gathered from the forward */
        for (int k = 0; k < n->n_in && rc == 0; k++) {
            int t = n->in[k];
            if (g->nodes[t].op != G_PARAM || gathered[t] || part != 1 || p->setup.recompute) continue;
            gathered[t] = 1;
            rc = shard__zero3_gather(w, t, 1);
        }
        shard_step s = {0};
        s.kind = STEP_COMPUTE;
        s.backward = 1;
        s.node = id;
        s.axis = s.dim = -1;
        s.region = n->region;
        if (shard__push(p, s) < 0) { rc = -1; break; }
        if (n->op == G_MOE && p->setup.ep > 1 &&
            emit(w, id, STEP_ALL_TO_ALL, EP, 0, p->steps[i + 1].elems, "dual of the moe dispatch") < 0) {
            rc = -1;
            break;
        }
        shard_pl uses[GRAPH_MAX_IN];
        const shard_use *us[GRAPH_MAX_IN];
        for (int k = 0; k < n->n_in; k++) {
            us[k] = find_use(w, id, k);
            uses[k] = us[k] ? us[k]->pl : p->pl[n->in[k]];
        }
        for (int k = 0; k < n->n_in && rc == 0; k++) {
            int t = n->in[k];
            if (!differentiable(w, t) || !us[k]) continue;
            shard_pl c = contribution(w, id, k, uses[k], uses);
            grad *slot = us[k]->ver >= 0 ? &gver[us[k]->ver] : &gt[t];
            rc = add_grad(w, t, slot, c);
        }
    }
    /* the params whose backward is done: reduced over tp where needed (and
     * with zero >= 2 over dp), then the once-per-step gradient sync */
    for (int part = prev; part >= 0 && rc == 0; part--) rc = finish_params(w, gt, gver, done, stack, part);
    int *has = rc == 0 ? gt_has(gt, g->n) : NULL;
    for (int t = 0; has && t < g->n; t++)
        if (has[t] && done[t] == 2) has[t] = 2; /* summed over tp in the gradient sync */
    if (rc == 0) rc = shard__grad_sync(w, has);
    free(gt);
    free(gver);
    free(gathered);
    free(done);
    return rc;
}

/* Data parallelism, once per step after the last micro-batch: each param's
 * gradient is summed over its data-parallel group (dp x ep for dense
 * params, dp for experts): an all-reduce with zero = 0, a reduce-scatter
 * with zero = 1 (each rank then updates its shard of the optimizer state),
 * followed after the optimizer step by an all-gather of the updated params
 * for zero = 1 and 2. With zero >= 2 the gradients are sharded already
 * (reduce-scattered per micro-batch, finish_params); zero = 3 keeps params
 * sharded: they are gathered before each use in forward and backward
 * instead (shard.c). */
/* An all-reduce of param t's gradient over `axis` in the gradient sync:
 * its whole gradient, or with zero >= 2 its shard (alike on every rank of
 * the axis, whose dp groups are alike). */
static int sum_param_grad(shard_prog *p, int t, int axis, const char *why) {
    shard_step s = {0};
    s.kind = STEP_ALL_REDUCE;
    s.backward = 2;
    s.node = t;
    s.axis = axis;
    s.dim = -1;
    s.elems = shard__local_numel(p, t);
    if (p->setup.zero >= 2) {
        int64_t d = shard__dp_group(p, t);
        s.elems = (s.elems + d - 1) / d;
    }
    s.region = p->g->nodes[t].region;
    s.why = why;
    return shard__push(p, s) < 0 ? -1 : 0;
}

int shard__grad_sync(shard_walk *w, int *has) {
    shard_prog *p = w->p;
    const graph *g = p->g;
    int rc = has ? 0 : -1;
    /* a param whose gradient is a partial sum over tp (has = 2): summed
     * over tp first; a weight used before and after the layer stack (a
     * tied embedding and LM head) lives on the first and the last pipeline
     * stage: the two gradients are summed between them */
    for (int t = g->n - 1; t >= 0 && rc == 0; t--)
        if (has[t] == 2) rc = sum_param_grad(p, t, TP, "param gradient summed over tp");
    for (int t = 0; t < g->n && rc == 0 && p->setup.pp > 1; t++)
        if (g->nodes[t].op == G_PARAM && has[t] && shard__tied_across_stack(g, t))
            rc = sum_param_grad(p, t, PP, "tied weight: gradient summed between the first and last pipeline stages");
    /* buckets: params of one part of the model (before, in or after the
     * layer stack; a stack layer's own), of one data-parallel group, in the
     * order backward finishes them, a bucket closed once it holds
     * train.bucket_size elements or more (as DDP and Megatron-LM close theirs) */
    int stack = -1;
    for (int r = 0; r < g->n_regions; r++)
        if (g->regions[r].is_stack) stack = r;
    int *bucket = malloc((size_t)(g->n ? g->n : 1) * sizeof *bucket);
    if (!bucket) rc = -1;
    int n_buckets = 0, last_key = -1;
    int64_t filled = 0;
    for (int t = g->n - 1; t >= 0 && rc == 0; t--) {
        bucket[t] = -1;
        if (g->nodes[t].op != G_PARAM || !has[t] || shard__dp_group(p, t) <= 1) continue;
        int part = stack >= 0 && g->nodes[t].region >= 0 ? 1 : stack >= 0 && t >= g->regions[stack].end ? 2 : 0;
        int key = (g->nodes[t].region + 2) * 8 + part * 2 + (p->pl[t].kind[EP] == PL_SPLIT);
        int64_t e = shard__local_numel(p, t);
        if (key != last_key || filled >= p->setup.bucket_size) {
            n_buckets++;
            filled = 0;
            last_key = key;
        }
        bucket[t] = n_buckets - 1;
        filled += e;
    }
    for (int phase = 0; phase < 2 && rc == 0; phase++)
        for (int t = g->n - 1; t >= 0 && rc == 0; t--) {
            const g_node *n = &g->nodes[t];
            if (bucket[t] < 0) continue;
            if (phase == 1 ? p->setup.zero == 0 || p->setup.zero == 3 : p->setup.zero >= 2) continue;
            shard_step_kind k = phase ? STEP_ALL_GATHER : p->setup.zero ? STEP_REDUCE_SCATTER : STEP_ALL_REDUCE;
            shard_step s = {0};
            s.kind = k;
            s.backward = 2 + phase;
            s.node = t;
            s.axis = DP;
            s.dim = 0;
            s.elems = shard__local_numel(p, t);
            s.region = n->region;
            s.why = phase ? "updated params gathered (zero 1/2)" : "gradient summed over the data-parallel ranks";
            s.bucket = 1 + bucket[t] + phase * n_buckets;
            rc = shard__push(p, s) < 0 ? -1 : 0;
        }
    free(bucket);
    free(has);
    return rc;
}
