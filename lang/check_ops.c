/* check_ops.c — the primitive ops: their arguments and shape rules.
 *
 * Each op has a descriptor (positional arity, named arguments with kinds
 * and defaults) and a shape function. docs/language.md's op table is this
 * file; keep them in step. Divisibility that tensor parallelism needs where
 * an op meets the mesh (heads by tp, vocab rows by tp, experts by ep) is
 * checked here, since only the op knows which dimension means what.
 */
#include <string.h> /* strcmp, memcpy */

#include "check.h"
#include "suggest.h"

enum { OP_MAX_POS = 6, OP_MAX_NAMED = 6 };

typedef struct named_spec {
    const char *name;
    char kind;          /* 'i' int, 'f' number, 'b' bool, 'w' word */
    const char *words;  /* 'w': allowed words, '|'-separated */
    int required;
} named_spec;

typedef struct op_args {
    value pos[OP_MAX_POS];
    int n_pos;
    value named[OP_MAX_NAMED];
    int have[OP_MAX_NAMED];
} op_args;

typedef struct op_desc op_desc;
typedef value (*op_fn)(checker *c, const ast_node *e, const op_desc *d, op_args *a);

struct op_desc {
    const char *name;
    int min_pos, max_pos;
    named_spec named[OP_MAX_NAMED];
    op_fn fn;
};

value tensor_value(int rank, const int64_t *dims, int is_int, loc where) {
    value v = {0};
    v.kind = V_TENSOR;
    v.rank = rank;
    v.is_int = is_int;
    if (rank > 0) memcpy(v.dims, dims, (size_t)rank * sizeof *dims);
    v.where = where;
    return v;
}

/* ---- argument helpers ---- */

static const char *ordinal(int i) {
    static const char *const w[] = {"first", "second", "third", "fourth", "fifth", "sixth"};
    return i < 6 ? w[i] : "next";
}

/* The i-th positional argument must be a float (or int) tensor of rank in
 * [lo, hi]; hi < 0 means no upper bound. */
static int want_tensor(checker *c, const ast_node *e, op_args *a, int i, int is_int, int lo, int hi) {
    const value *v = &a->pos[i];
    if (v->kind == V_ERR) return 0;
    if (v->kind != V_TENSOR) {
        check_error(c, v->where, "the %s argument of %s must be a tensor, not %s", ordinal(i), e->name,
                    value_describe(c, v));
        return 0;
    }
    if (v->is_int != is_int) {
        check_error(c, v->where, "the %s argument of %s must be a%s tensor, not %s %s", ordinal(i),
                    e->name, is_int ? "n int" : " float", v->is_int ? "an int tensor" : "a float tensor",
                    shape_str(c, v));
        return 0;
    }
    if (v->rank < lo || (hi >= 0 && v->rank > hi)) {
        if (lo == hi)
            check_error(c, v->where, "the %s argument of %s must have %d dimension%s, not %s", ordinal(i),
                        e->name, lo, lo == 1 ? "" : "s", shape_str(c, v));
        else
            check_error(c, v->where, "the %s argument of %s must have at least %d dimension%s, not %s",
                        ordinal(i), e->name, lo, lo == 1 ? "" : "s", shape_str(c, v));
        return 0;
    }
    return 1;
}

static int64_t named_int(const op_desc *d, op_args *a, const char *name, int64_t dflt) {
    for (int i = 0; i < OP_MAX_NAMED && d->named[i].name; i++)
        if (strcmp(d->named[i].name, name) == 0 && a->have[i]) return a->named[i].i;
    return dflt;
}

static const value *named_value(const op_desc *d, op_args *a, const char *name) {
    for (int i = 0; i < OP_MAX_NAMED && d->named[i].name; i++)
        if (strcmp(d->named[i].name, name) == 0 && a->have[i]) return &a->named[i];
    return NULL;
}

static const char *named_word(const op_desc *d, op_args *a, const char *name, const char *dflt) {
    const value *v = named_value(d, a, name);
    return v ? v->s : dflt;
}

static int positive(checker *c, const op_desc *d, op_args *a, const char *name) {
    const value *v = named_value(d, a, name);
    if (!v) return 1;
    double x = v->kind == V_INT ? (double)v->i : v->f;
    if (x > 0) return 1;
    check_error(c, v->where, "%s must be positive, not %s", name, value_describe(c, v));
    return 0;
}

static int same_shape(const value *a, const value *b) {
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

/* Does `b` equal the trailing dimensions of `a`? */
static int is_suffix(const value *a, const value *b) {
    if (b->rank > a->rank) return 0;
    for (int i = 0; i < b->rank; i++)
        if (a->dims[a->rank - b->rank + i] != b->dims[i]) return 0;
    return 1;
}

static int64_t last(const value *v) { return v->rank ? v->dims[v->rank - 1] : 0; }

/* ---- shape rules ---- */

static value matmul_shape(checker *c, loc where, const value *x, const value *w) {
    if (x->kind == V_ERR || w->kind == V_ERR) return value_err();
    if (x->rank < 1 || w->rank != 2) {
        check_error(c, where, "matmul needs [..., K] @ [K, N], not %s @ %s", shape_str(c, x), shape_str(c, w));
        return value_err();
    }
    if (x->is_int || w->is_int) {
        check_error(c, where, "matmul needs float tensors, not %s @ %s", shape_str(c, x), shape_str(c, w));
        return value_err();
    }
    if (last(x) != w->dims[0]) {
        check_error(c, where, "matmul inner dimensions differ: %s @ %s (%lld vs %lld)", shape_str(c, x),
                    shape_str(c, w), (long long)last(x), (long long)w->dims[0]);
        return value_err();
    }
    value r = *x;
    r.dims[r.rank - 1] = w->dims[1];
    r.where = where;
    return r;
}

static value op_matmul(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    (void)d;
    return matmul_shape(c, e->loc, &a->pos[0], &a->pos[1]);
}

static value op_transpose(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    (void)d;
    if (!want_tensor(c, e, a, 0, 0, 2, 2)) return value_err();
    value r = a->pos[0];
    r.dims[0] = a->pos[0].dims[1];
    r.dims[1] = a->pos[0].dims[0];
    r.where = e->loc;
    return r;
}

static value op_linear(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    value r = matmul_shape(c, e->loc, &a->pos[0], &a->pos[1]);
    if (r.kind == V_ERR || a->n_pos < 3) return r;
    if (!want_tensor(c, e, a, 2, 0, 1, 1)) return value_err();
    if (a->pos[2].dims[0] != last(&r)) {
        check_error(c, a->pos[2].where, "linear's bias must be [%lld], not %s", (long long)last(&r),
                    shape_str(c, &a->pos[2]));
        return value_err();
    }
    (void)d;
    return r;
}

static value op_embed(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    (void)d;
    if (!want_tensor(c, e, a, 0, 1, 1, VALUE_MAX_RANK - 1) || !want_tensor(c, e, a, 1, 0, 2, 2))
        return value_err();
    const value *ids = &a->pos[0], *table = &a->pos[1];
    if (ids->i > table->dims[0]) {
        check_error(c, e->loc, "embed looks up rows 0..%lld, but the table has %lld rows",
                    (long long)ids->i - 1, (long long)table->dims[0]);
        return value_err();
    }
    /* An unannotated token embedding gets Megatron's vocab-parallel layout;
     * a position table (ids from arange) stays replicated. */
    int64_t tp = c->axis[AX_TP];
    int vocab_parallel = ids->i == 0 && !(table->placed_axes & (1u << AX_TP));
    if (vocab_parallel && tp > 1 && table->dims[0] % tp != 0)
        check_error(c, table->where,
                    "the token embedding table has %lld rows, not divisible by tp = %lld: with tp > 1 an "
                    "unannotated token embedding is split by vocabulary; pad its rows (round_up(rows, 128)) "
                    "or annotate it @replicate(tp)", (long long)table->dims[0], (long long)tp);
    value r = *ids;
    r.is_int = 0;
    r.i = 0;
    r.split_axes = r.placed_axes = 0;
    r.dims[r.rank++] = table->dims[1];
    r.where = e->loc;
    return r;
}

static value op_arange(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    (void)d;
    int64_t n;
    if (!value_as_int(c, &a->pos[0], "arange's length", &n)) return value_err();
    if (n <= 0) {
        check_error(c, a->pos[0].where, "arange needs a positive length, not %lld", (long long)n);
        return value_err();
    }
    value r = tensor_value(1, &n, 1, e->loc);
    r.i = n; /* the largest index + 1, checked by embed */
    return r;
}

static value op_norm(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    if (!want_tensor(c, e, a, 0, 0, 1, -1)) return value_err();
    int64_t dim = last(&a->pos[0]);
    for (int i = 1; i < a->n_pos; i++) {
        if (!want_tensor(c, e, a, i, 0, 1, 1)) return value_err();
        if (a->pos[i].dims[0] != dim) {
            check_error(c, a->pos[i].where, "%s's %s must be [%lld] to match the input %s, not %s", e->name,
                        i == 1 ? "weight" : "bias", (long long)dim, shape_str(c, &a->pos[0]),
                        shape_str(c, &a->pos[i]));
            return value_err();
        }
    }
    if (!positive(c, d, a, "eps")) return value_err();
    value r = a->pos[0];
    r.where = e->loc;
    return r;
}

static value op_rope(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    if (!want_tensor(c, e, a, 0, 0, 1, -1)) return value_err();
    if (!positive(c, d, a, "heads") || !positive(c, d, a, "theta")) return value_err();
    int64_t h = named_int(d, a, "heads", 1), w = last(&a->pos[0]);
    if (w % h != 0 || (w / h) % 2 != 0) {
        check_error(c, e->loc, "rope needs a last dimension of heads x an even head size; %lld is not "
                               "divisible by 2 x %lld", (long long)w, (long long)h);
        return value_err();
    }
    value r = a->pos[0];
    r.where = e->loc;
    return r;
}

static int check_heads_tp(checker *c, const ast_node *e, const char *what, int64_t n) {
    int64_t tp = c->axis[AX_TP];
    if (tp > 1 && n % tp != 0) {
        check_error(c, e->loc, "%s = %lld is not divisible by tp = %lld (tensor parallelism splits "
                               "attention heads)", what, (long long)n, (long long)tp);
        return 0;
    }
    return 1;
}

static value op_attention(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    if (a->n_pos == 2) {
        check_error(c, e->loc, "attention takes (qkv) or (q, k, v), not 2 tensors");
        return value_err();
    }
    for (int i = 0; i < a->n_pos; i++)
        if (!want_tensor(c, e, a, i, 0, 3, 3)) return value_err();
    if (!positive(c, d, a, "heads") || !positive(c, d, a, "kv_heads")) return value_err();
    int64_t h = named_int(d, a, "heads", 1), kv = named_int(d, a, "kv_heads", h);
    if (h % kv != 0) {
        check_error(c, e->loc, "heads (%lld) must be a multiple of kv_heads (%lld)", (long long)h, (long long)kv);
        return value_err();
    }
    const value *q = &a->pos[0];
    int64_t hd;
    if (a->n_pos == 1) {
        if (last(q) % (h + 2 * kv) != 0) {
            check_error(c, q->where, "packed qkv's last dimension (%lld) must be (heads + 2 x kv_heads) "
                                     "x head size = %lld x head size", (long long)last(q),
                        (long long)(h + 2 * kv));
            return value_err();
        }
        hd = last(q) / (h + 2 * kv);
    } else {
        if (last(q) % h != 0) {
            check_error(c, q->where, "q's last dimension (%lld) is not divisible by heads = %lld",
                        (long long)last(q), (long long)h);
            return value_err();
        }
        hd = last(q) / h;
        for (int i = 1; i < 3; i++) {
            const value *k = &a->pos[i];
            if (k->dims[0] != q->dims[0] || k->dims[1] != q->dims[1] || last(k) != kv * hd) {
                int64_t want[3] = {q->dims[0], q->dims[1], kv * hd};
                value w = tensor_value(3, want, 0, k->where);
                check_error(c, k->where, "attention's %s must be %s (kv_heads x head size), not %s",
                            i == 1 ? "k" : "v", shape_str(c, &w), shape_str(c, k));
                return value_err();
            }
        }
    }
    if (!check_heads_tp(c, e, "heads", h) || !check_heads_tp(c, e, "kv_heads", kv)) return value_err();
    value r = *q;
    r.dims[2] = h * hd;
    r.where = e->loc;
    return r;
}

static value op_pointwise(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    (void)d;
    if (!want_tensor(c, e, a, 0, 0, 0, -1)) return value_err();
    value r = a->pos[0];
    r.where = e->loc;
    return r;
}

static value op_swiglu(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    (void)d;
    if (!want_tensor(c, e, a, 0, 0, 0, -1) || !want_tensor(c, e, a, 1, 0, 0, -1)) return value_err();
    if (!same_shape(&a->pos[0], &a->pos[1])) {
        check_error(c, e->loc, "swiglu's gate and up must have the same shape, not %s and %s",
                    shape_str(c, &a->pos[0]), shape_str(c, &a->pos[1]));
        return value_err();
    }
    value r = a->pos[0];
    r.where = e->loc;
    return r;
}

static value op_moe(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    c->has_moe = 1; /* even if the call has errors: no "model has no moe layer" warning */
    const char *act = named_word(d, a, "act", "swiglu");
    int n_w = strcmp(act, "gelu") == 0 ? 2 : 3;
    if (a->n_pos != 2 + n_w) {
        check_error(c, e->loc, "moe with act: %s takes x, router and %d expert weights (%s), not %d "
                               "arguments", act, n_w, n_w == 3 ? "w_gate, w_up, w_down" : "w_fc, w_out",
                    a->n_pos);
        return value_err();
    }
    if (!want_tensor(c, e, a, 0, 0, 1, -1) || !want_tensor(c, e, a, 1, 0, 2, 2)) return value_err();
    for (int i = 2; i < a->n_pos; i++)
        if (!want_tensor(c, e, a, i, 0, 3, 3)) return value_err();
    int64_t dim = last(&a->pos[0]);
    const value *router = &a->pos[1];
    if (router->dims[0] != dim) {
        check_error(c, router->where, "the router must be [%lld, experts] for inputs %s, not %s",
                    (long long)dim, shape_str(c, &a->pos[0]), shape_str(c, router));
        return value_err();
    }
    int64_t ne = router->dims[1], ffn = a->pos[2].dims[2];
    for (int i = 2; i < a->n_pos; i++) {
        int down = i == a->n_pos - 1;
        int64_t want[3] = {ne, down ? ffn : dim, down ? dim : ffn};
        value w = tensor_value(3, want, 0, a->pos[i].where);
        if (!same_shape(&w, &a->pos[i])) {
            check_error(c, a->pos[i].where, "expert weight %d must be %s ([experts, %s]), not %s", i - 1,
                        shape_str(c, &w), down ? "ffn, dim" : "dim, ffn", shape_str(c, &a->pos[i]));
            return value_err();
        }
    }
    const value *k = named_value(d, a, "top_k");
    int64_t top_k = k ? k->i : 2;
    if (top_k < 1 || top_k > ne) {
        check_error(c, k ? k->where : e->loc, "top_k%s must be between 1 and the number of experts (%lld), not %lld",
                    k ? "" : " (default 2)", (long long)ne, (long long)top_k);
        return value_err();
    }
    if (!positive(c, d, a, "capacity")) return value_err();
    const value *cap = named_value(d, a, "capacity"); /* bounded: the buffers' rows are counted in int64 */
    if (cap && (cap->kind == V_INT ? (double)cap->i : cap->f) > 1000) {
        check_error(c, cap->where, "capacity must be at most 1000 (a factor of experts / top_k = %g already keeps "
                    "every token), not %s", (double)ne / (double)top_k, value_describe(c, cap));
        return value_err();
    }
    const value *aux = named_value(d, a, "aux_loss");
    if (aux && (aux->kind == V_INT ? (double)aux->i : aux->f) < 0) {
        check_error(c, aux->where, "aux_loss must not be negative");
        return value_err();
    }
    int64_t ep = c->axis[AX_EP];
    int annotated = (a->pos[2].split_axes >> AX_EP) & 1; /* its annotation reported it already */
    if (ep > 1 && ne % ep != 0 && !annotated) {
        check_error(c, router->where, "%lld experts cannot be split evenly over ep = %lld", (long long)ne,
                    (long long)ep);
        return value_err();
    }
    value r = a->pos[0];
    r.where = e->loc;
    return r;
}

static value op_cross_entropy(checker *c, const ast_node *e, const op_desc *d, op_args *a) {
    if (!want_tensor(c, e, a, 0, 0, 1, -1) || !want_tensor(c, e, a, 1, 1, 0, -1)) return value_err();
    const value *lg = &a->pos[0], *t = &a->pos[1];
    int ok = t->rank == lg->rank - 1;
    for (int i = 0; ok && i < t->rank; i++) ok = t->dims[i] == lg->dims[i];
    if (!ok) {
        check_error(c, e->loc, "cross_entropy's targets must have the logits' leading dimensions: "
                               "logits %s, targets %s", shape_str(c, lg), shape_str(c, t));
        return value_err();
    }
    const value *v = named_value(d, a, "vocab");
    if (v && (v->i < 1 || v->i > last(lg))) {
        check_error(c, v->where, "vocab must be between 1 and the logits' last dimension (%lld), not %lld",
                    (long long)last(lg), (long long)v->i);
        return value_err();
    }
    return tensor_value(0, NULL, 0, e->loc);
}

/* ---- the table ---- */

static const op_desc ops[] = {
    {"embed", 2, 2, {{0}}, op_embed},
    {"arange", 1, 1, {{0}}, op_arange},
    {"matmul", 2, 2, {{0}}, op_matmul},
    {"transpose", 1, 1, {{0}}, op_transpose},
    {"linear", 2, 3, {{0}}, op_linear},
    {"layernorm", 2, 3, {{"eps", 'f', NULL, 0}}, op_norm},
    {"rmsnorm", 2, 2, {{"eps", 'f', NULL, 0}}, op_norm},
    {"rope", 1, 1, {{"heads", 'i', NULL, 1}, {"theta", 'f', NULL, 0}}, op_rope},
    {"attention", 1, 3,
     {{"heads", 'i', NULL, 1}, {"kv_heads", 'i', NULL, 0}, {"causal", 'b', NULL, 0}}, op_attention},
    {"gelu", 1, 1, {{0}}, op_pointwise},
    {"silu", 1, 1, {{0}}, op_pointwise},
    {"swiglu", 2, 2, {{0}}, op_swiglu},
    {"moe", 4, 5,
     {{"top_k", 'i', NULL, 0},
      {"capacity", 'f', NULL, 0},
      {"act", 'w', "swiglu|gelu", 0},
      {"aux_loss", 'f', NULL, 0}},
     op_moe},
    {"cross_entropy", 2, 2, {{"vocab", 'i', NULL, 0}}, op_cross_entropy},
};

const int ops_count = (int)(sizeof ops / sizeof ops[0]);

const char *ops_name(int i) { return i >= 0 && i < ops_count ? ops[i].name : NULL; }

static const op_desc *find_op(const char *name) {
    for (int i = 0; i < ops_count; i++)
        if (strcmp(ops[i].name, name) == 0) return &ops[i];
    return NULL;
}

int ops_is_builtin(const char *name) { return find_op(name) != NULL; }

static int word_allowed(const char *words, const char *w) {
    size_t n = strlen(w);
    for (const char *p = words; *p;) {
        const char *q = strchr(p, '|');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && strncmp(p, w, n) == 0) return 1;
        if (!q) break;
        p = q + 1;
    }
    return 0;
}

/* Evaluates and kind-checks one named argument. */
static int named_arg(checker *c, scope *s, const ast_node *e, const named_spec *ns, const ast_node *arg,
                     value *out) {
    if (ns->kind == 'w') {
        const char *w = arg->a->kind == AST_NAME ? arg->a->name : arg->a->kind == AST_STRING ? arg->a->sval : NULL;
        if (!w || !word_allowed(ns->words, w)) {
            check_error(c, arg->a->loc, "%s's %s must be one of: %s", e->name, ns->name, ns->words);
            return 0;
        }
        *out = (value){0};
        out->kind = V_WORD;
        out->s = w;
        out->where = arg->a->loc;
        return 1;
    }
    *out = eval(c, s, arg->a, EVAL_MODEL);
    if (out->kind == V_ERR) return 0;
    int ok = (ns->kind == 'i' && out->kind == V_INT) ||
             (ns->kind == 'f' && (out->kind == V_INT || out->kind == V_FLOAT)) ||
             (ns->kind == 'b' && out->kind == V_BOOL);
    if (!ok) {
        const char *want = ns->kind == 'i' ? "an integer" : ns->kind == 'f' ? "a number" : "true or false";
        check_error(c, out->where, "%s's %s must be %s, not %s", e->name, ns->name, want,
                    value_describe(c, out));
    }
    return ok;
}

value ops_call(checker *c, scope *s, const ast_node *e) {
    const op_desc *d = find_op(e->name);
    op_args a;
    memset(&a, 0, sizeof a);
    int ok = 1, n_args = 0;
    for (const ast_node *arg = e->list.first; arg; arg = arg->next) {
        if (!arg->name) {
            n_args++;
            if (a.n_pos < OP_MAX_POS) a.pos[a.n_pos] = eval(c, s, arg->a, EVAL_MODEL);
            if (a.n_pos < OP_MAX_POS && a.pos[a.n_pos].kind == V_ERR) ok = 0;
            a.n_pos++;
            continue;
        }
        int k = -1;
        for (int i = 0; i < OP_MAX_NAMED && d->named[i].name; i++)
            if (strcmp(d->named[i].name, arg->name) == 0) k = i;
        if (k < 0) {
            suggest sg;
            suggest_init(&sg, arg->name);
            for (int i = 0; i < OP_MAX_NAMED && d->named[i].name; i++) suggest_offer(&sg, d->named[i].name);
            const char *best = suggest_result(&sg);
            if (best)
                check_error(c, arg->name_loc, "%s has no argument '%s'; did you mean '%s'?", e->name, arg->name,
                            best);
            else if (d->named[0].name)
                check_error(c, arg->name_loc, "%s has no argument '%s'", e->name, arg->name);
            else
                check_error(c, arg->name_loc, "%s takes no named arguments", e->name);
            ok = 0;
            continue;
        }
        if (a.have[k]) {
            check_error(c, arg->name_loc, "argument '%s' is given twice", arg->name);
            ok = 0;
            continue;
        }
        if (named_arg(c, s, e, &d->named[k], arg, &a.named[k])) a.have[k] = 1; else ok = 0;
    }
    if (n_args < d->min_pos || n_args > d->max_pos) {
        if (d->min_pos == d->max_pos)
            check_error(c, e->loc, "%s takes %d tensor argument%s, not %d", e->name, d->min_pos,
                        d->min_pos == 1 ? "" : "s", n_args);
        else
            check_error(c, e->loc, "%s takes %d to %d tensor arguments, not %d", e->name, d->min_pos,
                        d->max_pos, n_args);
        return value_err();
    }
    for (int i = 0; i < OP_MAX_NAMED && d->named[i].name; i++)
        if (d->named[i].required && !a.have[i] && ok) {
            check_error(c, e->loc, "%s needs the argument '%s:'", e->name, d->named[i].name);
            ok = 0;
        }
    if (!ok) return value_err();
    value r = d->fn(c, e, d, &a);
    const value *named[OP_MAX_NAMED];
    const char *names[OP_MAX_NAMED];
    int n_named = 0;
    for (int i = 0; i < OP_MAX_NAMED && d->named[i].name; i++) {
        named[n_named] = a.have[i] ? &a.named[i] : NULL;
        names[n_named++] = d->named[i].name;
    }
    graph_note_op(c, e, &r, a.pos, a.n_pos < OP_MAX_POS ? a.n_pos : OP_MAX_POS, named, names, n_named);
    return r;
}

/* Tensor operators: a @ b, a + b, a - b, a * b, a / n. */
static value binary_shape(checker *c, const ast_node *e, const value *a, const value *b);

value ops_binary(checker *c, const ast_node *e, const value *a, const value *b) {
    value r = binary_shape(c, e, a, b);
    graph_note_binary(c, e->op, &r, a, b);
    return r;
}

static value binary_shape(checker *c, const ast_node *e, const value *a, const value *b) {
    if (e->op == '@') {
        if (a->kind != V_TENSOR || b->kind != V_TENSOR) {
            check_error(c, e->loc, "'@' multiplies two tensors, not %s and %s", value_describe(c, a),
                        value_describe(c, b));
            return value_err();
        }
        return matmul_shape(c, e->loc, a, b);
    }
    if (a->kind == V_TENSOR && b->kind == V_TENSOR) {
        if (e->op == '/' || e->op == '%') {
            check_error(c, e->loc, "'%c' between two tensors is not an op; divide by a number", e->op);
            return value_err();
        }
        if (a->is_int || b->is_int) {
            check_error(c, e->loc, "'%c' needs float tensors, not %s and %s", e->op, shape_str(c, a),
                        shape_str(c, b));
            return value_err();
        }
        const value *big = a->rank >= b->rank ? a : b, *small = big == a ? b : a;
        int fits = e->op == '*' ? same_shape(a, b) : is_suffix(big, small);
        if (!fits) {
            check_error(c, e->loc, "shapes do not match for '%c': %s and %s", e->op, shape_str(c, a),
                        shape_str(c, b));
            return value_err();
        }
        value r = *big;
        r.where = e->loc;
        return r;
    }
    const value *t = a->kind == V_TENSOR ? a : b, *n = t == a ? b : a;
    int scalar_ok = (e->op == '*' || (e->op == '/' && t == a)) && (n->kind == V_INT || n->kind == V_FLOAT);
    if (!scalar_ok || t->is_int) {
        check_error(c, e->loc, "'%c' does not apply to %s and %s", e->op, value_describe(c, a),
                    value_describe(c, b));
        return value_err();
    }
    value r = *t;
    r.where = e->loc;
    return r;
}
