/* frontend.c — loading sources and imports, --set, and the printed results
 * (frontend.h). */
#define _DEFAULT_SOURCE /* realpath */
#include "frontend.h"

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <setjmp.h>   /* setjmp */
#include <stdlib.h>   /* malloc, getenv, realpath */
#include <string.h>   /* strerror, strrchr */
#include <sys/stat.h> /* fstat, S_ISREG */
#include <unistd.h>   /* read, close */

#include "check.h"
#include "parse.h"

struct fe {
    fe_options opt;
    arena *arena;
    diag_sink *diag;
    ast_builder b;
    checker c;
    ast_node **files;
    int n_files, cap_files;
    const char **loading;   /* canonical paths being loaded (import stack) */
    int n_loading;
    const char **loaded;    /* canonical paths done */
    int n_loaded, cap_loaded;
    set_item *sets;
    int n_sets, cap_sets;
    int checked;
    graph graph;
    jmp_buf oom;
};

fe *fe_new(const fe_options *o) {
    fe *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->opt = *o;
    f->arena = arena_new();
    f->diag = diag_new(o->diag, o->diag_ud);
    if (!f->arena || !f->diag) {
        fe_free(f);
        return NULL;
    }
    f->b.arena = f->arena;
    f->b.diag = f->diag;
    graph_init(&f->graph);
    f->loading = calloc(FE_MAX_IMPORT_DEPTH + 1, sizeof *f->loading);
    if (!f->loading) {
        fe_free(f);
        return NULL;
    }
    return f;
}

void fe_free(fe *f) {
    if (!f) return;
    arena_free(f->arena);
    diag_free(f->diag);
    free(f->files);
    free(f->loading);
    free(f->loaded);
    free(f->sets);
    graph_free(&f->graph);
    free(f);
}

int fe_error_count(const fe *f) { return diag_errors(f->diag); }
int fe_warning_count(const fe *f) { return diag_warnings(f->diag); }

/* Grows a malloc'ed array by doubling; longjmps on failure. */
static void *grow(fe *f, void *p, int *cap, size_t elem) {
    int n = *cap ? *cap * 2 : 8;
    void *q = realloc(p, (size_t)n * elem);
    if (!q) longjmp(f->oom, 1);
    *cap = n;
    return q;
}

/* ---- reading files ---- */

/* Reads a regular file of at most FE_MAX_FILE bytes. On failure returns
 * NULL with a reason in `why`. */
static char *read_file(const char *path, size_t *len, const char **why) {
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        *why = "not a regular file";
        close(fd);
        return NULL;
    }
    if (st.st_size > FE_MAX_FILE) {
        *why = "file is too large (the limit is 4 MiB)";
        close(fd);
        return NULL;
    }
    size_t cap = (size_t)st.st_size, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        *why = "out of memory";
        close(fd);
        return NULL;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            *why = strerror(errno);
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) break; /* the file may have grown; we read what stat saw */
    }
    close(fd);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void add_file(fe *f, ast_node *file) {
    if (f->n_files == f->cap_files) f->files = grow(f, f->files, &f->cap_files, sizeof *f->files);
    f->files[f->n_files++] = file;
}

static fe_status load(fe *f, const char *name, const char *canon, char *text, size_t len, int depth);

/* Finds an import: next to the importing file, then -I folders, then
 * $MESH_PATH, then the standard library folder. Returns the path to open
 * and the name to show, or NULL. */
static const char *resolve_import(fe *f, const char *importer, const char *rel, const char **shown) {
    if (rel[0] == '/') {
        *shown = rel;
        return is_file(rel) ? rel : NULL;
    }
    const char *slash = strrchr(importer, '/');
    const char *cand = slash ? arena_printf(f->arena, "%.*s/%s", (int)(slash - importer), importer, rel)
                             : arena_strdup(f->arena, rel);
    if (is_file(cand)) {
        *shown = cand;
        return cand;
    }
    *shown = rel;
    for (int i = 0; i < f->opt.n_include; i++) {
        cand = arena_printf(f->arena, "%s/%s", f->opt.include_dirs[i], rel);
        if (is_file(cand)) return cand;
    }
    const char *mp = getenv("MESH_PATH");
    while (mp && *mp) {
        const char *colon = strchr(mp, ':');
        int n = colon ? (int)(colon - mp) : (int)strlen(mp);
        if (n > 0) {
            cand = arena_printf(f->arena, "%.*s/%s", n, mp, rel);
            if (is_file(cand)) return cand;
        }
        mp = colon ? colon + 1 : NULL;
    }
    if (f->opt.std_dir) {
        cand = arena_printf(f->arena, "%s/%s", f->opt.std_dir, rel);
        if (is_file(cand)) return cand;
    }
    return NULL;
}

static void load_import(fe *f, const ast_node *imp, const char *importer, int depth) {
    const char *shown;
    const char *path = resolve_import(f, importer, imp->sval, &shown);
    if (!path) {
        const char *slash = strrchr(importer, '/');
        const char *near = imp->sval[0] == '/' ? imp->sval
                         : slash ? arena_printf(f->arena, "%.*s/%s", (int)(slash - importer), importer, imp->sval)
                                 : imp->sval;
        if (is_dir(near))
            diag_report(f->diag, DIAG_ERROR, imp->loc, "import \"%s\" names a folder, not a .mesh file", imp->sval);
        else
            diag_report(f->diag, DIAG_ERROR, imp->loc, "cannot find import \"%s\" (searched next to %s, -I "
                        "folders, $MESH_PATH and the standard library)", imp->sval, importer);
        return;
    }
    char *rp = realpath(path, NULL);
    const char *canon = rp ? arena_strdup(f->arena, rp) : path;
    free(rp);
    for (int i = 0; i < f->n_loading; i++)
        if (strcmp(f->loading[i], canon) == 0) {
            diag_report(f->diag, DIAG_ERROR, imp->loc, "import cycle: \"%s\" is already being imported", imp->sval);
            return;
        }
    for (int i = 0; i < f->n_loaded; i++)
        if (strcmp(f->loaded[i], canon) == 0) return; /* imported once */
    if (depth >= FE_MAX_IMPORT_DEPTH) {
        diag_report(f->diag, DIAG_ERROR, imp->loc, "imports are nested too deeply (more than %d levels)",
                    FE_MAX_IMPORT_DEPTH);
        return;
    }
    size_t len;
    const char *why;
    char *text = read_file(path, &len, &why);
    if (!text) {
        diag_report(f->diag, DIAG_ERROR, imp->loc, "cannot read import \"%s\": %s", imp->sval, why);
        return;
    }
    load(f, shown, canon, text, len, depth + 1);
}

/* Parses one source (taking `text`), then its imports, then records it, so
 * that files[] lists dependencies before the files that import them. */
static fe_status load(fe *f, const char *name, const char *canon, char *text, size_t len, int depth) {
    int src = diag_add_source(f->diag, name, canon, text, len);
    if (src < 0) longjmp(f->oom, 1);
    ast_node *file = parse_file(&f->b, f->diag, src);
    if (canon) f->loading[f->n_loading++] = canon;
    for (const ast_node *it = file->list.first; it && !diag_stopped(f->diag); it = it->next)
        if (it->kind == AST_IMPORT) load_import(f, it, name, depth);
    if (canon) {
        f->n_loading--;
        if (f->n_loaded == f->cap_loaded) f->loaded = grow(f, f->loaded, &f->cap_loaded, sizeof *f->loaded);
        f->loaded[f->n_loaded++] = canon;
    }
    add_file(f, file);
    return diag_errors(f->diag) ? FE_ERRORS : FE_OK;
}

fe_status fe_load_file(fe *f, const char *path) {
    if (setjmp(f->oom)) return FE_NOMEM;
    arena_on_oom(f->arena, &f->oom);
    size_t len;
    const char *why;
    char *text = read_file(path, &len, &why);
    if (!text) {
        diag_report(f->diag, DIAG_ERROR, LOC_NONE, "cannot read '%s': %s", path, why);
        return FE_ERRORS;
    }
    char *rp = realpath(path, NULL);
    const char *canon = rp ? arena_strdup(f->arena, rp) : NULL;
    free(rp);
    return load(f, path, canon, text, len, 0);
}

fe_status fe_load_buffer(fe *f, const char *name, const char *data, size_t len) {
    if (setjmp(f->oom)) return FE_NOMEM;
    arena_on_oom(f->arena, &f->oom);
    if (len > FE_MAX_FILE) {
        diag_report(f->diag, DIAG_ERROR, LOC_NONE, "cannot read '%s': file is too large (the limit is 4 MiB)", name);
        return FE_ERRORS;
    }
    char *text = malloc(len + 1);
    if (!text) return FE_NOMEM;
    memcpy(text, data, len);
    text[len] = '\0';
    return load(f, name, NULL, text, len, 0);
}

/* ---- --set key=value ---- */

static int ident_char(char ch, int first) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || (!first && ch >= '0' && ch <= '9');
}

fe_status fe_add_set(fe *f, const char *kv) {
    if (setjmp(f->oom)) return FE_NOMEM;
    arena_on_oom(f->arena, &f->oom);
    size_t n = strlen(kv);
    const char *eq = strchr(kv, '=');
    const char *dot = NULL;
    int ok = eq && eq > kv && n <= 4096;
    for (const char *p = kv; ok && p < eq; p++) {
        if (*p == '.' && !dot && p > kv && p + 1 < eq) { dot = p; continue; }
        ok = ident_char(*p, p == kv || (dot && p == dot + 1));
    }
    if (!ok) {
        diag_report(f->diag, DIAG_ERROR, LOC_NONE,
                    "--set expects KEY=VALUE with KEY like mesh.tp, train.micro_batch, model.dim or a top-level "
                    "constant, not '%.60s'", kv);
        return FE_USAGE;
    }
    char *text = malloc(n + 1);
    if (!text) return FE_NOMEM;
    memcpy(text, kv, n + 1);
    int src = diag_add_source(f->diag, "--set", NULL, text, n);
    if (src < 0) return FE_NOMEM;
    int off = (int)(eq - kv) + 1;
    ast_node *v = parse_expr(&f->b, f->diag, src, off);
    if (!v) return FE_ERRORS;
    if (f->n_sets == f->cap_sets) f->sets = grow(f, f->sets, &f->cap_sets, sizeof *f->sets);
    set_item *it = &f->sets[f->n_sets++];
    memset(it, 0, sizeof *it);
    it->section = dot ? arena_strndup(f->arena, kv, (size_t)(dot - kv)) : NULL;
    it->key = dot ? arena_strndup(f->arena, dot + 1, (size_t)(eq - dot - 1)) : arena_strndup(f->arena, kv, (size_t)(eq - kv));
    it->value = v;
    it->where = (loc){src, 0, (int)n};
    return FE_OK;
}

/* ---- checking and results ---- */

fe_status fe_check(fe *f) {
    if (setjmp(f->oom)) return FE_NOMEM;
    arena_on_oom(f->arena, &f->oom);
    if (f->n_files == 0) return FE_ERRORS;
    checker *c = &f->c;
    memset(c, 0, sizeof *c);
    c->arena = f->arena;
    c->diag = f->diag;
    c->files = f->files;
    c->n_files = f->n_files;
    c->sets = f->sets;
    c->n_sets = f->n_sets;
    graph_free(&f->graph);
    c->graph = &f->graph;
    check_run(c);
    f->checked = 1;
    return diag_errors(f->diag) ? FE_ERRORS : FE_OK;
}

const graph *fe_graph(const fe *f) { return &f->graph; }

void fe_error_at(fe *f, loc l, const char *msg) { diag_report(f->diag, DIAG_ERROR, l, "%s", msg); }

fe_setup fe_get_setup(const fe *f) {
    const checker *c = &f->c;
    const train_cfg *t = &c->train;
    fe_setup s = {0};
    s.dp = c->axis[AX_DP];
    s.tp = c->axis[AX_TP];
    s.pp = c->axis[AX_PP];
    s.ep = c->axis[AX_EP];
    s.world = c->world;
    s.global_batch = t->global_batch;
    s.micro_batch = t->micro_batch;
    s.seq_len = t->seq_len;
    s.steps = t->steps;
    s.micro_batches = t->ok ? t->global_batch / (t->micro_batch * s.dp * s.ep) : 0;
    s.schedule = t->schedule;
    s.virtual_stages = t->virtual_stages;
    s.bucket_size = t->bucket_size;
    s.zero = t->zero;
    s.precision = t->precision;
    s.loss_scale = t->loss_scale;
    s.recompute = t->recompute;
    s.sequence_parallel = t->sequence_parallel;
    s.layers = c->layers;
    s.memory_limit = t->memory_limit;
    s.lr = t->lr;
    s.beta1 = t->beta1;
    s.beta2 = t->beta2;
    s.eps = t->eps;
    s.weight_decay = t->weight_decay;
    s.clip = t->clip;
    s.lr_schedule = strcmp(t->lr_schedule ? t->lr_schedule : "constant", "cosine") == 0 ? 1
                  : strcmp(t->lr_schedule ? t->lr_schedule : "constant", "linear") == 0 ? 2 : 0;
    s.warmup = t->warmup;
    s.min_lr = t->min_lr;
    s.seed = t->seed;
    s.log_every = t->log_every;
    s.eval_every = t->eval_every;
    s.checkpoint_every = t->checkpoint_every;
    s.data = t->data;
    s.val_data = t->val_data;
    s.checkpoint_dir = t->checkpoint_dir;
    s.stage_mode = t->stage_mode;
    s.n_stage_layers = t->n_stage_layers;
    s.stage_layers = t->stage_layers;
    s.memory_limit_at = t->memory_limit_at;
    return s;
}

long long fe_parse_bytes(const char *text) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || !(v > 0) || v > 9e18) return -1;
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            return b < 9e18 ? (long long)b : -1;
        }
    return -1;
}

void fe_dump_ast(fe *f, FILE *out) {
    if (f->n_files > 0) ast_dump(f->files[f->n_files - 1], f->diag, out);
}

void fe_commas(long long v, char *buf, size_t size) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", v);
    size_t k = 0;
    for (int i = 0; i < n && k + 2 < size; i++) {
        if (i > 0 && digits[i - 1] != '-' && (n - i) % 3 == 0) buf[k++] = ',';
        buf[k++] = digits[i];
    }
    if (size) buf[k < size ? k : size - 1] = '\0';
}

static const char *commas(fe *f, int64_t v) {
    char out[48];
    fe_commas((long long)v, out, sizeof out);
    return arena_strdup(f->arena, out);
}

static int64_t tensor_count(const checker *c) {
    int64_t n = 0;
    for (const pinfo *p = c->params; p; p = p->next) n += p->mult;
    return n;
}

void fe_dump_params(fe *f, FILE *out) {
    checker *c = &f->c;
    if (!f->checked || !c->model_node) return;
    fprintf(out, "# parameters of model %s: name, shape, placement, init, copies\n", c->model_node->name);
    for (const pinfo *p = c->params; p; p = p->next) {
        /* "auto": no annotation, the compiler chooses (Megatron's layout) */
        char place[128] = "auto";
        int k = 0;
        for (int i = 0; i < p->n_place; i++) {
            if (p->place[i].dim < 0)
                k += snprintf(place + k, sizeof place - (size_t)k, "%sreplicate(%s)", k ? " " : "",
                              axis_names[p->place[i].axis]);
            else
                k += snprintf(place + k, sizeof place - (size_t)k, "%ssplit(%s, %d)", k ? " " : "",
                              axis_names[p->place[i].axis], p->place[i].dim);
        }
        fprintf(out, "%s %s %s %s", p->name, shape_str(c, &p->shape), place, p->init);
        if (p->mult > 1) fprintf(out, " x%lld", (long long)p->mult);
        fputc('\n', out);
    }
    fprintf(out, "# total: %s parameters in %lld tensors\n", commas(f, c->total_params),
            (long long)tensor_count(c));
}

/* 124475904 -> "124.5M" */
static const char *human(fe *f, int64_t v) {
    static const char *const unit[] = {"", "K", "M", "B", "T"};
    double x = (double)v;
    int u = 0;
    while (x >= 1000.0 && u < 4) { x /= 1000.0; u++; }
    return u ? arena_printf(f->arena, "%.1f%s", x, unit[u]) : arena_printf(f->arena, "%lld", (long long)v);
}

static const char *plural(int64_t n, const char *one, const char *many) { return n == 1 ? one : many; }

void fe_summary(fe *f, FILE *out) {
    checker *c = &f->c;
    const src_file *s = diag_source(f->diag, f->files[f->n_files - 1]->loc.src);
    if (!f->checked || !c->model_node) {
        fprintf(out, "%s: ok (blocks and constants only, no model)\n", s ? s->name : "?");
        return;
    }
    static const char *const sched[] = {"gpipe", "1f1b", "interleaved"};
    static const char *const prec[] = {"fp32", "bf16", "fp16"};
    const train_cfg *t = &c->train;
    int64_t nt = tensor_count(c);
    fprintf(out, "%s: model %s, %s parameters (%s) in %lld %s\n", s->name, c->model_node->name,
            commas(f, c->total_params), human(f, c->total_params), (long long)nt, plural(nt, "tensor", "tensors"));
    fprintf(out, "  mesh:     dp %lld x tp %lld x pp %lld x ep %lld = %lld %s", (long long)c->axis[AX_DP],
            (long long)c->axis[AX_TP], (long long)c->axis[AX_PP], (long long)c->axis[AX_EP], (long long)c->world,
            plural(c->world, "rank", "ranks"));
    if (c->dp_replicate || c->dp_shard)
        fprintf(out, " (dp = %lld replicate x %lld shard)", (long long)c->dp_replicate, (long long)c->dp_shard);
    fputc('\n', out);
    if (c->layers) {
        fprintf(out, "  layers:   %lld", (long long)c->layers);
        if (c->axis[AX_PP] > 1) fprintf(out, " (%lld per pipeline stage)", (long long)(c->layers / c->axis[AX_PP]));
        fputc('\n', out);
    }
    int64_t dpr = c->axis[AX_DP] * c->axis[AX_EP]; /* data-parallel ranks of the dense layers */
    int64_t m_per = t->global_batch / (t->micro_batch * dpr);
    fprintf(out, "  batch:    %lld sequences x %lld tokens = %s tokens per step; %lld %s of %lld per data-parallel "
                 "rank (%s%lld)\n", (long long)t->global_batch, (long long)t->seq_len,
            commas(f, t->global_batch * t->seq_len), (long long)m_per, plural(m_per, "micro-batch", "micro-batches"),
            (long long)t->micro_batch, c->axis[AX_EP] > 1 ? "dp x ep = " : "dp = ", (long long)dpr);
    fprintf(out, "  schedule: %s", sched[t->schedule]);
    if (t->schedule == SCHED_INTERLEAVED) fprintf(out, " (%d virtual stages)", t->virtual_stages);
    fprintf(out, ", zero %d, %s%s%s, %lld %s, adamw lr %g with a %s schedule\n", t->zero, prec[t->precision],
            t->recompute ? ", full recompute" : "", t->sequence_parallel ? ", sequence parallel" : "",
            (long long)t->steps, plural(t->steps, "step", "steps"), t->lr, t->lr_schedule);
}
