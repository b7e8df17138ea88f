/* ranks.c — every rank's program and the static check (ranks.h). */
#include "ranks.h"
#include "shard_impl.h"

#include <stdlib.h> /* calloc, realloc, free */
#include <string.h> /* memset */

enum { RANKS_MAX_WORLD = 1 << 20, RANKS_MAX_OPS = 1 << 25 };

typedef struct coords {
    int tp, ep, dp, pp;
} coords;

typedef struct builder {
    rank_progs *r;
    const shard_prog *p;
    const sched *sc;
    int stack;                /* the layer-stack region, -1 if none */
    int chunks;               /* pp x v */
    long long stack_count;    /* the layer stack's iterations */
    int base[6];              /* first group index of: tp, ep, dp dense, dp expert, first+last stage */
    const ranks_sizes *sizes; /* what each operation carries */
    signed char *part;        /* per step of the forward and backward programs: its part (unit_parts) */
} builder;

static int rank_of(const builder *b, coords c) {
    const fe_setup *s = &b->p->setup;
    return (int)(c.tp + s->tp * (c.ep + s->ep * (c.dp + s->dp * c.pp)));
}

static coords coords_of(const builder *b, int rank) {
    const fe_setup *s = &b->p->setup;
    coords c;
    c.tp = (int)(rank % s->tp);
    rank /= (int)s->tp;
    c.ep = (int)(rank % s->ep);
    rank /= (int)s->ep;
    c.dp = (int)(rank % s->dp);
    c.pp = (int)(rank / s->dp);
    return c;
}

static int push(builder *b, int rank, verify_op op) {
    rank_progs *r = b->r;
    if (r->n_ops[rank] == r->cap_ops[rank]) {
        int cap = r->cap_ops[rank] ? 2 * r->cap_ops[rank] : 64;
        verify_op *o = realloc(r->ops[rank], (size_t)cap * sizeof *o);
        if (!o) return -1;
        r->ops[rank] = o;
        r->cap_ops[rank] = cap;
    }
    r->ops[rank][r->n_ops[rank]++] = op;
    if (op.kind == VERIFY_COLL) r->n_coll++; else r->n_p2p++;
    return 0;
}

/* ---- groups ---- */

static int build_groups(builder *b) {
    const fe_setup *s = &b->p->setup;
    rank_progs *r = b->r;
    int ntp = (int)(s->pp * s->dp * s->ep), nep = (int)(s->pp * s->dp * s->tp);
    /* groups: tp, ep, dense dp (dp x ep), expert dp, and with pp > 1 the
     * first and last stage ranks of equal dp/ep/tp (tied weights) */
    int ndd = (int)(s->pp * s->tp), nde = (int)(s->pp * s->ep * s->tp), nemb = (int)(s->dp * s->ep * s->tp);
    b->base[0] = 0;
    b->base[1] = ntp;
    b->base[2] = ntp + nep;
    b->base[3] = ntp + nep + ndd;
    b->base[4] = ntp + nep + ndd + nde;
    b->base[5] = b->base[4] + (s->pp > 1 ? nemb : 0);
    r->n_groups = b->base[5];
    r->groups = calloc((size_t)r->n_groups, sizeof *r->groups);
    r->group_store = calloc((size_t)r->world * 5, sizeof *r->group_store);
    if (!r->groups || !r->group_store) return -1;
    int *fill = calloc((size_t)r->n_groups, sizeof *fill);
    if (!fill) return -1;
    int off = 0;
    const long long size[4] = {s->tp, s->ep, s->dp * s->ep, s->dp};
    for (int kind = 0; kind < 4; kind++)
        for (int gi = b->base[kind]; gi < b->base[kind + 1]; gi++) {
            r->groups[gi].ranks = r->group_store + off;
            r->groups[gi].n = (int)size[kind];
            off += (int)size[kind];
        }
    for (int gi = b->base[4]; gi < b->base[5]; gi++) {
        r->groups[gi].ranks = r->group_store + off;
        r->groups[gi].n = 2;
        off += 2;
    }
    for (int rank = 0; rank < r->world; rank++) {
        coords c = coords_of(b, rank);
        int g[5] = {b->base[0] + (int)((c.pp * s->dp + c.dp) * s->ep + c.ep),
                    b->base[1] + (int)((c.pp * s->dp + c.dp) * s->tp + c.tp),
                    b->base[2] + (int)(c.pp * s->tp + c.tp),
                    b->base[3] + (int)((c.pp * s->ep + c.ep) * s->tp + c.tp),
                    b->base[4] + (int)((c.dp * s->ep + c.ep) * s->tp + c.tp)};
        int n = s->pp > 1 && (c.pp == 0 || c.pp == s->pp - 1) ? 5 : 4;
        for (int k = 0; k < n; k++) ((int *)r->groups[g[k]].ranks)[fill[g[k]]++] = rank;
    }
    free(fill);
    return 0;
}

/* The group a step's collective runs in, for `rank`. */
static int group_of(const builder *b, const shard_step *st, int rank) {
    const fe_setup *s = &b->p->setup;
    coords c = coords_of(b, rank);
    if (st->axis == TP) return b->base[0] + (int)((c.pp * s->dp + c.dp) * s->ep + c.ep);
    if (st->axis == EP) return b->base[1] + (int)((c.pp * s->dp + c.dp) * s->tp + c.tp);
    if (st->axis == PP) return b->base[4] + (int)((c.dp * s->ep + c.ep) * s->tp + c.tp);
    int expert = b->p->g->nodes[st->node].op == G_PARAM && b->p->pl[st->node].kind[EP] == PL_SPLIT;
    if (!expert) return b->base[2] + (int)(c.pp * s->tp + c.tp);
    return b->base[3] + (int)((c.pp * s->ep + c.ep) * s->tp + c.tp);
}

/* ---- steps into ops ---- */

/* How many copies of step si's param a stage holds (layers, or 1/0). */
static long long holds(const builder *b, int si, int stage);

/* One collective of step si's kind and group carrying `bytes`. */
static int emit_bytes(builder *b, int rank, int si, long long bytes) {
    const shard_step *st = &b->p->steps[si];
    int g = group_of(b, st, rank);
    if (b->r->groups[g].n <= 1) return 0;
    verify_op op = {0};
    op.kind = VERIFY_COLL;
    op.group = g;
    op.coll = (int)st->kind * SHARD_AXES + st->axis;
    op.bytes = bytes;
    op.peer = -1;
    op.tag = si;
    return push(b, rank, op);
}

/* Bytes of an element step si's collective moves (ranks_sizes). */
static long long step_elem_bytes(const builder *b, int si) { return b->sizes->elem_bytes[si]; }

static int emit_step(builder *b, int rank, int si) {
    const shard_step *st = &b->p->steps[si];
    if (st->kind == STEP_COMPUTE || st->kind == STEP_SLICE) return 0;
    return emit_bytes(b, rank, si, st->elems * step_elem_bytes(b, si));
}

/* The region directly inside `parent` that holds step si, or -1 if the
 * step is directly in `parent`. */
static int child_region(const builder *b, int si, int parent) {
    const graph *g = b->p->g;
    int r = b->p->steps[si].region;
    if (r == parent) return -1;
    while (r >= 0 && g->regions[r].parent != parent) r = g->regions[r].parent;
    return r;
}

static int in_region(const builder *b, int si, int region) {
    for (int r = b->p->steps[si].region; r >= 0; r = b->p->g->regions[r].parent)
        if (r == region) return 1;
    return 0;
}

/* Emits steps idx[0..n) inside region `parent`, repeating nested (non-stack)
 * regions their count times. */
static int emit_seq(builder *b, int rank, const int *idx, int n, int parent) {
    for (int i = 0; i < n;) {
        int r = child_region(b, idx[i], parent);
        if (r < 0) {
            if (emit_step(b, rank, idx[i]) < 0) return -1;
            i++;
            continue;
        }
        int j = i;
        while (j < n && in_region(b, idx[j], r)) j++;
        for (long long k = 0; k < b->p->g->regions[r].count; k++)
            if (emit_seq(b, rank, idx + i, j - i, r) < 0) return -1;
        i = j;
    }
    return 0;
}

/* Where a step runs: 0 before the layer stack (first chunk), 1 in it (every
 * chunk), 2 after it (last chunk). */
static int part_of(const builder *b, int si) {
    if (b->stack < 0) return 0;
    if (in_region(b, si, b->stack)) return 1;
    return b->p->steps[si].node < b->p->g->regions[b->stack].first ? 0 : 2;
}

static long long holds(const builder *b, int si, int stage) {
    const shard_prog *p = b->p;
    int part = part_of(b, si);
    if (part == 1) {
        long long n = 0;
        for (int ch = stage; ch < b->chunks; ch += b->sc->pp) n += sched_chunk_layers(b->sc, ch, b->stack_count);
        return n;
    }
    if (part == 0 && stage == 0) return 1;
    if (part == 2 && stage == b->sc->pp - 1) return 1;
    if (part == 0 && stage == b->sc->pp - 1 && b->sc->pp > 1 && p->steps[si].axis == DP &&
        shard__tied_across_stack(p->g, p->steps[si].node))
        return 1; /* the last stage's copy of a tied weight */
    return 0;
}

/* The part of each step of the forward and backward programs by its
 * place: the stack's own; before the stack's steps (forward) or after them
 * (backward), the part before; else the part after. So a param's step
 * outside the stack (zero 2/3) is where its use is: a tied weight's on both
 * sides. A phase without stack steps: by node. */
static void unit_parts(builder *b) {
    const shard_prog *p = b->p;
    for (int phase = 0; phase < 2; phase++) {
        int first = -1, last = -1;
        for (int si = 0; si < p->n_steps; si++)
            if (p->steps[si].backward == phase && b->stack >= 0 && in_region(b, si, b->stack)) {
                if (first < 0) first = si;
                last = si;
            }
        for (int si = 0; si < p->n_steps; si++) {
            if (p->steps[si].backward != phase) continue;
            if (first < 0) b->part[si] = (signed char)part_of(b, si);
            else if (in_region(b, si, b->stack)) b->part[si] = 1;
            else b->part[si] = (signed char)((phase ? si < first : si > last) ? 2 : 0);
        }
    }
}

/* One forward or backward unit of `chunk` on `rank`. */
static int emit_unit(builder *b, int rank, int phase, int chunk, int *idx) {
    const shard_prog *p = b->p;
    static const int order_fwd[3] = {0, 1, 2}, order_bwd[3] = {2, 1, 0};
    const int *order = phase ? order_bwd : order_fwd;
    for (int o = 0; o < 3; o++) {
        int part = order[o];
        if (part == 0 && chunk != 0) continue;
        if (part == 2 && chunk != b->chunks - 1) continue;
        int n = 0;
        for (int si = 0; si < p->n_steps; si++)
            if (p->steps[si].backward == phase && b->part[si] == part) idx[n++] = si;
        long long reps = part == 1 ? sched_chunk_layers(b->sc, chunk, b->stack_count) : 1;
        for (long long k = 0; k < reps; k++)
            if (emit_seq(b, rank, idx, n, part == 1 ? b->stack : -1) < 0) return -1;
    }
    return 0;
}

static int emit_p2p(builder *b, int rank, const sched_unit *u) {
    coords c = coords_of(b, rank);
    c.pp = u->peer;
    verify_op op = {0};
    int send = u->op == SCHED_SEND_ACT || u->op == SCHED_SEND_GRAD;
    int grad = u->op == SCHED_SEND_GRAD || u->op == SCHED_RECV_GRAD;
    int consumer = u->chunk;
    if (u->op == SCHED_SEND_ACT) consumer = u->chunk + 1;
    if (u->op == SCHED_SEND_GRAD) consumer = u->chunk - 1;
    op.kind = send ? VERIFY_SEND : VERIFY_RECV;
    op.peer = rank_of(b, c);
    op.tag = 2 * (u->micro * b->chunks + consumer) + grad;
    op.bytes = b->sizes->act_bytes;
    op.group = -1;
    return push(b, rank, op);
}

int ranks_build(rank_progs *r, const shard_prog *p, const sched *sc, const ranks_sizes *sizes, char *err,
                size_t n) {
    memset(r, 0, sizeof *r);
    const fe_setup *s = &p->setup;
    const graph *g = p->g;
    if (s->world > RANKS_MAX_WORLD) {
        snprintf(err, n, "the static check handles at most %d ranks, not %lld", RANKS_MAX_WORLD, s->world);
        return -1;
    }
    r->world = (int)s->world;
    builder b = {0};
    b.r = r;
    b.p = p;
    b.sc = sc;
    b.stack = -1;
    for (int i = 0; i < g->n_regions; i++)
        if (g->regions[i].is_stack) b.stack = i;
    b.chunks = sc->pp * sc->v;
    b.stack_count = b.stack >= 0 ? g->regions[b.stack].count : 0;
    b.sizes = sizes;
    r->ops = calloc((size_t)r->world, sizeof *r->ops);
    r->n_ops = calloc((size_t)r->world, sizeof *r->n_ops);
    r->cap_ops = calloc((size_t)r->world, sizeof *r->cap_ops);
    r->progs = calloc((size_t)r->world, sizeof *r->progs);
    int *idx = malloc((size_t)(p->n_steps ? p->n_steps : 1) * sizeof *idx);
    b.part = calloc((size_t)(p->n_steps ? p->n_steps : 1), 1);
    int rc = !r->ops || !r->n_ops || !r->cap_ops || !r->progs || !idx || !b.part || build_groups(&b) < 0 ? -1 : 0;
    if (rc == 0) unit_parts(&b);
    /* The first rank of each stage first: they give the size of the whole
     * check before the rest is built. */
    int per_stage = r->world / sc->pp;
    long long projected = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++)
    for (int rank = 0; rank < r->world && rc == 0; rank++) {
        if ((rank % per_stage == 0) != (pass == 0)) continue;
        if (pass == 1 && rank == 1 && projected > RANKS_MAX_OPS) {
            snprintf(err, n, "%d ranks with about %lld operations in all: beyond the check's budget of %d",
                     r->world, projected, RANKS_MAX_OPS);
            free(idx);
            free(b.part);
            return -2;
        }
        const sched_stage *st = &sc->stages[coords_of(&b, rank).pp];
        for (int u = 0; u < st->n_units && rc == 0; u++) {
            const sched_unit *un = &st->units[u];
            if (un->op == SCHED_FWD || un->op == SCHED_BWD)
                rc = emit_unit(&b, rank, un->op == SCHED_BWD, un->chunk, idx);
            else
                rc = emit_p2p(&b, rank, un);
        }
        for (int phase = 2; phase <= 3 && rc == 0; phase++)
            for (int si = 0; si < p->n_steps && rc == 0; si++) {
                const shard_step *x = &p->steps[si];
                if (x->backward != phase) continue;
                if (x->bucket) {
                    /* a bucket: one collective over the members this stage holds */
                    int stage = coords_of(&b, rank).pp, sj = si;
                    long long bytes = 0;
                    for (; sj < p->n_steps && p->steps[sj].backward == phase && p->steps[sj].bucket == x->bucket; sj++)
                        bytes += holds(&b, sj, stage) * p->steps[sj].elems * step_elem_bytes(&b, sj);
                    if (bytes > 0) rc = emit_bytes(&b, rank, si, bytes);
                    si = sj - 1;
                    continue;
                }
                /* a stage syncs the params of the layers it holds */
                int part = part_of(&b, si), stage = coords_of(&b, rank).pp;
                int mine = part == 1 || (part == 0 && stage == 0) || (part == 2 && stage == sc->pp - 1);
                if (x->axis == PP) mine = stage == 0 || stage == sc->pp - 1;
                if (x->axis == DP && part == 0 && stage == sc->pp - 1 && sc->pp > 1 &&
                    shard__tied_across_stack(p->g, x->node))
                    mine = 1; /* the last stage's copy of a tied weight is synced too */
                long long reps = 1;
                if (part == 1) {
                    reps = 0;
                    for (int ch = stage; ch < b.chunks; ch += sc->pp) reps += sched_chunk_layers(sc, ch, b.stack_count);
                }
                for (long long k = 0; mine && k < reps && rc == 0; k++) rc = emit_step(&b, rank, si);
            }
        r->progs[rank].ops = r->ops[rank];
        r->progs[rank].n = r->n_ops[rank];
        if (pass == 0) projected += (long long)r->n_ops[rank] * per_stage;
    }
    free(idx);
    free(b.part);
    if (rc < 0) snprintf(err, n, "out of memory building the rank programs");
    return rc;
}

void ranks_free(rank_progs *r) {
    for (int i = 0; r->ops && i < r->world; i++) free(r->ops[i]);
    free(r->ops);
    free(r->n_ops);
    free(r->cap_ops);
    free(r->progs);
    free(r->groups);
    free(r->group_store);
    memset(r, 0, sizeof *r);
}

int ranks_check(const rank_progs *r, char *msg, size_t n) {
    return verify_run(r->progs, r->world, r->groups, r->n_groups, msg, n);
}
