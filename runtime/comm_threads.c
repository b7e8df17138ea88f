/* comm_threads.c — the threads communicator (comm.h): every rank is a
 * thread of this process, and a collective is a rendezvous in shared
 * memory.
 *
 * Each collective: every member publishes its buffer and waits at the
 * group's barrier; then each rank computes its own part reading the peers'
 * buffers (for a sum: its 1/size of the elements, adding the ranks' values
 * in rank order), waits again, and writes or copies what it computed; a
 * last barrier ends the call, after which no one reads the buffers. An
 * abort stops a collective only at its first barrier: once every member
 * has published its buffer, all finish, so none frees a buffer a peer
 * still reads or writes. Sends
 * are eager: the data is copied into the (src, dst) queue and the sender
 * goes on, so transfers in any order cannot deadlock.
 *
 * A mutex and condition variable per group, for its barrier, so that a
 * barrier's end wakes and contends only its group's members, not every
 * thread of the world (with ranks and their queues' threads in many
 * groups, world-wide wake-ups cost more than the collectives on a few
 * cores); the world's mutex guards the message queues (a condition
 * variable per receiving rank), the list of groups and the abort. Every
 * wait also watches the world's abort flag and the timeout; an abort
 * wakes every group and every rank. Lock order: the world's, then a
 * group's.
 */
#include "comm.h"

#include <errno.h>   /* ETIMEDOUT */
#include <pthread.h> /* pthread_mutex_t, pthread_cond_t */
#include <stdatomic.h> /* atomic_int */
#include <stdint.h>  /* SIZE_MAX */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* calloc, free, getenv, strtod */
#include <string.h>  /* memcpy */
#include <time.h>    /* clock_gettime */

typedef struct tmsg {
    struct tmsg *next;
    size_t bytes;
    unsigned char data[];
} tmsg;

typedef struct tqueue {
    tmsg *head, *tail;
} tqueue;

typedef struct tgroup tgroup;

struct comm_threads_world {
    tgroup *all;       /* the world's own group */
    tgroup *groups;    /* every live group, linked by next (mu held) */
    pthread_mutex_t mu;
    pthread_cond_t *rcv; /* per world rank: a message came for it */
    int size;
    double timeout;
    atomic_int aborted; /* set under mu, after why; read under mu or a group's mu */
    char why[640];
    int refs;          /* groups alive */
    tqueue *queue;     /* size x size: [src * size + dst] */
};

struct tgroup {
    comm_threads_world *w;
    tgroup *prev, *next; /* in w->groups */
    pthread_mutex_t mu;  /* the barrier's: arrived, gen, late */
    pthread_cond_t cv;
    int late;            /* a member gave up waiting: later arrivals fail (until the world's abort says why) */
    int sync_ok;         /* mu and cv were initialized */
    int size;
    int *world;        /* per member: its world rank */
    int arrived;       /* barrier */
    atomic_ulong gen;  /* barriers completed: written under mu, read by spinning members too */
    const void **ptr;  /* per member: the buffer it published */
    const size_t **cnt; /* per member: its all-to-all send counts */
    int *color, *key;  /* split */
    tgroup **child;    /* split: per member, its new group */
    int refs;          /* handles alive */
};

typedef struct tcomm {
    comm c;
    tgroup *g;
    int spin_score;    /* meet's polls: see spun */
    unsigned spin_probe;
    float *scratch;    /* this rank's part of a sum */
    size_t scratch_n;
} tcomm;

static const comm_vtbl threads_vtbl;

double comm_timeout_from_env(void)
{
    const char *s = getenv("MESH_COLLECTIVE_TIMEOUT_S");
    char *end;
    double t = s ? strtod(s, &end) : 0;
    return s && end != s && t > 0 ? t : 600.0;
}

static void deadline_after(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = (double)(long)seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Marks the world aborted (the first reason stays); mu held. */
static void abort_locked(comm_threads_world *w, const char *why)
{
    if (w->aborted) return;
    snprintf(w->why, sizeof w->why, "%s", why);
    w->aborted = 1; /* after why: a reader that sees the flag reads it whole */
    for (tgroup *g = w->groups; g; g = g->next) { /* under its mu: a member about to wait sees the flag */
        pthread_mutex_lock(&g->mu);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    for (int r = 0; r < w->size; r++) pthread_cond_broadcast(&w->rcv[r]);
}

static void abort_world(comm_threads_world *w, const char *why)
{
    pthread_mutex_lock(&w->mu);
    abort_locked(w, why);
    pthread_mutex_unlock(&w->mu);
}

/* A rank's wait ran out of time: the world stops; mu held. */
static void timed_out_locked(comm_threads_world *w, int rank, const char *op, const char *who)
{
    char why[200];
    snprintf(why, sizeof why, "rank %d waited in %s for more than %g s: %s", rank, op, w->timeout, who);
    abort_locked(w, why);
}

static int fail(tcomm *t, const char *op) { return comm_fail(&t->c, op, "%s", t->g->w->why); }

/* A member that arrives at a barrier first polls for its end for up to
 * SPIN_S before it sleeps: with a core each, the last member is often
 * that close, and a sleep and a wake-up cost more (a small all-reduce on
 * 2 ranks: 18 us sleeping, 2 us polling). With more threads than cores
 * the poll only takes the core from the member awaited, so each handle
 * keeps a score: a poll that ends the wait raises it, one that does not
 * lowers it, and below 1 the handle sleeps at once but for a poll every
 * SPIN_PROBE barriers, which can raise it again. */
enum { SPIN_PROBE = 64, SPIN_MAX = 8 };
#define SPIN_S 5e-6

static inline void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* 1 if t's group passed barrier gen while t polled (see above). */
static int spun(tcomm *t, unsigned long gen, int committed)
{
    tgroup *g = t->g;
    if (t->spin_score < 1 && ++t->spin_probe % SPIN_PROBE != 0) return 0;
    double until = comm_now() + SPIN_S;
    do {
        for (int i = 0; i < 32; i++) {
            if (g->gen != gen) {
                t->spin_score = t->spin_score < 1 ? 1 : t->spin_score < SPIN_MAX ? t->spin_score + 1 : SPIN_MAX;
                return 1;
            }
            spin_pause();
        }
    } while ((committed || !g->w->aborted) && comm_now() < until);
    t->spin_score = t->spin_score > -SPIN_MAX + 4 ? t->spin_score - 4 : -SPIN_MAX;
    return 0;
}

/* The group's barrier; -1 if the world aborted, or a rank did not come in
 * time. A committed barrier (one after a collective's first) is passed by
 * every member even when the world aborts: each has passed the one before
 * and only copies before it comes, so no member leaves, and frees its
 * buffer, while a peer still reads or writes it. */
static int meet_(tcomm *t, const char *op, int committed)
{
    tgroup *g = t->g;
    comm_threads_world *w = g->w;
    pthread_mutex_lock(&g->mu);
    if (g->late && !committed) /* the member that gave up is aborting the world: its reason */
        while (!w->aborted) pthread_cond_wait(&g->cv, &g->mu);
    if (w->aborted && !committed) {
        pthread_mutex_unlock(&g->mu);
        return fail(t, op);
    }
    unsigned long gen = g->gen;
    int late = 0;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->gen = gen + 1;
        pthread_mutex_unlock(&g->mu);
        pthread_cond_broadcast(&g->cv); /* unlocked: the woken need not wait for the mutex */
        return 0;
    }
    pthread_mutex_unlock(&g->mu);
    if (spun(t, gen, committed)) return 0;
    pthread_mutex_lock(&g->mu);
    {
        struct timespec until;
        deadline_after(&until, w->timeout);
        while (g->gen == gen && (committed || !w->aborted))
            if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT && g->gen == gen) {
                late = g->late = 1; /* no one completes this barrier now */
                break;
            }
    }
    int failed = g->gen == gen; /* the barrier did not complete */
    pthread_mutex_unlock(&g->mu);
    if (late) { /* (the world's mutex before a group's) */
        pthread_mutex_lock(&w->mu);
        timed_out_locked(w, t->c.world_rank, op, "another rank of the group is stuck or gone");
        pthread_mutex_unlock(&w->mu);
    }
    return failed ? fail(t, op) : 0;
}

static int meet(tcomm *t, const char *op) { return meet_(t, op, 0); }
static int meet_committed(tcomm *t, const char *op) { return meet_(t, op, 1); }

static float *scratch(tcomm *t, size_t n) { return comm_scratch(&t->scratch, &t->scratch_n, n); }

static int out_of_memory(tcomm *t, const char *op)
{
    char why[120];
    snprintf(why, sizeof why, "rank %d ran out of memory in %s", t->c.world_rank, op);
    abort_world(t->g->w, why);
    return fail(t, op);
}

/* The sums: a member publishes its k buffers (the same n[] on every
 * member; one for the plain calls), treated as one array of their
 * elements laid end to end; each rank sums its part of that array, in
 * rank order, element by element. */
typedef struct vseg {
    float *const *bufs; /* the member's k buffers */
    const size_t *n;
    int k;
} vseg;

/* Calls fn on each run [x, x + len) of the virtual array's [lo, hi) that
 * lies in one buffer: its index i and its offset there. */
static void runs(const size_t *n, int k, size_t lo, size_t hi, void (*fn)(void *, int, size_t, size_t, size_t),
                 void *ud)
{
    size_t start = 0;
    for (int i = 0; i < k && start < hi; start += n[i], i++) {
        size_t a = lo > start ? lo : start, b = hi < start + n[i] ? hi : start + n[i];
        if (a < b) fn(ud, i, a - start, a - lo, b - a);
    }
}

typedef struct vsum {
    const tgroup *g;
    float *part;
} vsum;

/* part[at..] = the sum over members, in rank order, of their buffer i's [off, off + len) */
static void sum_run(void *ud, int i, size_t off, size_t at, size_t len)
{
    vsum *v = ud;
    float *restrict out = v->part + at;
    memcpy(out, ((const vseg *)v->g->ptr[0])->bufs[i] + off, len * sizeof *out);
    for (int q = 1; q < v->g->size; q++) {
        const float *restrict in = ((const vseg *)v->g->ptr[q])->bufs[i] + off;
        for (size_t e = 0; e < len; e++) out[e] += in[e];
    }
}

/* every member's buffer i's [off, off + len) = part[at..] */
static void copy_run(void *ud, int i, size_t off, size_t at, size_t len)
{
    vsum *v = ud;
    for (int q = 0; q < v->g->size; q++)
        memcpy(((const vseg *)v->g->ptr[q])->bufs[i] + off, v->part + at, len * sizeof *v->part);
}

static int t_all_reduce_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    size_t all = 0;
    for (int i = 0; i < k; i++) all += n[i];
    size_t lo = all * (size_t)c->rank / (size_t)g->size, hi = all * (size_t)(c->rank + 1) / (size_t)g->size;
    vseg me = {bufs, n, k};
    vsum v = {g, scratch(t, hi - lo)};
    if (!v.part) return out_of_memory(t, "all-reduce");
    g->ptr[c->rank] = &me;
    if (meet(t, "all-reduce") != 0) return -1;
    runs(n, k, lo, hi, sum_run, &v);
    if (meet_committed(t, "all-reduce") != 0) return -1;
    runs(n, k, lo, hi, copy_run, &v);
    return meet_committed(t, "all-reduce");
}

static int t_reduce_scatter_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    size_t all = 0;
    for (int i = 0; i < k; i++) all += n[i] / (size_t)g->size;
    vseg me = {bufs, n, k};
    vsum v = {g, scratch(t, all)};
    if (!v.part) return out_of_memory(t, "reduce-scatter");
    g->ptr[c->rank] = &me;
    if (meet(t, "reduce-scatter") != 0) return -1;
    size_t at = 0;
    for (int i = 0; i < k; i++) { /* this rank's chunk of each */
        size_t len = n[i] / (size_t)g->size;
        sum_run(&v, i, (size_t)c->rank * len, at, len);
        at += len;
    }
    if (meet_committed(t, "reduce-scatter") != 0) return -1; /* no one reads the buffers after it */
    at = 0;
    for (int i = 0; i < k; i++) {
        size_t len = n[i] / (size_t)g->size;
        memcpy(bufs[i] + (size_t)c->rank * len, v.part + at, len * sizeof *v.part);
        at += len;
    }
    return 0;
}

static int t_all_reduce(comm *c, float *buf, size_t n) { return t_all_reduce_v(c, &buf, &n, 1); }

static int t_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    float *whole = (float *)(uintptr_t)in; /* (read only) */
    size_t all = n * (size_t)g->size;
    vseg me = {&whole, &all, 1};
    vsum v = {g, scratch(t, n)};
    if (!v.part) return out_of_memory(t, "reduce-scatter");
    g->ptr[c->rank] = &me;
    if (meet(t, "reduce-scatter") != 0) return -1;
    sum_run(&v, 0, n * (size_t)c->rank, 0, n);
    if (meet_committed(t, "reduce-scatter") != 0) return -1; /* out may be this rank's own input */
    memcpy(out, v.part, n * sizeof *v.part);
    return 0;
}

static int t_all_gather_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    vseg me = {bufs, n, k};
    g->ptr[c->rank] = &me;
    if (meet(t, "all-gather") != 0) return -1;
    for (int q = 0; q < g->size; q++) /* every peer's chunk of each, from its buffers */
        for (int i = 0; q != c->rank && i < k; i++) {
            size_t len = n[i] / (size_t)g->size;
            const float *from = ((const vseg *)g->ptr[q])->bufs[i] + (size_t)q * len;
            memcpy(bufs[i] + (size_t)q * len, from, len * sizeof *from);
        }
    return meet_committed(t, "all-gather");
}

static int t_all_gather(comm *c, const float *in, float *out, size_t n)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    g->ptr[c->rank] = in;
    if (meet(t, "all-gather") != 0) return -1;
    for (int q = 0; q < g->size; q++)
        if (out + (size_t)q * n != (const float *)g->ptr[q]) memcpy(out + (size_t)q * n, g->ptr[q], n * sizeof *out);
    return meet_committed(t, "all-gather");
}

static int t_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    g->ptr[c->rank] = in;
    g->cnt[c->rank] = send;
    if (meet(t, "all-to-all") != 0) return -1;
    size_t at = 0;
    int bad = -1;
    for (int q = 0; q < g->size; q++) {
        size_t from = 0;
        for (int j = 0; j < c->rank; j++) from += g->cnt[q][j];
        if (g->cnt[q][c->rank] != recv[q]) bad = q;
        else memcpy(out + at, (const float *)g->ptr[q] + from, recv[q] * sizeof *out);
        at += recv[q];
    }
    if (bad >= 0) {
        char why[160];
        snprintf(why, sizeof why, "rank %d expected %zu floats from rank %d in all-to-all, which sends %zu",
                 c->rank, recv[bad], bad, g->cnt[bad][c->rank]);
        abort_world(g->w, why);
    }
    int rc = meet_committed(t, "all-to-all");
    return bad >= 0 ? fail(t, "all-to-all") : rc;
}

static int t_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    if (c->rank == root) g->ptr[0] = buf;
    if (meet(t, "broadcast") != 0) return -1;
    if (c->rank != root) memcpy(buf, g->ptr[0], bytes);
    return meet_committed(t, "broadcast");
}

static int t_barrier(comm *c) { return meet((tcomm *)c, "barrier"); }

static int t_send(comm *c, const void *buf, size_t bytes, int peer)
{
    tcomm *t = (tcomm *)c;
    comm_threads_world *w = t->g->w;
    if (peer < 0 || peer >= t->g->size) {
        snprintf(c->error, sizeof c->error, "send to rank %d of a group of %d", peer, t->g->size);
        return -1;
    }
    tmsg *m = malloc(sizeof *m + bytes);
    if (!m) return out_of_memory(t, "send");
    m->next = NULL;
    m->bytes = bytes;
    memcpy(m->data, buf, bytes);
    pthread_mutex_lock(&w->mu);
    tqueue *q = &w->queue[(size_t)c->world_rank * (size_t)w->size + (size_t)t->g->world[peer]];
    if (q->tail) q->tail->next = m;
    else q->head = m;
    q->tail = m;
    pthread_cond_broadcast(&w->rcv[t->g->world[peer]]); /* (a rank's queue's thread may receive too) */
    pthread_mutex_unlock(&w->mu);
    return 0;
}

static int t_recv(comm *c, void *buf, size_t bytes, int peer)
{
    tcomm *t = (tcomm *)c;
    comm_threads_world *w = t->g->w;
    if (peer < 0 || peer >= t->g->size) {
        snprintf(c->error, sizeof c->error, "receive from rank %d of a group of %d", peer, t->g->size);
        return -1;
    }
    pthread_mutex_lock(&w->mu);
    tqueue *q = &w->queue[(size_t)t->g->world[peer] * (size_t)w->size + (size_t)c->world_rank];
    struct timespec until;
    deadline_after(&until, w->timeout);
    while (!q->head && !w->aborted)
        if (pthread_cond_timedwait(&w->rcv[c->world_rank], &w->mu, &until) == ETIMEDOUT && !q->head)
            timed_out_locked(w, c->world_rank, "receive", "the sender is stuck or gone");
    tmsg *m = q->head;
    if (m && !w->aborted) {
        q->head = m->next;
        if (!q->head) q->tail = NULL;
    }
    int aborted = w->aborted;
    pthread_mutex_unlock(&w->mu);
    if (aborted) return fail(t, "receive");
    int ok = m->bytes == bytes;
    if (ok) memcpy(buf, m->data, bytes);
    else
        snprintf(c->error, sizeof c->error, "receive from rank %d: %zu bytes sent, %zu expected", peer, m->bytes,
                 bytes);
    free(m);
    return ok ? 0 : -1;
}

static int t_group_noop(comm *c)
{
    (void)c;
    return 0;
}

static void t_abort(comm *c, const char *why)
{
    char msg[640];
    comm_rank_failed(msg, sizeof msg, c->world_rank, why);
    abort_world(((tcomm *)c)->g->w, msg);
}

static void group_free(tgroup *g)
{
    if (g->sync_ok) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
    }
    free(g->world);
    free(g->ptr);
    free(g->cnt);
    free(g->color);
    free(g->key);
    free(g->child);
    free(g);
}

static tgroup *group_new(comm_threads_world *w, int size)
{
    tgroup *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->w = w;
    g->size = g->refs = size;
    g->world = calloc((size_t)size, sizeof *g->world);
    g->ptr = calloc((size_t)size, sizeof *g->ptr);
    g->cnt = calloc((size_t)size, sizeof *g->cnt);
    g->color = calloc((size_t)size, sizeof *g->color);
    g->key = calloc((size_t)size, sizeof *g->key);
    g->child = calloc((size_t)size, sizeof *g->child);
    if (pthread_mutex_init(&g->mu, NULL) == 0) {
        g->sync_ok = pthread_cond_init(&g->cv, NULL) == 0;
        if (!g->sync_ok) pthread_mutex_destroy(&g->mu);
    }
    if (!g->world || !g->ptr || !g->cnt || !g->color || !g->key || !g->child || !g->sync_ok) {
        group_free(g);
        return NULL;
    }
    return g;
}

/* Links g into the world's groups; mu held. */
static void group_link(comm_threads_world *w, tgroup *g)
{
    g->prev = NULL;
    g->next = w->groups;
    if (w->groups) w->groups->prev = g;
    w->groups = g;
}

static void group_unlink(comm_threads_world *w, tgroup *g)
{
    if (g->prev) g->prev->next = g->next;
    else if (w->groups == g) w->groups = g->next;
    if (g->next) g->next->prev = g->prev;
    g->prev = g->next = NULL;
}

static void world_free(comm_threads_world *w)
{
    for (size_t i = 0; i < (size_t)w->size * (size_t)w->size; i++)
        for (tmsg *m = w->queue[i].head, *next; m; m = next) {
            next = m->next;
            free(m);
        }
    free(w->queue);
    pthread_mutex_destroy(&w->mu);
    for (int r = 0; r < w->size; r++) pthread_cond_destroy(&w->rcv[r]);
    free(w->rcv);
    free(w);
}

static comm *handle(tgroup *g, int rank)
{
    tcomm *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->c.v = &threads_vtbl;
    t->c.rank = rank;
    t->c.size = g->size;
    t->c.world_rank = g->world[rank];
    t->g = g;
    t->spin_score = 1;
    return &t->c;
}

static int t_split(comm *c, int color, int key, comm **out)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    *out = NULL;
    g->color[c->rank] = color;
    g->key[c->rank] = key;
    if (meet(t, "split") != 0) return -1;
    int first = -1, n = 0, failed = 0;
    for (int q = 0; q < g->size && color >= 0; q++)
        if (g->color[q] == color) {
            if (first < 0) first = q;
            n++;
        }
    if (first == c->rank) { /* the lowest member of each color makes its group */
        tgroup *ng = group_new(g->w, n);
        if (ng) {
            /* members ordered by (key, rank) */
            int k = 0;
            for (int q = 0; q < g->size; q++)
                if (g->color[q] == color) ng->world[k++] = q;
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && g->key[ng->world[j]] < g->key[ng->world[j - 1]]; j--) {
                    int s = ng->world[j];
                    ng->world[j] = ng->world[j - 1];
                    ng->world[j - 1] = s;
                }
            for (int i = 0; i < n; i++) g->child[ng->world[i]] = ng;
            for (int i = 0; i < n; i++) ng->world[i] = g->world[ng->world[i]];
            pthread_mutex_lock(&g->w->mu);
            g->w->refs++;
            group_link(g->w, ng);
            pthread_mutex_unlock(&g->w->mu);
        } else {
            failed = 1;
        }
    }
    if (failed) return out_of_memory(t, "split");
    if (meet(t, "split") != 0) return -1;
    if (color < 0) return meet(t, "split");
    tgroup *ng = g->child[c->rank];
    int rank = 0;
    while (ng->world[rank] != c->world_rank) rank++;
    *out = handle(ng, rank);
    int rc = meet(t, "split"); /* everyone has read child[] */
    if (!*out) return out_of_memory(t, "split");
    return rc;
}

static void t_free(comm *c)
{
    tcomm *t = (tcomm *)c;
    tgroup *g = t->g;
    comm_threads_world *w = g->w;
    pthread_mutex_lock(&w->mu);
    int last_group = --g->refs == 0, last_world = 0;
    if (last_group) {
        group_unlink(w, g);
        last_world = --w->refs == 0;
    }
    pthread_mutex_unlock(&w->mu);
    if (last_group && g == w->all) w->all = NULL;
    if (last_group) group_free(g);
    if (last_world) world_free(w);
    free(t->scratch);
    free(t);
}

static const comm_vtbl threads_vtbl = {
    "threads", t_all_reduce, t_reduce_scatter, t_all_gather, t_all_to_all, t_broadcast, t_send, t_recv,
    t_barrier, t_split, t_group_noop, t_group_noop, t_abort, t_free, t_all_reduce_v, t_reduce_scatter_v,
    t_all_gather_v,
};

comm_threads_world *comm_threads_world_new(int size, double timeout_s)
{
    if (size < 1) return NULL;
    comm_threads_world *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->size = size;
    w->timeout = timeout_s > 0 ? timeout_s : comm_timeout_from_env();
    w->queue = calloc((size_t)size * (size_t)size, sizeof *w->queue);
    w->rcv = calloc((size_t)size, sizeof *w->rcv);
    w->all = group_new(w, size);
    int mu = w->queue && w->rcv && w->all ? pthread_mutex_init(&w->mu, NULL) : -1, cvs = 0;
    while (mu == 0 && cvs < size && pthread_cond_init(&w->rcv[cvs], NULL) == 0) cvs++;
    if (mu != 0 || cvs < size) {
        if (mu == 0) pthread_mutex_destroy(&w->mu);
        while (cvs > 0) pthread_cond_destroy(&w->rcv[--cvs]);
        if (w->all) group_free(w->all);
        free(w->rcv);
        free(w->queue);
        free(w);
        return NULL;
    }
    group_link(w, w->all);
    for (int r = 0; r < size; r++) w->all->world[r] = r;
    w->refs = 1;
    return w;
}

comm *comm_threads_rank(comm_threads_world *w, int rank)
{
    if (!w || rank < 0 || rank >= w->size) return NULL;
    return handle(w->all, rank);
}

comm_threads_world *comm_threads_world_of(const comm *c)
{
    c = c ? comm_checked_inner(c) : NULL;
    return c && c->v == &threads_vtbl ? ((const tcomm *)(const void *)c)->g->w : NULL;
}

/* A hold counts as a group alive: the world goes with the last of both. */
void comm_threads_world_hold(comm_threads_world *w)
{
    pthread_mutex_lock(&w->mu);
    w->refs++;
    pthread_mutex_unlock(&w->mu);
}

int comm_threads_aborted(comm_threads_world *w, char *why, size_t n)
{
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    int aborted = w->aborted;
    if (aborted && why && n) snprintf(why, n, "%s", w->why);
    pthread_mutex_unlock(&w->mu);
    return aborted;
}

void comm_threads_stop(comm_threads_world *w, const char *why)
{
    if (w) abort_world(w, why);
}

void comm_threads_release(comm_threads_world *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    int last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (last) world_free(w);
}

void comm_threads_world_free(comm_threads_world *w)
{
    if (!w) return;
    if (w->all) group_free(w->all);
    world_free(w);
}
