/* parse.h — the parser entry points and the state shared by lexer.l and
 * parser.y (a reentrant flex scanner and a pure bison parser; no globals). */
#ifndef MESH_PARSE_H
#define MESH_PARSE_H

#include "ast.h"

enum { PARSE_MAX_NESTING = 200 };

typedef struct parse_ctx {
    ast_builder *b;
    diag_sink *diag;
    int src;            /* source being read */
    int offset;         /* byte offset of the next token */
    int start_token;    /* token to return first (START_EXPR for --set), or 0 */
    int aborted;        /* the lexer stopped the parse; no more syntax errors */
    int depth;          /* open brackets */
    char open_kind[PARSE_MAX_NESTING + 1];
    loc open_loc[PARSE_MAX_NESTING + 1];
    char mismatch_kind; /* the opener a wrong closer was matched against */
    loc mismatch_loc;
    loc comment_loc;    /* start of the block comment being skipped */
    int cur_tok, prev_tok; /* the last two tokens returned, and where */
    loc cur_loc, prev_loc;
    int lex_err_end;    /* end of the last lexical error, -1 if none */
    ast_node *result;
    void *scanner;
} parse_ctx;

/* Parses source `src` as a whole file; returns its FILE node (never NULL;
 * errors go to the sink). */
ast_node *parse_file(ast_builder *b, diag_sink *d, int src);

/* Parses bytes [offset, end) of source `src` as one expression (`--set`
 * values); returns NULL after reporting an error. */
ast_node *parse_expr(ast_builder *b, diag_sink *d, int src, int offset);

#endif
