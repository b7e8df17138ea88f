/* check_resolve.c — name resolution for blocks that no call instantiated.
 *
 * A called block is checked in full when the model inlines it; a block
 * nothing calls (a library block, or a file without a model) still gets its
 * names checked here, so a typo in lang/std is caught without a model that
 * uses that block.
 */
#include <string.h> /* strcmp */

#include "check.h"

static const char *const init_words[] = {"zeros", "ones", "normal"};

static int is_const_fn(const char *name) {
    for (int i = 0; i < CHECK_N_CONST_FNS; i++)
        if (strcmp(name, check_const_fns[i]) == 0) return 1;
    return 0;
}

static void resolve(checker *c, scope *s, const ast_node *e);

static void resolve_list(checker *c, scope *s, const ast_list *l) {
    for (const ast_node *x = l->first; x; x = x->next) resolve(c, s, x);
}

static void resolve(checker *c, scope *s, const ast_node *e) {
    if (!e || diag_stopped(c->diag)) return;
    switch (e->kind) {
    case AST_NAME:
        if (!scope_find(s, e->name)) check_unknown_name(c, e->loc, "name", e->name, s, NULL, 0);
        return;
    case AST_CALL: {
        binding *b = scope_find(s, e->name);
        if (!(b && b->kind == B_BLOCK) && !ops_is_builtin(e->name) && !is_const_fn(e->name)) {
            const char *extra[64];
            int n = 0;
            for (int i = 0; i < ops_count && n < 60; i++) extra[n++] = ops_name(i);
            for (int i = 0; i < CHECK_N_CONST_FNS; i++) extra[n++] = check_const_fns[i];
            check_unknown_name(c, e->name_loc, "block or op", e->name, s, extra, n);
        }
        for (const ast_node *a = e->list.first; a; a = a->next) {
            /* act: swiglu is a word, not a name */
            if (a->name && strcmp(a->name, "act") == 0 && a->a->kind == AST_NAME) continue;
            resolve(c, s, a->a);
        }
        return;
    }
    case AST_MEMBER: resolve(c, s, e->a); return;
    case AST_TYPE:
    case AST_TUPLE: resolve_list(c, s, &e->list); return;
    default:
        resolve(c, s, e->a);
        resolve(c, s, e->b);
        return;
    }
}

/* An init is a word (zeros, ones) or a call (normal(std)); only names inside
 * the call's arguments must resolve. */
static void resolve_init(checker *c, scope *s, const ast_node *init) {
    if (!init) return;
    if (init->kind == AST_NAME) {
        for (int i = 0; i < 3; i++)
            if (strcmp(init->name, init_words[i]) == 0) return;
        if (scope_find(s, init->name)) return;
        check_error(c, init->loc, "unknown initialisation '%s'; use normal(std), zeros or ones", init->name);
        return;
    }
    if (init->kind == AST_CALL) {
        for (const ast_node *a = init->list.first; a; a = a->next) resolve(c, s, a->a);
        return;
    }
    resolve(c, s, init);
}

static void resolve_annots(checker *c, scope *s, const ast_list *annots) {
    for (const ast_node *an = annots->first; an; an = an->next) resolve(c, s, an->a);
}

static void bind(checker *c, scope *s, const ast_node *st) {
    if (!scope_find_local(s, st->name)) scope_add(c, s, st->name, B_TENSOR, st->name_loc);
}

static void resolve_stmts(checker *c, scope *s, const ast_list *stmts) {
    for (const ast_node *st = stmts->first; st; st = st->next) {
        switch (st->kind) {
        case AST_ASSIGN:
            resolve(c, s, st->a);
            resolve_annots(c, s, &st->list);
            bind(c, s, st);
            break;
        case AST_INPUT:
            resolve(c, s, st->a);
            bind(c, s, st);
            break;
        case AST_PARAM:
            resolve(c, s, st->a);
            resolve_init(c, s, st->b);
            resolve_annots(c, s, &st->list);
            bind(c, s, st);
            break;
        case AST_REPEAT:
            resolve(c, s, st->a);
            resolve_stmts(c, s, &st->list);
            break;
        case AST_RETURN: resolve(c, s, st->a); break;
        default: break;
        }
    }
}

void check_uncalled_blocks(checker *c) {
    for (binding *b = c->globals->first; b; b = b->order) {
        if (b->kind != B_BLOCK || b->used || b->bad || diag_stopped(c->diag)) continue;
        scope *s = scope_new(c, c->globals);
        s->barrier = 1;
        scope_add(c, s, "batch", B_CONST, LOC_NONE);
        scope_add(c, s, "seq", B_CONST, LOC_NONE);
        for (const ast_node *p = b->node->list2.first; p; p = p->next) {
            resolve(c, s, p->a);
            if (!scope_find_local(s, p->name)) scope_add(c, s, p->name, B_CONST, p->name_loc);
        }
        resolve_stmts(c, s, &b->node->list);
    }
}
