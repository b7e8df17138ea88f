/* stats.c — the cost summary and memory accounting (stats.h). */
#include "stats.h"

#include <stdlib.h> /* calloc, strtod */
#include <string.h> /* strcmp */

#include "plan.h"
#include "shard_impl.h"

typedef struct layout {
    int stack, chunks;
    const sched *sc;
    long long total;          /* the stack's count */
} layout;

static layout layout_of(const shard_prog *p, const sched *sc) {
    layout l = {-1, sc->pp * sc->v, sc, 0};
    for (int r = 0; r < p->g->n_regions; r++)
        if (p->g->regions[r].is_stack) l.stack = r;
    if (l.stack >= 0) l.total = p->g->regions[l.stack].count;
    return l;
}

/* Layer-stack iterations the chunks of `stage` run. */
static long long stage_layers(const layout *l, int stage) {
    long long n = 0;
    for (int c = stage; c < l->chunks; c += l->sc->pp) n += sched_chunk_layers(l->sc, c, l->total);
    return n;
}

static int in_stack(const graph *g, int id, int stack) {
    for (int r = g->nodes[id].region; r >= 0; r = g->regions[r].parent)
        if (r == stack) return 1;
    return 0;
}

/* How many copies of node id one stage holds or runs: a layer's share of
 * the stack (times nested repeats), or 1 before/after it on the first/last
 * stage, else 0. */
static double copies(const shard_prog *p, const layout *l, int id, int stage, int pp, int v) {
    const graph *g = p->g;
    double mult = 1;
    for (int r = g->nodes[id].region; r >= 0; r = g->regions[r].parent)
        if (r != l->stack) mult *= (double)g->regions[r].count;
    (void)v;
    if (l->stack >= 0 && in_stack(g, id, l->stack)) return mult * (double)stage_layers(l, stage);
    int before = l->stack < 0 || id < g->regions[l->stack].first;
    if (before) return stage == 0 ? mult : 0;
    return stage == pp - 1 ? mult : 0;
}

/* A tied weight is also held by the last stage. */
static double param_copies(const shard_prog *p, const layout *l, int id, int stage, int pp, int v) {
    double c = copies(p, l, id, stage, pp, v);
    if (c == 0 && pp > 1 && stage == pp - 1 && shard__tied_across_stack(p->g, id)) c = 1;
    return c;
}

/* Elements of node id on one rank: split over tp, and (params) over ep.
 * Activation shapes are already those of one data-parallel rank. */
static double local_elems(const shard_prog *p, int id) {
    double e = (double)shard__numel(&p->g->nodes[id]);
    if (p->pl[id].kind[TP] == PL_SPLIT) e /= (double)p->setup.tp;
    if (p->g->nodes[id].op == G_PARAM && p->pl[id].kind[EP] == PL_SPLIT) e /= (double)p->setup.ep;
    return e;
}

/* Forward FLOPs of one application of node id on one rank. */
static double flops_of(const shard_prog *p, int id) {
    const g_node *n = &p->g->nodes[id];
    const long long tp = p->setup.tp;
    if (n->op == G_MATMUL) {
        const g_node *x = &p->g->nodes[n->in[0]];
        double k = (double)x->dims[x->rank - 1];
        double out = (double)shard__numel(n);
        if (p->pl[id].kind[TP] == PL_SPLIT) out /= (double)tp;                 /* column-parallel */
        if (p->pl[id].kind[TP] == PL_PARTIAL) k /= (double)tp;                 /* row-parallel */
        return 2.0 * out * k;
    }
    if (n->op == G_ATTENTION) {
        /* q k^T and attention x v: 2 x 2 x B x T^2 x (heads x head size) */
        double b = (double)n->dims[0], t = (double)n->dims[1], c = (double)n->dims[2];
        if (p->pl[id].kind[TP] == PL_SPLIT) c /= (double)tp;
        return 4.0 * b * t * t * c;
    }
    if (n->op == G_MOE) {
        /* each token through top_k experts of 2 (gelu) or 3 (swiglu) matrices */
        const g_node *x = &p->g->nodes[n->in[0]], *w = &p->g->nodes[n->in[2]];
        double tokens = (double)shard__numel(x) / (double)x->dims[x->rank - 1];
        double per = 2.0 * (double)w->dims[1] * (double)w->dims[2] * (n->act_gelu ? 2 : 3);
        if (p->pl[n->in[2]].kind[TP] == PL_SPLIT) per /= (double)tp;
        return tokens * (double)n->top_k * per;
    }
    return 0;
}

int stats_build(stats *out, const shard_prog *p, const sched *sc) {
    const fe_setup *s = &p->setup;
    const graph *g = p->g;
    out->pp = sc->pp;
    out->stage = calloc((size_t)sc->pp, sizeof *out->stage);
    if (!out->stage) return -1;
    plan pl; /* the memory plan is laid out from the plan the runtime gets */
    if (plan_from(&pl, "", &p->setup, g, p, sc) != 0) {
        plan_free(&pl);
        return -1;
    }
    layout l = layout_of(p, sc);
    for (int st = 0; st < sc->pp; st++) {
        stats_stage *x = &out->stage[st];
        const mem_stage *ms = &pl.memory[st];
        double n_params = 0, fl = 0;
        for (int id = 0; id < g->n; id++) {
            const g_node *n = &g->nodes[id];
            if (n->op == G_PARAM) {
                n_params += local_elems(p, id) * param_copies(p, &l, id, st, sc->pp, sc->v);
                continue;
            }
            if (n->op == G_INPUT || n->is_int) continue;
            fl += copies(p, &l, id, st, sc->pp, sc->v) * flops_of(p, id);
        }
        x->n_params = (long long)n_params;
        x->params = ms->params;
        x->grads = ms->grads;
        x->optim = ms->optim;
        x->peak_inflight = ms->slots;
        x->act_per_micro = ms->slot_bytes;
        x->activations = ms->slot_bytes * ms->slots;
        x->workspace = ms->workspace;
        x->comm = ms->comm;
        x->total = ms->total;
        x->flops = fl * (double)s->micro_batches * (s->recompute ? 4.0 : 3.0);
    }
    plan_free(&pl);
    double bubble = 0;
    sched_simulate(sc, 1.0, 2.0, &bubble);
    out->bubble = bubble;
    return 0;
}

void stats_free(stats *s) {
    free(s->stage);
    s->stage = NULL;
}

static void human_bytes(double b, char *buf, size_t n) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (b >= 1024 && k < 4) {
        b /= 1024;
        k++;
    }
    if (k == 0) snprintf(buf, n, "%.0f B", b);
    else snprintf(buf, n, "%.2f %s", b, u[k]);
}

void stats_print(const stats *s, const shard_prog *p, const sched *sc, const rank_progs *r, FILE *out) {
    const fe_setup *st = &p->setup;
    static const char *const axes[SHARD_AXES] = {"dp", "tp", "pp", "ep"};
    fprintf(out, "# per rank, for each pipeline stage (all ranks of a stage do the same work)\n");
    for (int i = 0; i < s->pp; i++) {
        const stats_stage *x = &s->stage[i];
        char a[32], b[32], c[32], d[32], t[32];
        human_bytes((double)x->params, a, sizeof a);
        human_bytes((double)x->grads, b, sizeof b);
        human_bytes((double)x->optim, c, sizeof c);
        human_bytes((double)x->activations, d, sizeof d);
        human_bytes((double)x->total, t, sizeof t);
        fprintf(out, "stage %d: %lld params per rank\n", i, x->n_params);
        char e[32], f[32];
        human_bytes((double)x->workspace, e, sizeof e);
        human_bytes((double)x->comm, f, sizeof f);
        fprintf(out, "  memory:  %s total = params %s + gradients %s + optimizer %s + activations %s "
                     "(%d micro-batch chunk%s in flight) + workspace %s + communication %s\n", t, a, b, c, d,
                x->peak_inflight, x->peak_inflight == 1 ? "" : "s", e, f);
        fprintf(out, "  compute: %.3g TFLOP per step (forward + backward%s)\n", x->flops / 1e12,
                st->recompute ? " + recompute" : "");
        /* communication of the first rank of the stage */
        int rank = (int)(i * st->dp * st->ep * st->tp);
        long long calls[STEP_SLICE + 1][SHARD_AXES] = {{0}}, bytes[STEP_SLICE + 1][SHARD_AXES] = {{0}};
        long long sends = 0, send_bytes = 0, recvs = 0;
        for (int k = 0; r && k < r->n_ops[rank]; k++) {
            const verify_op *op = &r->ops[rank][k];
            if (op->kind == VERIFY_SEND) { sends++; send_bytes += op->bytes; continue; }
            if (op->kind == VERIFY_RECV) { recvs++; continue; }
            int kind = op->coll / SHARD_AXES, axis = op->coll % SHARD_AXES;
            calls[kind][axis]++;
            bytes[kind][axis] += op->bytes;
        }
        fprintf(out, "  comm:    ");
        int any = 0;
        for (int k = STEP_ALL_REDUCE; k <= STEP_ALL_TO_ALL; k++)
            for (int ax = 0; ax < SHARD_AXES; ax++) {
                if (!calls[k][ax]) continue;
                char m[32];
                human_bytes((double)bytes[k][ax], m, sizeof m);
                fprintf(out, "%s%s(%s) %lld x, %s", any++ ? "; " : "", shard_step_name((shard_step_kind)k), axes[ax],
                        calls[k][ax], m);
            }
        if (sends || recvs) {
            char m[32];
            human_bytes((double)send_bytes, m, sizeof m);
            fprintf(out, "%ssend %lld x, %s; receive %lld x", any++ ? "; " : "", sends, m, recvs);
        }
        fprintf(out, "%s per step\n", any ? "" : "none");
    }
    fprintf(out, "pipeline: %s, pp %d, %d micro-batches, %d virtual stage%s: bubble %.2f%% of the step "
                 "(backward = 2 x forward)\n", sched_kind_name(sc->kind), sc->pp, sc->m, sc->v, sc->v == 1 ? "" : "s",
            100.0 * s->bubble);
}


/* Forward FLOPs of one micro-batch on one rank: before the layer stack, one
 * iteration of it, and after it. */
void stats_stack_costs(const shard_prog *p, double *pre, double *layer, double *post) {
    const graph *g = p->g;
    int stack = -1;
    for (int r = 0; r < g->n_regions; r++)
        if (g->regions[r].is_stack) stack = r;
    *pre = *layer = *post = 0;
    for (int id = 0; id < g->n; id++) {
        double mult = 1;
        for (int r = g->nodes[id].region; r >= 0; r = g->regions[r].parent)
            if (r != stack) mult *= (double)g->regions[r].count;
        double f = mult * flops_of(p, id);
        if (stack >= 0 && in_stack(g, id, stack)) *layer += f;
        else if (stack < 0 || id < g->regions[stack].first) *pre += f;
        else *post += f;
    }
}
