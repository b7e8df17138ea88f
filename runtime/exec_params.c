/* exec_params.c — params and their optimizer state (exec.h): a param's
 * elements in the whole param (tp, ep splits; packed q/k/v blocks), ZeRO
 * shards, and whole params and moments for checkpoints. */
#include "exec_impl.h"

#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, malloc, free */
#include <string.h> /* memcpy, memset */

#include "init.h" /* mesh__init_* */

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
                    int64_t H = u->heads, KV = u->kv_heads ? u->kv_heads : u->heads, dh = exec__last_dim(u) / H;
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

void exec__param_runs(const mesh__exec *ex, int id, int rt, int re, run_fn fn, void *ctx)
{
    const plan_tensor *t = &ex->p->tensors[id];
    /* an expert's weights split over ep: the block of experts re (dim 0) */
    size_t whole = 1;
    for (int k = 0; k < t->rank; k++) whole *= (size_t)t->dims[k];
    size_t base = exec__split_ep(ex, id) ? (size_t)re * (whole / (size_t)ex->p->setup.ep) : 0;
    if (!exec__split_tp(ex, id)) {
        fn(ctx, 0, base, ex->numel[id]);
        return;
    }
    int d = t->pl.dim[1], tp = (int)ex->p->setup.tp;
    int64_t seg[3];
    int nseg = split_blocks(ex, id, seg);
    size_t outer = 1, inner = 1; /* the rank's rows before dim d (dim 0 after the ep split), whole after it */
    for (int k = 0; k < d; k++) outer *= (size_t)ex->ld[id][k];
    for (int k = d + 1; k < t->rank; k++) inner *= (size_t)t->dims[k];
    for (size_t o = 0; o < outer; o++) {
        size_t lacc = 0, gacc = 0;
        for (int j = 0; j < nseg; j++) {
            size_t L = (size_t)seg[j] / (size_t)tp;
            fn(ctx, (o * (size_t)ex->ld[id][d] + lacc) * inner,
               base + (o * (size_t)t->dims[d] + gacc + (size_t)rt * L) * inner, L * inner);
            lacc += L;
            gacc += (size_t)seg[j];
        }
    }
}

void exec__init_run(void *ctx, size_t local, size_t whole, size_t len)
{
    init_ctx *c = ctx;
    mesh__init_normal(c->w + local, len, whole, c->key, c->std);
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
void exec__shard_of(const mesh__exec *ex, int id, int it, size_t *lo, size_t *len, float **m, float **v)
{
    size_t n = ex->numel[id], sh = ex->shard[id];
    comm *z = exec__zcomm(ex, id);
    size_t r = z ? (size_t)z->rank : 0;
    *lo = r * sh < n ? r * sh : n;
    *len = (*lo + sh < n ? *lo + sh : n) - *lo;
    float *m0 = (float *)(void *)(ex->arena + ex->optim_at);
    *m = m0 + ex->opt_at[id] + (size_t)exec__param_copy(ex, id, it) * sh;
    *v = m0 + ex->opt_elems + ex->opt_at[id] + (size_t)exec__param_copy(ex, id, it) * sh;
}

/* zero 3: copy it of param id's shard <- its elements in whole (the
 * rank's slice, in host memory). */
static int keep_shard(mesh__exec *ex, int id, int it, const float *whole)
{
    size_t lo, len;
    float *m, *v;
    exec__shard_of(ex, id, it, &lo, &len, &m, &v);
    return exec__floats_to_dev(ex, exec__pshard(ex, id, it), whole + lo, len);
}

/* Copy it of param id (the rank's slice) <- local[numel] in host memory:
 * with zero 3 its shard, else the whole slice. */
static int put_param(mesh__exec *ex, int id, int it, const float *local)
{
    if (ex->p->setup.zero == 3) return keep_shard(ex, id, it, local);
    return exec__floats_to_dev(ex, exec__vptr(ex, id, it), local, ex->numel[id]);
}

/* zero 3: whole <- copy it of param id (the rank's slice), its shards
 * gathered over the param's data-parallel group (a sum over zeros, exact,
 * when the shards are uneven). Collective over that group. */
static int whole_of_shards(mesh__exec *ex, int id, int it, float *whole)
{
    size_t n = ex->numel[id], lo, len;
    float *m, *v;
    exec__shard_of(ex, id, it, &lo, &len, &m, &v);
    comm *z = exec__host_comm(ex, exec__zcomm(ex, id)); /* host buffers */
    memset(whole, 0, n * sizeof *whole);
    if (exec__floats_to_host(ex, whole + lo, exec__pshard(ex, id, it), len) != 0) return -1;
    if (!z || comm_all_reduce(z, whole, n) == 0) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d: gathering a param's shards: %s", ex->rank, z->error);
    return -1;
}

/* What this rank's optimizer updates: without ZeRO every param whole;
 * with it (over the param's data-parallel group) each copy's shard of
 * ceil(n / ranks) elements, as the memory plan lays out the moments. */
int exec__optimizer_shards(mesh__exec *ex)
{
    int copies = 0;
    size_t at = 0;
    ex->zero = ex->p->setup.zero >= 1 && ex->data_ranks > 1;
    ex->shard = exec__host_calloc(ex, (size_t)ex->n, sizeof *ex->shard);
    ex->opt_at = exec__host_calloc(ex, (size_t)ex->n, sizeof *ex->opt_at);
    if (!ex->shard || !ex->opt_at) return -1;
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        comm *z = exec__zcomm(ex, id);
        size_t P = z ? (size_t)z->size : 1;
        ex->shard[id] = (ex->numel[id] + P - 1) / P;
        ex->opt_at[id] = at;
        at += ex->shard[id] * (size_t)ex->copies[id];
        copies += ex->copies[id];
    }
    ex->opt_elems = at;
    /* m and v, and with mixed precision the fp32 masters */
    if (memplan_round(&ex->mp, (int64_t)(at * (ex->prec == KCPU_FP32 ? 2 : 3) * sizeof(float))) != ex->ms->optim)
        return -2;
    ex->n_gbufs = ex->zero ? copies : ex->n_params;
    ex->gbufs = exec__host_calloc(ex, (size_t)ex->n_gbufs + 1, sizeof *ex->gbufs);
    ex->gsizes = exec__host_calloc(ex, (size_t)ex->n_gbufs + 1, sizeof *ex->gsizes);
    ex->gsplit = exec__host_calloc(ex, (size_t)ex->n_gbufs + 1, 1);
    ex->gss = exec__host_calloc(ex, (size_t)ex->n_gbufs + 1, sizeof *ex->gss);
    ex->adam = exec__host_calloc(ex, (size_t)ex->n_gbufs + 1, sizeof *ex->adam);
    if (!ex->gbufs || !ex->gsizes || !ex->gsplit || !ex->gss || !ex->adam) return -1;
    for (int k = 0, b = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        for (int c = 0; c < (ex->zero ? ex->copies[id] : 1); c++, b++) {
            int it = exec__copy_it(ex, id, c);
            size_t lo, len;
            float *m, *v;
            exec__shard_of(ex, id, it, &lo, &len, &m, &v);
            ex->gbufs[b] = exec__gshard(ex, id, it);
            /* which sum of squares it adds to (exec_step.c's norm): a dense
             * param 0, split over tp 1; an expert's split over tp 2, not 3;
             * the last stage's copy of a tied param none (4: counted on the first) */
            int ep = exec__split_ep(ex, id), tp = exec__split_tp(ex, id);
            ex->gsplit[b] = (char)(tied_across(ex, id) && ex->stage > 0 ? 4 : ep ? 3 - tp : tp);
            ex->gsizes[b] = ex->zero ? len : (size_t)ex->copies[id] * ex->numel[id];
        }
    }
    return 0;
}

int exec__init_params(mesh__exec *ex)
{
    const plan *p = ex->p;
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        const plan_tensor *t = &p->tensors[id];
        /* the rank's whole slice made in host memory, then put in place
         * (with zero 3 its shard kept) */
        float *w = malloc(ex->numel[id] * sizeof *w);
        if (!w) return -1;
        for (int c = 0; c < ex->copies[id]; c++) {
            int it = exec__copy_it(ex, id, c);
            init_ctx ic = {w, mesh__init_key((uint64_t)p->setup.seed, ex->names[id][c]), (float)t->init_std};
            if (t->init == GRAPH_INIT_NORMAL) /* each element from its index in the whole param */
                exec__param_runs(ex, id, ex->coord[1], ex->coord[3], exec__init_run, &ic);
            else
                mesh__init_fill(w, ex->numel[id], t->init == GRAPH_INIT_ONES ? 1.0f : 0.0f);
            float *master = exec__master(ex, id, it);
            if (master) { /* mixed precision: the master keeps the fp32 values, the weights their rounding */
                size_t lo, len;
                float *m, *v;
                exec__shard_of(ex, id, it, &lo, &len, &m, &v);
                exec__to_dev(ex, master, w + lo, len * sizeof *w);
                exec__round(ex, w, ex->numel[id]);
            }
            put_param(ex, id, it, w);
        }
        free(w);
    }
    return ex->dev_failed ? -2 : 0;
}

/* Parameter k (each iteration's copy counted separately): its tensor id
 * and iteration; -1 past the last. */
static int param_at(const mesh__exec *ex, int k, int *it)
{
    for (int q = 0; k >= 0 && q < ex->n_params; q++) {
        int id = ex->params[q];
        if (k < ex->copies[id]) {
            *it = exec__copy_it(ex, id, k);
            return id;
        }
        k -= ex->copies[id];
    }
    return -1;
}

int mesh__exec_param(mesh__exec *ex, int k, const char **name, size_t *n, float **value, float **grad)
{
    if (exec__gather_wait(ex, -1) != 0) return -1; /* ZeRO-1/2: the last step's gathers */
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    *name = ex->names[id][exec__param_copy(ex, id, it)];
    *n = ex->numel[id];
    *value = exec__vptr(ex, id, it);
    *grad = exec__gptr(ex, id, it);
    return 0;
}

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

/* whole <- every tp and ep rank's slice of param id (local: this rank's);
 * collective over the tp and ep groups it is split over. */
static int tp_gather(mesh__exec *ex, int id, const float *local, float *whole)
{
    size_t nl = ex->numel[id];
    int st = exec__split_tp(ex, id), se = exec__split_ep(ex, id);
    if (!st && !se) {
        memcpy(whole, local, nl * sizeof *whole);
        return 0;
    }
    comm *ct = st ? ex->haxis[1] : NULL, *ce = se ? ex->haxis[3] : NULL; /* host buffers */
    size_t nt = ct ? (size_t)ct->size : 1, ne = ce ? (size_t)ce->size : 1;
    /* over tp, then those over ep: all[qe][qt] */
    float *all = malloc(ne * nt * nl * sizeof *all), *tps = ce && ct ? malloc(nt * nl * sizeof *tps) : NULL;
    int rc = all && (tps || !(ce && ct)) ? 0 : -1;
    comm *failed = NULL;
    if (rc == 0 && ct && (rc = comm_all_gather(ct, local, ce ? tps : all, nl)) != 0) failed = ct;
    if (rc == 0 && ce && (rc = comm_all_gather(ce, ct ? tps : local, all, nt * nl)) != 0) failed = ce;
    for (size_t q = 0; rc == 0 && q < ne * nt; q++) {
        copy_ctx cc = {whole, all + q * nl, 1};
        exec__param_runs(ex, id, (int)(q % nt), (int)(q / nt), copy_run, &cc);
    }
    if (rc != 0)
        snprintf(ex->error, sizeof ex->error, "rank %d: gathering a param over tp and ep: %s", ex->rank,
                 failed ? failed->error : "out of memory");
    free(all);
    free(tps);
    return rc;
}

/* local <- this rank's slice of the whole param id. */
static void tp_pick(const mesh__exec *ex, int id, const float *whole, float *local)
{
    copy_ctx cc = {local, whole, 0};
    exec__param_runs(ex, id, ex->coord[1], ex->coord[3], copy_run, &cc);
}

size_t mesh__exec_param_numel(const mesh__exec *ex, int k)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return 0;
    size_t n = 1;
    for (int d = 0; d < ex->p->tensors[id].rank; d++) n *= (size_t)ex->p->tensors[id].dims[d];
    return n;
}

/* local[q n ..] <- the rank's slice of copy it of param id for each of the
 * q < k optimizer arrays whose shards are at shards[q] (moments, masters):
 * every rank's shard over zeros, summed over the param's data-parallel
 * group (exact). Collective over that group. */
static int whole_of_opt(mesh__exec *ex, int id, int it, float *const *shards, int k, float *local)
{
    size_t n = ex->numel[id], lo, len;
    float *mo, *vo;
    exec__shard_of(ex, id, it, &lo, &len, &mo, &vo);
    comm *z = exec__host_comm(ex, exec__zcomm(ex, id)); /* host buffers */
    if (z) memset(local, 0, (size_t)k * n * sizeof *local);
    for (int q = 0; q < k; q++)
        if (exec__to_host(ex, local + (size_t)q * n + lo, shards[q], len * sizeof *local) != 0) return -1;
    if (!z || comm_all_reduce(z, local, (size_t)k * n) == 0) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d: gathering the optimizer state: %s", ex->rank, z->error);
    return -1;
}

/* Mixed precision: the fp32 masters are the params' values. */
static int masters_get(mesh__exec *ex, int id, int it, float *whole)
{
    float *local = malloc(ex->numel[id] * sizeof *local), *ms = exec__master(ex, id, it);
    int rc = local ? whole_of_opt(ex, id, it, &ms, 1, local) : -1;
    if (!local) snprintf(ex->error, sizeof ex->error, "rank %d: out of memory", ex->rank);
    if (rc == 0) rc = tp_gather(ex, id, local, whole);
    free(local);
    return rc == 0 ? 0 : -2;
}

int mesh__exec_param_get(mesh__exec *ex, int k, float *whole)
{
    if (exec__gather_wait(ex, -1) != 0) return -1; /* ZeRO-1/2: the last step's gathers */
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    if (ex->prec != KCPU_FP32) return masters_get(ex, id, it, whole);
    float *local = malloc(ex->numel[id] * sizeof *local);
    int rc = !local ? -1
             : ex->p->setup.zero == 3 ? whole_of_shards(ex, id, it, local)
                                      : exec__floats_to_host(ex, local, exec__vptr(ex, id, it), ex->numel[id]);
    if (!local) snprintf(ex->error, sizeof ex->error, "rank %d: out of memory", ex->rank);
    if (rc == 0) rc = tp_gather(ex, id, local, whole);
    free(local);
    return rc == 0 ? 0 : -2;
}

int mesh__exec_param_set(mesh__exec *ex, int k, const float *whole)
{
    if (exec__gather_wait(ex, -1) != 0) return -1; /* ZeRO-1/2: the last step's gathers */
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    size_t lo, len, n = ex->numel[id];
    float *m, *v, *master = exec__master(ex, id, it);
    exec__shard_of(ex, id, it, &lo, &len, &m, &v);
    float *local = malloc(n * sizeof *local);
    if (!local) return -2;
    tp_pick(ex, id, whole, local);
    /* mixed precision: the master in fp32, the value rounded */
    if (master) exec__to_dev(ex, master, local + lo, len * sizeof *local);
    exec__round(ex, local, n);
    put_param(ex, id, it, local);
    free(local);
    return ex->dev_failed ? -2 : 0;
}

int mesh__exec_moments_get(mesh__exec *ex, int k, float *m, float *v)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    size_t n = ex->numel[id], lo, len;
    float *mv[2], *lm = malloc(2 * n * sizeof *lm), *lv = lm + n;
    if (!lm) {
        snprintf(ex->error, sizeof ex->error, "rank %d: out of memory", ex->rank);
        return -2;
    }
    exec__shard_of(ex, id, it, &lo, &len, &mv[0], &mv[1]);
    int rc = whole_of_opt(ex, id, it, mv, 2, lm);
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
    exec__shard_of(ex, id, it, &lo, &len, &mo, &vo);
    tp_pick(ex, id, m, lm);
    tp_pick(ex, id, v, lm + n);
    exec__to_dev(ex, mo, lm + lo, len * sizeof *lm);
    exec__to_dev(ex, vo, lm + n + lo, len * sizeof *lm);
    free(lm);
    return ex->dev_failed ? -2 : 0;
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

double *mesh__exec_loss_scale(mesh__exec *ex) { return ex->prec == KCPU_FP16 ? &ex->loss_scale : NULL; }

long long *mesh__exec_scale_good(mesh__exec *ex) { return &ex->scale_good; }

void mesh__exec_set_scaler(mesh__exec *ex, double scale, long long interval)
{
    if (!ex->scale_dynamic) return;
    ex->loss_scale = scale;
    ex->scale_interval = interval;
}
