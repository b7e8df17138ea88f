/* exec_check.c — every kernel call of the plan within its buffers, checked
 * once when a rank's executor is made.
 *
 * The plan reader checks each tensor against its op on the plan's (global)
 * shapes (compiler/plan_check.c); what a rank's kernels read depends also
 * on the placements, which split dimensions over tp and ep. A placement
 * edited into one that the compiler would not derive (a GELU split along
 * the sequence where its input and its matmul are split along the width)
 * keeps every buffer's size, so the memory plan's check passes, but gives
 * the next op other sizes: its kernel would read past its input. Here the
 * sizes each op's kernels take on this rank, computed as exec_ops.c
 * computes them (M, K, N of a product, rows and width of a norm, the
 * attention's B, T, H, KV, d, ...), are checked against the elements of
 * the buffers they read and write (ex->cnumel: an input as its consumers
 * read it; ex->numel: the output). A plan meshc wrote always passes.
 */
#include <stdarg.h> /* va_list */
#include <stdio.h>  /* vsnprintf */

#include "exec_impl.h"

typedef struct ck {
    const mesh__exec *ex;
    int id;
    const plan_tensor *t;
    char *err;
    size_t errn;
} ck;

__attribute__((format(printf, 2, 3))) static int bad(ck *c, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (c->err && c->errn)
        snprintf(c->err, c->errn, "rank %d: tensor %d (%s): %s on this rank, by its placements: the plan is not one "
                 "meshc wrote; compile it again", c->ex->rank, c->id, graph_op_name(c->t->op), what);
    return -1;
}

static size_t in_n(const ck *c, int k) { return c->ex->cnumel[c->t->in[k]]; }

/* Input k holds `want` elements as the kernel reads it. */
static int reads(ck *c, int k, size_t want)
{
    if (in_n(c, k) == want) return 0;
    return bad(c, "its kernel reads %zu elements of input %d (tensor %d), which has %zu", want, k, c->t->in[k],
               in_n(c, k));
}

static int rows_of(ck *c, size_t n, int64_t width, size_t *rows)
{
    if (width < 1 || n % (size_t)width != 0)
        return bad(c, "its %zu elements are not rows of %lld", n, (long long)width);
    *rows = n / (size_t)width;
    return 0;
}

static int check_matmul(ck *c, size_t n)
{
    const mesh__exec *ex = c->ex;
    const plan_tensor *b = &ex->p->tensors[c->t->in[1]];
    size_t K = (size_t)exec__lastd(ex, c->t->in[0]), N = (size_t)exec__lastd(ex, c->id), M = 0;
    if (rows_of(c, n, (int64_t)N, &M) < 0 || reads(c, 0, M * K) < 0) return -1;
    /* x @ transpose(w) reads w itself, [N, K] */
    size_t w = b->op == G_TRANSPOSE ? ex->cnumel[b->in[0]] : in_n(c, 1);
    if (w != K * N) return bad(c, "its kernel reads a weight of %zu x %zu elements, which has %zu", K, N, w);
    return 0;
}

static int check_add(ck *c, size_t n)
{
    size_t a = in_n(c, 0), b = in_n(c, 1), big = a > b ? a : b, small = a > b ? b : a;
    if (small == 0 || big % small != 0 || n != big)
        return bad(c, "its inputs of %zu and %zu elements do not add into its %zu", a, b, n);
    return 0;
}

static int check_norm(ck *c, size_t n)
{
    size_t C = (size_t)exec__lastd(c->ex, c->id), rows = 0;
    if (rows_of(c, n, (int64_t)C, &rows) < 0 || reads(c, 0, n) < 0) return -1;
    for (int k = 1; k < c->t->n_in; k++)
        if (reads(c, k, C) < 0) return -1;
    return 0;
}

/* attention and rope: exec__attn_dims's geometry */
static int check_heads(ck *c, size_t n)
{
    const mesh__exec *ex = c->ex;
    const plan_tensor *t = c->t;
    int64_t d = exec__last_dim(t) / (t->heads > 0 ? t->heads : 1), w = exec__lastd(ex, c->id);
    int64_t kv = t->kv_heads ? t->kv_heads : t->heads;
    if (t->rank < 2 || d < 1 || w % d != 0 || (kv * (w / d)) % t->heads != 0)
        return bad(c, "its %lld columns are not whole heads of %lld", (long long)w, (long long)d);
    size_t H = (size_t)(w / d), KV = (size_t)(kv * (int64_t)H / t->heads), T = (size_t)ex->ld[c->id][t->rank - 2];
    size_t row = T * H * (size_t)d;
    if (row == 0 || n % row != 0) return bad(c, "its %zu elements are not sequences of %zu x %zu heads", n, T, H);
    size_t B = n / row;
    if (t->op == G_ROPE && d % 2 != 0) return bad(c, "its head size %lld is odd", (long long)d);
    if (t->op == G_ROPE) return reads(c, 0, n);
    if (t->n_in == 1) return reads(c, 0, B * T * (H + 2 * KV) * (size_t)d);
    return reads(c, 0, n) < 0 || reads(c, 1, B * T * KV * (size_t)d) < 0 ? -1 : reads(c, 2, B * T * KV * (size_t)d);
}

static int check_cross_entropy(ck *c)
{
    const mesh__exec *ex = c->ex;
    const plan_tensor *t = c->t, *lg = &ex->p->tensors[t->in[0]];
    size_t W = (size_t)exec__lastd(ex, t->in[0]), N = ex->numel[t->in[1]];
    int64_t V = t->vocab > 0 ? t->vocab : exec__last_dim(lg);
    int split = exec__split_tp(ex, t->in[0]) && lg->pl.dim[1] == lg->rank - 1;
    if (reads(c, 0, N * W) < 0 || in_n(c, 1) != N) return -1;
    if (V > (int64_t)W * (split ? ex->p->setup.tp : 1))
        return bad(c, "a vocabulary of %lld is wider than its logits' %zu columns", (long long)V, W);
    return 0;
}

static int check_moe(ck *c, size_t n)
{
    const ex_moe *m = c->ex->moe[c->id];
    if (!m) return 0; /* not made (another stage's) */
    size_t D = (size_t)m->g.D, E = (size_t)m->g.E, F = (size_t)m->F, rows = 0;
    if (rows_of(c, n, (int64_t)D, &rows) < 0 || reads(c, 0, n) < 0 || reads(c, 1, D * E) < 0) return -1;
    if (m->P < 1 || E % (size_t)m->P != 0) return bad(c, "its %zu experts are not split evenly over ep", E);
    size_t El = E / (size_t)m->P;
    for (int k = 2; k < c->t->n_in; k++)
        if (reads(c, k, El * D * F) < 0) return -1;
    return 0;
}

static int check_one(ck *c)
{
    size_t n = c->ex->numel[c->id];
    switch (c->t->op) {
    case G_EMBED: {
        const int64_t *tab = c->ex->ld[c->t->in[1]];
        if (c->ex->numel[c->t->in[0]] * (size_t)tab[1] != n || in_n(c, 0) != c->ex->numel[c->t->in[0]])
            return bad(c, "its %zu elements are not rows of %lld for its %zu ids", n, (long long)tab[1],
                       c->ex->numel[c->t->in[0]]);
        return 0;
    }
    case G_MATMUL: return check_matmul(c, n);
    case G_BIAS_ADD:
    case G_ADD: return check_add(c, n);
    case G_LAYERNORM:
    case G_RMSNORM: return check_norm(c, n);
    case G_ATTENTION:
    case G_ROPE: return check_heads(c, n);
    case G_GELU:
    case G_SILU: return reads(c, 0, n);
    case G_SWIGLU: return reads(c, 0, n) < 0 ? -1 : reads(c, 1, n);
    case G_CROSS_ENTROPY: return check_cross_entropy(c);
    case G_MOE: return check_moe(c, n);
    default: return 0; /* inputs, params, arange (no inputs); transposes read by their matmul */
    }
}

int exec__check_kernels(const mesh__exec *ex, char *err, size_t errn)
{
    for (int id = 0; id < ex->n; id++) {
        ck c = {ex, id, &ex->p->tensors[id], err, errn};
        if (check_one(&c) < 0) return -1;
    }
    return 0;
}
