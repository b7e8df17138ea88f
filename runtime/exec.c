/* exec.c — the plan interpreter on one CPU rank (exec.h). */
#include "exec.h"

#include <math.h>   /* cos, isfinite */
#include <stdarg.h> /* va_list */
#include <stdint.h> /* SIZE_MAX */
#include <stdio.h>  /* vsnprintf */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memset, strstr */

#include "comm.h"    /* comm_* */
#include "init.h"    /* mesh__init_* */
#include "kcpu.h"    /* kcpu_* */
#include "memplan.h" /* memplan_*, mem_buf */

/* A moe node's geometry, and its routing bound to the iteration's memory. */
typedef struct ex_moe {
    int N, D, E, K, C, F;
    int P, El;            /* the ep group's ranks, and the experts each holds (E / P) */
    size_t route_bytes;
    kcpu_moe_route route;
} ex_moe;

struct mesh__exec {
    const plan *p;
    memplan mp;          /* the layout, in fp32 */
    const mem_stage *ms; /* stage 0's sizes */
    unsigned char *arena; /* the one allocation: ms->total bytes */
    /* byte offsets of the regions in the arena */
    int64_t grads_at, optim_at, slots_at, pinned_at, shared_at, recompute_at;
    int64_t part_at[3];  /* a slot's parts */
    int slot;            /* the slot of the unit being run */
    int *slot_of;        /* per micro-batch: its slot while in flight */
    char *slot_busy;     /* per slot */
    int n;               /* tensors */
    size_t *numel;       /* per tensor: elements of one iteration's value on this rank */
    int64_t (*ld)[GRAPH_MAX_RANK]; /* per tensor: its dims on this rank (tp and ep splits applied) */
    int *iters;          /* per tensor: iterations of its region (1 outside) */
    int *zero_by;        /* per tensor: the node whose backward starts its gradient
                            (its last consumer in its segment, or itself), -1 if none */
    int *params;         /* tensor ids of the params */
    int n_params;
    char ***names;       /* per param tensor: its iterations' global names */
    float **gbufs;       /* the gradients this rank updates, for the global norm: per param
                            tensor (all copies) without ZeRO, per copy its shard with it */
    size_t *gsizes;      /* and their elements */
    char *gsplit;        /* and whether they are split over tp */
    int n_gbufs;
    size_t *shard;       /* per param tensor: elements of each copy's ZeRO shard (all without) */
    size_t *opt_at;      /* per param tensor: where its first copy's moments start in m and v */
    size_t opt_elems;    /* elements of m (and of v) on this rank */
    int zero;            /* ZeRO >= 1: each param's optimizer state is sharded over its
                            data-parallel group (zcomm) */
    int tokens_in, targets_in; /* the input tensors */
    int stack;           /* the layer stack's region, -1 if none */
    double dloss;        /* seed of the backward: 1 / micro-batches */
    ex_moe **moe;        /* per tensor: moe layers' geometry, NULL for others */
    double loss;         /* the last forward's loss, with moe's load-balancing losses */
    int recomputing;     /* running forward steps again in a backward */
    int poison;          /* test hook: dead memory is filled with NaN (mesh__exec_set_poison) */
    long long adam_t;    /* AdamW steps taken */
    size_t host_bytes;   /* bookkeeping allocated besides the arena */
    int rank;            /* in the plan's world */
    int coord[4];        /* on each axis: dp, tp, pp, ep */
    comm *axis[4];       /* this rank's group on each axis of size > 1, else NULL */
    comm *world;         /* the world's communicator (not owned), NULL on one rank */
    int data_ranks;      /* ranks the global batch is split over: dp x ep */
    /* pipeline: this rank's stage runs chunk `stage` (one chunk per stage) */
    int stage, last_stage;
    int chunk, chunks;   /* the chunk being run (of the stage's: stage, stage + pp, ...), and pp x v */
    int first_layer, n_layers; /* the chunk's iterations of the stack */
    int *copies;         /* per param tensor: the copies this stage holds (0: none) */
    comm *tied;          /* the first and the last stage, for a param both use (pp > 1) */
    comm *data;          /* dp x ep: the ranks the batch is split over, a dense param's data-parallel
                            group (axis[0] when ep = 1; owned when ep > 1) */
    char error[400];     /* why the last step failed */
    int counting;        /* in a training step: bytes sent are counted */
    int chain;           /* deterministic: the data-parallel ranks add their gradients one after
                            another, in the one-rank order (MESH__EXEC_DETERMINISTIC) */
    double sent[STEP_SLICE][4], sent_p2p; /* bytes sent by kind and axis, and by pipeline sends */
    long long steps;     /* training steps counted */
    mesh_alloc_fn alloc; /* the context's allocator hook */
    void *ud;
};

/* Zeroed memory from the context's allocator. The block's size is kept in
 * a header before it, for the hook's old_size. */
enum { EX_HEADER = 16 };

static void *ex_calloc(mesh__exec *ex, size_t n, size_t size)
{
    if (n && size > (SIZE_MAX - EX_HEADER) / n) return NULL;
    size_t bytes = n * size;
    unsigned char *base = ex->alloc(ex->ud, NULL, 0, bytes + EX_HEADER);
    if (!base) return NULL;
    memcpy(base, &bytes, sizeof bytes);
    memset(base + EX_HEADER, 0, bytes);
    return base + EX_HEADER;
}

static void ex_free(mesh__exec *ex, void *p)
{
    if (!p) return;
    unsigned char *base = (unsigned char *)p - EX_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    ex->alloc(ex->ud, base, bytes + EX_HEADER, 0);
}

/* Bookkeeping: counted apart from the arena. */
static void *host_calloc(mesh__exec *ex, size_t n, size_t size)
{
    void *p = ex_calloc(ex, n, size);
    if (p) ex->host_bytes += n * size;
    return p;
}

static void set_err(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && n) vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

static int64_t last_dim(const plan_tensor *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

/* ---- where a tensor lives ---------------------------------------------- */

static const mem_buf *buf_of(const mesh__exec *ex, int id) { return memplan_buf(&ex->mp, ex->stage, id); }

static int in_stack(const mesh__exec *ex, int id)
{
    return ex->stack >= 0 && ex->p->tensors[id].region == ex->stack;
}

/* The first layer of chunk c. */
static int chunk_start(const mesh__exec *ex, int c)
{
    int f = 0;
    for (int k = 0; k < c; k++) f += (int)ex->p->chunk_layers[k];
    return f;
}

/* The copy of a param at iteration it: a layer-stack param's copies are
 * the layers of the stage's chunks, in chunk order. */
static int64_t param_copy(const mesh__exec *ex, int id, int it)
{
    if (!in_stack(ex, id)) return it > 0 ? it : 0;
    int64_t base = 0;
    for (int c = ex->stage; c < ex->chunks; c += ex->p->pp) {
        int f = chunk_start(ex, c), n = (int)ex->p->chunk_layers[c];
        if (it >= f && it < f + n) return base + it - f;
        base += n;
    }
    return 0;
}

/* The iteration of a param's copy k (param_copy's inverse). */
static int copy_it(const mesh__exec *ex, int id, int k)
{
    if (!in_stack(ex, id)) return k;
    for (int c = ex->stage; c < ex->chunks; c += ex->p->pp) {
        if (k < (int)ex->p->chunk_layers[c]) return chunk_start(ex, c) + k;
        k -= (int)ex->p->chunk_layers[c];
    }
    return 0;
}

/* The copy of an activation at iteration it in the unit being run: a
 * layer-stack tensor's iterations start at the chunk's first layer. */
static int64_t local_it(const mesh__exec *ex, int id, int it)
{
    if (in_stack(ex, id)) it -= ex->first_layer;
    return it > 0 ? it : 0;
}

/* Is tensor id a value carried into the layer stack? */
static int carried_entry(const mesh__exec *ex, int id, int *which)
{
    if (ex->stack < 0) return 0;
    const plan_region *g = &ex->p->regions[ex->stack];
    for (int c = 0; c < g->n_carry; c++)
        if (g->carry[c].entry == id) {
            if (which) *which = c;
            return 1;
        }
    return 0;
}

/* Where a later pipeline chunk receives carried value c: the start of its slot. */
static int64_t recv_at(const mesh__exec *ex, int c)
{
    int64_t at = ex->slots_at + ex->slot * ex->ms->slot_bytes;
    const plan_region *g = &ex->p->regions[ex->stack];
    for (int k = 0; k < c; k++) at += memplan_buf(&ex->mp, ex->stage, g->carry[k].exit)->bytes;
    return at;
}

/* Value of tensor id at its iteration it (-1, a carried entry: 0). */
static float *vptr(const mesh__exec *ex, int id, int it)
{
    const mem_buf *b = buf_of(ex, id);
    int64_t at;
    int c;
    if (ex->chunk > 0 && carried_entry(ex, id, &c)) /* received from the chunk before */
        return (float *)(void *)(ex->arena + recv_at(ex, c));
    switch (b->region) {
    case MEM_PERSISTENT: at = 0; break;
    case MEM_SLOT: at = ex->slots_at + ex->slot * ex->ms->slot_bytes + ex->part_at[b->part]; break;
    case MEM_WORKSPACE: at = ex->shared_at; break;
    case MEM_RECOMPUTE: at = ex->recompute_at; break;
    default: return NULL;
    }
    int64_t copy = b->region == MEM_PERSISTENT ? param_copy(ex, id, it) : local_it(ex, id, it);
    return (float *)(void *)(ex->arena + at + b->offset + copy * b->stride);
}

/* Gradient of tensor id at its iteration it. A carried value's gradient
 * alternates between its pair of buffers: the exit of iteration it uses
 * it % 2, the entry (the exit of the iteration before the stage's first)
 * the other. */
static float *gptr(const mesh__exec *ex, int id, int it)
{
    const mem_buf *b = buf_of(ex, id);
    int64_t at;
    switch (b->grad_region) {
    case MEM_PERSISTENT: at = ex->grads_at; break;
    case MEM_WORKSPACE: at = ex->shared_at; break;
    case MEM_PINNED: at = ex->pinned_at; break;
    default: return NULL;
    }
    if (b->carried && b->grad_region == MEM_PINNED) {
        if (ex->p->tensors[id].region < 0) it = ex->first_layer - 1; /* an entry: "the iteration before" */
        at += (int64_t)(((it % 2) + 2) % 2) * b->bytes;
    } else {
        at += (b->grad_region == MEM_PERSISTENT ? param_copy(ex, id, it) : local_it(ex, id, it)) * b->grad_stride;
    }
    return (float *)(void *)(ex->arena + at + b->grad_offset);
}

/* The saved statistics after tensor id's value. */
static float *aux_ptr(const mesh__exec *ex, int id, int it)
{
    return (float *)(void *)((unsigned char *)vptr(ex, id, it) + buf_of(ex, id)->bytes);
}

/* Which copy of tensor id a consumer in region r at iteration it reads:
 * inside the same region, that iteration's; a carried entry, the previous
 * iteration's exit (the entry itself, iteration -1, at iteration 0); a
 * region's tensor seen from outside, its last iteration's. */
static int resolve(const mesh__exec *ex, int id, int r, int it, int *copy)
{
    const plan *p = ex->p;
    int tr = p->tensors[id].region;
    *copy = 0;
    if (tr >= 0 && tr == r) {
        *copy = it;
        return id;
    }
    if (tr < 0) {
        for (int q = 0; q < p->n_regions; q++)
            for (int c = 0; c < p->regions[q].n_carry; c++) {
                if (p->regions[q].carry[c].entry != id) continue;
                if (q == r && it > ex->first_layer) {
                    *copy = it - 1;
                    return p->regions[q].carry[c].exit;
                }
                *copy = -1;
            }
        return id;
    }
    *copy = ex->iters[id] - 1;
    return id;
}

static float *val_in(const mesh__exec *ex, int id, int r, int it)
{
    int copy, t = resolve(ex, id, r, it, &copy);
    return vptr(ex, t, copy);
}

static float *grad_in(const mesh__exec *ex, int id, int r, int it)
{
    int copy, t = resolve(ex, id, r, it, &copy);
    return gptr(ex, t, copy);
}

#define IN(k) val_in(ex, t->in[k], t->region, it)
#define DIN(k) grad_in(ex, t->in[k], t->region, it)
#define OUT vptr(ex, id, it)
#define DOUT gptr(ex, id, it)
#define AUX aux_ptr(ex, id, it)
#define I32(x) ((int32_t *)(void *)(x))

/* A moe layer's buffers at iteration it: routing, then xe, ye [E, C, D],
 * then hg, hu, act [E, C, F]; its backward's scratch: dxe, dye [E, C, D],
 * dweight [N, K], then max([N, E], [2, C, F]). */
/* With expert parallelism the rows go through two exchanges over the ep
 * group: xs (this rank's tokens dispatched, in expert order, so rank q's
 * experts are one block) becomes xr (the rows every rank sent to this
 * rank's experts, [P, El, C, D]); the experts turn xr into ys, which goes
 * back as yr ([E, C, D], this rank's tokens again). On one ep rank xr is
 * xs and yr is ys. The backward's gradients go the same ways. */
typedef struct moe_bufs {
    float *xs, *xr, *ys, *yr, *hg, *hu, *act;
    int *cnt;             /* [P, El] rows each rank sent to each local expert */
    float *dyr, *dys, *dxr, *dxs, *dweight, *scratch;
} moe_bufs;

static moe_bufs moe_at(mesh__exec *ex, int id, int it)
{
    ex_moe *g = ex->moe[id];
    size_t ecd = (size_t)g->E * (size_t)g->C * (size_t)g->D, ecf = (size_t)g->E * (size_t)g->C * (size_t)g->F;
    unsigned char *aux = (unsigned char *)aux_ptr(ex, id, it);
    int ep = g->P > 1;
    kcpu_moe_route_bind(&g->route, aux, g->N, g->E, g->K, g->C);
    moe_bufs m;
    m.xs = (float *)(void *)(aux + g->route_bytes);
    m.ys = m.xs + ecd;
    m.hg = m.ys + ecd;
    m.hu = m.hg + ecf;
    m.act = m.hu + ecf;
    m.xr = ep ? m.act + ecf : m.xs;
    m.yr = ep ? m.xr + ecd : m.ys;
    m.cnt = ep ? (int *)(void *)(m.yr + ecd) : g->route.count;
    m.dyr = (float *)(void *)(ex->arena + ex->shared_at + buf_of(ex, id)->scratch_offset);
    m.dxr = m.dyr + ecd;
    m.dys = ep ? m.dxr + ecd : m.dyr;
    m.dxs = ep ? m.dys + ecd : m.dxr;
    m.dweight = (ep ? m.dxs : m.dxr) + ecd;
    m.scratch = m.dweight + (size_t)g->N * (size_t)g->K;
    return m;
}

/* An all-to-all over the ep group of [P blocks of `per` floats]. */
static int moe_exchange(mesh__exec *ex, const float *in, float *out, size_t per)
{
    comm *c = ex->axis[3];
    size_t counts[64];
    for (int q = 0; q < c->size; q++) counts[q] = per;
    if (comm_all_to_all(c, in, counts, out, counts) == 0) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d: the moe all-to-all over ep: %s", ex->rank, c->error);
    return -1;
}

/* The local experts on every source rank's rows: one call per source. */
static void moe_experts_forward(const ex_moe *g, const moe_bufs *m, const float *wg, const float *wu, const float *wd)
{
    size_t rows = (size_t)g->El * (size_t)g->C;
    for (int s = 0; s < g->P; s++)
        kcpu_moe_expert_forward(m->ys + s * rows * g->D, m->hg + s * rows * g->F, m->hu + s * rows * g->F,
                                m->act + s * rows * g->F, m->xr + s * rows * g->D, wg, wu, wd, m->cnt + s * g->El,
                                g->El, g->C, g->D, g->F);
}

static void moe_experts_backward(const ex_moe *g, const moe_bufs *m, float *dwg, float *dwu, float *dwd,
                                 const float *wg, const float *wu, const float *wd)
{
    size_t rows = (size_t)g->El * (size_t)g->C;
    for (int s = 0; s < g->P; s++)
        kcpu_moe_expert_backward(m->dxr + s * rows * g->D, dwg, dwu, dwd, m->scratch, m->dyr + s * rows * g->D,
                                 m->hg + s * rows * g->F, m->hu + s * rows * g->F, m->act + s * rows * g->F,
                                 m->xr + s * rows * g->D, wg, wu, wd, m->cnt + s * g->El, g->El, g->C, g->D, g->F);
}

/* ---- tensor parallelism ------------------------------------------------- */

/* Is tensor id split over tp (and along which dim, if so)? */
static int split_tp(const mesh__exec *ex, int id)
{
    return ex->p->setup.tp > 1 && ex->p->tensors[id].pl.kind[1] == PL_SPLIT;
}

/* Is param id split over ep (an expert's weights, along its first dim)? */
static int split_ep(const mesh__exec *ex, int id)
{
    const plan_tensor *t = &ex->p->tensors[id];
    return ex->p->setup.ep > 1 && t->op == G_PARAM && t->pl.kind[3] == PL_SPLIT;
}

/* The group param id's optimizer state is sharded over with ZeRO: its
 * data-parallel group (dp x ep for a dense param, dp for an expert's);
 * NULL without ZeRO or for a group of one. */
static comm *zcomm(const mesh__exec *ex, int id)
{
    if (!ex->zero) return NULL;
    return split_ep(ex, id) ? ex->axis[0] : ex->data;
}

/* The first vocabulary row of an embedding table on this rank. */
static int row0_of(const mesh__exec *ex, int table)
{
    return split_tp(ex, table) && ex->p->tensors[table].pl.dim[1] == 0 ? ex->coord[1] * (int)ex->ld[table][0] : 0;
}

static int sum_doubles(mesh__exec *ex, comm *c, double *x, int n);

/* The blocks a param's split dim is made of: one, or for a packed q/k/v
 * projection (it feeds, through a matmul and bias adds, a one-input
 * attention) the q, k and v channels, each split over tp on its own, so
 * that a rank's slice holds the q, k and v of its heads (docs/language.md,
 * attention). Returns the count, sizes in seg. */
static int split_blocks(const mesh__exec *ex, int id, int64_t seg[3])
{
    const plan *p = ex->p;
    const plan_tensor *t = &p->tensors[id];
    int d = t->pl.dim[1], cur = id;
    seg[0] = t->dims[d];
    if (d != t->rank - 1) return 1;
    for (int depth = 0; depth < 4; depth++) {
        int next = -1;
        for (int c = cur + 1; c < p->n_tensors && next < 0; c++) {
            const plan_tensor *u = &p->tensors[c];
            for (int k = 0; k < u->n_in && next < 0; k++) {
                if (u->in[k] != cur) continue;
                if (u->op == G_ATTENTION && u->n_in == 1) {
                    int64_t H = u->heads, KV = u->kv_heads ? u->kv_heads : u->heads, dh = last_dim(u) / H;
                    if ((H + 2 * KV) * dh != seg[0]) return 1;
                    seg[0] = H * dh;
                    seg[1] = seg[2] = KV * dh;
                    return 3;
                }
                if ((u->op == G_MATMUL && k == 1) || u->op == G_BIAS_ADD || u->op == G_ADD) next = c;
            }
        }
        if (next < 0) return 1;
        cur = next;
    }
    return 1;
}

/* Calls fn(ctx, local, whole, len) for each contiguous run of param id's
 * elements on the rank `r` of its tp group: `len` elements at `local` in
 * the rank's slice are at `whole` in the whole param. */
typedef void (*run_fn)(void *ctx, size_t local, size_t whole, size_t len);

static void param_runs(const mesh__exec *ex, int id, int r, run_fn fn, void *ctx)
{
    const plan_tensor *t = &ex->p->tensors[id];
    if (split_ep(ex, id)) { /* a block of whole experts: one run */
        fn(ctx, 0, (size_t)r * ex->numel[id], ex->numel[id]);
        return;
    }
    if (!split_tp(ex, id)) {
        fn(ctx, 0, 0, ex->numel[id]);
        return;
    }
    int d = t->pl.dim[1], tp = (int)ex->p->setup.tp;
    int64_t seg[3];
    int nseg = split_blocks(ex, id, seg);
    size_t outer = 1, inner = 1;
    for (int k = 0; k < d; k++) outer *= (size_t)t->dims[k];
    for (int k = d + 1; k < t->rank; k++) inner *= (size_t)t->dims[k];
    for (size_t o = 0; o < outer; o++) {
        size_t lacc = 0, gacc = 0;
        for (int j = 0; j < nseg; j++) {
            size_t L = (size_t)seg[j] / (size_t)tp;
            fn(ctx, (o * (size_t)ex->ld[id][d] + lacc) * inner, (o * (size_t)t->dims[d] + gacc + (size_t)r * L) * inner,
               L * inner);
            lacc += L;
            gacc += (size_t)seg[j];
        }
    }
}

/* Initialising a param's slice: the whole param's values at its indices. */
typedef struct init_ctx {
    float *w;
    uint64_t key;
    float std;
} init_ctx;

static void init_run(void *ctx, size_t local, size_t whole, size_t len)
{
    init_ctx *c = ctx;
    mesh__init_normal(c->w + local, len, whole, c->key, c->std);
}

/* Vocabulary-parallel cross-entropy: this rank holds columns [r W, (r + 1)
 * W) of the logits. The ranks take the rows' maximum, then add their sums
 * of exp(logit - max) and their target logits (exactly, in rank order).
 * aux: losses, rowmax, lse [N] each, as the whole-vocabulary kernel's. */
static int ce_shard_forward(mesh__exec *ex, float *out, float *aux, const float *logits, const int32_t *targets,
                            int N, int W, int V)
{
    comm *c = ex->axis[1];
    float *mx = aux + N, *lse = aux + 2 * N, *tl = aux; /* the losses' place holds the target logits first */
    int col0 = ex->coord[1] * W;
    kcpu_crossentropy_shard_max(mx, tl, logits, targets, N, col0, W, V);
    float *all = malloc((size_t)c->size * (size_t)N * sizeof *all);
    double *st = malloc(2 * (size_t)N * sizeof *st);
    int rc = all && st ? comm_all_gather(c, mx, all, (size_t)N) : -1;
    if (rc == 0) {
        for (int i = 0; i < N; i++)
            for (int q = 0; q < c->size; q++) mx[i] = all[(size_t)q * N + i] > mx[i] ? all[(size_t)q * N + i] : mx[i];
        kcpu_crossentropy_shard_sumexp(st, logits, mx, N, col0, W, V);
        for (int i = 0; i < N; i++) st[N + i] = tl[i];
        rc = sum_doubles(ex, c, st, 2 * N);
    }
    if (rc == 0) {
        double total = 0;
        for (int i = 0; i < N; i++) {
            double ls = log(st[i]), loss = ls - (st[N + i] - mx[i]);
            aux[i] = (float)loss;
            lse[i] = (float)ls;
            total += loss;
        }
        out[0] = (float)(total / N);
    } else if (!all || !st) {
        snprintf(ex->error, sizeof ex->error, "rank %d: out of memory", ex->rank);
        comm_abort(c, ex->error);
    } else if (!ex->error[0]) {
        snprintf(ex->error, sizeof ex->error, "rank %d: vocabulary-parallel cross-entropy: %s", ex->rank, c->error);
    }
    free(all);
    free(st);
    return rc;
}

/* ---- one op ----------------------------------------------------------- */

/* Broadcast add: the smaller operand's elements repeat over the larger's. */
static void add_forward(float *out, const float *a, size_t na, const float *b, size_t nb)
{
    if (na == nb) kcpu_add_forward(out, a, b, na);
    else if (na > nb) kcpu_add_broadcast_forward(out, a, b, (int)(na / nb), 1, (int)nb);
    else kcpu_add_broadcast_forward(out, b, a, (int)(nb / na), 1, (int)na);
}

static void add_backward(float *da, size_t na, float *db, size_t nb, const float *dout)
{
    if (na == nb) kcpu_add_backward(da, db, dout, na);
    else if (na > nb) kcpu_add_broadcast_backward(da, db, dout, (int)(na / nb), 1, (int)nb);
    else kcpu_add_broadcast_backward(db, da, dout, (int)(nb / na), 1, (int)na);
}

/* The last of tensor id's dims on this rank. */
static int lastd(const mesh__exec *ex, int id)
{
    const plan_tensor *t = &ex->p->tensors[id];
    return t->rank ? (int)ex->ld[id][t->rank - 1] : 1;
}

/* Attention geometry on this rank: qkv [B, T, (H + 2 KV) d] -> out [B, T,
 * H d]; split over tp, H and KV are the rank's heads. */
static void attn_dims(const mesh__exec *ex, int id, int *B, int *T, int *H, int *KV, int *d)
{
    const plan_tensor *t = &ex->p->tensors[id];
    *d = (int)(last_dim(t) / t->heads);
    *H = lastd(ex, id) / *d;
    *KV = (int)((t->kv_heads ? t->kv_heads : t->heads) * *H / t->heads);
    *T = (int)ex->ld[id][t->rank - 2];
    *B = (int)(ex->numel[id] / ((size_t)*T * (size_t)*H * (size_t)*d));
}

static int forward_node(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *a = t->n_in > 0 ? &ex->p->tensors[t->in[0]] : NULL;
    const plan_tensor *b = t->n_in > 1 ? &ex->p->tensors[t->in[1]] : NULL;
    size_t n = ex->numel[id];
    switch (t->op) {
    case G_EMBED: { /* a table split over tp holds its rank's rows of the vocabulary */
        int rows = (int)ex->ld[t->in[1]][0], C = (int)ex->ld[t->in[1]][1];
        kcpu_embedding_rows_forward(OUT, I32(IN(0)), IN(1), (int)ex->numel[t->in[0]], row0_of(ex, t->in[1]), rows,
                                    C);
        break;
    }
    case G_ARANGE:
        for (size_t k = 0; k < n; k++) I32(OUT)[k] = (int32_t)k;
        break;
    case G_MATMUL: {
        int K = lastd(ex, t->in[0]), N = lastd(ex, id), M = (int)(n / (size_t)N);
        if (b->op == G_TRANSPOSE) /* x @ transpose(w): w stored [N, K] */
            kcpu_matmul_wt_forward(OUT, IN(0), val_in(ex, b->in[0], t->region, it), NULL, M, K, N);
        else
            kcpu_matmul_forward(OUT, IN(0), IN(1), NULL, M, K, N);
        break;
    }
    case G_TRANSPOSE: /* only read through the matmul that uses it */
        break;
    case G_BIAS_ADD:
    case G_ADD:
        add_forward(OUT, IN(0), ex->numel[t->in[0]], IN(1), ex->numel[t->in[1]]);
        break;
    case G_LAYERNORM: {
        int C = lastd(ex, id), rows = (int)(n / (size_t)C);
        float *aux = AUX;
        kcpu_layernorm_forward(OUT, aux, aux + rows, IN(0), IN(1), t->n_in > 2 ? IN(2) : NULL, rows, C,
                               (float)t->eps);
        break;
    }
    case G_RMSNORM: {
        int C = lastd(ex, id), rows = (int)(n / (size_t)C);
        kcpu_rmsnorm_forward(OUT, AUX, IN(0), IN(1), rows, C, (float)t->eps);
        break;
    }
    case G_ATTENTION: {
        int B, T, H, KV, d;
        attn_dims(ex, id, &B, &T, &H, &KV, &d);
        if (t->n_in == 1) /* packed [q | k | v] */
            kcpu_attention_qkv_forward(OUT, AUX, IN(0), B, T, H, KV, d, t->causal);
        else
            kcpu_attention_forward(OUT, AUX, IN(0), IN(1), IN(2), B, T, H, KV, d, t->causal);
        break;
    }
    case G_ROPE: {
        int B, T, H, KV, d;
        attn_dims(ex, id, &B, &T, &H, &KV, &d);
        kcpu_rope_forward(OUT, IN(0), B, T, H, d, (float)t->theta, 0);
        break;
    }
    case G_GELU: kcpu_gelu_forward(OUT, IN(0), n); break;
    case G_SILU: kcpu_silu_forward(OUT, IN(0), n); break;
    case G_SWIGLU: kcpu_swiglu_forward(OUT, IN(0), IN(1), n); break;
    case G_CROSS_ENTROPY: {
        int W = lastd(ex, t->in[0]), N = (int)ex->numel[t->in[1]];
        int V = t->vocab > 0 ? (int)t->vocab : (int)last_dim(a);
        float *aux = AUX;
        if (split_tp(ex, t->in[0])) { /* vocabulary-parallel */
            if (ce_shard_forward(ex, OUT, aux, IN(0), I32(IN(1)), N, W, V) != 0) return -1;
        } else {
            OUT[0] = kcpu_crossentropy_forward(aux, aux + N, aux + 2 * N, IN(0), I32(IN(1)), N, V, W);
        }
        break;
    }
    case G_MOE: {
        ex_moe *g = ex->moe[id];
        moe_bufs m = moe_at(ex, id, it);
        size_t block = (size_t)g->El * (size_t)g->C * (size_t)g->D;
        kcpu_moe_route_forward(&g->route, IN(0), IN(1), g->D);
        kcpu_moe_dispatch_forward(m.xs, IN(0), &g->route, g->D);
        if (g->P > 1) { /* the counts, then the rows, to the experts' ranks */
            float fc[256], rc[256];
            for (int e = 0; e < g->E; e++) fc[e] = (float)g->route.count[e];
            if (moe_exchange(ex, fc, rc, (size_t)g->El) != 0 || moe_exchange(ex, m.xs, m.xr, block) != 0) return -1;
            for (int e = 0; e < g->E; e++) m.cnt[e] = (int)rc[e];
        }
        moe_experts_forward(g, &m, IN(2), IN(3), IN(4));
        if (g->P > 1 && moe_exchange(ex, m.ys, m.yr, block) != 0) return -1; /* the outputs back */
        kcpu_moe_combine_forward(OUT, m.yr, &g->route, g->D);
        if (!ex->recomputing) ex->loss += t->aux_loss * (double)g->route.aux;
        break;
    }
    default: /* inputs and params are filled elsewhere; others refused at create */
        break;
    }
    if (id == ex->p->loss && !ex->recomputing) ex->loss += OUT[0];
    return 0;
}

static int backward_node(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *a = t->n_in > 0 ? &ex->p->tensors[t->in[0]] : NULL;
    const plan_tensor *b = t->n_in > 1 ? &ex->p->tensors[t->in[1]] : NULL;
    size_t n = ex->numel[id];
    switch (t->op) {
    case G_EMBED: {
        int rows = (int)ex->ld[t->in[1]][0], C = (int)ex->ld[t->in[1]][1];
        kcpu_embedding_rows_backward(DIN(1), DOUT, I32(IN(0)), (int)ex->numel[t->in[0]], row0_of(ex, t->in[1]),
                                     rows, C);
        break;
    }
    case G_MATMUL: {
        int K = lastd(ex, t->in[0]), N = lastd(ex, id), M = (int)(n / (size_t)N);
        if (b->op == G_TRANSPOSE)
            kcpu_matmul_wt_backward(DIN(0), grad_in(ex, b->in[0], t->region, it), NULL, DOUT, IN(0),
                                    val_in(ex, b->in[0], t->region, it), M, K, N);
        else
            kcpu_matmul_backward(DIN(0), DIN(1), NULL, DOUT, IN(0), IN(1), M, K, N);
        break;
    }
    case G_BIAS_ADD:
    case G_ADD:
        add_backward(DIN(0), ex->numel[t->in[0]], DIN(1), ex->numel[t->in[1]], DOUT);
        break;
    case G_LAYERNORM: {
        int C = lastd(ex, id), rows = (int)(n / (size_t)C);
        float *aux = AUX;
        kcpu_layernorm_backward(DIN(0), DIN(1), t->n_in > 2 ? DIN(2) : NULL, DOUT, IN(0), IN(1), aux,
                                aux + rows, rows, C);
        break;
    }
    case G_RMSNORM: {
        int C = lastd(ex, id), rows = (int)(n / (size_t)C);
        kcpu_rmsnorm_backward(DIN(0), DIN(1), DOUT, IN(0), IN(1), AUX, rows, C);
        break;
    }
    case G_ATTENTION: {
        int B, T, H, KV, d;
        attn_dims(ex, id, &B, &T, &H, &KV, &d);
        if (t->n_in == 1)
            kcpu_attention_qkv_backward(DIN(0), DOUT, OUT, AUX, IN(0), B, T, H, KV, d, t->causal);
        else
            kcpu_attention_backward(DIN(0), DIN(1), DIN(2), DOUT, OUT, AUX, IN(0), IN(1), IN(2), B, T,
                                    H, KV, d, t->causal);
        break;
    }
    case G_ROPE: {
        int B, T, H, KV, d;
        attn_dims(ex, id, &B, &T, &H, &KV, &d);
        kcpu_rope_backward(DIN(0), DOUT, B, T, H, d, (float)t->theta, 0);
        break;
    }
    case G_GELU: kcpu_gelu_backward(DIN(0), IN(0), DOUT, n); break;
    case G_SILU: kcpu_silu_backward(DIN(0), IN(0), DOUT, n); break;
    case G_SWIGLU: kcpu_swiglu_backward(DIN(0), DIN(1), DOUT, IN(0), IN(1), n); break;
    case G_CROSS_ENTROPY: {
        int W = lastd(ex, t->in[0]), N = (int)ex->numel[t->in[1]];
        int V = t->vocab > 0 ? (int)t->vocab : (int)last_dim(a);
        float *aux = AUX;
        kcpu_crossentropy_shard_backward(DIN(0), IN(0), I32(IN(1)), aux + N, aux + 2 * N, DOUT[0], N,
                                         split_tp(ex, t->in[0]) ? ex->coord[1] * W : 0, W, V);
        break;
    }
    case G_MOE: {
        ex_moe *g = ex->moe[id];
        moe_bufs m = moe_at(ex, id, it);
        size_t ecd = (size_t)g->E * (size_t)g->C * (size_t)g->D, block = ecd / (size_t)g->P;
        memset(m.dys, 0, ecd * sizeof(float));
        memset(m.dxr, 0, ecd * sizeof(float));
        memset(m.dweight, 0, (size_t)g->N * (size_t)g->K * sizeof(float));
        kcpu_moe_combine_backward(m.dys, m.dweight, DOUT, m.yr, &g->route, g->D);
        if (g->P > 1 && moe_exchange(ex, m.dys, m.dyr, block) != 0) return -1; /* to the experts' ranks */
        moe_experts_backward(g, &m, DIN(2), DIN(3), DIN(4), IN(2), IN(3), IN(4));
        if (g->P > 1 && moe_exchange(ex, m.dxr, m.dxs, block) != 0) return -1; /* back to the tokens' rank */
        kcpu_moe_dispatch_backward(DIN(0), m.dxs, &g->route, g->D);
        /* the load-balancing loss is part of the loss: its gradient scales
         * with the seed of the backward, as the cross-entropy's does */
        kcpu_moe_route_backward(DIN(0), DIN(1), m.scratch, m.dweight, (float)(t->aux_loss * ex->dloss), &g->route,
                                IN(0), IN(1), g->D);
        break;
    }
    default:
        break;
    }
    return 0;
}


/* ---- running the program ---------------------------------------------- */

/* Poisoning: the shared workspace and the recompute area hold nothing
 * live between ops' runs of forward and backward, nor a slot before its
 * unit's forward. */
static void poison_workspace(mesh__exec *ex)
{
    if (ex->poison) memset(ex->arena + ex->shared_at, 0xff, (size_t)(ex->ms->shared + ex->ms->recompute));
}

void mesh__exec_set_poison(mesh__exec *ex, int on) { ex->poison = on; }

/* Before node c's backward: the gradients it starts (of inputs whose last
 * consumer it is, or its own when nothing consumes it) are zeroed; the
 * loss's is the seed. */
static void start_grads(mesh__exec *ex, int c, int it)
{
    const plan_tensor *t = &ex->p->tensors[c];
    for (int k = 0; k < t->n_in; k++) {
        int in = t->in[k], seen = 0;
        for (int j = 0; j < k; j++) seen |= t->in[j] == in;
        if (seen || ex->zero_by[in] != c) continue;
        float *g = grad_in(ex, in, t->region, it);
        if (g) memset(g, 0, (size_t)buf_of(ex, in)->bytes);
    }
    if (ex->zero_by[c] != c) return;
    float *g = gptr(ex, c, it);
    if (!g) return;
    if (c == ex->p->loss) g[0] = (float)ex->dloss;
    else memset(g, 0, (size_t)buf_of(ex, c)->bytes);
}

/* Before iteration it of the stack's backward: the buffer of each carried
 * value's pair that receives the gradient of the iteration's entry. */
static void start_carries(mesh__exec *ex, int r, int it)
{
    const plan_region *g = &ex->p->regions[r];
    for (int c = 0; c < g->n_carry; c++) {
        float *d = gptr(ex, g->carry[c].exit, it - 1);
        if (d && buf_of(ex, g->carry[c].exit)->carried) memset(d, 0, (size_t)buf_of(ex, g->carry[c].exit)->bytes);
    }
}

/* A collective step of the program on the rank's group of its axis. */
static int collective(mesh__exec *ex, const plan_step *st, int it)
{
    /* over pp: a tied param's two copies, on the first and the last stage;
     * over dp, a dense param's gradients: dp x ep */
    comm *c = st->axis == 2 ? ex->tied : ex->axis[st->axis];
    const plan_tensor *nt = &ex->p->tensors[st->node];
    if (st->axis == 0 && nt->op == G_PARAM && nt->pl.kind[3] != PL_SPLIT) c = ex->data;
    if (ex->chain && st->axis == 0 && st->kind == STEP_ALL_REDUCE) return 0; /* the chain summed them */
    if (c && ex->counting && st->kind < STEP_SLICE) ex->sent[st->kind][st->axis] += (double)st->elems * 4;
    if (st->kind == STEP_ALL_TO_ALL && nt->op == G_MOE) return 0; /* the op exchanges its rows itself */
    if (!c) return 0; /* a group of one */
    int rc = -1;
    const char *what = "?";
    size_t n = (size_t)(buf_of(ex, st->node)->bytes / 4), part = n / (size_t)c->size;
    switch (st->kind) {
    case STEP_ALL_REDUCE:
        what = "all-reduce";
        if (ex->p->tensors[st->node].op == G_CROSS_ENTROPY) return 0; /* the op exchanges its sums itself */
        /* forward: a partial sum of values; backward and the gradient sync: of gradients */
        rc = comm_all_reduce(c, st->phase == PLAN_FORWARD ? vptr(ex, st->node, it) : gptr(ex, st->node, it), n);
        break;
    case STEP_REDUCE_SCATTER: { /* ZeRO's gradient sync: this rank's shard summed, in place */
        what = "reduce-scatter";
        float *g = gptr(ex, st->node, it);
        if (n % (size_t)c->size == 0) rc = comm_reduce_scatter(c, g, g + (size_t)c->rank * part, part);
        else rc = comm_all_reduce(c, g, n); /* uneven shards: the whole sum, of which it uses its part */
        break;
    }
    case STEP_ALL_GATHER: { /* ZeRO: every rank's updated shard, into the whole param */
        what = "all-gather";
        float *w = vptr(ex, st->node, it);
        size_t sh = ex->shard[st->node], lo = (size_t)c->rank * sh, hi = lo + sh < n ? lo + sh : n;
        if (n % (size_t)c->size == 0) {
            rc = comm_all_gather(c, w + lo, w, sh);
        } else { /* uneven: a sum of the shards over zeros is the gather, exactly */
            memset(w, 0, lo * sizeof *w);
            if (hi < n) memset(w + hi, 0, (n - hi) * sizeof *w);
            rc = comm_all_reduce(c, w, n);
        }
        break;
    }
    default:
        snprintf(c->error, sizeof c->error, "not run yet");
        break;
    }
    if (rc != 0)
        snprintf(ex->error, sizeof ex->error, "rank %d: %s(%s) of tensor %d (%s): %s", ex->rank, what,
                 plan__axis_name(st->axis), st->node, plan_phase_name(st->phase), c->error);
    return rc;
}

/* Does step st run on this pipeline stage? A layer's on the stage of its
 * layers (run_phase picks the iterations), one before the stack on the
 * first stage, one after it on the last; a param's gradient sync and
 * gather where the param is held. */
static int step_here(const mesh__exec *ex, const plan_step *st)
{
    if (ex->p->pp == 1) return 1;
    const plan_tensor *t = &ex->p->tensors[st->node];
    if (st->phase == PLAN_GRAD_SYNC || st->phase == PLAN_AFTER_OPTIMIZER) return ex->copies[st->node] > 0;
    if (ex->stack >= 0 && t->region == ex->stack) return ex->n_layers > 0;
    return st->node < ex->p->regions[ex->stack].first ? ex->chunk == 0 : ex->chunk == ex->chunks - 1;
}

/* Pipeline transfers of the carried values (comm: the pp group, eager
 * sends): a stage after the first receives its first layer's input before
 * a forward, one before the last sends its last layer's output after it;
 * in the backward the gradients go the other way. */
static int pipe_transfer(mesh__exec *ex, int grad, int send)
{
    const plan_region *g = &ex->p->regions[ex->stack];
    comm *c = ex->axis[2];
    int pp = (int)ex->p->pp, peer = grad == send ? (ex->stage + pp - 1) % pp : (ex->stage + 1) % pp;
    int last_it = ex->first_layer + ex->n_layers - 1;
    for (int k = 0; k < g->n_carry; k++) {
        int exit = g->carry[k].exit, entry = g->carry[k].entry;
        size_t bytes = (size_t)buf_of(ex, exit)->bytes;
        int rc;
        if (!grad && !send) rc = comm_recv(c, ex->arena + recv_at(ex, k), bytes, peer);
        else if (!grad) rc = comm_send(c, vptr(ex, exit, last_it), bytes, peer);
        else if (!send) rc = comm_recv(c, gptr(ex, exit, last_it), bytes, peer);
        else rc = comm_send(c, gptr(ex, entry, 0), bytes, peer);
        if (rc == 0 && send && ex->counting) ex->sent_p2p += (double)bytes;
        if (rc != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d (stage %d): %s %s %s stage %d: %s", ex->rank, ex->stage,
                     send ? "sending" : "receiving", grad ? "gradients" : "activations", send ? "to" : "from", peer,
                     c->error);
            return -1;
        }
    }
    return 0;
}

/* Is an input's part (before or after the stack) run on this stage? */
static int part_here(const mesh__exec *ex, int id)
{
    int part = buf_of(ex, id)->part;
    return part == MEM_PART_PRE ? ex->chunk == 0 : part == MEM_PART_POST ? ex->chunk == ex->chunks - 1 : 1;
}

/* Runs the program's steps of one phase on this stage; a run of
 * consecutive steps in a region repeats per iteration (backward: last to
 * first, each iteration starting with the forward steps it recomputes).
 * Returns 0, or -1 when a collective or a transfer failed (ex->error). */
static int run_phase(mesh__exec *ex, plan_phase phase)
{
    const plan *p = ex->p;
    int back = phase == PLAN_BACKWARD;
    if (back) {
        poison_workspace(ex);
        memset(ex->arena + ex->pinned_at, 0, (size_t)ex->ms->pinned);
        if (ex->chunk < ex->chunks - 1 && pipe_transfer(ex, 1, 0) != 0) return -1;
    } else if (phase == PLAN_FORWARD && ex->chunk > 0 && pipe_transfer(ex, 0, 0) != 0) {
        return -1;
    }
    int sync = phase == PLAN_GRAD_SYNC || phase == PLAN_AFTER_OPTIMIZER;
    for (int s = 0; s < p->n_steps;) {
        const plan_step *st = &p->steps[s];
        if (st->phase != phase) { s++; continue; }
        int e = s + 1;
        if (st->region >= 0)
            while (e < p->n_steps && p->steps[e].phase == phase && p->steps[e].region == st->region) e++;
        int count = st->region >= 0 ? (int)p->regions[st->region].count : 1;
        int stack = st->region >= 0 && st->region == ex->stack;
        if (stack) count = sync ? ex->copies[st->node] : ex->n_layers; /* the unit's layers; a param's held copies */
        if (!step_here(ex, st)) count = 0;
        for (int k = 0; k < count; k++) {
            int it = stack && sync ? copy_it(ex, st->node, k)
                   : stack         ? ex->first_layer + (back ? count - 1 - k : k)
                                   : back ? count - 1 - k : k;
            if (back && st->region >= 0) start_carries(ex, st->region, it);
            for (int q = s; q < e; q++) {
                const plan_step *sq = &p->steps[q];
                if (sq->kind != STEP_COMPUTE) {
                    if (collective(ex, sq, it) != 0) return -1;
                } else if (back && sq->recompute) {
                    ex->recomputing = 1;
                    int rc = forward_node(ex, sq->node, it);
                    ex->recomputing = 0;
                    if (rc != 0) return -1;
                } else if (back) {
                    start_grads(ex, sq->node, it);
                    if (backward_node(ex, sq->node, it) != 0) return -1;
                } else if (forward_node(ex, sq->node, it) != 0) {
                    return -1;
                }
            }
        }
        s = e;
    }
    if (phase == PLAN_FORWARD && ex->chunk < ex->chunks - 1) return pipe_transfer(ex, 0, 1);
    if (back && ex->chunk > 0) return pipe_transfer(ex, 1, 1);
    return 0;
}

size_t mesh__exec_batch_tokens(const mesh__exec *ex) { return ex->numel[ex->tokens_in]; }

/* Switches to chunk c of the stage: its layers, and its slot's parts
 * (chunk 0 starts with the part before the stack, a later one with what
 * it receives; the last ends with the part after). */
static void set_chunk(mesh__exec *ex, int c)
{
    ex->chunk = c;
    ex->first_layer = chunk_start(ex, c);
    ex->n_layers = ex->stack >= 0 ? (int)ex->p->chunk_layers[c] : 0;
    ex->part_at[MEM_PART_PRE] = 0;
    ex->part_at[MEM_PART_LAYER] = c == 0 ? ex->mp.part_bytes[MEM_PART_PRE] : ex->mp.recv_bytes;
    ex->part_at[MEM_PART_POST] = ex->part_at[MEM_PART_LAYER] + (int64_t)ex->n_layers * ex->mp.part_bytes[MEM_PART_LAYER];
}

/* Forward of one micro-batch in the current slot: its loss in *loss;
 * -1 if a collective failed (ex->error). */
static int forward(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, double *loss)
{
    if (ex->poison) memset(ex->arena + ex->slots_at + ex->slot * ex->ms->slot_bytes, 0xff, (size_t)ex->ms->slot_bytes);
    poison_workspace(ex);
    size_t n = ex->numel[ex->tokens_in];
    if (part_here(ex, ex->tokens_in)) memcpy(vptr(ex, ex->tokens_in, 0), inputs, n * sizeof *inputs);
    if (part_here(ex, ex->targets_in)) memcpy(vptr(ex, ex->targets_in, 0), targets, n * sizeof *targets);
    ex->loss = 0;
    int rc = run_phase(ex, PLAN_FORWARD);
    *loss = ex->loss;
    return rc;
}

double mesh__exec_loss(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    double loss;
    return mesh__exec_forward(ex, inputs, targets, &loss) == 0 ? loss : NAN;
}

int mesh__exec_forward(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, double *loss)
{
    ex->slot = 0;
    double l = 0;
    *loss = 0;
    for (int c = ex->stage; c < ex->chunks; c += (int)ex->p->pp) { /* the stage's chunks, in order */
        set_chunk(ex, c);
        if (forward(ex, inputs, targets, &l) != 0) return -2;
        *loss += l;
    }
    set_chunk(ex, ex->stage);
    /* the last chunk has the loss: every stage gets it */
    return sum_doubles(ex, ex->axis[2], loss, 1) == 0 ? 0 : -2;
}

static void zero_param_grads(mesh__exec *ex)
{
    memset(ex->arena + ex->grads_at, 0, (size_t)ex->ms->grads);
}

double mesh__exec_grad(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    zero_param_grads(ex);
    double saved = ex->dloss;
    ex->dloss = 1.0;
    ex->slot = 0;
    double loss;
    if (forward(ex, inputs, targets, &loss) != 0 || run_phase(ex, PLAN_BACKWARD) != 0) loss = NAN;
    ex->dloss = saved;
    return loss;
}

double mesh__exec_lr(const plan *p, long long step)
{
    const fe_setup *s = &p->setup;
    if (s->warmup > 0 && step <= s->warmup) return s->lr * (double)step / (double)s->warmup;
    if (s->lr_schedule == 0 || s->steps <= s->warmup) return s->lr;
    double frac = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    if (frac > 1) frac = 1;
    double shape = s->lr_schedule == 1 ? 0.5 * (1 + cos(3.14159265358979323846 * frac)) : 1 - frac;
    return s->min_lr + (s->lr - s->min_lr) * shape;
}


/* The micro-batches in the schedule's order: a forward takes a free slot,
 * its backward frees it. Sums the losses into *loss; -1 if a collective
 * failed. */
static int run_units(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, double *loss)
{
    const plan_stage *g = &ex->p->stages[ex->stage];
    size_t bt = mesh__exec_batch_tokens(ex);
    for (int u = 0; u < g->n_units; u++) {
        const sched_unit *un = &g->units[u];
        int unit = un->micro * ex->chunks + un->chunk;
        if (un->op == SCHED_FWD || un->op == SCHED_BWD) set_chunk(ex, un->chunk);
        if (un->op == SCHED_FWD) {
            int s = 0;
            while (ex->slot_busy[s]) s++; /* the memory plan has a slot for every unit in flight */
            ex->slot_busy[s] = 1;
            ex->slot_of[unit] = ex->slot = s;
            double l;
            if (forward(ex, inputs + (size_t)un->micro * bt, targets + (size_t)un->micro * bt, &l) != 0) return -1;
            *loss += l;
        } else if (un->op == SCHED_BWD) {
            ex->slot = ex->slot_of[unit];
            if (run_phase(ex, PLAN_BACKWARD) != 0) return -1;
            ex->slot_busy[ex->slot] = 0;
        }
    }
    return 0;
}


/* Is param id used both before and after the layer stack (a tied
 * embedding), so that the first and the last stage each hold a copy? */
static int tied_across(const mesh__exec *ex, int id)
{
    const plan *p = ex->p;
    if (p->pp == 1 || ex->stack < 0 || p->tensors[id].op != G_PARAM) return 0;
    int before = 0, after = 0;
    for (int c = 0; c < p->n_tensors; c++)
        for (int k = 0; k < p->tensors[c].n_in; k++) {
            if (p->tensors[c].in[k] != id) continue;
            before |= c < p->regions[ex->stack].first;
            after |= c >= p->regions[ex->stack].end;
        }
    return before && after;
}

/* The part of copy it of param id this rank updates: elements [lo, lo +
 * len) (all of them without ZeRO), and its AdamW moments. */
static void shard_of(const mesh__exec *ex, int id, int it, size_t *lo, size_t *len, float **m, float **v)
{
    size_t n = ex->numel[id], sh = ex->shard[id];
    comm *z = zcomm(ex, id);
    size_t r = z ? (size_t)z->rank : 0;
    *lo = r * sh < n ? r * sh : n;
    *len = (*lo + sh < n ? *lo + sh : n) - *lo;
    float *m0 = (float *)(void *)(ex->arena + ex->optim_at);
    *m = m0 + ex->opt_at[id] + (size_t)param_copy(ex, id, it) * sh;
    *v = m0 + ex->opt_elems + ex->opt_at[id] + (size_t)param_copy(ex, id, it) * sh;
}

/* The sum over the group of x[0..n-1], in rank order, exactly (doubles
 * travel as bytes). */
static int sum_doubles(mesh__exec *ex, comm *c, double *x, int n)
{
    if (!c) return 0;
    float *all = malloc((size_t)c->size * (size_t)n * 2 * sizeof *all), *mine = malloc((size_t)n * 2 * sizeof *mine);
    if (!all || !mine) {
        free(all);
        free(mine);
        snprintf(ex->error, sizeof ex->error, "rank %d: out of memory", ex->rank);
        comm_abort(c, ex->error);
        return -1;
    }
    memcpy(mine, x, (size_t)n * sizeof *x);
    int rc = comm_all_gather(c, mine, all, (size_t)n * 2);
    if (rc == 0)
        for (int k = 0; k < n; k++) {
            double sum = 0, v;
            for (int q = 0; q < c->size; q++) {
                memcpy(&v, all + ((size_t)q * (size_t)n + (size_t)k) * 2, sizeof v);
                sum += v;
            }
            x[k] = sum;
        }
    else
        snprintf(ex->error, sizeof ex->error, "rank %d: an all-gather of sums: %s", ex->rank, c->error);
    free(all);
    free(mine);
    return rc;
}

/* The deterministic chain over the data-parallel ranks: before its
 * micro-batches (end = 0) rank d takes the gradients and the loss summed by
 * ranks 0 .. d - 1 (rank 0 starts from zeros); after them (end = 1) it
 * passes them on, and the last rank's sums, now the one-rank run's to the
 * bit, go to every rank. The ranks run one after another. */
static int chain_link(mesh__exec *ex, int end, double *loss)
{
    comm *c = ex->data;
    int d = c->rank, last = c->size - 1, rc = 0;
    void *g = ex->arena + ex->grads_at;
    size_t bytes = (size_t)ex->ms->grads;
    if (!end && d == 0) {
        zero_param_grads(ex);
        *loss = 0;
    } else if (!end) {
        rc = comm_recv(c, g, bytes, d - 1) | comm_recv(c, loss, sizeof *loss, d - 1);
    } else {
        if (d < last) rc = comm_send(c, g, bytes, d + 1) | comm_send(c, loss, sizeof *loss, d + 1);
        if (rc == 0) rc = comm_broadcast(c, g, bytes, last) | comm_broadcast(c, loss, sizeof *loss, last);
    }
    if (rc != 0) snprintf(ex->error, sizeof ex->error, "rank %d: the deterministic chain: %s", ex->rank, c->error);
    return rc ? -1 : 0;
}

int mesh__exec_train_step(mesh__exec *ex, long long step, const int32_t *inputs,
                          const int32_t *targets, mesh__step_stats *st)
{
    const fe_setup *s = &ex->p->setup;
    int m = (int)(s->micro_batches > 0 ? s->micro_batches : 1);
    double loss = 0;
    ex->counting = 1;
    ex->steps++;
    /* deterministic: data-parallel rank d starts from rank d - 1's sums */
    if (ex->chain ? chain_link(ex, 0, &loss) != 0 : (zero_param_grads(ex), 0)) return -2;
    /* the loss is the last stage's */
    if (run_units(ex, inputs, targets, &loss) != 0 || (ex->chain && chain_link(ex, 1, &loss) != 0) ||
        run_phase(ex, PLAN_GRAD_SYNC) != 0 || sum_doubles(ex, ex->axis[2], &loss, 1) != 0 ||
        (!ex->chain && sum_doubles(ex, ex->data, &loss, 1) != 0))
        return -2;
    loss /= (double)m * ex->data_ranks;
    double norm;
    if (!ex->zero && s->tp == 1 && s->ep == 1 && ex->p->pp == 1) {
        norm = s->clip > 0 ? kcpu_clip_global_norm(ex->gbufs, ex->gsizes, ex->n_gbufs, (float)s->clip)
                           : kcpu_global_norm((const float *const *)ex->gbufs, ex->gsizes, ex->n_gbufs);
    } else { /* the norm of the whole gradient: every rank's shards, a replicated param once */
        double ss[3] = {0, 0, 0}; /* params split over tp, the others, experts split over ep */
        for (int b = 0; b < ex->n_gbufs; b++) /* a tied param counts on the first stage only */
            if (ex->gsplit[b] != 2)
                ss[ex->gsplit[b] == 1 ? 0 : ex->gsplit[b] == 3 ? 2 : 1] +=
                    kcpu_sum_squares((const float *const *)&ex->gbufs[b], &ex->gsizes[b], 1);
        comm *zd = ex->zero ? ex->data : NULL, *ze = ex->zero ? ex->axis[0] : NULL;
        if (sum_doubles(ex, zd, ss, 2) != 0 || sum_doubles(ex, ze, ss + 2, 1) != 0 ||
            sum_doubles(ex, ex->axis[1], ss, 1) != 0 ||
            sum_doubles(ex, ex->axis[3], ss + 2, 1) != 0 || sum_doubles(ex, ex->axis[2], ss, 3) != 0)
            return -2;
        norm = (float)sqrt(ss[0] + ss[1] + ss[2]);
        double scale = s->clip / (norm + 1e-6);
        if (s->clip > 0 && scale < 1.0) kcpu_scale_buffers(ex->gbufs, ex->gsizes, ex->n_gbufs, scale);
    }
    double lr = mesh__exec_lr(ex->p, step);
    st->loss = loss;
    st->norm = norm;
    st->lr = lr;
    if (!isfinite(loss) || !isfinite(norm)) return -1;
    ex->adam_t++;
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        const plan_tensor *t = &ex->p->tensors[id];
        /* decay matrices and embeddings, not gains and biases (GPT-2, llm.c) */
        float wd = t->rank >= 2 ? (float)s->weight_decay : 0.0f;
        /* without ZeRO all copies at once (they follow one another), with it each copy's shard */
        int copies = ex->zero ? ex->copies[id] : 1;
        for (int c = 0; c < copies; c++) {
            int it = copy_it(ex, id, c);
            size_t lo, len;
            float *mo, *vo;
            shard_of(ex, id, it, &lo, &len, &mo, &vo);
            kcpu_adamw_step(vptr(ex, id, it) + lo, gptr(ex, id, it) + lo, mo, vo, ex->zero ? len :
                            (size_t)ex->copies[id] * ex->numel[id], (float)lr, (float)s->beta1, (float)s->beta2,
                            (float)s->eps, wd, (int)ex->adam_t);
        }
    }
    int rc = run_phase(ex, PLAN_AFTER_OPTIMIZER) == 0 ? 0 : -2;
    ex->counting = 0;
    return rc;
}

int mesh__exec_sent(const mesh__exec *ex, int k, char *what, size_t n, double *bytes, double *planned)
{
    const plan_traffic *t = ex->p->traffic ? &ex->p->traffic[ex->stage] : NULL;
    double steps = ex->steps > 0 ? (double)ex->steps : 1;
    for (int kind = STEP_ALL_REDUCE; kind <= STEP_SLICE; kind++)
        for (int a = 0; a < 4; a++) {
            int p2p = kind == STEP_SLICE;
            if (p2p && a > 0) break;
            double got = p2p ? ex->sent_p2p : ex->sent[kind][a];
            double want = !t ? -1 : p2p ? (double)t->send : (double)t->coll[kind][a];
            if (got == 0 && want <= 0) continue;
            if (k-- > 0) continue;
            if (p2p) snprintf(what, n, "send(pp)");
            else snprintf(what, n, "%s(%s)", shard_step_name((shard_step_kind)kind), plan__axis_name(a));
            *bytes = got / steps;
            *planned = want;
            return 0;
        }
    return -1;
}

const char *mesh__exec_error(const mesh__exec *ex) { return ex->error; }

int mesh__exec_data_mean(mesh__exec *ex, double *x)
{
    if (sum_doubles(ex, ex->data, x, 1) != 0) return -2;
    *x /= (double)ex->data_ranks;
    return 0;
}

void mesh__exec_data_rank(const mesh__exec *ex, int *data_rank, int *data_ranks)
{
    *data_rank = ex->coord[0] * (int)ex->p->setup.ep + ex->coord[3];
    *data_ranks = ex->data_ranks;
}

/* ---- setup ------------------------------------------------------------- */

/* The global name of a param at iteration it: "h.{0..1}.x" -> "h.1.x". */
static char *iter_name(mesh__exec *ex, const char *name, int it)
{
    const char *open = strstr(name, "{0..");
    const char *close = open ? strchr(open, '}') : NULL;
    size_t len = strlen(name) + 24;
    char *out = host_calloc(ex, len, 1);
    if (!out) return NULL;
    if (!close) snprintf(out, len, "%s", name);
    else snprintf(out, len, "%.*s%d%s", (int)(open - name), name, it, close + 1);
    return out;
}

/* Why the executor cannot run this plan yet, or NULL. */
static const char *refusal(const plan *p, char *buf, size_t n)
{
    const fe_setup *s = &p->setup;
    if (s->tp > 1 && s->sequence_parallel) return "sequence parallelism is not run yet (tp > 1 without it is)";
    for (int id = 0; s->tp > 1 && id < p->n_tensors; id++)
        if (p->tensors[id].op == G_MOE) return "mixture-of-experts layers are not run yet with tp > 1";
    if (s->world > 1 && s->zero >= 2) return "zero 2 and 3 are not run yet with dp > 1: zero 0 and 1 are";
    for (int k = 0; k < p->n_steps; k++) {
        const plan_step *st = &p->steps[k];
        int sync = st->kind == STEP_REDUCE_SCATTER && st->phase == PLAN_GRAD_SYNC;
        int moe = st->kind == STEP_ALL_TO_ALL && p->tensors[st->node].op == G_MOE;
        int gather = st->kind == STEP_ALL_GATHER && st->phase == PLAN_AFTER_OPTIMIZER;
        if (st->kind != STEP_COMPUTE && st->kind != STEP_ALL_REDUCE && !sync && !gather && !moe) {
            snprintf(buf, n, "the plan's %s steps over %s are not run yet", plan_phase_name(st->phase),
                     plan__axis_name(st->axis));
            return buf;
        }
    }
    if (p->loss < 0) return "the plan has no loss";
    for (int id = 0; id < p->n_tensors; id++) {
        const plan_tensor *t = &p->tensors[id];
        int ok = 1;
        switch (t->op) {
        case G_SUB: case G_MUL: case G_SCALE: ok = 0; break;
        case G_MOE: ok = !t->act_gelu; break; /* SwiGLU experts */
        case G_ATTENTION: ok = t->n_in == 1 || t->n_in == 3; break; /* packed qkv, or q, k, v */
        case G_TRANSPOSE:
            for (int c = id + 1; c < p->n_tensors; c++)
                for (int k = 0; k < p->tensors[c].n_in; k++)
                    if (p->tensors[c].in[k] == id && !(p->tensors[c].op == G_MATMUL && k == 1)) ok = 0;
            ok = ok && p->tensors[t->in[0]].op == G_PARAM;
            break;
        default: break;
        }
        if (!ok) {
            snprintf(buf, n, "op '%s' (tensor %d) is not run by the CPU executor yet",
                     graph_op_name(t->op), id);
            return buf;
        }
    }
    return NULL;
}

/* A moe node's geometry; -1 if the kernels' routing layout differs from
 * the memory plan's. */
static int moe_setup(mesh__exec *ex, int id)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *wg = &ex->p->tensors[t->in[2]];
    ex_moe *g = host_calloc(ex, 1, sizeof *g);
    if (!g) return -1;
    ex->moe[id] = g;
    g->D = (int)last_dim(t);
    g->N = (int)(ex->numel[id] / (size_t)g->D);
    g->E = (int)wg->dims[0];
    g->F = (int)wg->dims[2];
    g->K = (int)t->top_k;
    g->P = wg->pl.kind[3] == PL_SPLIT ? (int)ex->p->setup.ep : 1;
    g->El = g->E / g->P;
    if (g->E > 256 || g->P > 64) return -2; /* the count exchange's buffers */
    g->C = kcpu_moe_capacity(g->N, g->E, g->K, t->capacity);
    g->route_bytes = kcpu_moe_route_bytes(g->N, g->E, g->K, g->C);
    return g->C == memplan_moe_capacity(g->N, g->E, g->K, t->capacity) &&
                   (int64_t)g->route_bytes == memplan_moe_route_bytes(g->N, g->E, g->K, g->C)
               ? 0
               : -2;
}

/* The node whose backward starts each tensor's gradient: its last
 * consumer in its segment; itself when none (the loss); -1 for tensors
 * without a gradient in the shared workspace. */
static void find_zero_by(mesh__exec *ex)
{
    const plan *p = ex->p;
    for (int id = 0; id < ex->n; id++) ex->zero_by[id] = id;
    for (int c = 0; c < ex->n; c++)
        for (int k = 0; k < p->tensors[c].n_in; k++) {
            int in = p->tensors[c].in[k];
            if (buf_of(ex, c)->part == buf_of(ex, in)->part) ex->zero_by[in] = c;
        }
    for (int id = 0; id < ex->n; id++)
        if (buf_of(ex, id)->grad_region != MEM_WORKSPACE) ex->zero_by[id] = -1;
}

/* What this rank's optimizer updates: without ZeRO every param whole;
 * with it (over the param's data-parallel group) each copy's shard of
 * ceil(n / ranks) elements, as the memory plan lays out the moments. */
static int optimizer_shards(mesh__exec *ex)
{
    int copies = 0;
    size_t at = 0;
    ex->zero = ex->p->setup.zero >= 1 && ex->data_ranks > 1;
    ex->shard = host_calloc(ex, (size_t)ex->n, sizeof *ex->shard);
    ex->opt_at = host_calloc(ex, (size_t)ex->n, sizeof *ex->opt_at);
    if (!ex->shard || !ex->opt_at) return -1;
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        comm *z = zcomm(ex, id);
        size_t P = z ? (size_t)z->size : 1;
        ex->shard[id] = (ex->numel[id] + P - 1) / P;
        ex->opt_at[id] = at;
        at += ex->shard[id] * (size_t)ex->copies[id];
        copies += ex->copies[id];
    }
    ex->opt_elems = at;
    if (at * 2 * sizeof(float) != (size_t)ex->ms->optim) return -2; /* not the memory plan's layout */
    ex->n_gbufs = ex->zero ? copies : ex->n_params;
    ex->gbufs = host_calloc(ex, (size_t)ex->n_gbufs + 1, sizeof *ex->gbufs);
    ex->gsizes = host_calloc(ex, (size_t)ex->n_gbufs + 1, sizeof *ex->gsizes);
    ex->gsplit = host_calloc(ex, (size_t)ex->n_gbufs + 1, 1);
    if (!ex->gbufs || !ex->gsizes || !ex->gsplit) return -1;
    for (int k = 0, b = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        for (int c = 0; c < (ex->zero ? ex->copies[id] : 1); c++, b++) {
            int it = copy_it(ex, id, c);
            size_t lo, len;
            float *m, *v;
            shard_of(ex, id, it, &lo, &len, &m, &v);
            ex->gbufs[b] = gptr(ex, id, it) + lo;
            /* 1: split over tp; 2: the last stage's copy of a tied param (counted on
             * the first); 3: split over ep (an expert's weights) */
            ex->gsplit[b] = (char)(tied_across(ex, id) && ex->stage > 0 ? 2
                                   : split_tp(ex, id)                ? 1
                                   : split_ep(ex, id)                ? 3
                                                                     : 0);
            ex->gsizes[b] = ex->zero ? len : (size_t)ex->copies[id] * ex->numel[id];
        }
    }
    return 0;
}

/* Lays the arena out by the memory plan and checks that it is the plan's. */
static int layout(mesh__exec *ex, unsigned flags, char *err, size_t errn)
{
    const plan *p = ex->p;
    int no_reuse = (flags & MESH__EXEC_NO_REUSE) != 0;
    if (memplan_build(&ex->mp, p, 4, no_reuse ? MEMPLAN_NO_REUSE : 0) != 0) return -1;
    if (ex->mp.unsupported) {
        set_err(err, errn, "the plan has %s: not run yet", ex->mp.unsupported);
        return -2;
    }
    const mem_stage *ms = ex->ms = &ex->mp.stage[ex->stage];
    const mem_stage *pm = p->memory ? &p->memory[ex->stage] : NULL;
    if (p->setup.precision == 0 && pm && !no_reuse &&
        (pm->total != ms->total || pm->params != ms->params || pm->grads != ms->grads || pm->optim != ms->optim ||
         pm->slot_bytes != ms->slot_bytes || pm->slots != ms->slots || pm->workspace != ms->workspace)) {
        set_err(err, errn, "the plan's memory plan (%lld bytes) is not the layout this runtime computes from it "
                           "(%lld bytes): compile it again with this version's meshc",
                (long long)pm->total, (long long)ms->total);
        return -2;
    }
    ex->grads_at = ms->params;
    ex->optim_at = ex->grads_at + ms->grads;
    ex->slots_at = ex->optim_at + ms->optim;
    ex->pinned_at = ex->slots_at + ms->slot_bytes * ms->slots;
    ex->shared_at = ex->pinned_at + ms->pinned;
    ex->recompute_at = ex->shared_at + ms->shared;
    /* a slot: the part before the stack (a later stage: what it receives), its layers, the part after */
    set_chunk(ex, ex->stage); /* the stage's first chunk */
    if ((uint64_t)ms->total > SIZE_MAX - EX_HEADER) return -1;
    ex->arena = ex_calloc(ex, (size_t)ms->total, 1);
    return ex->arena ? 0 : -1;
}

int mesh__exec_supported(const plan *p, char *err, size_t errn)
{
    char why[160];
    const char *no = refusal(p, why, sizeof why);
    if (no) set_err(err, errn, "%s", no);
    return no ? -1 : 0;
}

mesh__exec *mesh__exec_create(const plan *p, mesh_alloc_fn alloc, void *ud, char *err, size_t errn)
{
    return mesh__exec_create_rank(p, 0, NULL, alloc, ud, 0, err, errn);
}

mesh__exec *mesh__exec_create_flags(const plan *p, mesh_alloc_fn alloc, void *ud, unsigned flags, char *err,
                                    size_t errn)
{
    return mesh__exec_create_rank(p, 0, NULL, alloc, ud, flags, err, errn);
}

/* This rank's coordinates (tp fastest, then ep, dp, pp: docs/language.md)
 * and its group on each axis of size > 1, split from the world. */
static int join_axes(mesh__exec *ex, comm *world, char *err, size_t errn)
{
    const fe_setup *s = &ex->p->setup;
    long long size[4] = {s->dp, s->tp, s->pp, s->ep}, stride[4];
    stride[1] = 1;
    stride[3] = s->tp;
    stride[0] = s->tp * s->ep;
    stride[2] = s->tp * s->ep * s->dp;
    for (int a = 0; a < 4; a++) ex->coord[a] = (int)(ex->rank / stride[a] % size[a]);
    ex->world = world;
    for (int a = 0; a < 4; a++) {
        if (size[a] == 1) continue;
        int color = (int)(ex->rank - ex->coord[a] * stride[a]);
        if (comm_split(world, color, ex->coord[a], &ex->axis[a]) != 0) {
            set_err(err, errn, "rank %d: making the %s groups: %s", ex->rank, plan__axis_name(a), world->error);
            return -1;
        }
    }
    ex->data = ex->axis[0];
    if (s->ep > 1) { /* dp x ep: the ranks that share pp and tp */
        int color = (int)(ex->rank - ex->coord[0] * stride[0] - ex->coord[3] * stride[3]);
        if (comm_split(world, color, (int)(ex->coord[0] * s->ep + ex->coord[3]), &ex->data) != 0) {
            set_err(err, errn, "rank %d: making the dp x ep groups: %s", ex->rank, world->error);
            return -1;
        }
    }
    return 0;
}

mesh__exec *mesh__exec_create_rank(const plan *p, int rank, comm *world, mesh_alloc_fn alloc, void *ud,
                                   unsigned flags, char *err, size_t errn)
{
    char why[160];
    const char *no = refusal(p, why, sizeof why);
    if (!no && p->setup.world > 1 && (!world || world->size != p->setup.world))
        no = "a plan of more than one rank runs on a communicator of its world's size";
    if (!no && (rank < 0 || rank >= p->setup.world)) no = "the rank is not in the plan's world";
    if (no) {
        set_err(err, errn, "%s", no);
        return NULL;
    }
    mesh__exec *ex = calloc(1, sizeof *ex);
    int n = p->n_tensors;
    if (!ex) goto oom;
    ex->p = p;
    ex->n = n;
    ex->rank = rank;
    ex->alloc = alloc ? alloc : mesh_alloc_default;
    ex->ud = ud;
    ex->data_ranks = (int)(p->setup.dp * p->setup.ep);
    if (p->setup.world > 1 && join_axes(ex, world, err, errn) != 0) goto fail;
    /* this rank's pipeline stage: its chunk's layers of the stack */
    ex->stack = -1;
    for (int r = 0; r < p->n_regions; r++)
        if (p->regions[r].is_stack && ex->stack < 0) ex->stack = r;
    ex->stage = ex->coord[2];
    ex->last_stage = p->pp - 1;
    ex->chunks = (int)(p->pp * p->v);
    if (p->pp > 1 && comm_split(ex->axis[2], ex->stage == 0 || ex->stage == ex->last_stage ? 0 : -1, ex->stage,
                                &ex->tied) != 0) {
        set_err(err, errn, "rank %d: making the tied-param groups: %s", rank, ex->axis[2]->error);
        goto fail;
    }
    int lay = layout(ex, flags, err, errn);
    if (lay == -2) goto fail;
    if (lay != 0) goto oom;
    int slots = ex->ms->slots > 0 ? ex->ms->slots : 1;
    ex->numel = host_calloc(ex, (size_t)n, sizeof *ex->numel);
    ex->copies = host_calloc(ex, (size_t)n, sizeof *ex->copies);
    ex->ld = host_calloc(ex, (size_t)n, sizeof *ex->ld);
    ex->iters = host_calloc(ex, (size_t)n, sizeof *ex->iters);
    ex->zero_by = host_calloc(ex, (size_t)n, sizeof *ex->zero_by);
    ex->params = host_calloc(ex, (size_t)n, sizeof *ex->params);
    ex->names = host_calloc(ex, (size_t)n, sizeof *ex->names);
    ex->moe = host_calloc(ex, (size_t)n, sizeof *ex->moe);
    ex->slot_of = host_calloc(ex, (size_t)(p->m > 0 ? p->m : 1) * (size_t)(p->pp * p->v), sizeof *ex->slot_of);
    ex->slot_busy = host_calloc(ex, (size_t)slots, 1);
    if (!ex->numel || !ex->copies || !ex->ld || !ex->iters || !ex->zero_by || !ex->params || !ex->names || !ex->moe || !ex->slot_of ||
        !ex->slot_busy)
        goto oom;
    find_zero_by(ex);
    ex->tokens_in = ex->targets_in = -1;
    /* the gradient of the mean loss over every micro-batch of every rank */
    ex->dloss = 1.0 / ((double)(p->setup.micro_batches > 0 ? p->setup.micro_batches : 1) * ex->data_ranks);
    for (int id = 0; id < n; id++) {
        const plan_tensor *t = &p->tensors[id];
        size_t ne = 1;
        for (int d = 0; d < t->rank; d++) {
            int64_t split = t->pl.kind[1] == PL_SPLIT && t->pl.dim[1] == d ? p->setup.tp : 1;
            if (t->op == G_PARAM && t->pl.kind[3] == PL_SPLIT && t->pl.dim[3] == d) split *= p->setup.ep;
            ex->ld[id][d] = t->dims[d] / split;
            ne *= (size_t)ex->ld[id][d];
        }
        if (t->op != G_TRANSPOSE && ne * 4 != (size_t)buf_of(ex, id)->bytes) {
            set_err(err, errn, "tensor %d: %zu elements on this rank, not the memory plan's", id, ne);
            goto fail;
        }
        int iters = t->region >= 0 ? (int)p->regions[t->region].count : 1;
        ex->numel[id] = ne;
        ex->iters[id] = iters;
        if (t->op == G_MOE) {
            int rc = moe_setup(ex, id);
            if (rc == -2) {
                set_err(err, errn, "moe tensor %d: the kernels' routing layout is not the memory plan's", id);
                goto fail;
            }
            if (rc != 0) goto oom;
        }
        if (t->op == G_INPUT) {
            if (ex->tokens_in < 0) ex->tokens_in = id;
            else ex->targets_in = id;
        }
        if (t->op != G_PARAM || buf_of(ex, id)->region != MEM_PERSISTENT) continue; /* held on another stage */
        ex->params[ex->n_params++] = id;
        ex->copies[id] = iters;
        if (in_stack(ex, id)) { /* the layers of the stage's chunks */
            ex->copies[id] = 0;
            for (int c = ex->stage; c < ex->chunks; c += (int)p->pp) ex->copies[id] += (int)p->chunk_layers[c];
        }
        ex->names[id] = host_calloc(ex, (size_t)ex->copies[id] + 1, sizeof *ex->names[id]);
        if (!ex->names[id]) goto oom;
        for (int c = 0; c < ex->copies[id]; c++) {
            int it = copy_it(ex, id, c);
            char *name = iter_name(ex, t->name ? t->name : "?", it);
            if (!name) goto oom;
            ex->names[id][c] = name;
            float *w = vptr(ex, id, it);
            init_ctx ic = {w, mesh__init_key((uint64_t)p->setup.seed, name), (float)t->init_std};
            if (t->init == GRAPH_INIT_NORMAL) /* each element from its index in the whole param */
                param_runs(ex, id, ex->coord[split_ep(ex, id) ? 3 : 1], init_run, &ic);
            else
                mesh__init_fill(w, ne, t->init == GRAPH_INIT_ONES ? 1.0f : 0.0f);
        }
    }
    /* deterministic: only where the gradients are whole (no ZeRO) and the
     * ranks differ only in their data */
    ex->chain = (flags & MESH__EXEC_DETERMINISTIC) && ex->data && p->setup.zero == 0;
    int shards = optimizer_shards(ex);
    if (shards == -2) {
        set_err(err, errn, "rank %d: the optimizer's shards are not the memory plan's", rank);
        goto fail;
    }
    if (shards != 0) goto oom;
    if (ex->tokens_in < 0 || ex->targets_in < 0) {
        set_err(err, errn, "the model needs two inputs (tokens and targets)");
        goto fail;
    }
    return ex;
oom:
    set_err(err, errn, "rank %d: out of memory", rank);
fail:
    if (world && p->setup.world > 1) comm_abort(world, err); /* the others stop rather than wait */
    mesh__exec_free(ex);
    return NULL;
}

/* Parameter k (each iteration's copy counted separately): its tensor id
 * and iteration; -1 past the last. */
static int param_at(const mesh__exec *ex, int k, int *it)
{
    for (int q = 0; k >= 0 && q < ex->n_params; q++) {
        int id = ex->params[q];
        if (k < ex->copies[id]) {
            *it = copy_it(ex, id, k);
            return id;
        }
        k -= ex->copies[id];
    }
    return -1;
}

int mesh__exec_param(mesh__exec *ex, int k, const char **name, size_t *n, float **value, float **grad)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    *name = ex->names[id][param_copy(ex, id, it)];
    *n = ex->numel[id];
    *value = vptr(ex, id, it);
    *grad = gptr(ex, id, it);
    return 0;
}

/* AdamW's m and v: arrays laid out like the params, one after the other. */
/* Copying runs between a rank's slice and the whole param. */
typedef struct copy_ctx {
    float *to;
    const float *from;
    int to_whole;
} copy_ctx;

static void copy_run(void *ctx, size_t local, size_t whole, size_t len)
{
    copy_ctx *c = ctx;
    if (c->to_whole) memcpy(c->to + whole, c->from + local, len * sizeof *c->to);
    else memcpy(c->to + local, c->from + whole, len * sizeof *c->to);
}

/* whole <- every tp rank's slice of param id (local: this rank's);
 * collective over the tp group when the param is split. */
static int tp_gather(mesh__exec *ex, int id, const float *local, float *whole)
{
    size_t nl = ex->numel[id];
    if (!split_tp(ex, id) && !split_ep(ex, id)) {
        memcpy(whole, local, nl * sizeof *whole);
        return 0;
    }
    comm *c = ex->axis[split_ep(ex, id) ? 3 : 1];
    float *all = malloc((size_t)c->size * nl * sizeof *all);
    int rc = all ? comm_all_gather(c, local, all, nl) : -1;
    for (int q = 0; rc == 0 && q < c->size; q++) {
        copy_ctx cc = {whole, all + (size_t)q * nl, 1};
        param_runs(ex, id, q, copy_run, &cc);
    }
    if (rc != 0)
        snprintf(ex->error, sizeof ex->error, "rank %d: gathering a param over tp: %s", ex->rank,
                 all ? c->error : "out of memory");
    free(all);
    return rc;
}

/* local <- this rank's slice of the whole param id. */
static void tp_pick(const mesh__exec *ex, int id, const float *whole, float *local)
{
    copy_ctx cc = {local, whole, 0};
    param_runs(ex, id, ex->coord[split_ep(ex, id) ? 3 : 1], copy_run, &cc);
}

size_t mesh__exec_param_numel(const mesh__exec *ex, int k)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return 0;
    size_t n = 1;
    for (int d = 0; d < ex->p->tensors[id].rank; d++) n *= (size_t)ex->p->tensors[id].dims[d];
    return n;
}

int mesh__exec_param_get(mesh__exec *ex, int k, float *whole)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    return tp_gather(ex, id, vptr(ex, id, it), whole) == 0 ? 0 : -2;
}

int mesh__exec_param_set(mesh__exec *ex, int k, const float *whole)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    tp_pick(ex, id, whole, vptr(ex, id, it));
    return 0;
}

int mesh__exec_moments_get(mesh__exec *ex, int k, float *m, float *v)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    size_t n = ex->numel[id], lo, len;
    float *mo, *vo, *lm = malloc(2 * n * sizeof *lm), *lv = lm + n;
    if (!lm) {
        snprintf(ex->error, sizeof ex->error, "rank %d: out of memory", ex->rank);
        return -2;
    }
    shard_of(ex, id, it, &lo, &len, &mo, &vo);
    int rc = 0;
    comm *z = zcomm(ex, id);
    if (!z) {
        memcpy(lm, mo, n * sizeof *lm);
        memcpy(lv, vo, n * sizeof *lv);
    } else { /* every dp rank's shard over zeros, summed: the rank's slice, exactly */
        memset(lm, 0, 2 * n * sizeof *lm);
        memcpy(lm + lo, mo, len * sizeof *lm);
        memcpy(lv + lo, vo, len * sizeof *lv);
        rc = comm_all_reduce(z, lm, 2 * n);
        if (rc != 0)
            snprintf(ex->error, sizeof ex->error, "rank %d: gathering the optimizer state: %s", ex->rank, z->error);
    }
    if (rc == 0) rc = tp_gather(ex, id, lm, m);
    if (rc == 0) rc = tp_gather(ex, id, lv, v);
    free(lm);
    return rc == 0 ? 0 : -2;
}

int mesh__exec_moments_set(mesh__exec *ex, int k, const float *m, const float *v)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    size_t n = ex->numel[id], lo, len;
    float *mo, *vo, *lm = malloc(2 * n * sizeof *lm);
    if (!lm) return -2;
    shard_of(ex, id, it, &lo, &len, &mo, &vo);
    tp_pick(ex, id, m, lm);
    tp_pick(ex, id, v, lm + n);
    memcpy(mo, lm + lo, len * sizeof *lm);
    memcpy(vo, lm + n + lo, len * sizeof *lm);
    free(lm);
    return 0;
}

int mesh__exec_rank(const mesh__exec *ex) { return ex->rank; }

int mesh__exec_stage(const mesh__exec *ex) { return ex->stage; }

comm *mesh__exec_pipeline(const mesh__exec *ex, int *stage, int *lead)
{
    *stage = ex->stage;
    *lead = ex->coord[0] == 0 && ex->coord[1] == 0 && ex->coord[3] == 0;
    return ex->axis[2];
}

int mesh__exec_param_dup(const mesh__exec *ex, int k)
{
    int it, id = param_at(ex, k, &it);
    return id >= 0 && ex->stage > 0 && tied_across(ex, id);
}

int mesh__exec_param_dims(const mesh__exec *ex, int k, const int64_t **dims, int *rank)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    *dims = ex->p->tensors[id].dims;
    *rank = ex->p->tensors[id].rank;
    return 0;
}

long long *mesh__exec_adam_steps(mesh__exec *ex) { return &ex->adam_t; }

size_t mesh__exec_bytes(const mesh__exec *ex) { return (size_t)ex->ms->total; }

size_t mesh__exec_host_bytes(const mesh__exec *ex) { return ex->host_bytes; }

const float *mesh__exec_logits(const mesh__exec *ex, int *vocab_padded)
{
    int id = ex->p->tensors[ex->p->loss].in[0];
    *vocab_padded = (int)last_dim(&ex->p->tensors[id]);
    return val_in(ex, id, -1, 0);
}

void mesh__exec_free(mesh__exec *ex)
{
    if (!ex) return;
    for (int id = 0; id < ex->n; id++) {
        for (int c = 0; ex->names && ex->names[id] && c < ex->copies[id]; c++) ex_free(ex, ex->names[id][c]);
        if (ex->names) ex_free(ex, ex->names[id]);
        if (ex->moe) ex_free(ex, ex->moe[id]);
    }
    if (ex->data != ex->axis[0]) comm_free(ex->data);
    for (int a = 0; ex && a < 4; a++) comm_free(ex->axis[a]);
    ex_free(ex, ex->arena);
    ex_free(ex, ex->moe);
    ex_free(ex, ex->numel);
    ex_free(ex, ex->copies);
    comm_free(ex->tied);
    ex_free(ex, ex->ld);
    ex_free(ex, ex->iters);
    ex_free(ex, ex->zero_by);
    ex_free(ex, ex->params);
    ex_free(ex, ex->names);
    ex_free(ex, ex->gbufs);
    ex_free(ex, ex->gsizes);
    ex_free(ex, ex->gsplit);
    ex_free(ex, ex->shard);
    ex_free(ex, ex->opt_at);
    ex_free(ex, ex->slot_of);
    ex_free(ex, ex->slot_busy);
    memplan_free(&ex->mp);
    free(ex);
}
