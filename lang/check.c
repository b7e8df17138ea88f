/* check.c — the checker's driver, scopes and diagnostics helpers.
 *
 * Order of evaluation: blocks are registered from every file first (they
 * may be used before they are defined), then top-level constants in file
 * order (imports first), then mesh, train and model, then the checks that
 * need all three (check_sections.c).
 */
#include "check.h"

#include <stdarg.h> /* va_list */
#include <string.h> /* strcmp */

#include "suggest.h"

const char *const axis_names[AX_COUNT] = {"dp", "tp", "pp", "ep"};

/* ---- scopes: small hash maps in the arena ---- */

enum { SCOPE_BUCKETS = 16 };

static unsigned hash_name(const char *s) {
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

scope *scope_new(checker *c, scope *parent) {
    scope *s = arena_alloc(c->arena, sizeof *s);
    s->parent = parent;
    s->n_buckets = SCOPE_BUCKETS;
    s->buckets = arena_alloc(c->arena, SCOPE_BUCKETS * sizeof *s->buckets);
    return s;
}

static void scope_grow(checker *c, scope *s) {
    int nb = s->n_buckets * 4;
    binding **b = arena_alloc(c->arena, (size_t)nb * sizeof *b);
    for (binding *x = s->first; x; x = x->order) {
        unsigned h = hash_name(x->name) & (unsigned)(nb - 1);
        x->next = b[h];
        b[h] = x;
    }
    s->buckets = b;
    s->n_buckets = nb;
}

binding *scope_find_local(const scope *s, const char *name) {
    for (binding *b = s->buckets[hash_name(name) & (unsigned)(s->n_buckets - 1)]; b; b = b->next)
        if (strcmp(b->name, name) == 0) return b;
    return NULL;
}

binding *scope_find(const scope *s, const char *name) {
    for (; s; s = s->parent) {
        binding *b = scope_find_local(s, name);
        if (b) return b;
    }
    return NULL;
}

binding *scope_add(checker *c, scope *s, const char *name, bkind kind, loc decl) {
    if (s->count >= s->n_buckets * 2) scope_grow(c, s);
    binding *b = arena_alloc(c->arena, sizeof *b);
    b->name = name;
    b->kind = kind;
    b->decl = decl;
    unsigned h = hash_name(name) & (unsigned)(s->n_buckets - 1);
    b->next = s->buckets[h];
    s->buckets[h] = b;
    if (s->last) s->last->order = b; else s->first = b;
    s->last = b;
    s->count++;
    return b;
}

/* ---- diagnostics with the block-call context as notes ---- */

static void report(checker *c, diag_level lv, loc l, const char *fmt, va_list ap) {
    diag_vreport(c->diag, lv, l, fmt, ap);
    if (lv == DIAG_NOTE) return;
    int shown = 0;
    for (const frame *f = c->frame; f && f->block; f = f->up) {
        if (shown++ == 4) {
            diag_report(c->diag, DIAG_NOTE, f->call, "(and further calls)");
            break;
        }
        diag_report(c->diag, DIAG_NOTE, f->call, "in block '%s' called here", f->block->name);
    }
}

void check_error(checker *c, loc l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(c, DIAG_ERROR, l, fmt, ap);
    va_end(ap);
}

void check_warning(checker *c, loc l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(c, DIAG_WARNING, l, fmt, ap);
    va_end(ap);
}

void check_note(checker *c, loc l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(c->diag, DIAG_NOTE, l, fmt, ap);
    va_end(ap);
}

const char *check_unknown_name(checker *c, loc l, const char *what, const char *name, const scope *s,
                               const char *const *extra, int n_extra) {
    suggest sg;
    suggest_init(&sg, name);
    for (; s; s = s->parent)
        for (const binding *b = s->first; b; b = b->order) suggest_offer(&sg, b->name);
    for (int i = 0; i < n_extra; i++) suggest_offer(&sg, extra[i]);
    const char *best = suggest_result(&sg);
    if (best)
        check_error(c, l, "unknown %s '%s'; did you mean '%s'?", what, name, best);
    else
        check_error(c, l, "unknown %s '%s'", what, name);
    return best;
}

const set_item *check_find_set(checker *c, const char *section, const char *key) {
    set_item *last = NULL;
    for (int i = 0; i < c->n_sets; i++) {
        set_item *it = &c->sets[i];
        int same = (!section && !it->section) ||
                   (section && it->section && strcmp(section, it->section) == 0);
        if (same && strcmp(it->key, key) == 0) {
            it->used = 1; /* the earlier ones too: the last one wins */
            last = it;
        }
    }
    return last;
}

/* [8, 1024, 768] or int[8, 1024]; [] for a scalar. */
const char *shape_str(checker *c, const value *v) {
    char buf[256];
    int k = snprintf(buf, sizeof buf, "%s[", v->is_int ? "int" : "");
    for (int i = 0; i < v->rank && k < (int)sizeof buf - 32; i++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%lld", i ? ", " : "", (long long)v->dims[i]);
    snprintf(buf + k, sizeof buf - (size_t)k, "]");
    return arena_strdup(c->arena, buf);
}

/* ---- top level ---- */

/* The keyword that starts an item: `model`, `mesh`, `train`. */
static loc keyword_loc(const ast_node *it, const char *kw) {
    loc l = it->loc;
    l.end = l.start + (int)strlen(kw);
    return l;
}

/* An item that only the main file may hold, at most once. */
static void main_only(checker *c, const ast_node *it, const ast_node **slot, const char *what, int is_main) {
    if (!is_main) {
        check_error(c, keyword_loc(it, what), "an imported file may only define blocks and constants, not a %s",
                    what);
        return;
    }
    if (*slot) {
        check_error(c, keyword_loc(it, what), "a second %s section; a file has at most one", what);
        check_note(c, keyword_loc(*slot, what), "the first %s is here", what);
        return;
    }
    *slot = it;
}

/* The first NAME node in `e` spelled `name`, or NULL. */
static const ast_node *find_name(const ast_node *e, const char *name) {
    if (!e) return NULL;
    if (e->kind == AST_NAME && strcmp(e->name, name) == 0) return e;
    const ast_node *r = find_name(e->a, name);
    if (!r) r = find_name(e->b, name);
    for (const ast_node *x = e->list.first; x && !r; x = x->next) r = find_name(x, name);
    return r;
}

static void register_block(checker *c, const ast_node *blk) {
    if (ops_is_builtin(blk->name)) {
        check_error(c, blk->name_loc, "'%s' is a built-in op; choose another block name", blk->name);
        return;
    }
    binding *prev = scope_find_local(c->globals, blk->name);
    if (prev) {
        check_error(c, blk->name_loc, "'%s' is already defined", blk->name);
        check_note(c, prev->decl, "previous definition is here");
        return;
    }
    binding *b = scope_add(c, c->globals, blk->name, B_BLOCK, blk->name_loc);
    b->node = blk;
    for (const ast_node *p = blk->list2.first; p; p = p->next) {
        for (const ast_node *q = blk->list2.first; q != p; q = q->next)
            if (strcmp(p->name, q->name) == 0) {
                check_error(c, p->name_loc, "block parameter '%s' is declared twice", p->name);
                check_note(c, q->name_loc, "first declared here");
                b->bad = 1;
                break;
            }
        for (const ast_node *q = p->next; q && p->a; q = q->next) {
            const ast_node *use = find_name(p->a, q->name);
            if (use) {
                check_error(c, use->loc, "the default of '%s' uses '%s', a later parameter; defaults may use "
                                         "only earlier parameters", p->name, q->name);
                b->bad = 1;
            }
        }
    }
}

static void define_constant(checker *c, const ast_node *it) {
    const set_item *ov = check_find_set(c, NULL, it->name);
    value v = eval(c, c->globals, ov ? ov->value : it->a, EVAL_CONST);
    binding *prev = scope_find_local(c->globals, it->name);
    if (prev) {
        check_error(c, it->name_loc, "'%s' is already defined", it->name);
        check_note(c, prev->decl, "previous definition is here");
        return;
    }
    if (ops_is_builtin(it->name)) {
        check_error(c, it->name_loc, "'%s' is a built-in op and cannot be redefined", it->name);
        return;
    }
    binding *b = scope_add(c, c->globals, it->name, B_CONST, it->name_loc);
    b->v = v;
}

void check_run(checker *c) {
    c->globals = scope_new(c, NULL);
    c->params_tail = &c->params;
    for (int f = 0; f < c->n_files; f++)
        for (const ast_node *it = c->files[f]->list.first; it; it = it->next)
            if (it->kind == AST_BLOCK) register_block(c, it);
    for (int f = 0; f < c->n_files && !diag_stopped(c->diag); f++) {
        int is_main = f == c->n_files - 1;
        for (const ast_node *it = c->files[f]->list.first; it; it = it->next) {
            switch (it->kind) {
            case AST_ASSIGN: define_constant(c, it); break;
            case AST_MODEL: main_only(c, it, &c->model_node, "model", is_main); break;
            case AST_MESH: main_only(c, it, &c->mesh_node, "mesh", is_main); break;
            case AST_TRAIN: main_only(c, it, &c->train_node, "train", is_main); break;
            default: break;
            }
        }
    }
    if (diag_stopped(c->diag)) return;
    if (c->model_node) {
        loc at = c->model_node->name_loc;
        if (!c->mesh_node)
            check_error(c, at, "model '%s' has no mesh section; add one, e.g. `mesh { dp = 1 }`",
                        c->model_node->name);
        if (!c->train_node)
            check_error(c, at, "model '%s' has no train section; add one with at least "
                               "global_batch, seq_len, steps and optimizer", c->model_node->name);
    } else if (c->mesh_node || c->train_node) {
        const char *kw = c->mesh_node ? "mesh" : "train";
        check_error(c, keyword_loc(c->mesh_node ? c->mesh_node : c->train_node, kw), "%s section without a model",
                    kw);
    }
    if (c->mesh_node) check_mesh(c);
    if (c->train_node) check_train(c);
    if (c->model_node && !diag_stopped(c->diag)) check_model(c);
    if (c->model_node && c->mesh_node && c->train_node && !diag_stopped(c->diag)) check_layout(c);
    if (!diag_stopped(c->diag)) check_uncalled_blocks(c);
    for (int i = 0; i < c->n_sets; i++)
        if (!c->sets[i].used && !diag_stopped(c->diag)) {
            const set_item *s = &c->sets[i];
            if (s->section && strcmp(s->section, "model") == 0)
                check_error(c, s->where, "the model has no constant '%s' to override", s->key);
            else if (!s->section)
                check_error(c, s->where, "there is no top-level constant '%s' to override", s->key);
            else
                check_error(c, s->where, "'%s.%s' matches no section of the file (use mesh., train., model. or a top-level constant)", s->section, s->key);
        }
}
