/* ast_dump.c — `meshc --dump=ast`: the tree as stable text.
 *
 * One node per line, two spaces of indent per level:
 *     KIND [payload] @line:col-line:col
 * Payloads: names bare, strings quoted with C escapes, floats in the
 * shortest form that reads back exactly. Golden tests pin this format.
 */
#include <inttypes.h> /* PRId64 */
#include <stdlib.h>   /* strtod */
#include <string.h>   /* strlen */

#include "ast.h"

static void put_float(FILE *out, double v) {
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* make floats recognisable: 1 -> 1.0 */
    fputs(buf, out);
    if (!strpbrk(buf, ".eEni")) fputs(".0", out);
}

static void put_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", out);
        else if (*p == '\t') fputs("\\t", out);
        else if (*p < 0x20 || *p == 0x7f) fprintf(out, "\\x%02x", *p);
        else fputc(*p, out);
    }
    fputc('"', out);
}

static void put_loc(FILE *out, const diag_sink *d, loc l) {
    if (l.src < 0) return;
    int l1, c1, l2, c2;
    diag_line_col(d, l, &l1, &c1);
    loc e = l;
    e.start = l.end;
    diag_line_col(d, e, &l2, &c2);
    fprintf(out, " @%d:%d-%d:%d", l1, c1, l2, c2);
}

static void dump(const ast_node *n, const diag_sink *d, FILE *out, int indent);

static void dump_list(const ast_list *l, const diag_sink *d, FILE *out, int indent) {
    for (const ast_node *c = l->first; c; c = c->next) dump(c, d, out, indent);
}

static void dump(const ast_node *n, const diag_sink *d, FILE *out, int indent) {
    if (!n) return;
    fprintf(out, "%*s%s", indent * 2, "", ast_kind_name(n->kind));
    switch (n->kind) {
    case AST_INT: fprintf(out, " %" PRId64, n->ival); break;
    case AST_FLOAT: fputc(' ', out); put_float(out, n->fval); break;
    case AST_BOOL: fputs(n->ival ? " true" : " false", out); break;
    case AST_STRING:
    case AST_IMPORT: fputc(' ', out); put_string(out, n->sval); break;
    case AST_UNARY:
    case AST_BINARY: fprintf(out, " '%c'", n->op); break;
    case AST_ANNOT: fprintf(out, " %s %s", n->op == 's' ? "split" : "replicate", n->name); break;
    case AST_REPEAT: if (n->name) fprintf(out, " as %s", n->name); break;
    case AST_FILE: {
        const src_file *s = diag_source(d, n->loc.src);
        if (s) fprintf(out, " %s", s->name);
        break;
    }
    default:
        if (n->name) fprintf(out, " %s", n->name);
        break;
    }
    if (n->kind != AST_FILE) put_loc(out, d, n->loc);
    fputc('\n', out);
    switch (n->kind) {
    case AST_BLOCK:
        dump_list(&n->list2, d, out, indent + 1);
        dump_list(&n->list, d, out, indent + 1);
        break;
    case AST_PARAM:
        dump(n->a, d, out, indent + 1);
        if (n->b) {
            fprintf(out, "%*sinit:\n", (indent + 1) * 2, "");
            dump(n->b, d, out, indent + 2);
        }
        dump_list(&n->list, d, out, indent + 1);
        break;
    default:
        dump(n->a, d, out, indent + 1);
        dump(n->b, d, out, indent + 1);
        dump_list(&n->list, d, out, indent + 1);
        break;
    }
}

void ast_dump(const ast_node *root, const diag_sink *d, FILE *out) {
    dump(root, d, out, 0);
}
