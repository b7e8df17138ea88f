/* diag.h — source files, locations and diagnostics.
 *
 * Every token and AST node carries a `loc`: a byte range in one registered
 * source. Line and column are computed on demand from the source's line map.
 * Diagnostics render as
 *
 *     file:line:col: error: message
 *        12 |     x = gpt2_block(x, heads: hedas)
 *           |                              ^~~~~
 *
 * and go to a callback (default: a FILE*). Identical diagnostics are printed
 * once (a block instantiated twice reports its error once), and after
 * DIAG_MAX_ERRORS errors the sink stops and says so.
 */
#ifndef MESH_DIAG_H
#define MESH_DIAG_H

#include <stdarg.h>  /* va_list */
#include <stddef.h>  /* size_t */
#include <stdio.h>   /* FILE */

enum { DIAG_MAX_ERRORS = 50 };

typedef struct loc {
    int src;   /* index into the sink's sources, -1 if unknown */
    int start; /* byte offset of the first byte */
    int end;   /* one past the last byte */
} loc;

#define LOC_NONE ((loc){-1, -1, -1})

typedef enum diag_level { DIAG_ERROR, DIAG_WARNING, DIAG_NOTE } diag_level;

/* Receives each rendered diagnostic (several lines, '\n'-terminated). */
typedef void (*diag_fn)(void *ud, diag_level level, const char *text);

typedef struct src_file {
    char *name;        /* as shown in diagnostics */
    char *path;        /* canonical path (imports), NULL for buffers */
    char *text;        /* contents, NUL-terminated (may contain NULs) */
    size_t len;
    int *line_starts;  /* byte offset of each line */
    int n_lines;
} src_file;

typedef struct diag_sink diag_sink;

diag_sink *diag_new(diag_fn fn, void *ud);
void diag_free(diag_sink *d);
void diag_to_file(void *ud, diag_level level, const char *text); /* ud: FILE* */

/* Registers a source; takes ownership of `text` (malloc'ed, len bytes + NUL).
 * Returns its index, or -1 when out of memory. */
int diag_add_source(diag_sink *d, const char *name, const char *path, char *text, size_t len);
const src_file *diag_source(const diag_sink *d, int src);
int diag_source_count(const diag_sink *d);

/* 1-based line and column (columns count UTF-8 code points). */
void diag_line_col(const diag_sink *d, loc l, int *line, int *col);

void diag_report(diag_sink *d, diag_level level, loc l, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void diag_vreport(diag_sink *d, diag_level level, loc l, const char *fmt, va_list ap);

int diag_errors(const diag_sink *d);
int diag_warnings(const diag_sink *d);
int diag_stopped(const diag_sink *d); /* true once too many errors were seen */

#endif
