/* check_expr.c — evaluating expressions: exact constant arithmetic, names,
 * tuples and x.shape, constant built-ins, option constructors, and dispatch
 * of tensor operators to check_ops.c and block calls to check_model.c. */
#include <math.h>   /* sqrt, isfinite */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* strtod */
#include <string.h> /* strcmp */

#include "check.h"

const char *value_kind_name(vkind k) {
    switch (k) {
    case V_ERR: return "an erroneous value";
    case V_INT: return "an integer";
    case V_FLOAT: return "a float";
    case V_BOOL: return "a boolean";
    case V_STR: return "a string";
    case V_WORD: return "a word";
    case V_TUPLE: return "a tuple";
    case V_TENSOR: return "a tensor";
    case V_CALL: return "a call";
    }
    return "a value";
}

/* "an integer (12)", "a tensor [8, 64]", for messages. */
const char *value_describe(checker *c, const value *v) {
    switch (v->kind) {
    case V_INT: return arena_printf(c->arena, "an integer (%lld)", (long long)v->i);
    case V_FLOAT: {
        char buf[64];
        /* (range first: converting a float beyond int64's range is undefined) */
        if (v->f > -1e15 && v->f < 1e15 && v->f == (double)(int64_t)v->f) {
            snprintf(buf, sizeof buf, "%.1f", v->f); /* 10000.0, not 1e+04 */
        } else {
            for (int prec = 1; prec <= 17; prec++) {
                snprintf(buf, sizeof buf, "%.*g", prec, v->f);
                if (strtod(buf, NULL) == v->f) break;
            }
        }
        return arena_printf(c->arena, "a float (%s)", buf);
    }
    case V_WORD: return arena_printf(c->arena, "the word '%s'", v->s);
    case V_STR: return arena_printf(c->arena, "a string (\"%.40s\")", v->s);
    case V_TENSOR: return arena_printf(c->arena, "a tensor %s", shape_str(c, v));
    case V_CALL: return arena_printf(c->arena, "a call of '%s'", v->s);
    default: return value_kind_name(v->kind);
    }
}

value value_err(void) {
    value v = {0};
    v.kind = V_ERR;
    v.where = LOC_NONE;
    return v;
}

value value_int(int64_t i, loc where) {
    value v = {0};
    v.kind = V_INT;
    v.i = i;
    v.where = where;
    return v;
}

value value_float(double f, loc where) {
    value v = {0};
    v.kind = V_FLOAT;
    v.f = f;
    v.where = where;
    return v;
}

int value_as_int(checker *c, const value *v, const char *what, int64_t *out) {
    if (v->kind == V_INT) { *out = v->i; return 1; }
    if (v->kind != V_ERR)
        check_error(c, v->where, "%s must be an integer, not %s", what, value_describe(c, v));
    return 0;
}

int value_as_number(checker *c, const value *v, const char *what, double *out) {
    if (v->kind == V_INT) { *out = (double)v->i; return 1; }
    if (v->kind == V_FLOAT) { *out = v->f; return 1; }
    if (v->kind != V_ERR)
        check_error(c, v->where, "%s must be a number, not %s", what, value_describe(c, v));
    return 0;
}

static value int_arith(checker *c, const ast_node *e, int64_t a, int64_t b) {
    int64_t r = 0;
    int bad = 0;
    switch (e->op) {
    case '+': bad = __builtin_add_overflow(a, b, &r); break;
    case '-': bad = __builtin_sub_overflow(a, b, &r); break;
    case '*': bad = __builtin_mul_overflow(a, b, &r); break;
    case '/':
    case '%':
        if (b == 0) {
            check_error(c, e->b->loc, "division by zero");
            return value_err();
        }
        if (a == INT64_MIN && b == -1) { bad = 1; break; }
        if (e->op == '%') {
            if (b < 0) {
                check_error(c, e->b->loc, "the right side of '%%' must be positive, not %lld", (long long)b);
                return value_err();
            }
            r = a % b;
            break;
        }
        if (a % b != 0) {
            check_error(c, e->loc,
                        "%lld / %lld is not a whole number (integer division must be exact; "
                        "use round_up(...) or a float)", (long long)a, (long long)b);
            return value_err();
        }
        r = a / b;
        break;
    default:
        check_error(c, e->loc, "'%c' needs tensors, not integers", e->op);
        return value_err();
    }
    if (bad) {
        check_error(c, e->loc, "integer overflow in '%c' (the result does not fit in 64 bits)", e->op);
        return value_err();
    }
    return value_int(r, e->loc);
}

static value float_arith(checker *c, const ast_node *e, double a, double b) {
    double r;
    switch (e->op) {
    case '+': r = a + b; break;
    case '-': r = a - b; break;
    case '*': r = a * b; break;
    case '/':
        if (b == 0.0) {
            check_error(c, e->b->loc, "division by zero");
            return value_err();
        }
        r = a / b;
        break;
    default:
        check_error(c, e->loc, "'%c' does not apply to numbers", e->op);
        return value_err();
    }
    if (!isfinite(r)) {
        check_error(c, e->loc, "the result is not a finite number");
        return value_err();
    }
    return value_float(r, e->loc);
}

static int is_num(const value *v) { return v->kind == V_INT || v->kind == V_FLOAT; }

static value eval_binary(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    value a = eval(c, s, e->a, mode);
    value b = eval(c, s, e->b, mode);
    if (a.kind == V_ERR || b.kind == V_ERR) return value_err();
    if (a.kind == V_INT && b.kind == V_INT) return int_arith(c, e, a.i, b.i);
    if (is_num(&a) && is_num(&b)) {
        double x = a.kind == V_INT ? (double)a.i : a.f;
        double y = b.kind == V_INT ? (double)b.i : b.f;
        return float_arith(c, e, x, y);
    }
    if (a.kind == V_TENSOR || b.kind == V_TENSOR) {
        if (mode != EVAL_MODEL) {
            check_error(c, e->loc, "tensors exist only inside a model or block");
            return value_err();
        }
        return ops_binary(c, e, &a, &b);
    }
    check_error(c, e->loc, "'%c' does not apply to %s and %s", e->op, value_describe(c, &a),
                value_describe(c, &b));
    return value_err();
}

static value eval_unary(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    value a = eval(c, s, e->a, mode);
    switch (a.kind) {
    case V_ERR: return a;
    case V_INT:
        if (a.i == INT64_MIN) {
            check_error(c, e->loc, "integer overflow in '-'");
            return value_err();
        }
        return value_int(-a.i, e->loc);
    case V_FLOAT: return value_float(-a.f, e->loc);
    default:
        check_error(c, e->loc, "'-' does not apply to %s", value_describe(c, &a));
        return value_err();
    }
}

/* Notes for two common causes of an unknown name: a top-level constant
 * defined further down, and a model constant used outside the model. */
static void explain_unknown(checker *c, const ast_node *e) {
    for (int f = 0; f < c->n_files; f++)
        for (const ast_node *it = c->files[f]->list.first; it; it = it->next) {
            if (it->kind == AST_ASSIGN && strcmp(it->name, e->name) == 0 &&
                (it->loc.src != e->loc.src || it->loc.start > e->loc.start)) {
                check_note(c, it->name_loc, "'%s' is defined later, here; constants must be defined before use",
                           e->name);
                return;
            }
            if (it->kind != AST_MODEL || c->frame) continue;
            for (const ast_node *st = it->list.first; st; st = st->next)
                if (st->kind == AST_ASSIGN && strcmp(st->name, e->name) == 0) {
                    check_note(c, st->name_loc, "'%s' is a constant of model '%s', visible only inside the model; "
                                                "move it to the top level to share it", e->name, it->name);
                    return;
                }
        }
}

static value eval_name(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    binding *b = scope_find(s, e->name);
    if (b) {
        b->used = 1;
        if (b->kind == B_BLOCK) {
            check_error(c, e->loc, "'%s' is a block; call it as %s(...)", e->name, e->name);
            return value_err();
        }
        value v = b->v;
        v.where = e->loc;
        return v;
    }
    if (mode == EVAL_OPTION) {
        value v = {0};
        v.kind = V_WORD;
        v.s = e->name;
        v.where = e->loc;
        return v;
    }
    if (ops_is_builtin(e->name)) {
        check_error(c, e->loc, "'%s' is an op; call it as %s(...)", e->name, e->name);
        return value_err();
    }
    check_unknown_name(c, e->loc, "name", e->name, s, NULL, 0);
    explain_unknown(c, e);
    return value_err();
}

static value eval_tuple(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    value v = {0};
    v.kind = V_TUPLE;
    v.where = e->loc;
    v.n = e->list.n;
    v.elems = arena_alloc(c->arena, (size_t)v.n * sizeof *v.elems);
    int i = 0;
    for (const ast_node *x = e->list.first; x; x = x->next) {
        v.elems[i] = eval(c, s, x, mode);
        if (v.elems[i].kind == V_ERR) return value_err();
        i++;
    }
    return v;
}

static value eval_member(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    value a = eval(c, s, e->a, mode);
    if (a.kind == V_ERR) return a;
    if (a.kind == V_TENSOR && strcmp(e->name, "shape") == 0) {
        value v = {0};
        v.kind = V_TUPLE;
        v.where = e->loc;
        v.n = a.rank;
        v.elems = arena_alloc(c->arena, (size_t)(a.rank ? a.rank : 1) * sizeof *v.elems);
        for (int i = 0; i < a.rank; i++) v.elems[i] = value_int(a.dims[i], e->loc);
        return v;
    }
    if (a.kind == V_TENSOR)
        check_error(c, e->name_loc, "tensors have no member '%s' (only 'shape')", e->name);
    else
        check_error(c, e->name_loc, "%s has no member '%s'", value_describe(c, &a), e->name);
    return value_err();
}

static value eval_index(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    value a = eval(c, s, e->a, mode);
    value i = eval(c, s, e->b, mode);
    if (a.kind == V_ERR || i.kind == V_ERR) return value_err();
    if (a.kind != V_TUPLE) {
        check_error(c, e->a->loc, "only tuples can be indexed, not %s", value_describe(c, &a));
        return value_err();
    }
    int64_t k;
    if (!value_as_int(c, &i, "an index", &k)) return value_err();
    int64_t j = k < 0 ? k + a.n : k;
    if (j < 0 || j >= a.n) {
        check_error(c, e->b->loc, "index %lld is out of range for a tuple of %d element%s",
                    (long long)k, a.n, a.n == 1 ? "" : "s");
        return value_err();
    }
    value v = a.elems[j];
    v.where = e->loc;
    return v;
}

/* Constant built-ins: round_up(n, m), min(a, b), max(a, b), sqrt(x). */
const char *const check_const_fns[CHECK_N_CONST_FNS] = {"round_up", "min", "max", "sqrt"};

static value eval_const_fn(checker *c, scope *s, const ast_node *e, eval_mode mode, int which) {
    int want = which == 3 ? 1 : 2;
    if (e->list.n != want) {
        check_error(c, e->loc, "%s() takes %d argument%s, not %d", e->name, want, want == 1 ? "" : "s",
                    e->list.n);
        return value_err();
    }
    value a[2];
    int k = 0;
    for (const ast_node *x = e->list.first; x; x = x->next) {
        if (x->name) {
            check_error(c, x->name_loc, "%s() takes no named arguments", e->name);
            return value_err();
        }
        a[k] = eval(c, s, x->a, mode == EVAL_MODEL ? EVAL_MODEL : EVAL_CONST);
        if (a[k].kind == V_ERR) return value_err();
        k++;
    }
    if (which == 0) {
        int64_t n, m, r;
        if (!value_as_int(c, &a[0], "round_up's first argument", &n) ||
            !value_as_int(c, &a[1], "round_up's second argument", &m))
            return value_err();
        if (m <= 0) {
            check_error(c, a[1].where, "round_up needs a positive multiple, not %lld", (long long)m);
            return value_err();
        }
        int64_t q = n / m + (n % m > 0);
        if (__builtin_mul_overflow(q, m, &r)) {
            check_error(c, e->loc, "integer overflow in round_up");
            return value_err();
        }
        return value_int(r, e->loc);
    }
    if (which == 3) {
        double x;
        if (!value_as_number(c, &a[0], "sqrt's argument", &x)) return value_err();
        if (x < 0) {
            check_error(c, a[0].where, "sqrt of a negative number");
            return value_err();
        }
        return value_float(sqrt(x), e->loc);
    }
    if (a[0].kind == V_INT && a[1].kind == V_INT) {
        int64_t r = (which == 1) == (a[0].i < a[1].i) ? a[0].i : a[1].i;
        return value_int(r, e->loc);
    }
    double x, y;
    if (!value_as_number(c, &a[0], "the argument", &x) || !value_as_number(c, &a[1], "the argument", &y))
        return value_err();
    return value_float((which == 1) == (x < y) ? x : y, e->loc);
}

/* adamw(lr: 6e-4, ...), cosine(warmup: 700), normal(0.02): kept as a call
 * value; the option that receives it checks the arguments. */
static value eval_option_call(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    value v = {0};
    v.kind = V_CALL;
    v.s = e->name;
    v.where = e->loc;
    v.n = e->list.n;
    v.elems = arena_alloc(c->arena, (size_t)(v.n ? v.n : 1) * sizeof *v.elems);
    v.names = arena_alloc(c->arena, (size_t)(v.n ? v.n : 1) * sizeof *v.names);
    v.locs = arena_alloc(c->arena, (size_t)(v.n ? v.n : 1) * sizeof *v.locs);
    int i = 0;
    for (const ast_node *x = e->list.first; x; x = x->next, i++) {
        v.elems[i] = eval(c, s, x->a, mode);
        v.names[i] = x->name;
        v.locs[i] = x->name ? x->name_loc : x->a->loc;
        if (v.elems[i].kind == V_ERR) return value_err();
    }
    return v;
}

static value eval_call(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    int named = 0;
    for (const ast_node *a = e->list.first; a; a = a->next) {
        if (a->name) named = 1;
        else if (named) {
            check_error(c, a->loc, "a positional argument cannot follow a named one");
            return value_err();
        }
    }
    for (int i = 0; i < CHECK_N_CONST_FNS; i++)
        if (strcmp(e->name, check_const_fns[i]) == 0) return eval_const_fn(c, s, e, mode, i);
    binding *b = scope_find(s, e->name);
    if (mode == EVAL_MODEL) {
        if (b && b->kind == B_BLOCK) return check_block_call(c, s, e, b->node);
        if (ops_is_builtin(e->name)) return ops_call(c, s, e);
        if (b) {
            check_error(c, e->name_loc, "'%s' is not a block or op and cannot be called", e->name);
            return value_err();
        }
        const char *extra[64];
        int n = 0;
        for (int i = 0; i < ops_count && n < 60; i++) extra[n++] = ops_name(i);
        for (int i = 0; i < CHECK_N_CONST_FNS; i++) extra[n++] = check_const_fns[i];
        check_unknown_name(c, e->name_loc, "block or op", e->name, s, extra, n);
        return value_err();
    }
    if (mode == EVAL_OPTION) return eval_option_call(c, s, e, mode);
    if (b && b->kind == B_BLOCK) {
        check_error(c, e->name_loc, "block '%s' can only be called inside a model or block", e->name);
        return value_err();
    }
    if (ops_is_builtin(e->name)) {
        check_error(c, e->name_loc, "op '%s' works on tensors; use it inside a model or block", e->name);
        return value_err();
    }
    check_unknown_name(c, e->name_loc, "function", e->name, NULL, check_const_fns, CHECK_N_CONST_FNS);
    return value_err();
}

value eval(checker *c, scope *s, const ast_node *e, eval_mode mode) {
    if (!e || diag_stopped(c->diag)) return value_err();
    value v = {0};
    switch (e->kind) {
    case AST_INT: return value_int(e->ival, e->loc);
    case AST_FLOAT: return value_float(e->fval, e->loc);
    case AST_BOOL:
        v.kind = V_BOOL;
        v.i = e->ival;
        v.where = e->loc;
        return v;
    case AST_STRING:
        v.kind = V_STR;
        v.s = e->sval;
        v.where = e->loc;
        return v;
    case AST_NAME: return eval_name(c, s, e, mode);
    case AST_UNARY: return eval_unary(c, s, e, mode);
    case AST_BINARY: return eval_binary(c, s, e, mode);
    case AST_CALL: return eval_call(c, s, e, mode);
    case AST_TUPLE: return eval_tuple(c, s, e, mode);
    case AST_MEMBER: return eval_member(c, s, e, mode);
    case AST_INDEX: return eval_index(c, s, e, mode);
    default: return value_err();
    }
}
