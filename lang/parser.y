/* parser.y — the .mesh grammar: a pure bison parser with byte-range
 * locations, %expect 0 and one ast_* call per action. The EBNF in
 * docs/language.md is this grammar. Syntax errors are reported with what was
 * expected, and the parser recovers at the next statement or item so one run
 * reports them all. */

%define api.pure full
%define api.prefix {lexyy_}
%define api.location.type {loc}
%define parse.error custom
%locations
%expect 0

%param {void *scanner}
%parse-param {parse_ctx *p}

%code requires {
#include "parse.h"
}

%code top {
#include <string.h> /* strcmp, strlen */
}

%code provides {
int lexyy_lex(LEXYY_STYPE *lval, loc *lloc, void *scanner);
}

%code {
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                   \
    do {                                                              \
        if (N) {                                                      \
            (Cur).src = YYRHSLOC(Rhs, 1).src;                         \
            (Cur).start = YYRHSLOC(Rhs, 1).start;                     \
            (Cur).end = YYRHSLOC(Rhs, N).end;                         \
        } else {                                                      \
            (Cur).src = YYRHSLOC(Rhs, 0).src;                         \
            (Cur).start = (Cur).end = YYRHSLOC(Rhs, 0).end;           \
        }                                                             \
    } while (0)

#define B (p->b)
static const ast_list NOLIST = {0, 0, 0};

static ast_list list1(ast_node *n) {
    ast_list l = NOLIST;
    ast_append(&l, n);
    return l;
}

static ast_list list_add(ast_list l, ast_node *n) {
    ast_append(&l, n);
    return l;
}

static void lexyy_error(const loc *l, void *scanner, parse_ctx *p, const char *msg);
}

%union {
    int64_t i;
    double f;
    const char *s;
    ast_node *node;
    ast_list list;
}

%token END 0            "end of file"
%token <i> INT          "integer"
%token <f> FLOAT        "number"
%token <s> STRING       "string"
%token <s> IDENT        "name"
%token IMPORT "import" MODEL "model" BLOCK "block" PARAM "param" INPUT "input"
%token REPEAT "repeat" AS "as" RETURN "return" MESH "mesh" TRAIN "train"
%token TRUE "true" FALSE "false"
%token ANNOT_SPLIT "@split" ANNOT_REPLICATE "@replicate"
%token START_EXPR "start of expression"

%left '+' '-'
%left '*' '/' '%' '@'
%precedence NEG

%type <node> item stmt expr postfix primary arg type annot bparam option
%type <node> init_opt
%type <list> items stmts body options opts annots bparams bparams_opt args args_opt exprs exprs_opt
%type <s> as_opt

%%

start
    : items                     { p->result = ast_section(B, @$, AST_FILE, $1);
                                  p->result->loc.src = p->src; }
    | START_EXPR expr           { p->result = $2; }
    ;

items
    : %empty                    { $$ = NOLIST; }
    | items item                { $$ = list_add($1, $2); }
    | items error               { $$ = $1; }
    ;

item
    : IMPORT STRING             { $$ = ast_import(B, @$, $2); }
    | IDENT '=' expr            { $$ = ast_assign(B, @$, $1, @1, $3, NOLIST); }
    | BLOCK IDENT '(' bparams_opt ')' body
                                { $$ = ast_block(B, @$, $2, @2, $4, $6); }
    | MODEL IDENT body          { $$ = ast_model(B, @$, $2, @2, $3); }
    | MESH options              { $$ = ast_section(B, @$, AST_MESH, $2); }
    | TRAIN options             { $$ = ast_section(B, @$, AST_TRAIN, $2); }
    | ';'                       { $$ = NULL; }
    ;

bparams_opt
    : %empty                    { $$ = NOLIST; }
    | bparams
    ;

bparams
    : bparam                    { $$ = list1($1); }
    | bparams ',' bparam        { $$ = list_add($1, $3); }
    ;

bparam
    : IDENT                     { $$ = ast_bparam(B, @$, $1, NULL); }
    | IDENT '=' expr            { $$ = ast_bparam(B, @1, $1, $3); }
    ;

options
    : '{' opts '}'              { $$ = $2; }
    ;

opts
    : %empty                    { $$ = NOLIST; }
    | opts option               { $$ = list_add($1, $2); }
    | opts ';'                  { $$ = $1; }
    | opts error                { $$ = $1; }
    ;

option
    : IDENT '=' expr            { $$ = ast_assign(B, @$, $1, @1, $3, NOLIST); }
    ;

body
    : '{' stmts '}'             { $$ = $2; }
    ;

stmts
    : %empty                    { $$ = NOLIST; }
    | stmts stmt                { $$ = list_add($1, $2); }
    | stmts error               { $$ = $1; }
    ;

stmt
    : IDENT '=' expr annots     { $$ = ast_assign(B, @$, $1, @1, $3, $4); }
    | INPUT IDENT ':' type annots
                                { $$ = ast_input(B, @$, $2, @2, $4, $5); }
    | PARAM IDENT ':' type init_opt annots
                                { $$ = ast_param(B, @$, $2, @2, $4, $5, $6); }
    | REPEAT expr as_opt body   { $$ = ast_repeat(B, @$, $2, $3, @3, $4); }
    | RETURN expr               { $$ = ast_return(B, @$, $2); }
    | ';'                       { $$ = NULL; }
    ;

as_opt
    : %empty                    { $$ = NULL; }
    | AS IDENT                  { $$ = $2; @$ = @2; }
    ;

init_opt
    : %empty                    { $$ = NULL; }
    | '=' expr                  { $$ = $2; }
    ;

type
    : '[' exprs_opt ']'         { $$ = ast_type(B, @$, NULL, LOC_NONE, $2); }
    | IDENT '[' exprs_opt ']'   { $$ = ast_type(B, @$, $1, @1, $3); }
    ;

annots
    : %empty                    { $$ = NOLIST; }
    | annots annot              { $$ = list_add($1, $2); }
    ;

annot
    : ANNOT_SPLIT '(' IDENT ',' expr ')'
                                { $$ = ast_annot(B, @$, 's', $3, @3, $5); }
    | ANNOT_REPLICATE '(' IDENT ')'
                                { $$ = ast_annot(B, @$, 'r', $3, @3, NULL); }
    ;

expr
    : expr '+' expr             { $$ = ast_binary(B, '+', $1, $3); }
    | expr '-' expr             { $$ = ast_binary(B, '-', $1, $3); }
    | expr '*' expr             { $$ = ast_binary(B, '*', $1, $3); }
    | expr '/' expr             { $$ = ast_binary(B, '/', $1, $3); }
    | expr '%' expr             { $$ = ast_binary(B, '%', $1, $3); }
    | expr '@' expr             { $$ = ast_binary(B, '@', $1, $3); }
    | '-' expr %prec NEG        { $$ = ast_unary(B, @1, '-', $2); }
    | postfix
    ;

postfix
    : primary
    | postfix '.' IDENT         { $$ = ast_member(B, @$, $1, $3, @3); }
    | postfix '[' expr ']'      { $$ = ast_index(B, @$, $1, $3); }
    ;

primary
    : INT                       { $$ = ast_int(B, @$, $1); }
    | FLOAT                     { $$ = ast_float(B, @$, $1); }
    | STRING                    { $$ = ast_string(B, @$, $1); }
    | TRUE                      { $$ = ast_bool(B, @$, 1); }
    | FALSE                     { $$ = ast_bool(B, @$, 0); }
    | IDENT                     { $$ = ast_name(B, @$, $1); }
    | IDENT '(' args_opt ')'    { $$ = ast_call(B, @$, $1, @1, $3); }
    | '(' expr ')'              { $$ = $2; $$->loc = @$; }
    | '(' expr ',' ')'          { $$ = ast_tuple(B, @$, list1($2)); }
    | '(' expr ',' exprs ')'    { ast_list l = list1($2);
                                  for (ast_node *n = $4.first, *nx; n; n = nx) {
                                      nx = n->next;
                                      ast_append(&l, n);
                                  }
                                  $$ = ast_tuple(B, @$, l); }
    ;

args_opt
    : %empty                    { $$ = NOLIST; }
    | args
    ;

args
    : arg                       { $$ = list1($1); }
    | args ',' arg              { $$ = list_add($1, $3); }
    ;

arg
    : expr                      { $$ = ast_arg(B, @$, NULL, LOC_NONE, $1); }
    | IDENT ':' expr            { $$ = ast_arg(B, @$, $1, @1, $3); }
    ;

exprs_opt
    : %empty                    { $$ = NOLIST; }
    | exprs
    ;

exprs
    : expr                      { $$ = list1($1); }
    | exprs ',' expr            { $$ = list_add($1, $3); }
    ;

%%

/* The token as the user wrote it, for messages: name 'foo', '}', ... */
static void describe(parse_ctx *p, yysymbol_kind_t k, loc l, char *buf, size_t n) {
    const src_file *s = diag_source(p->diag, l.src);
    int len = l.end - l.start;
    const char *text = s && l.start >= 0 ? s->text + l.start : "";
    if (len > 40) len = 40;
    if (len < 0) len = 0;
    switch (k) {
    case YYSYMBOL_IDENT: snprintf(buf, n, "name '%.*s'", len, text); break;
    case YYSYMBOL_INT: snprintf(buf, n, "integer %.*s", len, text); break;
    case YYSYMBOL_FLOAT: snprintf(buf, n, "number %.*s", len, text); break;
    case YYSYMBOL_STRING: snprintf(buf, n, "string"); break;
    default: {
        const char *name = yysymbol_name(k);
        size_t nl = strlen(name);
        if (nl >= 2 && name[0] == '"') snprintf(buf, n, "'%.*s'", (int)nl - 2, name + 1);
        else snprintf(buf, n, "%s", name);
        if (k == YYSYMBOL_YYEOF) snprintf(buf, n, "end of file");
        break;
    }
    }
}

/* Is symbol k the character token c? (Their enum names depend on order.) */
static int is_char(yysymbol_kind_t k, char c) {
    const char *n = yysymbol_name(k);
    return n[0] == '\'' && n[1] == c && n[2] == '\'' && n[3] == '\0';
}

/* A keyword where a name belongs: `return = 3`, `block param(x)`. Reports
 * it and returns 1, or returns 0 if the error is something else. */
static int keyword_as_name(const yypcontext_t *ctx, parse_ctx *p) {
    yysymbol_kind_t tok = yypcontext_token(ctx);
    loc kw = LOC_NONE;
    if (tok >= YYSYMBOL_IMPORT && tok <= YYSYMBOL_FALSE) {
        yysymbol_kind_t exp[YYNTOKENS];
        int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
        for (int i = 0; i < n; i++)
            if (exp[i] == YYSYMBOL_IDENT) kw = *yypcontext_location(ctx);
    } else if (is_char(tok, '=') && p->prev_tok >= IMPORT && p->prev_tok <= FALSE) {
        kw = p->prev_loc; /* `repeat = 3`: the keyword was shifted, '=' is the error */
    }
    if (kw.src < 0) return 0;
    const src_file *s = diag_source(p->diag, kw.src);
    diag_report(p->diag, DIAG_ERROR, kw, "'%.*s' is a keyword and cannot be used as a name", kw.end - kw.start,
                s->text + kw.start);
    return 1;
}

/* "unexpected X; expected A, B or C", then a note at an unclosed or
 * mismatched bracket when that is the likely cause. */
static int yyreport_syntax_error(const yypcontext_t *ctx, void *scanner, parse_ctx *p) {
    (void)scanner;
    if (p->aborted) return 0;
    enum { MAX_EXPECTED = 6 };
    loc at = *yypcontext_location(ctx);
    /* right after a lexical error, the syntax error is its echo */
    if (p->lex_err_end >= 0 && p->lex_err_end > p->prev_loc.end && p->lex_err_end <= at.start + 1) {
        p->lex_err_end = -1;
        return 0;
    }
    if (keyword_as_name(ctx, p)) return 0;
    yysymbol_kind_t exp[MAX_EXPECTED];
    int n = yypcontext_expected_tokens(ctx, exp, MAX_EXPECTED);
    yysymbol_kind_t tok = yypcontext_token(ctx);
    loc l = *yypcontext_location(ctx);
    char what[96], msg[512];
    describe(p, tok, l, what, sizeof what);
    int k = snprintf(msg, sizeof msg, "unexpected %s", what);
    if (n > 0 && n <= 5) {
        k += snprintf(msg + k, sizeof msg - (size_t)k, "; expected ");
        for (int i = 0; i < n; i++) {
            char e[96];
            describe(p, exp[i], LOC_NONE, e, sizeof e);
            if (exp[i] == YYSYMBOL_IDENT) snprintf(e, sizeof e, "a name");
            if (exp[i] == YYSYMBOL_INT) snprintf(e, sizeof e, "an integer");
            if (exp[i] == YYSYMBOL_STRING) snprintf(e, sizeof e, "a string");
            k += snprintf(msg + k, sizeof msg - (size_t)k, "%s%s",
                          i == 0 ? "" : i == n - 1 ? " or " : ", ", e);
            if (k >= (int)sizeof msg) break;
        }
    } else if (n > 5) {
        snprintf(msg + k, sizeof msg - (size_t)k, " here");
    }
    if (p->prev_tok == ',' && (is_char(tok, ')') || is_char(tok, ']')))
        snprintf(msg + k, sizeof msg - (size_t)k > 0 ? sizeof msg - (size_t)k : 0, " (remove the trailing comma)");
    diag_report(p->diag, DIAG_ERROR, l, "%s", msg);
    if (tok == YYSYMBOL_YYEOF && p->depth > 0) {
        diag_report(p->diag, DIAG_NOTE, p->open_loc[p->depth - 1], "'%c' opened here is never closed",
                    p->open_kind[p->depth - 1]);
    } else if (p->mismatch_kind) {
        diag_report(p->diag, DIAG_NOTE, p->mismatch_loc, "to match this '%c'", p->mismatch_kind);
    } else if (p->depth > 0 && p->open_kind[p->depth - 1] != '{') {
        int l1, c1, l2, c2;
        diag_line_col(p->diag, p->open_loc[p->depth - 1], &l1, &c1);
        diag_line_col(p->diag, l, &l2, &c2);
        if (l1 < l2)
            diag_report(p->diag, DIAG_NOTE, p->open_loc[p->depth - 1], "'%c' opened here is not closed",
                        p->open_kind[p->depth - 1]);
    }
    p->mismatch_kind = 0;
    return 0;
}

/* Errors that bison raises itself (stack exhaustion on absurd nesting). */
static void lexyy_error(const loc *l, void *scanner, parse_ctx *p, const char *msg) {
    (void)scanner;
    if (p->aborted) return;
    if (strcmp(msg, "memory exhausted") == 0)
        diag_report(p->diag, DIAG_ERROR, *l, "expression is nested too deeply");
    else
        diag_report(p->diag, DIAG_ERROR, *l, "%s", msg);
    p->aborted = 1;
}
