/* diag.c — source registry, line maps and diagnostic rendering (diag.h). */
#include "diag.h"

#include <stdint.h> /* uint64_t */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* memcmp */

enum { DIAG_WINDOW = 160, SEEN_BITS = 12 };

struct diag_sink {
    diag_fn fn;
    void *ud;
    src_file *srcs;
    int n_srcs, cap_srcs;
    int errors, warnings, stopped;
    int last_suppressed; /* the previous error was a duplicate: drop its notes */
    uint64_t *seen;      /* hashes of printed diagnostics */
    int n_seen, cap_seen;
};

/* A growable text buffer, just for rendering one diagnostic. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void sb_vprintf(sbuf *b, const char *fmt, va_list ap) {
    char tmp[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { sb_putn(b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = 1; return; }
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    sb_putn(b, big, (size_t)n);
    free(big);
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(b, fmt, ap);
    va_end(ap);
}

diag_sink *diag_new(diag_fn fn, void *ud) {
    diag_sink *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->fn = fn;
    d->ud = ud;
    return d;
}

void diag_free(diag_sink *d) {
    if (!d) return;
    for (int i = 0; i < d->n_srcs; i++) {
        free(d->srcs[i].name);
        free(d->srcs[i].path);
        free(d->srcs[i].text);
        free(d->srcs[i].line_starts);
    }
    free(d->srcs);
    free(d->seen);
    free(d);
}

void diag_to_file(void *ud, diag_level level, const char *text) {
    (void)level;
    if (ud) fputs(text, (FILE *)ud);
}

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

int diag_add_source(diag_sink *d, const char *name, const char *path, char *text, size_t len) {
    if (d->n_srcs == d->cap_srcs) {
        int cap = d->cap_srcs ? 2 * d->cap_srcs : 8;
        src_file *s = realloc(d->srcs, (size_t)cap * sizeof *s);
        if (!s) { free(text); return -1; }
        d->srcs = s;
        d->cap_srcs = cap;
    }
    int n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += text[i] == '\n';
    int *starts = malloc((size_t)n_lines * sizeof *starts);
    char *nm = dup_or_null(name), *pt = dup_or_null(path);
    if (!starts || !nm || (path && !pt)) {
        free(starts); free(nm); free(pt); free(text);
        return -1;
    }
    int k = 0;
    starts[k++] = 0;
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\n') starts[k++] = (int)i + 1;
    src_file *s = &d->srcs[d->n_srcs];
    s->name = nm;
    s->path = pt;
    s->text = text;
    s->len = len;
    s->line_starts = starts;
    s->n_lines = n_lines;
    return d->n_srcs++;
}

const src_file *diag_source(const diag_sink *d, int src) {
    return src >= 0 && src < d->n_srcs ? &d->srcs[src] : NULL;
}

int diag_source_count(const diag_sink *d) { return d->n_srcs; }

/* Index of the line holding byte `off` (binary search in line_starts). */
static int line_of(const src_file *s, int off) {
    int lo = 0, hi = s->n_lines - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (s->line_starts[mid] <= off) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* Length of the valid UTF-8 sequence at t[i] (before `end`), or 0 when the
 * byte does not start one. ASCII is 1. */
static int utf8_len(const char *t, int i, int end) {
    unsigned char c = (unsigned char)t[i];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > end || (n == 2 && c < 0xC2)) return 0;
    for (int k = 1; k < n; k++)
        if (((unsigned char)t[i + k] & 0xC0) != 0x80) return 0;
    return n;
}

/* Steps over one display column at t[i]: a code point, or one byte of
 * invalid UTF-8 (shown as '?'). */
static int step(const char *t, int i, int end) {
    int n = utf8_len(t, i, end);
    return n ? n : 1;
}

/* Display width of bytes [a, b) of a line: one column per code point (tabs
 * count one) and per invalid byte. */
static int width(const char *t, int a, int b) {
    int w = 0;
    for (int i = a; i < b; i += step(t, i, b)) w++;
    return w;
}

/* Replaces control bytes and invalid UTF-8 in p[0..n) with '?', in place. */
static void sanitize(char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        int k = utf8_len(p, (int)i, (int)n);
        if (k == 0 || (c < 0x20 && c != '\t') || c == 0x7f) {
            p[i++] = '?';
            continue;
        }
        i += (size_t)k;
    }
}

void diag_line_col(const diag_sink *d, loc l, int *line, int *col) {
    const src_file *s = diag_source(d, l.src);
    *line = *col = 0;
    if (!s || l.start < 0) return;
    int off = l.start > (int)s->len ? (int)s->len : l.start;
    int ln = line_of(s, off);
    *line = ln + 1;
    *col = width(s->text, s->line_starts[ln], off) + 1;
}

/* Appends the source line and the caret/underline for `l`. Long lines show a
 * window around the column; control bytes print as '?'. */
static void render_snippet(sbuf *b, const src_file *s, loc l) {
    int off = l.start > (int)s->len ? (int)s->len : l.start;
    int ln = line_of(s, off);
    int ls = s->line_starts[ln];
    int le = ls;
    while (le < (int)s->len && s->text[le] != '\n') le++;
    if (le > ls && s->text[le - 1] == '\r') le--;
    int end = l.end > le ? le : l.end;
    if (end < off) end = off;
    int ws = ls, we = le;
    const char *pre = "", *post = "";
    if (le - ls > DIAG_WINDOW) {
        ws = off - DIAG_WINDOW / 2 > ls ? off - DIAG_WINDOW / 2 : ls;
        while (ws > ls && ((unsigned char)s->text[ws] & 0xC0) == 0x80) ws--;
        we = ws + DIAG_WINDOW < le ? ws + DIAG_WINDOW : le;
        while (we < le && ((unsigned char)s->text[we] & 0xC0) == 0x80) we++;
        if (ws > ls) pre = "...";
        if (we < le) post = "...";
        if (end > we) end = we;
    }
    char num[32];
    int nw = snprintf(num, sizeof num, "%d", ln + 1);
    if (nw < 4) nw = 4;
    sb_printf(b, " %*d | %s", nw, ln + 1, pre);
    size_t at = b->n;
    sb_putn(b, s->text + ws, (size_t)(we - ws));
    if (!b->oom) sanitize(b->p + at, (size_t)(we - ws));
    sb_printf(b, "%s\n %*s | %s", post, nw, "", *pre ? "   " : "");
    for (int i = ws; i < off; i += step(s->text, i, we > off ? we : off))
        sb_putn(b, s->text[i] == '\t' ? "\t" : " ", 1);
    sb_puts(b, "^");
    int under = width(s->text, off, end) - 1;
    for (int i = 0; i < under; i++) sb_puts(b, "~");
    sb_puts(b, "\n");
}

static uint64_t hash_text(const char *t, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)t[i]) * 1099511628211ull;
    return h ? h : 1;
}

/* Returns 1 if `h` was seen before; records it otherwise. */
static int seen_before(diag_sink *d, uint64_t h) {
    if (d->n_seen * 2 >= d->cap_seen) {
        int cap = d->cap_seen ? 2 * d->cap_seen : 1 << SEEN_BITS;
        uint64_t *t = calloc((size_t)cap, sizeof *t);
        if (!t) return 0;
        for (int i = 0; i < d->cap_seen; i++) {
            uint64_t v = d->seen[i];
            if (!v) continue;
            size_t j = (size_t)(v & (uint64_t)(cap - 1));
            while (t[j]) j = (j + 1) & (size_t)(cap - 1);
            t[j] = v;
        }
        free(d->seen);
        d->seen = t;
        d->cap_seen = cap;
    }
    size_t j = (size_t)(h & (uint64_t)(d->cap_seen - 1));
    while (d->seen[j]) {
        if (d->seen[j] == h) return 1;
        j = (j + 1) & (size_t)(d->cap_seen - 1);
    }
    d->seen[j] = h;
    d->n_seen++;
    return 0;
}

void diag_vreport(diag_sink *d, diag_level level, loc l, const char *fmt, va_list ap) {
    if (d->stopped) return;
    if (level == DIAG_NOTE && d->last_suppressed) return;
    static const char *const names[] = {"error", "warning", "note"};
    sbuf b = {0};
    const src_file *s = diag_source(d, l.src);
    if (s && l.start >= 0) {
        int line, col;
        diag_line_col(d, l, &line, &col);
        sb_printf(&b, "%s:%d:%d: %s: ", s->name, line, col, names[level]);
    } else if (s) {
        sb_printf(&b, "%s: %s: ", s->name, names[level]);
    } else {
        sb_printf(&b, "meshc: %s: ", names[level]);
    }
    size_t msg = b.n;
    sb_vprintf(&b, fmt, ap);
    if (!b.oom) sanitize(b.p + msg, b.n - msg);
    sb_puts(&b, "\n");
    if (s && l.start >= 0) render_snippet(&b, s, l);
    if (b.oom) { free(b.p); return; }
    if (level != DIAG_NOTE) {
        d->last_suppressed = seen_before(d, hash_text(b.p, b.n));
        if (d->last_suppressed) { free(b.p); return; }
    }
    if (level == DIAG_ERROR) d->errors++;
    if (level == DIAG_WARNING) d->warnings++;
    if (d->fn) d->fn(d->ud, level, b.p);
    free(b.p);
    if (level == DIAG_ERROR && d->errors >= DIAG_MAX_ERRORS) {
        if (d->fn)
            d->fn(d->ud, DIAG_NOTE, "meshc: too many errors (50); stopping here\n");
        d->stopped = 1;
    }
}

void diag_report(diag_sink *d, diag_level level, loc l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(d, level, l, fmt, ap);
    va_end(ap);
}

int diag_errors(const diag_sink *d) { return d->errors; }
int diag_warnings(const diag_sink *d) { return d->warnings; }
int diag_stopped(const diag_sink *d) { return d->stopped; }
