/* exec_ops.c — one op forward and backward on this rank (exec_impl.h),
 * through the rank's device's kernels (kern.h): its shapes on the rank,
 * and the exchanges a few ops make themselves (vocabulary-parallel
 * cross-entropy, expert-parallel moe). */
#include "exec_impl.h"

#include <math.h>   /* cos, exp, isfinite, log, sqrt */
#include <stdio.h>  /* snprintf */
#include <string.h> /* memcpy, memset */

#define IN(k) exec__val_in(ex, t->in[k], t->region, it)
#define DIN(k) exec__grad_in(ex, t->in[k], t->region, it)
#define OUT exec__vptr(ex, id, it)
#define DOUT exec__gptr(ex, id, it)
#define AUX exec__aux_ptr(ex, id, it)
#define I32(x) ((int32_t *)(void *)(x))

/* A kernel on the rank's device; a failure ends the op (exec__kern_failed). */
#define K(fn, ...)                                                                                          \
    do {                                                                                                    \
        if (EXEC_KERN(ex, fn, __VA_ARGS__) != 0) return exec__kern_failed(ex, #fn);                        \
    } while (0)

/* With expert parallelism the rows go through two exchanges over the ep
 * group: xs (this rank's tokens dispatched, in expert order, so rank q's
 * experts are one block) becomes xr (the rows every rank sent to this
 * rank's experts, [P, El, C, D]); the experts turn xr into ys, which goes
 * back as yr ([E, C, D], this rank's tokens again). On one ep rank xr is
 * xs and yr is ys. The backward's gradients go the same ways. The buffers
 * have room for fp32 elements; they hold the tensors' storage type. */
typedef struct moe_bufs {
    void *route;          /* the routing, in the device's layout */
    void *xs, *xr, *ys, *yr, *hg, *hu, *act;
    int *cnt;             /* [P, El] rows each rank sent to each local expert */
    void *dyr, *dys, *dxr, *dxs;
    float *dweight, *scratch; /* fp32 */
} moe_bufs;

static moe_bufs moe_at(mesh__exec *ex, int id, int it)
{
    ex_moe *g = ex->moe[id];
    size_t ec = (size_t)g->g.E * (size_t)g->g.C, ecd = ec * (size_t)g->g.D * 4, ecf = ec * (size_t)g->F * 4; /* bytes */
    unsigned char *aux = (unsigned char *)exec__aux_ptr(ex, id, it);
    int ep = g->P > 1;
    moe_bufs m;
    m.route = aux;
    m.xs = aux + g->route_bytes;
    m.ys = (char *)m.xs + ecd;
    m.hg = (char *)m.ys + ecd;
    m.hu = (char *)m.hg + ecf;
    m.act = (char *)m.hu + ecf;
    m.xr = ep ? (char *)m.act + ecf : m.xs;
    m.yr = ep ? (char *)m.xr + ecd : m.ys;
    m.cnt = ep ? (int *)(void *)((char *)m.yr + ecd) : ex->kern.v->moe_route_count(m.route, &g->g);
    m.dyr = ex->arena + ex->shared_at + exec__buf_of(ex, id)->scratch_offset;
    m.dxr = (char *)m.dyr + ecd;
    m.dys = ep ? (char *)m.dxr + ecd : m.dyr;
    m.dxs = ep ? (char *)m.dys + ecd : m.dxr;
    m.dweight = (float *)(void *)((char *)(ep ? m.dxs : m.dxr) + ecd);
    m.scratch = m.dweight + (size_t)g->g.N * (size_t)g->g.K;
    return m;
}

/* An all-to-all over the ep group of [P blocks of `bytes` each] (the
 * group's elements are the tensors' storage type, ex->esize bytes). */
static int moe_exchange(mesh__exec *ex, const void *in, void *out, size_t bytes)
{
    comm *c = ex->axis[3];
    size_t counts[64];
    for (int q = 0; q < c->size; q++) counts[q] = bytes / (size_t)ex->esize;
    if (EXEC_COMM(ex, STEP_ALL_TO_ALL, 3, comm_all_to_all(c, in, counts, out, counts)) == 0) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d: the moe all-to-all over ep: %s", ex->rank, c->error);
    return -1;
}

/* p advanced by n elements of the tensors' storage type. */
static void *el(const mesh__exec *ex, void *p, size_t n) { return (char *)p + n * (size_t)ex->esize; }

/* The local experts on every source rank's rows: one call per source. */
static int moe_experts_forward(mesh__exec *ex, const ex_moe *g, const moe_bufs *m, const void *wg, const void *wu,
                               const void *wd)
{
    size_t rows = (size_t)g->El * (size_t)g->g.C, D = (size_t)g->g.D, F = (size_t)g->F;
    for (int s = 0; s < g->P; s++)
        K(moe_expert_forward, el(ex, m->ys, s * rows * D), el(ex, m->hg, s * rows * F), el(ex, m->hu, s * rows * F),
          el(ex, m->act, s * rows * F), el(ex, m->xr, s * rows * D), wg, wu, wd, m->cnt + s * g->El, g->El, g->g.C,
          g->g.D, g->F);
    /* stored in the plan's precision (fp32 words on the CPU: rounded) */
    size_t all = (size_t)g->P * rows;
    exec__round(ex, m->ys, all * D);
    exec__round(ex, m->hg, all * F);
    exec__round(ex, m->hu, all * F);
    exec__round(ex, m->act, all * F);
    return 0;
}

static int moe_experts_backward(mesh__exec *ex, const ex_moe *g, const moe_bufs *m, void *dwg, void *dwu, void *dwd,
                                const void *wg, const void *wu, const void *wd)
{
    size_t rows = (size_t)g->El * (size_t)g->g.C, D = (size_t)g->g.D, F = (size_t)g->F;
    size_t w = (size_t)g->El * D * F; /* each expert weight's elements on this rank */
    for (int s = 0; s < g->P; s++) {
        K(moe_expert_backward, el(ex, m->dxr, s * rows * D), dwg, dwu, dwd, m->scratch, el(ex, m->dyr, s * rows * D),
          el(ex, m->hg, s * rows * F), el(ex, m->hu, s * rows * F), el(ex, m->act, s * rows * F),
          el(ex, m->xr, s * rows * D), wg, wu, wd, m->cnt + s * g->El, g->El, g->g.C, g->g.D, g->F);
        /* each call's sums stored in the plan's precision, as a GPU stores
         * them (with ep the experts' weight gradients are rounded once per
         * source rank's rows; the last source's with the op's gradients,
         * by round_grads) */
        exec__round(ex, el(ex, m->dxr, s * rows * D), rows * D);
        if (s + 1 < g->P) {
            exec__round(ex, dwg, w);
            exec__round(ex, dwu, w);
            exec__round(ex, dwd, w);
        }
    }
    return 0;
}

/* The first vocabulary row of an embedding table on this rank. */
static int row0_of(const mesh__exec *ex, int table)
{
    return exec__split_tp(ex, table) && ex->p->tensors[table].pl.dim[1] == 0 ? ex->coord[1] * (int)ex->ld[table][0] : 0;
}

/* Are the logits `id` split over tp along the vocabulary (their last dim),
 * not along the sequence (sequence parallelism gathers those whole)? */
static int vocab_split(const mesh__exec *ex, int id)
{
    const plan_tensor *t = &ex->p->tensors[id];
    return exec__split_tp(ex, id) && t->pl.dim[1] == t->rank - 1;
}

/* Vocabulary-parallel cross-entropy: this rank holds columns [r W, (r + 1)
 * W) of the logits. The ranks take the rows' maximum, then add their sums
 * of exp(logit - max) and their target logits (exactly, in rank order).
 * aux: losses, rowmax, lse [N] each, as the whole-vocabulary kernel's.
 * Everything stays on the device (two all-gathers between kernels, which
 * an ordered NCCL world runs without the host waiting); *mean gets the
 * mean loss, one float on the device. */
static int ce_shard_forward(mesh__exec *ex, float *aux, const float *logits, const int32_t *targets, int N, int W,
                            int V, float *mean)
{
    comm *c = ex->axis[1];
    int P = c->size;
    float *mx = aux + N, *lse = aux + 2 * N, *tl = aux; /* the losses' place holds the target logits first */
    int col0 = ex->coord[1] * W;
    /* in the communication buffer (memplan_ce_exchange_bytes): this rank's
     * sums and target logits (2 N doubles), then every rank's maxima, later
     * every rank's sums and target logits */
    if ((int64_t)memplan_ce_exchange_bytes(N, P) > ex->ms->comm) {
        snprintf(ex->error, sizeof ex->error, "rank %d: the communication buffer is smaller than the "
                 "vocabulary-parallel cross-entropy needs", ex->rank);
        comm_abort(c, ex->error);
        return -1;
    }
    double *x = (double *)(void *)(ex->arena + ((ex->comm_at + 7) & ~(int64_t)7)); /* the arena is 8-aligned */
    float *all = (float *)(void *)(x + 2 * (size_t)N);
    size_t elems = (size_t)ex->esize; /* the group's elements: the plan's type (bytes move, nothing is summed) */
    /* a device failure stops the group rather than leave it waiting in the next exchange */
    if (EXEC_KERN(ex, crossentropy_shard_max, mx, tl, logits, targets, N, col0, W, V) != 0)
        return exec__kern_failed(ex, "crossentropy_shard_max"), comm_abort(c, ex->error), -1;
    /* (timed as the plan's all-reduce(tp) of the loss, which they are) */
    if (EXEC_COMM(ex, STEP_ALL_REDUCE, 1, comm_all_gather(c, mx, all, (size_t)N * sizeof(float) / elems)) != 0)
        goto comm_failed;
    if (EXEC_KERN(ex, crossentropy_shard_rowmax, mx, all, N, P) != 0)
        return exec__kern_failed(ex, "crossentropy_shard_rowmax"), comm_abort(c, ex->error), -1;
    if (EXEC_KERN(ex, crossentropy_shard_sumexp, x, tl, logits, mx, N, col0, W, V) != 0)
        return exec__kern_failed(ex, "crossentropy_shard_sumexp"), comm_abort(c, ex->error), -1;
    if (EXEC_COMM(ex, STEP_ALL_REDUCE, 1,
                  comm_all_gather(c, (float *)(void *)x, all, 2 * (size_t)N * sizeof(double) / elems)) != 0)
        goto comm_failed;
    if (EXEC_KERN(ex, crossentropy_shard_finish, mean, tl, lse, (double *)(void *)all, mx, N, P) != 0)
        return exec__kern_failed(ex, "crossentropy_shard_finish"), -1;
    return 0;
comm_failed:
    if (!ex->error[0])
        snprintf(ex->error, sizeof ex->error, "rank %d: vocabulary-parallel cross-entropy: %s", ex->rank, c->error);
    return -1;
}

/* Broadcast add: the smaller operand's elements repeat over the larger's. */
static int add_forward(mesh__exec *ex, float *out, const float *a, size_t na, const float *b, size_t nb)
{
    if (na == nb) K(add_forward, out, a, b, na);
    else if (na > nb) K(add_broadcast_forward, out, a, b, (int)(na / nb), 1, (int)nb);
    else K(add_broadcast_forward, out, b, a, (int)(nb / na), 1, (int)na);
    return 0;
}

/* a + b's backward: da += dout, db += dout, the smaller side's summed over
 * the rows it was broadcast to. A side whose gradient is a param's fp32
 * main gradient (fa, fb: memplan_grad_fp32, with kern.dw32) gets its sum in
 * fp32: the broadcast side's column sums in fp32, an equal-sized side's add
 * by accumulate. asg: the sides (bit 0: a, 1: b) whose gradient is
 * overwritten, not added to (kern.assign; the larger side's only). */
static int add_backward(mesh__exec *ex, float *da, size_t na, int fa, float *db, size_t nb, int fb, unsigned asg,
                        const float *dout)
{
    int rc = 0;
    /* a side whose gradient is the output's own buffer (a matmul's before
     * its bias add, mem_buf.grad_alias) has it already */
    if (da == dout) da = NULL, asg &= ~1u;
    if (db == dout) db = NULL, asg &= ~2u;
    if (na < nb) { /* a: the larger side (or either) */
        float *d = da;
        size_t n = na;
        int f = fa;
        da = db, na = nb, fa = fb;
        db = d, nb = n, fb = f;
        asg = (asg & 1u) << 1 | (asg >> 1 & 1u);
    }
    int dw32 = ex->kern.dw32;
    ex->kern.dw32 = 0;
    if (na == nb && !fa && !fb) { /* both elementwise, in one kernel */
        ex->kern.assign = (int)asg;
        rc = EXEC_KERN(ex, add_backward, da, db, dout, na);
    } else { /* a elementwise (fp32: accumulate), b's sums over the rows it was broadcast to */
        ex->kern.assign = (int)(asg & 1u);
        if (da) rc = fa ? EXEC_KERN(ex, accumulate, da, dout, na, 0) : EXEC_KERN(ex, add_backward, da, NULL, dout, na);
        ex->kern.assign = 0;
        ex->kern.dw32 = fb;
        if (rc == 0 && db) rc = EXEC_KERN(ex, add_broadcast_backward, NULL, db, dout, (int)(na / nb), 1, (int)nb);
    }
    ex->kern.assign = 0;
    ex->kern.dw32 = dw32;
    return rc == 0 ? 0 : exec__kern_failed(ex, "add_backward");
}

/* The gradient add node id's backward writes for its input k: a position
 * embedding's table's fp32 gradient (memplan_pos_table: its first rows,
 * the embedding's; sliced over tp, the rank's slice of them), else the
 * input's own. */
static float *add_grad(mesh__exec *ex, int id, int k, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    int e = t->in[k], table = memplan_pos_table(ex->p, e);
    if (table < 0) return exec__grad_in(ex, e, t->region, it);
    float *g = exec__grad_in(ex, table, t->region, it);
    return g && memplan_pos_sliced(ex->p, e) ? g + (size_t)ex->coord[1] * ex->cnumel[e] : g;
}

/* Attention geometry on this rank: qkv [B, T, (H + 2 KV) d] -> out [B, T,
 * H d]; split over tp, H and KV are the rank's heads. */
void exec__attn_dims(const mesh__exec *ex, int id, int *B, int *T, int *H, int *KV, int *d)
{
    const plan_tensor *t = &ex->p->tensors[id];
    *d = (int)(exec__last_dim(t) / t->heads);
    *H = exec__lastd(ex, id) / *d;
    *KV = (int)((t->kv_heads ? t->kv_heads : t->heads) * *H / t->heads);
    *T = (int)ex->ld[id][t->rank - 2];
    *B = (int)(ex->numel[id] / ((size_t)*T * (size_t)*H * (size_t)*d));
}

int exec__forward_node(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *a = t->n_in > 0 ? &ex->p->tensors[t->in[0]] : NULL;
    const plan_tensor *b = t->n_in > 1 ? &ex->p->tensors[t->in[1]] : NULL;
    size_t n = ex->numel[id];
    float ce_mean = 0; /* a 2-byte cross-entropy's mean, through the host */
    switch (t->op) {
    case G_EMBED: { /* a table split over tp holds its rank's rows of the vocabulary */
        int rows = (int)ex->ld[t->in[1]][0], C = (int)ex->ld[t->in[1]][1];
        K(embedding_rows_forward, OUT, I32(IN(0)), IN(1), (int)ex->numel[t->in[0]], row0_of(ex, t->in[1]), rows, C);
        break;
    }
    case G_ARANGE:
        K(arange, I32(OUT), n);
        break;
    case G_MATMUL: {
        if (ex->fuse[id].into >= 0) break; /* with its bias add, at the bias add */
        int K = exec__lastd(ex, t->in[0]), N = exec__lastd(ex, id), M = (int)(n / (size_t)N);
        if (b->op == G_TRANSPOSE) /* x @ transpose(w): w stored [N, K] */
            K(matmul_wt_forward, OUT, IN(0), exec__val_in(ex, b->in[0], t->region, it), M, K, N);
        else
            K(matmul_forward, OUT, IN(0), IN(1), M, K, N);
        break;
    }
    case G_TRANSPOSE: /* only read through the matmul that uses it */
        break;
    case G_BIAS_ADD:
        if (ex->fuse[t->in[0]].into == id) { /* x @ w + bias (and its GELU) in one kernel */
            const plan_tensor *mm = a;
            int g = ex->fuse[id].gelu; /* (recomputing too: the GELU's bits are the forward's) */
            int K = exec__lastd(ex, mm->in[0]), N = exec__lastd(ex, t->in[0]), M = (int)(n / (size_t)N);
            K(matmul_bias_forward, g >= 0 ? exec__vptr(ex, g, it) : OUT, g >= 0 ? OUT : NULL,
              exec__val_in(ex, mm->in[0], t->region, it), exec__val_in(ex, mm->in[1], t->region, it), IN(1), M, K,
              N, g >= 0);
            break;
        }
        /* fall through */
    case G_ADD:
        if (ex->fuse[id].norm >= 0 && !ex->recomputing) { /* with the norm after it, in one kernel */
            const plan_tensor *nt = &ex->p->tensors[ex->fuse[id].norm];
            int rms = nt->op == G_RMSNORM, C = exec__lastd(ex, id), rows = (int)(n / (size_t)C);
            float *aux = exec__aux_ptr(ex, ex->fuse[id].norm, it);
            K(add_norm_forward, OUT, exec__vptr(ex, ex->fuse[id].norm, it), rms ? NULL : aux, rms ? aux : aux + rows,
              IN(0), IN(1), exec__val_in(ex, nt->in[1], nt->region, it),
              !rms && nt->n_in > 2 ? exec__val_in(ex, nt->in[2], nt->region, it) : NULL, rows, C, (float)nt->eps, rms);
            break;
        }
        if (add_forward(ex, OUT, IN(0), ex->cnumel[t->in[0]], IN(1), ex->cnumel[t->in[1]]) != 0) return -1;
        break;
    case G_LAYERNORM: {
        if (ex->fuse[id].into >= 0 && !ex->recomputing) break; /* with its add, at the add */
        int C = exec__lastd(ex, id), rows = (int)(n / (size_t)C);
        float *aux = AUX;
        K(layernorm_forward, OUT, aux, aux + rows, IN(0), IN(1), t->n_in > 2 ? IN(2) : NULL, rows, C, (float)t->eps);
        break;
    }
    case G_RMSNORM: {
        if (ex->fuse[id].into >= 0 && !ex->recomputing) break; /* with its add, at the add */
        int C = exec__lastd(ex, id), rows = (int)(n / (size_t)C);
        K(rmsnorm_forward, OUT, AUX, IN(0), IN(1), rows, C, (float)t->eps);
        break;
    }
    case G_ATTENTION: {
        int B, T, H, KV, d;
        exec__attn_dims(ex, id, &B, &T, &H, &KV, &d);
        if (t->n_in == 1) /* packed [q | k | v] */
            K(attention_qkv_forward, OUT, AUX, IN(0), B, T, H, KV, d, t->causal);
        else
            K(attention_forward, OUT, AUX, IN(0), IN(1), IN(2), B, T, H, KV, d, t->causal);
        break;
    }
    case G_ROPE: {
        int B, T, H, KV, d;
        exec__attn_dims(ex, id, &B, &T, &H, &KV, &d);
        K(rope_forward, OUT, IN(0), B, T, H, d, (float)t->theta);
        break;
    }
    case G_GELU:
        if (ex->fuse[id].into < 0) K(gelu_forward, OUT, IN(0), n); /* else with its bias add */
        break;
    case G_SILU: K(silu_forward, OUT, IN(0), n); break;
    case G_SWIGLU: K(swiglu_forward, OUT, IN(0), IN(1), n); break;
    case G_CROSS_ENTROPY: {
        int W = exec__lastd(ex, t->in[0]), N = (int)ex->numel[t->in[1]];
        int V = t->vocab > 0 ? (int)t->vocab : (int)exec__last_dim(a);
        float *aux = AUX;
        /* the mean into the loss's terms (read with the step's), or a float of its own */
        int term = (ex->loss_terms || id == ex->p->loss) && !ex->recomputing;
        float *mean = term ? exec__loss_term(ex, 1.0) : exec__loss_dump(ex);
        if (!mean) return -1;
        /* in a training step the backward's gradient now, over the logits
         * (mem_buf.grad_in_value; the loss's seed, exactly) */
        int over = exec__buf_of(ex, t->in[0])->grad_in_value && ex->grads_follow && !ex->recomputing;
        float seed = (float)(ex->dloss * ex->loss_scale);
        if (vocab_split(ex, t->in[0])) { /* vocabulary-parallel */
            if (ce_shard_forward(ex, aux, IN(0), I32(IN(1)), N, W, V, mean) != 0) return -1;
            if (over) {
                ex->kern.assign = 1;
                int rc = EXEC_KERN(ex, crossentropy_shard_backward, DIN(0), IN(0), I32(IN(1)), aux + N, aux + 2 * N,
                                   seed, N, ex->coord[1] * W, W, V);
                ex->kern.assign = 0;
                if (rc != 0) return exec__kern_failed(ex, "crossentropy_shard_backward");
            }
        } else {
            K(crossentropy_forward, mean, aux, aux + N, aux + 2 * N, IN(0), I32(IN(1)), over ? DIN(0) : NULL, seed, N,
              V, W);
        }
        if (ex->esize == 4) { /* the tensor's value too, on the device */
            if (exec__dcopy(ex, OUT, mean, sizeof *mean) != 0) return -1;
        } else if (!term || id != ex->p->loss || ex->loss_read) { /* a 2-byte value that an op reads: through the host */
            if (exec__to_host(ex, &ce_mean, mean, sizeof ce_mean) != 0 || /* (the mean is fp32) */
                exec__floats_to_dev(ex, OUT, &ce_mean, 1) != 0)
                return -1;
        }
        if (term) return 0;
        break;
    }
    case G_MOE: {
        ex_moe *g = ex->moe[id];
        moe_bufs m = moe_at(ex, id, it);
        size_t block = (size_t)g->El * (size_t)g->g.C * (size_t)g->g.D * (size_t)ex->esize; /* bytes */
        float *aux = ex->recomputing ? exec__loss_dump(ex) : exec__loss_term(ex, t->aux_loss); /* on the device */
        if (!aux) return -1;
        K(moe_route_forward, m.route, aux, IN(0), IN(1), &g->g);
        K(moe_dispatch_forward, m.xs, IN(0), m.route, &g->g);
        if (g->P > 1) { /* the counts (ints: an all-to-all moves bytes, it sums nothing), then the rows */
            int *kept = ex->kern.v->moe_route_count(m.route, &g->g);
            if (moe_exchange(ex, kept, m.cnt, (size_t)g->El * sizeof(int)) != 0 ||
                moe_exchange(ex, m.xs, m.xr, block) != 0)
                return -1;
        }
        if (moe_experts_forward(ex, g, &m, IN(2), IN(3), IN(4)) != 0) return -1;
        if (g->P > 1 && moe_exchange(ex, m.ys, m.yr, block) != 0) return -1; /* the outputs back */
        K(moe_combine_forward, OUT, m.yr, m.route, &g->g);
        break;
    }
    default: /* inputs and params are filled elsewhere; others refused at create */
        break;
    }
    if (id == ex->p->loss && !ex->recomputing && !ex->loss_terms) { /* a loss not of terms: its value */
        float loss = 0;
        if (exec__floats_to_host(ex, &loss, OUT, 1) != 0) return -1;
        if (exec__loss_value(ex, loss) != 0) return -1;
    }
    return 0;
}

int exec__backward_node(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *a = t->n_in > 0 ? &ex->p->tensors[t->in[0]] : NULL;
    const plan_tensor *b = t->n_in > 1 ? &ex->p->tensors[t->in[1]] : NULL;
    size_t n = ex->numel[id];
    switch (t->op) {
    case G_EMBED: {
        if (memplan_pos_table(ex->p, id) >= 0) break; /* its add wrote the table's gradient */
        int rows = (int)ex->ld[t->in[1]][0], C = (int)ex->ld[t->in[1]][1];
        K(embedding_rows_backward, DIN(1), DOUT, I32(IN(0)), (int)ex->numel[t->in[0]], row0_of(ex, t->in[1]), rows,
          C);
        break;
    }
    case G_MATMUL: {
        int K = exec__lastd(ex, t->in[0]), N = exec__lastd(ex, id), M = (int)(n / (size_t)N);
        int g = ex->fuse[id].dgelu; /* the GELU whose value x is: its backward too, dx never stored */
        if (g >= 0)
            K(matmul_gelu_backward, exec__grad_in(ex, ex->p->tensors[g].in[0], t->region, it), DIN(1), DOUT, IN(0),
              IN(1), exec__val_in(ex, ex->p->tensors[g].in[0], t->region, it), M, K, N);
        else if (b->op == G_TRANSPOSE)
            K(matmul_wt_backward, DIN(0), exec__grad_in(ex, b->in[0], t->region, it), DOUT, IN(0),
              exec__val_in(ex, b->in[0], t->region, it), M, K, N);
        else
            K(matmul_backward, DIN(0), DIN(1), DOUT, IN(0), IN(1), M, K, N);
        break;
    }
    case G_BIAS_ADD:
    case G_ADD:
        if (add_backward(ex, add_grad(ex, id, 0, it), ex->cnumel[t->in[0]], ex->kern.dw32 && memplan_grad_fp32(ex->p, id, 0),
                         add_grad(ex, id, 1, it), ex->cnumel[t->in[1]], ex->kern.dw32 && memplan_grad_fp32(ex->p, id, 1),
                         (unsigned)ex->kern.assign, DOUT) != 0)
            return -1;
        break;
    case G_LAYERNORM: {
        int C = exec__lastd(ex, id), rows = (int)(n / (size_t)C);
        float *aux = AUX;
        K(layernorm_backward, DIN(0), DIN(1), t->n_in > 2 ? DIN(2) : NULL, DOUT, IN(0), IN(1), aux, aux + rows, rows,
          C);
        break;
    }
    case G_RMSNORM: {
        int C = exec__lastd(ex, id), rows = (int)(n / (size_t)C);
        K(rmsnorm_backward, DIN(0), DIN(1), DOUT, IN(0), IN(1), AUX, rows, C);
        break;
    }
    case G_ATTENTION: {
        int B, T, H, KV, d;
        exec__attn_dims(ex, id, &B, &T, &H, &KV, &d);
        if (t->n_in == 1)
            K(attention_qkv_backward, DIN(0), DOUT, OUT, AUX, IN(0), B, T, H, KV, d, t->causal);
        else
            K(attention_backward, DIN(0), DIN(1), DIN(2), DOUT, OUT, AUX, IN(0), IN(1), IN(2), B, T, H, KV, d,
              t->causal);
        break;
    }
    case G_ROPE: {
        int B, T, H, KV, d;
        exec__attn_dims(ex, id, &B, &T, &H, &KV, &d);
        K(rope_backward, DIN(0), DOUT, B, T, H, d, (float)t->theta);
        break;
    }
    case G_GELU:
        if (ex->fuse[id].dgelu_by < 0) K(gelu_backward, DIN(0), IN(0), DOUT, n); /* else with the matmul's */
        break;
    case G_SILU: K(silu_backward, DIN(0), IN(0), DOUT, n); break;
    case G_SWIGLU: K(swiglu_backward, DIN(0), DIN(1), DOUT, IN(0), IN(1), n); break;
    case G_CROSS_ENTROPY: {
        int W = exec__lastd(ex, t->in[0]), N = (int)ex->numel[t->in[1]];
        int V = t->vocab > 0 ? (int)t->vocab : (int)exec__last_dim(a);
        float *aux = AUX;
        /* the loss's gradient: the backward's seed (exactly, when it is this node) */
        if (exec__buf_of(ex, t->in[0])->grad_in_value) break; /* written by the forward, over the logits */
        float seed = (float)(ex->dloss * ex->loss_scale);
        if (id != ex->p->loss && exec__floats_to_host(ex, &seed, DOUT, 1) != 0) return -1;
        K(crossentropy_shard_backward, DIN(0), IN(0), I32(IN(1)), aux + N, aux + 2 * N, seed, N,
          vocab_split(ex, t->in[0]) ? ex->coord[1] * W : 0, W, V);
        break;
    }
    case G_MOE: {
        ex_moe *g = ex->moe[id];
        moe_bufs m = moe_at(ex, id, it);
        size_t ecd = (size_t)g->g.E * (size_t)g->g.C * (size_t)g->g.D, block = ecd * (size_t)ex->esize / (size_t)g->P;
        size_t bytes = ecd * (size_t)ex->esize;
        if (exec__fill(ex, m.dys, 0, bytes) != 0 || exec__fill(ex, m.dxr, 0, bytes) != 0 ||
            exec__fill(ex, m.dweight, 0, (size_t)g->g.N * (size_t)g->g.K * sizeof(float)) != 0)
            return -1;
        K(moe_combine_backward, m.dys, m.dweight, DOUT, m.yr, m.route, &g->g);
        exec__round(ex, m.dys, ecd); /* stored in the plan's precision (fp32 words: rounded), as below */
        if (g->P > 1 && moe_exchange(ex, m.dys, m.dyr, block) != 0) return -1; /* to the experts' ranks */
        if (moe_experts_backward(ex, g, &m, DIN(2), DIN(3), DIN(4), IN(2), IN(3), IN(4)) != 0) return -1;
        if (g->P > 1 && moe_exchange(ex, m.dxr, m.dxs, block) != 0) return -1; /* back to the tokens' rank */
        K(moe_dispatch_backward, DIN(0), m.dxs, m.route, &g->g);
        exec__round(ex, DIN(0), ex->cnumel[t->in[0]]);
        /* the load-balancing loss is part of the loss: its gradient scales
         * with the seed of the backward, as the cross-entropy's does. With
         * tp the gradients of x and the router are partial sums over the tp
         * ranks (each holds a slice of the experts' hidden width), summed by
         * the plan's all-reduces: the aux loss, the same on every tp rank,
         * enters on the first only */
        double aux = ex->coord[1] == 0 ? t->aux_loss * ex->dloss * ex->loss_scale : 0.0;
        K(moe_route_backward, DIN(0), DIN(1), m.scratch, m.dweight, (float)aux, m.route, IN(0), IN(1), &g->g);
        break;
    }
    default:
        break;
    }
    return 0;
}
