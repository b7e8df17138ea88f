/* data.c — token shards (data.h) and the public token streams over them
 * (mesh_data_*, mesh_shard_write and mesh_evaluate in mesh.h).
 *
 * A stream is every shard a pattern matches, in sorted order. Each shard is
 * cut into windows of seq_len tokens, each with the token after it as its
 * last target, so a sequence never spans two shards; the windows are
 * numbered through the shards, first to last. Global sequence g (counted
 * from the start of the stream over all data-parallel ranks) is window
 * g mod windows: the stream wraps around at its end. A step reads the
 * global_batch sequences that start at the cursor: data-parallel rank r
 * takes r x per .. (r + 1) x per - 1 of them (per = micro_batches x
 * micro_batch), micro-batch k the k-th micro_batch of its part, and the
 * cursor moves on by global_batch. For one shard and one rank this is the
 * order meshrun has always read.
 */
#define _DEFAULT_SOURCE /* MAP_PRIVATE */
#include "data.h"

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <glob.h>     /* glob */
#include <stdio.h>    /* snprintf, fopen */
#include <stdlib.h>   /* calloc, free */
#include <string.h>   /* memcpy, strerror, strpbrk */
#include <sys/mman.h> /* mmap */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* close */

#include "api_impl.h" /* mesh__fail, mesh__plan_vocab, struct mesh_context */

/* ---- shards --------------------------------------------------------------- */

static int32_t le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

mesh_status mesh__shard_open(mesh__shard *s, const char *path, int vocab, char *err, size_t n) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, n, "%s: cannot open: %s", path, strerror(errno));
        return MESH_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, n, "%s: not a regular file", path);
        close(fd);
        return MESH_ERR_IO;
    }
    size_t len = (size_t)st.st_size;
    if (len < MESH_SHARD_HEADER_INTS * 4) {
        snprintf(err, n, "%s: %zu bytes, shorter than a shard's 1024-byte header", path, len);
        close(fd);
        return MESH_ERR_PARSE;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, n, "%s: cannot map: %s", path, strerror(errno));
        return MESH_ERR_IO;
    }
    const unsigned char *h = map;
    int32_t magic = le32(h), version = le32(h + 4), count = le32(h + 8);
    const char *why = NULL;
    char buf[160];
    mesh_status rc = MESH_ERR_PARSE;
    if (magic != MESH_SHARD_MAGIC) {
        snprintf(buf, sizeof buf, "not a token shard (magic %d, not %d)", magic, MESH_SHARD_MAGIC);
        why = buf;
    } else if (version != MESH_SHARD_VERSION) {
        snprintf(buf, sizeof buf, "shard version %d; this build reads version %d (uint16 tokens)", version,
                 MESH_SHARD_VERSION);
        why = buf;
    } else if (count < 0 || len != MESH_SHARD_HEADER_INTS * 4 + (size_t)count * 2) {
        snprintf(buf, sizeof buf, "the header says %d tokens (%zu bytes), but the file has %zu bytes: truncated "
                 "or corrupted", count, MESH_SHARD_HEADER_INTS * 4 + (size_t)(count < 0 ? 0 : count) * 2, len);
        why = buf;
    }
    if (!why && count < 2) why = "fewer than 2 tokens";
    const uint16_t *tok = (const uint16_t *)(h + MESH_SHARD_HEADER_INTS * 4);
    for (int32_t i = 0; !why && vocab > 0 && i < count; i++)
        if (tok[i] >= vocab) {
            snprintf(buf, sizeof buf, "token %d at position %d is outside the model's vocabulary of %d", tok[i], i,
                     vocab);
            why = buf;
            rc = MESH_ERR_CHECK;
        }
    if (why) {
        snprintf(err, n, "%s: %s", path, why);
        munmap(map, len);
        return rc;
    }
    s->tokens = tok;
    s->n = (size_t)count;
    s->map = map;
    s->map_len = len;
    return MESH_OK;
}

void mesh__shard_close(mesh__shard *s) {
    if (s->map) munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

mesh_status mesh__shard_write(const char *path, const int32_t *ids, size_t n, char *err, size_t errn) {
    char tmp[4200];
    if (n > 0x7fffffff) {
        snprintf(err, errn, "%s: %zu tokens do not fit one shard", path, n);
        return MESH_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] > 0xffff) {
            snprintf(err, errn, "%s: token %d at position %zu does not fit a shard's uint16 tokens", path,
                     (int)ids[i], i);
            return MESH_ERR_INVALID_ARG;
        }
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        snprintf(err, errn, "%.200s...: the path is too long", path);
        return MESH_ERR_INVALID_ARG;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errn, "%s: cannot write: %s", tmp, strerror(errno));
        return MESH_ERR_IO;
    }
    unsigned char h[MESH_SHARD_HEADER_INTS * 4] = {0};
    const int32_t head[3] = {MESH_SHARD_MAGIC, MESH_SHARD_VERSION, (int32_t)n};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) h[i * 4 + b] = (unsigned char)((uint32_t)head[i] >> (8 * b));
    int ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    for (size_t i = 0; ok && i < n;) { /* little-endian uint16, a header's worth at a time */
        size_t k = 0;
        for (; k < sizeof h / 2 && i < n; k++, i++) {
            h[2 * k] = (unsigned char)ids[i];
            h[2 * k + 1] = (unsigned char)(ids[i] >> 8);
        }
        ok = fwrite(h, 2, k, f) == k;
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, errn, "%s: cannot write: %s", path, strerror(errno));
        remove(tmp);
        return MESH_ERR_IO;
    }
    return MESH_OK;
}

mesh_status mesh_shard_write(const char *path, const int *ids, size_t n) {
    char err[600];
    if (!path || (!ids && n)) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_shard_write: NULL argument");
    mesh_status st = mesh__shard_write(path, (const int32_t *)ids, n, err, sizeof err);
    return st == MESH_OK ? MESH_OK : mesh__fail(st, "%s", err);
}

/* ---- streams -------------------------------------------------------------- */

struct mesh_data {
    int n;                 /* shards */
    char **paths;
    mesh__shard *shards;
    uint64_t *first;       /* first[i]: windows before shard i; first[n]: all of them */
    uint64_t tokens;
    int seq, micro_batch, micro_batches, ranks, rank;
    uint64_t pos;          /* the cursor: global sequences read */
};

void mesh_data_free(mesh_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        mesh__shard_close(&d->shards[i]);
        free(d->paths[i]);
    }
    free(d->paths);
    free(d->shards);
    free(d->first);
    free(d);
}

/* Opens the files the pattern names, in order, into d (n, paths, shards). */
static mesh_status open_shards(mesh_data *d, const char *pattern, int vocab) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOSPACE) return mesh__fail(MESH_ERR_NOMEM, "out of memory");
    const char *const one[1] = {pattern};
    const char *const *names = rc == 0 ? (const char *const *)g.gl_pathv : one;
    size_t count = rc == 0 ? g.gl_pathc : 1;
    mesh_status st = MESH_OK;
    if (rc != 0 && strpbrk(pattern, "*?[")) /* a path without them fails below, saying why */
        st = mesh__fail(MESH_ERR_IO, "no file matches '%s'", pattern);
    else if (count > 1000000)
        st = mesh__fail(MESH_ERR_INVALID_ARG, "'%s' matches %zu files; at most 1000000 shards", pattern, count);
    if (st == MESH_OK) {
        d->paths = calloc(count, sizeof *d->paths);
        d->shards = calloc(count, sizeof *d->shards);
        if (!d->paths || !d->shards) st = mesh__fail(MESH_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; st == MESH_OK && i < count; i++) {
        char err[600];
        if (!(d->paths[i] = strdup(names[i]))) {
            st = mesh__fail(MESH_ERR_NOMEM, "out of memory");
        } else if ((st = mesh__shard_open(&d->shards[i], names[i], vocab, err, sizeof err)) != MESH_OK) {
            free(d->paths[i]);
            mesh__fail(st, "%s", err);
        } else {
            d->n++;
        }
    }
    if (rc == 0) globfree(&g);
    return st;
}

mesh_status mesh_data_open(const mesh_plan *mp, const char *pattern, int dp_rank, mesh_data **out) {
    if (!mp || !pattern || !out) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_data_open: NULL argument");
    *out = NULL;
    const fe_setup *s = &mp->p.setup;
    mesh_data *d = calloc(1, sizeof *d);
    if (!d) return mesh__fail(MESH_ERR_NOMEM, "out of memory");
    mesh_plan_batch(mp, &d->micro_batch, &d->micro_batches, &d->seq, NULL);
    d->ranks = s->dp * s->ep > 0 ? (int)(s->dp * s->ep) : 1;
    d->rank = dp_rank;
    mesh_status st = MESH_OK;
    if (dp_rank < 0 || dp_rank >= d->ranks)
        st = mesh__fail(MESH_ERR_INVALID_ARG, "data-parallel rank %d is not one of the plan's %d (dp x ep)",
                        dp_rank, d->ranks);
    else if (d->micro_batch < 1 || d->micro_batches < 1 || d->seq < 1)
        st = mesh__fail(MESH_ERR_INVALID_ARG, "the plan's batch is empty (%d x %d sequences of %d tokens)",
                        d->micro_batches, d->micro_batch, d->seq);
    if (st == MESH_OK) st = open_shards(d, pattern, mesh__plan_vocab(&mp->p));
    if (st == MESH_OK && !(d->first = calloc((size_t)d->n + 1, sizeof *d->first)))
        st = mesh__fail(MESH_ERR_NOMEM, "out of memory");
    for (int i = 0; st == MESH_OK && i < d->n; i++) {
        d->first[i + 1] = d->first[i] + (d->shards[i].n - 1) / (size_t)d->seq;
        d->tokens += d->shards[i].n;
    }
    if (st == MESH_OK && d->first[d->n] == 0)
        st = mesh__fail(MESH_ERR_CHECK, "%s: %llu tokens hold no sequence of seq_len + 1 = %d tokens", pattern,
                        (unsigned long long)d->tokens, d->seq + 1);
    if (st != MESH_OK) {
        mesh_data_free(d);
        return st;
    }
    *out = d;
    return MESH_OK;
}

/* The inputs and targets of window w: seq tokens, and the seq after them. */
static void window(const mesh_data *d, uint64_t w, int *in, int *tg) {
    int lo = 0, hi = d->n - 1; /* the last shard starting at or before w (an empty one never is) */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first[mid] <= w) lo = mid;
        else hi = mid - 1;
    }
    const uint16_t *t = d->shards[lo].tokens + (size_t)(w - d->first[lo]) * (size_t)d->seq;
    for (int k = 0; k < d->seq; k++) {
        in[k] = t[k];
        tg[k] = t[k + 1];
    }
}

/* Sequences from .. from + count - 1 of this rank's part of a batch that
 * starts at global sequence `base` and gives each rank `per` sequences. */
static void read_part(const mesh_data *d, uint64_t base, uint64_t per, uint64_t from, int count, int *in,
                      int *tg) {
    uint64_t all = d->first[d->n];
    uint64_t start = (base % all + ((uint64_t)d->rank * per + from) % all) % all;
    for (int i = 0; i < count; i++)
        window(d, (start + (uint64_t)i) % all, in + (size_t)i * d->seq, tg + (size_t)i * d->seq);
}

mesh_status mesh_data_next(mesh_data *d, int *inputs, int *targets) {
    if (!d || !inputs || !targets) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_data_next: NULL argument");
    uint64_t per = (uint64_t)d->micro_batches * (uint64_t)d->micro_batch;
    read_part(d, d->pos, per, 0, (int)per, inputs, targets);
    d->pos += per * (uint64_t)d->ranks;
    return MESH_OK;
}

mesh_status mesh_data_tell(const mesh_data *d, uint64_t *pos) {
    if (!d || !pos) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_data_tell: NULL argument");
    *pos = d->pos;
    return MESH_OK;
}

mesh_status mesh_data_seek(mesh_data *d, uint64_t pos) {
    if (!d) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_data_seek: NULL argument");
    d->pos = pos;
    return MESH_OK;
}

mesh_status mesh_data_info(const mesh_data *d, int *shards, uint64_t *tokens, uint64_t *sequences) {
    if (!d) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_data_info: NULL argument");
    if (shards) *shards = d->n;
    if (tokens) *tokens = d->tokens;
    if (sequences) *sequences = d->first[d->n];
    return MESH_OK;
}

mesh_status mesh_data_shard(const mesh_data *d, int index, const char **path, uint64_t *tokens) {
    if (!d) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_data_shard: NULL argument");
    if (index < 0 || index >= d->n) return mesh__fail(MESH_ERR_INVALID_ARG, "no shard %d", index);
    if (path) *path = d->paths[index];
    if (tokens) *tokens = d->shards[index].n;
    return MESH_OK;
}

/* Micro-batch by micro-batch, as mesh_forward, so any count fits. */
mesh_status mesh_evaluate(mesh_context *ctx, mesh_data *d, int micro_batches, double *loss) {
    if (!ctx || !d || !loss || micro_batches < 1)
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_evaluate: NULL argument or no micro-batch");
    size_t bt = (size_t)d->micro_batch * (size_t)d->seq;
    if (mesh__exec_batch_tokens(ctx->ex) != bt)
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_evaluate: the data's micro-batches (%d x %d tokens) are "
                          "not the context's (%zu tokens)", d->micro_batch, d->seq,
                          mesh__exec_batch_tokens(ctx->ex));
    int *in = malloc(bt * sizeof *in), *tg = malloc(bt * sizeof *tg);
    if (!in || !tg) {
        free(in);
        free(tg);
        return mesh__fail(MESH_ERR_NOMEM, "out of memory");
    }
    uint64_t per = (uint64_t)micro_batches * (uint64_t)d->micro_batch;
    double sum = 0, l;
    int rc = 0;
    for (int k = 0; k < micro_batches && rc == 0; k++) {
        read_part(d, d->pos, per, (uint64_t)k * (uint64_t)d->micro_batch, d->micro_batch, in, tg);
        rc = mesh__exec_forward(ctx->ex, in, tg, &l); /* with tp, a collective over the tp group */
        sum += l;
    }
    d->pos += per * (uint64_t)d->ranks;
    free(in);
    free(tg);
    *loss = sum / micro_batches;
    if (rc == 0) rc = mesh__exec_data_mean(ctx->ex, loss); /* every data-parallel rank's slice */
    if (rc != 0) return mesh__fail(MESH_ERR_RANK, "%s", mesh__exec_error(ctx->ex));
    return MESH_OK;
}
