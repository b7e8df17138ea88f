/* parse.c — runs the generated scanner and parser over one source. */
#include "parse.h"
#include "parser.h"

#define YYSTYPE LEXYY_STYPE
#define YYLTYPE loc
#include "lexer.h"

static ast_node *run(ast_builder *b, diag_sink *d, int src, int offset, int start_token) {
    const src_file *s = diag_source(d, src);
    parse_ctx p = {0};
    p.b = b;
    p.diag = d;
    p.src = src;
    p.offset = offset;
    p.start_token = start_token;
    p.lex_err_end = -1;
    p.cur_loc = p.prev_loc = (loc){src, offset, offset};
    yyscan_t scanner;
    if (lexyy_lex_init_extra(&p, &scanner) != 0) return NULL;
    YY_BUFFER_STATE buf = lexyy__scan_bytes(s->text + offset, (int)((int)s->len - offset), scanner);
    lexyy_parse(scanner, &p);
    lexyy__delete_buffer(buf, scanner);
    lexyy_lex_destroy(scanner);
    return p.result;
}

ast_node *parse_file(ast_builder *b, diag_sink *d, int src) {
    ast_node *f = run(b, d, src, 0, 0);
    if (!f) {
        /* the parse aborted before reducing `start`: an empty file node */
        loc l = {src, 0, 0};
        f = ast_new(b, AST_FILE, l);
    }
    return f;
}

ast_node *parse_expr(ast_builder *b, diag_sink *d, int src, int offset) {
    int before = diag_errors(d);
    ast_node *e = run(b, d, src, offset, START_EXPR);
    return diag_errors(d) == before ? e : NULL;
}
