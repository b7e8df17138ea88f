/* plan_check.c — a plan's tensors against their ops, as the runtime reads
 * them: the checker's shape rules (lang/check_ops.c), restated on the
 * plan's tensors, so that a plan meshc did not write as it stands (edited
 * by hand, cut, corrupted) is refused with a message rather than run with
 * one op reading past another's buffer.
 *
 * The rules are the checker's, on the shapes one data-parallel rank sees,
 * plus what the executor derives from the mesh: a dimension split over tp
 * (or a parameter's over ep) divides by it, and attention heads split over
 * tp divide by it. Every input id is an earlier tensor (plan_read checks
 * that before this runs).
 */
#include <math.h>   /* isfinite */
#include <stdarg.h> /* va_list */
#include <stdio.h>  /* vsnprintf */

#include "plan.h"
#include "plan_check.h"

typedef struct chk {
    const plan *p;
    const plan_tensor *t;
    char *msg;
    size_t n;
} chk;

__attribute__((format(printf, 2, 3))) static int bad(chk *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (c->msg && c->n) vsnprintf(c->msg, c->n, fmt, ap);
    va_end(ap);
    return -1;
}

static const plan_tensor *in(const chk *c, int k) { return &c->p->tensors[c->t->in[k]]; }

static int64_t last(const plan_tensor *t) { return t->rank ? t->dims[t->rank - 1] : 0; }

static int same_shape(const plan_tensor *a, const plan_tensor *b)
{
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

/* "[2, 64, 192]" */
static const char *shape(const plan_tensor *t, char *buf, size_t n)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->rank && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    if (at < n) snprintf(buf + at, n - at, "]");
    return buf;
}

/* The output has input k's shape. */
static int as_input(chk *c, int k)
{
    char a[96], b[96];
    if (!same_shape(c->t, in(c, k)))
        return bad(c, "its shape %s is not its input's, %s (tensor %d)", shape(c->t, a, sizeof a),
                   shape(in(c, k), b, sizeof b), c->t->in[k]);
    return 0;
}

static int arity(chk *c, int lo, int hi)
{
    if (c->t->n_in >= lo && c->t->n_in <= hi) return 0;
    if (lo == hi) return bad(c, "it takes %d input%s, not %d", lo, lo == 1 ? "" : "s", c->t->n_in);
    return bad(c, "it takes %d to %d inputs, not %d", lo, hi, c->t->n_in);
}

/* Input k: of dtype want, with a rank from lo to hi (hi < 0: any). */
static int want(chk *c, int k, plan_dtype dt, int lo, int hi)
{
    const plan_tensor *x = in(c, k);
    char a[96];
    if (x->dtype != dt)
        return bad(c, "its input %d (tensor %d) must be %s, not %s", k, c->t->in[k], plan__dtype_name(dt),
                   plan__dtype_name(x->dtype));
    if (x->rank < lo || (hi >= 0 && x->rank > hi)) {
        if (lo == hi)
            return bad(c, "its input %d (tensor %d), %s, must have rank %d", k, c->t->in[k], shape(x, a, sizeof a), lo);
        return bad(c, "its input %d (tensor %d), %s, must have rank %d to %d", k, c->t->in[k], shape(x, a, sizeof a),
                   lo, hi < 0 ? GRAPH_MAX_RANK : hi);
    }
    return 0;
}

static int floats(chk *c, int from, int lo, int hi)
{
    for (int k = from; k < c->t->n_in; k++)
        if (want(c, k, PLAN_DTYPE_F32, lo, hi) < 0) return -1;
    return 0;
}

static int check_embed(chk *c)
{
    if (arity(c, 2, 2) < 0 || want(c, 0, PLAN_DTYPE_I32, 1, GRAPH_MAX_RANK - 1) < 0 ||
        want(c, 1, PLAN_DTYPE_F32, 2, 2) < 0)
        return -1;
    const plan_tensor *ids = in(c, 0), *table = in(c, 1);
    int ok = c->t->rank == ids->rank + 1 && last(c->t) == table->dims[1];
    for (int i = 0; ok && i < ids->rank; i++) ok = c->t->dims[i] == ids->dims[i];
    char a[96], b[96], d[96];
    if (!ok)
        return bad(c, "its shape %s is not its ids' %s and a row of its table %s", shape(c->t, a, sizeof a),
                   shape(ids, b, sizeof b), shape(table, d, sizeof d));
    if (ids->op == G_ARANGE && ids->dims[0] > table->dims[0])
        return bad(c, "it looks up rows 0 to %lld of a table of %lld", (long long)ids->dims[0] - 1,
                   (long long)table->dims[0]);
    return 0;
}

static int check_matmul(chk *c)
{
    if (arity(c, 2, 2) < 0 || want(c, 0, PLAN_DTYPE_F32, 1, -1) < 0 || want(c, 1, PLAN_DTYPE_F32, 2, 2) < 0)
        return -1;
    const plan_tensor *x = in(c, 0), *w = in(c, 1);
    int ok = c->t->rank == x->rank && last(x) == w->dims[0] && last(c->t) == w->dims[1];
    for (int i = 0; ok && i + 1 < x->rank; i++) ok = c->t->dims[i] == x->dims[i];
    char a[96], b[96], d[96];
    if (!ok)
        return bad(c, "%s @ %s is not %s", shape(x, a, sizeof a), shape(w, b, sizeof b), shape(c->t, d, sizeof d));
    return 0;
}

static int check_transpose(chk *c)
{
    if (arity(c, 1, 1) < 0 || want(c, 0, PLAN_DTYPE_F32, 2, 2) < 0) return -1;
    const plan_tensor *x = in(c, 0);
    char a[96], b[96];
    if (c->t->rank != 2 || c->t->dims[0] != x->dims[1] || c->t->dims[1] != x->dims[0])
        return bad(c, "its shape %s is not its input's %s transposed", shape(c->t, a, sizeof a),
                   shape(x, b, sizeof b));
    return 0;
}

/* bias_add, add, sub: [..., S] and its suffix S, either way round; mul:
 * the same shapes. */
static int check_binary(chk *c)
{
    if (arity(c, 2, 2) < 0 || floats(c, 0, 0, -1) < 0) return -1;
    const plan_tensor *x = in(c, 0), *y = in(c, 1);
    const plan_tensor *big = x->rank >= y->rank ? x : y, *small = big == x ? y : x;
    int ok = c->t->op == G_MUL ? same_shape(x, y) : 1;
    for (int i = 0; ok && i < small->rank; i++) ok = big->dims[big->rank - small->rank + i] == small->dims[i];
    if (c->t->op == G_BIAS_ADD) ok = ok && small == y && y->rank == 1;
    char a[96], b[96];
    if (!ok) return bad(c, "its inputs' shapes %s and %s do not match", shape(x, a, sizeof a), shape(y, b, sizeof b));
    return as_input(c, big == x ? 0 : 1);
}

static int check_norm(chk *c)
{
    if (arity(c, 2, c->t->op == G_LAYERNORM ? 3 : 2) < 0 || want(c, 0, PLAN_DTYPE_F32, 1, -1) < 0 ||
        floats(c, 1, 1, 1) < 0)
        return -1;
    for (int k = 1; k < c->t->n_in; k++)
        if (in(c, k)->dims[0] != last(in(c, 0)))
            return bad(c, "its %s (tensor %d) has %lld elements, not the rows' %lld", k == 1 ? "weight" : "bias",
                       c->t->in[k], (long long)in(c, k)->dims[0], (long long)last(in(c, 0)));
    if (!(c->t->eps > 0) || !isfinite(c->t->eps)) return bad(c, "eps must be positive");
    return as_input(c, 0);
}

/* heads (and kv_heads) split over tp with the tensor: whole heads a rank */
static int heads_split(chk *c, int64_t heads, const char *what)
{
    int64_t tp = c->p->setup.tp;
    if (c->t->pl.kind[1] == PL_SPLIT && tp > 1 && heads % tp != 0)
        return bad(c, "its %s (%lld) are split over tp = %lld", what, (long long)heads, (long long)tp);
    return 0;
}

static int check_rope(chk *c)
{
    if (arity(c, 1, 1) < 0 || want(c, 0, PLAN_DTYPE_F32, 1, -1) < 0) return -1;
    int64_t h = c->t->heads, w = last(in(c, 0));
    if (h < 1 || w % h != 0 || (w / h) % 2 != 0)
        return bad(c, "its last dimension %lld is not heads (%lld) x an even head size", (long long)w, (long long)h);
    if (!(c->t->theta > 0) || !isfinite(c->t->theta)) return bad(c, "theta must be positive");
    if (heads_split(c, h, "heads") < 0) return -1;
    return as_input(c, 0);
}

static int check_attention(chk *c)
{
    if (arity(c, 1, 3) < 0 || c->t->n_in == 2) return bad(c, "attention takes qkv, or q, k and v: not 2 inputs");
    if (floats(c, 0, 3, 3) < 0) return -1;
    int64_t h = c->t->heads, kv = c->t->kv_heads ? c->t->kv_heads : h;
    if (h < 1 || kv < 1 || h % kv != 0)
        return bad(c, "heads (%lld) must be a positive multiple of kv_heads (%lld)", (long long)h, (long long)kv);
    const plan_tensor *q = in(c, 0);
    int64_t hd;
    if (c->t->n_in == 1) {
        if (last(q) % (h + 2 * kv) != 0)
            return bad(c, "packed qkv's last dimension (%lld) is not (heads + 2 x kv_heads) x a head size",
                       (long long)last(q));
        hd = last(q) / (h + 2 * kv);
    } else {
        if (last(q) % h != 0) return bad(c, "q's last dimension (%lld) is not heads x a head size", (long long)last(q));
        hd = last(q) / h;
        for (int k = 1; k < 3; k++) {
            const plan_tensor *x = in(c, k);
            if (x->dims[0] != q->dims[0] || x->dims[1] != q->dims[1] || last(x) != kv * hd)
                return bad(c, "its %s (tensor %d) is not [%lld, %lld, %lld]", k == 1 ? "k" : "v", c->t->in[k],
                           (long long)q->dims[0], (long long)q->dims[1], (long long)(kv * hd));
        }
    }
    char a[96];
    if (c->t->rank != 3 || c->t->dims[0] != q->dims[0] || c->t->dims[1] != q->dims[1] || c->t->dims[2] != h * hd)
        return bad(c, "its shape %s is not [%lld, %lld, heads x head size = %lld]", shape(c->t, a, sizeof a),
                   (long long)q->dims[0], (long long)q->dims[1], (long long)(h * hd));
    return heads_split(c, h, "heads") < 0 || heads_split(c, kv, "kv_heads") < 0 ? -1 : 0;
}

static int check_moe(chk *c)
{
    int n_w = c->t->act_gelu ? 2 : 3;
    if (arity(c, 2 + n_w, 2 + n_w) < 0 || want(c, 0, PLAN_DTYPE_F32, 1, -1) < 0 ||
        want(c, 1, PLAN_DTYPE_F32, 2, 2) < 0 || floats(c, 2, 3, 3) < 0)
        return -1;
    int64_t dim = last(in(c, 0)), ne = in(c, 1)->dims[1], ffn = in(c, 2)->dims[2];
    if (in(c, 1)->dims[0] != dim)
        return bad(c, "its router (tensor %d) is not [%lld, experts]", c->t->in[1], (long long)dim);
    for (int k = 2; k < c->t->n_in; k++) {
        int down = k == c->t->n_in - 1;
        const plan_tensor *w = in(c, k);
        if (w->dims[0] != ne || w->dims[1] != (down ? ffn : dim) || w->dims[2] != (down ? dim : ffn))
            return bad(c, "its expert weight %d (tensor %d) is not [%lld, %lld, %lld]", k - 1, c->t->in[k],
                       (long long)ne, (long long)(down ? ffn : dim), (long long)(down ? dim : ffn));
    }
    if (c->t->top_k < 1 || c->t->top_k > ne)
        return bad(c, "top_k (%lld) must be from 1 to the experts (%lld)", (long long)c->t->top_k, (long long)ne);
    if (!(c->t->capacity > 0 && c->t->capacity <= 1000)) return bad(c, "capacity must be above 0 and at most 1000");
    if (!(c->t->aux_loss >= 0) || !isfinite(c->t->aux_loss)) return bad(c, "aux_loss must be 0 or more");
    return as_input(c, 0);
}

static int check_cross_entropy(chk *c)
{
    if (arity(c, 2, 2) < 0 || want(c, 0, PLAN_DTYPE_F32, 1, -1) < 0 || want(c, 1, PLAN_DTYPE_I32, 0, -1) < 0)
        return -1;
    const plan_tensor *lg = in(c, 0), *tg = in(c, 1);
    int ok = tg->rank == lg->rank - 1;
    for (int i = 0; ok && i < tg->rank; i++) ok = tg->dims[i] == lg->dims[i];
    char a[96], b[96];
    if (!ok)
        return bad(c, "its targets %s are not its logits' %s leading dimensions", shape(tg, a, sizeof a),
                   shape(lg, b, sizeof b));
    if (c->t->vocab < 0 || c->t->vocab > last(lg))
        return bad(c, "vocab (%lld) must be from 1 to the logits' last dimension (%lld), or 0", (long long)c->t->vocab,
                   (long long)last(lg));
    if (c->t->rank != 0) return bad(c, "a loss is a scalar: shape []");
    return 0;
}

static int check_op(chk *c)
{
    const plan_tensor *t = c->t;
    if (t->dtype != PLAN_DTYPE_F32 && t->op != G_INPUT && t->op != G_ARANGE)
        return bad(c, "its dtype must be f32");
    switch (t->op) {
    case G_INPUT: {
        /* a micro-batch of ids, as the caller gives them (mesh_plan_batch) */
        const fe_setup *s = &c->p->setup;
        char a[96];
        if (t->rank != 2 || t->dims[0] != s->micro_batch || t->dims[1] != s->seq_len)
            return bad(c, "its shape %s is not [micro_batch, seq_len] = [%lld, %lld]", shape(t, a, sizeof a),
                       s->micro_batch, s->seq_len);
        return arity(c, 0, 0);
    }
    case G_PARAM: return arity(c, 0, 0);
    case G_ARANGE:
        if (t->dtype != PLAN_DTYPE_I32 || t->rank != 1) return bad(c, "it must be i32, of rank 1");
        return arity(c, 0, 0);
    case G_EMBED: return check_embed(c);
    case G_MATMUL: return check_matmul(c);
    case G_TRANSPOSE: return check_transpose(c);
    case G_BIAS_ADD:
    case G_ADD:
    case G_SUB:
    case G_MUL: return check_binary(c);
    case G_LAYERNORM:
    case G_RMSNORM: return check_norm(c);
    case G_ROPE: return check_rope(c);
    case G_ATTENTION: return check_attention(c);
    case G_GELU:
    case G_SILU: return arity(c, 1, 1) < 0 || floats(c, 0, 0, -1) < 0 ? -1 : as_input(c, 0);
    case G_SWIGLU:
        if (arity(c, 2, 2) < 0 || floats(c, 0, 0, -1) < 0) return -1;
        return as_input(c, 0) < 0 ? -1 : as_input(c, 1);
    case G_SCALE:
        if (!isfinite(t->scale)) return bad(c, "scale must be a finite number");
        return arity(c, 1, 1) < 0 || floats(c, 0, 0, -1) < 0 ? -1 : as_input(c, 0);
    case G_MOE: return check_moe(c);
    case G_CROSS_ENTROPY: return check_cross_entropy(c);
    case G_OP_COUNT: break;
    }
    return bad(c, "unknown op");
}

/* A dimension split over tp, or a parameter's over ep, divides by it. */
static int check_splits(chk *c)
{
    const plan_tensor *t = c->t;
    const int64_t size[SHARD_AXES] = {c->p->setup.dp, c->p->setup.tp, c->p->setup.pp, c->p->setup.ep};
    for (int a = 1; a < SHARD_AXES; a += 2) {
        if (t->pl.kind[a] != PL_SPLIT || (a == 3 && t->op != G_PARAM)) continue;
        int d = t->pl.dim[a];
        if (size[a] > 0 && t->dims[d] % size[a] != 0)
            return bad(c, "its dimension %d (%lld) is split over %s = %lld", d, (long long)t->dims[d],
                       plan__axis_name(a), (long long)size[a]);
    }
    return 0;
}

int plan_check_tensor(const plan *p, int id, char *msg, size_t n)
{
    chk c = {p, &p->tensors[id], msg, n};
    return check_op(&c) < 0 || check_splits(&c) < 0 ? -1 : 0;
}
