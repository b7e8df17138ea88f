/* ast.h — the syntax tree of a .mesh program.
 *
 * One node type for every construct (Lua/jq style): a kind, a source range,
 * scalar payloads and up to three children plus a child list. Nodes live in
 * the program's arena. Each builder is the single action of one grammar rule
 * (the rule is written above it in ast.c).
 */
#ifndef MESH_AST_H
#define MESH_AST_H

#include <stdint.h> /* int64_t */

#include "arena.h"
#include "diag.h"

enum { AST_MAX_DEPTH = 500 };

#define AST_KIND_LIST(X) \
    X(ERROR)   /* placeholder after a reported error */ \
    X(INT) X(FLOAT) X(STRING) X(BOOL) X(NAME) \
    X(UNARY)   /* op a */ \
    X(BINARY)  /* a op b */ \
    X(CALL)    /* name(list of ARG) */ \
    X(ARG)     /* [name:] a */ \
    X(TUPLE)   /* (list) */ \
    X(MEMBER)  /* a.name */ \
    X(INDEX)   /* a[b] */ \
    X(TYPE)    /* [name] [list of dims] */ \
    X(ANNOT)   /* @split(name, a) | @replicate(name) */ \
    X(ASSIGN)  /* name = a {list of ANNOT} */ \
    X(INPUT)   /* input name : a(TYPE) {list of ANNOT, an error} */ \
    X(PARAM)   /* param name : a(TYPE) [= b] {list of ANNOT} */ \
    X(REPEAT)  /* repeat a [as name] { list } */ \
    X(RETURN)  /* return a */ \
    X(IMPORT)  /* import sval */ \
    X(BLOCK)   /* block name(list2 of BPARAM) { list } */ \
    X(BPARAM)  /* name [= a] */ \
    X(MODEL)   /* model name { list } */ \
    X(MESH)    /* mesh { list of ASSIGN } */ \
    X(TRAIN)   /* train { list of ASSIGN } */ \
    X(FILE)    /* list of items */

typedef enum ast_kind {
#define AST_ENUM(k) AST_##k,
    AST_KIND_LIST(AST_ENUM)
#undef AST_ENUM
    AST_KIND_COUNT
} ast_kind;

typedef struct ast_node ast_node;

typedef struct ast_list {
    ast_node *first, *last;
    int n;
} ast_list;

struct ast_node {
    ast_kind kind;
    loc loc;           /* the whole construct */
    int depth;         /* expression nesting, capped at AST_MAX_DEPTH */
    const char *name;  /* identifier payload (NAME, CALL, MEMBER, ASSIGN, ...) */
    loc name_loc;      /* where `name` is written */
    int op;            /* operator: '+', '-', '*', '/', '%', '@'; ANNOT: 's'/'r' */
    int64_t ival;      /* INT, BOOL */
    double fval;       /* FLOAT */
    const char *sval;  /* STRING, IMPORT (decoded) */
    ast_node *a, *b;   /* children, see AST_KIND_LIST */
    ast_list list;     /* children, see AST_KIND_LIST */
    ast_list list2;
    ast_node *next;    /* sibling in a list */
};

const char *ast_kind_name(ast_kind k);

/* The builder state: the arena and the sink used for depth errors. */
typedef struct ast_builder {
    arena *arena;
    diag_sink *diag;
    int depth_reported;
} ast_builder;

ast_node *ast_new(ast_builder *b, ast_kind k, loc l);
void ast_append(ast_list *list, ast_node *n);
loc loc_span(loc a, loc b);

ast_node *ast_int(ast_builder *b, loc l, int64_t v);
ast_node *ast_float(ast_builder *b, loc l, double v);
ast_node *ast_string(ast_builder *b, loc l, const char *s);
ast_node *ast_bool(ast_builder *b, loc l, int v);
ast_node *ast_name(ast_builder *b, loc l, const char *name);
ast_node *ast_unary(ast_builder *b, loc l, int op, ast_node *a);
ast_node *ast_binary(ast_builder *b, int op, ast_node *x, ast_node *y);
ast_node *ast_call(ast_builder *b, loc l, const char *name, loc name_loc, ast_list args);
ast_node *ast_arg(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *value);
ast_node *ast_tuple(ast_builder *b, loc l, ast_list elems);
ast_node *ast_member(ast_builder *b, loc l, ast_node *obj, const char *name, loc name_loc);
ast_node *ast_index(ast_builder *b, loc l, ast_node *obj, ast_node *index);
ast_node *ast_type(ast_builder *b, loc l, const char *dtype, loc dtype_loc, ast_list dims);
ast_node *ast_annot(ast_builder *b, loc l, int kind, const char *axis, loc axis_loc, ast_node *dim);
ast_node *ast_assign(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *value, ast_list annots);
ast_node *ast_input(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *type, ast_list annots);
ast_node *ast_param(ast_builder *b, loc l, const char *name, loc name_loc, ast_node *type,
                    ast_node *init, ast_list annots);
ast_node *ast_repeat(ast_builder *b, loc l, ast_node *count, const char *label, loc label_loc,
                     ast_list body);
ast_node *ast_return(ast_builder *b, loc l, ast_node *value);
ast_node *ast_import(ast_builder *b, loc l, const char *path);
ast_node *ast_block(ast_builder *b, loc l, const char *name, loc name_loc, ast_list params,
                    ast_list body);
ast_node *ast_bparam(ast_builder *b, loc l, const char *name, ast_node *dflt);
ast_node *ast_model(ast_builder *b, loc l, const char *name, loc name_loc, ast_list body);
ast_node *ast_section(ast_builder *b, loc l, ast_kind kind, ast_list options);

/* --dump=ast: stable text, one node per line, indented, with line:col. */
void ast_dump(const ast_node *root, const diag_sink *d, FILE *out);

#endif
