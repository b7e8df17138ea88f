/* ast.c — builders for the syntax tree (ast.h). Each is the one action of a
 * grammar rule in parser.y; the rule is the comment above it. */
#include "ast.h"

static const char *const kind_names[] = {
#define AST_NAME_STR(k) #k,
    AST_KIND_LIST(AST_NAME_STR)
#undef AST_NAME_STR
};

const char *ast_kind_name(ast_kind k) {
    return k >= 0 && k < AST_KIND_COUNT ? kind_names[k] : "?";
}

loc loc_span(loc a, loc b) {
    if (a.src < 0) return b;
    if (b.src < 0 || b.src != a.src) return a;
    loc r = a;
    if (b.start < r.start) r.start = b.start;
    if (b.end > r.end) r.end = b.end;
    return r;
}

ast_node *ast_new(ast_builder *b, ast_kind k, loc l) {
    ast_node *n = arena_alloc(b->arena, sizeof *n);
    n->kind = k;
    n->loc = l;
    n->name_loc = LOC_NONE;
    n->depth = 1;
    return n;
}

void ast_append(ast_list *list, ast_node *n) {
    if (!n) return;
    n->next = NULL;
    if (list->last) list->last->next = n; else list->first = n;
    list->last = n;
    list->n++;
}

/* Gives `n` a depth one more than its deepest child; past AST_MAX_DEPTH the
 * node becomes an ERROR leaf (reported once), so no later pass recurses
 * without bound. */
static ast_node *deepen(ast_builder *b, ast_node *n, const ast_node *c1, const ast_node *c2) {
    int d = 0;
    if (c1 && c1->depth > d) d = c1->depth;
    if (c2 && c2->depth > d) d = c2->depth;
    n->depth = d + 1;
    if (n->depth <= AST_MAX_DEPTH) return n;
    if (!b->depth_reported)
        diag_report(b->diag, DIAG_ERROR, n->loc,
                    "expression is nested too deeply (more than %d levels)", AST_MAX_DEPTH);
    b->depth_reported = 1;
    ast_node *e = ast_new(b, AST_ERROR, n->loc);
    return e;
}

static ast_node *deepen_list(ast_builder *b, ast_node *n, const ast_list *l) {
    const ast_node *deepest = NULL;
    for (const ast_node *c = l->first; c; c = c->next)
        if (!deepest || c->depth > deepest->depth) deepest = c;
    return deepen(b, n, deepest, NULL);
}

/* primary: INT */
ast_node *ast_int(ast_builder *b, loc l, int64_t v) {
    ast_node *n = ast_new(b, AST_INT, l);
    n->ival = v;
    return n;
}

/* primary: FLOAT */
ast_node *ast_float(ast_builder *b, loc l, double v) {
    ast_node *n = ast_new(b, AST_FLOAT, l);
    n->fval = v;
    return n;
}

/* primary: STRING */
ast_node *ast_string(ast_builder *b, loc l, const char *s) {
    ast_node *n = ast_new(b, AST_STRING, l);
    n->sval = s;
    return n;
}

/* primary: "true" | "false" */
ast_node *ast_bool(ast_builder *b, loc l, int v) {
    ast_node *n = ast_new(b, AST_BOOL, l);
    n->ival = v;
    return n;
}

/* primary: IDENT */
ast_node *ast_name(ast_builder *b, loc l, const char *name) {
    ast_node *n = ast_new(b, AST_NAME, l);
    n->name = name;
    n->name_loc = l;
    return n;
}

/* expr: "-" expr */
ast_node *ast_unary(ast_builder *b, loc l, int op, ast_node *a) {
    ast_node *n = ast_new(b, AST_UNARY, loc_span(l, a->loc));
    n->op = op;
    n->a = a;
    return deepen(b, n, a, NULL);
}

/* expr: expr op expr */
ast_node *ast_binary(ast_builder *b, int op, ast_node *x, ast_node *y) {
    ast_node *n = ast_new(b, AST_BINARY, loc_span(x->loc, y->loc));
    n->op = op;
    n->a = x;
    n->b = y;
    return deepen(b, n, x, y);
}

/* primary: IDENT "(" [ arg { "," arg } ] ")" */
ast_node *ast_call(ast_builder *b, loc l, const char *name, loc name_loc, ast_list args) {
    ast_node *n = ast_new(b, AST_CALL, l);
    n->name = name;
    n->name_loc = name_loc;
    n->list = args;
    return deepen_list(b, n, &args);
}

/* arg: [ IDENT ":" ] expr */
ast_node *ast_arg(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *value) {
    ast_node *n = ast_new(b, AST_ARG, l);
    n->name = name;
    n->name_loc = name_loc;
    n->a = value;
    n->depth = value->depth;
    return n;
}

/* primary: "(" expr "," [ expr { "," expr } ] ")" */
ast_node *ast_tuple(ast_builder *b, loc l, ast_list elems) {
    ast_node *n = ast_new(b, AST_TUPLE, l);
    n->list = elems;
    return deepen_list(b, n, &elems);
}

/* postfix: postfix "." IDENT */
ast_node *ast_member(ast_builder *b, loc l, ast_node *obj, const char *name, loc name_loc) {
    ast_node *n = ast_new(b, AST_MEMBER, l);
    n->a = obj;
    n->name = name;
    n->name_loc = name_loc;
    return deepen(b, n, obj, NULL);
}

/* postfix: postfix "[" expr "]" */
ast_node *ast_index(ast_builder *b, loc l, ast_node *obj, ast_node *index) {
    ast_node *n = ast_new(b, AST_INDEX, l);
    n->a = obj;
    n->b = index;
    return deepen(b, n, obj, index);
}

/* type: [ IDENT ] "[" [ expr { "," expr } ] "]" */
ast_node *ast_type(ast_builder *b, loc l, const char *dtype, loc dtype_loc, ast_list dims) {
    ast_node *n = ast_new(b, AST_TYPE, l);
    n->name = dtype;
    n->name_loc = dtype_loc;
    n->list = dims;
    return n;
}

/* annot: "@split" "(" IDENT "," expr ")" | "@replicate" "(" IDENT ")" */
ast_node *ast_annot(ast_builder *b, loc l, int kind, const char *axis, loc axis_loc, ast_node *dim) {
    ast_node *n = ast_new(b, AST_ANNOT, l);
    n->op = kind;
    n->name = axis;
    n->name_loc = axis_loc;
    n->a = dim;
    return n;
}

/* stmt: IDENT "=" expr { annot }   (also mesh/train options and constants) */
ast_node *ast_assign(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *value,
                     ast_list annots) {
    ast_node *n = ast_new(b, AST_ASSIGN, l);
    n->name = name;
    n->name_loc = name_loc;
    n->a = value;
    n->list = annots;
    return n;
}

/* stmt: "input" IDENT ":" type { annot } */
ast_node *ast_input(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *type, ast_list annots) {
    ast_node *n = ast_new(b, AST_INPUT, l);
    n->name = name;
    n->name_loc = name_loc;
    n->a = type;
    n->list = annots;
    return n;
}

/* stmt: "param" IDENT ":" type [ "=" expr ] { annot } */
ast_node *ast_param(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *type,
                    ast_node *init, ast_list annots) {
    ast_node *n = ast_new(b, AST_PARAM, l);
    n->name = name;
    n->name_loc = name_loc;
    n->a = type;
    n->b = init;
    n->list = annots;
    return n;
}

/* stmt: "repeat" expr [ "as" IDENT ] body */
ast_node *ast_repeat(ast_builder *b, loc l, ast_node *count, const char *label, loc label_loc,
                     ast_list body) {
    ast_node *n = ast_new(b, AST_REPEAT, l);
    n->a = count;
    n->name = label;
    n->name_loc = label_loc;
    n->list = body;
    return n;
}

/* stmt: "return" expr */
ast_node *ast_return(ast_builder *b, loc l, ast_node *value) {
    ast_node *n = ast_new(b, AST_RETURN, l);
    n->a = value;
    return n;
}

/* item: "import" STRING */
ast_node *ast_import(ast_builder *b, loc l, const char *path) {
    ast_node *n = ast_new(b, AST_IMPORT, l);
    n->sval = path;
    return n;
}

/* item: "block" IDENT "(" [ bparam { "," bparam } ] ")" body */
ast_node *ast_block(ast_builder *b, loc l, const char *name, loc name_loc, ast_list params,
                    ast_list body) {
    ast_node *n = ast_new(b, AST_BLOCK, l);
    n->name = name;
    n->name_loc = name_loc;
    n->list = body;
    n->list2 = params;
    return n;
}

/* bparam: IDENT [ "=" expr ] */
ast_node *ast_bparam(ast_builder *b, loc l, const char *name, ast_node *dflt) {
    ast_node *n = ast_new(b, AST_BPARAM, l);
    n->name = name;
    n->name_loc = l;
    n->a = dflt;
    return n;
}

/* item: "model" IDENT body */
ast_node *ast_model(ast_builder *b, loc l, const char *name, loc name_loc, ast_list body) {
    ast_node *n = ast_new(b, AST_MODEL, l);
    n->name = name;
    n->name_loc = name_loc;
    n->list = body;
    return n;
}

/* item: "mesh" "{" { option } "}" | "train" "{" { option } "}" */
ast_node *ast_section(ast_builder *b, loc l, ast_kind kind, ast_list options) {
    ast_node *n = ast_new(b, kind, l);
    n->list = options;
    return n;
}
