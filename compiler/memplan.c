/* memplan.c — the static memory plan (memplan.h). */
#include "memplan.h"

#include <stdlib.h> /* calloc, free */
#include <string.h> /* memset */

#include "shard_impl.h"

enum { SEG_PRE, SEG_LAYER, SEG_POST, SEG_COUNT };

typedef struct mp {
    const shard_prog *p;
    const sched *sc;
    memplan *m;
    int stack;
    int64_t total_layers;
    int *seg;          /* per node */
    char *saved;       /* per node: kept for backward */
    int act_bytes;     /* bytes of a float activation */
} mp;

static int in_stack(const graph *g, int id, int stack) {
    for (int r = g->nodes[id].region; r >= 0; r = g->regions[r].parent)
        if (r == stack) return 1;
    return 0;
}

/* Copies of node id per run of its segment: nested repeats other than the
 * layer stack. */
static int64_t reps(const mp *x, int id) {
    const graph *g = x->p->g;
    int64_t n = 1;
    for (int r = g->nodes[id].region; r >= 0; r = g->regions[r].parent)
        if (r != x->stack) n *= g->regions[r].count;
    return n;
}

/* Bytes of node id on one rank, as produced. */
static int64_t local_bytes(const mp *x, int id) {
    const shard_prog *p = x->p;
    const g_node *n = &p->g->nodes[id];
    int64_t e = shard__numel(n);
    if (p->pl[id].kind[TP] == PL_SPLIT) e /= p->setup.tp;
    if (n->op == G_PARAM && p->pl[id].kind[EP] == PL_SPLIT) e /= p->setup.ep;
    return e * (n->is_int ? 4 : x->act_bytes);
}

/* Does op `c`'s backward read its input k (1), or its output (k = -1)? */
static int backward_reads(const g_node *c, int k) {
    switch (c->op) {
    case G_MATMUL: return k == 0;                     /* dW = x^T dy */
    case G_LAYERNORM:
    case G_RMSNORM:
    case G_GELU:
    case G_SILU: return k == 0;
    case G_SWIGLU:
    case G_MUL: return k >= 0;
    case G_ATTENTION: return 1;                       /* q, k, v and the output */
    case G_EMBED: return k == 0;                      /* the ids */
    case G_CROSS_ENTROPY: return k >= 0;              /* logits and targets */
    case G_MOE: return k == 0 || k == -1;
    default: return 0;
    }
}

/* Extra bytes an op keeps for backward beyond tensors: row statistics. */
static int64_t extra_saved(const mp *x, int id) {
    const g_node *n = &x->p->g->nodes[id];
    if (n->op == G_CROSS_ENTROPY) {
        const g_node *lg = &x->p->g->nodes[n->in[0]];
        return shard__numel(lg) / lg->dims[lg->rank - 1] * 2 * 4; /* max and sum per token */
    }
    if (n->rank == 0) return 0;
    int64_t rows = shard__numel(n) / n->dims[n->rank - 1];
    if (n->op == G_LAYERNORM || n->op == G_RMSNORM) return rows * 2 * 4; /* mean, 1/std in fp32 */
    if (n->op == G_ATTENTION && n->rank == 3) {
        int64_t heads = n->heads ? n->heads : 1;
        if (x->p->pl[id].kind[TP] == PL_SPLIT) heads /= x->p->setup.tp;
        return n->dims[0] * n->dims[1] * heads * 4;     /* log-sum-exp per row and head */
    }
    return 0;
}

static int is_activation(const mp *x, int id) {
    g_op op = x->p->g->nodes[id].op;
    return op != G_PARAM && op != G_ARANGE;
}

/* ---- first-fit over live intervals ---- */

typedef struct block {
    int64_t off, size;
    int end;
} block;

/* Places intervals [start[i], end[i]] of size[i] (sorted by start) and
 * returns the peak; off[i] receives each offset. */
static int64_t first_fit(const int *start, const int *end, const int64_t *size, int64_t *off, int n) {
    block *live = calloc((size_t)(n ? n : 1), sizeof *live);
    if (!live) return -1;
    int nl = 0;
    int64_t peak = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        for (int j = 0; j < nl; j++)
            if (live[j].end >= start[i]) live[k++] = live[j];
        nl = k;
        /* lowest gap that fits, scanning blocks by offset */
        int64_t at = 0;
        for (int moved = 1; moved;) {
            moved = 0;
            for (int j = 0; j < nl; j++)
                if (at < live[j].off + live[j].size && live[j].off < at + size[i]) {
                    at = live[j].off + live[j].size;
                    moved = 1;
                }
        }
        off[i] = at;
        live[nl++] = (block){at, size[i], end[i]};
        if (at + size[i] > peak) peak = at + size[i];
    }
    free(live);
    return peak;
}

/* Forward temporaries (activations not kept for backward) of one segment,
 * live from their producer to their last use, and backward gradients, live
 * from their first contribution to their producer's backward. */
static int workspaces(mp *x, int seg, int64_t *fwd, int64_t *bwd) {
    const graph *g = x->p->g;
    int n = g->n, cnt = 0;
    int *st = calloc((size_t)(n ? n : 1), sizeof *st), *en = calloc((size_t)(n ? n : 1), sizeof *en);
    int64_t *sz = calloc((size_t)(n ? n : 1), sizeof *sz), *off = calloc((size_t)(n ? n : 1), sizeof *off);
    int *ids = calloc((size_t)(n ? n : 1), sizeof *ids);
    if (!st || !en || !sz || !off || !ids) return -1;
    for (int pass = 0; pass < 2; pass++) {
        cnt = 0;
        for (int id = 0; id < n; id++) {
            if (x->seg[id] != seg || !is_activation(x, id) || g->nodes[id].op == G_INPUT) continue;
            if (pass == 0 && x->saved[id]) continue;
            if (pass == 1 && g->nodes[id].is_int) continue;
            int last = id;
            for (int c = id + 1; c < n; c++)
                for (int k = 0; k < g->nodes[c].n_in; k++)
                    if (g->nodes[c].in[k] == id && x->seg[c] == seg) last = c;
            /* forward: [id, last]; backward (reverse order): [n-1-last, n-1-id] */
            st[cnt] = pass ? n - 1 - last : id;
            en[cnt] = pass ? n - 1 - id : last;
            sz[cnt] = local_bytes(x, id) * reps(x, id);
            ids[cnt++] = id;
        }
        /* sort by start (insertion sort: segments are small) */
        for (int i = 1; i < cnt; i++)
            for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
                int t = st[j]; st[j] = st[j - 1]; st[j - 1] = t;
                t = en[j]; en[j] = en[j - 1]; en[j - 1] = t;
                t = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = t;
                int64_t s = sz[j]; sz[j] = sz[j - 1]; sz[j - 1] = s;
            }
        int64_t peak = first_fit(st, en, sz, off, cnt);
        if (peak < 0) return -1;
        if (pass == 0) {
            *fwd = peak;
            for (int i = 0; i < cnt; i++) {
                x->m->region[ids[i]] = MEM_WORKSPACE;
                x->m->offset[ids[i]] = off[i];
            }
        } else {
            *bwd = peak;
        }
    }
    free(st); free(en); free(sz); free(off); free(ids);
    return 0;
}

int memplan_build(memplan *m, const shard_prog *p, const sched *sc) {
    memset(m, 0, sizeof *m);
    const graph *g = p->g;
    const fe_setup *s = &p->setup;
    int n = g->n ? g->n : 1;
    mp x = {p, sc, m, -1, 0, NULL, NULL, s->precision == 0 ? 4 : 2};
    for (int r = 0; r < g->n_regions; r++)
        if (g->regions[r].is_stack) x.stack = r;
    if (x.stack >= 0) x.total_layers = g->regions[x.stack].count;
    m->pp = sc->pp;
    m->stage = calloc((size_t)sc->pp, sizeof *m->stage);
    m->region = calloc((size_t)n, sizeof *m->region);
    m->offset = calloc((size_t)n, sizeof *m->offset);
    m->bytes = calloc((size_t)n, sizeof *m->bytes);
    m->part = calloc((size_t)n, sizeof *m->part);
    x.seg = calloc((size_t)n, sizeof *x.seg);
    x.saved = calloc((size_t)n, 1);
    if (!m->stage || !m->region || !m->offset || !m->bytes || !m->part || !x.seg || !x.saved) return -1;

    /* segments, and what backward keeps */
    for (int id = 0; id < g->n; id++) {
        x.seg[id] = x.stack >= 0 && in_stack(g, id, x.stack) ? SEG_LAYER
                  : x.stack < 0 || id < g->regions[x.stack].first ? SEG_PRE : SEG_POST;
        m->bytes[id] = local_bytes(&x, id);
        const g_node *c = &g->nodes[id];
        if (backward_reads(c, -1)) x.saved[id] = 1;
        for (int k = 0; k < c->n_in; k++)
            if (backward_reads(c, k) && is_activation(&x, c->in[k])) x.saved[c->in[k]] = 1;
    }
    /* an input belongs to the segment of its first consumer */
    for (int id = 0; id < g->n; id++) {
        if (g->nodes[id].op != G_INPUT) continue;
        for (int c = id + 1; c < g->n; c++) {
            int uses = 0;
            for (int k = 0; k < g->nodes[c].n_in; k++) uses |= g->nodes[c].in[k] == id;
            if (uses) { x.seg[id] = x.seg[c]; break; }
        }
    }

    /* slot layout: saved tensors of each segment, in node order */
    int64_t seg_saved[SEG_COUNT] = {0}, layer_full = 0;
    for (int id = 0; id < g->n; id++) {
        int64_t b = x.saved[id] ? local_bytes(&x, id) * reps(&x, id) : 0;
        b += extra_saved(&x, id) * reps(&x, id);
        if (!b) continue;
        m->region[id] = MEM_SLOT;
        m->offset[id] = seg_saved[x.seg[id]];
        seg_saved[x.seg[id]] += b;
    }
    layer_full = seg_saved[SEG_LAYER];
    if (s->recompute && x.stack >= 0 && g->regions[x.stack].n_carry > 0) {
        /* only each layer's input is kept; the rest is rebuilt in backward */
        int t = g->regions[x.stack].carry[0].entry;
        seg_saved[SEG_LAYER] = local_bytes(&x, t);
        for (int id = 0; id < g->n; id++)
            if (x.seg[id] == SEG_LAYER && m->region[id] == MEM_SLOT) m->region[id] = MEM_WORKSPACE;
    }
    for (int id = 0; id < g->n; id++) m->part[id] = (signed char)x.seg[id];

    int64_t fwd[SEG_COUNT] = {0}, bwd[SEG_COUNT] = {0};
    for (int sg = 0; sg < SEG_COUNT; sg++)
        if (workspaces(&x, sg, &fwd[sg], &bwd[sg]) < 0) return -1;
    int64_t fws = 0, bws = 0;
    for (int sg = 0; sg < SEG_COUNT; sg++) {
        if (fwd[sg] > fws) fws = fwd[sg];
        int64_t b = bwd[sg] + (sg == SEG_LAYER && s->recompute ? layer_full : 0);
        if (b > bws) bws = b;
    }

    /* the largest collective output */
    int64_t comm = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const shard_step *st = &p->steps[i];
        if (st->kind == STEP_COMPUTE || st->kind == STEP_SLICE || st->axis == DP) continue;
        int64_t e = st->elems;
        if (st->kind == STEP_REDUCE_SCATTER) e /= (st->axis == TP ? s->tp : st->axis == EP ? s->ep : 1);
        if (e * x.act_bytes > comm) comm = e * x.act_bytes;
    }

    int pbytes = x.act_bytes, obytes = s->precision == 0 ? 8 : 12;
    /* zero = 3: params are gathered whole for use, a layer at a time (the
     * part before or after the stack counts as one) */
    int64_t gathered = 0, part_bytes[SEG_COUNT] = {0};
    for (int id = 0; id < g->n; id++)
        if (g->nodes[id].op == G_PARAM) part_bytes[x.seg[id]] += local_bytes(&x, id) / x.act_bytes * pbytes;
    for (int sg = 0; sg < SEG_COUNT; sg++)
        if (part_bytes[sg] > gathered) gathered = part_bytes[sg];
    int chunks = sc->pp * sc->v;
    for (int stg = 0; stg < sc->pp; stg++) {
        mem_stage *ms = &m->stage[stg];
        /* params held by the stage */
        double n_params = 0, sharded = 0;
        for (int id = 0; id < g->n; id++) {
            if (g->nodes[id].op != G_PARAM) continue;
            int64_t layers = 0;
            for (int c = stg; c < chunks; c += sc->pp) layers += sched_chunk_layers(sc, c, x.total_layers);
            double copies = x.seg[id] == SEG_LAYER ? (double)layers
                          : x.seg[id] == SEG_PRE ? (stg == 0 || (stg == sc->pp - 1 && sc->pp > 1 &&
                                                                 shard__tied_across_stack(g, id)))
                                                 : stg == sc->pp - 1;
            copies *= (double)reps(&x, id);
            double e = (double)(local_bytes(&x, id) / x.act_bytes) * copies;
            n_params += e;
            sharded += e / (double)shard__dp_group(p, id);
            if (copies > 0) {
                m->region[id] = MEM_PERSISTENT;
                m->offset[id] = (int64_t)((n_params - e) * pbytes);
            }
        }
        ms->params = (int64_t)((s->zero == 3 ? sharded : n_params) * pbytes);
        ms->grads = (int64_t)((s->zero >= 2 ? sharded : n_params) * pbytes);
        ms->optim = (int64_t)((s->zero >= 1 ? sharded : n_params) * obytes);
        ms->layer_stride = seg_saved[SEG_LAYER];
        for (int c = stg; c < chunks; c += sc->pp) {
            int64_t unit = (c == 0 ? seg_saved[SEG_PRE] : 0) +
                           sched_chunk_layers(sc, c, x.total_layers) * seg_saved[SEG_LAYER] +
                           (c == chunks - 1 ? seg_saved[SEG_POST] : 0);
            if (unit > ms->slot_bytes) ms->slot_bytes = unit;
        }
        ms->slots = sched_peak_inflight(sc, stg);
        ms->fwd_workspace = fws;
        ms->bwd_workspace = bws;
        ms->workspace = fws > bws ? fws : bws;
        if (s->zero == 3) ms->workspace += 2 * gathered; /* the layer in use and the one prefetched */
        ms->comm = comm;
        ms->total = ms->params + ms->grads + ms->optim + ms->slot_bytes * ms->slots + ms->workspace + ms->comm;
    }
    free(x.seg);
    free(x.saved);
    return 0;
}

void memplan_free(memplan *m) {
    free(m->stage);
    free(m->region);
    free(m->offset);
    free(m->bytes);
    free(m->part);
    memset(m, 0, sizeof *m);
}

static void mib(FILE *out, const char *label, int64_t b) {
    fprintf(out, "%s%s %.2f MiB", *label ? " " : "", label, (double)b / 1048576.0);
}

void memplan_dump(const memplan *m, const shard_prog *p, FILE *out) {
    static const char *const where[] = {"-", "persistent", "slot", "workspace"};
    fprintf(out, "# memory plan per rank, by pipeline stage\n");
    for (int s = 0; s < m->pp; s++) {
        const mem_stage *x = &m->stage[s];
        fprintf(out, "stage %d:", s);
        mib(out, "params", x->params);
        mib(out, "+ grads", x->grads);
        mib(out, "+ optimizer", x->optim);
        fprintf(out, " + %d slot%s x", x->slots, x->slots == 1 ? "" : "s");
        mib(out, "", x->slot_bytes);
        mib(out, "+ workspace", x->workspace);
        mib(out, "+ comm", x->comm);
        mib(out, "=", x->total);
        fputc('\n', out);
    }
    static const char *const parts[] = {"first", "layer", "last"};
    fprintf(out, "# buffers: node, bytes per rank, region[.part], offset within it (slot parts: the first\n"
                 "# chunk's before the stack, each layer's, the last chunk's after the stack)\n");
    for (int id = 0; id < p->g->n; id++) {
        if (m->region[id] == MEM_NONE) continue;
        fprintf(out, "%%%d %s %lld %s%s%s %lld\n", id, graph_op_name(p->g->nodes[id].op), (long long)m->bytes[id],
                where[m->region[id]], m->region[id] == MEM_PERSISTENT ? "" : ".",
                m->region[id] == MEM_PERSISTENT ? "" : parts[m->part[id]], (long long)m->offset[id]);
    }
}
