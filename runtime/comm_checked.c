/* comm_checked.c — a communicator that checks, before every call, that each
 * buffer it is given is device memory (by its maker's predicate), then
 * makes the call on the communicator it wraps (comm.h).
 *
 * NCCL takes device buffers only. On the guarded test device the executor
 * wraps its device communicators in this one and keeps plain host twins
 * beside them, as it keeps NCCL's and the launcher's on GPUs: a host
 * buffer handed to a device communicator fails the call, naming it, where
 * NCCL would fault or read garbage. Splits are wrapped too.
 */
#include "comm.h"

#include <stdint.h> /* uintptr_t */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memcpy */

typedef struct checked {
    comm c;
    comm *in;           /* the communicator that makes the calls */
    int own;            /* in is freed with this handle */
    comm_buf_check ok;  /* is [p, p + bytes) device memory? */
    void *ud;
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

static int c_all_reduce(comm *c, float *buf, size_t n)
{
    if (check(c, "all-reduce", buf, n * sizeof *buf)) return -1;
    return done(c, comm_all_reduce(self(c)->in, buf, n));
}

static int c_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    if (check(c, "reduce-scatter", in, (size_t)c->size * n * sizeof *in) ||
        check(c, "reduce-scatter", out, n * sizeof *out))
        return -1;
    return done(c, comm_reduce_scatter(self(c)->in, in, out, n));
}

static int c_all_gather(comm *c, const float *in, float *out, size_t n)
{
    if (check(c, "all-gather", in, n * sizeof *in) || check(c, "all-gather", out, (size_t)c->size * n * sizeof *out))
        return -1;
    return done(c, comm_all_gather(self(c)->in, in, out, n));
}

static int c_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    if (check(c, "all-to-all", in, sum(send, c->size) * sizeof *in) ||
        check(c, "all-to-all", out, sum(recv, c->size) * sizeof *out))
        return -1;
    return done(c, comm_all_to_all(self(c)->in, in, send, out, recv));
}

static int c_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    if (check(c, "broadcast", buf, bytes)) return -1;
    return done(c, comm_broadcast(self(c)->in, buf, bytes, root));
}

static int c_send(comm *c, const void *buf, size_t bytes, int peer)
{
    if (check(c, "send", buf, bytes)) return -1;
    return done(c, comm_send(self(c)->in, buf, bytes, peer));
}

static int c_recv(comm *c, void *buf, size_t bytes, int peer)
{
    if (check(c, "receive", buf, bytes)) return -1;
    return done(c, comm_recv(self(c)->in, buf, bytes, peer));
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
    if (*out) return 0;
    comm_free(part);
    return comm_fail(c, "split", "out of memory");
}

static int c_group_begin(comm *c) { return done(c, comm_group_begin(self(c)->in)); }
static int c_group_end(comm *c) { return done(c, comm_group_end(self(c)->in)); }
static void c_abort(comm *c, const char *why) { comm_abort(self(c)->in, why); }

static void c_free(comm *c)
{
    checked *k = self(c);
    if (k->own) comm_free(k->in);
    free(k);
}

/* every buffer of a _v call, then the wrapped call (which packs them for a
 * host backend) */
static int check_v(comm *c, const char *op, float *const *bufs, const size_t *n, int k)
{
    for (int i = 0; i < k; i++)
        if (check(c, op, bufs[i], n[i] * sizeof *bufs[i])) return -1;
    return 0;
}

static int c_all_reduce_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (check_v(c, "all-reduce", bufs, n, k)) return -1;
    return done(c, comm_all_reduce_v(self(c)->in, bufs, n, k));
}

static int c_reduce_scatter_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (check_v(c, "reduce-scatter", bufs, n, k)) return -1;
    return done(c, comm_reduce_scatter_v(self(c)->in, bufs, n, k));
}

static int c_all_gather_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (check_v(c, "all-gather", bufs, n, k)) return -1;
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

const comm *comm_checked_inner(const comm *c)
{
    while (c && c->v == &checked_vtbl) c = ((const checked *)(const void *)c)->in;
    return c;
}
