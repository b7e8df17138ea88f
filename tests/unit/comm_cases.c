/*
 * comm_cases.c: the communicator checks every backend must pass (see
 * comm_cases.h). Each rank only records: the caller checks the results.
 */
#include <pthread.h> /* defines: pthread_mutex_* (the hooks' log) */
#include <stdio.h>  /* defines: snprintf */
#include <stdlib.h> /* defines: malloc, free */
#include <string.h> /* defines: memcmp */

#include "comm_async.h" /* defines: comm_async_* */
#include "comm_cases.h"

enum { N = 1001, RS = 257, MAXC = 3, MAXP = COMM_CASES_MAX_RANKS };

static float value(int rank, size_t i) { return (float)rank * 0.75f + (float)(i % 97) * 0.013f - 0.5f; }

/* 1 when a[i] == b[i] for all i, bit for bit. */
static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static size_t a2a_count(int from, int to) { return (size_t)((from + 2 * to) % MAXC + 1); }

/* -1 with c's error copied to err. */
static int call_failed(const comm *c, char *err, size_t n)
{
    snprintf(err, n, "%s", c->error);
    return -1;
}

/* all-reduce, reduce-scatter, all-gather, the bucket calls (_v),
 * broadcast: a bit per failure */
static int sums_and_copies(comm *c, char *err, size_t en)
{
    int r = c->rank, p = c->size, bad = 0;
    /* all-reduce: the sum in rank order */
    float buf[N], want[N];
    for (size_t i = 0; i < N; i++) {
        buf[i] = value(r, i);
        want[i] = value(0, i);
        for (int q = 1; q < p; q++) want[i] += value(q, i);
    }
    if (comm_all_reduce(c, buf, N) != 0) return call_failed(c, err, en);
    bad |= !same(buf, want, N) << 1;
    /* reduce-scatter: this rank's RS of the sum of p x RS */
    float in[MAXP * RS], out[RS], wrs[RS];
    for (size_t i = 0; i < (size_t)p * RS; i++) in[i] = value(r, i * 3);
    for (size_t i = 0; i < RS; i++) {
        size_t k = (size_t)r * RS + i;
        wrs[i] = value(0, k * 3);
        for (int q = 1; q < p; q++) wrs[i] += value(q, k * 3);
    }
    if (comm_reduce_scatter(c, in, out, RS) != 0) return call_failed(c, err, en);
    bad |= !same(out, wrs, RS) << 2;
    /* all-gather */
    float mine[RS], all[MAXP * RS];
    for (size_t i = 0; i < RS; i++) mine[i] = value(r, i + 5);
    if (comm_all_gather(c, mine, all, RS) != 0) return call_failed(c, err, en);
    for (int q = 0; q < p; q++)
        for (size_t i = 0; i < RS; i++) bad |= (all[(size_t)q * RS + i] != value(q, i + 5)) << 3;
    /* a bucket: all_reduce_v over 4 buffers (one of 1001, not a multiple of
     * p), reduce_scatter_v then all_gather_v over 3 (multiples of p): each
     * as if alone */
    static const size_t len[4] = {3, N, 257, 1};
    float b0[3 * MAXP], b1[N], b2[257 * MAXP], b3[MAXP], *bv[4] = {b0, b1, b2, b3};
    size_t nv[4];
    for (int i = 0; i < 4; i++) {
        nv[i] = len[i] == N ? N : len[i] * (size_t)p;
        for (size_t e = 0; e < nv[i]; e++) bv[i][e] = value(r, e * 5 + (size_t)i);
    }
    if (comm_all_reduce_v(c, bv, nv, 4) != 0) return call_failed(c, err, en);
    for (int i = 0; i < 4; i++)
        for (size_t e = 0; e < nv[i]; e++) {
            float w = value(0, e * 5 + (size_t)i);
            for (int q = 1; q < p; q++) w += value(q, e * 5 + (size_t)i);
            bad |= (bv[i][e] != w) << 5;
        }
    float *sv[3] = {b0, b2, b3};
    size_t ns[3] = {nv[0], nv[2], nv[3]};
    for (int i = 0; i < 3; i++)
        for (size_t e = 0; e < ns[i]; e++) sv[i][e] = value(r, e * 3 + (size_t)i);
    if (comm_reduce_scatter_v(c, sv, ns, 3) != 0) return call_failed(c, err, en);
    for (int i = 0; i < 3; i++) {
        size_t chunk = ns[i] / (size_t)p;
        for (size_t e = (size_t)r * chunk; e < (size_t)(r + 1) * chunk; e++) {
            float w = value(0, e * 3 + (size_t)i);
            for (int q = 1; q < p; q++) w += value(q, e * 3 + (size_t)i);
            bad |= (sv[i][e] != w) << 6;
        }
    }
    /* all_gather_v of those chunks: every buffer whole, the sums */
    if (comm_all_gather_v(c, sv, ns, 3) != 0) return call_failed(c, err, en);
    for (int i = 0; i < 3; i++)
        for (size_t e = 0; e < ns[i]; e++) {
            float w = value(0, e * 3 + (size_t)i);
            for (int q = 1; q < p; q++) w += value(q, e * 3 + (size_t)i);
            bad |= (sv[i][e] != w) << 7;
        }
    /* broadcast from the last rank */
    float b[7];
    for (int i = 0; i < 7; i++) b[i] = r == p - 1 ? (float)i * 1.5f : -1.0f;
    if (comm_broadcast(c, b, sizeof b, p - 1) != 0) return call_failed(c, err, en);
    for (int i = 0; i < 7; i++) bad |= (b[i] != (float)i * 1.5f) << 4;
    return bad;
}

int comm_case_collectives(comm *c, char *note, char *err, size_t n)
{
    int r = c->rank, p = c->size;
    if (p < 2 || p > MAXP) return 1;
    int bad = sums_and_copies(c, err, n);
    if (bad < 0) return -1;
    /* all-to-all with uneven counts: element e of the part for peer q is r*100 + q*10 + e */
    size_t send[MAXP], recv[MAXP];
    for (int q = 0; q < p; q++) {
        send[q] = a2a_count(r, q);
        recv[q] = a2a_count(q, r);
    }
    float sbuf[MAXP * MAXC], rbuf[MAXP * MAXC];
    for (int q = 0, k = 0; q < p; q++)
        for (size_t e = 0; e < send[q]; e++) sbuf[k++] = (float)(r * 100 + q * 10) + (float)e;
    if (comm_all_to_all(c, sbuf, send, rbuf, recv) != 0) return call_failed(c, err, n);
    for (int q = 0, k = 0; q < p; q++)
        for (size_t e = 0; e < recv[q]; e++) bad |= (rbuf[k++] != (float)(q * 100 + r * 10) + (float)e) << 5;
    /* point to point, around the ring, sends first (eager: no deadlock) */
    int next = (r + 1) % p, prev = (r + p - 1) % p, got = -1, msg = 1000 + r;
    if (comm_send(c, &msg, sizeof msg, next) != 0 || comm_recv(c, &got, sizeof got, prev) != 0)
        return call_failed(c, err, n);
    bad |= (got != 1000 + prev) << 6;
    /* 1 MiB around the ring, sends first: past MPI's eager limit, so a
     * send that waited for its receive would deadlock */
    enum { BIG = 1 << 18 };
    float *big = malloc(2 * BIG * sizeof *big);
    if (!big) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < BIG; i++) big[i] = value(r, i);
    int rc = comm_send(c, big, BIG * sizeof *big, next) != 0 || comm_recv(c, big + BIG, BIG * sizeof *big, prev) != 0;
    for (size_t i = 0; rc == 0 && i < BIG; i++) bad |= (big[BIG + i] != value(prev, i)) << 8;
    free(big);
    if (rc) return call_failed(c, err, n);
    /* a receive of the wrong size is an error */
    if (comm_send(c, &msg, sizeof msg, next) != 0) return call_failed(c, err, n);
    double wrong;
    if (comm_recv(c, &wrong, sizeof wrong, prev) == 0) bad |= 1 << 7;
    else snprintf(note, n, "%s", c->error);
    if (comm_barrier(c) != 0) return call_failed(c, err, n);
    return bad;
}

int comm_case_groups(comm *c, char *err, size_t n)
{
    int r = c->rank, bad = 0;
    comm *tp = NULL, *dp = NULL, *none = NULL;
    if (c->size != 4) return 1;
    if (comm_split(c, r / 2, r, &tp) != 0 || comm_split(c, r % 2, -r, &dp) != 0) return call_failed(c, err, n);
    bad |= (tp->size != 2 || tp->rank != r % 2) << 1;
    bad |= (dp->size != 2 || dp->rank != (r < 2 ? 1 : 0)) << 2;
    float x = (float)(r + 1), y = (float)(r + 1);
    int v = r, got = -1, rc = 0;
    if (comm_all_reduce(tp, &x, 1) != 0) rc = call_failed(tp, err, n);
    bad |= (x != (r < 2 ? 3.0f : 7.0f)) << 3;
    if (rc == 0 && comm_all_reduce(dp, &y, 1) != 0) rc = call_failed(dp, err, n);
    bad |= (y != (r % 2 == 0 ? 4.0f : 6.0f)) << 4;
    /* point to point inside a group uses the group's ranks */
    if (rc == 0 &&
        (comm_send(dp, &v, sizeof v, 1 - dp->rank) != 0 || comm_recv(dp, &got, sizeof got, 1 - dp->rank) != 0))
        rc = call_failed(dp, err, n);
    bad |= (got != (r + 2) % 4) << 5;
    if (rc == 0 && comm_split(c, r == 3 ? -1 : 0, 0, &none) != 0) rc = call_failed(c, err, n);
    bad |= (r == 3 ? none != NULL : none == NULL || none->size != 3) << 6;
    comm_free(none);
    comm_free(tp);
    comm_free(dp);
    return rc ? rc : bad;
}

int comm_case_one_aborts(comm *c, char *err, size_t n)
{
    if (c->rank == 1) {
        comm_abort(c, "the loss is not finite at step 3");
        return 0;
    }
    float x[16] = {0};
    int rc = comm_all_reduce(c, x, 16);
    snprintf(err, n, "%s", c->error);
    return rc == 0;
}

int comm_case_one_missing(comm *c, double idle, char *err, size_t n)
{
    if (c->rank == 1) {
        if (idle > 0) comm_sleep(idle);
        return 0;
    }
    float x[4] = {0};
    int rc = comm_all_reduce(c, x, 4);
    snprintf(err, n, "%s", c->error);
    return rc == 0;
}

int comm_case_async(comm *c, char *err, size_t n)
{
    int r = c->rank, p = c->size, bad = 0;
    if (p < 2 || p > MAXP || !comm_async_supported(c)) return 1;
    comm_async *q = NULL;
    if (comm_async_new(c, NULL, &q) != 0) return call_failed(c, err, n);
    static const size_t sizes[3] = {N, 1, 64 * 1024 + 3};
    float *buf[3], *want[3];
    for (int k = 0; k < 3; k++) {
        buf[k] = malloc(sizes[k] * sizeof *buf[k]);
        want[k] = malloc(sizes[k] * sizeof *want[k]);
        if (!buf[k] || !want[k]) return snprintf(err, n, "out of memory"), -1; /* (a test: leaks) */
        for (size_t i = 0; i < sizes[k]; i++) {
            buf[k][i] = value(r, i + (size_t)k);
            want[k][i] = value(0, i + (size_t)k);
            for (int o = 1; o < p; o++) want[k][i] += value(o, i + (size_t)k);
        }
    }
    float in[MAXP * RS], out[RS], wrs[RS], mine[RS], all[MAXP * RS];
    for (size_t i = 0; i < (size_t)p * RS; i++) in[i] = value(r, i * 3);
    for (size_t i = 0; i < RS; i++) {
        wrs[i] = value(0, ((size_t)r * RS + i) * 3);
        for (int o = 1; o < p; o++) wrs[i] += value(o, ((size_t)r * RS + i) * 3);
        mine[i] = value(r, i + 5);
    }
    long t[4];
    t[0] = comm_async_all_reduce(q, buf[0], sizes[0]);
    t[1] = comm_async_reduce_scatter(q, in, out, RS);
    {
        float *bv[2] = {buf[1], buf[2]}; /* a bucket: the queue copies the arrays */
        size_t nv[2] = {sizes[1], sizes[2]};
        t[2] = comm_async_all_reduce_v(q, bv, nv, 2);
    }
    t[3] = comm_async_all_gather(q, mine, all, RS);
    for (int k = 0; k < 4; k++) bad |= (t[k] != k + 1) << 1;
    /* the rank's own calls meanwhile, on the group the queue copied */
    for (int k = 0; k < 3 && !bad; k++) {
        float x[RS];
        for (size_t i = 0; i < RS; i++) x[i] = value(r, i * 7);
        if (comm_all_reduce(c, x, RS) != 0) return call_failed(c, err, n);
        float w0 = value(0, 0);
        for (int o = 1; o < p; o++) w0 += value(o, 0);
        bad |= (x[0] != w0) << 2;
    }
    if (comm_async_wait(q, t[1]) != 0) return snprintf(err, n, "%s", comm_async_error(q)), -1;
    bad |= !same(buf[0], want[0], sizes[0]) << 3; /* done: it came before */
    bad |= !same(out, wrs, RS) << 4;
    if (comm_async_wait_all(q) != 0) return snprintf(err, n, "%s", comm_async_error(q)), -1;
    bad |= (comm_async_pending(q) != 0) << 5;
    bad |= !same(buf[1], want[1], sizes[1]) << 6;
    bad |= !same(buf[2], want[2], sizes[2]) << 7;
    for (int o = 0; o < p; o++)
        for (size_t i = 0; i < RS; i++) bad |= (all[(size_t)o * RS + i] != value(o, i + 5)) << 8;
    comm_async_free(q);
    for (int k = 0; k < 3; k++) {
        free(buf[k]);
        free(want[k]);
    }
    return bad;
}

/* The hooks' view of a queue: which ticket each of the ring's slots holds,
 * what ran where. */
enum { HOOK_MARKS = 4, HOOK_CALLS = 24 };
typedef struct hook_log {
    pthread_mutex_t mu;
    long slot[HOOK_MARKS]; /* the ticket marked into each slot */
    long marked, waited, ran, joined;
    long worst;            /* the most calls marked and not yet waited for */
    int bad;               /* a wait found its slot marked again, or the order wrong */
    long fail_wait;        /* the wait fails for this ticket (0: never) */
    long fail_mark;        /* the mark fails for this ticket (0: never) */
} hook_log;

static int hook_mark(void *ud, long t, char *err, size_t n)
{
    hook_log *h = ud;
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    if (t == h->fail_mark) {
        snprintf(err, n, "mark %ld refused", t);
        rc = -1;
    } else {
        h->bad |= t != h->marked + 1;
        h->marked = t;
        h->slot[t % HOOK_MARKS] = t;
        if (t - h->waited > h->worst) h->worst = t - h->waited;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int hook_wait(void *ud, long t, comm *c, char *err, size_t n)
{
    (void)c;
    hook_log *h = ud;
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    if (t == h->fail_wait) {
        snprintf(err, n, "wait %ld refused", t);
        rc = -1;
    } else {
        h->bad |= (h->slot[t % HOOK_MARKS] != t) << 1; /* re-marked before its call ran */
        h->bad |= (t != h->waited + 1) << 2;
        h->waited = t;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* After call t ran, in the queue's thread: it is the call last waited
 * before (hook_wait). */
static int hook_ran(void *ud, long t, comm *c, char *err, size_t n)
{
    hook_log *h = ud;
    (void)c;
    (void)err;
    (void)n;
    pthread_mutex_lock(&h->mu);
    h->bad |= (t != h->waited || t != h->ran + 1) << 3;
    h->ran = t;
    pthread_mutex_unlock(&h->mu);
    return 0;
}

/* At the end of a wait for t, in the caller's thread: t has run. */
static int hook_joined(void *ud, long t, char *err, size_t n)
{
    hook_log *h = ud;
    (void)err;
    (void)n;
    pthread_mutex_lock(&h->mu);
    h->bad |= (t > h->ran || t < h->joined) << 4;
    h->joined = t;
    pthread_mutex_unlock(&h->mu);
    return 0;
}

int comm_case_async_hooks(comm *c, char *err, size_t n)
{
    int r = c->rank, p = c->size, bad = 0;
    if (p < 2 || p > MAXP || !comm_async_supported(c)) return 1;
    /* 1: a ring of 4 marks over a slow queue: the issuer outruns it, and waits */
    hook_log h = {.mu = PTHREAD_MUTEX_INITIALIZER};
    comm_async_hooks hooks = {.mark = hook_mark, .wait = hook_wait, .ran = hook_ran, .joined = hook_joined, .ud = &h,
                              .marks = HOOK_MARKS};
    comm_async *q = NULL;
    if (comm_async_new(c, &hooks, &q) != 0) return call_failed(c, err, n);
    comm_async_set_delay(q, 2e-3);
    float x[HOOK_CALLS][8];
    for (int k = 0; k < HOOK_CALLS; k++) {
        for (int i = 0; i < 8; i++) x[k][i] = value(r, (size_t)(k * 8 + i));
        bad |= (comm_async_all_reduce(q, x[k], 8) != k + 1) << 4;
    }
    if (comm_async_wait_all(q) != 0) return snprintf(err, n, "%s", comm_async_error(q)), -1;
    for (int k = 0; k < HOOK_CALLS; k++)
        for (int i = 0; i < 8; i++) {
            float w = value(0, (size_t)(k * 8 + i));
            for (int o = 1; o < p; o++) w += value(o, (size_t)(k * 8 + i));
            bad |= (x[k][i] != w) << 5;
        }
    bad |= h.bad << 6; /* bits 6..10 */
    bad |= (h.marked != HOOK_CALLS || h.waited != HOOK_CALLS || h.ran != HOOK_CALLS || h.joined != HOOK_CALLS) << 22;
    bad |= (h.worst > HOOK_MARKS) << 11; /* never more in flight than slots */
    bad |= (h.worst < 2) << 12;          /* (and the queue did fall behind) */
    comm_async_free(q);
    /* 2: a wait that fails (on every rank, at call 3) fails its call and the queue, with its reason */
    hook_log f = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_wait = 3};
    hooks.ud = &f;
    if (comm_async_new(c, &hooks, &q) != 0) return call_failed(c, err, n);
    long t[4];
    for (int k = 0; k < 4; k++) t[k] = comm_async_all_reduce(q, x[k], 8);
    /* (call 4 is issued before the queue's thread fails at call 3's wait,
     * or after: then the failed queue refuses it; a loaded machine, under
     * ThreadSanitizer, gave -1 once) */
    bad |= (t[0] != 1 || t[1] != 2 || t[2] != 3 || (t[3] != 4 && t[3] != -1)) << 13;
    bad |= (comm_async_wait(q, t[2]) != -1) << 14;
    bad |= (strstr(comm_async_error(q), "wait 3 refused") == NULL) << 15;
    bad |= (comm_async_all_reduce(q, x[0], 8) != -1) << 16; /* it stays failed */
    comm_async_free(q);
    /* 3: a mark that fails fails the issue, and the queue. (Call 1 is
     * waited for first: a failed queue drops the calls it has not started,
     * so a rank whose failure came before its thread took call 1 would
     * leave the others' call 1 waiting for it until the timeout.) */
    hook_log g = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_mark = 2};
    hooks.ud = &g;
    if (comm_async_new(c, &hooks, &q) != 0) return call_failed(c, err, n);
    bad |= (comm_async_all_reduce(q, x[0], 8) != 1) << 17;
    bad |= (comm_async_wait(q, 1) != 0) << 19;
    bad |= (comm_async_all_reduce(q, x[1], 8) != -1) << 18;
    bad |= (comm_async_all_reduce(q, x[2], 8) != -1) << 21; /* the queue stays failed */
    bad |= (strstr(comm_async_error(q), "mark 2 refused") == NULL) << 20;
    comm_async_free(q);
    if (bad) snprintf(err, n, "bad bits %#x (worst in flight %ld)", (unsigned)bad, h.worst);
    return bad;
}

int comm_case_async_abort(comm *c, char *err, size_t n)
{
    comm_async *q = NULL;
    if (comm_async_new(c, NULL, &q) != 0) { /* rank 1 may abort before a peer's split ends */
        snprintf(err, n, "%s", c->error);
        return c->rank == 1;
    }
    float x[16] = {0};
    int rc = 0;
    if (c->rank == 1) {
        comm_abort(c, "rank 1 ran out of memory");
    } else {
        long t = comm_async_all_reduce(q, x, 16);
        rc |= t != 1;
        rc |= comm_async_wait(q, t) == 0;
        snprintf(err, n, "%s", comm_async_error(q));
        rc |= comm_async_all_reduce(q, x, 16) != -1; /* the queue stays failed */
        rc |= comm_async_wait_all(q) == 0;
    }
    comm_async_free(q);
    return rc;
}
