/* plan_read.c — reading a plan file (see plan.h, and "The plan file" in docs/plan.md).
 *
 * Two passes. libyaml's event parser builds a small tree of the document
 * (maps, sequences, scalars, each with its line and column); anchors,
 * aliases, tags and second documents are refused, so the tree is exactly
 * what the text shows. Then the tree is checked against the format and
 * copied into a plan: first the magic and the format version (so a plan
 * of another version gets that message, not a complaint about its keys),
 * then every section, with its keys, types, ranges and the ids that point
 * into other sections. The first problem ends the read with its
 * "LINE:COL: message".
 *
 * Nothing is trusted: sizes come from the tree, so every allocation is
 * bounded by the input's length, and every id is checked before use.
 */
#include "plan.h"
#include "plan_check.h" /* plan_check_tensor */

#include <errno.h>  /* errno, ERANGE */
#include <math.h>   /* isfinite */
#include <stdarg.h> /* va_list */
#include <stdlib.h> /* calloc, realloc, free, strtoll, strtod */
#include <string.h> /* memset, strcmp, strlen */

#include <yaml.h> /* yaml_parser_*, yaml_event_* */

enum { MAX_DEPTH = 16, NO_NODE = -1 };

/* ---- The document tree ---------------------------------------------- */

typedef enum ykind { Y_SCALAR, Y_SEQ, Y_MAP } ykind;

typedef struct ynode {
    ykind kind;
    int line, col;       /* 1-based */
    int plain;           /* scalar: written without quotes */
    size_t str, len;     /* scalar: its text at rd.chars + str, NUL-terminated */
    int first, last;     /* children: items, or keys and values in turn */
    int next;            /* the next sibling */
    int n;               /* number of children */
} ynode;

typedef struct rd {
    ynode *nodes;
    int n_nodes, cap_nodes;
    char *chars;
    size_t n_chars, cap_chars;
    int end_line, end_col; /* where the stream ends */
    char *err;
    size_t errn;
    int failed;
} rd;

static int fail_at(rd *r, int line, int col, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Records the first error as "LINE:COL: message"; returns -1. */
static int fail_at(rd *r, int line, int col, const char *fmt, ...) {
    if (r->failed) return -1;
    r->failed = 1;
    if (!r->err || r->errn == 0) return -1;
    int k = snprintf(r->err, r->errn, "%d:%d: ", line, col);
    if (k < 0 || (size_t)k >= r->errn) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + k, r->errn - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static int fail(rd *r, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(rd *r, int node, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = node >= 0 ? r->nodes[node].line : 1, col = node >= 0 ? r->nodes[node].col : 1;
    return fail_at(r, line, col, "%s", msg);
}

static const char *text_of(const rd *r, int node) { return r->chars + r->nodes[node].str; }

/* A scalar for messages: at most 40 bytes, non-printable bytes as '?'. */
static const char *shown(const rd *r, int node, char *buf, size_t n) {
    const char *s = text_of(r, node);
    size_t len = r->nodes[node].len, k = 0;
    for (size_t i = 0; i < len && k + 4 < n && i < 40; i++)
        buf[k++] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    if (len > 40 && k + 4 < n) buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
    buf[k] = '\0';
    return buf;
}

static int new_node(rd *r, ykind kind, yaml_mark_t m) {
    if (r->n_nodes == r->cap_nodes) {
        int cap = r->cap_nodes ? 2 * r->cap_nodes : 256;
        ynode *n = realloc(r->nodes, (size_t)cap * sizeof *n);
        if (!n) return -1;
        r->nodes = n;
        r->cap_nodes = cap;
    }
    ynode *y = &r->nodes[r->n_nodes];
    memset(y, 0, sizeof *y);
    y->kind = kind;
    y->line = (int)m.line + 1;
    y->col = (int)m.column + 1;
    y->first = y->last = y->next = NO_NODE;
    return r->n_nodes++;
}

static int add_chars(rd *r, const unsigned char *s, size_t len) {
    if (r->cap_chars - r->n_chars < len + 1) {
        size_t cap = r->cap_chars ? r->cap_chars : 4096;
        while (cap - r->n_chars < len + 1) cap *= 2;
        char *c = realloc(r->chars, cap);
        if (!c) return -1;
        r->chars = c;
        r->cap_chars = cap;
    }
    memcpy(r->chars + r->n_chars, s, len);
    r->chars[r->n_chars + len] = '\0';
    r->n_chars += len + 1;
    return 0;
}

static void attach(rd *r, int parent, int child) {
    ynode *p = &r->nodes[parent];
    if (p->last >= 0) r->nodes[p->last].next = child;
    else p->first = child;
    p->last = child;
    p->n++;
}

/* Line and column of a byte offset (libyaml's reader errors give only the
 * offset). */
static void locate(const char *text, size_t len, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (text[i] == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

static int syntax_error(rd *r, const yaml_parser_t *ps, const char *text, size_t len) {
    if (ps->error == YAML_MEMORY_ERROR) return fail_at(r, 1, 1, "out of memory");
    int line, col;
    if (ps->error == YAML_READER_ERROR) {
        locate(text, len, ps->problem_offset, &line, &col);
        return fail_at(r, line, col, "not a mesh plan: %s (not YAML text)",
                       ps->problem ? ps->problem : "unreadable bytes");
    }
    line = (int)ps->problem_mark.line + 1;
    col = (int)ps->problem_mark.column + 1;
    if (ps->context)
        return fail_at(r, line, col, "malformed plan: YAML syntax error: %s %s (from line %d)",
                       ps->problem ? ps->problem : "?", ps->context, (int)ps->context_mark.line + 1);
    return fail_at(r, line, col, "malformed plan: YAML syntax error: %s", ps->problem ? ps->problem : "?");
}

/* The event's anchor and tag, which a plan never has. */
static int plain_event(rd *r, const yaml_event_t *ev) {
    const yaml_char_t *anchor = NULL, *tag = NULL;
    if (ev->type == YAML_SCALAR_EVENT) anchor = ev->data.scalar.anchor, tag = ev->data.scalar.tag;
    if (ev->type == YAML_SEQUENCE_START_EVENT) anchor = ev->data.sequence_start.anchor,
                                               tag = ev->data.sequence_start.tag;
    if (ev->type == YAML_MAPPING_START_EVENT) anchor = ev->data.mapping_start.anchor,
                                              tag = ev->data.mapping_start.tag;
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    if (anchor) return fail_at(r, line, col, "anchors (&name) are not allowed in a plan");
    if (tag) return fail_at(r, line, col, "tags (!name) are not allowed in a plan");
    return 0;
}

/* Builds the tree of the one document in text; returns its root, or -1. */
static int load(rd *r, const char *text, size_t len) {
    yaml_parser_t ps;
    if (!yaml_parser_initialize(&ps)) return fail_at(r, 1, 1, "out of memory");
    yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
    int stack[MAX_DEPTH], depth = 0, root = NO_NODE, docs = 0, done = 0;
    while (!done && !r->failed) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&ps, &ev)) {
            syntax_error(r, &ps, text, len);
            break;
        }
        int line = (int)ev.start_mark.line + 1, col = (int)ev.start_mark.column + 1, id = NO_NODE;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            r->end_line = line;
            r->end_col = col;
            done = 1;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) fail_at(r, line, col, "a plan is one YAML document; a second one starts here");
            break;
        case YAML_ALIAS_EVENT:
            fail_at(r, line, col, "aliases (*name) are not allowed in a plan");
            break;
        case YAML_SCALAR_EVENT:
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (plain_event(r, &ev) < 0) break;
            id = new_node(r, ev.type == YAML_SCALAR_EVENT ? Y_SCALAR : ev.type == YAML_SEQUENCE_START_EVENT ? Y_SEQ
                                                                                                          : Y_MAP,
                          ev.start_mark);
            if (id < 0) {
                fail_at(r, line, col, "out of memory");
                break;
            }
            if (ev.type == YAML_SCALAR_EVENT) {
                r->nodes[id].plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
                r->nodes[id].str = r->n_chars;
                r->nodes[id].len = ev.data.scalar.length;
                if (add_chars(r, ev.data.scalar.value, ev.data.scalar.length) < 0) {
                    fail_at(r, line, col, "out of memory");
                    break;
                }
            }
            if (depth > 0) attach(r, stack[depth - 1], id);
            else root = id;
            if (ev.type != YAML_SCALAR_EVENT) {
                if (depth == MAX_DEPTH) fail_at(r, line, col, "nested more than %d levels deep", MAX_DEPTH);
                else stack[depth++] = id;
            }
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            if (depth > 0) depth--;
            break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&ps);
    if (r->failed) return -1;
    if (root < 0) return fail_at(r, 1, 1, "not a mesh plan: the file is empty");
    return root;
}

/* ---- Typed access --------------------------------------------------- */

/* The key after key k of a map (skipping k's value), or NO_NODE. */
static int next_key(const rd *r, int k) {
    int v = r->nodes[k].next;
    return v >= 0 ? r->nodes[v].next : NO_NODE;
}

/* The value of `key` in map m, or NO_NODE (no other checks). */
static int lookup(const rd *r, int m, const char *key) {
    for (int k = r->nodes[m].first; k >= 0; k = next_key(r, k))
        if (r->nodes[k].kind == Y_SCALAR && strcmp(text_of(r, k), key) == 0) return r->nodes[k].next;
    return NO_NODE;
}

/* Checks that m is a map whose keys are exactly `keys` (NULL-terminated; a
 * leading '?' marks an optional one), each once, and puts each value in
 * val[i] (NO_NODE when an optional key is absent). */
static int fields(rd *r, int m, const char *what, const char *const keys[], int *val) {
    int nk = 0;
    while (keys[nk]) val[nk++] = NO_NODE;
    if (r->nodes[m].kind != Y_MAP) return fail(r, m, "%s must be a map of keys to values", what);
    for (int k = r->nodes[m].first; k >= 0; k = next_key(r, k)) {
        char b[64];
        if (r->nodes[k].next < 0) return fail(r, k, "%s: a key without a value", what);
        if (r->nodes[k].kind != Y_SCALAR) return fail(r, k, "%s: a key must be a plain name", what);
        int i = 0;
        while (i < nk && strcmp(keys[i] + (keys[i][0] == '?'), text_of(r, k)) != 0) i++;
        if (i == nk) return fail(r, k, "unknown key '%s' in %s", shown(r, k, b, sizeof b), what);
        if (val[i] >= 0) return fail(r, k, "duplicate key '%s' in %s", shown(r, k, b, sizeof b), what);
        val[i] = r->nodes[k].next;
    }
    for (int i = 0; i < nk; i++)
        if (val[i] < 0 && keys[i][0] != '?') return fail(r, m, "%s has no key '%s'", what, keys[i]);
    return 0;
}

static int get_int(rd *r, int v, const char *what, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    char b[64];
    if (r->nodes[v].kind == Y_SCALAR && r->nodes[v].plain) {
        const char *s = text_of(r, v);
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        int digits = s[0] >= '0' && s[0] <= '9' ? 1 : s[0] == '-' && s[1] >= '0' && s[1] <= '9';
        if (digits && *end == '\0' && errno == 0 && x >= lo && x <= hi) {
            *out = x;
            return 0;
        }
        if (digits && *end == '\0' && lo == hi)
            return fail(r, v, "%s: %s must be %lld, not %s", what, key, (long long)lo, shown(r, v, b, sizeof b));
        if (digits && *end == '\0')
            return fail(r, v, "%s: %s must be from %lld to %lld, not %s", what, key, (long long)lo, (long long)hi,
                        shown(r, v, b, sizeof b));
        return fail(r, v, "%s: %s must be an integer, not '%s'", what, key, shown(r, v, b, sizeof b));
    }
    return fail(r, v, "%s: %s must be an integer", what, key);
}

/* get_int into an int */
static int get_i(rd *r, int v, const char *what, const char *key, int64_t lo, int64_t hi, int *out) {
    int64_t x;
    if (get_int(r, v, what, key, lo, hi, &x) < 0) return -1;
    *out = (int)x;
    return 0;
}

static int get_ll(rd *r, int v, const char *what, const char *key, int64_t lo, int64_t hi, long long *out) {
    int64_t x;
    if (get_int(r, v, what, key, lo, hi, &x) < 0) return -1;
    *out = x;
    return 0;
}

static int get_double(rd *r, int v, const char *what, const char *key, double *out) {
    char b[64];
    if (r->nodes[v].kind == Y_SCALAR && r->nodes[v].plain && r->nodes[v].len > 0) {
        char *end;
        double x = strtod(text_of(r, v), &end);
        if (*end == '\0' && isfinite(x)) {
            *out = x;
            return 0;
        }
        return fail(r, v, "%s: %s must be a finite number, not '%s'", what, key, shown(r, v, b, sizeof b));
    }
    return fail(r, v, "%s: %s must be a number", what, key);
}

static int get_bool(rd *r, int v, const char *what, const char *key, int *out) {
    if (r->nodes[v].kind == Y_SCALAR && r->nodes[v].plain) {
        if (strcmp(text_of(r, v), "true") == 0) return *out = 1, 0;
        if (strcmp(text_of(r, v), "false") == 0) return *out = 0, 0;
    }
    return fail(r, v, "%s: %s must be true or false", what, key);
}

/* A string (any style), copied; NUL bytes are refused. */
static int get_str(rd *r, int v, const char *what, const char *key, char **out) {
    if (r->nodes[v].kind != Y_SCALAR) return fail(r, v, "%s: %s must be a string", what, key);
    if (strlen(text_of(r, v)) != r->nodes[v].len) return fail(r, v, "%s: %s holds a NUL byte", what, key);
    *out = strdup(text_of(r, v));
    if (!*out) return fail(r, v, "out of memory");
    return 0;
}

/* One of the names name(0) .. name(count-1), written plain. */
static int get_name(rd *r, int v, const char *what, const char *key, const char *(*name)(int), int count,
                    int *out) {
    char b[64];
    if (r->nodes[v].kind == Y_SCALAR && r->nodes[v].plain)
        for (int i = 0; i < count; i++)
            if (strcmp(text_of(r, v), name(i)) == 0) return *out = i, 0;
    char list[256];
    size_t k = 0;
    for (int i = 0; i < count && k < sizeof list; i++) {
        int w = snprintf(list + k, sizeof list - k, "%s%s", i ? (i + 1 == count ? " or " : ", ") : "", name(i));
        if (w < 0) break;
        k += (size_t)w;
    }
    if (r->nodes[v].kind != Y_SCALAR) return fail(r, v, "%s: %s must be %s", what, key, list);
    return fail(r, v, "%s: %s must be %s, not '%s'", what, key, list, shown(r, v, b, sizeof b));
}

static int get_seq(rd *r, int v, const char *what, const char *key, int min, int max) {
    if (r->nodes[v].kind != Y_SEQ) return fail(r, v, "%s: %s must be a list", what, key);
    if (r->nodes[v].n < min || r->nodes[v].n > max) {
        if (min == max) return fail(r, v, "%s: %s must have %d items, not %d", what, key, min, r->nodes[v].n);
        return fail(r, v, "%s: %s must have %d to %d items, not %d", what, key, min, max, r->nodes[v].n);
    }
    return 0;
}

/* name tables as int -> name, for get_name */
static const char *op_name(int i) { return graph_op_name((g_op)i); }
static const char *dtype_name(int i) { return plan__dtype_name((plan_dtype)i); }
static const char *phase_name(int i) { return plan_phase_name((plan_phase)i); }
static const char *step_name(int i) { return shard_step_name((shard_step_kind)i); }
static const char *axis_name(int i) { return plan__axis_name(i); }
static const char *kind_name(int i) { return sched_kind_name((sched_kind)i); }
static const char *unit_name(int i) { return plan__unit_name((sched_op)i); }
static const char *init_name(int i) {
    static const char *const n[] = {"normal", "zeros", "ones"};
    return i >= 0 && i < 3 ? n[i] : "?";
}
static const char *optim_name(int i) { return i == 0 ? "adamw" : "?"; }
static const char *lr_name(int i) {
    static const char *const n[] = {"constant", "cosine", "linear"};
    return i >= 0 && i < 3 ? n[i] : "?";
}
static const char *precision_name(int i) { return plan__precision_name(i); }
static const char *act_name(int i) { return i ? "gelu" : "swiglu"; }

/* ---- Sections ------------------------------------------------------- */

enum { MAX_AXIS = 1 << 24, MAX_INT = 0x7fffffff };
#define MAX_I64 INT64_MAX

/* a * b, or -1 when it overflows int64 (both >= 0) */
static int64_t mul(int64_t a, int64_t b) { return a == 0 || b <= MAX_I64 / a ? a * b : -1; }

static int read_mesh(rd *r, int m, fe_setup *s) {
    static const char *const keys[] = {"dp", "tp", "pp", "ep", "world", NULL};
    int v[5];
    if (fields(r, m, "mesh", keys, v) < 0 || get_ll(r, v[0], "mesh", "dp", 1, MAX_AXIS, &s->dp) < 0 ||
        get_ll(r, v[1], "mesh", "tp", 1, MAX_AXIS, &s->tp) < 0 ||
        get_ll(r, v[2], "mesh", "pp", 1, MAX_AXIS, &s->pp) < 0 ||
        get_ll(r, v[3], "mesh", "ep", 1, MAX_AXIS, &s->ep) < 0 ||
        get_ll(r, v[4], "mesh", "world", 1, MAX_I64, &s->world) < 0)
        return -1;
    if (mul(mul(mul(s->dp, s->tp), s->pp), s->ep) != s->world)
        return fail(r, v[4], "mesh: world (%lld) must be dp x tp x pp x ep = %lld x %lld x %lld x %lld", s->world,
                    s->dp, s->tp, s->pp, s->ep);
    return 0;
}

/* train.optimizer and train.lr_schedule */
static int read_optim(rd *r, int opt, int lrs, fe_setup *s) {
    static const char *const ok[] = {"kind", "lr", "beta1", "beta2", "eps", "weight_decay", "clip", NULL};
    static const char *const sk[] = {"kind", "warmup", "min_lr", NULL};
    int f[7], g[3], kind;
    const char *t = "train.optimizer";
    if (fields(r, opt, t, ok, f) < 0 || get_name(r, f[0], t, "kind", optim_name, 1, &kind) < 0 ||
        get_double(r, f[1], t, "lr", &s->lr) < 0 || get_double(r, f[2], t, "beta1", &s->beta1) < 0 ||
        get_double(r, f[3], t, "beta2", &s->beta2) < 0 || get_double(r, f[4], t, "eps", &s->eps) < 0 ||
        get_double(r, f[5], t, "weight_decay", &s->weight_decay) < 0 || get_double(r, f[6], t, "clip", &s->clip) < 0)
        return -1;
    if (!(s->lr > 0)) return fail(r, f[1], "%s: lr must be positive", t);
    if (!(s->beta1 >= 0 && s->beta1 < 1)) return fail(r, f[2], "%s: beta1 must be in [0, 1)", t);
    if (!(s->beta2 >= 0 && s->beta2 < 1)) return fail(r, f[3], "%s: beta2 must be in [0, 1)", t);
    if (!(s->eps > 0)) return fail(r, f[4], "%s: eps must be positive", t);
    if (!(s->weight_decay >= 0) || !(s->clip >= 0)) return fail(r, f[5], "%s: weight_decay and clip must be >= 0", t);
    t = "train.lr_schedule";
    if (fields(r, lrs, t, sk, g) < 0 || get_name(r, g[0], t, "kind", lr_name, 3, &s->lr_schedule) < 0 ||
        get_ll(r, g[1], t, "warmup", 0, s->steps, &s->warmup) < 0 || get_double(r, g[2], t, "min_lr", &s->min_lr) < 0)
        return -1;
    if (!(s->min_lr >= 0 && s->min_lr <= s->lr)) return fail(r, g[2], "%s: min_lr must be in [0, lr]", t);
    return 0;
}

/* An optional path: "" means none. */
static int get_path(rd *r, int v, const char *key, char **own, const char **ptr) {
    if (get_str(r, v, "train", key, own) < 0) return -1;
    if (!**own) {
        free(*own);
        *own = NULL;
    }
    *ptr = *own;
    return 0;
}

static int read_train(rd *r, int m, fe_setup *s, plan *p) {
    static const char *const keys[] = {"global_batch", "micro_batch", "seq_len", "steps", "micro_batches",
                                       "schedule", "virtual_stages", "zero", "precision", "recompute",
                                       "sequence_parallel", "optimizer", "lr_schedule", "seed", "log_every",
                                       "eval_every", "checkpoint_every", "data", "val_data", "checkpoint_dir",
                                       "?loss_scale", "?bucket_size", NULL};
    int v[22];
    const char *t = "train";
    if (fields(r, m, t, keys, v) < 0 || get_ll(r, v[0], t, keys[0], 1, MAX_I64, &s->global_batch) < 0 ||
        get_ll(r, v[1], t, keys[1], 1, MAX_I64, &s->micro_batch) < 0 ||
        get_ll(r, v[2], t, keys[2], 1, MAX_I64, &s->seq_len) < 0 ||
        get_ll(r, v[3], t, keys[3], 1, MAX_I64, &s->steps) < 0 ||
        get_ll(r, v[4], t, keys[4], 1, MAX_INT, &s->micro_batches) < 0 ||
        get_name(r, v[5], t, keys[5], kind_name, 3, &s->schedule) < 0 ||
        get_i(r, v[6], t, keys[6], 1, 1024, &s->virtual_stages) < 0 ||
        get_i(r, v[7], t, keys[7], 0, 3, &s->zero) < 0 ||
        get_name(r, v[8], t, keys[8], precision_name, 3, &s->precision) < 0 ||
        get_bool(r, v[9], t, keys[9], &s->recompute) < 0 || get_bool(r, v[10], t, keys[10], &s->sequence_parallel) < 0 ||
        read_optim(r, v[11], v[12], s) < 0 || get_ll(r, v[13], t, keys[13], 0, MAX_I64, &s->seed) < 0 ||
        get_ll(r, v[14], t, keys[14], 1, MAX_I64, &s->log_every) < 0 ||
        get_ll(r, v[15], t, keys[15], 0, MAX_I64, &s->eval_every) < 0 ||
        get_ll(r, v[16], t, keys[16], 0, MAX_I64, &s->checkpoint_every) < 0 ||
        get_path(r, v[17], keys[17], &p->data, &s->data) < 0 ||
        get_path(r, v[18], keys[18], &p->val_data, &s->val_data) < 0 ||
        get_path(r, v[19], keys[19], &p->checkpoint_dir, &s->checkpoint_dir) < 0)
        return -1;
    s->bucket_size = FE_BUCKET_SIZE; /* (a plan from before the key) */
    if (v[21] >= 0 && get_ll(r, v[21], t, "bucket_size", 1, MAX_I64, &s->bucket_size) < 0) return -1;
    s->loss_scale = 0;
    if (v[20] >= 0 && s->precision != 2) return fail(r, v[20], "train: loss_scale applies only to precision fp16");
    if (v[20] >= 0 && !(r->nodes[v[20]].kind == Y_SCALAR && strcmp(text_of(r, v[20]), "dynamic") == 0)) {
        if (get_double(r, v[20], t, "loss_scale", &s->loss_scale) < 0) return -1;
        if (!(s->loss_scale > 0)) return fail(r, v[20], "train: loss_scale must be dynamic or a positive number");
    }
    if (mul(mul(mul(s->micro_batch, s->micro_batches), s->dp), s->ep) != s->global_batch)
        return fail(r, v[0], "train: global_batch (%lld) must be micro_batch x micro_batches x dp x ep = "
                             "%lld x %lld x %lld x %lld", s->global_batch, s->micro_batch, s->micro_batches,
                    s->dp, s->ep);
    return 0;
}

/* R, P or S<dim> with dim < rank, per axis */
static int read_placement(rd *r, int v, const char *what, int rank, shard_pl *pl) {
    if (get_seq(r, v, what, "placement", SHARD_AXES, SHARD_AXES) < 0) return -1;
    int a = 0;
    for (int e = r->nodes[v].first; e >= 0; e = r->nodes[e].next, a++) {
        char b[64];
        const char *s = r->nodes[e].kind == Y_SCALAR && r->nodes[e].plain ? text_of(r, e) : "";
        pl->dim[a] = 0;
        if (strcmp(s, "R") == 0) pl->kind[a] = PL_REP;
        else if (strcmp(s, "P") == 0) pl->kind[a] = PL_PARTIAL;
        else if (s[0] == 'S' && s[1] >= '0' && s[1] <= '9' && s[2] == '\0' && s[1] - '0' < rank)
            pl->kind[a] = PL_SPLIT, pl->dim[a] = (signed char)(s[1] - '0');
        else if (r->nodes[e].kind != Y_SCALAR)
            return fail(r, e, "%s: a placement must be R, P or S<dim>", what);
        else
            return fail(r, e, "%s: placement '%s' over %s must be R (replicated), P (partial) or S<dim> (split "
                              "along dim, below the rank %d)", what, shown(r, e, b, sizeof b), plan__axis_name(a),
                        rank);
    }
    return 0;
}

static int read_attrs(rd *r, int v, const char *what, plan_tensor *t) {
    unsigned want = plan__op_attrs(t->op);
    const char *keys[PLAN_ATTR_COUNT + 1];
    int which[PLAN_ATTR_COUNT], nk = 0, val[PLAN_ATTR_COUNT];
    for (int a = 0; a < PLAN_ATTR_COUNT; a++)
        if (want & (1u << a)) which[nk] = a, keys[nk++] = plan__attr_name((plan_attr)a);
    keys[nk] = NULL;
    char ctx[96];
    snprintf(ctx, sizeof ctx, "the attrs of %s (%s)", what, graph_op_name(t->op));
    if (fields(r, v, ctx, keys, val) < 0) return -1;
    int rc = 0;
    for (int i = 0; i < nk && rc == 0; i++) {
        const char *k = keys[i];
        switch ((plan_attr)which[i]) {
        case PLAN_ATTR_HEADS: rc = get_int(r, val[i], ctx, k, 0, MAX_I64, &t->heads); break;
        case PLAN_ATTR_KV_HEADS: rc = get_int(r, val[i], ctx, k, 0, MAX_I64, &t->kv_heads); break;
        case PLAN_ATTR_CAUSAL: rc = get_bool(r, val[i], ctx, k, &t->causal); break;
        case PLAN_ATTR_THETA: rc = get_double(r, val[i], ctx, k, &t->theta); break;
        case PLAN_ATTR_EPS: rc = get_double(r, val[i], ctx, k, &t->eps); break;
        case PLAN_ATTR_TOP_K: rc = get_int(r, val[i], ctx, k, 0, MAX_I64, &t->top_k); break;
        case PLAN_ATTR_CAPACITY: rc = get_double(r, val[i], ctx, k, &t->capacity); break;
        case PLAN_ATTR_ACT: rc = get_name(r, val[i], ctx, k, act_name, 2, &t->act_gelu); break;
        case PLAN_ATTR_AUX_LOSS: rc = get_double(r, val[i], ctx, k, &t->aux_loss); break;
        case PLAN_ATTR_VOCAB: rc = get_int(r, val[i], ctx, k, 0, MAX_I64, &t->vocab); break;
        case PLAN_ATTR_SCALE: rc = get_double(r, val[i], ctx, k, &t->scale); break;
        case PLAN_ATTR_COUNT: break;
        }
    }
    return rc;
}

static int read_tensor(rd *r, int v, int id, plan *p) {
    static const char *const keys[] = {"id", "op", "?name", "shape", "dtype", "in", "?attrs", "region",
                                       "placement", "?init", "?std", NULL};
    int f[11], x;
    char what[48];
    snprintf(what, sizeof what, "tensor %d", id);
    plan_tensor *t = &p->tensors[id];
    int op;
    if (fields(r, v, what, keys, f) < 0 || get_i(r, f[0], what, "id", id, id, &x) < 0 ||
        get_name(r, f[1], what, "op", op_name, G_OP_COUNT, &op) < 0)
        return -1;
    t->op = (g_op)op;
    if ((t->op == G_INPUT || t->op == G_PARAM) && f[2] < 0)
        return fail(r, v, "%s: an %s needs a name", what, graph_op_name(t->op));
    if (f[2] >= 0 && get_str(r, f[2], what, "name", &t->name) < 0) return -1;
    if (get_seq(r, f[3], what, "shape", 0, GRAPH_MAX_RANK) < 0) return -1;
    t->rank = r->nodes[f[3]].n;
    int d = 0;
    for (int e = r->nodes[f[3]].first; e >= 0; e = r->nodes[e].next)
        if (get_int(r, e, what, "a dimension", 1, MAX_I64, &t->dims[d++]) < 0) return -1;
    int dt;
    if (get_name(r, f[4], what, "dtype", dtype_name, 2, &dt) < 0) return -1;
    t->dtype = (plan_dtype)dt;
    if (get_seq(r, f[5], what, "in", 0, GRAPH_MAX_IN) < 0) return -1;
    for (int e = r->nodes[f[5]].first; e >= 0; e = r->nodes[e].next) {
        if (id == 0) return fail(r, e, "%s: input id out of range (tensor 0 can have no inputs)", what);
        if (get_i(r, e, what, "an input id (an earlier tensor)", 0, id - 1, &t->in[t->n_in++]) < 0) return -1;
    }
    if (plan__op_attrs(t->op) && f[6] < 0) return fail(r, v, "%s has no key 'attrs'", what);
    if (!plan__op_attrs(t->op) && f[6] >= 0)
        return fail(r, f[6], "%s: a %s has no attrs", what, graph_op_name(t->op));
    if (f[6] >= 0 && read_attrs(r, f[6], what, t) < 0) return -1;
    if ((t->op == G_PARAM) != (f[9] >= 0))
        return fail(r, f[9] >= 0 ? f[9] : v, "%s: %s", what, t->op == G_PARAM ? "a param needs 'init'" :
                                                         "only params have 'init'");
    if (f[9] >= 0) {
        if (get_name(r, f[9], what, "init", init_name, 3, &t->init) < 0) return -1;
        if ((t->init == GRAPH_INIT_NORMAL) != (f[10] >= 0))
            return fail(r, f[10] >= 0 ? f[10] : f[9], "%s: 'std' goes with init normal, and only with it", what);
        if (f[10] >= 0 && get_double(r, f[10], what, "std", &t->init_std) < 0) return -1;
        if (f[10] >= 0 && !(t->init_std > 0)) return fail(r, f[10], "%s: std must be positive", what);
    } else if (f[10] >= 0) {
        return fail(r, f[10], "%s: only params have 'std'", what);
    }
    if (get_i(r, f[7], what, "region", -1, p->n_regions - 1, &t->region) < 0) return -1;
    if (t->region >= 0 && (id < p->regions[t->region].first || id >= p->regions[t->region].end))
        return fail(r, f[7], "%s: region %d holds tensors %d to %d, not %d", what, t->region,
                    p->regions[t->region].first, p->regions[t->region].end - 1, id);
    if (read_placement(r, f[8], what, t->rank, &t->pl) < 0) return -1;
    char why[256];
    if (plan_check_tensor(p, id, why, sizeof why) < 0)
        return fail(r, v, "%s (%s): %s", what, graph_op_name(t->op), why);
    return 0;
}

static int read_region(rd *r, int v, int id, plan *p) {
    static const char *const keys[] = {"id", "first", "end", "count", "parent", "is_stack", "label", "carries",
                                       NULL};
    int f[8], x;
    char what[48];
    snprintf(what, sizeof what, "region %d", id);
    plan_region *g = &p->regions[id];
    int n = p->n_tensors;
    if (fields(r, v, what, keys, f) < 0 || get_i(r, f[0], what, "id", id, id, &x) < 0 ||
        get_i(r, f[1], what, "first", 0, n - 1, &g->first) < 0 ||
        get_i(r, f[2], what, "end", g->first + 1, n, &g->end) < 0 ||
        get_int(r, f[3], what, "count", 1, MAX_I64, &g->count) < 0 ||
        get_i(r, f[4], what, "parent (an earlier region)", -1, id - 1, &g->parent) < 0 ||
        get_bool(r, f[5], what, "is_stack", &g->is_stack) < 0 || get_str(r, f[6], what, "label", &g->label) < 0 ||
        get_seq(r, f[7], what, "carries", 0, GRAPH_MAX_CARRY) < 0)
        return -1;
    for (int e = r->nodes[f[7]].first; e >= 0; e = r->nodes[e].next) {
        g_carry *c = &g->carry[g->n_carry++];
        if (get_seq(r, e, what, "a carry [entry, exit]", 2, 2) < 0) return -1;
        int a = r->nodes[e].first, b = r->nodes[a].next;
        if (get_i(r, a, what, "a carry's entry", 0, n - 1, &c->entry) < 0 ||
            get_i(r, b, what, "a carry's exit", 0, n - 1, &c->exit) < 0)
            return -1;
    }
    return 0;
}

static int read_step(rd *r, int v, int i, plan *p, int prev_phase) {
    static const char *const keys[] = {"phase", "kind", "node", "?axis", "?dim", "?elems", "region", "?why",
                                       "?recompute", "?bucket", NULL};
    int f[10], ph, kind;
    char what[48];
    snprintf(what, sizeof what, "program step %d", i);
    plan_step *s = &p->steps[i];
    if (fields(r, v, what, keys, f) < 0 || get_name(r, f[0], what, "phase", phase_name, 4, &ph) < 0 ||
        get_name(r, f[1], what, "kind", step_name, STEP_SLICE + 1, &kind) < 0 ||
        get_i(r, f[2], what, "node", 0, p->n_tensors - 1, &s->node) < 0 ||
        get_i(r, f[6], what, "region", -1, p->n_regions - 1, &s->region) < 0)
        return -1;
    s->phase = (plan_phase)ph;
    s->kind = (shard_step_kind)kind;
    if (f[8] >= 0) {
        int yes;
        if (get_bool(r, f[8], what, "recompute", &yes) < 0) return -1;
        if (yes && ph != PLAN_BACKWARD)
            return fail(r, f[8], "%s: only backward steps can be recompute steps", what);
        s->recompute = yes;
    }
    if (f[9] >= 0) {
        int64_t bkt;
        if (get_int(r, f[9], what, "bucket", 1, MAX_INT, &bkt) < 0) return -1;
        if (ph != PLAN_GRAD_SYNC && ph != PLAN_AFTER_OPTIMIZER)
            return fail(r, f[9], "%s: only gradient-sync and after-optimizer steps are bucketed", what);
        s->bucket = (int)bkt;
    }
    if (ph < prev_phase)
        return fail(r, f[0], "%s: a %s step cannot follow a %s step (the phases run in order: forward, backward, "
                             "grad-sync, after-optimizer)", what, plan_phase_name(s->phase),
                    plan_phase_name((plan_phase)prev_phase));
    s->axis = s->dim = -1;
    if (kind == STEP_COMPUTE) {
        for (int k = 3; k < 8; k++)
            if (k != 6 && f[k] >= 0) return fail(r, f[k], "%s: a compute step has no %s", what, keys[k] + 1);
        return 0;
    }
    for (int k = 3; k < 8; k++)
        if (k != 6 && f[k] < 0) return fail(r, v, "%s has no key '%s'", what, keys[k] + 1);
    return get_name(r, f[3], what, "axis", axis_name, SHARD_AXES, &s->axis) < 0 ||
                   get_i(r, f[4], what, "dim (-1, or below its tensor's rank)", -1, p->tensors[s->node].rank - 1,
                         &s->dim) < 0 ||
                   get_int(r, f[5], what, "elems", 0, MAX_I64, &s->elems) < 0 ||
                   get_str(r, f[7], what, "why", &s->why) < 0
               ? -1
               : 0;
}

/* The program computes each tensor once in the forward, in the order of
 * the ids (every input before its reader), and each at most once in the
 * backward, in the reverse order (recomputations aside); a step's region
 * is its tensor's, since where a step stands says which part of a stage
 * (before the layer stack, in it, after it) runs it. */
static int check_program(rd *r, int v, const plan *p) {
    unsigned char *seen = calloc((size_t)p->n_tensors, 1);
    if (!seen) return fail(r, v, "out of memory");
    int rc = 0, last_fwd = -1, last_bwd = p->n_tensors, e = r->nodes[v].first;
    for (int i = 0; i < p->n_steps && rc == 0; i++, e = r->nodes[e].next) {
        const plan_step *s = &p->steps[i];
        const plan_tensor *t = &p->tensors[s->node];
        if (s->region != t->region)
            rc = fail(r, e, "program step %d: region %d, where its tensor %d is in region %d", i, s->region, s->node,
                      t->region);
        if (rc != 0 || s->kind != STEP_COMPUTE || s->recompute) continue;
        if (t->op == G_INPUT || t->op == G_PARAM)
            rc = fail(r, e, "program step %d computes tensor %d, %s", i, s->node,
                      t->op == G_INPUT ? "an input" : "a param");
        else if (s->phase == PLAN_FORWARD && s->node <= last_fwd)
            rc = fail(r, e, "program step %d computes tensor %d after tensor %d: the forward runs in the order of the "
                            "ids, each once", i, s->node, last_fwd);
        else if (s->phase == PLAN_BACKWARD && s->node >= last_bwd)
            rc = fail(r, e, "program step %d takes the backward of tensor %d after tensor %d's: the backward runs "
                            "in the reverse order of the ids, each once", i, s->node, last_bwd);
        else if (s->phase == PLAN_BACKWARD && !seen[s->node])
            rc = fail(r, e, "program step %d takes the backward of tensor %d, which the forward does not compute", i,
                      s->node);
        else if (s->phase == PLAN_FORWARD)
            last_fwd = s->node, seen[s->node] = 1;
        else if (s->phase == PLAN_BACKWARD)
            last_bwd = s->node;
    }
    for (int id = 0; id < p->n_tensors && rc == 0; id++) {
        g_op op = p->tensors[id].op;
        if (!seen[id] && op != G_INPUT && op != G_PARAM && op != G_TRANSPOSE)
            rc = fail(r, v, "the program never computes tensor %d (%s)", id, graph_op_name(op));
    }
    free(seen);
    return rc;
}

/* Where a unit's data goes or comes from: the stage holding chunk c. */
static int unit_peer(const plan *p, sched_op op, int chunk) {
    int c = op == SCHED_SEND_ACT || op == SCHED_RECV_GRAD ? chunk + 1 : chunk - 1;
    return op == SCHED_FWD || op == SCHED_BWD ? -1 : c < 0 || c >= p->pp * p->v ? -2 : c % p->pp;
}

/* Each (micro, chunk) of the stage runs forward once, then backward once. */
static int check_stage_units(rd *r, int v, const plan *p, int s) {
    const plan_stage *st = &p->stages[s];
    int64_t pairs = (int64_t)p->m * p->v, nf = 0;
    for (int u = 0; u < st->n_units; u++) nf += st->units[u].op == SCHED_FWD;
    if (nf != pairs)
        return fail(r, v, "stage %d runs %lld forward units; %d micro-batches x %d chunks need %lld", s,
                    (long long)nf, p->m, p->v, (long long)pairs);
    unsigned char *seen = calloc((size_t)pairs, 1);
    if (!seen) return fail(r, v, "out of memory");
    int rc = 0;
    for (int u = 0; u < st->n_units && rc == 0; u++) {
        const sched_unit *un = &st->units[u];
        if (un->op != SCHED_FWD && un->op != SCHED_BWD) continue;
        unsigned char *x = &seen[(int64_t)un->micro * p->v + un->chunk / p->pp];
        const char *what = un->op == SCHED_FWD ? "forward" : "backward";
        if (un->op == SCHED_FWD ? *x != 0 : *x != 1)
            rc = fail(r, v, "stage %d: unit %d, the %s of micro-batch %d through chunk %d, %s", s, u, what,
                      un->micro, un->chunk, un->op == SCHED_FWD || *x == 2 ? "runs twice" : "comes before its forward");
        *x = (unsigned char)(*x + 1);
    }
    for (int64_t i = 0; i < pairs && rc == 0; i++)
        if (seen[i] != 2)
            rc = fail(r, v, "stage %d never runs the backward of micro-batch %d through chunk %d", s,
                      (int)(i / p->v), (int)(i % p->v) * p->pp + s);
    free(seen);
    return rc;
}

static int read_stage(rd *r, int v, int s, plan *p) {
    static const char *const keys[] = {"stage", "units", NULL};
    int f[2], x;
    char what[48];
    snprintf(what, sizeof what, "pipeline stage %d", s);
    if (fields(r, v, what, keys, f) < 0 || get_i(r, f[0], what, "stage", s, s, &x) < 0 ||
        get_seq(r, f[1], what, "units", 0, MAX_INT) < 0)
        return -1;
    plan_stage *st = &p->stages[s];
    if (r->nodes[f[1]].n > 0) {
        st->units = calloc((size_t)r->nodes[f[1]].n, sizeof *st->units);
        if (!st->units) return fail(r, v, "out of memory");
    }
    for (int e = r->nodes[f[1]].first; e >= 0; e = r->nodes[e].next) {
        char uw[64];
        snprintf(uw, sizeof uw, "%s unit %d", what, st->n_units);
        sched_unit *u = &st->units[st->n_units++];
        int op;
        if (get_seq(r, e, uw, "a unit [op, micro, chunk, peer]", 4, 4) < 0) return -1;
        int a = r->nodes[e].first, b = r->nodes[a].next, c = r->nodes[b].next, d = r->nodes[c].next;
        if (get_name(r, a, uw, "op", unit_name, SCHED_RECV_GRAD + 1, &op) < 0 ||
            get_i(r, b, uw, "micro", 0, p->m - 1, &u->micro) < 0 ||
            get_i(r, c, uw, "chunk", 0, p->pp * p->v - 1, &u->chunk) < 0 ||
            get_i(r, d, uw, "peer", -1, p->pp - 1, &u->peer) < 0)
            return -1;
        u->op = (sched_op)op;
        if (u->chunk % p->pp != s)
            return fail(r, c, "%s: chunk %d is held by stage %d, not %d", uw, u->chunk, u->chunk % p->pp, s);
        int want = unit_peer(p, u->op, u->chunk);
        if (want == -2 || want == s)
            return fail(r, a, "%s: chunk %d has no neighbour on another stage to %s", uw, u->chunk,
                        u->op == SCHED_SEND_ACT || u->op == SCHED_SEND_GRAD ? "send to" : "receive from");
        if (u->peer != want) return fail(r, d, "%s: peer must be %d, not %d", uw, want, u->peer);
    }
    return check_stage_units(r, v, p, s);
}

static int read_pipeline(rd *r, int m, plan *p) {
    static const char *const keys[] = {"kind", "pp", "m", "v", "chunk_layers", "stages", NULL};
    int f[6], kind;
    const char *t = "pipeline";
    const fe_setup *s = &p->setup;
    if (fields(r, m, t, keys, f) < 0 || get_name(r, f[0], t, "kind", kind_name, 3, &kind) < 0 ||
        get_i(r, f[1], t, "pp (mesh.pp)", s->pp, s->pp, &p->pp) < 0 ||
        get_i(r, f[2], t, "m (train.micro_batches)", s->micro_batches, s->micro_batches, &p->m) < 0 ||
        get_i(r, f[3], t, "v (train.virtual_stages)", s->virtual_stages, s->virtual_stages, &p->v) < 0)
        return -1;
    p->kind = (sched_kind)kind;
    if ((int64_t)p->pp * p->v > MAX_INT)
        return fail(r, f[3], "pipeline: pp x v = %lld chunks is too many", (long long)p->pp * p->v);
    if (kind != s->schedule)
        return fail(r, f[0], "pipeline: kind %s is not train.schedule (%s)", kind_name(kind), kind_name(s->schedule));
    int64_t chunks = (int64_t)p->pp * p->v, total = 0, sum = 0;
    for (int i = 0; i < p->n_regions; i++)
        if (p->regions[i].is_stack) total = p->regions[i].count;
    if (get_seq(r, f[4], t, "chunk_layers (one per pipeline chunk, pp x v)", (int)chunks, (int)chunks) < 0)
        return -1;
    p->chunk_layers = calloc((size_t)chunks, sizeof *p->chunk_layers);
    if (!p->chunk_layers) return fail(r, m, "out of memory");
    int ci = 0;
    for (int e = r->nodes[f[4]].first; e >= 0; e = r->nodes[e].next, ci++) {
        if (get_int(r, e, t, "a chunk's layers", total ? 1 : 0, total, &p->chunk_layers[ci]) < 0) return -1;
        sum += p->chunk_layers[ci];
    }
    if (sum != total)
        return fail(r, f[4], "pipeline: chunk_layers add up to %lld, but the layer stack has %lld iterations",
                    (long long)sum, (long long)total);
    if (get_seq(r, f[5], t, "stages (one per pp stage)", p->pp, p->pp) < 0) return -1;
    p->stages = calloc((size_t)p->pp, sizeof *p->stages);
    if (!p->stages) return fail(r, m, "out of memory");
    int st = 0;
    for (int e = r->nodes[f[5]].first; e >= 0; e = r->nodes[e].next, st++)
        if (read_stage(r, e, st, p) < 0) return -1;
    return 0;
}

/* The layer stack: at most one region, whose count pp x v divides. */
static int check_stack(rd *r, int regions, plan *p) {
    int stack = -1, e = r->nodes[regions].first;
    for (int i = 0; i < p->n_regions; i++, e = r->nodes[e].next) {
        if (!p->regions[i].is_stack) continue;
        if (stack >= 0) return fail(r, e, "region %d: a plan has one layer stack, and region %d is it", i, stack);
        stack = i;
        int64_t chunks = p->setup.pp * p->setup.virtual_stages;
        if (p->regions[i].count % chunks != 0)
            return fail(r, e, "region %d: the layer stack's %lld layers do not split over pp x virtual_stages = %lld",
                        i, (long long)p->regions[i].count, (long long)chunks);
        p->setup.layers = p->regions[i].count;
    }
    return 0;
}

/* ---- The file ------------------------------------------------------- */

/* Magic and version first: a plan of another version may differ in
 * anything else. */
static int check_header(rd *r, int root, plan *p) {
    char b[64], by[64] = "?";
    if (r->nodes[root].kind != Y_MAP)
        return fail(r, root, "not a mesh plan (a plan is a YAML map that starts with 'magic: %s')", PLAN_MAGIC);
    int magic = lookup(r, root, "magic"), format = lookup(r, root, "format"), meshc = lookup(r, root, "meshc");
    if (magic < 0) return fail(r, root, "not a mesh plan (it has no 'magic: %s' line)", PLAN_MAGIC);
    if (r->nodes[magic].kind != Y_SCALAR || strcmp(text_of(r, magic), PLAN_MAGIC) != 0)
        return fail(r, magic, "not a mesh plan (magic is '%s', not '%s')",
                    r->nodes[magic].kind == Y_SCALAR ? shown(r, magic, b, sizeof b) : "a list or map", PLAN_MAGIC);
    if (format < 0) return fail(r, root, "the plan has no 'format' (its format version)");
    int64_t version;
    if (get_int(r, format, "the plan", "format", 0, MAX_I64, &version) < 0) return -1;
    if (meshc >= 0 && r->nodes[meshc].kind == Y_SCALAR) shown(r, meshc, by, sizeof by);
    if (version != PLAN_FORMAT_VERSION)
        return fail(r, format, "plan format version %lld is not supported: this build reads version %d\n"
                               "HINT: this plan was written by meshc %s with format version %lld; recompile the "
                               ".mesh file with this meshc (format version %d)", (long long)version,
                    PLAN_FORMAT_VERSION, by, (long long)version, PLAN_FORMAT_VERSION);
    p->format = (int)version;
    int end = lookup(r, root, "end");
    if (end < 0)
        return fail_at(r, r->end_line, r->end_col, "the plan is truncated: it has no 'end: %s' line (a plan's "
                                                   "last line)", PLAN_MAGIC);
    if (r->nodes[end].kind != Y_SCALAR || strcmp(text_of(r, end), PLAN_MAGIC) != 0)
        return fail(r, end, "the plan's last line must be 'end: %s'", PLAN_MAGIC);
    return 0;
}

/* memory's sent: bytes per step by "kind(axis)" and "send". */
static int read_sent(rd *r, int v, plan *p, int stage) {
    char what[48];
    snprintf(what, sizeof what, "memory of stage %d: sent", stage);
    if (r->nodes[v].kind != Y_MAP) return fail(r, v, "%s must be a map of bytes", what);
    if (!p->traffic && !(p->traffic = calloc((size_t)p->pp, sizeof *p->traffic))) return fail(r, v, "out of memory");
    plan_traffic *t = &p->traffic[stage];
    for (int k = r->nodes[v].first; k >= 0; k = next_key(r, k)) {
        char b[64];
        int64_t x;
        if (r->nodes[k].next < 0 || r->nodes[k].kind != Y_SCALAR) return fail(r, k, "%s: a key without a value", what);
        const char *name = text_of(r, k);
        int kind = -1, axis = -1;
        for (int c = STEP_ALL_REDUCE; c < STEP_SLICE && kind < 0; c++)
            for (int a = 0; a < SHARD_AXES; a++) {
                char n[48];
                snprintf(n, sizeof n, "%s(%s)", shard_step_name((shard_step_kind)c), plan__axis_name(a));
                if (strcmp(n, name) == 0) kind = c, axis = a;
            }
        if (kind < 0 && strcmp(name, "send") != 0)
            return fail(r, k, "unknown key '%s' in %s", shown(r, k, b, sizeof b), what);
        if (get_int(r, r->nodes[k].next, what, name, 0, MAX_I64, &x) < 0) return -1;
        if (kind < 0) t->send = x;
        else t->coll[kind][axis] = x;
    }
    return 0;
}

/* memory: one map of sizes per stage; the total must be their sum. */
static int read_memory(rd *r, int v, plan *p) {
    static const char *const keys[] = {"stage", "params", "grads", "optim", "slot_bytes", "slots", "layer_stride",
                                       "workspace", "comm", "total", "?sent", NULL};
    if (get_seq(r, v, "the plan", "memory (one entry per pp stage)", p->pp, p->pp) < 0) return -1;
    p->memory = calloc((size_t)p->pp, sizeof *p->memory);
    if (!p->memory) return fail(r, v, "out of memory");
    int s = 0;
    for (int e = r->nodes[v].first; e >= 0; e = r->nodes[e].next, s++) {
        char what[32];
        snprintf(what, sizeof what, "memory of stage %d", s);
        int f[11];
        int64_t x[10];
        if (fields(r, e, what, keys, f) < 0) return -1;
        if (f[10] >= 0 && read_sent(r, f[10], p, s) < 0) return -1;
        for (int k = 0; k < 10; k++)
            if (get_int(r, f[k], what, keys[k], k == 0 ? s : 0, k == 0 ? s : MAX_I64, &x[k]) < 0) return -1;
        mem_stage *m = &p->memory[s];
        m->params = x[1];
        m->grads = x[2];
        m->optim = x[3];
        m->slot_bytes = x[4];
        m->slots = (int)(x[5] > MAX_INT ? MAX_INT : x[5]);
        m->layer_stride = x[6];
        m->workspace = x[7];
        m->comm = x[8];
        m->total = x[9];
        double sum = (double)m->params + (double)m->grads + (double)m->optim +
                     (double)m->slot_bytes * (double)m->slots + (double)m->workspace + (double)m->comm;
        if (sum != (double)m->total)
            return fail(r, f[9], "%s: total is not params + grads + optim + slot_bytes x slots + workspace + comm",
                        what);
    }
    return 0;
}

static int read_plan(rd *r, int root, plan *p) {
    static const char *const keys[] = {"magic", "format", "meshc", "source", "mesh", "train", "loss", "tensors",
                                       "regions", "program", "pipeline", "memory", "end", NULL};
    enum { K_MESHC = 2, K_SOURCE, K_MESH, K_TRAIN, K_LOSS, K_TENSORS, K_REGIONS, K_PROGRAM, K_PIPELINE, K_MEMORY };
    int f[13];
    const char *t = "the plan";
    if (check_header(r, root, p) < 0 || fields(r, root, t, keys, f) < 0 ||
        get_str(r, f[K_MESHC], t, "meshc", &p->meshc) < 0 || get_str(r, f[K_SOURCE], t, "source", &p->source) < 0 ||
        read_mesh(r, f[K_MESH], &p->setup) < 0 || read_train(r, f[K_TRAIN], &p->setup, p) < 0 ||
        get_seq(r, f[K_TENSORS], t, "tensors", 1, MAX_INT) < 0 ||
        get_seq(r, f[K_REGIONS], t, "regions", 0, MAX_INT) < 0 ||
        get_seq(r, f[K_PROGRAM], t, "program", 0, MAX_INT) < 0)
        return -1;
    int nt = r->nodes[f[K_TENSORS]].n, nr = r->nodes[f[K_REGIONS]].n, ns = r->nodes[f[K_PROGRAM]].n;
    p->tensors = calloc((size_t)nt, sizeof *p->tensors);
    p->regions = calloc(nr ? (size_t)nr : 1, sizeof *p->regions);
    p->steps = calloc(ns ? (size_t)ns : 1, sizeof *p->steps);
    if (!p->tensors || !p->regions || !p->steps) return fail(r, root, "out of memory");
    /* the counts first, so that plan_free frees what a failed read made;
     * regions before tensors, which check that they lie in their region */
    p->n_tensors = nt;
    p->n_regions = nr;
    p->n_steps = ns;
    int e = r->nodes[f[K_REGIONS]].first;
    for (int i = 0; i < nr; i++, e = r->nodes[e].next)
        if (read_region(r, e, i, p) < 0) return -1;
    if (check_stack(r, f[K_REGIONS], p) < 0) return -1;
    e = r->nodes[f[K_TENSORS]].first;
    for (int i = 0; i < nt; i++, e = r->nodes[e].next)
        if (read_tensor(r, e, i, p) < 0) return -1;
    if (get_i(r, f[K_LOSS], t, "loss (a tensor id, or -1)", -1, nt - 1, &p->loss) < 0) return -1;
    if (p->loss >= 0 && p->tensors[p->loss].rank != 0)
        return fail(r, f[K_LOSS], "the loss, tensor %d (%s), must be a scalar", p->loss,
                    graph_op_name(p->tensors[p->loss].op));
    e = r->nodes[f[K_PROGRAM]].first;
    for (int i = 0, prev = 0; i < ns; i++, e = r->nodes[e].next) {
        if (read_step(r, e, i, p, prev) < 0) return -1;
        prev = (int)p->steps[i].phase;
    }
    if (check_program(r, f[K_PROGRAM], p) < 0) return -1;
    if (read_pipeline(r, f[K_PIPELINE], p) < 0) return -1;
    return read_memory(r, f[K_MEMORY], p);
}

int plan_read(plan *out, const char *text, size_t len, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    if (err && n) err[0] = '\0';
    rd r;
    memset(&r, 0, sizeof r);
    r.err = err;
    r.errn = n;
    int root = text ? load(&r, text, len) : fail_at(&r, 1, 1, "no plan text");
    int rc = root >= 0 ? read_plan(&r, root, out) : -1;
    free(r.nodes);
    free(r.chars);
    if (rc < 0) plan_free(out);
    return rc;
}
