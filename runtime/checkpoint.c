/* checkpoint.c — checkpoints as safetensors files (checkpoint.h). */
#define _GNU_SOURCE /* renameat2, RENAME_EXCHANGE (glibc 2.28 on): a step saved again, swapped in at once */
#include "checkpoint.h"
#include "file.h" /* mesh__read_file */

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open, fcntl, F_SETLK */
#include <stdarg.h>   /* va_list */
#include <stdint.h>   /* uint64_t */
#include <stdio.h>    /* FILE, snprintf, rename */
#include <stdlib.h>   /* malloc, free, strtoll */
#include <string.h>   /* strcmp, strerror, strdup */
#include <sys/stat.h> /* mkdir, stat */
#include <unistd.h>   /* fsync, unlink, rmdir */

static void set_err(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && n) vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* out = a/b; a path too long is cut (and then fails to open, by name). */
static void join(char *out, size_t cap, const char *a, const char *b)
{
    if (snprintf(out, cap, "%s/%s", a, b) >= (int)cap) out[cap - 1] = '\0';
}

/* ---- writing ------------------------------------------------------------ */

/* One tensor of a file being written. */
typedef struct st_item {
    const char *name, *suffix; /* name + suffix is the key */
    const int64_t *dims;
    int rank;
    const float *data;
    size_t n;
} st_item;

static int fsync_path(const char *path)
{
    int rc = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    rc = fsync(fileno(f));
    fclose(f);
    return rc;
}

/* Writes items as a safetensors file with the given metadata JSON object
 * body (may be ""), and flushes it to disk. */
static int write_st(const char *path, const st_item *items, int count, const char *meta, char *err,
                    size_t errn)
{
    char *head = NULL;
    size_t head_len = 0;
    FILE *h = open_memstream(&head, &head_len);
    if (!h) { set_err(err, errn, "out of memory"); return -1; }
    fprintf(h, "{\"__metadata__\":{%s}", meta);
    uint64_t off = 0;
    for (int k = 0; k < count; k++) {
        fprintf(h, ",\"%s%s\":{\"dtype\":\"F32\",\"shape\":[", items[k].name, items[k].suffix);
        for (int d = 0; d < items[k].rank; d++) fprintf(h, "%s%lld", d ? "," : "", (long long)items[k].dims[d]);
        uint64_t end = off + items[k].n * sizeof(float);
        fprintf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)end);
        off = end;
    }
    fputc('}', h);
    while ((ftell(h) % 8) != 0) fputc(' ', h);
    fclose(h);
    FILE *f = fopen(path, "wb");
    if (!f) {
        set_err(err, errn, "cannot write '%s': %s", path, strerror(errno));
        free(head);
        return -1;
    }
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)head_len >> (8 * b));
    int bad = fwrite(len8, 1, 8, f) != 8 || fwrite(head, 1, head_len, f) != head_len;
    for (int k = 0; !bad && k < count; k++)
        bad = fwrite(items[k].data, sizeof(float), items[k].n, f) != items[k].n;
    free(head);
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad) set_err(err, errn, "cannot write '%s': %s", path, strerror(errno));
    return bad ? -1 : 0;
}

/* mkdir -p: makes dir and the folders above it that are missing. */
static int make_dirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(p, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Removes a folder's two files and the folder (for replacing one). */
static void remove_step_dir(const char *dir)
{
    char p[4096];
    join(p, sizeof p, dir, "model.safetensors");
    unlink(p);
    join(p, sizeof p, dir, "optim.safetensors");
    unlink(p);
    rmdir(dir);
}

/* Puts the folder written at tmp in final's place. A step saved again
 * (final there already) is swapped in by one rename where the system can
 * (RENAME_EXCHANGE), so that `latest`, which may name it, never names a
 * missing folder; elsewhere the old one is removed first. */
static int replace_dir(const char *tmp, const char *final)
{
    struct stat st;
    if (stat(final, &st) != 0) return rename(tmp, final);
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        remove_step_dir(tmp); /* (the old one, now there) */
        return 0;
    }
#endif
    remove_step_dir(final);
    return rename(tmp, final);
}

/* ---- the folder's lock ------------------------------------------------ */

void mesh__ckpt_unlock(mesh__ckpt_lock *lock)
{
    if (!lock || !lock->dir) return;
    close(lock->fd); /* (the lock goes with it) */
    free(lock->dir);
    lock->dir = NULL;
}

/* Takes dir's lock (mesh__ckpt_lock), or keeps the one held on it. */
static int lock_dir(mesh__ckpt_lock *lock, const char *dir, char *err, size_t errn)
{
    if (lock->dir && strcmp(lock->dir, dir) == 0) return 0;
    mesh__ckpt_unlock(lock);
    char path[4096], who[64] = "";
    join(path, sizeof path, dir, ".lock");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        set_err(err, errn, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    struct flock fl = {0};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        int e = errno;
        if (e != EACCES && e != EAGAIN) { /* no locks here (ENOLCK, EINVAL): saves go on without */
            close(fd);
            return 0;
        }
        struct flock holder = fl; /* who holds it (on this machine; a lock over NFS may not say) */
        if (fcntl(fd, F_GETLK, &holder) == 0 && holder.l_type != F_UNLCK && holder.l_pid > 0)
            snprintf(who, sizeof who, "process %ld", (long)holder.l_pid);
        close(fd);
        set_err(err, errn, "the checkpoint folder '%s' is another job's (%s holds %s): two jobs saving in one "
                "folder would overwrite each other's steps; give this one its own (--checkpoint DIR)", dir,
                who[0] ? who : "a process", path);
        return -1;
    }
    if (!(lock->dir = strdup(dir))) {
        close(fd);
        set_err(err, errn, "out of memory");
        return -1;
    }
    lock->fd = fd;
    return 0;
}

/* ---- pipeline stages' params, to rank 0 ------------------------------ */

/* A stage's params as one message: the item count, then per item its
 * name's length and bytes, its rank and dims, its elements, and the
 * param's, m's and v's floats. */
typedef struct blob {
    unsigned char *b;
    size_t len, cap;
} blob;

static int put(blob *x, const void *p, size_t n)
{
    if (x->len + n > x->cap) {
        size_t cap = (x->len + n) * 2;
        unsigned char *b = realloc(x->b, cap);
        if (!b) return -1;
        x->b = b;
        x->cap = cap;
    }
    memcpy(x->b + x->len, p, n);
    x->len += n;
    return 0;
}

static int pack(blob *x, const st_item *model, const st_item *optim, const char *skip, int count)
{
    uint64_t items = 0;
    for (int k = 0; k < count; k++) items += !skip[k];
    int rc = put(x, &items, sizeof items);
    for (int k = 0; rc == 0 && k < count; k++) {
        if (skip[k]) continue;
        uint32_t len = (uint32_t)strlen(model[k].name), rank = (uint32_t)model[k].rank;
        uint64_t n = model[k].n;
        rc = put(x, &len, sizeof len) | put(x, model[k].name, len) | put(x, &rank, sizeof rank) |
             put(x, model[k].dims, rank * sizeof *model[k].dims) | put(x, &n, sizeof n) |
             put(x, model[k].data, n * sizeof(float)) | put(x, optim[2 * k].data, n * sizeof(float)) |
             put(x, optim[2 * k + 1].data, n * sizeof(float));
    }
    return rc;
}

/* Reads one item of a received blob at *at into the three item slots
 * (names, dims and floats stay in the blob: copied to aligned memory). */
static int unpack_item(const blob *x, size_t *at, st_item *w, st_item *m, st_item *v)
{
    uint32_t len, rank;
    uint64_t n;
    size_t i = *at;
#define TAKE(dst, size)                                            \
    do {                                                           \
        if ((size) > x->len - i) return -1;                        \
        memcpy((dst), x->b + i, (size));                           \
        i += (size);                                               \
    } while (0)
    TAKE(&len, sizeof len);
    char *name = calloc(len + 1, 1);
    if (!name) return -1;
    TAKE(name, len);
    TAKE(&rank, sizeof rank);
    if (rank > 8) return -1;
    int64_t *dims = calloc(rank + 1, sizeof *dims);
    if (!dims) return -1;
    TAKE(dims, rank * sizeof *dims);
    TAKE(&n, sizeof n);
    if (n > (x->len - i) / sizeof(float) / 3) return -1;
    float *data = malloc((3 * n + 1) * sizeof *data);
    if (!data) return -1;
    TAKE(data, 3 * n * sizeof *data);
#undef TAKE
    *w = (st_item){name, "", dims, (int)rank, data, n};
    *m = *w;
    m->suffix = ".m";
    m->data = data + n;
    *v = *w;
    v->suffix = ".v";
    v->data = data + 2 * n;
    *at = i;
    return 0;
}

/* With pipeline stages: every stage's leading rank sends its params to
 * rank 0 (the pp group's stage 0), which appends them to its items. *owned
 * counts the items whose memory rank 0 then frees. Returns 0, -2 if a
 * transfer failed, -1 out of memory. */
static int gather_stages(mesh__exec *ex, st_item **model, st_item **optim, int *count, int *owned, char *err,
                         size_t errn)
{
    int stage, lead;
    comm *pc = mesh__exec_pipeline(ex, &stage, &lead);
    *owned = 0;
    if (!pc || !lead) return 0;
    if (stage > 0) {
        blob x = {NULL, 0, 0};
        char *skip = calloc((size_t)*count + 1, 1);
        for (int k = 0; skip && k < *count; k++) skip[k] = (char)mesh__exec_param_dup(ex, k);
        int rc = skip && pack(&x, *model, *optim, skip, *count) == 0 ? 0 : -1;
        uint64_t len = x.len;
        if (rc == 0 && (comm_send(pc, &len, sizeof len, 0) != 0 || comm_send(pc, x.b, x.len, 0) != 0)) {
            set_err(err, errn, "stage %d: sending its params to rank 0: %s", stage, pc->error);
            rc = -2;
        }
        free(skip);
        free(x.b);
        return rc;
    }
    for (int s = 1; s < pc->size; s++) {
        uint64_t len = 0, items = 0;
        blob x = {NULL, 0, 0};
        if (comm_recv(pc, &len, sizeof len, s) != 0 || !(x.b = malloc(len ? len : 1)) ||
            comm_recv(pc, x.b, len, s) != 0) {
            set_err(err, errn, "receiving the params of stage %d: %s", s, x.b || !len ? pc->error : "out of memory");
            free(x.b);
            return -2;
        }
        x.len = len;
        size_t at = 0;
        memcpy(&items, x.b, len >= sizeof items ? sizeof items : 0);
        at = sizeof items;
        st_item *mo = realloc(*model, ((size_t)*count + items + 1) * sizeof *mo);
        if (mo) *model = mo;
        st_item *op = mo ? realloc(*optim, (2 * ((size_t)*count + items) + 1) * sizeof *op) : NULL;
        if (op) *optim = op;
        int rc = mo && op ? 0 : -1;
        for (uint64_t k = 0; rc == 0 && k < items; k++, (*count)++, (*owned)++)
            rc = unpack_item(&x, &at, &(*model)[*count], &(*optim)[2 * *count], &(*optim)[2 * *count + 1]);
        free(x.b);
        if (rc != 0) {
            set_err(err, errn, "the params of stage %d: out of memory or malformed", s);
            return -1;
        }
    }
    return 0;
}

/* The save's end on every rank: rank 0's result (its write done), so that
 * no rank goes on (to load it, or to stop) before the checkpoint is there
 * or has failed. A failed transfer (-2) has stopped the world: not here. */
static int rank0_did(mesh__exec *ex, int rc, const char *what, char *err, size_t errn)
{
    comm *w = mesh__exec_host_world(ex);
    int32_t st = rc;
    if (!w) return rc;
    if (comm_broadcast(w, &st, sizeof st, 0) != 0) {
        set_err(err, errn, "waiting for rank 0 to %s: %s", what, w->error);
        return -2;
    }
    if (mesh__exec_rank(ex) != 0 && st != 0) set_err(err, errn, "rank 0 could not %s (its message says why)", what);
    return rc != 0 ? rc : st != 0 ? -1 : 0;
}

static int saved_by_rank0(mesh__exec *ex, int rc, char *err, size_t errn)
{
    return rank0_did(ex, rc, "write the checkpoint", err, errn);
}

int mesh__ckpt_claim(mesh__exec *ex, const char *dir, mesh__ckpt_lock *lock, char *err, size_t errn)
{
    int rc = 0;
    if (mesh__exec_rank(ex) == 0) {
        if (make_dirs(dir) != 0) {
            set_err(err, errn, "cannot make the checkpoint folder '%s': %s", dir, strerror(errno));
            rc = -1;
        } else {
            rc = lock_dir(lock, dir, err, errn);
        }
    }
    return rank0_did(ex, rc, "claim the checkpoint folder", err, errn);
}

int mesh__ckpt_save(mesh__exec *ex, const char *dir, long long step, const uint64_t *data_pos,
                    mesh__ckpt_lock *lock, char *err, size_t errn)
{
    int count = 0;
    const char *name;
    size_t n, total = 0;
    float *w, *g;
    if (mesh__exec_failed(ex)) { /* (a step that failed may have updated some params and not others) */
        snprintf(err, errn, "saving a checkpoint in %s: a step of this rank failed, so its state may be half "
                 "updated; nothing is written (%.300s)", dir, mesh__exec_error(ex));
        return -2;
    }
    while (mesh__exec_param(ex, count, &name, &n, &w, &g) == 0) total += mesh__exec_param_numel(ex, count++);
    st_item *model = calloc((size_t)count + 1, sizeof *model);
    st_item *optim = calloc(2 * (size_t)count + 1, sizeof *optim);
    /* whole params and moments, even where tp splits and ZeRO shards them */
    float *whole = malloc((3 * total + 1) * sizeof *whole);
    char tmp[4096], final[4096], path[4096], meta[320];
    int rc = -1, local = 0, owned = 0;
    if (!model || !optim || !whole) { set_err(err, errn, "out of memory"); goto out; }
    for (size_t k = 0, at = 0; k < (size_t)count; k++) {
        mesh__exec_param(ex, (int)k, &name, &n, &w, &g);
        n = mesh__exec_param_numel(ex, (int)k);
        float *pw = whole + at, *m = whole + total + at, *v = whole + 2 * total + at;
        at += n;
        /* collective over the tp and ZeRO groups */
        if (mesh__exec_param_get(ex, (int)k, pw) != 0 || mesh__exec_moments_get(ex, (int)k, m, v) != 0) {
            set_err(err, errn, "%s", mesh__exec_error(ex));
            rc = -2;
            goto out;
        }
        st_item it = {name, "", NULL, 0, pw, n};
        mesh__exec_param_dims(ex, (int)k, &it.dims, &it.rank);
        model[k] = it;
        optim[2 * k] = it;
        optim[2 * k].suffix = ".m";
        optim[2 * k].data = m;
        optim[2 * k + 1] = it;
        optim[2 * k + 1].suffix = ".v";
        optim[2 * k + 1].data = v;
    }
    local = count;
    int piped = gather_stages(ex, &model, &optim, &count, &owned, err, errn); /* pp: all at rank 0 */
    if (piped != 0) {
        rc = piped;
        goto out;
    }
    if (mesh__exec_rank(ex) != 0) { /* rank 0 writes what every rank holds */
        rc = 0;
        goto out;
    }
    if (make_dirs(dir) != 0) {
        set_err(err, errn, "cannot make the checkpoint folder '%s': %s", dir, strerror(errno));
        goto out;
    }
    if (lock && lock_dir(lock, dir, err, errn) != 0) goto out;
    snprintf(tmp, sizeof tmp, "%s/.step-%08lld.tmp", dir, step);
    snprintf(final, sizeof final, "%s/step-%08lld", dir, step);
    remove_step_dir(tmp);
    if (mkdir(tmp, 0777) != 0) {
        set_err(err, errn, "cannot make '%s': %s", tmp, strerror(errno));
        goto out;
    }
    int used = snprintf(meta, sizeof meta, "\"format\":\"mesh\",\"step\":\"%lld\",\"adam_steps\":\"%lld\"",
                        step, *mesh__exec_adam_steps(ex));
    if (data_pos)
        used += snprintf(meta + used, sizeof meta - (size_t)used, ",\"data_position\":\"%llu\"",
                         (unsigned long long)*data_pos);
    if (mesh__exec_loss_scale(ex)) /* fp16's scaler: %.17g gives the double back exactly */
        snprintf(meta + used, sizeof meta - (size_t)used, ",\"loss_scale\":\"%.17g\",\"loss_scale_good_steps\":\"%lld\"",
                 *mesh__exec_loss_scale(ex), *mesh__exec_scale_good(ex));
    join(path, sizeof path, tmp, "model.safetensors");
    if (write_st(path, model, count, "\"format\":\"mesh\"", err, errn) != 0) goto out;
    join(path, sizeof path, tmp, "optim.safetensors");
    if (write_st(path, optim, 2 * count, meta, err, errn) != 0) goto out;
    fsync_path(tmp);
    if (replace_dir(tmp, final) != 0) {
        set_err(err, errn, "cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
        goto out;
    }
    join(path, sizeof path, dir, ".latest.tmp");
    FILE *f = fopen(path, "w");
    int bad = !f || fprintf(f, "step-%08lld\n", step) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0;
    if (f) bad |= fclose(f) != 0;
    join(tmp, sizeof tmp, dir, "latest");
    if (bad || rename(path, tmp) != 0) {
        set_err(err, errn, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    fsync_path(dir);
    rc = 0;
out:
    for (int k = local; model && k < local + owned; k++) { /* the items received from other stages */
        free((char *)(uintptr_t)model[k].name);
        free((int64_t *)(uintptr_t)model[k].dims);
        free((float *)(uintptr_t)model[k].data);
    }
    free(model);
    free(optim);
    free(whole);
    return rc == -2 ? rc : saved_by_rank0(ex, rc, err, errn);
}

/* ---- reading ------------------------------------------------------------ */

typedef struct st_entry {
    char name[256];
    int f32;
    uint64_t numel, begin, end;
} st_entry;

typedef struct st_file {
    const char *path;
    unsigned char *bytes;
    size_t size, data;        /* data: where the tensors start (8 + N) */
    st_entry *e;
    int n, cap;
    long long step, adam_steps;
    double loss_scale;        /* fp16's scaler, 0: none saved */
    long long scale_good;
    uint64_t data_pos;        /* UINT64_MAX: none saved */
    size_t i;                 /* parse position */
    char *err;
    size_t errn;
} st_file;

static int bad(st_file *f, const char *why)
{
    set_err(f->err, f->errn, "%s: not a valid checkpoint file: %s (header byte %zu)", f->path, why,
            f->i > 8 ? f->i - 8 : 0);
    return -1;
}

static void ws(st_file *f)
{
    while (f->i < f->data && strchr(" \t\r\n", f->bytes[f->i]) && f->bytes[f->i]) f->i++;
}

static int lit(st_file *f, char c)
{
    ws(f);
    if (f->i < f->data && f->bytes[f->i] == c) { f->i++; return 0; }
    return -1;
}

/* A JSON string (ASCII escapes only) into out[cap]. */
static int str(st_file *f, char *out, size_t cap)
{
    size_t n = 0;
    if (lit(f, '"') != 0) return bad(f, "expected a string");
    while (f->i < f->data && f->bytes[f->i] != '"') {
        char c = (char)f->bytes[f->i++];
        if (c == '\\') {
            if (f->i >= f->data) break;
            c = (char)f->bytes[f->i++];
            if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
            else if (c != '"' && c != '\\' && c != '/') return bad(f, "unsupported escape in a string");
        }
        if (n + 1 >= cap) return bad(f, "string too long");
        out[n++] = c;
    }
    if (f->i >= f->data) return bad(f, "unterminated string");
    f->i++;
    out[n] = '\0';
    return 0;
}

static int num(st_file *f, uint64_t *v)
{
    ws(f);
    size_t start = f->i;
    *v = 0;
    while (f->i < f->data && f->bytes[f->i] >= '0' && f->bytes[f->i] <= '9' && *v < (1ull << 60))
        *v = *v * 10 + (uint64_t)(f->bytes[f->i++] - '0');
    return f->i > start ? 0 : bad(f, "expected a number");
}

/* [n, n, ...]: the product into *prod, or the two values into pair. */
static int array(st_file *f, uint64_t *prod, uint64_t pair[2])
{
    if (lit(f, '[') != 0) return bad(f, "expected '['");
    int k = 0;
    *prod = 1;
    if (lit(f, ']') == 0) return pair ? bad(f, "data_offsets needs two numbers") : 0;
    do {
        uint64_t v;
        if (num(f, &v) != 0) return -1;
        if (pair && k < 2) pair[k] = v;
        if (v && *prod > (1ull << 62) / v) return bad(f, "shape too large");
        *prod *= v;
        k++;
    } while (lit(f, ',') == 0);
    if (lit(f, ']') != 0) return bad(f, "expected ']'");
    return pair && k != 2 ? bad(f, "data_offsets needs two numbers") : 0;
}

static int metadata(st_file *f)
{
    char key[64], val[64];
    if (lit(f, '{') != 0) return bad(f, "expected '{'");
    if (lit(f, '}') == 0) return 0;
    do {
        if (str(f, key, sizeof key) != 0 || lit(f, ':') != 0 || str(f, val, sizeof val) != 0)
            return bad(f, "bad __metadata__");
        if (strcmp(key, "step") == 0) f->step = strtoll(val, NULL, 10);
        if (strcmp(key, "adam_steps") == 0) f->adam_steps = strtoll(val, NULL, 10);
        if (strcmp(key, "loss_scale") == 0) f->loss_scale = strtod(val, NULL);
        if (strcmp(key, "loss_scale_good_steps") == 0) f->scale_good = strtoll(val, NULL, 10);
        if (strcmp(key, "data_position") == 0) f->data_pos = strtoull(val, NULL, 10);
    } while (lit(f, ',') == 0);
    return lit(f, '}') == 0 ? 0 : bad(f, "expected '}'");
}

static int entry(st_file *f, st_entry *e)
{
    char key[32], dtype[16] = "";
    uint64_t off[2] = {0, 0}, dummy;
    int have = 0;
    if (lit(f, '{') != 0) return bad(f, "expected '{'");
    do {
        if (str(f, key, sizeof key) != 0 || lit(f, ':') != 0) return -1;
        if (strcmp(key, "dtype") == 0) {
            if (str(f, dtype, sizeof dtype) != 0) return -1;
            have |= 1;
        } else if (strcmp(key, "shape") == 0) {
            if (array(f, &e->numel, NULL) != 0) return -1;
            have |= 2;
        } else if (strcmp(key, "data_offsets") == 0) {
            if (array(f, &dummy, off) != 0) return -1;
            have |= 4;
        } else {
            return bad(f, "unknown key in a tensor entry");
        }
    } while (lit(f, ',') == 0);
    if (lit(f, '}') != 0) return bad(f, "expected '}'");
    if (have != 7) return bad(f, "a tensor entry needs dtype, shape and data_offsets");
    e->f32 = strcmp(dtype, "F32") == 0;
    e->begin = off[0];
    e->end = off[1];
    if (e->end < e->begin || e->end - e->begin != e->numel * (e->f32 ? 4 : 0) || e->end > f->size - f->data)
        return bad(f, "a tensor's data_offsets do not match its shape and the file's size");
    return 0;
}

static int parse(st_file *f)
{
    if (f->size < 8) return bad(f, "shorter than the 8-byte header length");
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--) n = n << 8 | f->bytes[b];
    if (n > 100000000ull || n > f->size - 8) return bad(f, "the header length is past the end (truncated?)");
    f->data = 8 + (size_t)n;
    f->i = 8;
    if (lit(f, '{') != 0) return bad(f, "expected '{'");
    if (lit(f, '}') == 0) return 0;
    do {
        char name[256];
        if (str(f, name, sizeof name) != 0 || lit(f, ':') != 0) return -1;
        if (strcmp(name, "__metadata__") == 0) {
            if (metadata(f) != 0) return -1;
            continue;
        }
        if (f->n == f->cap) {
            int cap = f->cap ? 2 * f->cap : 64;
            st_entry *e = realloc(f->e, (size_t)cap * sizeof *e);
            if (!e) return bad(f, "out of memory");
            f->e = e;
            f->cap = cap;
        }
        st_entry *e = &f->e[f->n++];
        snprintf(e->name, sizeof e->name, "%s", name);
        if (entry(f, e) != 0) return -1;
    } while (lit(f, ',') == 0);
    return lit(f, '}') == 0 ? 0 : bad(f, "expected '}'");
}

static int open_st(st_file *f, const char *path, char *err, size_t errn)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    f->err = err;
    f->errn = errn;
    f->data_pos = UINT64_MAX;
    f->bytes = (unsigned char *)mesh__read_file(path, &f->size, err, errn);
    if (!f->bytes) return -1;
    if (parse(f) != 0) {
        free(f->bytes);
        free(f->e);
        f->bytes = NULL;
        f->e = NULL;
        return -1;
    }
    return 0;
}

/* Copies tensor name+suffix into dst[n]; reports a missing or mis-sized one. */
static int take(st_file *f, const char *name, const char *suffix, float *dst, size_t n)
{
    char key[300];
    snprintf(key, sizeof key, "%s%s", name, suffix);
    for (int k = 0; k < f->n; k++) {
        if (strcmp(f->e[k].name, key) != 0) continue;
        if (!f->e[k].f32 || f->e[k].numel != n) {
            set_err(f->err, f->errn, "%s: tensor '%s' is not F32 with %zu elements as this model's is",
                    f->path, key, n);
            return -1;
        }
        memcpy(dst, f->bytes + f->data + f->e[k].begin, n * sizeof(float));
        return 0;
    }
    set_err(f->err, f->errn, "%s: no tensor '%s' (a checkpoint of another model?)", f->path, key);
    return -1;
}

int mesh__ckpt_load(mesh__exec *ex, const char *path, int optim, long long *step, uint64_t *data_pos,
                    char *err, size_t errn)
{
    char dir[4096], file[4200];
    join(file, sizeof file, path, "latest");
    FILE *lf = fopen(file, "r");
    snprintf(dir, sizeof dir, "%s", path);
    if (lf) { /* a checkpoint folder: follow latest */
        char name[256] = "";
        if (!fgets(name, sizeof name, lf)) name[0] = '\0';
        fclose(lf);
        name[strcspn(name, "\n")] = '\0';
        if (!name[0] || strchr(name, '/')) {
            set_err(err, errn, "%s: does not name a step folder", file);
            return -1;
        }
        join(dir, sizeof dir, path, name);
    }
    st_file model, opt;
    join(file, sizeof file, dir, "model.safetensors");
    if (open_st(&model, file, err, errn) != 0) return -1;
    char optfile[4200];
    join(optfile, sizeof optfile, dir, "optim.safetensors");
    int rc = optim ? open_st(&opt, optfile, err, errn) : 0;
    const char *name;
    size_t n, most = 0;
    float *w, *g, *m = NULL;
    for (int k = 0; mesh__exec_param(ex, k, &name, &n, &w, &g) == 0; k++) {
        n = mesh__exec_param_numel(ex, k);
        most = n > most ? n : most;
    }
    if (rc == 0 && !(m = malloc((3 * most + 1) * sizeof *m))) {
        set_err(err, errn, "out of memory");
        rc = -1;
    }
    /* whole tensors; with tp each rank keeps its slice, with ZeRO its shard */
    for (int k = 0; rc == 0 && mesh__exec_param(ex, k, &name, &n, &w, &g) == 0; k++) {
        n = mesh__exec_param_numel(ex, k);
        rc = take(&model, name, "", m + 2 * most, n);
        if (rc == 0) mesh__exec_param_set(ex, k, m + 2 * most);
        if (rc == 0 && optim) {
            rc = take(&opt, name, ".m", m, n);
            if (rc == 0) rc = take(&opt, name, ".v", m + most, n);
            if (rc == 0) mesh__exec_moments_set(ex, k, m, m + most);
        }
    }
    free(m);
    if (rc == 0 && optim) {
        *mesh__exec_adam_steps(ex) = opt.adam_steps;
        if (opt.loss_scale > 0 && mesh__exec_loss_scale(ex)) { /* fp16 */
            *mesh__exec_loss_scale(ex) = opt.loss_scale;
            *mesh__exec_scale_good(ex) = opt.scale_good;
        }
        *step = opt.step;
        if (data_pos) *data_pos = opt.data_pos;
    } else if (rc == 0) {
        *step = 0;
        if (data_pos) *data_pos = UINT64_MAX;
    }
    free(model.bytes);
    free(model.e);
    if (optim && opt.bytes) {
        free(opt.bytes);
        free(opt.e);
    }
    return rc;
}
