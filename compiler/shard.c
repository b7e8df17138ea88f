/* shard.c — placements over the mesh and the forward program (shard.h).
 *
 * Walks the recorded graph in execution order. For each op it asks the op's
 * rule which placement each input must have, converts inputs that differ
 * (recording the collective), and gives the output its placement. The
 * rules are Megatron-LM's: column-parallel then row-parallel products,
 * vocab-parallel embedding and cross-entropy, heads split over tp, and with
 * sequence parallelism the activations between them split along the
 * sequence. Conversions of one tensor are versions of it; autodiff.c uses
 * them to derive the backward program's duals.
 */
#include "shard.h"

#include <stdarg.h> /* va_list */
#include <stdlib.h> /* calloc, realloc, free */
#include <string.h> /* memset */

#include "shard_impl.h"

const char *shard_step_name(shard_step_kind k) {
    static const char *const n[] = {"compute", "all-reduce", "reduce-scatter", "all-gather", "all-to-all", "slice"};
    return k >= 0 && k <= STEP_SLICE ? n[k] : "?";
}

int shard__push(shard_prog *p, shard_step s) {
    if (p->n_steps == p->cap_steps) {
        int cap = p->cap_steps ? 2 * p->cap_steps : 256;
        shard_step *n = realloc(p->steps, (size_t)cap * sizeof *n);
        if (!n) return -1;
        p->steps = n;
        p->cap_steps = cap;
    }
    p->steps[p->n_steps] = s;
    return p->n_steps++;
}

static int fail(shard_prog *p, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(shard_prog *p, int node, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error, sizeof p->error, fmt, ap);
    va_end(ap);
    p->error_node = node;
    return -1;
}

/* ---- the walk state: current version of every tensor ---- */

/* Converts the current version of tensor t to `want` over tp, recording the
 * step (none when equal). */
static int convert(shard_walk *w, int t, shard_pl want, const char *why) {
    shard_prog *p = w->p;
    shard_pl have = w->cur[t];
    if (shard__same_tp(have, want)) return 0;
    const g_node *n = &p->g->nodes[t];
    shard_step s = {0};
    s.node = t;
    s.axis = TP;
    s.region = w->region;
    s.elems = shard__numel(n);
    s.why = why;
    s.dim = -1;
    int hk = have.kind[TP], wk = want.kind[TP];
    if (hk == PL_PARTIAL && wk == PL_REP) s.kind = STEP_ALL_REDUCE;
    else if (hk == PL_PARTIAL && wk == PL_SPLIT) s.kind = STEP_REDUCE_SCATTER, s.dim = want.dim[TP];
    else if (hk == PL_SPLIT && wk == PL_REP) s.kind = STEP_ALL_GATHER, s.dim = have.dim[TP];
    else if (hk == PL_REP && wk == PL_SPLIT) s.kind = STEP_SLICE, s.dim = want.dim[TP];
    else if (hk == PL_SPLIT && wk == PL_SPLIT) s.kind = STEP_ALL_TO_ALL, s.dim = want.dim[TP];
    else return fail(p, t, "%%%d: cannot make a partial sum out of a %s tensor", t,
                     hk == PL_REP ? "replicated" : "split");
    if (shard__push(p, s) < 0) return fail(p, t, "out of memory");
    if (shard__version(w, t, s.kind, have, want) < 0) return fail(p, t, "out of memory");
    w->cur[t] = want;
    return 0;
}

/* A partial input is summed before a consumer that cannot take partial
 * sums: into a sequence split with sequence parallelism (a reduce-scatter),
 * else into a replicated tensor (an all-reduce). */
static int resolve_partial(shard_walk *w, int t, const char *why) {
    if (w->cur[t].kind[TP] != PL_PARTIAL) return 0;
    shard_pl want = shard__with_tp(w->cur[t], w->sp && w->p->is_act[t] && shard__has_seq(w, t) ? PL_SPLIT : PL_REP, 1);
    return convert(w, t, want, why);
}

static int shard__use(shard_walk *w, int node, int k) {
    int t = w->p->g->nodes[node].in[k];
    return shard__record_use(w, node, k, t, w->cur[t]);
}

/* ---- per-op rules (over tp) ---- */

/* Where partial operand t of a sum with `other` is reduced to: the other's
 * placement, except that with sequence parallelism an activation sums into
 * a sequence split (a reduce-scatter) unless the other is already split
 * some other way; the replicated other is then sliced. */
static shard_pl sum_target(shard_walk *w, int t, int other) {
    if (w->sp && w->p->is_act[t] && shard__has_seq(w, t) && w->cur[other].kind[TP] != PL_SPLIT)
        return shard__with_tp(w->cur[t], PL_SPLIT, 1);
    return shard__align(w, other, t);
}

static int last_dim(const g_node *n) { return n->rank - 1; }

/* Brings every input to a placement the op accepts and returns the
 * output's tp placement (kind, dim) through *out. */
static int rule(shard_walk *w, int id, shard_pl *out) {
    shard_prog *p = w->p;
    const g_node *n = &p->g->nodes[id];
    const int *in = n->in;
    shard_pl o = shard__rep();
    int tp_on = p->setup.tp > 1;
    switch (n->op) {
    case G_INPUT:
    case G_ARANGE:
        break;
    case G_PARAM:
        o = w->param_pl[id];
        break;
    case G_EMBED:
        /* vocab-parallel: each rank looks up its rows; the rest are zero */
        if (w->cur[in[1]].kind[TP] == PL_SPLIT && w->cur[in[1]].dim[TP] == 0) o = shard__with_tp(o, PL_PARTIAL, -1);
        else if (convert(w, in[1], shard__with_tp(w->cur[in[1]], PL_REP, -1), "embedding table gathered") < 0) return -1;
        break;
    case G_TRANSPOSE: {
        shard_pl x = w->cur[in[0]];
        if (x.kind[TP] == PL_SPLIT) o = shard__with_tp(o, PL_SPLIT, 1 - x.dim[TP]);
        else o = shard__with_tp(o, x.kind[TP], -1);
        break;
    }
    case G_MATMUL: {
        shard_pl wpl = w->cur[in[1]];
        int xl = last_dim(&p->g->nodes[in[0]]);
        if (wpl.kind[TP] == PL_PARTIAL && resolve_partial(w, in[1], "partial weight") < 0) return -1;
        wpl = w->cur[in[1]];
        if (wpl.kind[TP] == PL_SPLIT && wpl.dim[TP] == 1) {
            /* column-parallel: whole input, a slice of the output columns */
            if (convert(w, in[0], shard__with_tp(w->cur[in[0]], PL_REP, -1), "input of a column-parallel product") < 0)
                return -1;
            o = shard__with_tp(w->cur[in[0]], PL_SPLIT, n->rank - 1);
        } else if (wpl.kind[TP] == PL_SPLIT && wpl.dim[TP] == 0) {
            /* row-parallel: the input's matching slice, a partial output */
            if (convert(w, in[0], shard__with_tp(w->cur[in[0]], PL_SPLIT, xl), "input of a row-parallel product") < 0)
                return -1;
            o = shard__with_tp(w->cur[in[0]], PL_PARTIAL, -1);
        } else {
            if (resolve_partial(w, in[0], "input of a replicated product") < 0) return -1;
            shard_pl x = w->cur[in[0]];
            if (x.kind[TP] == PL_SPLIT && x.dim[TP] == xl &&
                convert(w, in[0], shard__with_tp(x, PL_REP, -1), "input of a replicated product") < 0)
                return -1;
            o = w->cur[in[0]];
        }
        break;
    }
    case G_BIAS_ADD: {
        shard_pl b = w->cur[in[1]];
        if (resolve_partial(w, in[0], "row-parallel output, before its bias") < 0) return -1;
        if (b.kind[TP] == PL_SPLIT) {
            if (convert(w, in[0], shard__with_tp(w->cur[in[0]], PL_SPLIT, last_dim(n)), "bias of a split output") < 0)
                return -1;
        } else if (w->cur[in[0]].kind[TP] == PL_SPLIT && w->cur[in[0]].dim[TP] == last_dim(n)) {
            if (convert(w, in[1], shard__with_tp(b, PL_SPLIT, 0), "bias of a split output") < 0) return -1;
        }
        o = w->cur[in[0]];
        break;
    }
    case G_LAYERNORM:
    case G_RMSNORM: {
        if (resolve_partial(w, in[0], "input of a norm") < 0) return -1;
        shard_pl x = w->cur[in[0]];
        if (x.kind[TP] == PL_SPLIT && x.dim[TP] == last_dim(n) &&
            convert(w, in[0], shard__with_tp(x, PL_REP, -1), "a norm needs whole rows") < 0)
            return -1;
        for (int k = 1; k < n->n_in; k++)
            if (convert(w, in[k], shard__with_tp(w->cur[in[k]], PL_REP, -1), "norm weights are whole") < 0) return -1;
        o = w->cur[in[0]];
        break;
    }
    case G_ROPE:
    case G_GELU:
    case G_SILU:
    case G_SCALE:
        if (n->op != G_SCALE && resolve_partial(w, in[0], "input of a pointwise op") < 0) return -1;
        o = w->cur[in[0]];
        break;
    case G_ATTENTION: {
        int split = 0;
        for (int k = 0; k < n->n_in; k++) {
            if (resolve_partial(w, in[k], "input of attention") < 0) return -1;
            shard_pl x = w->cur[in[k]];
            if (x.kind[TP] == PL_SPLIT && x.dim[TP] != last_dim(n) &&
                convert(w, in[k], shard__with_tp(x, PL_REP, -1), "attention needs the whole sequence") < 0)
                return -1;
            split |= w->cur[in[k]].kind[TP] == PL_SPLIT;
        }
        for (int k = 0; split && k < n->n_in; k++)
            if (convert(w, in[k], shard__with_tp(w->cur[in[k]], PL_SPLIT, last_dim(n)), "heads split over tp") < 0)
                return -1;
        o = shard__with_tp(w->cur[in[0]], split ? PL_SPLIT : PL_REP, last_dim(n));
        break;
    }
    case G_SWIGLU:
    case G_MUL:
    case G_ADD:
    case G_SUB: {
        int a = in[0], b = in[1];
        int pa = w->cur[a].kind[TP] == PL_PARTIAL, pb = w->cur[b].kind[TP] == PL_PARTIAL;
        if ((n->op == G_ADD || n->op == G_SUB) && pa && pb) {
            o = w->cur[a];
            break;
        }
        /* a partial operand takes the other's placement (an all-reduce, or
         * with sequence parallelism a reduce-scatter) */
        if (pa && !pb && convert(w, a, sum_target(w, a, b), "residual add of a partial sum") < 0) return -1;
        if (pb && !pa && convert(w, b, sum_target(w, b, a), "residual add of a partial sum") < 0) return -1;
        if (pa && pb && (resolve_partial(w, a, "product of partial sums") < 0 ||
                         resolve_partial(w, b, "product of partial sums") < 0))
            return -1;
        if (!shard__same_tp(shard__align(w, a, b), w->cur[b])) {
            /* a replicated operand is sliced to match a split one */
            int rep_b = w->cur[b].kind[TP] == PL_REP, rep_a = w->cur[a].kind[TP] == PL_REP;
            if (rep_b && convert(w, b, shard__align(w, a, b), "operand sliced to match") < 0) return -1;
            if (!rep_b && rep_a && convert(w, a, shard__align(w, b, a), "operand sliced to match") < 0) return -1;
            if (!rep_a && !rep_b && (convert(w, a, shard__with_tp(w->cur[a], PL_REP, -1), "operands split differently") < 0 ||
                                     convert(w, b, shard__with_tp(w->cur[b], PL_REP, -1), "operands split differently") < 0))
                return -1;
        }
        o = p->g->nodes[a].rank >= p->g->nodes[b].rank ? w->cur[a] : shard__align(w, b, a);
        if (p->g->nodes[a].rank < p->g->nodes[b].rank) o = w->cur[b];
        break;
    }
    case G_MOE: {
        /* tokens are independent: a sequence split is kept unless the
         * experts are split over tp, which needs whole tokens */
        int expert_tp = 0;
        for (int k = 2; k < n->n_in; k++) expert_tp |= w->cur[in[k]].kind[TP] == PL_SPLIT;
        if (resolve_partial(w, in[0], "input of moe") < 0) return -1;
        if (expert_tp && convert(w, in[0], shard__with_tp(w->cur[in[0]], PL_REP, -1), "experts split over tp") < 0)
            return -1;
        if (convert(w, in[1], shard__with_tp(w->cur[in[1]], PL_REP, -1), "the router is whole") < 0) return -1;
        if (shard__moe_dispatch(w, id, 0) < 0) return -1;
        o = shard__with_tp(w->cur[in[0]], expert_tp ? PL_PARTIAL : w->cur[in[0]].kind[TP], w->cur[in[0]].dim[TP]);
        break;
    }
    case G_CROSS_ENTROPY: {
        if (resolve_partial(w, in[0], "logits") < 0) return -1;
        shard_pl x = w->cur[in[0]];
        if (x.kind[TP] == PL_SPLIT && x.dim[TP] != last_dim(&p->g->nodes[in[0]]) &&
            convert(w, in[0], shard__with_tp(x, PL_REP, -1), "cross-entropy on whole rows") < 0)
            return -1;
        if (w->cur[in[0]].kind[TP] == PL_SPLIT && tp_on && shard__vocab_parallel_ce(w, id) < 0) return -1;
        break;
    }
    default:
        return fail(p, id, "%%%d: no placement rule for %s", id, graph_op_name(n->op));
    }
    for (int k = 0; k < n->n_in; k++)
        if (shard__use(w, id, k) < 0) return fail(p, id, "out of memory");
    o.kind[DP] = o.kind[EP] = PL_REP;
    o.dim[DP] = o.dim[EP] = -1;
    if (n->op == G_PARAM) o = w->param_pl[id];
    *out = o;
    return 0;
}

/* An activation the user annotated over tp is brought to that placement. */
static int annotated_activation(shard_walk *w, int id) {
    const g_node *n = &w->p->g->nodes[id];
    if (n->op == G_PARAM || w->p->setup.tp <= 1) return 0;
    for (int k = 0; k < n->n_annot; k++)
        if (n->annot[k].axis == TP)
            return convert(w, id, shard__with_tp(w->cur[id], n->annot[k].dim < 0 ? PL_REP : PL_SPLIT, n->annot[k].dim),
                           "annotated in the source");
    return 0;
}

/* ---- driver ---- */

/* zero 3 with pp > 1: a weight used before and after the layer stack (a
 * tied embedding) has a copy on the first and on the last stage; the last
 * one's is gathered before its first use after the stack. */
static int post_gathers(shard_walk *w, int id) {
    const graph *g = w->p->g;
    int stack = -1;
    for (int r = 0; r < g->n_regions; r++)
        if (g->regions[r].is_stack) stack = r;
    if (w->p->setup.pp == 1 || stack < 0 || id < g->regions[stack].end) return 0;
    for (int k = 0; k < g->nodes[id].n_in; k++) {
        int t = g->nodes[id].in[k], first = 1;
        if (g->nodes[t].op != G_PARAM || !shard__tied_across_stack(g, t)) continue;
        for (int c = g->regions[stack].end; c < id && first; c++)
            for (int j = 0; j < g->nodes[c].n_in; j++) first &= g->nodes[c].in[j] != t;
        for (int j = 0; j < k; j++) first &= g->nodes[id].in[j] != t;
        if (first && shard__zero3_gather(w, t, 0) < 0) return -1;
    }
    return 0;
}

int shard_build(const graph *g, const fe_setup *setup, shard_prog *p) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->setup = *setup;
    p->error_node = -1;
    shard_walk w;
    if (shard__walk_init(&w, p) < 0) return fail(p, -1, "out of memory");
    int rc = 0;
    for (int id = 0; id < g->n && rc == 0; id++) {
        shard_pl o;
        rc = shard__enter_regions(&w, id, resolve_partial);
        if (rc == 0) rc = rule(&w, id, &o);
        if (rc == 0) {
            shard__batch_axes(&w, id, &o);
            p->pl[id] = o;
            w.cur[id] = o;
            shard_step s = {0};
            s.kind = STEP_COMPUTE;
            s.node = id;
            s.region = w.region;
            s.axis = -1;
            s.dim = -1;
            if (post_gathers(&w, id) < 0) rc = fail(p, id, "out of memory");
            if (rc == 0 && g->nodes[id].op != G_PARAM && g->nodes[id].op != G_INPUT && shard__push(p, s) < 0)
                rc = fail(p, id, "out of memory");
            if (rc == 0 && g->nodes[id].op == G_PARAM && shard__zero3_gather(&w, id, 0) < 0)
                rc = fail(p, id, "out of memory");
            if (rc == 0 && g->nodes[id].op == G_MOE) rc = shard__moe_dispatch(&w, id, 1);
            if (rc == 0) rc = annotated_activation(&w, id);
        }
        if (rc == 0) rc = shard__leave_regions(&w, id, convert);
    }
    p->n_forward = p->n_steps;
    if (rc == 0) rc = shard__backward_walk(&w);
    shard__walk_free(&w);
    return rc;
}

void shard_free(shard_prog *p) {
    free(p->pl);
    free(p->is_act);
    free(p->steps);
    memset(p, 0, sizeof *p);
}
