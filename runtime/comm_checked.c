/* comm_checked.c — a communicator that checks, before every call, that each
 * buffer it is given is device memory (by its maker's predicate), then
 * makes the call on the communicator it wraps (comm.h).
 *
 * NCCL takes device buffers only. On the guarded test device the executor
 * wraps its device communicators in this one and keeps plain host twins
 * beside them, as it keeps NCCL's and the launcher's on GPUs: a host
 * buffer handed to a device communicator fails the call, naming it, where
 * NCCL would fault or read garbage. Splits are wrapped too.
 *
 * With 2-byte elements (comm_checked_set_elements: bf16 or fp16, as
 * comm_nccl_set_elements makes NCCL's) the float counts are of 2-byte
 * numbers: sums widen them to fp32, sum in the wrapped communicator (rank
 * order) and round once, as the CPU's mixed-precision runs round a sum
 * kept in fp32 words; gathers and all-to-alls move the bytes as they are.
 *
 * Staged (comm_checked_stage): the wrapped communicator never touches the
 * device's memory; each call copies its inputs to host memory with the
 * device's copies (on a stream of the handle's own, waited for), makes
 * the call there and copies the results back. So a host communicator
 * (threads) can move a GPU's buffers, several ranks sharing one GPU (a
 * mesh tested on one GPU, MESH_GPU_SHARED), and on the guarded device the
 * collectives run with its memory closed.
 */
#include "comm.h"

#include "device.h" /* dev_copy, dev_stream_*: staging */
#include "kcpu.h"   /* kcpu_pack16, kcpu_unpack16 */

#include <stdint.h> /* uintptr_t, uint16_t */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memcpy */

typedef struct checked {
    comm c;
    comm *in;           /* the communicator that makes the calls */
    int own;            /* in is freed with this handle */
    comm_buf_check ok;  /* is [p, p + bytes) device memory? */
    void *ud;
    int half;           /* float elements: COMM_F32, or 2-byte COMM_BF16 / COMM_F16 */
    float *tmp;         /* 2-byte calls' fp32 or byte staging */
    size_t tmp_n;
    dev *d;             /* staged: the device whose buffers go through host memory */
    dev_stream *s;      /* its copies' stream, this handle's own */
    float *host;        /* the staging area (floats' room for any bytes) */
    size_t host_n;
} checked;

static const comm_vtbl checked_vtbl;

static checked *self(comm *c) { return (checked *)(void *)c; }

/* 0 if buf[bytes] is device memory (or empty), else -1 naming op. */
static int check(comm *c, const char *op, const void *buf, size_t bytes)
{
    checked *k = self(c);
    if (bytes == 0 || k->ok(k->ud, buf, bytes)) return 0;
    return comm_fail(c, op, "a host buffer (%zu bytes at %#lx) handed to a device communicator (%s)", bytes,
                     (unsigned long)(uintptr_t)buf, k->in->v->name);
}

/* The wrapped call's result, its error copied. */
static int done(comm *c, int rc)
{
    if (rc != 0) memcpy(c->error, self(c)->in->error, sizeof c->error);
    return rc;
}

static size_t sum(const size_t *x, int n)
{
    size_t s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

/* The 2-byte elements' rounding. */
static kcpu_precision prec(comm *c) { return self(c)->half == COMM_F16 ? KCPU_FP16 : KCPU_BF16; }

/* Bytes of n float elements. */
static size_t fb(comm *c, size_t n) { return n * (self(c)->half ? 2u : 4u); }

/* n floats of staging (kept between calls); NULL, with the error, if out
 * of memory. */
static float *staging(comm *c, const char *op, size_t n)
{
    checked *k = self(c);
    float *t = comm_scratch(&k->tmp, &k->tmp_n, n ? n : 1);
    if (!t) comm_fail(c, op, "out of memory (%zu floats of 2-byte staging)", n);
    return t;
}

/* ---- the calls on buffers the wrapped communicator can touch ---------- */

static int h_all_reduce(comm *c, float *buf, size_t n)
{
    if (!self(c)->half) return done(c, comm_all_reduce(self(c)->in, buf, n));
    float *t = staging(c, "all-reduce", n);
    if (!t) return -1;
    kcpu_unpack16(t, (const uint16_t *)(void *)buf, n, prec(c));
    if (done(c, comm_all_reduce(self(c)->in, t, n)) != 0) return -1;
    kcpu_pack16((uint16_t *)(void *)buf, t, n, prec(c));
    return 0;
}

static int h_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    size_t all = (size_t)c->size * n;
    if (!self(c)->half) return done(c, comm_reduce_scatter(self(c)->in, in, out, n));
    float *t = staging(c, "reduce-scatter", all + n);
    if (!t) return -1;
    kcpu_unpack16(t, (const uint16_t *)(const void *)in, all, prec(c));
    if (done(c, comm_reduce_scatter(self(c)->in, t, t + all, n)) != 0) return -1;
    kcpu_pack16((uint16_t *)(void *)out, t + all, n, prec(c));
    return 0;
}

static int h_all_gather(comm *c, const float *in, float *out, size_t n)
{
    if (!self(c)->half) return done(c, comm_all_gather(self(c)->in, in, out, n));
    /* the bytes, in floats' room: each rank's n 2-byte elements in w = ceil(n / 2) floats */
    size_t w = (n + 1) / 2;
    float *t = staging(c, "all-gather", w * (size_t)(c->size + 1));
    if (!t) return -1;
    memcpy(t, in, 2 * n);
    if (done(c, comm_all_gather(self(c)->in, t, t + w, w)) != 0) return -1;
    for (int q = 0; q < c->size; q++) memcpy((char *)out + 2 * n * (size_t)q, t + w * (size_t)(q + 1), 2 * n);
    return 0;
}

static int h_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    if (!self(c)->half) return done(c, comm_all_to_all(self(c)->in, in, send, out, recv));
    /* the bytes, each peer's part in ceil(n / 2) floats */
    size_t ws[64], wr[64], ts = 0, tr = 0;
    if (c->size > 64) return comm_fail(c, "all-to-all", "2-byte elements over more than 64 ranks");
    for (int q = 0; q < c->size; q++) ts += ws[q] = (send[q] + 1) / 2, tr += wr[q] = (recv[q] + 1) / 2;
    float *t = staging(c, "all-to-all", ts + tr);
    if (!t) return -1;
    size_t at = 0, fat = 0;
    for (int q = 0; q < c->size; at += send[q], fat += ws[q], q++)
        memcpy(t + fat, (const char *)in + 2 * at, 2 * send[q]);
    if (done(c, comm_all_to_all(self(c)->in, t, ws, t + ts, wr)) != 0) return -1;
    at = fat = 0;
    for (int q = 0; q < c->size; at += recv[q], fat += wr[q], q++)
        memcpy((char *)out + 2 * at, t + ts + fat, 2 * recv[q]);
    return 0;
}

/* ---- staging through host memory (comm_checked_stage) ----------------- */

/* The staging area: `parts` regions of the given bytes, each starting on a
 * float; NULL, with the error, if out of memory. at[i]: where region i is. */
static void *area(comm *c, const char *op, const size_t *bytes, int parts, char **at)
{
    checked *k = self(c);
    size_t floats = 0;
    for (int i = 0; i < parts; i++) floats += (bytes[i] + 3) / 4;
    float *h = comm_scratch(&k->host, &k->host_n, floats ? floats : 1);
    if (!h) {
        comm_fail(c, op, "out of memory (%zu bytes of host staging)", 4 * floats);
        return NULL;
    }
    size_t f = 0;
    for (int i = 0; i < parts; i++) {
        at[i] = (char *)(h + f);
        f += (bytes[i] + 3) / 4;
    }
    return h;
}

/* bytes from src to dst, one the device's and the other the staging
 * area, on the handle's stream, waited for; 0, or -1 naming op. */
static int move(comm *c, const char *op, void *dst, const void *src, size_t bytes, dev_copy_kind kind)
{
    checked *k = self(c);
    if (bytes == 0) return 0;
    if (dev_copy(k->d, dst, src, bytes, kind, k->s) == MESH_OK && dev_stream_sync(k->d, k->s) == MESH_OK) return 0;
    return comm_fail(c, op, "staging through host memory: %s", dev_last_error(k->d));
}

static int down(comm *c, const char *op, void *h, const void *dptr, size_t bytes)
{
    return move(c, op, h, dptr, bytes, DEV_DEVICE_TO_HOST);
}

static int up(comm *c, const char *op, void *dptr, const void *h, size_t bytes)
{
    return move(c, op, dptr, h, bytes, DEV_HOST_TO_DEVICE);
}

static int staged(comm *c) { return self(c)->d != NULL; }

/* ---- the calls ---------------------------------------------------------- */

static int c_all_reduce(comm *c, float *buf, size_t n)
{
    const char *op = "all-reduce";
    size_t b = fb(c, n);
    char *h;
    if (check(c, op, buf, b)) return -1;
    if (!staged(c)) return h_all_reduce(c, buf, n);
    if (!area(c, op, &b, 1, &h) || down(c, op, h, buf, b) || h_all_reduce(c, (float *)(void *)h, n)) return -1;
    return up(c, op, buf, h, b);
}

static int c_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    const char *op = "reduce-scatter";
    size_t b[2] = {fb(c, (size_t)c->size * n), fb(c, n)};
    char *h[2];
    if (check(c, op, in, b[0]) || check(c, op, out, b[1])) return -1;
    if (!staged(c)) return h_reduce_scatter(c, in, out, n);
    if (!area(c, op, b, 2, h) || down(c, op, h[0], in, b[0]) ||
        h_reduce_scatter(c, (float *)(void *)h[0], (float *)(void *)h[1], n))
        return -1;
    return up(c, op, out, h[1], b[1]);
}

static int c_all_gather(comm *c, const float *in, float *out, size_t n)
{
    const char *op = "all-gather";
    size_t b[2] = {fb(c, n), fb(c, (size_t)c->size * n)};
    char *h[2];
    if (check(c, op, in, b[0]) || check(c, op, out, b[1])) return -1;
    if (!staged(c)) return h_all_gather(c, in, out, n);
    if (!area(c, op, b, 2, h) || down(c, op, h[0], in, b[0]) ||
        h_all_gather(c, (float *)(void *)h[0], (float *)(void *)h[1], n))
        return -1;
    return up(c, op, out, h[1], b[1]);
}

static int c_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    const char *op = "all-to-all";
    size_t b[2] = {fb(c, sum(send, c->size)), fb(c, sum(recv, c->size))};
    char *h[2];
    if (check(c, op, in, b[0]) || check(c, op, out, b[1])) return -1;
    if (!staged(c)) return h_all_to_all(c, in, send, out, recv);
    if (!area(c, op, b, 2, h) || down(c, op, h[0], in, b[0]) ||
        h_all_to_all(c, (float *)(void *)h[0], send, (float *)(void *)h[1], recv))
        return -1;
    return up(c, op, out, h[1], b[1]);
}

static int c_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    const char *op = "broadcast";
    char *h;
    if (check(c, op, buf, bytes)) return -1;
    if (!staged(c)) return done(c, comm_broadcast(self(c)->in, buf, bytes, root));
    if (!area(c, op, &bytes, 1, &h) || down(c, op, h, buf, bytes) ||
        done(c, comm_broadcast(self(c)->in, h, bytes, root)))
        return -1;
    return up(c, op, buf, h, bytes);
}

/* (sends are eager: the staging area is free again when it returns) */
static int c_send(comm *c, const void *buf, size_t bytes, int peer)
{
    const char *op = "send";
    char *h;
    if (check(c, op, buf, bytes)) return -1;
    if (!staged(c)) return done(c, comm_send(self(c)->in, buf, bytes, peer));
    if (!area(c, op, &bytes, 1, &h) || down(c, op, h, buf, bytes)) return -1;
    return done(c, comm_send(self(c)->in, h, bytes, peer));
}

static int c_recv(comm *c, void *buf, size_t bytes, int peer)
{
    const char *op = "receive";
    char *h;
    if (check(c, op, buf, bytes)) return -1;
    if (!staged(c)) return done(c, comm_recv(self(c)->in, buf, bytes, peer));
    if (!area(c, op, &bytes, 1, &h) || done(c, comm_recv(self(c)->in, h, bytes, peer))) return -1;
    return up(c, op, buf, h, bytes);
}

static int c_barrier(comm *c) { return done(c, comm_barrier(self(c)->in)); }

static int c_split(comm *c, int color, int key, comm **out)
{
    checked *k = self(c);
    comm *part = NULL;
    *out = NULL;
    if (comm_split(k->in, color, key, &part) != 0) return done(c, -1);
    if (!part) return 0;
    *out = comm_checked_new(part, 1, k->ok, k->ud);
    if (!*out) {
        comm_free(part);
        return comm_fail(c, "split", "out of memory");
    }
    self(*out)->half = k->half;
    if (!k->d || comm_checked_stage(*out, k->d) == 0) return 0;
    comm_fail(c, "split", "%s", (*out)->error);
    comm_free(*out);
    *out = NULL;
    return -1;
}

static int c_group_begin(comm *c) { return done(c, comm_group_begin(self(c)->in)); }
static int c_group_end(comm *c) { return done(c, comm_group_end(self(c)->in)); }
static void c_abort(comm *c, const char *why) { comm_abort(self(c)->in, why); }

static void c_free(comm *c)
{
    checked *k = self(c);
    if (k->own) comm_free(k->in);
    if (k->d) dev_stream_destroy(k->d, k->s);
    free(k->tmp);
    free(k->host);
    free(k);
}

/* every buffer of a _v call, then the wrapped call (which packs them for a
 * host backend) */
static int check_v(comm *c, const char *op, float *const *bufs, const size_t *n, int k)
{
    for (int i = 0; i < k; i++)
        if (check(c, op, bufs[i], fb(c, n[i]))) return -1;
    return 0;
}

/* A bucket of 2-byte or staged buffers: one call per buffer (NCCL's way) */
static int each_v(comm *c, int op, float *const *bufs, const size_t *n, int k)
{
    for (int i = 0; i < k; i++) {
        size_t len = n[i] / (size_t)c->size;
        void *mine = (char *)bufs[i] + fb(c, len) * (size_t)c->rank;
        int rc = op == 0 ? c_all_reduce(c, bufs[i], n[i])
               : op == 1 ? c_reduce_scatter(c, bufs[i], mine, len)
                         : c_all_gather(c, mine, bufs[i], len);
        if (rc != 0) return -1;
    }
    return 0;
}

static int c_all_reduce_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (check_v(c, "all-reduce", bufs, n, k)) return -1;
    if (self(c)->half || staged(c)) return each_v(c, 0, bufs, n, k);
    return done(c, comm_all_reduce_v(self(c)->in, bufs, n, k));
}

static int c_reduce_scatter_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (check_v(c, "reduce-scatter", bufs, n, k)) return -1;
    if (self(c)->half || staged(c)) return each_v(c, 1, bufs, n, k);
    return done(c, comm_reduce_scatter_v(self(c)->in, bufs, n, k));
}

static int c_all_gather_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (check_v(c, "all-gather", bufs, n, k)) return -1;
    if (self(c)->half || staged(c)) return each_v(c, 2, bufs, n, k);
    return done(c, comm_all_gather_v(self(c)->in, bufs, n, k));
}

static const comm_vtbl checked_vtbl = {
    "checked",    c_all_reduce,  c_reduce_scatter, c_all_gather,   c_all_to_all,
    c_broadcast,  c_send,        c_recv,           c_barrier,      c_split,
    c_group_begin, c_group_end,  c_abort,          c_free,         c_all_reduce_v,
    c_reduce_scatter_v, c_all_gather_v,
};

comm *comm_checked_new(comm *in, int own, comm_buf_check ok, void *ud)
{
    checked *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->c.v = &checked_vtbl;
    k->c.rank = in->rank;
    k->c.size = in->size;
    k->c.world_rank = in->world_rank;
    k->in = in;
    k->own = own;
    k->ok = ok;
    k->ud = ud;
    return &k->c;
}

int comm_checked_set_elements(comm *c, int type)
{
    if (!c || c->v != &checked_vtbl || type < COMM_F32 || type > COMM_F16) return -1;
    self(c)->half = type;
    return 0;
}

int comm_checked_stage(comm *c, struct dev *d)
{
    if (!c || c->v != &checked_vtbl || !d) return -1;
    checked *k = self(c);
    if (k->d) return 0;
    if (dev_stream_create(d, &k->s) != MESH_OK)
        return comm_fail(c, "staging", "a stream for the copies: %s", dev_last_error(d));
    k->d = d;
    return 0;
}

int comm_checked_restage(comm *c, struct dev *d)
{
    if (!c || c->v != &checked_vtbl || !self(c)->d || !d) return 0;
    checked *k = self(c);
    dev_stream *s = NULL;
    if (dev_stream_create(d, &s) != MESH_OK)
        return comm_fail(c, "staging", "a stream for the copies: %s", dev_last_error(d));
    dev_stream_destroy(k->d, k->s);
    k->d = d;
    k->s = s;
    return 0;
}

const comm *comm_checked_inner(const comm *c)
{
    while (c && c->v == &checked_vtbl) c = ((const checked *)(const void *)c)->in;
    return c;
}
