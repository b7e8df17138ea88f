/* check_model.c — evaluating the model body and inlining block calls.
 *
 * The model is run symbolically with concrete shapes: every statement once,
 * a `repeat` body once (its parameters count N times), each block call by
 * binding its arguments in a fresh scope and running its body. Parameters
 * get their global names here (docs/language.md, "Parameter names").
 */
#include <stdio.h>  /* sscanf */
#include <string.h> /* strcmp, strncmp */

#include "check.h"
#include "suggest.h"

typedef struct exec_ctx {
    frame *fr;
    scope *repeat_scope; /* innermost repeat body scope, NULL outside repeats */
    int in_block;
    value ret;
    int returned;
} exec_ctx;

static void exec_stmts(checker *c, scope *s, const ast_list *stmts, exec_ctx *x);

static int budget(checker *c, loc at) {
    if (c->work < 0) return 0;
    if (++c->work <= CHECK_MAX_WORK) return 1;
    check_error(c, at, "the model is too large to check (more than %d statements after inlining blocks)",
                CHECK_MAX_WORK);
    c->work = -1;
    return 0;
}

/* Finds the binding an assignment updates: the scope chain up to the
 * enclosing model or block body. */
static binding *find_assignable(scope *s, const char *name, scope **where) {
    for (; s; s = s->parent) {
        binding *b = scope_find_local(s, name);
        if (b) { *where = s; return b; }
        if (s->barrier) break;
    }
    return NULL;
}

static int axis_of(checker *c, const ast_node *an) {
    for (int i = 0; i < AX_COUNT; i++)
        if (strcmp(an->name, axis_names[i]) == 0) return i;
    check_unknown_name(c, an->name_loc, "mesh axis", an->name, NULL, axis_names, AX_COUNT);
    return -1;
}

/* Checks @split/@replicate annotations against the tensor and the mesh;
 * fills `out` (up to 4) and returns how many. */
static int check_annots(checker *c, scope *s, const ast_list *annots, const value *v, const char *what,
                        placement *out) {
    int n = 0;
    if (annots->n == 0) return 0;
    if (v->kind == V_ERR) return 0;
    if (v->kind != V_TENSOR) {
        check_error(c, annots->first->loc, "annotations apply to tensors, and '%s' is %s", what,
                    value_describe(c, v));
        return 0;
    }
    const ast_node *seen[AX_COUNT] = {0};
    int64_t split_by[VALUE_MAX_RANK];
    const char *split_names[VALUE_MAX_RANK] = {0};
    for (int i = 0; i < VALUE_MAX_RANK; i++) split_by[i] = 1;
    for (const ast_node *an = annots->first; an; an = an->next) {
        int ax = axis_of(c, an);
        if (ax < 0) continue;
        if (seen[ax]) {
            check_error(c, an->loc, "'%s' is placed over %s twice", what, axis_names[ax]);
            check_note(c, seen[ax]->loc, "first placement is here");
            continue;
        }
        seen[ax] = an;
        placement p = {ax, -1};
        if (an->op == 's') {
            if (ax == AX_PP) {
                check_error(c, an->name_loc, "tensors cannot be split over pp: pipeline stages split the "
                                             "layer stack, not tensors");
                continue;
            }
            value dv = eval(c, s, an->a, EVAL_MODEL);
            int64_t d;
            if (!value_as_int(c, &dv, "the split dimension", &d)) continue;
            int64_t nd = d < 0 ? d + v->rank : d;
            if (nd < 0 || nd >= v->rank) {
                check_error(c, an->a->loc, "dimension %lld is out of range for '%s' %s", (long long)d, what,
                            shape_str(c, v));
                continue;
            }
            int64_t size = c->axis[ax] > 0 ? c->axis[ax] : 1;
            const char *before = split_names[nd];
            split_by[nd] *= size;
            split_names[nd] = before ? arena_printf(c->arena, "%s x %s", before, axis_names[ax]) : axis_names[ax];
            if (v->dims[nd] % split_by[nd] != 0)
                check_error(c, an->loc, "dimension %lld of '%s' (%lld) is not divisible by %s = %lld",
                            (long long)nd, what, (long long)v->dims[nd], split_names[nd], (long long)split_by[nd]);
            p.dim = (int)nd; /* recorded even when it does not divide: no second error downstream */
        }
        if (n < 4) out[n++] = p;
    }
    return n;
}

static int64_t dims_of_type(checker *c, scope *s, const ast_node *type, value *t, const char *what) {
    int rank = 0;
    int ok = 1;
    if (type->list.n > VALUE_MAX_RANK) {
        check_error(c, type->loc, "'%s' has %d dimensions; at most %d are supported", what, type->list.n,
                    VALUE_MAX_RANK);
        return 0;
    }
    for (const ast_node *d = type->list.first; d; d = d->next) {
        value dv = eval(c, s, d, EVAL_MODEL);
        int64_t n = 0;
        if (!value_as_int(c, &dv, "a dimension", &n)) { ok = 0; continue; }
        if (n <= 0) {
            check_error(c, d->loc, "dimensions must be positive, not %lld", (long long)n);
            ok = 0;
            continue;
        }
        t->dims[rank++] = n;
    }
    t->rank = rank;
    return ok;
}

static const char *init_text(checker *c, scope *s, const ast_node *pdecl, int rank) {
    if (!pdecl->b) return rank == 1 ? "zeros" : "normal(0.02)";
    value v = eval(c, s, pdecl->b, EVAL_OPTION);
    if (v.kind == V_ERR) return NULL;
    if (v.kind == V_WORD && (strcmp(v.s, "zeros") == 0 || strcmp(v.s, "ones") == 0)) return v.s;
    if (v.kind == V_CALL && strcmp(v.s, "normal") == 0) {
        double std;
        if (v.n != 1 || (v.names[0] && strcmp(v.names[0], "std") != 0)) {
            check_error(c, v.where, "normal takes one argument, the standard deviation: normal(0.02)");
            return NULL;
        }
        if (!value_as_number(c, &v.elems[0], "the standard deviation", &std)) return NULL;
        if (std <= 0) {
            check_error(c, v.elems[0].where, "the standard deviation must be positive");
            return NULL;
        }
        return arena_printf(c->arena, "normal(%.9g)", std);
    }
    if (v.kind == V_WORD || v.kind == V_CALL)
        check_error(c, pdecl->b->loc, "unknown initialisation '%s'; use normal(std), zeros or ones", v.s);
    else
        check_error(c, pdecl->b->loc, "an initialisation must be normal(std), zeros or ones, not %s",
                    value_describe(c, &v));
    return NULL;
}

static const pinfo *record_param(checker *c, exec_ctx *x, const ast_node *st, const value *t, placement *pl,
                                 int npl, const char *init) {
    pinfo *p = arena_alloc(c->arena, sizeof *p);
    p->name = arena_printf(c->arena, "%s%s", x->fr->prefix, st->name);
    p->shape = *t;
    p->mult = x->fr->mult;
    for (int i = 0; i < npl; i++) p->place[i] = pl[i];
    p->n_place = npl;
    p->init = init;
    *c->params_tail = p;
    c->params_tail = &p->next;
    c->n_params++;
    int64_t numel = 1;
    int bad = 0;
    for (int i = 0; i < t->rank; i++) bad |= __builtin_mul_overflow(numel, t->dims[i], &numel);
    bad |= __builtin_mul_overflow(numel, p->mult, &numel);
    bad |= __builtin_add_overflow(c->total_params, numel, &c->total_params);
    if (bad && !c->params_overflow) {
        check_error(c, st->loc, "the parameter count overflows 64 bits");
        c->params_overflow = 1;
    }
    return p;
}

static int declare(checker *c, scope *s, const ast_node *st, const char *what) {
    binding *prev = scope_find_local(s, st->name);
    if (!prev) return 1;
    check_error(c, st->name_loc, "%s '%s' is already defined", what, st->name);
    check_note(c, prev->decl, "previous definition is here");
    return 0;
}

static void exec_param(checker *c, scope *s, const ast_node *st, exec_ctx *x) {
    value t = {0};
    t.kind = V_TENSOR;
    t.where = st->name_loc;
    const ast_node *ty = st->a;
    if (ty->name && strcmp(ty->name, "float") != 0) {
        check_error(c, ty->name_loc, "parameters are float tensors; '%s' is not allowed here", ty->name);
        return;
    }
    if (!dims_of_type(c, s, ty, &t, st->name)) t.kind = V_ERR;
    if (t.kind == V_TENSOR && t.rank == 0) {
        check_error(c, ty->loc, "parameter '%s' needs at least one dimension", st->name);
        t.kind = V_ERR;
    }
    const char *init = t.kind == V_TENSOR ? init_text(c, s, st, t.rank) : NULL;
    placement pl[4];
    int npl = check_annots(c, s, &st->list, &t, st->name, pl);
    for (int i = 0; i < npl; i++) {
        t.placed_axes |= 1u << pl[i].axis;
        if (pl[i].dim >= 0) t.split_axes |= 1u << pl[i].axis;
    }
    if (!declare(c, s, st, "parameter")) return;
    if (t.kind == V_TENSOR) {
        const pinfo *p = record_param(c, x, st, &t, pl, npl, init ? init : "?");
        g_node gn = {0};
        gn.op = G_PARAM;
        gn.name = p->name;
        gn.where = st->name_loc;
        gn.annotated = npl > 0;
        gn.init = strncmp(p->init, "zeros", 5) == 0 ? GRAPH_INIT_ZEROS
                : strncmp(p->init, "ones", 4) == 0 ? GRAPH_INIT_ONES : GRAPH_INIT_NORMAL;
        if (gn.init == GRAPH_INIT_NORMAL && sscanf(p->init, "normal(%lf)", &gn.init_std) != 1) gn.init_std = 0.02;
        for (int i = 0; i < npl; i++) gn.annot[gn.n_annot++] = (g_annot){pl[i].axis, pl[i].dim};
        graph_note_tensor(c, &t, &gn);
    }
    binding *b = scope_add(c, s, st->name, B_PARAM, st->name_loc);
    b->v = t;
    b->node = st;
}

static void exec_input(checker *c, scope *s, const ast_node *st, exec_ctx *x) {
    if (x->in_block || x->repeat_scope) {
        check_error(c, st->loc, "inputs can only be declared in the model body, not inside a %s",
                    x->repeat_scope ? "repeat" : "block");
        if (!scope_find_local(s, st->name)) scope_add(c, s, st->name, B_TENSOR, st->name_loc)->v = value_err();
        return;
    }
    if (st->list.n)
        check_error(c, st->list.first->loc, "inputs cannot be annotated: the batch dimension of every input "
                                            "is split over dp by the compiler");
    value t = {0};
    t.kind = V_TENSOR;
    t.where = st->name_loc;
    const ast_node *ty = st->a;
    if (ty->name && strcmp(ty->name, "int") != 0 && strcmp(ty->name, "float") != 0) {
        static const char *const dts[] = {"int", "float"};
        check_unknown_name(c, ty->name_loc, "dtype", ty->name, NULL, dts, 2);
        t.kind = V_ERR;
    }
    t.is_int = ty->name && strcmp(ty->name, "int") == 0;
    if (!dims_of_type(c, s, ty, &t, st->name)) t.kind = V_ERR;
    if (!declare(c, s, st, "input")) return;
    g_node gn = {0};
    gn.op = G_INPUT;
    gn.name = st->name;
    gn.where = st->name_loc;
    graph_note_tensor(c, &t, &gn);
    binding *b = scope_add(c, s, st->name, B_INPUT, st->name_loc);
    b->v = t;
    b->node = st;
}

/* The --set of a model constant, `model.KEY` or `MODELNAME.KEY`: the last
 * given of either spelling. */
static const set_item *model_set(checker *c, const char *key) {
    const set_item *it = check_find_set(c, "model", key);
    const set_item *named = c->model_node ? check_find_set(c, c->model_node->name, key) : NULL;
    return !it || (named && named > it) ? named : it; /* c->sets is in command-line order */
}

static void exec_assign(checker *c, scope *s, const ast_node *st, exec_ctx *x) {
    const ast_node *rhs = st->a;
    if (!x->in_block && !x->repeat_scope) {
        const set_item *ov = model_set(c, st->name);
        if (ov) rhs = ov->value;
    }
    value v = eval(c, s, rhs, EVAL_MODEL);
    placement pl[4];
    int npl = check_annots(c, s, &st->list, &v, st->name, pl);
    if (npl && c->graph && v.kind == V_TENSOR && v.node > 0) {
        g_node *gn = &c->graph->nodes[v.node - 1];
        gn->annotated = 1;
        gn->n_annot = 0;
        for (int i = 0; i < npl; i++) gn->annot[gn->n_annot++] = (g_annot){pl[i].axis, pl[i].dim};
    }
    scope *where = NULL;
    binding *b = find_assignable(s, st->name, &where);
    if (b) {
        if (b->kind == B_PARAM || b->kind == B_INPUT) {
            check_error(c, st->name_loc, "cannot assign to %s '%s'", b->kind == B_PARAM ? "parameter" : "input",
                        st->name);
            check_note(c, b->decl, "declared here");
            return;
        }
        if (b->kind == B_CONST && b->decl.src < 0) {
            check_error(c, st->name_loc, "'%s' is built in (the train section's %s) and cannot be rebound",
                        st->name, strcmp(st->name, "batch") == 0 ? "micro_batch" : "seq_len");
            return;
        }
        if (b->kind == B_CONST && b->v.kind != V_ERR) {
            check_error(c, st->name_loc, "'%s' is a constant and is already defined", st->name);
            check_note(c, b->decl, "previous definition is here");
            return;
        }
        if (v.kind != V_TENSOR && v.kind != V_ERR) {
            check_error(c, rhs->loc, "'%s' holds a tensor; it cannot become %s", st->name, value_describe(c, &v));
            return;
        }
        if (x->repeat_scope && where != x->repeat_scope && v.kind == V_TENSOR && b->v.kind == V_TENSOR) {
            value old = b->v;
            int same = old.rank == v.rank && old.is_int == v.is_int;
            for (int i = 0; same && i < v.rank; i++) same = old.dims[i] == v.dims[i];
            if (!same) {
                check_error(c, st->loc, "inside repeat, '%s' changes shape from %s to %s; every iteration "
                                        "must keep it", st->name, shape_str(c, &old), shape_str(c, &v));
                return;
            }
        }
        if (x->repeat_scope && where != x->repeat_scope && c->graph && b->v.kind == V_TENSOR && b->v.node > 0 &&
            v.kind == V_TENSOR && v.node > 0 &&
            graph_region_carry(c->graph, c->graph->cur_region, b->v.node - 1, v.node - 1) < 0)
            check_error(c, st->loc, "a repeat body may carry at most %d tensors to the next iteration",
                        GRAPH_MAX_CARRY);
        b->v = v;
        return;
    }
    binding *nb = scope_add(c, s, st->name, v.kind == V_TENSOR || v.kind == V_ERR ? B_TENSOR : B_CONST,
                            st->name_loc);
    nb->v = v;
    nb->used = 1;
}

static void exec_repeat(checker *c, scope *s, const ast_node *st, exec_ctx *x) {
    value n = eval(c, s, st->a, EVAL_MODEL);
    int64_t count;
    if (!value_as_int(c, &n, "the repeat count", &count)) return;
    if (count <= 0) {
        check_error(c, st->a->loc, "the repeat count must be positive, not %lld", (long long)count);
        return;
    }
    if (!x->in_block && !x->repeat_scope) {
        if (!c->layers_node) {
            c->layers = count;
            c->layers_node = st;
        } else if (!c->second_stack) {
            c->second_stack = st;
        }
    }
    frame fr = *x->fr;
    fr.up = x->fr->up;
    const char *label = st->name ? st->name : "layers";
    fr.prefix = count == 1 ? arena_printf(c->arena, "%s%s.0.", x->fr->prefix, label)
                           : arena_printf(c->arena, "%s%s.{0..%lld}.", x->fr->prefix, label, (long long)count - 1);
    if (__builtin_mul_overflow(x->fr->mult, count, &fr.mult)) {
        check_error(c, st->a->loc, "nested repeat counts overflow 64 bits");
        return;
    }
    fr.names_used = scope_new(c, NULL);
    exec_ctx inner = *x;
    inner.fr = &fr;
    inner.repeat_scope = scope_new(c, s);
    frame *saved = c->frame;
    c->frame = &fr;
    int region = c->graph ? graph_region_begin(c->graph, count, c->layers_node == st, label) : -1;
    exec_stmts(c, inner.repeat_scope, &st->list, &inner);
    if (c->graph) graph_region_end(c->graph, region);
    c->frame = saved;
    if (inner.returned) {
        x->returned = 1;
        x->ret = inner.ret;
    }
}

/* Unused params and inputs; skipped once there are errors, since a failed
 * expression leaves the names it used unmarked. */
static void warn_unused(checker *c, scope *s) {
    if (diag_errors(c->diag)) return;
    for (binding *b = s->first; b; b = b->order)
        if (!b->used && (b->kind == B_PARAM || b->kind == B_INPUT))
            check_warning(c, b->decl, "%s '%s' is never used", b->kind == B_PARAM ? "parameter" : "input", b->name);
}

static void exec_stmts(checker *c, scope *s, const ast_list *stmts, exec_ctx *x) {
    for (const ast_node *st = stmts->first; st; st = st->next) {
        if (diag_stopped(c->diag) || !budget(c, st->loc)) return;
        if (x->returned) {
            check_error(c, st->loc, "statement after return");
            return;
        }
        switch (st->kind) {
        case AST_ASSIGN: exec_assign(c, s, st, x); break;
        case AST_PARAM: exec_param(c, s, st, x); break;
        case AST_INPUT: exec_input(c, s, st, x); break;
        case AST_REPEAT: exec_repeat(c, s, st, x); break;
        case AST_RETURN:
            if (!x->in_block) {
                check_error(c, st->loc, "return is for blocks; a model defines 'loss' instead");
                break;
            }
            if (x->repeat_scope) {
                check_error(c, st->loc, "return inside repeat; return after the repeat instead");
                break;
            }
            x->ret = eval(c, s, st->a, EVAL_MODEL);
            x->returned = 1;
            break;
        default: break;
        }
    }
    if (x->repeat_scope == s) warn_unused(c, s);
}

/* The k-th call of a block in one scope gets the prefix name_k (k >= 2). */
static const char *call_prefix(checker *c, frame *up, const char *name) {
    if (!up->names_used) up->names_used = scope_new(c, NULL);
    binding *b = scope_find_local(up->names_used, name);
    if (!b) {
        b = scope_add(c, up->names_used, name, B_CONST, LOC_NONE);
        b->v.i = 0;
    }
    b->v.i++;
    if (b->v.i == 1) return arena_printf(c->arena, "%s%s.", up->prefix, name);
    return arena_printf(c->arena, "%s%s_%lld.", up->prefix, name, (long long)b->v.i);
}

static const ast_node *find_bparam(const ast_node *block, const char *name, int *index) {
    int i = 0;
    for (const ast_node *p = block->list2.first; p; p = p->next, i++)
        if (strcmp(p->name, name) == 0) { *index = i; return p; }
    return NULL;
}

value check_block_call(checker *c, scope *caller, const ast_node *call, const ast_node *block) {
    binding *self = scope_find_local(c->globals, block->name);
    if (self && self->node == block) {
        self->used = 1;
        if (self->bad) return value_err(); /* its declaration had errors */
    }
    for (const frame *f = c->frame; f; f = f->up)
        if (f->block == block) {
            check_error(c, call->name_loc, "block '%s' calls itself; recursion is not allowed", block->name);
            return value_err();
        }
    if (c->call_depth >= CHECK_MAX_CALL_DEPTH) {
        check_error(c, call->name_loc, "blocks are nested too deeply (more than %d calls)", CHECK_MAX_CALL_DEPTH);
        return value_err();
    }
    int np = block->list2.n, ok = 1, pos = 0;
    value *given = arena_alloc(c->arena, (size_t)(np ? np : 1) * sizeof *given);
    int *have = arena_alloc(c->arena, (size_t)(np ? np : 1) * sizeof *have);
    for (const ast_node *a = call->list.first; a; a = a->next) {
        int k = -1;
        if (a->name) {
            if (!find_bparam(block, a->name, &k)) {
                suggest sg;
                suggest_init(&sg, a->name);
                for (const ast_node *p = block->list2.first; p; p = p->next) suggest_offer(&sg, p->name);
                const char *best = suggest_result(&sg);
                if (best)
                    check_error(c, a->name_loc, "block '%s' has no parameter '%s'; did you mean '%s'?",
                                block->name, a->name, best);
                else
                    check_error(c, a->name_loc, "block '%s' has no parameter '%s'", block->name, a->name);
                check_note(c, block->name_loc, "'%s' is declared here", block->name);
                ok = 0;
                continue;
            }
        } else {
            k = pos++;
            if (k >= np) {
                int given_n = 0;
                for (const ast_node *q = call->list.first; q; q = q->next) given_n += !q->name;
                check_error(c, a->loc, "block '%s' takes %d argument%s, but %d are given", block->name, np,
                            np == 1 ? "" : "s", given_n);
                check_note(c, block->name_loc, "'%s' is declared here", block->name);
                ok = 0;
                break;
            }
        }
        if (have[k]) {
            check_error(c, a->loc, "argument '%s' is given twice", a->name ? a->name : "?");
            ok = 0;
            continue;
        }
        have[k] = 1;
        given[k] = eval(c, caller, a->a, EVAL_MODEL);
        if (given[k].kind == V_ERR) ok = 0;
    }
    if (!ok) return value_err();
    frame fr = {0};
    fr.block = block;
    fr.call = call->loc;
    fr.prefix = call_prefix(c, c->frame, block->name);
    fr.mult = c->frame->mult;
    fr.up = c->frame;
    frame *saved = c->frame;
    c->frame = &fr;
    c->call_depth++;
    scope *bs = scope_new(c, c->globals);
    bs->barrier = 1;
    int i = 0;
    for (const ast_node *p = block->list2.first; p && ok; p = p->next, i++) {
        value v;
        if (have[i]) {
            v = given[i];
        } else if (p->a) {
            v = eval(c, bs, p->a, EVAL_MODEL);
        } else {
            c->frame = saved;
            check_error(c, call->loc, "missing argument '%s' in call to block '%s'", p->name, block->name);
            check_note(c, p->loc, "parameter '%s' is declared here", p->name);
            c->frame = &fr;
            ok = 0;
            break;
        }
        binding *b = scope_add(c, bs, p->name, v.kind == V_TENSOR || v.kind == V_ERR ? B_TENSOR : B_CONST, p->loc);
        b->v = v;
        b->used = 1;
    }
    value r = value_err();
    if (ok) {
        exec_ctx x = {0};
        x.fr = &fr;
        x.in_block = 1;
        exec_stmts(c, bs, &block->list, &x);
        warn_unused(c, bs);
        if (x.returned) {
            r = x.ret;
            r.where = call->loc;
        } else if (!diag_stopped(c->diag) && c->work >= 0) {
            check_error(c, block->name_loc, "block '%s' does not return a value", block->name);
        }
    }
    c->call_depth--;
    c->frame = saved;
    return r;
}

void check_model(checker *c) {
    const ast_node *m = c->model_node;
    scope *ms = scope_new(c, c->globals);
    ms->barrier = 1;
    int64_t bsz = c->train.ok ? c->train.micro_batch : 1, seq = c->train.ok ? c->train.seq_len : 1;
    binding *b = scope_add(c, ms, "batch", B_CONST, LOC_NONE);
    b->v = value_int(bsz, LOC_NONE);
    b = scope_add(c, ms, "seq", B_CONST, LOC_NONE);
    b->v = value_int(seq, LOC_NONE);
    frame root = {0};
    root.prefix = "";
    root.mult = 1;
    c->frame = &root;
    exec_ctx x = {0};
    x.fr = &root;
    exec_stmts(c, ms, &m->list, &x);
    c->frame = NULL;
    if (diag_stopped(c->diag) || c->work < 0) return;
    warn_unused(c, ms);
    binding *loss = scope_find_local(ms, "loss");
    if (c->graph && loss && loss->v.kind == V_TENSOR && loss->v.node > 0) c->graph->loss = loss->v.node - 1;
    if (!loss) {
        check_error(c, m->name_loc, "model '%s' does not define 'loss' (e.g. loss = cross_entropy(logits, targets))",
                    m->name);
    } else if (loss->v.kind == V_TENSOR && loss->v.rank != 0) {
        check_error(c, loss->decl, "'loss' must be a scalar, but it is %s", shape_str(c, &loss->v));
    } else if (loss->v.kind != V_TENSOR && loss->v.kind != V_ERR) {
        check_error(c, loss->decl, "'loss' must be a tensor, not %s", value_describe(c, &loss->v));
    }
    if (c->n_params == 0 && !diag_errors(c->diag))
        check_error(c, m->name_loc, "model '%s' has no parameters to train", m->name);
}
